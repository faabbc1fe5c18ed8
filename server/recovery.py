"""Recovery at start: preserved catalog -> in-memory catalog + replay plan.

When it runs: once, in `IoxServer.start`, before the consumer starts.

Invariant: after `recover`, every row the preserved catalog says is persisted is
queryable from its Parquet file (registered as an unloaded chunk), every table
keeps its persisted column types, and the returned plan makes the consumer
start, per Kafka partition, at the first offset that may hold unpersisted rows;
`row_filters` drop the replayed rows that are already in Parquet (IOx's
ReplayPlanner: offset above the checkpoint's max -> keep; within [min, max] ->
keep only time > flush timestamp; below min -> skip).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from catalog.catalog import Catalog
from catalog.checkpoint import DatabaseCheckpoint, PartitionCheckpoint, ReplayPlanner, UnpersistedOffsets
from catalog.chunk import Chunk
from catalog.errors import CatalogError
from catalog.preserved_catalog import PreservedCatalog, PreservedCatalogConfig
from catalog.schema import Column
from lifecycle.chunk_data import estimate_bytes, register_parquet_chunk

from .write_buffer import topic_for

__all__ = ["recover", "RecoveryResult", "TopicMismatch", "list_catalog_databases", "keep_mask_fn"]

log = logging.getLogger(__name__)


class TopicMismatch(Exception):
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


def list_catalog_databases(store) -> list[str]:
    """Databases that have a preserved catalog in the store."""
    names = set()
    for meta in store.list(""):
        parts = meta.key.split("/")
        if len(parts) >= 3 and parts[1] == "catalog":
            names.add(parts[0])
    return sorted(names)


def _day_number(partition_key: str) -> int:
    import datetime

    return (datetime.date.fromisoformat(partition_key) - datetime.date(1970, 1, 1)).days


def recover(spark, catalog: Catalog, store, kafka_partitions: int, now: float,
            transactions_until_checkpoint: int, databases: list[str]) -> RecoveryResult:
    out = RecoveryResult()
    cfg = PreservedCatalogConfig(transactions_until_checkpoint=transactions_until_checkpoint)
    for name in databases:
        pc, state = PreservedCatalog.create_or_load(store, name, now, cfg)
        out.preserved[name] = pc
        topic = topic_for(name)
        dbck = state.database_checkpoint
        if dbck is not None and (dbck.topic != topic or dbck.kafka_partitions != kafka_partitions):
            raise TopicMismatch(name, f"topic {dbck.topic} with {dbck.kafka_partitions} partitions",
                                f"topic {topic} with {kafka_partitions} partitions")
        db = catalog.ensure_database(name, topic, kafka_partitions)
        for table, cols in state.table_schemas.items():
            db.schemas.merge(table, [Column(*c) for c in cols])
        for key, f in sorted(state.files.items(), key=lambda kv: (kv[1].table, kv[1].partition_key, kv[1].min_seq)):
            cid = catalog.next_chunk_id()
            view = register_parquet_chunk(spark, store, [key], [list(c) for c in f.schema], cid)
            chunk = Chunk(id=cid, table=f.table, partition_key=f.partition_key, order=catalog.next_order(),
                          state="unloaded", rows=f.row_count,
                          size_bytes=estimate_bytes(f.row_count, len(f.schema)), min_time_ns=f.min_time_ns,
                          max_time_ns=f.max_time_ns, columns=[list(c) for c in f.schema], view=view,
                          parquet_keys=[key], created_at=now)
            part = catalog.partition(db, f.table, f.partition_key)
            part.chunks.append(chunk)
            part.files.append(f)
        planner = ReplayPlanner()
        for (table, pkey), ck in state.partition_checkpoints.items():
            catalog.partition(db, table, pkey).checkpoint = ck
            planner.register_partition_checkpoint(PartitionCheckpoint(
                table=table, partition_key=pkey, flush_timestamp_ns=ck.flush_timestamp_ns,
                offsets={kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in ck.sequencer_numbers.items()}))
            filters = out.row_filters.setdefault((name, table), {})
            filters[_day_number(pkey)] = (ck.flush_timestamp_ns, dict(ck.sequencer_numbers))
        if dbck is not None:
            planner.register_database_checkpoint(DatabaseCheckpoint(
                {kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in dbck.sequencer_numbers.items()}))
        plan = planner.build()
        starts = {}
        until = {}
        for kp in plan.kafka_partitions():
            s = plan.start_offset(kp)
            if s is not None:
                starts[kp] = s
                until[kp] = plan.replay_range(kp).max_seen_offset
                # offsets below the start are persisted: they count as applied
                db.applied_hi_inclusive[kp] = max(db.applied_hi_inclusive.get(kp, -1), s - 1)
        out.start_offsets[topic] = starts
        out.replay_until[topic] = until
        log.info("recovered database %s at catalog revision %d: %d file(s), replay from %s", name,
                 state.revision, len(state.files), starts)
    return out


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

