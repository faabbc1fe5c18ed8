"""Server metrics in the Prometheus text format, served at `GET /metrics` on the HTTP API port.

What they say: where a write's time goes before it is acknowledged, one
histogram per stage of the router (`iox_write_stage_seconds{stage=...}`):
`parse` (line protocol to Arrow) or `decode` (an Arrow write's IPC streams),
`checks` (backpressure, reserved names, the database and its topic, table
schemas), `encode` (write-buffer messages) and `produce` (handing them to
Kafka until every one is acknowledged); and what was acknowledged
(`iox_write_requests_total`, `iox_write_points_total`). A request rejected
before Kafka acknowledged it counts in the stages it passed, never in the
acknowledged totals. `iox_gc_pause_seconds{generation=...}`: Python's garbage
collections in the server process, each of which stops every thread
(server/runtime/gc_pauses.py; recorded by `iox serve`). `iox_poisoned_messages_total{database}`:
write-buffer messages the consumer set aside because applying them failed (each
time one is found failing; server/write_buffer/poison.py), `iox_poisoned_messages_held{database}`:
those held now (their Kafka partition applies nothing after them until retried or
accepted; `iox status` lists them). Watermarks per database and Kafka partition, read at each
scrape (server/consume/watermarks.py): `iox_watermark_offset{database,partition,watermark}` with
watermark = applied_hi_inclusive, visible_hi_inclusive, persisted_hi_inclusive (inclusive offsets,
-1 = none) or high_watermark (Kafka's exclusive end, -1 unknown), `iox_write_buffer_lag_messages`
and `iox_write_buffer_lag_bytes` (an estimate: lag times the mean size of the messages this server
produced to the partition).

Invariant: every figure counts what this server process did since it started
(a restart starts again from zero, as Prometheus counters do). Each server has
a registry of its own, so several servers in one process (tests) never share
or collide.

Who calls it: the router (server/write/router.py) observes each stage in the gRPC /
HTTP worker thread that serves the request; the HTTP API renders the registry.
Driver side only; nothing here is pickled.
"""
from __future__ import annotations

import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from iox_spark.server.operation_metrics import OperationMetrics

__all__ = ["ServerMetrics", "WRITE_STAGES", "WRITE_STAGE_BUCKETS_S", "GC_PAUSE_BUCKETS_S", "CONTENT_TYPE_LATEST",
           "WATERMARKS"]

#: the router's stages, in the order a request passes them (`parse` for line protocol, `decode` for Arrow)
WRITE_STAGES = ("parse", "decode", "checks", "encode", "produce")
#: upper bounds (seconds) of the stage histograms' buckets: 0.25 ms to 10 s, fine around the 20 ms
#: the benchmark's ack-latency target asks for
WRITE_STAGE_BUCKETS_S = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25,
                         0.5, 1.0, 2.5, 5.0, 10.0)

