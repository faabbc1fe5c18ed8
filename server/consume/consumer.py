"""The write-buffer consumer: one Spark Structured Streaming query over every database topic.

When it runs: started by the server after the catalog is loaded, at the replay
plan's start offsets; stopped on shutdown. A watchdog restarts the query if it
dies, from the offsets the catalog has applied (applied_hi_inclusive + 1), so
nothing is skipped and nothing is applied twice.

Spark's own checkpoint directory is scratch: the catalog, not Spark, decides
where reading resumes. The same restart, on purpose, is `restart`: once a held
poisoned message is retried or accepted (server/write_buffer/poison.py), or a database
continues on a new topic, the query is stopped, the change is made while no
micro-batch runs, and the query starts again from the applied offsets, which
re-reads exactly what was not applied.

A stop waits at most spark.sql.streaming.stopTimeout for the micro-batch in flight
(server/runtime/spark.py); one that outlives it keeps `Ingestor.batch_lock`. No
new query starts while it holds it (the watchdog waits for it; `restart` waits
`restart_batch_wait_s`, then raises StreamRestartTimedOut with nothing changed),
and each query has its own generation: a batch of a stopped query that reaches
the lock after a new query started applies nothing.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import time
import uuid

from iox_spark.catalog.catalog import Catalog

from iox_spark.server.consume.ingest import Ingestor
from iox_spark.server.errors import StreamRestartTimedOut
from iox_spark.server.write_buffer.kafka_source import SOURCE_NAME

__all__ = ["WriteBufferConsumer"]

log = logging.getLogger(__name__)

#: How often the watchdog checks that the streaming query is alive.
WATCHDOG_INTERVAL_S = 2.0
#: How long `restart` waits, once the stream stopped, for a micro-batch of it still applying.
RESTART_BATCH_WAIT_S = 30.0


class WriteBufferConsumer:
    def __init__(self, spark, catalog: Catalog, ingestor: Ingestor, bootstrap: str, scratch_dir: str,
                 trigger_interval_ms: int, max_messages_per_partition: int, pause_file: str,
                 acked_marks_dir: str = "", holds_file: str = "",
                 restart_batch_wait_s: float = RESTART_BATCH_WAIT_S, *, throttle_file: str = "",
                 freeze_file: str = ""):
        self.spark = spark
        self.restart_batch_wait_s = restart_batch_wait_s
        self.catalog = catalog
        self.ingestor = ingestor
        self.bootstrap = bootstrap
        self.scratch_dir = scratch_dir
        self.trigger_interval_ms = trigger_interval_ms
        self.max_messages_per_partition = max_messages_per_partition
        self.pause_file = pause_file
        #: where the write buffer marks topics it got a write acknowledged on (end_polls.AckMarks)
        self.acked_marks_dir = acked_marks_dir
        #: partitions held at a poisoned message (server/write_buffer/poison.py), for the streaming source
        self.holds_file = holds_file
        #: the memory guard's lower read limit under memory pressure (server/runtime/memory_guard.py); "" = none
        self.throttle_file = throttle_file
        #: while it exists the server is frozen (server/write_buffer/freeze.py); "" = never
        self.freeze_file = freeze_file
        #: one (re)start of the query at a time: the watchdog's and `restart`'s
        self._restart_lock = threading.Lock()
        self._query = None
        self._stopping = threading.Event()
        self._watchdog = None
        self.restarts = 0
        self.last_error: str | None = None

    def start(self, start_offsets: dict, known_ends: dict | None = None) -> None:
        """start_offsets: {topic: {kafka partition (int): first offset to read}}; known_ends: {topic:
        {kafka partition: true end (last offset + 1)}} confirmed at start (the replay's ends, read
        exactly before the server took writes): the first micro-batch reads up to them at once
        instead of up to a watermark that may stop short of a last batch of several messages. Only
        the first query gets them: a query started later (the watchdog, an epoch reset) asks Kafka."""
        self._start_query(start_offsets, known_ends)
        self._watchdog = threading.Thread(target=self._watch, name="consumer-watchdog", daemon=True)
        self._watchdog.start()

    def _start_query(self, start_offsets: dict, known_ends: dict | None = None) -> None:
        """Starts a query of a new generation. Called with `Ingestor.batch_lock` held (or before
        any query ran): no batch of an earlier query is applying."""
        self.ingestor.stream_generation += 1
        apply = functools.partial(self.ingestor.apply_batch, generation=self.ingestor.stream_generation)

        ckpt = os.path.join(self.scratch_dir, f"stream-{uuid.uuid4().hex}")
        opts = {
            "bootstrap": self.bootstrap,
            "start_offsets": _per_partition_json(start_offsets),
            "max_messages_per_partition": str(self.max_messages_per_partition),
            "pause_file": self.pause_file,
            "acked_marks_dir": self.acked_marks_dir,
            "holds_file": self.holds_file,
            "throttle_file": self.throttle_file,
            "freeze_file": self.freeze_file,
            "known_ends": _per_partition_json(known_ends or {}),
        }
        reader = self.spark.readStream.format(SOURCE_NAME)
        for k, v in opts.items():
            reader = reader.option(k, v)
        self._query = (reader.load().writeStream.queryName(f"iox-write-buffer-{uuid.uuid4().hex[:8]}")
                       .foreachBatch(apply)
                       .option("checkpointLocation", ckpt)
                       .trigger(processingTime=f"{self.trigger_interval_ms} milliseconds")
                       .start())
        self._ckpt = ckpt

    def resume_offsets(self) -> dict:
        """Per topic and Kafka partition, the first offset not yet applied."""
        out: dict = {}
        for db in self.catalog.databases():
            out[db.topic] = {p: off + 1 for p, off in db.applied_offsets().items() if off >= 0}
        return out

    def _watch(self) -> None:
        while not self._stopping.wait(WATCHDOG_INTERVAL_S):
            if not self._restart_lock.acquire(blocking=False):
                continue  # `restart` is at work
            try:
                q = self._query
                if q is None or q.isActive or self._stopping.is_set():
                    continue
                if not self.ingestor.batch_lock.acquire(blocking=False):
                    continue  # a batch of the stopped query still applies: what it applies is not read again
                try:
                    exc = q.exception()
                    self.last_error = str(exc) if exc else "stopped"
                    log.error("write-buffer stream stopped (%s); restarting from the applied offsets", self.last_error)
                    self.restarts += 1
                    self._start_query(self.resume_offsets())
                except Exception:
                    log.exception("restarting the write-buffer stream failed")
                finally:
                    self.ingestor.batch_lock.release()
            finally:
                self._restart_lock.release()

    def restart(self, between=None):
        """Stops the query (a micro-batch in flight finishes, or fails and is withdrawn), calls
        `between()` while no micro-batch runs, then starts the query again from the applied offsets
        (also when `between` raises, which is then raised). Returns what `between` returned.
        A batch of the stopped query still applying `restart_batch_wait_s` after the stop:
        StreamRestartTimedOut, `between` not called (the watchdog starts the query once that batch
        ends). Called from gRPC and lifecycle threads (admin commands, pool claims and losses)."""
        with self._restart_lock:
            if self._stopping.is_set():
                raise RuntimeError("the write-buffer consumer is stopping")
            self.ingestor.quiescing.set()
            try:
                q = self._query
                t0 = time.monotonic()
                if q is not None:
                    try:
                        q.stop()
                    except Exception:
                        log.exception("stopping the write-buffer stream for a restart")
                self.ingestor.stream_generation += 1  # a batch of it that has not begun applies nothing
                if not self.ingestor.batch_lock.acquire(timeout=self.restart_batch_wait_s):
                    waited = time.monotonic() - t0
                    log.error("a micro-batch of the stopped write-buffer stream still applies after %.1f s; the "
                              "stream starts again once it ends", waited)
                    raise StreamRestartTimedOut(round(waited, 1))
                try:
                    return between() if between is not None else None
                finally:
                    try:
                        offsets = self.resume_offsets()
                        self.ingestor.quiescing.clear()
                        self.restarts += 1
                        self._start_query(offsets)
                        log.info("write-buffer stream restarted from the applied offsets")
                    finally:
                        self.ingestor.batch_lock.release()
            finally:
                self.ingestor.quiescing.clear()

    @property
    def is_active(self) -> bool:
        return self._query is not None and self._query.isActive

    def stop(self) -> None:
        self._stopping.set()
        self.ingestor.quiescing.set()
        if self._query is not None:
            try:
                self._query.stop()
            except Exception:
                log.exception("stopping the stream")
        self.ingestor.stream_generation += 1  # a batch that outlived the stop and has not begun: nothing
        shutil.rmtree(self.scratch_dir, ignore_errors=True)


def _per_partition_json(offsets: dict) -> str:
    """{topic: {kafka partition (int): offset}} as the streaming source's options take it (JSON,
    partitions as strings)."""
    return json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()})
