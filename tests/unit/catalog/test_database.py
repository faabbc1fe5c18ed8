"""catalog/catalog.py `Database`: its operations (holds, claims, epochs, losses) keep its state,
each under the catalog's lock."""
from __future__ import annotations

import threading

import pytest

from iox_spark.catalog.catalog import (ACCEPTED, FENCED, FROZEN, HELD, NOT_OWNED, RETRYING, Catalog, LostWriteRange,
                             PoisonedMessage, TablePartition)
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.sharding import partition_for
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
    cat = Catalog(pool_member=True)
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


def test_a_replaced_topic_records_the_acknowledged_offsets_past_the_applied_ones_once():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 3)
    db.adopt_topic_id("id-1")
    cat.advance_applied(db, {0: 4, 1: 9})
    assert db.tail_check_state() == (0, {0: 4, 1: 9, 2: -1})
    ranges = db.record_topic_replaced({0: 7, 1: 9, 2: 1}, 50.0, "gone")
    assert [(r.partition, r.from_offset, r.to_exclusive, r.reason) for r in ranges] == [(0, 5, 8, "gone"), (2, 0, 2, "gone")]
    assert db.topic_replaced and db.lost_writes == ranges and db.tail_check_state() is None
    assert db.record_topic_replaced({0: 20}, 60.0, "again") is None and db.lost_writes == ranges  # known: nothing


def test_a_lost_tail_records_what_was_acknowledged_past_kafkas_end_and_the_applied_offsets():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 3)
    db.adopt_topic_id("id-1")
    cat.advance_applied(db, {0: 4, 1: 2})
    assert db.record_tail_lost(1, {0: 3}, {0: 9}, 50.0) is None  # read in another epoch: nothing
    ranges = db.record_tail_lost(0, {0: 3, 1: 6, 2: 0}, {0: 9, 1: 5, 2: 2}, 50.0)
    # kp 0: applied up to 4, so lost from 5; kp 1: acknowledged below Kafka's end, nothing lost
    assert [(r.partition, r.from_offset, r.to_exclusive) for r in ranges] == [(0, 5, 10), (2, 0, 3)]
    assert db.tail_truncated == {0: 3, 1: 6, 2: 0} and db.lost_writes == ranges
    assert db.record_tail_lost(0, {0: 3}, {0: 9}, 60.0) is None and db.tail_check_state() is None


def test_lost_write_entries_as_accepted_change_nothing():
    db = Catalog().ensure_database("d", "iox.d", 2)
    db.record_lost_writes([LostWriteRange(0, 5, 9, 10.0, "tail lost", epoch=0),
                           LostWriteRange(1, 0, 3, 20.0, "gone", accepted=True, accepted_at_s=25.0, epoch=0)])
    entries = db.lost_write_entries(accepted_at_s=30.0)
    assert [(e.partition, e.accepted_at_s) for e in entries] == [(0, 30.0), (1, 25.0)]
    assert [r.accepted for r in db.lost_write_ranges()] == [False, True]


def test_poisoned_messages_are_selected_retried_and_accepted_through_the_database():
    db = Catalog().ensure_database("d", "iox.d", 2)
    a, b, old = _poisoned(0, 3), _poisoned(1, 7), _poisoned(1, 2, epoch=5)
    done = _poisoned(0, 1, state=ACCEPTED)
    for r in (b, a, old, done):
        db.add_poisoned(r)
    assert db.poisoned_of() == [a, b] and db.poisoned_of(1) == [b] and db.poisoned_of(1, 8) == []
    assert db.retry_poisoned(0) == [a] and a.state == RETRYING and b.state == HELD
    records, entries = db.poison_acceptance(1, 7, 40.0)
    assert records == [b] and b.state == HELD  # nothing changes before the record is committed
    assert [(e.partition, e.offset, e.accepted_at_s) for e in entries] == [(0, 1, 1.0), (1, 7, 40.0)]
    copies = db.poisoned_copies(records)
    db.accept_poisoned(records, 40.0)
    assert (b.state, b.accepted_at_s) == (ACCEPTED, 40.0) and copies[0].state == HELD and copies[0] is not b


