"""Recovery (server/consume/recovery.py): the lost-offsets decisions (`lost_offsets`, `truncated_tail`), one
case per cause, and the seq origin and epoch a start gives each database (`recover`, with its Parquet views
stubbed)."""
from __future__ import annotations

import functools

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.preserved_catalog import (AddDeletePredicate, AddParquet, PreservedCatalog, RecordDatabaseCheckpoint,
                                       RecordPartitionCheckpoint)
from iox_spark.catalog.seq_layout import SEQ_MAX, SEQ_ROWS_PER_OFFSET, legacy_seq_origin, max_seq_offset
from iox_spark.server.consume import recovery
from iox_spark.server.consume.recovery import LostWrites, lost_offsets, truncated_tail
from iox_spark.server.write_buffer import tail_loss
from iox_spark.server.write_buffer.ack_log import AckedOffsets
from iox_spark.catalog.sharding import topic_for


def test_kafka_holds_everything_replay_needs():
    assert lost_offsets(10, 14, low_watermark=0, end_exclusive=15, topic_gone=False,
                        checkpoint_complete=False) == (False, None)
    # nothing unpersisted, Kafka holds exactly up to where replay starts
    assert lost_offsets(15, None, low_watermark=15, end_exclusive=15, topic_gone=False,
                        checkpoint_complete=False) == (False, None)


def test_retention_dropped_offsets_replay_needs():
    # the low watermark passed the plan's start: [start, low watermark) is gone
    assert lost_offsets(10, 14, low_watermark=12, end_exclusive=20, topic_gone=False,
                        checkpoint_complete=False) == (False, (10, 12))
    # also when nothing unpersisted is known: writes after the checkpoint started at 10
    assert lost_offsets(10, None, low_watermark=11, end_exclusive=20, topic_gone=False,
                        checkpoint_complete=True) == (False, (10, 11))


def test_topic_behind_the_catalog_is_a_reset():
    # unpersisted offsets known: exactly those are lost
    assert lost_offsets(10, 14, low_watermark=0, end_exclusive=3, topic_gone=False,
                        checkpoint_complete=False) == (True, (10, 15))
    # none known, but the checkpoint is not from a drained clean stop: from 10 on, end unknown
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=False,
                        checkpoint_complete=False) == (True, (10, None))
    # a drained clean stop persisted everything: the empty topic loses nothing
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=False,
                        checkpoint_complete=True) == (True, None)


def test_topic_gone_even_when_its_new_incarnation_is_longer():
    # the new topic already holds more than the old checkpoint: only the topic id tells
    assert lost_offsets(1, None, low_watermark=0, end_exclusive=4, topic_gone=True,
                        checkpoint_complete=False) == (True, (1, None))
    assert lost_offsets(1, 3, low_watermark=0, end_exclusive=40, topic_gone=True,
                        checkpoint_complete=False) == (True, (1, 4))
    assert lost_offsets(1, None, low_watermark=0, end_exclusive=40, topic_gone=True,
                        checkpoint_complete=True) == (True, None)


def test_a_reset_topic_loses_exactly_what_this_server_acknowledged_past_the_checkpoint():
    # the ack log knows the end the catalog does not: [start, highest acknowledged + 1)
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=True, checkpoint_complete=False,
                        acked_hi_inclusive=17) == (True, (10, 18))
    assert lost_offsets(10, 14, low_watermark=0, end_exclusive=0, topic_gone=True, checkpoint_complete=False,
                        acked_hi_inclusive=12) == (True, (10, 15))
    # every acknowledged write is persisted: nothing lost, although the stop was not a clean one
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=True, checkpoint_complete=False,
                        acked_hi_inclusive=9) == (True, None)


