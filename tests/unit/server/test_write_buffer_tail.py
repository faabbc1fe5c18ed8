"""The write buffer's tail (server/write_buffer_tail.py): one Kafka partition's state machine,
fed with messages built by the router's own encoders, and the rows a query reads from it."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from catalog.delete_mailbox import Delete
from catalog.schema import Column
from server.ingest import seq_base
from server.query import tail_rows
from server.wire_format import as_part, encode_decision, encode_delete, encode_marker, encode_write
from server.write_buffer_tail import PartitionTail, TailWrite

KP = 1
ROOM = 1 << 30
T0 = 1_700_000_000_000_000_000


def _write(table="cpu", rows=((T0, "a", 1.0),), unique=True):
    data = pa.table({"host": [r[1] for r in rows], "usage": [r[2] for r in rows],
                     "time": pa.array([r[0] for r in rows], pa.int64())})
    cols = [Column("host", "tag", "string"), Column("usage", "field", "float"), Column("time", "time", "time")]
    return encode_write(table, cols, data, unique_keys=unique)


def _take(pt, offset, msg, room=ROOM):
    pt.take(offset, dict(msg.headers), msg.value, KP, room)


def _headers(msg, **changes):
    h = dict(msg.headers)
    for k, v in changes.items():
        name = k.replace("_", "-")
        if v is None:
            h.pop(name, None)
        else:
            h[name] = v
    return h


def test_writes_become_visible_in_order_with_their_bytes():
    pt = PartitionTail.starting_after(9, epoch=0)
    w1, w2 = _write(rows=((T0, "a", 1.0),)), _write(rows=((T0 + 5, "b", 2.0), (T0 + 9, "b", 3.0)))
    _take(pt, 10, w1)
    _take(pt, 11, w2)
    assert pt.visible_hi == 11 and pt.next_offset == 12 and pt.blocked_at is None
    assert [(o, it.table, it.spans, it.unique) for o, it in pt.items] == [
        (10, "cpu", ((T0, T0),), True), (11, "cpu", ((T0 + 5, T0 + 9),), True)]
    assert pt.nbytes == len(w1.value) + len(w2.value)
    _take(pt, 11, w2)  # a redelivery of an offset already read changes nothing
    assert len(pt.items) == 2


def test_messages_the_consumer_skips_are_skipped():
    pt = PartitionTail.starting_after(-1, epoch=0)
    w = _write()
    pt.take(0, _headers(w, iox_format=None), w.value, KP, ROOM)  # a foreign producer's
    pt.take(1, _headers(w, iox_kind=b"gossip"), w.value, KP, ROOM)
    d = encode_delete("cpu", 0, 10, [])
    pt.take(2, dict(d.headers), b"not json", KP, ROOM)  # a delete whose value is not a delete
    assert pt.visible_hi == 2 and pt.items == [] and pt.nbytes == 0


def test_an_unknown_format_blocks_until_the_consumer_applied_it():
    pt = PartitionTail.starting_after(4, epoch=0)
    w = _write()
    _take(pt, 5, w)
    pt.take(6, _headers(w, iox_format=b"99"), w.value, KP, ROOM)
    _take(pt, 7, w)  # nothing after a block is taken
    assert pt.blocked_at == 6 and pt.visible_hi == 5 and [o for o, _ in pt.items] == [5]
    assert pt.trim(5) is False and pt.items == [] and pt.blocked_at == 6
    assert pt.trim(6) is True  # applied: read again after it
    assert (pt.next_offset, pt.visible_hi, pt.blocked_at, pt.items, pt.nbytes) == (7, 6, None, [], 0)


def test_a_gap_blocks_instead_of_claiming_offsets_never_read():
    pt = PartitionTail.starting_after(4, epoch=0)
    _take(pt, 7, _write())
    assert pt.blocked_at == 5 and pt.visible_hi == 4 and pt.items == []


def test_a_write_past_the_byte_budget_blocks():
    pt = PartitionTail.starting_after(-1, epoch=0)
    w = _write()
    _take(pt, 0, w, room=len(w.value))
    _take(pt, 1, w, room=len(w.value) - 1)
    assert pt.visible_hi == 0 and pt.blocked_at == 1 and pt.nbytes == len(w.value)


def test_deletes_are_held_with_their_sequence():
    pt = PartitionTail.starting_after(-1, epoch=3)
    d = encode_delete("cpu", 100, 200, [["host", "=", "a", "string"]])
    _take(pt, 0, d)
    assert pt.items == [(0, Delete(table="cpu", start_ns=100, stop_ns_exclusive=200,
                                   predicate=(("host", "=", "a", "string"),), seq=seq_base(3, 0), kafka_partition=KP))]
    assert pt.nbytes == 0 and pt.visible_hi == 0


def test_a_committed_part_applies_at_its_marker_and_an_aborted_one_never():
    pt = PartitionTail.starting_after(-1, epoch=0)
    w = _write()
    _take(pt, 0, as_part(w, "t1", coordinator_kp=3))
    _take(pt, 1, _write(table="mem"))
    _take(pt, 2, as_part(w, "t2", coordinator_kp=3))
    assert pt.visible_hi == 2 and [o for o, _ in pt.items] == [1]  # undecided parts are invisible
    assert pt.nbytes == 3 * len(w.value)
    _take(pt, 3, encode_marker("t1", "commit", KP))
    _take(pt, 4, encode_marker("t2", "abort", KP))
    assert pt.visible_hi == 4 and pt.pending == {}
    assert [(o, it.offset, it.table) for o, it in pt.items] == [(1, 1, "mem"), (3, 3, "cpu")]
    assert pt.nbytes == 2 * len(w.value)


def test_a_decision_decides_the_parts_of_its_own_partition():
    pt = PartitionTail.starting_after(-1, epoch=0)
    w = _write()
    _take(pt, 0, as_part(w, "t1", coordinator_kp=KP))
    _take(pt, 1, encode_decision("t1", "commit", [(0, 7), (KP, 0)], KP))
    _take(pt, 2, encode_decision("t9", "commit", [(0, 8), (2, 4)], KP))  # no part here: nothing to apply
    assert pt.visible_hi == 2 and [o for o, _ in pt.items] == [1]


@pytest.mark.parametrize("decision", [
    encode_marker("t1", "commit", KP),
    encode_decision("t1", "commit", [(KP, 3)], KP),
])
def test_a_decision_for_a_part_read_before_the_tail_blocks(decision):
    pt = PartitionTail.starting_after(4, epoch=0)  # the part at offset 3 is in the consumer's stash
    _take(pt, 5, decision)
    assert pt.blocked_at == 5 and pt.visible_hi == 4


def test_a_committed_delete_part_applies_at_its_marker():
    pt = PartitionTail.starting_after(-1, epoch=0)
    d = encode_delete(None, 0, 10, [])
    _take(pt, 0, as_part(d, "t1", coordinator_kp=3))
    assert pt.nbytes == len(d.value)
    _take(pt, 1, encode_marker("t1", "commit", KP))
    assert [(o, it.seq, it.table) for o, it in pt.items] == [(1, seq_base(0, 1), None)]
    assert pt.nbytes == 0


def test_trim_drops_what_the_consumer_applied_and_restarts_when_it_is_ahead():
    pt = PartitionTail.starting_after(-1, epoch=0)
    w = _write()
    for off in range(3):
        _take(pt, off, w)
    _take(pt, 3, as_part(w, "t1", coordinator_kp=3))
    assert pt.trim(1) is False
    assert [o for o, _ in pt.items] == [2] and pt.nbytes == 2 * len(w.value)
    assert pt.trim(3) is False  # the part is the consumer's now
    assert pt.pending == {} and pt.items == [] and pt.nbytes == 0 and pt.next_offset == 4
    assert pt.trim(10) is True and (pt.next_offset, pt.visible_hi) == (11, 10)


def test_tail_rows_are_the_rows_the_consumer_builds():
    w1 = _write(rows=((T0, "a", 1.0), (T0 + 1, "b", 2.0)))
    w2 = _write(rows=((T0 + 2, "a", 3.0),))
    writes = [TailWrite(7, "cpu", w1.value, (), (), True), TailWrite(9, "cpu", b"garbage", (), (), True),
              TailWrite(12, "cpu", w2.value, (), (), True)]
    t = tail_rows(writes, [("host", "string"), ("region", "string"), ("usage", "float")], epoch=2)
    assert t.column_names == ["host", "region", "usage", "time_ns", "_iox_seq"]
    assert t.to_pylist() == [
        {"host": "a", "region": None, "usage": 1.0, "time_ns": T0, "_iox_seq": seq_base(2, 7)},
        {"host": "b", "region": None, "usage": 2.0, "time_ns": T0 + 1, "_iox_seq": seq_base(2, 7) + 1},
        {"host": "a", "region": None, "usage": 3.0, "time_ns": T0 + 2, "_iox_seq": seq_base(2, 12)}]
    assert tail_rows([writes[1]], [("host", "string")], epoch=0) is None


def test_the_schema_and_days_headers_are_kept():
    w = _write(rows=((T0, "a", 1.0), (T0 + 86_400 * 10**9, "a", 2.0)))
    pt = PartitionTail.starting_after(-1, epoch=0)
    _take(pt, 0, w)
    it = pt.items[0][1]
    assert [list(c) for c in it.columns] == json.loads(dict(w.headers)["iox-schema"])
    assert it.spans == ((T0, T0), (T0 + 86_400 * 10**9, T0 + 86_400 * 10**9))