def _chunk(cid: int, table: str, key: str, offsets: dict, state: str = "open") -> Chunk:
    return Chunk(id=cid, table=table, partition_key=key, order=cid, state=state, rows=3, size_bytes=10,
                 min_time_ns=0, max_time_ns=10, columns=[], view=None, offsets=offsets)


def test_partitions_chunks_and_unpersisted_rows_through_the_database():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 4)
    tables = sorted({"cpu", "mem", "disk", "net", "io"}, key=lambda t: partition_for(t, 4))
    a, b = tables[0], next(t for t in tables if partition_for(t, 4) != partition_for(tables[0], 4))
    assert not db.has_unpersisted_rows()
    cat.add_chunk(db, _chunk(1, a, "2026-12-01", {0: (0, 2)}), now=10.0)
    cat.add_chunk(db, _chunk(2, a, "2026-12-02", {0: (3, 4)}), now=10.0)
    cat.add_chunk(db, _chunk(3, b, "2026-12-01", {1: (0, 1)}, state="persisted"))
    assert db.partition_keys() == sorted([(a, "2026-12-01"), (a, "2026-12-02"), (b, "2026-12-01")])
    assert db.partition_keys(a, "2026-12-02") == [(a, "2026-12-02")] and db.partition_keys("none") == []
    assert db.has_unpersisted_rows()
    assert db.close_chunks_of(lambda t: t == a) == [a]
    assert {c.state for c in cat.table_chunks(db, a)} == {"closed"}
    dropped, changed = db.drop_unpersisted_of({partition_for(a, 4)}, ("persisted", "unloaded"))
    assert sorted(c.id for c in dropped) == [1, 2] and changed == {a}
    assert [c.id for c in cat.table_chunks(db, b)] == [3] and not db.has_unpersisted_rows()


def test_reads_of_offsets_with_their_epoch_and_the_transactions_to_stage():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    db.set_epoch(2, 1000)
    cat.advance_applied(db, {0: 5})
    assert db.applied_in_epoch() == ({0: 5, 1: -1}, 2, "iox.d")
    db.hold(FROZEN, {1: 0})
    assert db.tail_state() == ("iox.d", 1000, {0: 5, 1: -1}, {1: 0})
    hi_after, txns = db.txns_to_stage({1: 7, 0: 2})
    assert hi_after == {0: 5, 1: 7} and txns is not db.txns and isinstance(txns, TxnLog)
    assert db.due_txn_repairs(1e9, 30.0) == [] and db.txns_undecided_elsewhere(1e9) is None


def test_a_message_set_aside_is_held_and_settles_once_applied_on_retry():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    r = cat.set_aside_poisoned(db, 1, 4, "cpu", "write", "boom", 5.0)
    assert db.held_offsets() == {1: 4} and (r.state, r.attempts) == (HELD, 1)
    assert db.retry_poisoned(1, 4) == [r]
    assert db.set_aside_poisoned(1, 4, "cpu", "write", "again", 6.0) is r and (r.state, r.attempts) == (HELD, 2)
    db.retry_poisoned(1, 4)
    assert db.settle_retried() == []  # offset 4 not applied yet
    cat.advance_applied(db, {1: 4})
    assert db.settle_retried() == [r] and db.poisoned == []


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
    with cat._lock:  # the catalog's own test: its lock, held as its operations hold it
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