def test_a_broker_that_lost_its_tail():
    # Kafka ends at 5; the server acknowledged up to 9, nothing persisted: [5, 10) lost
    assert truncated_tail(0, None, None, acked_hi_inclusive=9, end_exclusive=5) == (True, (5, 10))
    # persisted up to 6 (replay starts at 7), acknowledged up to 9: only the unpersisted part is lost
    assert truncated_tail(7, 9, 9, acked_hi_inclusive=9, end_exclusive=5) == (True, (7, 10))
    # checkpointed unpersisted offsets count as written, also without the ack log
    assert truncated_tail(3, 8, 8, acked_hi_inclusive=None, end_exclusive=5) == (True, (5, 9))
    # everything persisted: offsets are given out again, nothing acknowledged is lost
    assert truncated_tail(10, None, 9, acked_hi_inclusive=9, end_exclusive=5) == (True, None)
    # Kafka holds every offset known written (exactly, or more)
    assert truncated_tail(0, None, None, acked_hi_inclusive=9, end_exclusive=10) == (False, None)
    assert truncated_tail(7, 9, 9, acked_hi_inclusive=12, end_exclusive=20) == (False, None)
    # nothing known written: nothing to compare
    assert truncated_tail(0, None, None, acked_hi_inclusive=None, end_exclusive=0) == (False, None)


@pytest.mark.parametrize("to, text", [(12, "[10, 12)"), (None, "from 10 on")])
def test_lost_writes_message_names_partition_range_and_flag(to, text):
    e = LostWrites("db1", 3, 10, to, reason="topic iox.db1 no longer exists")
    assert (e.database, e.partition, e.from_offset, e.to_exclusive) == ("db1", 3, 10, to)
    assert str(e) == (f"database 'db1': Kafka partition 3 no longer holds offsets {text} that are not "
                      f"persisted yet (topic iox.db1 no longer exists); refusing to start. Start with "
                      f"--skip-lost-writes to accept losing them and read from the oldest available offset.")


# --------------------------------------------------------------------------- seq origins of `recover`

DB = "db1"
TOPIC_ID = "AaIEvtMVcYCJieZB4rlcnA"
NOW = 1_700_000_000.0
SCHEMA = (("host", "tag", "string"), ("time", "time", "time"))


class _WriteBuffer:
    """A topic that holds offsets [0, end) of Kafka partition 0 (end 0: empty, as an in-memory
    broker after a clean stop)."""

    def __init__(self, end: int):
        self.end = end

    def topic_id(self, topic):
        return TOPIC_ID

    def partition_bounds(self, topic, partitions):
        return {kp: (0, self.end if kp == 0 else 0) for kp in range(partitions)}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "register_parquet_chunk", lambda *a, **k: "unused_view")
    return LocalObjectStore(tmp_path / "objects")


def _recover(store, end: int):
    catalog = Catalog()
    recovery.recover(None, catalog, store, 1, NOW, 100, [DB], _WriteBuffer(end))
    return catalog.database(DB), PreservedCatalog.create_or_load(store, DB, NOW)[1]


def _persisted(store, epoch: int, seq_origin: int | None, origin: int, seen: int, n: int, delete_at: int) -> list:
    """Commits what a server at `epoch` persisted (offsets 0..seen in file `n`, a delete at offset
    `delete_at`) and its clean stop's complete checkpoint; returns the file's seqs."""
    pc, _state = PreservedCatalog.create_or_load(store, DB, NOW)
    lo, hi = origin, origin + (seen << 20) + 1  # as any layout wrote them, wrapped ones too
    key = f"{DB}/data/cpu/f{n}.parquet"
    pc.commit([AddParquet(key=key, table="cpu", partition_key="2024-01-01", row_count=2, size_bytes=1, min_time_ns=0,
                          max_time_ns=1, min_seq=lo, max_seq=hi, schema=SCHEMA),
               AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=1, predicate=(),
                                  seq=origin + (delete_at << 20), applies_to=(key,)),
               RecordPartitionCheckpoint(table="cpu", partition_key="2024-01-01", flush_timestamp_ns=1,
                                         sequencer_numbers={0: (None, seen)}, epoch=epoch),
               RecordDatabaseCheckpoint(topic=topic_for(DB), kafka_partitions=1, sequencer_numbers={0: (None, seen)},
                                        epoch=epoch, topic_id=TOPIC_ID, complete=True, seq_origin=seq_origin)], NOW)
    return [lo, hi, origin + (delete_at << 20)]


