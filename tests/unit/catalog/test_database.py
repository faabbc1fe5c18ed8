"""catalog/catalog.py `Database`: its operations (holds, claims, epochs, losses) keep its state,
each under the catalog's lock."""
from __future__ import annotations

import threading

import pytest

from iox_spark.catalog.catalog import (ACCEPTED, FENCED, FROZEN, HELD, NOT_OWNED, RETRYING, Catalog, LostWriteRange,
                             PoisonedMessage, TablePartition)
from iox_spark.catalog.transactions import TxnLog


def _poisoned(kp: int, offset: int, state: str = HELD, epoch: int = 0) -> PoisonedMessage:
    return PoisonedMessage(partition=kp, offset=offset, epoch=epoch, table="cpu", kind="write", error="boom",
                           detected_at_s=1.0, last_failed_at_s=1.0, state=state)


def test_holds_of_each_reason_merge_to_the_lowest_offset_and_release_apart():
    db = Catalog().ensure_database("d", "iox.d", 3)
    assert not db.may_hold and db.held_offsets() == {}
    db.hold(FENCED, {0: 9, 1: 9, 2: 9})
    db.hold(FROZEN, {0: 4, 2: 12})
    db.hold(NOT_OWNED, {1: 0})
    db.add_poisoned(_poisoned(2, 7))
    db.add_poisoned(_poisoned(0, 1, epoch=5))  # of another epoch: holds nothing
    assert db.held_offsets() == {0: 4, 1: 0, 2: 7}
    assert db.hold_reasons() == {0: [(4, "frozen"), (9, "fenced")], 1: [(0, "not owned"), (9, "fenced")],
                                 2: [(7, "poisoned message"), (9, "fenced"), (12, "frozen")]}
    db.hold(FROZEN, {0: 6})  # in place of its earlier hold of 0
    assert db.holds(FROZEN) == {0: 6, 2: 12}
    db.release(NOT_OWNED, [1, 2])
    db.release(FROZEN)
    assert db.holds(FROZEN) == {} and db.holds(NOT_OWNED) == {}
    assert db.held_offsets() == {0: 9, 1: 9, 2: 7}
    db.drop_poisoned(list(db.poisoned))
    db.release(FENCED)
    assert not db.may_hold and db.held_offsets() == {}
    with pytest.raises(ValueError, match="unknown hold reason"):
        db.hold("tired", {0: 1})


def test_a_pool_member_applies_only_what_it_claimed_and_holds_what_it_lost_after_its_applied_offset():
    cat = Catalog()
    cat.pool_member = True
    db = cat.ensure_database("d", "iox.d", 3)
    assert db.owned_partitions == frozenset() and db.held_offsets() == {0: 0, 1: 0, 2: 0}
    db.own_only({1})  # at start, what the catalog says it owns
    assert db.owned_partitions == frozenset({1}) and db.holds(NOT_OWNED) == {0: 0, 2: 0}
    db.adopt_claim({0: 40, 2: 7})
    assert db.owned_partitions == frozenset({0, 1, 2}) and db.holds(NOT_OWNED) == {}
    assert db.applied_hi_inclusive == {0: 39, 1: -1, 2: 6}
    cat.advance_applied(db, {0: 45})
    assert db.lose_claim({0, 2})
    assert db.owned_partitions == frozenset({1}) and db.holds(NOT_OWNED) == {0: 46, 2: 7}
    assert not db.lose_claim({0})  # owns it no more: nothing changes
    assert db.holds(NOT_OWNED) == {0: 46, 2: 7}


def test_a_frozen_catalog_holds_every_database_also_those_created_while_frozen():
    cat = Catalog()
    a = cat.ensure_database("a", "iox.a", 2)
    cat.advance_applied(a, {0: 3})
    assert cat.freeze({"a": {1: 8}}) == {"a": {0: 3, 1: 8}}
    assert a.holds(FROZEN) == {0: 4, 1: 9}
    b = cat.ensure_database("b", "iox.b", 2)
    assert b.holds(FROZEN) == {0: 0, 1: 0}
    cat.unfreeze()
    assert a.holds(FROZEN) == {} and b.holds(FROZEN) == {} and not a.may_hold


def test_continuing_in_a_new_epoch_forgets_what_belonged_to_the_old_one():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    db.set_epoch(2, 1000)
    cat.advance_applied(db, {0: 50, 1: 60})
    db.add_poisoned(_poisoned(0, 3, epoch=2))
    db.add_poisoned(_poisoned(1, 4, state=ACCEPTED, epoch=2))
    assert db.mark_topic_replaced() and not db.mark_topic_replaced()
    db.record_tail_truncated({1: 20})
    db.failed_batch_hi[0] = 50
    part = db.partitions.setdefault("cpu", {}).setdefault("2026-12-03", TablePartition("cpu", "2026-12-03"))
    part.windows = object()
    lost = [LostWriteRange(0, 51, 70, 5.0, "gone", accepted=True, accepted_at_s=6.0, epoch=2)]
    old_txns = db.txns
    db.continue_in_epoch(3, 5000, "tid-2", lost, {0: 70, 1: 20})
    assert (db.epoch, db.seq_origin, db.topic_id, db.topic_replaced, db.tail_truncated) == (3, 5000, "tid-2", False, None)
    assert db.applied_hi_inclusive == {0: 69, 1: 19} and db.failed_batch_hi == {}
    assert db.lost_writes == lost and db.txns is not old_txns and isinstance(db.txns, TxnLog)
    assert [(r.partition, r.state) for r in db.poisoned] == [(1, ACCEPTED)]
    assert part.windows is None