def test_what_a_persist_request_and_a_clean_stop_see_as_unpersisted():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    assert db.unpersisted_partitions() == [] and cat.unpersisted_at_stop(db) == ([], {})
    cat.add_chunk(db, _chunk(1, "cpu", "2026-12-01", {0: (0, 2)}), now=10.0)
    cat.add_chunk(db, _chunk(2, "cpu", "2026-12-02", {0: (3, 4)}), now=10.0)
    cat.advance_applied(db, {0: 4})
    cat.get_partition(db, "cpu", "2026-12-02").hold_for("compacting")
    assert db.unpersisted_partitions() == [("cpu", "2026-12-01", None),
                                           ("cpu", "2026-12-02", "a persist or compaction of it was running")]
    assert db.unpersisted_partitions("cpu", "2026-12-01") == [("cpu", "2026-12-01", None)]
    assert db.unpersisted_partitions("mem") == []
    db.failed_batch_hi = {0: 4}
    assert db.unpersisted_partitions(partition_key="2026-12-01") == [
        ("cpu", "2026-12-01", "a micro-batch that failed is not applied again yet")]
    unpersisted, applied = cat.unpersisted_at_stop(db)
    assert sorted(unpersisted) == [("cpu", "2026-12-01"), ("cpu", "2026-12-02")] and applied == {0: 4}


def test_a_table_read_and_a_check_read_their_inputs_at_one_instant():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    cat.add_chunk(db, _chunk(1, "cpu", "2026-12-01", {0: (0, 2)}), now=10.0)
    schema, chunks, deletes = cat.owned_table_read(db, "cpu", ())
    assert chunks == [] and deletes == []  # a chunk without a view is not read
    cat.table_chunks(db, "cpu")[0].view = "v1"
    assert [c.id for c in cat.owned_table_read(db, "cpu", ())[1]] == [1]
    assert cat.owned_table_read(db, "cpu", ("open",))[1] == []
    schemas, origin, accepted, files_min_seq, retention = db.verify_inputs(["cpu", "mem"], 0)
    assert set(schemas) == {"cpu", "mem"} and schemas["mem"] is None
    assert accepted == set() and files_min_seq == {"cpu": [], "mem": []}
    assert (origin, retention) == (db.seq_origin, db.retention_period_s)


def test_a_snapshot_copies_what_status_shows_at_one_instant():
    from iox_spark.catalog.schema import Column

    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    db.schemas.check_and_reserve({"cpu": [Column("host", "tag", "string"), Column("v", "field", "float")]})
    cat.add_chunk(db, _chunk(1, "cpu", "2026-12-01", {0: (0, 2)}), now=10.0)
    cat.add_chunk(db, _chunk(2, "cpu", "2026-12-02", {0: (3, 4)}), now=10.0)
    held = _poisoned(1, 7)
    db.add_poisoned(held)
    lost = LostWriteRange(0, 5, 9, 10.0, "tail lost", epoch=0)
    db.record_lost_writes([lost])
    snap = db.snapshot()
    assert (snap.name, snap.topic, snap.kafka_partitions, snap.epoch) == ("d", "iox.d", 2, 0)
    assert [t.name for t in snap.tables] == ["cpu"]
    assert [c.name for c in snap.tables[0].columns] == ["host", "v"]
    assert [(p.key, [c.id for c in p.chunks], p.unpersisted_rows) for p in snap.tables[0].partitions] == [
        ("2026-12-01", [1], 3), ("2026-12-02", [2], 3)]
    assert snap.lost_writes == (lost,) and [(r.offset, r.state) for r in snap.poisoned] == [(7, HELD)]
    # later changes leave the snapshot as it was
    cat.add_chunk(db, _chunk(3, "mem", "2026-12-02", {1: (0, 0)}), now=11.0)
    held.retry()
    cat.table_chunks(db, "cpu")[0].state = "closed"
    assert [t.name for t in snap.tables] == ["cpu"] and snap.poisoned[0].state == HELD
    assert snap.tables[0].partitions[0].chunks[0].state == "open"
    assert [t.name for t in db.snapshot().tables] == ["cpu", "mem"]