def test_a_reset_past_legacy_epoch_255_continues_above_every_persisted_seq(store):
    """A catalog written before seq origins were recorded, at epoch 255; then clean stops with the
    in-memory broker (its topic empty at every start) take it to epoch 256, 257, ..."""
    seqs = _persisted(store, 255, None, legacy_seq_origin(255), seen=41, n=0, delete_at=42)
    db, state = _recover(store, end=42)  # the topic still holds epoch 255: nothing reset
    assert (db.epoch, db.seq_origin) == (255, legacy_seq_origin(255))
    assert state.database_checkpoint.seq_origin is None  # nothing recorded: the legacy origin
    for n, epoch in enumerate(range(256, 262), start=1):
        db, state = _recover(store, end=0)
        assert db.epoch == epoch and db.seq_origin % SEQ_ROWS_PER_OFFSET == 0
        assert db.seq_origin > max(seqs) and max_seq_offset(db.seq_origin) > 0
        if epoch == 256:  # above the delete at offset 42, which the checkpoint's offsets (to 41) do not cover
            assert db.seq_origin == legacy_seq_origin(255) + 43 * SEQ_ROWS_PER_OFFSET
        ck = state.database_checkpoint
        assert (ck.epoch, ck.seq_origin, ck.sequencer_numbers) == (epoch, db.seq_origin, {})
        seqs += _persisted(store, epoch, db.seq_origin, db.seq_origin, seen=9 + n, n=n, delete_at=10 + n)
    assert all(0 <= s <= SEQ_MAX for s in seqs) and seqs == sorted(seqs)


def test_a_start_without_a_reset_keeps_the_recorded_origin(store):
    origin = legacy_seq_origin(255) + 42 * SEQ_ROWS_PER_OFFSET
    _persisted(store, 256, origin, origin, seen=5, n=0, delete_at=3)
    db, state = _recover(store, end=6)
    assert (db.epoch, db.seq_origin) == (256, origin)
    assert state.database_checkpoint.seq_origin == origin


def test_a_legacy_checkpoint_past_epoch_255_gets_an_origin_above_every_seq_and_records_it(store):
    """The legacy layout kept going past epoch 255 (its seqs wrapped): the start records an origin
    above every seq the catalog knows, before any seq is computed from it."""
    wrapped = ((256 << 55) - (1 << 64))
    _persisted(store, 255, None, legacy_seq_origin(255), seen=41, n=0, delete_at=40)
    _persisted(store, 256, None, wrapped, seen=3, n=1, delete_at=2)
    db, state = _recover(store, end=4)
    assert db.epoch == 256 and db.seq_origin == legacy_seq_origin(255) + 42 * SEQ_ROWS_PER_OFFSET
    assert state.database_checkpoint.seq_origin == db.seq_origin
    assert state.database_checkpoint.sequencer_numbers == {0: (None, 3)} and state.database_checkpoint.complete
    assert _recover(store, end=4)[0].seq_origin == db.seq_origin  # recorded: the next start keeps it


def test_replay_reads_from_past_the_checkpoint_to_the_end_and_reports_its_progress(store):
    origin = legacy_seq_origin(255) + 42 * SEQ_ROWS_PER_OFFSET
    _persisted(store, 256, origin, origin, seen=5, n=0, delete_at=3)  # offsets 0..5 persisted
    catalog = Catalog()
    out = recovery.recover(None, catalog, store, 1, NOW, 100, [DB], _WriteBuffer(9))  # Kafka holds 0..8
    topic = topic_for(DB)
    assert out.start_offsets[topic] == {0: 6} and out.replay_from[topic] == {0: 6}
    assert out.replay_until[topic] == {0: 8}
    applied = catalog.database(DB).applied_hi_inclusive
    assert recovery.replay_progress(out.replay_from[topic], out.replay_until[topic], applied) == (0, 3)
    assert recovery.replay_progress(out.replay_from[topic], out.replay_until[topic], {0: 7}) == (2, 3)
    # nothing past the checkpoint: nothing to replay
    out = recovery.recover(None, Catalog(), store, 1, NOW, 100, [DB], _WriteBuffer(6))
    assert out.replay_until[topic] == {} and out.replay_from[topic] == {}


