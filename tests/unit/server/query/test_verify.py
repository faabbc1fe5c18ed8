"""The fold and the comparison of `iox verify` (server/query/verify.py), without Kafka or Spark:
the write buffer's messages are fed to the fold as the reader would, the answer is a dict."""
from __future__ import annotations

import pyarrow as pa

from iox_spark.server.query.verify import PartitionReport, compare, TableFold
from tests.timestamps import S, T0

ROLES = {"host": "tag", "v": "field", "w": "field", "time": "time"}


def _write(fold: TableFold, offset: int, rows: list) -> None:
    """rows: [(host, second, {field: value})] of one message at `offset`."""
    t = pa.table({"host": [h for h, _s, _f in rows],
                  "v": pa.array([f.get("v") for _h, _s, f in rows], pa.int64()),
                  "w": pa.array([f.get("w") for _h, _s, f in rows], pa.int64()),
                  "time": pa.array([T0 + s * S for _h, s, _f in rows], pa.int64())})
    fold.late = offset > fold.watermark
    fold.write(0, offset, t, ROLES)


def _delete(fold: TableFold, offset: int, lo: int, hi: int, host: str | None = None, column: str = "host") -> None:
    fold.late = offset > fold.watermark
    fold.delete(0, offset, T0 + lo * S, T0 + hi * S, [(column, "=", host)] if host is not None else [])


def _key(host: str, second: int) -> tuple:
    return ((host,), T0 + second * S)


def _check(fold: TableFold, answer: dict, lo_before=None, lo_after=None) -> PartitionReport:
    rep = PartitionReport(partition=0)
    compare(rep, fold, {k: dict(v) for k, v in answer.items()}, lo_before, lo_after, 100)
    return rep


def _fold(complete: bool = True, watermark: int = 1_000) -> TableFold:
    f = TableFold("cpu", ["host"], ["v", "w"], complete)
    f.watermark = watermark
    return f


def test_last_write_wins_field_by_field_and_deletes_remove_only_earlier_rows():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1, "w": 10}), ("b", 1, {"v": 2})])
    _write(f, 1, [("a", 1, {"v": 3}), ("a", 1, {"w": 30})])  # a later line of one message wins too
    _delete(f, 2, 0, 2, "b")
    _write(f, 3, [("b", 1, {"w": 5})])  # after the delete: only what it wrote
    answer = {_key("a", 1): {"v": 3, "w": 30}, _key("b", 1): {"w": 5}}
    rep = _check(f, answer)
    assert (rep.difference_count, rep.rows_compared, rep.rows_unjudged) == (0, 2, 0)


def test_each_kind_of_difference_is_named_with_the_offsets_that_decided_the_row():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1}), ("b", 1, {"v": 2}), ("c", 1, {"v": 3})])
    _write(f, 4, [("c", 1, {"v": 4})])
    answer = {_key("b", 1): {"v": 2}, _key("c", 1): {"v": 3}, _key("d", 1): {"v": 9}}
    rep = _check(f, answer)
    got = {(d.kind, d.tags["host"]): (d.want, d.got, d.offsets) for d in rep.differences}
    assert got == {("missing", "a"): ({"v": 1}, None, (0,)),
                   ("different", "c"): ({"v": 4}, {"v": 3}, (0, 4)),
                   ("extra", "d"): (None, {"v": 9}, ())}
    assert (rep.difference_count, rep.rows_compared) == (3, 1)


def test_a_row_deleted_and_answered_is_extra():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1})])
    _delete(f, 1, 0, 5)
    rep = _check(f, {_key("a", 1): {"v": 1}})
    assert [(d.kind, d.want, d.got, d.offsets) for d in rep.differences] == [("extra", None, {"v": 1}, (0, 1))]


def test_rows_touched_after_the_watermark_may_show_any_state_since():
    f = _fold(watermark=1)
    _write(f, 0, [("a", 1, {"v": 1}), ("b", 1, {"v": 1})])
    _write(f, 2, [("a", 1, {"v": 2})])  # after the answers' watermark
    _write(f, 3, [("a", 1, {"v": 3}), ("c", 1, {"v": 7})])
    _delete(f, 4, 0, 5, "b")
    for a, b, c in [(1, 1, None), (2, 1, 7), (3, None, 7), (3, 1, None)]:
        answer = {_key("a", 1): {"v": a}}
        if b is not None:
            answer[_key("b", 1)] = {"v": b}
        if c is not None:
            answer[_key("c", 1)] = {"v": c}
        assert _check(f, answer).difference_count == 0, (a, b, c)
    rep = _check(f, {_key("a", 1): {"v": 5}, _key("b", 1): {"v": 1}})
    assert [(d.kind, d.want) for d in rep.differences] == [("different", {"v": 1})]  # the state at the watermark


def test_a_history_kafka_no_longer_holds_is_judged_only_where_retained_messages_decide():
    f = _fold(complete=False)
    _write(f, 10, [("a", 1, {"v": 1})])
    _delete(f, 11, 0, 5, "b")
    _delete(f, 12, 0, 5, "c")
    _write(f, 13, [("c", 1, {"w": 2})])
    answer = {_key("a", 1): {"v": 1, "w": 99},  # w from before the retained messages: unknown, fine
              _key("b", 2): {"v": 5},  # a retained delete removed it: extra
              _key("c", 1): {"w": 2},  # deleted, then written: exactly what came after
              _key("e", 1): {"v": 6}}  # never named by a retained message: not judged
    rep = _check(f, answer)
    assert [(d.kind, d.tags["host"]) for d in rep.differences] == [("extra", "b")]
    assert (rep.rows_compared, rep.rows_unjudged) == (2, 1)
    rep = _check(f, {_key("a", 1): {"w": 99}, _key("c", 1): {"w": 2, "v": 1}})
    assert sorted((d.kind, d.tags["host"]) for d in rep.differences) == [("different", "a"), ("different", "c")]


def test_a_delete_on_a_field_leaves_the_rows_it_may_touch_unjudged():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1}), ("b", 1, {"v": 2}), ("b", 7, {"v": 1})])
    _delete(f, 1, 0, 5, 1, column="v")  # a row stored as a merge of several writes may match or not
    rep = _check(f, {_key("b", 1): {"v": 2}, _key("b", 7): {"v": 1}})
    assert (rep.difference_count, rep.rows_compared, rep.rows_unjudged) == (0, 1, 2)


def test_retention_leaves_out_older_rows_and_an_answered_one_past_it_is_extra():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1}), ("a", 3, {"v": 3})])
    lo = T0 + 2 * S
    rep = _check(f, {_key("a", 3): {"v": 3}}, lo_before=lo, lo_after=lo)
    assert (rep.difference_count, rep.rows_compared) == (0, 1)
    rep = _check(f, {_key("a", 1): {"v": 1}, _key("a", 3): {"v": 3}}, lo_before=lo, lo_after=lo)
    assert [(d.kind, d.tags["host"]) for d in rep.differences] == [("extra", "a")]


def test_a_tag_that_appears_later_keys_earlier_rows_without_it():
    f = _fold()
    _write(f, 0, [("a", 1, {"v": 1})])
    t = pa.table({"host": ["a"], "dc": ["x"], "v": pa.array([2], pa.int64()), "time": pa.array([T0 + S], pa.int64())})
    f.write(0, 1, t, {**ROLES, "dc": "tag"})
    answer = {(("a", None), T0 + S): {"v": 1}, (("a", "x"), T0 + S): {"v": 2}}
    assert _check(f, answer).difference_count == 0
