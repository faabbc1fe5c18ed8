"""Retention administration on the server: setting a database's retention period, and what
status and /metrics say about retention and memory.

Invariant: a retention period takes effect only once it is committed to the database's
preserved catalog (RecordRetention), so a restart keeps it (server/consume/recovery.py loads it);
then, at once, queries hide rows older than the new reader_lo and writes of older points are
refused (both compute reader_lo from the clock); the lifecycle worker's retention round prunes
after --prune-delay-s (lifecycle/prune_policy.py).

Who calls it: `RetentionControl.set` through `ApiParts.set_retention` (gRPC SetRetention, the
HTTP buckets API, in their worker threads), the status document and the /metrics scrape. Driver
side only.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from iox_spark.catalog.retention import MAX_RETENTION_S, format_duration_s, reader_lo_ns
from iox_spark.catalog.sharding import topic_for
from iox_spark.iox import management_pb2
from iox_spark.server.errors import InvalidArgument

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.ingest import Ingestor

__all__ = ["RetentionControl", "fill_retention_status", "operation_gauges"]

log = logging.getLogger(__name__)


class RetentionControl:
    """Sets retention periods. `catalog`: the in-memory catalog; `lifecycle`: the lifecycle worker
    (commits the record); `ingestor`: refreshes the table views Spark Connect clients read;
    `partitions`: Kafka partitions of a new database's topic; `refuse_when_fenced(name)`: raises
    DatabaseFenced when another server owns the database."""

    def __init__(self, catalog: Catalog, lifecycle: LifecycleWorker, ingestor: Ingestor, partitions: int,
                 refuse_when_fenced: Callable[[str], None]):
        self._catalog = catalog
        self._lifecycle = lifecycle
        self._ingestor = ingestor
        self._partitions = partitions
        self._refuse_when_fenced = refuse_when_fenced

    def set(self, database: str, period_s: int) -> management_pb2.SetRetentionResponse:
        """Records `period_s` (0 removes it) as `database`'s retention and applies it; creates the
        database when the server does not know it yet. Raises InvalidArgument (a bad name or period),
        DatabaseFenced (another server owns the database)."""
        from iox_spark.catalog.preserved_catalog import RecordRetention
        from iox_spark.server.write.router import validate_database_name

        validate_database_name(database)
        if isinstance(period_s, bool) or not isinstance(period_s, int) or not 0 <= period_s <= MAX_RETENTION_S:
            raise InvalidArgument(f"retention period must be 0 (none) to {MAX_RETENTION_S} seconds, got {period_s!r}")
        self._refuse_when_fenced(database)
        db = self._catalog.ensure_database(database, topic_for(database), self._partitions)
        now = time.time()
        self._lifecycle.commit_records(db, [RecordRetention(period_s=period_s, set_at_s=now)], now)
        db.set_retention(period_s, reader_lo_ns(period_s, now))
        log.info("database %s: retention %s", database, format_duration_s(period_s) if period_s else "removed")
        self._refresh_views(db)
        resp = management_pb2.SetRetentionResponse(database=database, period_s=period_s)
        if db.reader_lo_ns is not None:
            resp.reader_lo_ns = db.reader_lo_ns
        if db.pruner_hi_ns is not None:
            resp.pruner_hi_ns = db.pruner_hi_ns
        return resp

    def _refresh_views(self, db) -> None:
        """The database's table views (what Spark Connect clients read) with the new period; a view
        that fails to refresh keeps the old one until its table's next change (logged, not raised:
        the period is committed and every other query path applies it already)."""
        for table in db.table_names():
            if not self._ingestor.has_table_view(db.name, table):
                continue
            try:
                self._ingestor.refresh_table_view(db, table)
            except Exception:  # noqa: BLE001 - logged; the next change of the table refreshes it again
                log.exception("database %s: refreshing the view of %s after a retention change", db.name, table)


def fill_retention_status(d, db, now_s: float) -> None:
    """Fills the retention fields of a management_pb2.DatabaseStatus `d` from `db` (a Database or its
    DatabaseSnapshot)."""
    d.retention_period_s = db.retention_period_s or 0
    lo = reader_lo_ns(db.retention_period_s, now_s)
    if lo is not None:
        d.reader_lo_ns = lo
    if db.pruner_hi_ns is not None:
        d.pruner_hi_ns = db.pruner_hi_ns


def operation_gauges(catalog, memory_guard, replay) -> list:
    """The scrape-time gauges of server/operation_metrics.py: [(name, [labels], value)]. `memory_guard`:
    server/runtime/memory_guard.py (None without one); `replay`: server/replay_watch.py."""
    now = time.time()
    rows: list = []
    if memory_guard is not None:
        rows += [("iox_process_tree_rss_bytes", [], memory_guard.rss_bytes),
                 ("iox_memory_limit_bytes", [], memory_guard.limit_bytes),
                 ("iox_memory_state", [], memory_guard.state)]
    for db in catalog.databases():
        count, size_bytes = db.chunks_in_memory()
        period, pruner_hi = db.retention_period_s, db.pruner_hi_ns
        rows.append(("iox_chunks_in_memory", [db.name], count))
        rows.append(("iox_chunk_bytes_in_memory", [db.name], size_bytes))
        if period:
            rows.append(("iox_retention_seconds", [db.name], period))
            rows.append(("iox_reader_lo_ns", [db.name], reader_lo_ns(period, now)))
        if pruner_hi is not None:
            rows.append(("iox_pruner_hi_ns", [db.name], pruner_hi))
        done, todo = replay.progress(db)
        rows.append(("iox_replay_offsets_done", [db.name], done))
        rows.append(("iox_replay_offsets_todo", [db.name], todo))
    return rows
