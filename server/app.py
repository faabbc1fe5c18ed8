"""The server: wires broker, write buffer, Spark, consumer, catalog, query and gRPC.

When it runs: `iox serve` builds one `IoxServer`, calls `start()` and blocks in
`wait()` until SIGTERM/SIGINT, then `stop()` shuts down in reverse order
(gRPC stops taking requests, the stream stops, producers close, the embedded
broker this data directory owns is stopped).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

from grpc_health.v1 import health_pb2

from catalog.catalog import Catalog, DatabaseNotFoundError
from iox import management_pb2

from . import broker as broker_mod
from .config import ServerConfig
from .consumer import WriteBufferConsumer
from .errors import DatabaseNotFound
from .grpc_services import SERVICE_NAMES, build_grpc_server
from .ingest import Ingestor
from .query import QueryEngine
from .router import Router
from .spark import build_spark
from .write_buffer import WriteBuffer

__all__ = ["IoxServer"]

log = logging.getLogger(__name__)


class IoxServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.catalog = Catalog()
        self.broker = None
        self.spark = None
        self.write_buffer = None
        self.consumer = None
        self.grpc = None
        self.grpc_port = None
        self._health = None
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.started_at = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        data_dir = cfg.abs_data_dir
        os.makedirs(data_dir, exist_ok=True)
        t0 = time.monotonic()
        if cfg.kafka_bootstrap:
            bootstrap = cfg.kafka_bootstrap
        else:
            self.broker = broker_mod.start_or_reuse(data_dir, cfg.embedded_broker_port)
            bootstrap = self.broker.bootstrap
            log.info("embedded broker on %s (pid %s)", bootstrap, self.broker.pid)
        self.bootstrap = bootstrap
        self.write_buffer = WriteBuffer(bootstrap, cfg.partitions, cfg.produce_timeout_ms)
        scratch = os.path.join(data_dir, "spark")
        from pyspark.sql import SparkSession

        # a server stops only the Spark application it created (tests run several servers on one)
        self._owns_spark = SparkSession.getActiveSession() is None and SparkSession._instantiatedSession is None
        self.spark = build_spark(cfg.spark_master, cfg.driver_memory, scratch, cfg.spark_connect_port,
                                 cfg.extra_spark_conf)
        self.ingestor = Ingestor(self.spark, self.catalog, cfg.partitions)
        self.query_engine = QueryEngine(self.spark, self.catalog)
        self.router = Router(self.catalog, self.write_buffer, cfg.partitions, cfg.max_request_bytes)
        # databases that already exist on the broker are known before their first batch
        for topic, n in self.write_buffer.list_database_topics().items():
            from .write_buffer import database_of_topic

            self.catalog.ensure_database(database_of_topic(topic), topic, n)
        self.consumer = WriteBufferConsumer(
            self.spark, self.catalog, self.ingestor, bootstrap, os.path.join(scratch, "streams"),
            cfg.trigger_interval_ms, cfg.max_messages_per_partition_per_batch,
            os.path.join(data_dir, "backpressure"))
        self.consumer.start({})
        self.grpc, self._health, self.grpc_port = build_grpc_server(self, cfg.bind_host, cfg.grpc_port)
        self.grpc.start()
        self.http = None
        if cfg.http_port:
            from .http_api import HttpWriteServer

            self.http = HttpWriteServer(self.router, cfg.bind_host, cfg.http_port)
            self.http.start()
        for name in ("",) + SERVICE_NAMES:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.started_at = time.time()
        log.info("iox serving gRPC on port %s (started in %.1fs)", self.grpc_port, time.monotonic() - t0)

    def wait(self) -> None:
        """Blocks until SIGTERM/SIGINT (main thread only), then stops."""
        def _on_signal(signum, _frame):
            log.info("signal %s: shutting down", signum)
            threading.Thread(target=self.stop, name="shutdown").start()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        while not self._stopped.wait(0.5):
            pass

    def stop(self) -> None:
        with self._stop_lock:
            if self._stopped.is_set():
                return
            if self._health is not None:
                self._health.enter_graceful_shutdown()
            if self.grpc is not None:
                self.grpc.stop(grace=5).wait(10)
            if getattr(self, "http", None) is not None:
                self.http.stop()
            if self.consumer is not None:
                self.consumer.stop()
            if self.write_buffer is not None:
                self.write_buffer.close()
            if self.spark is not None and getattr(self, "_owns_spark", False):
                try:
                    self.spark.stop()
                except Exception:
                    log.exception("stopping Spark")
            if self.broker is not None:
                self.broker.stop()
            self._stopped.set()
            log.info("iox stopped")

    # -- status -----------------------------------------------------------------------
    def status(self, database: str = "") -> management_pb2.GetStatusResponse:
        if database:
            try:
                dbs = [self.catalog.database(database)]
            except DatabaseNotFoundError:
                raise DatabaseNotFound(database) from None
        else:
            dbs = self.catalog.databases()
        resp = management_pb2.GetStatusResponse()
        with self.catalog.lock:
            for db in dbs:
                d = resp.databases.add(name=db.name, topic=db.topic, kafka_partitions=db.kafka_partitions)
                for kp in sorted(db.applied_hi_inclusive):
                    d.write_buffer.add(partition=kp, applied_hi_inclusive=db.applied_hi_inclusive[kp])
                for table in sorted(set(db.schemas.tables()) | set(db.partitions)):
                    t = d.tables.add(name=table)
                    sch = db.schemas.get(table)
                    for c in (sch.columns if sch else []):
                        t.columns.add(name=c.name, role=c.role, type=c.type)
                    for key in sorted(db.partitions.get(table, {})):
                        p = t.partitions.add(key=key)
                        for c in db.partitions[table][key].live_chunks():
                            p.chunks.add(id=c.id, state=c.state, rows=c.rows, size_bytes=c.size_bytes,
                                         min_time_ns=c.min_time_ns, max_time_ns=c.max_time_ns)
        return resp
