"""The write buffer's tail (server/query/tail.py): one Kafka partition's state machine,
fed with messages built by the router's own encoders, and the rows a query reads from it."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.schema import Column
from iox_spark.catalog.seq_layout import SEQ_ROW_BITS, legacy_seq_origin
from iox_spark.catalog.seq_layout import seq_base
from iox_spark.server.query.engine import tail_rows
from iox_spark.server.write_buffer.wire_format import as_part, encode_decision, encode_delete, encode_marker, encode_write
from iox_spark.server.query.tail import PartitionTail, TailWrite
from tests.timestamps import T0

KP = 1
ROOM = 1 << 30
#: a seq origin of an epoch after the legacy layout's last one (catalog/seq_layout.py)
ORIGIN = legacy_seq_origin(255) + (17 << SEQ_ROW_BITS)


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
    pt = PartitionTail.starting_after(9, seq_origin=0)
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
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    pt.take(0, _headers(w, iox_format=None), w.value, KP, ROOM)  # a foreign producer's
    pt.take(1, _headers(w, iox_kind=b"gossip"), w.value, KP, ROOM)
    d = encode_delete("cpu", 0, 10, [])
    pt.take(2, dict(d.headers), b"not json", KP, ROOM)  # a delete whose value is not a delete
    assert pt.visible_hi == 2 and pt.items == [] and pt.nbytes == 0


def test_an_unknown_format_blocks_until_the_consumer_applied_it():
    pt = PartitionTail.starting_after(4, seq_origin=0)
    w = _write()
    _take(pt, 5, w)
    pt.take(6, _headers(w, iox_format=b"99"), w.value, KP, ROOM)
    _take(pt, 7, w)  # nothing after a block is taken
    assert pt.blocked_at == 6 and pt.visible_hi == 5 and [o for o, _ in pt.items] == [5]
    assert pt.trim(5) is False and pt.items == [] and pt.blocked_at == 6
    assert pt.trim(6) is True  # applied: read again after it
    assert (pt.next_offset, pt.visible_hi, pt.blocked_at, pt.items, pt.nbytes) == (7, 6, None, [], 0)


def test_a_gap_blocks_instead_of_claiming_offsets_never_read():
    pt = PartitionTail.starting_after(4, seq_origin=0)
    _take(pt, 7, _write())
    assert pt.blocked_at == 5 and pt.visible_hi == 4 and pt.items == []


def test_a_write_past_the_byte_budget_blocks():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _take(pt, 0, w, room=len(w.value))
    _take(pt, 1, w, room=len(w.value) - 1)
    assert pt.visible_hi == 0 and pt.blocked_at == 1 and pt.nbytes == len(w.value)


def test_deletes_are_held_with_their_sequence():
    pt = PartitionTail.starting_after(-1, seq_origin=ORIGIN)
    d = encode_delete("cpu", 100, 200, [["host", "=", "a", "string"]])
    _take(pt, 0, d)
    assert pt.items == [(0, Delete(table="cpu", start_ns=100, stop_ns_exclusive=200,
                                   predicate=(("host", "=", "a", "string"),), seq=ORIGIN, kafka_partition=KP))]
    assert pt.nbytes == 0 and pt.visible_hi == 0


def test_a_committed_part_applies_at_its_marker_and_an_aborted_one_never():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
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
    pt = PartitionTail.starting_after(-1, seq_origin=0)
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
    pt = PartitionTail.starting_after(4, seq_origin=0)  # the part at offset 3 is in the consumer's stash
    _take(pt, 5, decision)
    assert pt.blocked_at == 5 and pt.visible_hi == 4


def test_a_committed_delete_part_applies_at_its_marker():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    d = encode_delete(None, 0, 10, [])
    _take(pt, 0, as_part(d, "t1", coordinator_kp=3))
    assert pt.nbytes == len(d.value)
    _take(pt, 1, encode_marker("t1", "commit", KP))
    assert [(o, it.seq, it.table) for o, it in pt.items] == [(1, seq_base(0, 1), None)]
    assert pt.nbytes == 0


def test_trim_drops_what_the_consumer_applied_and_restarts_when_it_is_ahead():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
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
    t = tail_rows(writes, [("host", "string"), ("region", "string"), ("usage", "float")], seq_origin=ORIGIN)
    assert t.column_names == ["host", "region", "usage", "time_ns", "_iox_seq"]
    assert t.to_pylist() == [
        {"host": "a", "region": None, "usage": 1.0, "time_ns": T0, "_iox_seq": seq_base(ORIGIN, 7)},
        {"host": "b", "region": None, "usage": 2.0, "time_ns": T0 + 1, "_iox_seq": seq_base(ORIGIN, 7) + 1},
        {"host": "a", "region": None, "usage": 3.0, "time_ns": T0 + 2, "_iox_seq": seq_base(ORIGIN, 12)}]
    assert tail_rows([writes[1]], [("host", "string")], seq_origin=0) is None


def test_the_schema_and_days_headers_are_kept():
    w = _write(rows=((T0, "a", 1.0), (T0 + 86_400 * 10**9, "a", 2.0)))
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    _take(pt, 0, w)
    it = pt.items[0][1]
    assert [list(c) for c in it.columns] == json.loads(dict(w.headers)["iox-schema"])
    assert it.spans == ((T0, T0), (T0 + 86_400 * 10**9, T0 + 86_400 * 10**9))


def _offer(pt, offset, msg, now=0.0, room=ROOM):
    pt.offer(offset, dict(msg.headers), msg.value, KP, room, now)


def test_this_servers_acknowledged_messages_are_held_without_reading_them_back():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w0, w1 = _write(rows=((T0, "a", 1.0),)), _write(rows=((T0 + 1, "b", 2.0),))
    _offer(pt, 0, w0)
    _offer(pt, 1, w1)
    assert pt.visible_hi == 1 and [o for o, _ in pt.items] == [0, 1]
    assert [it.payload for _, it in pt.items] == [w0.value, w1.value]
    assert pt.nbytes == len(w0.value) + len(w1.value) and pt.early == {} and pt.gap_since is None


def test_acknowledgements_out_of_order_wait_for_the_offsets_before_them():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _offer(pt, 2, w, now=5.0)
    _offer(pt, 1, w, now=5.01)
    assert pt.visible_hi == -1 and pt.items == [] and sorted(pt.early) == [1, 2] and pt.gap_since == 5.0
    assert pt.nbytes == 0  # waiting, not held
    _offer(pt, 0, w, now=5.02)
    assert pt.visible_hi == 2 and [o for o, _ in pt.items] == [0, 1, 2]
    assert pt.early == {} and pt.gap_since is None and pt.nbytes == 3 * len(w.value)


def test_a_gap_another_producer_left_is_filled_from_kafka_then_the_early_ones_follow():
    pt = PartitionTail.starting_after(9, seq_origin=0)
    ours, theirs = _write(rows=((T0, "a", 1.0),)), _write(rows=((T0, "z", 9.0),))
    _offer(pt, 12, ours, now=1.0)
    _offer(pt, 13, ours, now=1.0)
    assert pt.visible_hi == 9 and pt.gap_since == 1.0
    _take(pt, 10, theirs)  # read from Kafka
    assert pt.visible_hi == 10 and sorted(pt.early) == [12, 13]
    _take(pt, 11, theirs)
    assert pt.visible_hi == 13 and [o for o, _ in pt.items] == [10, 11, 12, 13]
    assert pt.early == {} and pt.gap_since is None
    _take(pt, 12, ours)  # the same messages read from Kafka too: ignored
    _offer(pt, 11, theirs)
    assert [o for o, _ in pt.items] == [10, 11, 12, 13] and pt.next_offset == 14


def test_a_message_read_from_kafka_first_is_not_held_twice():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _take(pt, 0, w)
    _offer(pt, 0, w)
    assert [o for o, _ in pt.items] == [0] and pt.nbytes == len(w.value)


def test_a_blocked_partition_drops_what_it_is_offered_and_a_restart_reads_it_from_kafka():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _offer(pt, 2, w)
    _offer(pt, 0, w, room=len(w.value) - 1)  # past the byte budget: blocks at 0
    assert pt.blocked_at == 0 and pt.early == {} and pt.gap_since is None
    _offer(pt, 1, w)
    assert pt.early == {} and pt.items == []
    assert pt.trim(0) is True  # the consumer applied the blocking message: read again after it
    assert (pt.next_offset, pt.blocked_at, pt.early) == (1, None, {})


def test_a_restart_at_the_applied_watermark_forgets_the_early_messages():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _offer(pt, 5, w, now=2.0)
    assert pt.trim(3) is True  # the consumer is ahead of the tail
    assert (pt.next_offset, pt.early, pt.gap_since) == (4, {}, None)


def test_the_early_messages_are_bounded():
    from iox_spark.server.query.tail import MAX_EARLY

    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    for off in range(1, MAX_EARLY + 3):
        _offer(pt, off, w)
    assert len(pt.early) == MAX_EARLY and max(pt.early) == MAX_EARLY
    _offer(pt, 0, w)
    assert pt.visible_hi == MAX_EARLY and pt.early == {}  # the rest is read from Kafka


def test_a_full_tail_waits_until_what_it_dropped_is_small_before_reading_kafka_again():
    from iox_spark.server.query.tail import RESUME_BACKLOG_SHARE

    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    n = len(w.value)
    _offer(pt, 0, w, room=n)
    _offer(pt, 1, w, room=0)  # the budget is spent: blocked, and what follows is only counted
    for off in (2, 3, 4):
        _offer(pt, off, w, room=0)
    assert (pt.blocked_at, pt.full, pt.dropped) == (1, True, [(1, n), (2, n), (3, n), (4, n)])
    room = RESUME_BACKLOG_SHARE * n  # a backlog of one message may be read back from Kafka
    # the consumer applied 0-2: 3 and 4 are left (2n bytes): stay blocked, at the next unapplied offset
    assert pt.trim(2, room_bytes=room) is False
    assert (pt.blocked_at, pt.next_offset, pt.visible_hi, pt.items, pt.nbytes) == (3, 3, 2, [], 0)
    assert pt.dropped == [(3, n), (4, n)]
    # 3 applied: one message left, read from Kafka after the applied watermark
    assert pt.trim(3, room_bytes=room) is True
    assert (pt.blocked_at, pt.full, pt.dropped, pt.next_offset) == (None, False, [], 4)


def test_a_block_for_what_a_message_is_restarts_as_soon_as_it_is_applied():
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _take(pt, 0, w)
    _take(pt, 1, _write(), room=0)
    assert pt.full is True
    pt2 = PartitionTail.starting_after(-1, seq_origin=0)
    unknown = _headers(w, iox_format=b"99")
    pt2.take(0, unknown, w.value, KP, ROOM)
    assert pt2.blocked_at == 0 and pt2.full is False
    assert pt2.trim(0, room_bytes=0) is True and pt2.next_offset == 1


def test_a_delete_the_consumer_fails_to_apply_blocks_instead_of_stopping_the_tail():
    """A delete whose value parses but cannot be applied (an infinite start time: the consumer
    fails on it and sets it aside, server/write_buffer/poison.py) is not held as if it were applied: the
    partition blocks at it, alone or as a committed part (with the part's write beside it)."""
    import dataclasses

    bad = b'{"table":"cpu","start_ns":1e999,"stop_ns_exclusive":10,"predicate":[]}'
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    _take(pt, 0, _write())
    _take(pt, 1, dataclasses.replace(encode_delete("cpu", 0, 10, []), value=bad))
    assert pt.blocked_at == 1 and pt.visible_hi == 0 and [o for o, _it in pt.items] == [0]
    pt = PartitionTail.starting_after(-1, seq_origin=0)
    w = _write()
    _take(pt, 0, as_part(w, "t1", coordinator_kp=3))
    _take(pt, 1, as_part(dataclasses.replace(encode_delete("cpu", 0, 10, []), value=bad), "t1", coordinator_kp=3))
    _take(pt, 2, encode_marker("t1", "commit", KP))
    assert pt.blocked_at == 2 and pt.visible_hi == 1 and pt.items == [] and pt.nbytes == 0  # parts: invisible
