"""Recovery at start: preserved catalog -> in-memory catalog + replay plan.

When it runs: once, in `IoxServer.start`, before the consumer starts.

Invariant: after `recover`, every row the preserved catalog says is persisted is
queryable from its Parquet file (registered as an unloaded chunk), every table
keeps its persisted column types, and the returned plan makes the consumer
start, per Kafka partition, at the first offset that may hold unpersisted rows;
`row_filters` drop the replayed rows that are already in Parquet (IOx's
ReplayPlanner: offset above the checkpoint's max -> keep; within [min, max] ->
keep only time > flush timestamp; below min -> skip).

The preserved catalog's records come back too: every loss of acknowledged writes
(accepted or not; one found again at this start is the same record), and the
messages accepted to be skipped (server/write_buffer/poison.py). With --skip-lost-writes every
loss is accepted and the records are committed again.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from iox_spark.catalog.catalog import Catalog, LostWriteRange, PoisonedMessage
from iox_spark.catalog.checkpoint import DatabaseCheckpoint, PartitionCheckpoint, ReplayPlanner, UnpersistedOffsets
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.delete_predicate import literal_kind
from iox_spark.catalog.partition_keys import day_number_of_key
from iox_spark.catalog.preserved_catalog import PreservedCatalog, PreservedCatalogConfig, RecordLostWrites
from iox_spark.catalog.schema import Column
from iox_spark.catalog.seq_layout import current_seq_origin, next_seq_origin
from iox_spark.chunk_store.chunk_data import estimate_bytes, register_parquet_chunk

from iox_spark.catalog.sharding import topic_for
from iox_spark.server.errors import ServerError
from iox_spark.server.write_buffer.tail_loss import TAIL_LOSS_GRACE_S, settled_bounds

__all__ = ["recover", "RecoveryResult", "TopicMismatch", "LostWrites", "list_catalog_databases", "keep_mask_fn",
           "lost_offsets", "truncated_tail", "replay_progress", "register_persisted_file", "add_recorded_delete"]

log = logging.getLogger(__name__)


class LostWrites(ServerError):
    """Kafka no longer holds offsets the replay plan needs (retention, or a deleted topic).

    ``to_exclusive`` is None when the end is unknown: the topic is gone, and writes
    acknowledged after the last checkpoint would have been at ``from_offset`` and above.
    """

    def __init__(self, database: str, partition: int, from_offset: int, to_exclusive: int | None,
                 reason: str = ""):
        self.database = database
        self.partition = partition
        self.from_offset = from_offset
        self.to_exclusive = to_exclusive
        self.reason = reason
        super().__init__(
            f"database {database!r}: Kafka partition {partition} no longer holds offsets "
            f"{_offset_range(from_offset, to_exclusive)} that are not persisted yet"
            f"{f' ({reason})' if reason else ''}; refusing to start. "
            f"Start with --skip-lost-writes to accept losing them and read from the oldest available offset.")


def _offset_range(from_offset: int, to_exclusive: int | None) -> str:
    return f"[{from_offset}, {to_exclusive})" if to_exclusive is not None else f"from {from_offset} on"


class TopicMismatch(ServerError):
    """The preserved catalog was written for another topic or number of Kafka partitions."""

    def __init__(self, database: str, expected: str, actual: str):
        self.database = database
        self.expected = expected
        self.actual = actual
        super().__init__(f"database {database!r}: the preserved catalog was written for {expected}, "
                         f"the server now has {actual}; refusing to mix them")


@dataclass
class RecoveryResult:
    #: database -> PreservedCatalog
    preserved: dict = field(default_factory=dict)
    #: topic -> {kafka partition: first offset to read}
    start_offsets: dict = field(default_factory=dict)
    #: (database, table) -> {day number: (flush_timestamp_ns, {kp: (min_unpersisted or None, max_seen)})}
    row_filters: dict = field(default_factory=dict)
    #: topic -> {kafka partition: offset replay must reach before it counts as caught up}
    replay_until: dict = field(default_factory=dict)
    #: topic -> {kafka partition: first offset replay reads}, for the partitions of `replay_until`
    replay_from: dict = field(default_factory=dict)


def replay_progress(replay_from: dict, replay_until: dict, applied: dict) -> tuple[int, int]:
    """(offsets done, offsets to do) of one database's replay, summed over its Kafka partitions.

    Pure. ``replay_from``: {kafka partition: first offset replay reads}; ``replay_until``:
    {kafka partition: last offset (inclusive) replay must apply}; ``applied``: {kafka partition:
    applied_hi_inclusive}. A partition has ``until - from + 1`` offsets to do (none when the range
    is empty), done as far as ``applied`` reached into them: done == to do once every partition
    reached its target (writes applied past it do not count)."""
    done = todo = 0
    for kp, until in replay_until.items():
        first = replay_from.get(kp, 0)
        n = max(0, until - first + 1)
        todo += n
        done += min(n, max(0, applied.get(kp, -1) - first + 1))
    return done, todo


def _highest(*offsets: int | None) -> int:
    """The highest of `offsets` that are known (not None); -1 when none is."""
    return max((o for o in offsets if o is not None), default=-1)


def truncated_tail(start: int, replay_hi_inclusive: int | None, seen_hi_inclusive: int | None,
                   acked_hi_inclusive: int | None, end_exclusive: int) -> tuple[bool, tuple[int, int] | None]:
    """Decides, for one Kafka partition of the topic incarnation the catalog was written for, whether
    the broker lost its tail: it came back with fewer offsets than were written (a store that did
    not fsync, an unclean leader election, a restored backup).

    Pure (driver, at start). ``start``: the replay plan's first offset to read (0 without a
    checkpoint); ``replay_hi_inclusive``: the last offset replay must reach, None when nothing
    unpersisted is known; ``seen_hi_inclusive``: the highest offset the catalog's checkpoints name,
    persisted or not (None: none); ``acked_hi_inclusive``: the highest offset this server
    acknowledged to a client (server/write_buffer/ack_log.py; None: none known);
    ``end_exclusive``: Kafka's end now.

    Returns ``(truncated, lost)``: ``truncated`` when Kafka's end is at or below an offset known
    written (Kafka gives those offsets out again); ``lost`` = ``(from, to_exclusive)`` of the
    offsets acknowledged or checkpointed unpersisted that neither Parquet nor Kafka holds, or None.
    """
    known = [x for x in (replay_hi_inclusive, seen_hi_inclusive, acked_hi_inclusive) if x is not None]
    if not known or end_exclusive > max(known):
        return False, None
    hi = _highest(replay_hi_inclusive, acked_hi_inclusive)
    first = max(end_exclusive, start)
    return True, ((first, hi + 1) if hi >= first else None)


def lost_offsets(start: int, replay_hi_inclusive: int | None, low_watermark: int, end_exclusive: int,
                 topic_gone: bool, checkpoint_complete: bool,
                 acked_hi_inclusive: int | None = None) -> tuple[bool, tuple[int, int | None] | None]:
    """Decides, for one Kafka partition, whether the write buffer lost offsets replay needs.

    Pure (driver, at start).  ``start``: the replay plan's first offset to read;
    ``replay_hi_inclusive``: the last offset replay must reach, None when nothing
    unpersisted is known; ``low_watermark`` / ``end_exclusive``: what Kafka holds now;
    ``topic_gone``: the checkpoint's topic incarnation no longer exists;
    ``checkpoint_complete``: the checkpoint was written by a drained clean stop;
    ``acked_hi_inclusive``: the highest offset of the checkpoint's topic incarnation that this
    server acknowledged (server/write_buffer/ack_log.py), None when unknown: when known, it bounds
    what a reset topic lost exactly.

    Returns ``(reset, lost)``: ``reset`` when the topic's offsets started over (a new
    write-buffer epoch begins), ``lost`` = ``(from, to_exclusive)`` of offsets that are
    neither persisted nor in Kafka any more (``to_exclusive`` None: unknown end), or None.
    """
    if topic_gone or end_exclusive < start:  # the topic was reset (or the broker lost data)
        hi = _highest(replay_hi_inclusive, acked_hi_inclusive)
        if hi >= start:
            return True, (start, hi + 1)
        if not checkpoint_complete and acked_hi_inclusive is None:
            # writes acknowledged after the last checkpoint were at `start` and above: unknown how many
            return True, (start, None)
        return True, None
    if low_watermark > start:  # retention dropped offsets replay needs
        return False, (start, low_watermark)
    return False, None


def _acked_of(acked: dict | None, topic: str, epoch: int, topic_id: str | None) -> dict:
    """{kp: highest offset acknowledged} of `topic` in the ack log when it is of `epoch` and of the
    incarnation `topic_id` (an unknown id on either side matches), else {}."""
    a = (acked or {}).get(topic)
    if a is None or a.epoch != epoch or (a.topic_id is not None and topic_id is not None and a.topic_id != topic_id):
        return {}
    return dict(a.hi_inclusive)


def _skip_or_refuse(db, name: str, kp: int, lost: tuple, reason: str, skip_lost_writes: bool, now: float,
                    epoch: int) -> None:
    """Raises LostWrites for `lost` ((from, to_exclusive)) of Kafka partition `kp`; with
    --skip-lost-writes, records it accepted in `db.lost_writes` instead."""
    if not skip_lost_writes:
        raise LostWrites(name, kp, *lost, reason=reason)
    log.error("database %s: SKIPPING lost writes of Kafka partition %d, offsets %s%s (--skip-lost-writes)",
              name, kp, _offset_range(*lost), f" ({reason})" if reason else "")
    db.merge_lost_write(LostWriteRange(
        kp, lost[0], lost[1], now, reason or "Kafka no longer holds offsets the replay needed",
        accepted=True, accepted_at_s=now, epoch=epoch), now)


def list_catalog_databases(store) -> list[str]:
    """Databases that have a preserved catalog in the store."""
    names = set()
    for meta in store.list(""):
        parts = meta.key.split("/")
        if len(parts) >= 3 and parts[1] == "catalog":
            names.add(parts[0])
    return sorted(names)


def recover(spark, catalog: Catalog, store, kafka_partitions: int, now: float,
            transactions_until_checkpoint: int, databases: list[str], write_buffer,
            skip_lost_writes: bool = False, cache=None,
            pool_member: str | None = None, acked: dict | None = None,
            tail_loss_grace_s: float = TAIL_LOSS_GRACE_S) -> RecoveryResult:
    """`pool_member`: this server's name in an ingester pool (catalog/ownership.py). It claims
    again the Kafka partitions the catalog says it owns (fencing the process it replaces) and
    recovers only those; every other partition is held (`Database.hold`, NOT_OWNED): its owner applies
    it. The files of every partition are registered, so queries read what every owner persisted.

    `acked`: {topic: AckedOffsets} this server acknowledged in earlier runs (server/write_buffer/
    ack_log.py). A broker that lost the tail of a topic (`truncated_tail`) is refused with
    LostWrites naming the acknowledged offsets it lost; with nothing lost, or the loss accepted
    (--skip-lost-writes), the database continues in a new write-buffer epoch from Kafka's end:
    at once when Kafka holds nothing unpersisted of it, else `Database.tail_truncated` is set and
    the server switches once the replay is applied and persisted (server/lost_writes_admin.py). An end short only
    of acknowledged offsets is read again until it stops moving (at most `tail_loss_grace_s`)."""
    out = RecoveryResult()
    cfg = PreservedCatalogConfig(transactions_until_checkpoint=transactions_until_checkpoint)
    for name in databases:
        pc, state = PreservedCatalog.create_or_load(store, name, now, cfg)
        out.preserved[name] = pc
        owned = None
        if pool_member is not None:
            mine = sorted(kp for kp, o in state.owners.items() if o.owner == pool_member)
            if mine:
                pc.claim(mine, kafka_partitions, pool_member, now)
                state = pc.state
            owned = frozenset(mine)
        topic = topic_for(name)
        dbck = state.database_checkpoint
        if dbck is not None and (dbck.topic != topic or dbck.kafka_partitions != kafka_partitions):
            raise TopicMismatch(name, f"topic {dbck.topic} with {dbck.kafka_partitions} partitions",
                                f"topic {topic} with {kafka_partitions} partitions")
        db = catalog.ensure_database(name, topic, kafka_partitions)
        if owned is not None:
            db.own_only(owned)
        # the records of earlier runs: losses of acknowledged writes (accepted or not), messages
        # accepted to be skipped (server/write_buffer/poison.py: the consumer passes those of the
        # current epoch), and retention (catalog/retention.py): the period, how far the pruner got
        db.load_records(write_buffer.topic_id(topic), [LostWriteRange.from_entry(e) for e in state.lost_writes],
                        [PoisonedMessage.from_entry(e) for e in state.accepted_poison],
                        state.retention_period_s, state.pruner_hi_ns)
        lost_before = list(db.lost_writes)
        # the topic the checkpoint was written for is gone (deleted, or deleted and created
        # again: Kafka gives every incarnation a new id); none of its offsets carry over
        gone = dbck is not None and dbck.topic_id is not None and db.topic_id != dbck.topic_id
        gone_reason = ""
        if gone:
            gone_reason = (f"topic {topic} no longer exists" if db.topic_id is None else
                           f"topic {topic} was deleted and created again: its id is {db.topic_id}")
            gone_reason += f", the catalog's checkpoint was written for id {dbck.topic_id}"
        for table, cols in state.table_schemas.items():
            db.schemas.merge(table, [Column(*c) for c in cols])
        for key, f in sorted(state.files.items(), key=lambda kv: (kv[1].table, kv[1].partition_key, kv[1].min_seq)):
            register_persisted_file(spark, catalog, store, db, f, now, cache)
        for dp in state.delete_predicates:
            add_recorded_delete(db, dp)
        epoch = dbck.epoch if dbck is not None else 0
        origin, record_origin = current_seq_origin(state)
        db.set_epoch(epoch, origin)
        if record_origin:  # a legacy epoch whose seqs wrapped: continue above every known seq, from now on
            pc.commit([dataclasses.replace(dbck, seq_origin=db.seq_origin)], now)
            log.warning("database %s: write-buffer epoch %d is past the legacy seq layout; its seqs "
                        "continue from origin %d", name, epoch, db.seq_origin)
        planner = ReplayPlanner()
        filters = {}
        for (table, pkey), ck in state.partition_checkpoints.items():
            catalog.set_partition_checkpoint(db, table, pkey, ck)
            if ck.epoch != epoch:
                continue  # an older epoch of the write buffer: wholly persisted, nothing to replay
            planner.register_partition_checkpoint(PartitionCheckpoint(
                table=table, partition_key=pkey, flush_timestamp_ns=ck.flush_timestamp_ns,
                offsets={kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in ck.sequencer_numbers.items()}))
            filters.setdefault(table, {})[day_number_of_key(pkey)] = (ck.flush_timestamp_ns, dict(ck.sequencer_numbers))
        if dbck is not None:
            planner.register_database_checkpoint(DatabaseCheckpoint(
                {kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in dbck.sequencer_numbers.items()}))
        plan = planner.build()
        # what this server acknowledged of the topic incarnation and epoch the catalog was written for
        ack = _acked_of(acked, topic, epoch, dbck.topic_id if gone else db.topic_id)
        # the topic the catalog was written for is still there: Kafka ending below an offset known
        # written means its broker lost the tail (Kafka without topic ids: a reset, as before)
        same_topic = not gone and db.topic_id is not None
        bounds = write_buffer.partition_bounds(topic, kafka_partitions) if dbck is not None or ack else {}
        if same_topic and ack and bounds:  # an end short only of acknowledged offsets may be a late read
            seen = {kp: r.max_seen_offset for kp in plan.kafka_partitions()
                    if (r := plan.replay_range(kp)) is not None and r.max_seen_offset is not None}
            bounds = settled_bounds(lambda: write_buffer.partition_bounds(topic, kafka_partitions), bounds, ack, seen,
                                    grace_s=tail_loss_grace_s)
        starts, until, reset, truncated = {}, {}, False, {}
        planned = set(plan.kafka_partitions())
        for kp in sorted(planned | set(ack) | (set(range(kafka_partitions)) if gone else set())):
            if owned is not None and kp not in owned:
                continue  # another pool member's: its owner recovers it
            s = plan.start_offset(kp) if kp in planned else None
            rng = plan.replay_range(kp) if kp in planned else None
            needs_replay = rng is not None and rng.min_unpersisted_offset is not None
            lo, end = bounds.get(kp, (0, 0))
            replay_hi = rng.max_seen_offset if needs_replay else None
            if same_topic:
                kp_truncated, lost = truncated_tail(0 if s is None else s, replay_hi,
                                                    None if rng is None else rng.max_seen_offset, ack.get(kp), end)
                if kp_truncated:
                    truncated[kp] = end
                    reason = (f"the broker lost the tail of Kafka partition {kp}: it ends at offset {end}, "
                              f"below offsets this server acknowledged or checkpointed")
                    if lost is not None:
                        _skip_or_refuse(db, name, kp, lost, reason, skip_lost_writes, now, epoch)
                    if s is not None:  # else nothing of it was checkpointed: replay from Kafka's start
                        starts[kp] = s
                        if needs_replay and s <= min(rng.max_seen_offset, end - 1):
                            until[kp] = min(rng.max_seen_offset, end - 1)  # what Kafka still holds of it
                        catalog.advance_applied(db, {kp: s - 1})
                    continue
            if s is None:
                if not gone:
                    continue
                s = 0  # no checkpointed offset: whatever the lost topic held for it
            kp_reset, lost = lost_offsets(s, replay_hi, lo, end, gone, dbck is not None and dbck.complete,
                                          ack.get(kp, -1) if ack and owned is None else None)
            reset = reset or kp_reset
            if lost is not None:
                _skip_or_refuse(db, name, kp, lost, gone_reason, skip_lost_writes, now, epoch)
                s = lo
            starts[kp] = s
            if needs_replay and s <= rng.max_seen_offset:
                until[kp] = rng.max_seen_offset
            catalog.advance_applied(db, {kp: s - 1})
        reset = reset or gone
        first_offsets = None  # of a new epoch: {kp: first offset}
        if reset:
            first_offsets = {kp: bounds.get(kp, (0, 0))[0] for kp in range(kafka_partitions)
                             if owned is None or kp in owned}
        elif truncated:
            # Kafka's offsets below its end are of the old epoch; those from it on are given out again
            ends = {kp: bounds.get(kp, (0, 0))[1] for kp in range(kafka_partitions) if owned is None or kp in owned}
            if all(starts.get(kp, bounds.get(kp, (0, 0))[0]) >= end for kp, end in ends.items()):
                first_offsets = ends  # Kafka holds nothing unpersisted: the new epoch starts now
            else:
                db.record_tail_truncated(truncated)  # after the replay (server/lost_writes_admin.py)
                log.error("database %s: the broker lost the tail of its write buffer (Kafka partition ends %s); "
                          "writes are refused until the replay of what Kafka still holds is persisted, then the "
                          "database continues in a new write-buffer epoch", name, truncated)
        if skip_lost_writes:  # a loss recorded while a server ran, not accepted then, is accepted now
            db.accept_lost_writes(now)
        # recorded with the epoch's checkpoint below, or on its own
        mine_lost = [r for r in db.lost_writes if owned is None or r.partition in owned]
        lost_actions = [RecordLostWrites(ranges=tuple(r.entry() for r in mine_lost))] \
            if db.lost_writes != lost_before else []
        if first_offsets is not None:
            # offsets start over (a reset topic) or are given out again (a lost tail): a new epoch keeps
            # write-buffer order (its seq origin is above every seq the catalog knows) and ignores old
            # checkpoints; what Kafka holds below its first offsets is of the old epoch, all persisted
            db.set_epoch(epoch + 1, next_seq_origin(state, db.seq_origin))
            starts = dict(first_offsets)
            until = {}
            filters = {}
            db.start_applying_at(starts)
            pc.commit([db.checkpoint_action({kp: (None, s - 1) for kp, s in starts.items() if s > 0 and not reset})]
                      + lost_actions, now)
            lost_actions = []
            log.warning("database %s: the write buffer topic was %s; everything was persisted, continuing in "
                        "write-buffer epoch %d (seq origin %d) from offsets %s", name,
                        "reset" if reset else "cut short (its broker lost the tail)", db.epoch, db.seq_origin, starts)
        if lost_actions:
            pc.commit(lost_actions, now)
        # replay counts as caught up once everything Kafka held at start is applied
        if not bounds:
            bounds = write_buffer.partition_bounds(topic, kafka_partitions)
        for kp, (lo, end) in bounds.items():
            if owned is not None and kp not in owned:
                continue
            first = starts.get(kp, lo)
            if end - 1 >= first:
                until[kp] = max(until.get(kp, -1), end - 1)
        for table, f in filters.items():
            out.row_filters[(name, table)] = f
        out.start_offsets[topic] = starts
        out.replay_until[topic] = until
        out.replay_from[topic] = {kp: starts.get(kp, bounds.get(kp, (0, 0))[0]) for kp in until}
        log.info("recovered database %s at catalog revision %d: %d file(s), replay from %s", name,
                 state.revision, len(state.files), starts)
    return out


def register_persisted_file(spark, catalog: Catalog, store, db, f, now: float, cache) -> Chunk:
    """Registers the preserved catalog's file `f` (AddParquet) as an unloaded chunk of its partition
    (the newest of it) and in the partition's files. Caller holds no Spark job; driver side."""
    cid = catalog.next_chunk_id()
    view = register_parquet_chunk(spark, store, [f.key], [list(c) for c in f.schema], cid, cache, [f.size_bytes])
    chunk = Chunk(id=cid, table=f.table, partition_key=f.partition_key, order=catalog.next_order(),
                  state="unloaded", rows=f.row_count,
                  size_bytes=estimate_bytes(f.row_count, len(f.schema)), min_time_ns=f.min_time_ns,
                  max_time_ns=f.max_time_ns, columns=[list(c) for c in f.schema], view=view,
                  parquet_keys=[f.key], created_at=now, deduplicated=True)
    catalog.add_file(db, f, chunk)
    return chunk