#: upper bounds (seconds) of the garbage-collection pause histogram's buckets
GC_PAUSE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class ServerMetrics:
    """The metrics of one server (see the module docstring). Thread-safe (prometheus_client locks)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self._stage = Histogram("iox_write_stage_seconds", "Seconds a write request spent in each stage of the "
                                "router before its acknowledgement", ["stage"], registry=self.registry,
                                buckets=WRITE_STAGE_BUCKETS_S)
        self._requests = Counter("iox_write_requests", "Write requests acknowledged by Kafka",
                                 registry=self.registry)
        self._points = Counter("iox_write_points", "Points of the write requests acknowledged by Kafka",
                               registry=self.registry)
        self._no_sync_failed = Counter("iox_write_no_sync_failed_points", "Points of no_sync writes (POST "
                                       "/api/v3/write_lp?no_sync=true) answered before Kafka acknowledged them "
                                       "and then not acknowledged: lost", registry=self.registry)
        self._lost = Counter("iox_lost_write_ranges", "Ranges of offsets (one per Kafka partition and loss) of "
                             "acknowledged writes the write buffer lost before they were persisted",
                             ["database"], registry=self.registry)
        self._poisoned = Counter("iox_poisoned_messages", "Write-buffer messages set aside because applying them "
                                 "failed on their own (each time one is found failing)", ["database"],
                                 registry=self.registry)
        self._poisoned_held = Gauge("iox_poisoned_messages_held", "Write-buffer messages set aside and held: their "
                                    "Kafka partition applies nothing after them until they are retried or accepted",
                                    ["database"], registry=self.registry)
        self._truncated = Counter("iox_broker_store_truncated_batches", "Record batches of persisted messages "
                                  "deleted from the durable embedded broker's store", registry=self.registry)
        for s in WRITE_STAGES:  # every stage is listed from the start, with zero observations
            self._stage.labels(stage=s)
        #: micro-batches, lifecycle, retention, memory (server/operation_metrics.py)
        self.operation = OperationMetrics(self.registry)
        self._gc = Histogram("iox_gc_pause_seconds", "Seconds of each garbage collection of the server process "
                             "(every thread waits for it)", ["generation"], registry=self.registry,
                             buckets=GC_PAUSE_BUCKETS_S)

    def watch_watermarks(self, read) -> None:
        """Reports the watermarks `read()` gives at each scrape: [(database, w)] where w has
        partition, applied_hi_inclusive, visible_hi_inclusive, persisted_hi_inclusive, high_watermark,
        lag_messages and lag_bytes (server/consume/watermarks.py PartitionWatermarks)."""
        self.registry.register(_WatermarkCollector(read))

    def lost_writes(self, database: str, ranges: int) -> None:
        """Counts `ranges` ranges of acknowledged writes the write buffer lost (per Kafka partition)."""
        self._lost.labels(database=database).inc(ranges)

    def poisoned(self, database: str) -> None:
        """Counts one message of `database` found failing on its own and set aside."""
        self._poisoned.labels(database=database).inc()

    def poisoned_held(self, database: str, held: int) -> None:
        """Sets how many messages of `database` are held now."""
        self._poisoned_held.labels(database=database).set(held)

    def broker_batches_truncated(self, n: int) -> None:
        """Counts `n` record batches deleted from the durable embedded broker's store."""
        self._truncated.inc(n)

    def observe_stage(self, stage: str, seconds: float) -> None:
        """Records `seconds` spent in `stage` (one of WRITE_STAGES) by one request."""
        self._stage.labels(stage=stage).observe(seconds)

    def acknowledged(self, points: int) -> None:
        """Counts one request acknowledged by Kafka and its points."""
        self._requests.inc()
        self._points.inc(points)

    def no_sync_failed(self, points: int) -> None:
        """Counts the points of a no_sync write that Kafka did not acknowledge."""
        self._no_sync_failed.inc(points)

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        """Records one garbage collection of `generation` (0-2) that took `seconds`."""
        self._gc.labels(generation=str(generation)).observe(seconds)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format (CONTENT_TYPE_LATEST)."""
        return generate_latest(self.registry)


#: the watermarks `iox_watermark_offset` reports, by its `watermark` label
WATERMARKS = ("applied_hi_inclusive", "visible_hi_inclusive", "persisted_hi_inclusive", "high_watermark")


class _WatermarkCollector:
    """A prometheus_client collector reading the watermarks at each scrape (see `watch_watermarks`)."""

    def __init__(self, read):
        self._read = read

    def describe(self):
        return []  # read at scrape time only: registering must not call `read`

    def collect(self):
        marks = GaugeMetricFamily("iox_watermark_offset", "Write-buffer watermarks per database and Kafka "
                                  "partition: applied/visible/persisted_hi_inclusive (inclusive offsets, -1 = none), "
                                  "high_watermark (Kafka's exclusive end, -1 = unknown)",
                                  labels=["database", "partition", "watermark"])
        lag = GaugeMetricFamily("iox_write_buffer_lag_messages", "Offsets written to the Kafka partition and not "
                                "applied yet", labels=["database", "partition"])
        lag_bytes = GaugeMetricFamily("iox_write_buffer_lag_bytes", "Estimated bytes of the offsets not applied "
                                      "yet (lag times the mean size of the messages this server produced)",
                                      labels=["database", "partition"])
        try:
            read = self._read()
        except Exception:  # the other metrics are still served
            logging.getLogger(__name__).exception("reading the watermarks for /metrics")
            read = []
        for database, w in read:
            kp = str(w.partition)
            for name in WATERMARKS:
                marks.add_metric([database, kp, name], getattr(w, name))
            lag.add_metric([database, kp], w.lag_messages)
            lag_bytes.add_metric([database, kp], w.lag_bytes)
        yield marks
        yield lag
        yield lag_bytes
