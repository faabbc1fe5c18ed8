"""catalog/catalog.py: adding chunks, including a micro-batch retried after a failure (its chunks
withdrawn, its offsets already recorded in the persistence windows)."""
from __future__ import annotations

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.errors import OffsetNotIncreasing


def _chunk(cid: int, offsets: dict, rows: int = 3) -> Chunk:
    return Chunk(id=cid, table="cpu", partition_key="2023-11-14", order=cid, state="open", rows=rows,
                 size_bytes=10, min_time_ns=0, max_time_ns=10, columns=[], view=None, offsets=offsets)


def _windows(cat, db):
    return cat.get_partition(db, "cpu", "2023-11-14").windows


def test_offsets_seen_before_raise_and_change_nothing():
    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    cat.add_chunk(db, _chunk(1, {0: (0, 4)}), now=100.0)
    with pytest.raises(OffsetNotIncreasing):
        cat.add_chunk(db, _chunk(2, {0: (3, 6)}), now=101.0)
    assert [c.id for c in cat.table_chunks(db, "cpu")] == [1]
    assert cat.table_chunks(db, "cpu")[0].state == "open"


def test_a_withdrawn_batch_added_again_records_only_unseen_offsets():
    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    first = _chunk(1, {0: (0, 4)})
    cat.add_chunk(db, first, now=100.0)
    failed = _chunk(2, {0: (5, 9), 1: (0, 2)})
    cat.add_chunk(db, failed, now=101.0, seen_before_ok=True)
    assert cat.withdraw_chunks(db, [failed]) == [failed]
    assert cat.withdraw_chunks(db, [failed]) == []  # gone already
    assert [c.id for c in cat.table_chunks(db, "cpu")] == [1]
    # the retry read further on partition 0 and found partition 1 as before
    retry = _chunk(3, {0: (5, 12), 1: (0, 2)})
    cat.add_chunk(db, retry, now=102.0, seen_before_ok=True)
    assert [c.id for c in cat.table_chunks(db, "cpu")] == [1, 3]
    w = _windows(cat, db)
    assert w.unseen_ranges({0: (0, 12), 1: (0, 2)}) == {}
    assert w.unseen_ranges({0: (10, 14), 1: (3, 3), 2: (0, 0)}) == {0: (13, 14), 1: (3, 3), 2: (0, 0)}
    # what replay must read still starts at the first batch's offsets
    assert {kp: (o.min_unpersisted_offset, o.max_seen_offset) for kp, o in w.offset_ranges().items()} == \
        {0: (0, 12), 1: (0, 2)}


def test_a_withdrawn_batch_holds_persists_until_its_offsets_are_applied_again():
    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    cat.add_chunk(db, _chunk(1, {0: (0, 4)}), now=100.0)
    cat.advance_applied(db, {0: 4})
    assert db.failed_batch_hi == {}
    failed = [_chunk(2, {0: (5, 9), 1: (0, 2)}), _chunk(3, {0: (7, 11)})]
    for ch in failed:
        cat.add_chunk(db, ch, now=101.0, seen_before_ok=True)
    cat.withdraw_chunks(db, failed)
    assert db.failed_batch_hi == {0: 11, 1: 2}
    cat.advance_applied(db, {0: 10, 1: 2})  # partition 1 applied again, partition 0 not up to 11 yet
    assert db.failed_batch_hi == {0: 11}
    cat.advance_applied(db, {0: 11})
    assert db.failed_batch_hi == {}


def test_a_database_checkpoint_records_the_seq_origin():
    """Every database checkpoint (persist, clean stop, recovery) carries the origin its seqs use."""
    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    assert (db.epoch, db.seq_origin) == (0, 0) and db.checkpoint_action({}).seq_origin == 0
    db.epoch, db.seq_origin = 300, 77 << 20
    ck = db.checkpoint_action({0: (None, 5)}, complete=True)
    assert (ck.epoch, ck.seq_origin, ck.complete, ck.sequencer_numbers) == (300, 77 << 20, True, {0: (None, 5)})


def test_a_held_message_forgets_what_failed_attempts_recorded_after_it_and_ends_their_hold_on_persists():
    """A micro-batch attempt recorded offsets 5..9 of Kafka partition 0 and was withdrawn; the
    message at 7 is held (server/write_buffer/poison.py): the windows keep 5..6 only (no persist may claim 7..9),
    persists are no longer held for partition 0, and 7..9 are recorded again once applied."""
    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    cat.add_chunk(db, _chunk(1, {0: (0, 4), 1: (0, 2)}), now=100.0)
    cat.advance_applied(db, {0: 4, 1: 2})
    failed = _chunk(2, {0: (5, 9)})
    cat.add_chunk(db, failed, now=101.0, seen_before_ok=True)
    cat.withdraw_chunks(db, [failed])
    assert db.failed_batch_hi == {0: 9}
    ok = _chunk(3, {0: (5, 6)})
    cat.add_chunk(db, ok, now=102.0, seen_before_ok=True)  # the prefix before the held message
    cat.advance_applied(db, {0: 6})
    assert db.failed_batch_hi == {0: 9}
    cat.forget_unapplied(db, 0, 7)
    assert db.failed_batch_hi == {}
    ranges = _windows(cat, db).offset_ranges()
    assert (ranges[0].min_unpersisted_offset, ranges[0].max_seen_offset) == (0, 6)
    assert (ranges[1].min_unpersisted_offset, ranges[1].max_seen_offset) == (0, 2)
    # resolved: 7..9 are applied and recorded again
    cat.add_chunk(db, _chunk(4, {0: (7, 9)}), now=103.0, seen_before_ok=True)
    assert _windows(cat, db).offset_ranges()[0].max_seen_offset == 9


def test_a_batch_being_applied_pins_replay_at_its_first_offsets_until_it_ends():
    from iox_spark.catalog.transactions import PART, TxnRecord

    cat = Catalog()
    db = cat.ensure_database("d", "t", 2)
    other = cat.ensure_database("e", "u", 2)
    assert cat.replay_pins(db, {}) == {}
    # a transaction part without a marker pins its own offset
    db.txns.apply_batch([TxnRecord(kp=1, offset=7, kind=PART, txn="x", ts_ms=0, coordinator_kp=1)], {1: 7}, 0.0)
    assert cat.replay_pins(db, {}) == {1: 7}
    # a batch being applied: its chunks may be in the catalog before its transaction state
    cat.begin_applying({"d": {0: 20, 1: 9}, "e": {0: 3}})
    cat.add_chunk(db, _chunk(1, {0: (21, 21)}), now=100.0)
    assert cat.replay_pins(db, {0: 21}) == {0: 20, 1: 7}
    assert cat.replay_pins(other, {}) == {0: 3}
    cat.end_applying(["d"])
    assert cat.replay_pins(db, {0: 21}) == {1: 7}
    assert cat.replay_pins(other, {}) == {0: 3}
    cat.end_applying(["e"])
    assert cat.replay_pins(other, {}) == {}