def test_a_loss_found_again_at_start_is_the_record_found_while_running_accepted_now():
    from iox_spark.catalog.catalog import LostWriteRange
    from iox_spark.catalog.catalog import merge_lost_writes

    running = LostWriteRange(0, 5, 7, 100.0, "topic replaced", epoch=2)
    other = LostWriteRange(1, 3, None, 100.0, "topic replaced", accepted=True, accepted_at_s=101.0, epoch=2)
    found = LostWriteRange(0, 5, None, 200.0, "topic gone", accepted=True, accepted_at_s=200.0, epoch=2)
    merged = merge_lost_writes([running, other], found, 200.0)
    assert merged == [LostWriteRange(0, 5, 7, 100.0, "topic replaced", accepted=True, accepted_at_s=200.0, epoch=2),
                      other]
    elsewhere = LostWriteRange(1, 8, None, 200.0, "topic gone", accepted=True, accepted_at_s=200.0, epoch=2)
    assert merge_lost_writes([running], elsewhere, 200.0) == [running, elsewhere]
    older_epoch = LostWriteRange(0, 5, None, 200.0, "gone", accepted=True, accepted_at_s=200.0, epoch=3)
    assert merge_lost_writes([running], older_epoch, 200.0) == [running, older_epoch]


def test_recorded_losses_and_accepted_messages_come_back_and_skip_lost_writes_accepts_the_open_ones(store):
    """A loss found while a server ran (not accepted) and a message accepted as skipped are in the
    preserved catalog: a start without --skip-lost-writes that finds no loss keeps the loss open
    (writes stay refused) and the accepted message (skipped by the consumer in its epoch); a start
    with the flag accepts the loss and records that."""
    from iox_spark.catalog.catalog import ACCEPTED
    from iox_spark.catalog.preserved_catalog import (AcceptedPoisonEntry, LostWritesEntry, RecordAcceptedPoison,
                                           RecordLostWrites)

    pc, _state = PreservedCatalog.create_or_load(store, DB, NOW)
    pc.commit([RecordDatabaseCheckpoint(topic=topic_for(DB), kafka_partitions=1, sequencer_numbers={0: (None, 9)},
                                        topic_id=TOPIC_ID, seq_origin=0, complete=True),
               RecordLostWrites(ranges=[LostWritesEntry(partition=0, from_offset=10, to_exclusive=12,
                                                        detected_at_s=NOW - 5, reason="topic replaced")]),
               RecordAcceptedPoison(messages=[AcceptedPoisonEntry(epoch=0, partition=0, offset=11, table="cpu",
                                                                  kind="write", error="boom", detected_at_s=NOW - 9,
                                                                  accepted_at_s=NOW - 8)])], NOW)
    db, _state = _recover(store, 12)
    assert [(r.partition, r.from_offset, r.to_exclusive, r.accepted) for r in db.lost_writes] == [(0, 10, 12, False)]
    assert [(r.offset, r.state) for r in db.poisoned] == [(11, ACCEPTED)] and db.accepted_offsets() == {(0, 11)}
    catalog = Catalog()
    recovery.recover(None, catalog, store, 1, NOW + 1, 100, [DB], _WriteBuffer(12), skip_lost_writes=True)
    db = catalog.database(DB)
    assert [(r.accepted, r.accepted_at_s) for r in db.lost_writes] == [(True, NOW + 1)]
    state = PreservedCatalog.create_or_load(store, DB, NOW)[1]
    assert [e.accepted_at_s for e in state.lost_writes] == [NOW + 1]
    assert [e.offset for e in state.accepted_poison] == [11]


# --------------------------------------------------------------------------- a broker that lost its tail


def _acked(hi: int, epoch: int = 0) -> dict:
    return {topic_for(DB): AckedOffsets(TOPIC_ID, epoch, {0: hi})}


def _recorded(store) -> None:
    """The database recorded at its first write (a checkpoint of nothing, topic id known)."""
    pc, _state = PreservedCatalog.create_or_load(store, DB, NOW)
    pc.commit([RecordDatabaseCheckpoint(topic=topic_for(DB), kafka_partitions=1, sequencer_numbers={}, epoch=0,
                                        topic_id=TOPIC_ID)], NOW)


@pytest.fixture
def settles_at_once(monkeypatch):
    """An end short of acknowledged offsets counts as settled at its first read (no 5 s wait)."""
    monkeypatch.setattr(recovery, "settled_bounds", functools.partial(tail_loss.settled_bounds, stable_s=0.0))


