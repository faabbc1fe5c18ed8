"""Metrics of the server's operation, beside the write path's (server/metrics.py):

Counted as things happen (Prometheus counters / histograms):
- `iox_micro_batch_messages`, `iox_micro_batch_bytes`, `iox_micro_batch_seconds` (histograms): each
  micro-batch the consumer applied (messages, payload bytes, seconds from its start to applied);
- `iox_persists_total{database}`, `iox_persisted_rows_total{database}`, `iox_persist_seconds{database}`;
- `iox_compactions_total{database,kind}` (kind = memory | persisted), `iox_compacted_rows_total`,
  `iox_compaction_seconds`;
- `iox_pruned_partitions_total{database}`, `iox_pruned_files_total{database}` (retention).

Read at each scrape (gauges; `watch`):
- `iox_chunks_in_memory{database}`, `iox_chunk_bytes_in_memory{database}`;
- `iox_retention_seconds{database}`, `iox_reader_lo_ns{database}`, `iox_pruner_hi_ns{database}`
  (catalog/retention.py; absent without a retention / before the first prune);
- `iox_replay_offsets_done{database}`, `iox_replay_offsets_todo{database}`;
- `iox_process_tree_rss_bytes`, `iox_memory_limit_bytes` (0 = off), `iox_memory_state`
  (0 normal, 1 throttled, 2 writes refused; server/runtime/memory_guard.py).

Invariant: counters count what this process did since it started; gauges are read from the
server's state at the scrape, so they are never stale. Registered in the server's own registry
(one per server). Driver side only; thread-safe (prometheus_client locks).
"""
from __future__ import annotations

import logging

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

__all__ = ["OperationMetrics", "MICRO_BATCH_SECONDS_BUCKETS", "LIFECYCLE_SECONDS_BUCKETS", "GAUGES"]

#: upper bounds (seconds) of the micro-batch duration histogram
MICRO_BATCH_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: upper bounds (seconds) of the persist and compaction histograms
LIFECYCLE_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_COUNT_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
_BYTES_BUCKETS = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26, 1 << 29)

#: the gauges read at each scrape: name -> (help, label names)
GAUGES = {
    "iox_chunks_in_memory": ("Chunks of the database with an in-memory copy", ["database"]),
    "iox_chunk_bytes_in_memory": ("Bytes of the database's chunk data held in memory (estimate)", ["database"]),
    "iox_retention_seconds": ("The database's retention period (absent: none)", ["database"]),
    "iox_reader_lo_ns": ("Oldest time guaranteed readable (ns since the epoch): older rows are hidden and "
                         "older writes refused", ["database"]),
    "iox_pruner_hi_ns": ("Every row older than this (ns since the epoch) was pruned", ["database"]),
    "iox_replay_offsets_done": ("Offsets the replay at start applied", ["database"]),
    "iox_replay_offsets_todo": ("Offsets the replay at start had to apply", ["database"]),
    "iox_process_tree_rss_bytes": ("Resident memory of the server's process tree (driver, Spark JVM, Python "
                                   "workers)", []),
    "iox_memory_limit_bytes": ("--memory-limit-bytes (0 = off)", []),
    "iox_memory_state": ("0 normal, 1 throttled (past the soft fraction of the limit), 2 writes refused", []),
}


class OperationMetrics:
    """The counters above, and `watch(read)` for the gauges. `read()` returns [(gauge name,
    [label values], value)]; an exception there is logged and the gauges are skipped for that scrape."""

    def __init__(self, registry):
        self._registry = registry
        self._mb_messages = Histogram("iox_micro_batch_messages", "Write-buffer messages per applied micro-batch",
                                      registry=registry, buckets=_COUNT_BUCKETS)
        self._mb_bytes = Histogram("iox_micro_batch_bytes", "Payload bytes per applied micro-batch",
                                   registry=registry, buckets=_BYTES_BUCKETS)
        self._mb_seconds = Histogram("iox_micro_batch_seconds", "Seconds from a micro-batch's start to applied",
                                     registry=registry, buckets=MICRO_BATCH_SECONDS_BUCKETS)
        self._persists = Counter("iox_persists", "Persists committed", ["database"], registry=registry)
        self._persisted_rows = Counter("iox_persisted_rows", "Rows written to Parquet by persists", ["database"],
                                       registry=registry)
        self._persist_s = Histogram("iox_persist_seconds", "Seconds per persist", ["database"], registry=registry,
                                    buckets=LIFECYCLE_SECONDS_BUCKETS)
        self._compactions = Counter("iox_compactions", "Compactions done", ["database", "kind"], registry=registry)
        self._compacted_rows = Counter("iox_compacted_rows", "Rows of the chunks compactions produced",
                                       ["database", "kind"], registry=registry)
        self._compaction_s = Histogram("iox_compaction_seconds", "Seconds per compaction", ["database", "kind"],
                                       registry=registry, buckets=LIFECYCLE_SECONDS_BUCKETS)
        self._pruned_partitions = Counter("iox_pruned_partitions", "Partitions dropped by retention", ["database"],
                                          registry=registry)
        self._pruned_files = Counter("iox_pruned_files", "Parquet files removed by retention", ["database"],
                                     registry=registry)

    def micro_batch(self, messages: int, nbytes: int, seconds: float) -> None:
        self._mb_messages.observe(messages)
        self._mb_bytes.observe(nbytes)
        self._mb_seconds.observe(seconds)

    def persisted(self, database: str, rows: int, seconds: float) -> None:
        self._persists.labels(database=database).inc()
        self._persisted_rows.labels(database=database).inc(rows)
        self._persist_s.labels(database=database).observe(seconds)

    def compacted(self, database: str, kind: str, rows: int, seconds: float) -> None:
        self._compactions.labels(database=database, kind=kind).inc()
        self._compacted_rows.labels(database=database, kind=kind).inc(rows)
        self._compaction_s.labels(database=database, kind=kind).observe(seconds)

    def pruned(self, database: str, partitions: int, files: int) -> None:
        self._pruned_partitions.labels(database=database).inc(partitions)
        self._pruned_files.labels(database=database).inc(files)

    def watch(self, read) -> None:
        """Registers the scrape-time gauges, read through `read()` (see the class docstring)."""
        self._registry.register(_GaugeCollector(read))


class _GaugeCollector:
    def __init__(self, read):
        self._read = read

    def describe(self):
        return []  # read at scrape time only

    def collect(self):
        families = {name: GaugeMetricFamily(name, doc, labels=labels) for name, (doc, labels) in GAUGES.items()}
        try:
            rows = self._read()
        except Exception:  # the other metrics are still served
            logging.getLogger(__name__).exception("reading the server's state for /metrics")
            rows = []
        for name, labels, value in rows:
            families[name].add_metric(list(labels), value)
        yield from families.values()