def add_recorded_delete(db, dp) -> None:
    """Adds the preserved catalog's delete predicate `dp` to the database's mailbox as recorded
    (queries apply it; an equal delete replayed from Kafka is applied once)."""
    from iox_spark.catalog.delete_mailbox import Delete
    from iox_spark.catalog.sharding import partition_for

    db.deletes.add(Delete(table=dp.table, start_ns=dp.start_ns, stop_ns_exclusive=dp.stop_ns_exclusive,
                          predicate=tuple((c, op, v, literal_kind(v)) for c, op, v in dp.predicate),
                          seq=dp.seq, kafka_partition=partition_for(dp.table, db.kafka_partitions)), recorded=True)


def keep_mask_fn(filters: dict):
    """Executor-side helper: (kafka partition, offset, day numbers, times) -> boolean keep mask.

    `filters`: {day number: (flush_timestamp_ns, {kp: (min_unpersisted or None, max_seen)})}. Picklable.
    """

    def keep(kp: int, offset: int, days, times):
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(times)
        mask = pa.array([True] * n)
        for day, (flush_ts, ranges) in filters.items():
            r = ranges.get(kp)
            if r is None:
                continue  # this Kafka partition never fed the checkpoint: replay all of it
            lo, hi = r
            if offset > hi:
                continue  # after the checkpoint: keep
            in_day = pc.equal(days, day)
            if lo is None or offset < lo:
                drop = in_day  # fully persisted
            else:
                drop = pc.and_(in_day, pc.less_equal(times, flush_ts))
            mask = pc.and_(mask, pc.invert(drop))
        return mask

    return keep