class _LateBroker(_WriteBuffer):
    """Shows its acknowledged offsets to readers late: ends at `end` for the first `late_reads` reads."""

    def __init__(self, end: int, caught_up: int, late_reads: int):
        super().__init__(end)
        self.caught_up, self.late_reads, self.reads = caught_up, late_reads, 0

    def partition_bounds(self, topic, partitions):
        self.reads += 1
        if self.reads > self.late_reads:
            self.end = self.caught_up
        return super().partition_bounds(topic, partitions)


def test_an_end_short_of_acknowledged_offsets_that_catches_up_at_start_is_no_loss(store):
    _recorded(store)
    wb = _LateBroker(5, caught_up=10, late_reads=2)
    catalog = Catalog()
    out = recovery.recover(None, catalog, store, 1, NOW, 100, [DB], wb, acked=_acked(9))
    db = catalog.database(DB)
    assert (db.lost_writes, db.tail_truncated) == ([], None) and wb.reads >= 3
    assert out.replay_until[topic_for(DB)] == {0: 9}


def test_a_lost_tail_with_acknowledged_writes_refuses_to_start_naming_them(store, settles_at_once):
    _recorded(store)
    with pytest.raises(LostWrites) as ei:
        recovery.recover(None, Catalog(), store, 1, NOW, 100, [DB], _WriteBuffer(5), acked=_acked(9))
    assert (ei.value.partition, ei.value.from_offset, ei.value.to_exclusive) == (0, 5, 10)
    assert "the broker lost the tail of Kafka partition 0" in str(ei.value)
    # an ack log of an earlier epoch or another topic incarnation says nothing about this one
    for other in (_acked(9, epoch=1), {topic_for(DB): AckedOffsets("another-id", 0, {0: 9})}):
        out = recovery.recover(None, Catalog(), store, 1, NOW, 100, [DB], _WriteBuffer(5), acked=other)
        assert out.replay_until[topic_for(DB)] == {0: 4}


def test_an_accepted_lost_tail_replays_what_kafka_holds_then_waits_to_continue_in_a_new_epoch(store, settles_at_once):
    _recorded(store)
    catalog = Catalog()
    out = recovery.recover(None, catalog, store, 1, NOW, 100, [DB], _WriteBuffer(5), skip_lost_writes=True,
                           acked=_acked(9))
    db = catalog.database(DB)
    assert [(r.partition, r.from_offset, r.to_exclusive, r.accepted) for r in db.lost_writes] == [(0, 5, 10, True)]
    assert db.tail_truncated == {0: 5} and db.epoch == 0  # the server switches once offsets 0..4 are persisted
    assert out.replay_until[topic_for(DB)] == {0: 4} and out.start_offsets[topic_for(DB)] == {}
    state = PreservedCatalog.create_or_load(store, DB, NOW)[1]
    assert [(e.from_offset, e.to_exclusive, e.accepted_at_s) for e in state.lost_writes] == [(5, 10, NOW)]


def test_a_lost_tail_of_persisted_offsets_continues_at_once_in_a_new_epoch_from_kafkas_end(store):
    origin = legacy_seq_origin(255) + 42 * SEQ_ROWS_PER_OFFSET
    seqs = _persisted(store, 256, origin, origin, seen=9, n=0, delete_at=3)  # offsets 0..9 persisted
    catalog = Catalog()
    out = recovery.recover(None, catalog, store, 1, NOW, 100, [DB], _WriteBuffer(6), acked=_acked(9, epoch=256))
    db = catalog.database(DB)
    assert (db.epoch, db.tail_truncated, db.lost_writes) == (257, None, [])
    assert db.seq_origin > max(seqs)
    # offsets 0..5 are of the old epoch (persisted); 6 on are given out again, in the new epoch
    assert out.start_offsets[topic_for(DB)] == {0: 6} and out.replay_until[topic_for(DB)] == {}
    assert db.applied_hi_inclusive == {0: 5}
    ck = PreservedCatalog.create_or_load(store, DB, NOW)[1].database_checkpoint
    assert (ck.epoch, ck.sequencer_numbers, ck.seq_origin) == (257, {0: (None, 5)}, db.seq_origin)
    # the next start keeps the new epoch and starts where it began
    catalog = Catalog()
    out = recovery.recover(None, catalog, store, 1, NOW, 100, [DB], _WriteBuffer(6), acked=_acked(9, epoch=256))
    assert catalog.database(DB).epoch == 257 and out.start_offsets[topic_for(DB)] == {0: 6}