def test_losses_are_recorded_accepted_and_merged_with_one_found_again_at_start():
    db = Catalog().ensure_database("d", "iox.d", 2)
    running = LostWriteRange(0, 5, 9, 10.0, "tail lost", epoch=1)
    db.record_lost_writes([running])
    found = LostWriteRange(0, 5, None, 20.0, "at start", accepted=True, accepted_at_s=20.0, epoch=1)
    db.merge_lost_write(found, 20.0)  # the same loss: kept, accepted now
    assert [(r.reason, r.accepted, r.accepted_at_s) for r in db.lost_writes] == [("tail lost", True, 20.0)]
    db.record_lost_writes([LostWriteRange(1, 0, 3, 30.0, "topic gone", epoch=1)])
    accepted = db.accept_lost_writes(40.0)
    assert [(r.partition, r.accepted_at_s) for r in accepted] == [(0, 20.0), (1, 40.0)]
    assert db.lost_writes == accepted


def test_a_poisoned_message_retried_and_failing_again_counts_the_attempt():
    r = _poisoned(0, 3)
    r.failed_again("again", 2.0)
    assert (r.state, r.attempts, r.error) == (HELD, 1, "again")
    r.retry()
    assert r.state == RETRYING
    r.failed_again("third", 3.0)
    assert (r.state, r.attempts, r.error, r.last_failed_at_s) == (HELD, 2, "third", 3.0)
    r.accept(4.0)
    assert (r.state, r.accepted_at_s) == (ACCEPTED, 4.0)


def test_retention_and_tables_and_the_transaction_log():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 1)
    db.set_retention(0, None)
    assert db.retention_period_s is None
    db.set_retention(3600, 100)
    db.raise_reader_lo(50)  # never down
    db.raise_reader_lo(150)
    db.set_pruner_hi(120)
    assert (db.retention_period_s, db.reader_lo_ns, db.pruner_hi_ns) == (3600, 150, 120)
    db.note_queried(["cpu", "mem"], 7.0)
    assert db.queried_at == {"cpu": 7.0, "mem": 7.0}
    part = cat.partition(db, "cpu", "2026-12-03")
    assert not db.drop_partition("cpu", "2026-12-03", TablePartition("cpu", "2026-12-03"))  # not that one
    assert db.drop_partition("cpu", "2026-12-03", part) and db.partitions["cpu"] == {}
    staged = TxnLog()
    db.install_txns(staged)
    assert db.txns is staged
    db.note_skipped(0, 5, "bad header")
    db.note_skipped(0, 9, "worse header")
    assert db.skipped_messages == {0: (2, 9, "worse header")}
    assert db.adopt_topic_id("t1") is None and db.adopt_topic_id("t2") == "t1" and db.topic_id == "t1"


def test_an_operation_waits_for_the_catalog_lock_another_thread_holds():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 1)
    with cat.lock:
        db.hold(FENCED, {0: 1})  # reentrant: the holder may call them
        t = threading.Thread(target=db.hold, args=(FROZEN, {0: 2}))
        t.start()
        t.join(0.2)
        assert t.is_alive() and db.holds(FROZEN) == {}  # cannot run before the lock is released
    t.join(10)
    assert not t.is_alive() and db.holds(FROZEN) == {0: 2}


def test_reads_return_copies_taken_at_one_instant():
    from iox_spark.catalog.schema import Column

    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    cat.advance_applied(db, {0: 4})
    db.hold(FROZEN, {1: 3})
    applied, held = db.applied_and_held()
    assert (applied, held) == ({0: 4, 1: -1}, {1: 3}) and db.applied_offsets() == {0: 4, 1: -1}
    applied[0] = 99  # a copy: the database is not changed through it
    assert db.applied_offsets() == {0: 4, 1: -1}
    assert db.owned() == {0, 1}
    db.own_only([1])
    assert db.owned() == {1}
    assert db.incarnation() == ("iox.d", None, 0)
    db.schemas.check_and_reserve({"cpu": [Column("host", "tag", "string"), Column("v", "field", "float")]})
    cat.partition(db, "mem", "2026-12-04")
    assert db.known_tables() == ["cpu", "mem"]
    assert db.table_columns() == {"cpu": [("host", "tag", "string"), ("v", "field", "float")]}
    cat.set_partition_checkpoint(db, "disk", "2026-12-04", "ck")
    assert db.partitions["disk"]["2026-12-04"].checkpoint == "ck"
    assert db.loss_state() == ([], False, None) and db.lost_write_entries() == ()
    lost = LostWriteRange(0, 5, 9, 10.0, "tail lost", epoch=0)
    db.record_lost_writes([lost])
    db.record_tail_truncated({0: 5})
    open_ranges, replaced, truncated = db.loss_state()
    assert open_ranges == [lost] and not replaced and truncated == {0: 5}
    assert db.lost_write_entries() == (lost.entry(),)