def test_a_new_epoch_waits_for_unpersisted_rows_a_failed_batch_and_what_kafka_still_holds():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    cat.advance_applied(db, {0: 4})
    lost = LostWriteRange(1, 0, 3, 10.0, "tail lost", epoch=0)
    db.record_lost_writes([lost])
    assert db.new_epoch_readiness({0: 5, 1: 0}, cut_short=True) == (None, 4, 1, [lost])
    assert db.new_epoch_readiness({0: 0, 1: 0}, cut_short=False)[0] is None
    why = db.new_epoch_readiness({0: 9, 1: 0}, cut_short=True)[0]
    assert why == "what Kafka still holds is not applied yet (partition: (applied, end) {0: (4, 9)})"
    db.own_only([1])  # a pool member waits only for the partitions it owns
    assert db.new_epoch_readiness({0: 9, 1: 0}, cut_short=True)[0] is None
    db.failed_batch_hi = {0: 4}
    assert db.new_epoch_readiness({0: 0, 1: 0}, cut_short=False)[0] == "a failed micro-batch is not applied again yet"
    cat.add_chunk(db, _chunk(1, "cpu", "2026-12-01", {0: (0, 2)}), now=10.0)
    assert db.new_epoch_readiness({0: 0, 1: 0}, cut_short=False)[0] == \
        "table partitions [('cpu', '2026-12-01')] still hold unpersisted rows"


def test_a_query_cut_reads_its_tables_and_the_callers_state_under_the_lock():
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    cat.add_chunk(db, _chunk(1, "cpu", "2026-12-01", {0: (0, 2)}), now=10.0)
    cat.add_chunk(db, _chunk(2, "mem", "2026-12-01", {1: (0, 1)}), now=10.0)
    cat.advance_applied(db, {0: 2, 1: 1})
    db.retention_period_s = 3600
    seen = []

    def locked_elsewhere() -> bool:  # whether another thread finds the catalog's lock taken
        out = []

        def try_lock():
            out.append(cat._lock.acquire(blocking=False))
            if out[0]:
                cat._lock.release()

        t = threading.Thread(target=try_lock)
        t.start()
        t.join(10)
        return not out[0]

    def at_cut(applied):
        seen.append(("cut", dict(applied), locked_elsewhere()))
        return {"writes": ["disk"]}

    def tables(extra):
        return ["cpu"] + extra["writes"]

    def read(table, chunks, deletes, schema, extra):
        seen.append((table, [c.id for c in chunks], locked_elsewhere()))
        return len(chunks)

    applied, retention, extra, reads = cat.query_cut(db, at_cut, tables, read)
    assert applied == {0: 2, 1: 1} and retention == 3600 and extra == {"writes": ["disk"]}
    assert reads == {"cpu": 1, "disk": 0}
    assert seen == [("cut", {0: 2, 1: 1}, True), ("cpu", [1], True), ("disk", [], True)]
    assert not locked_elsewhere()


def test_a_pool_members_refresh_drops_the_chunks_of_files_another_member_removed():
    from types import SimpleNamespace

    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    mine, theirs = (next(t for t in ("cpu", "mem", "disk", "net", "io") if partition_for(t, 2) == kp) for kp in (0, 1))
    db.own_only([0])
    for cid, table, key in ((1, mine, "m1"), (2, theirs, "t1"), (3, theirs, "t2")):
        c = _chunk(cid, table, "2026-12-01", {}, state="unloaded")
        c.parquet_keys = [key]
        cat.add_file(db, SimpleNamespace(key=key, table=table, partition_key="2026-12-01"), c)
    kept = {"t2"}
    known, dropped, changed = db.drop_stale_foreign_chunks(None, lambda k: k not in kept, kept.__contains__)
    assert known == {"t1", "t2"} and [c.id for c in dropped] == [2] and changed == {theirs}
    assert [c.id for c in cat.table_chunks(db, theirs)] == [3] and [c.id for c in cat.table_chunks(db, mine)] == [1]
    assert [f.key for f in db.partitions[theirs]["2026-12-01"].files] == ["t2"]
    # only the partitions touched are visited
    assert db.drop_stale_foreign_chunks({(mine, "2026-12-01")}, lambda k: True, lambda k: False) == (set(), [], set())
