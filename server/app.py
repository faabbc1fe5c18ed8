"""The server: wires broker, write buffer, Spark, consumer, catalog, query and gRPC.

When it runs: `iox serve` builds one `IoxServer`, calls `start()` and blocks in
`wait()` until SIGTERM/SIGINT, then `stop()` shuts down in reverse order
(gRPC stops taking requests, the stream stops, producers close, the embedded
broker this data directory owns is stopped).

A fenced database (another server committed to its preserved catalog: docs/ARCHITECTURE.md
invariant 8) stops that database only, not the server: server/fence_admin.py.

A write-buffer message that fails to apply stops only its own Kafka partition
of its database (server/write_buffer/poison.py): `iox poison retry` applies it again, `iox
poison accept` skips it for good (recorded); both restart the stream from the
applied offsets while no micro-batch runs (`WriteBufferConsumer.restart`). Lost
writes found while running (the topic replaced, a broker that lost its tail:
server/lost_writes_admin.py) are accepted with `iox accept-lost-writes`: once
what was applied is persisted, the database continues in a new write-buffer
epoch, as a start with --skip-lost-writes would; every loss stays recorded in
the preserved catalog.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time

from grpc_health.v1 import health_pb2

from iox_spark.catalog.catalog import Catalog
from iox_spark.iox import management_pb2

from iox_spark.server.runtime import broker as broker_mod
from iox_spark.server.config import ServerConfig, is_loopback
from iox_spark.server.api.auth import Authenticator
from iox_spark.server.consume.consumer import WriteBufferConsumer
from iox_spark.server.write_buffer.end_polls import AckMarks
from iox_spark.server.api.grpc_services import SERVICE_NAMES, build_grpc_server
from iox_spark.server.errors import NotAPoolMember, RoleRefuses
from iox_spark.server.write_buffer.ack_log import AckLog
from iox_spark.server.consume.ingest import Ingestor
from iox_spark.server.consume.txn_repair import TransactionRepair
from iox_spark.server.query.engine import QueryEngine
from iox_spark.server.query.read_barrier import ReadBarrier
from iox_spark.server.consume.watermarks import MessageSizes
from iox_spark.server.write.backpressure import WriteBackpressure
from iox_spark.server.write.router import Router
from iox_spark.server.runtime.broker_supervisor import BrokerSupervisor
from iox_spark.server.runtime.broker_truncation import BrokerTruncation
from iox_spark.server.runtime.spark import build_spark, lower_spark_priority
from iox_spark.server.write_buffer.kafka_ends import KafkaEnds
from iox_spark.server.write_buffer.producer import WriteBuffer
from iox_spark.catalog.sharding import topic_for
from iox_spark.server.query.tail import WriteBufferTail
from iox_spark.server.runtime.write_path_priority import raise_server_and_broker
from iox_spark.server.runtime.memory_guard import MemoryGuard, process_tree_rss_bytes
from iox_spark.server.runtime.ports import check_ports_free
from iox_spark.server.runtime import spark_connect
from iox_spark.server.retention_admin import RetentionControl, operation_gauges
from iox_spark.server.epoch_reset import EpochReset
from iox_spark.server.fence_admin import FenceControl
from iox_spark.server.freeze_admin import FreezeControl
from iox_spark.server.lost_writes_admin import LostWritesControl
from iox_spark.server.poison_admin import PoisonControl
from iox_spark.server.pool_admin import PoolControl
from iox_spark.server.replay_watch import ReplayWatch
from iox_spark.server.status_document import StatusDocument
from iox_spark.server.query_service import QueryService
from iox_spark.server.query.visibility import Visibility
from iox_spark.server.clean_stop import drain_and_persist
from iox_spark.server.manual_actions import ManualActions
from iox_spark.server.verify_admin import VerifyControl
from iox_spark.server.write_buffer.freeze import cap_replay_until
from iox_spark.server.api.buckets import BucketsApi

__all__ = ["IoxServer"]


log = logging.getLogger(__name__)



def _advertised(bind_host: str, port: int) -> str:
    """host:port other hosts reach a server bound to `bind_host` at (the host's name when bound to
    every interface)."""
    import socket

    host = socket.getfqdn() if bind_host in ("0.0.0.0", "::", "") else bind_host
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class IoxServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.catalog = Catalog()
        self.broker = None
        #: deletes persisted messages from the durable embedded broker's store; None without one
        self.broker_truncation = None
        self.spark = None
        self.write_buffer = None
        self.consumer = None
        self.grpc = None
        self.grpc_port = None
        self._health = None
        self.authenticator = None
        self._stopped = threading.Event()
        #: SIGTERM / SIGINT came (`install_signal_handlers`): `wait` stops the server, also one that
        #: was still starting when the signal came
        self._stop_requested = threading.Event()
        self._stop_lock = threading.Lock()
        self.started_at = None
        self.lifecycle = None
        self.tail = None
        #: ingester pool membership (server/pool_admin.py); None when not a pool member
        self.pool = None
        #: each database's replay of its write buffer (server/replay_watch.py); built at start
        self.replay = None
        #: Kafka's end offsets as status and /metrics report them (server/write_buffer/kafka_ends.py)
        self.kafka_ends = None
        #: lost writes found while running (server/lost_writes_admin.py), the operator's word on
        #: poisoned messages (server/poison_admin.py); built once the lifecycle is
        self.losses = None
        self.poison = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Starts every part; a start that fails stops what it started before raising."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        cfg = self.config
        # first: a tokens file that does not load stops the start before anything runs
        self.authenticator = Authenticator(cfg.auth_token, cfg.auth_tokens_file)
        if not self.authenticator.enabled and not is_loopback(cfg.bind_host):
            log.warning("serving on %s WITHOUT authentication (--insecure)", cfg.bind_host)
        from pyspark.sql import SparkSession

        # a server stops only the Spark application it created (tests run several servers on one)
        self._owns_spark = SparkSession.getActiveSession() is None and SparkSession._instantiatedSession is None
        # a port another process holds stops the start here, in one line naming its option
        check_ports_free(cfg.bind_host, [(cfg.grpc_port, "--grpc-port"), (cfg.http_port, "--http-port"),
                                         (cfg.influxdb3_port, "--influxdb3-port")] + (
            [(cfg.spark_connect_port, "--spark-connect-port")] if self._owns_spark and cfg.role != "ingester" else []))
        data_dir = cfg.abs_data_dir
        os.makedirs(data_dir, exist_ok=True)
        t0 = time.monotonic()
        if cfg.kafka_bootstrap:
            bootstrap = cfg.kafka_bootstrap
        else:
            self.broker = broker_mod.start_or_reuse(data_dir, cfg.embedded_broker_port, cfg.broker_storage)
            bootstrap = self.broker.bootstrap
            if self.broker.in_memory:
                log.warning("embedded broker on %s (pid %s) keeps the write buffer IN MEMORY: a crash of the broker "
                            "or a restart of the host loses acknowledged writes not yet persisted (at most %g s "
                            "old); production runs a Kafka cluster (--kafka-bootstrap)",
                            bootstrap, self.broker.pid, cfg.lifecycle_rules().persist_age_threshold_s)
            else:
                log.info("embedded broker on %s (pid %s, storage %s%s)", bootstrap, self.broker.pid,
                         self.broker.storage, f" in {self.broker.store_dir}" if self.broker.store_dir else "")
        self.bootstrap = bootstrap
        self.write_buffer = WriteBuffer(bootstrap, cfg.partitions, cfg.produce_timeout_ms, cfg.txn_timeout_s,
                                        cfg.replication_factor if cfg.kafka_bootstrap else 1)
        self.kafka_ends = KafkaEnds(self.write_buffer, self.catalog)
        from iox_spark.catalog.object_store import object_store_from_url

        self.store = object_store_from_url(cfg.object_store_url, cfg.s3_endpoint)
        if cfg.pool_member is not None:  # the pool's Kafka cluster and object store, or no start (before Spark)
            from iox_spark.server.pool_identity import establish_pool_identity

            establish_pool_identity(self.store, bootstrap, cfg.pool_member, cfg.object_store_url,
                                    cfg.replication_factor if cfg.kafka_bootstrap else 1, time.time())
        # what earlier runs acknowledged, and where this one records what it acknowledges
        self.ack_log = AckLog(data_dir)
        scratch = os.path.join(data_dir, "spark")
        sc_port = 0 if cfg.role == "ingester" else cfg.spark_connect_port  # an ingester answers no query
        #: the token Spark Connect requires (never none: server/runtime/spark_connect.py); None when it is off
        self.spark_connect_token = spark_connect.token_for(data_dir, sc_port, cfg.auth_token) \
            if sc_port and self._owns_spark else None
        self.spark = build_spark(cfg.spark_master, cfg.driver_memory, scratch, sc_port, cfg.extra_spark_conf,
                                 cfg.bind_host, self.spark_connect_token)
        if self.spark_connect_token is not None:
            log.info("Spark Connect on port %d needs its token: `iox spark-connect-url --data-dir %s` prints "
                     "sc://localhost:%d/;token=...", sc_port, data_dir, sc_port)
        if self._owns_spark and cfg.spark_nice:
            n = lower_spark_priority(self.spark, cfg.spark_nice)
            log.info("Spark JVM: %d thread(s) at nice %d", n, cfg.spark_nice)
        from iox_spark.chunk_store.cluster import runs_local
        from iox_spark.lifecycle.worker import LifecycleWorker

        if not runs_local(self.spark):  # executors on other hosts: they must run this code
            from iox_spark.server.runtime.executor_check import check_executor_environment

            check_executor_environment(self.spark, cfg.spark_master)

        from iox_spark.server.consume.recovery import list_catalog_databases, recover
        from iox_spark.server.consume.replay_schemas import load_replay_schemas
        from iox_spark.server.write_buffer.producer import PartitionCountMismatch
        from iox_spark.catalog.sharding import database_of_topic

        self.rules = cfg.lifecycle_rules()
        self.catalog.late_arrive_window_s = self.rules.late_arrive_window_s
        # local mode on S3: Parquet files are copied to this directory (up to its byte limit) and read
        # natively; on a cluster the executors read the object store themselves (nothing of it on the
        # driver's disk); a local object store is read in place
        from iox_spark.catalog.object_store import LocalObjectStore
        from iox_spark.chunk_store.parquet_cache import ParquetCache

        self.parquet_cache = ParquetCache(os.path.join(data_dir, "parquet-cache"), cfg.parquet_cache_max_bytes,
                                          self.catalog.query_pins) \
            if runs_local(self.spark) and not isinstance(self.store, LocalObjectStore) else None
        topics = self.write_buffer.list_database_topics()
        for topic, n in topics.items():
            if n != cfg.partitions:
                raise PartitionCountMismatch(topic, cfg.partitions, n)
        databases = sorted(set(list_catalog_databases(self.store)) | {database_of_topic(t) for t in topics})
        t_recover = time.time()
        # an ingester pool member applies only the Kafka partitions claimed for it (server/pool_admin.py)
        self.catalog.pool_member = cfg.pool_member is not None
        rec = recover(self.spark, self.catalog, self.store, cfg.partitions, t_recover,
                      self.rules.catalog_transactions_until_checkpoint, databases, self.write_buffer,
                      cfg.skip_lost_writes, self.parquet_cache, pool_member=cfg.pool_member,
                      acked=self.ack_log.at_start, tail_loss_grace_s=cfg.tail_loss_grace_s)
        for name in databases:
            self.catalog.ensure_database(name, topic_for(name), cfg.partitions)
        # losses found by this start (the preserved catalog also lists those of earlier runs)
        self._lost_at_start = {db.name: n for db in self.catalog.databases()
                               if (n := sum(1 for r in db.lost_writes if r.detected_at_s >= t_recover))}
        # frozen mode (server/write_buffer/freeze.py): a record a previous run left stays in force, and
        # the replay reads only up to what was applied when the server froze
        # resident bytes of the process tree (server/runtime/memory_guard.py): the embedded broker and
        # its store count too, also when reused from an earlier run (no children of this process
        # then); their pids are read at each sample: the supervisor may restart them
        broker_pids = lambda: [p for p in ((self.broker.pid, self.broker.store_pid)  # noqa: E731
                                           if self.broker is not None else ()) if p]
        tree_bytes = lambda exact=True: process_tree_rss_bytes(extra_pids=broker_pids(), exact=exact)  # noqa: E731
        self.freeze = FreezeControl(self.catalog, data_dir, cfg.freeze_at_percent, cfg.memory_limit_bytes, rss=tree_bytes)
        self.freeze.hold_recorded()
        replay_until = {t: p for t, p in cap_replay_until(rec.replay_until, self.freeze.record).items() if p}
        self.replay = ReplayWatch(self.catalog, replay_until, rec.replay_from, on_caught_up=self._replay_caught_up)
        for topic, until in replay_until.items():  # types of Kafka-only tables, before any write
            load_replay_schemas(bootstrap, self.catalog.database(database_of_topic(topic)),
                                rec.start_offsets.get(topic, {}), until)
        # which Kafka partitions are held at a poisoned message (server/write_buffer/poison.py): none at start
        holds_file = os.path.join(scratch, "poison-holds.json")
        if os.path.exists(holds_file):
            os.unlink(holds_file)
        self.ingestor = Ingestor(self.spark, self.catalog, cfg.partitions, rec.row_filters, cfg.txn_timeout_s,
                                 holds_file=holds_file)
        for db in self.catalog.databases():
            for table in db.table_names():
                self.ingestor.refresh_table_view(db, table)
        self.tail = None
        if cfg.tail_max_bytes:
            self.tail = WriteBufferTail(self.catalog, bootstrap, cfg.tail_max_bytes,
                                        is_replaying=self.replay.any_replaying)
        self.acked_marks = AckMarks(os.path.join(scratch, "acked"))
        self.write_buffer.on_acked = self._on_acked
        self.query_engine = QueryEngine(self.spark, self.catalog, self.tail, self.ingestor.table_view_sql_of,
                                        cfg.max_query_rows, cfg.max_query_bytes, cfg.query_timeout_s)
        self.router = Router(self.catalog, self.write_buffer, cfg.partitions, cfg.max_request_bytes)
        self.router.max_columns_per_table = cfg.max_columns_per_table
        if cfg.pool_member is not None:  # column types are the pool's (catalog/pool_schema.py)
            self.router.agree_columns = self._agree_columns
        for name, n in self._lost_at_start.items():
            self.router.metrics.lost_writes(name, n)
        self.ingestor.metrics = self.router.metrics
        self.message_sizes = MessageSizes()
        self.visibility = Visibility(self.catalog, self.tail, self.kafka_ends, self.message_sizes,
                                     self._database_checkpoint)
        self.read_barrier = ReadBarrier(self.catalog, self.ingestor.wait_applied, self.visibility.for_barrier,
                                        self.replay.state)
        self.router.metrics.watch_watermarks(self.visibility.all_watermarks)
        self.pause_file = os.path.join(data_dir, "backpressure")
        if os.path.exists(self.pause_file):
            os.unlink(self.pause_file)
        self.consumer = WriteBufferConsumer(
            self.spark, self.catalog, self.ingestor, bootstrap, os.path.join(scratch, "streams"),
            cfg.trigger_interval_ms, cfg.max_messages_per_partition_per_batch, self.pause_file,
            self.acked_marks.directory, holds_file)
        # the process tree's resident bytes (tree_bytes, above) against --memory-limit-bytes
        self.memory_guard = MemoryGuard(cfg.memory_limit_bytes, cfg.memory_soft_fraction,
                                        cfg.memory_sample_interval_ms, os.path.join(scratch, "memory-throttle"),
                                        cfg.max_messages_per_partition_per_batch,
                                        measure=tree_bytes, bound=lambda: tree_bytes(exact=False))
        self.router.metrics.operation.watch(lambda: operation_gauges(self.catalog, self.memory_guard, self.replay))
        self.consumer.throttle_file = self.memory_guard.throttle_file
        self.consumer.freeze_file = self.freeze.path
        self.memory_guard.start()
        self.consumer.start(rec.start_offsets)
        if self.replay.planned:
            threading.Thread(target=self.replay.log_progress, args=(self._stopped,), name="replay-progress",
                             daemon=True).start()
        if self.tail is not None:
            self.tail.start()
        # what is persisted leaves the durable embedded broker's store (server/runtime/broker_truncation.py)
        if self.broker is not None and self.broker.store_port is not None and cfg.pool_member is None \
                and not math.isinf(cfg.broker_persisted_retention_s):
            self.broker_truncation = BrokerTruncation(
                lambda: self.broker.store_port if self.broker is not None else None,
                cfg.broker_persisted_retention_s, self.router.metrics).start()
        self.lifecycle = LifecycleWorker(self.spark, self.catalog, self.rules, self.store, rec.preserved,
                                         self.ingestor.refresh_table_view, self.pause_file,
                                         is_replaying=self.replay.replaying,
                                         on_persisted=self._commit_resumption_offsets, cache=self.parquet_cache)
        self.fence = FenceControl(self.catalog, self.lifecycle, self.ingestor)
        self.lifecycle.on_fenced = self.fence.on_fenced
        self.lifecycle.prune_delay_s = cfg.prune_delay_s
        self.lifecycle.memory_pressure = self.memory_guard.pressure
        self.lifecycle.frozen = lambda: self.freeze.frozen
        self.pool = PoolControl(self, cfg.pool_member) if cfg.pool_member is not None else None
        self.verifier = VerifyControl(self.spark, self.catalog, self.tail, self.ingestor.table_view_sql_of,
                                      self.read_barrier, self.write_buffer, self.pool)
        if self.pool is not None:
            self.lifecycle.on_partitions_lost = self.pool.lose
            self.lifecycle.on_catalog_refreshed = self.pool.take_state
        self.lifecycle.metrics = self.router.metrics.operation
        self.lifecycle.start()
        self.freeze.start(self.consumer)
        if self.freeze.frozen:
            log.warning("frozen since %.0f (%s): no new write-buffer offsets are consumed until `iox unfreeze`",
                        self.freeze.record.since_s, self.freeze.record.reason)
        self.losses = LostWritesControl(self.catalog, self.write_buffer, self.lifecycle, self.consumer,
                                        self.router.metrics, cfg.partitions, cfg.tail_loss_grace_s, self._stopped,
                                        replaying=self.replay.replaying,
                                        refuse_when_fenced=self.fence.refuse_when_fenced,
                                        forget_epoch=EpochReset(self.ingestor, self.replay, self.kafka_ends,
                                                                self.message_sizes, self.write_buffer,
                                                                self.tail).forget,
                                        ack_log=self.ack_log)
        self.poison = PoisonControl(self.catalog, self.consumer, self.lifecycle, self.ingestor,
                                    refuse_when_fenced=self.fence.refuse_when_fenced)
        self.queries = QueryService(cfg.role, self.catalog, self.read_barrier, self.query_engine, self.pool)
        self.retention = RetentionControl(self.catalog, self.lifecycle, self.ingestor, cfg.partitions,
                                          self.fence.refuse_when_fenced)
        self.manual = ManualActions(self.catalog, self.write_buffer, self.ingestor.wait_applied, self.lifecycle,
                                    cfg.partitions)
        self.status_document = StatusDocument(self.catalog, self.lifecycle, self.freeze, self.replay,
                                              self.visibility.watermarks, self.store, cfg.pool_member)
        self.write_buffer.guard = self.losses.guard
        self.write_buffer.confirm = self.losses.confirm
        self.write_buffer.on_topic = self.losses.on_topic
        for db in self.catalog.databases():
            if db.tail_truncated is not None:  # found by recovery: continues once its replay is persisted
                self.losses.continue_after_tail_lost(db, lost=False)
        threading.Thread(target=self.losses.run_tail_checks, name="tail-check", daemon=True).start()
        TransactionRepair(self.ingestor, self.write_buffer, self._stopped).start()
        self.router.overload_check = WriteBackpressure(self.memory_guard, self.lifecycle, self.catalog,
                                                       self.rules).refusal
        self.router.database_check = self.fence.refuse_when_fenced
        self.grpc, self._health, self.grpc_port = build_grpc_server(self, cfg.bind_host, cfg.grpc_port,
                                                                    authenticator=self.authenticator,
                                                                    max_workers=cfg.grpc_workers,
                                                                    max_request_bytes=cfg.max_request_bytes,
                                                                    max_concurrent_rpcs=cfg.max_concurrent_rpcs)
        self.grpc.start()
        if self.pool is not None:  # where the other members ask this one for its unpersisted rows
            self.pool.publish_address(cfg.pool_address or _advertised(cfg.bind_host, self.grpc_port))
        self.http = None
        if cfg.http_port:
            from iox_spark.server.api.http_api import HttpWriteServer, database_for

            self.http = HttpWriteServer(self.router, cfg.bind_host, cfg.http_port, authenticator=self.authenticator,
                                        workers=cfg.http_workers)
            # /api/v2/buckets (server/api/buckets.py)
            self.http.buckets = BucketsApi(self.catalog, self.retention.set, database_for, time.time())
            self.http.query = self.query  # /api/v3/query_sql (server/api/http_query.py)
            self.http.iox = self  # InfluxQL: /query, /api/v3/query_influxql (server/api/influxql_answer.py)
            self.http.start()
        self.one_port = None
        if cfg.influxdb3_port and self.http is not None:  # last: both servers behind it are serving
            from iox_spark.server.api.one_port import OnePortServer
            from iox_spark.server.runtime.ports import PortTaken

            target = "127.0.0.1" if cfg.bind_host in ("0.0.0.0", "::", "", "localhost") else cfg.bind_host
            try:
                self.one_port = OnePortServer(cfg.bind_host, cfg.influxdb3_port, self.grpc_port, self.http.port,
                                              target).start()
            except OSError as e:
                raise PortTaken(cfg.bind_host, cfg.influxdb3_port, "--influxdb3-port", str(e)) from None
        if cfg.write_path_rt_priority:  # last: every process the server starts is running by now
            raise_server_and_broker(self.broker, cfg.write_path_rt_priority)
        if self.broker is not None:
            BrokerSupervisor(lambda: self.broker, data_dir, cfg.broker_storage, self._stopped, self._stop_lock,
                             on_restarted=lambda nb: setattr(self, "broker", nb)).start()
        for name in ("",) + SERVICE_NAMES:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.started_at = time.time()
        log.info("iox serving gRPC on port %s (started in %.1fs)", self.grpc_port, time.monotonic() - t0)

    def reload_tokens(self) -> bool:
        """Re-reads `--auth-tokens-file` (SIGHUP); an invalid file is logged and the tokens in use stay."""
        return self.authenticator.reload() if self.authenticator is not None else False

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT ask `wait` to stop the server; SIGHUP re-reads the tokens file. Main
        thread only; `iox serve` installs them before `start`, so a signal that comes while the
        server starts (its health already SERVING, or not yet) is a clean stop once it started,
        never the signal's default death."""
        def _on_signal(signum, _frame):
            log.info("signal %s: shutting down", signum)
            self._stop_requested.set()

        def _on_hup(_signum, _frame):
            threading.Thread(target=self.reload_tokens, name="reload-tokens").start()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGHUP, _on_hup)

    def wait(self) -> None:
        """Blocks until SIGTERM/SIGINT (main thread only; see `install_signal_handlers`), then stops."""
        self.install_signal_handlers()
        while not self._stopped.is_set():
            if self._stop_requested.wait(0.5):
                self.stop()

    def stop(self) -> None:
        with self._stop_lock:
            if self._stopped.is_set():
                return
            if self._health is not None:
                self._health.enter_graceful_shutdown()
            if self.grpc is not None:
                self.grpc.stop(grace=5).wait(10)
            if getattr(self, "one_port", None) is not None:
                self.one_port.stop()
            if getattr(self, "http", None) is not None:
                self.http.stop()
            if getattr(self, "router", None) is not None:
                self.router.close()  # no_sync writes handed to the producer: Kafka acknowledges them first
            if self.broker is not None and self.broker.in_memory and \
                    self.lifecycle is not None and self.consumer is not None:
                drain_and_persist(self.catalog, self.write_buffer, self.lifecycle, self.replay)
            if self.lifecycle is not None:
                self.lifecycle.stop()
            if self.broker_truncation is not None:
                self.broker_truncation.close()
            if getattr(self, "memory_guard", None) is not None:
                self.memory_guard.stop()
            if getattr(self, "freeze", None) is not None:
                self.freeze.stop()
            if self.pool is not None:
                self.pool.close()
            if self.tail is not None:
                self.tail.stop()
            if self.consumer is not None:
                self.consumer.stop()
            if self.write_buffer is not None:
                self.write_buffer.close()
            if getattr(self, "ack_log", None) is not None:
                self.ack_log.close()
            if self.spark is not None and getattr(self, "_owns_spark", False):
                try:
                    self.spark.stop()
                except Exception:
                    log.exception("stopping Spark")
            if self.broker is not None:
                self.broker.stop()
            self._stopped.set()
            log.info("iox stopped")

    def claim_partitions(self, database: str, partitions):
        """`iox claim` / the assigner: see server/pool_admin.py."""
        if self.config.role == "querier":
            raise RoleRefuses("querier", "claim partitions", "list only ingester and all members in the assigner's "
                                                             "--ingesters")
        if self.pool is None:
            raise NotAPoolMember(f"claiming partitions of {database!r}")
        return self.pool.claim(database, partitions)

    def verify(self, database: str, table: str = "", max_differences: int = 0, here_only: bool = False):
        """`iox verify`: see server/verify_admin.py and server/query/verify.py."""
        from iox_spark.server.query.verify import DEFAULT_MAX_DIFFERENCES

        if self.pool is not None and self.catalog.peek_database(database) is None:
            self.pool.learn_database(database)  # written through another member only
        return self.verifier.verify(database, table, max_differences or DEFAULT_MAX_DIFFERENCES, here_only)

    def set_retention(self, database: str, period_s: int):
        """`iox retention` / the buckets API: see server/retention_admin.py."""
        return self.retention.set(database, period_s)

    # -- replay -------------------------------------------------------------------------
    def _replay_caught_up(self) -> None:
        """The last database's replay caught up (server/replay_watch.py): the ingestor's replay row
        filters (what a persisted file already holds) are not needed any more."""
        self.ingestor.row_filters = {}

    # -- write-buffer losses -----------------------------------------------------------
    def accept_lost_writes(self, database: str):
        """`iox accept-lost-writes` (server/lost_writes_admin.py `LostWritesControl.accept`)."""
        return self.losses.accept(database)

    def _on_acked(self, topic: str, messages: list) -> None:
        """The write buffer's hook (in the acknowledging request's thread): marks the partitions written
        for the streaming source (end_polls.AckMarks) and hands the messages to the tail."""
        self.acked_marks.touch(topic, (m[0] for m in messages))
        self.message_sizes.record(topic, messages)
        if self.tail is not None:
            self.tail.feed(topic, messages)

    def _commit_resumption_offsets(self, db, db_checkpoint) -> None:
        """Bounded input reliance: after a persist, tell Kafka where replay would start."""
        offsets = {kp: (lo if lo is not None else hi + 1) for kp, (lo, hi) in db_checkpoint.sequencer_numbers.items()}
        if self.broker_truncation is not None:
            self.broker_truncation.advance(db_checkpoint.topic, offsets, time.time())
        try:
            self.write_buffer.commit_resumption_offsets(db.name, offsets)
        except Exception:
            log.exception("committing resumption offsets of %s", db.name)

    # -- queries -------------------------------------------------------------------------
    def query(self, database: str, sql: str, after: str = "", allow_partial: bool = False,
              deadline_s: float | None = None):
        """A user's SQL (server/query_service.py)."""
        return self.queries.query(database, sql, after, allow_partial, deadline_s)

    def table_columns(self, database: str) -> dict:
        """InfluxQL's tags and fields of a database (server/query_service.py)."""
        return self.queries.table_columns(database)

    def database_names(self) -> list:
        """The names of the databases this server knows, sorted (server/query_service.py)."""
        return self.queries.database_names()

    def unpersisted_rows(self, database: str, tables: list, wait_applied: dict, deadline_s: float | None,
                         written_before: dict | None = None, scans: dict | None = None, max_bytes: int = 0):
        """The UnpersistedRows RPC (server/query_service.py)."""
        return self.queries.unpersisted_rows(database, tables, wait_applied, deadline_s, written_before, scans,
                                             max_bytes)

    def _agree_columns(self, database: str, columns: dict) -> dict:
        """The router's `agree_columns` in an ingester pool (request threads): the pool's columns of
        `columns` (catalog/pool_schema.py); ColumnAgreementUnavailable when the store cannot be asked."""
        from iox_spark.catalog.pool_schema import reserve_columns
        from iox_spark.server.errors import ColumnAgreementUnavailable

        try:
            return reserve_columns(self.store, database, columns, self.config.pool_member)
        except Exception as e:  # noqa: BLE001  (the object store's errors, an unreadable reservation)
            raise ColumnAgreementUnavailable(database, f"{type(e).__name__}: {e}") from e

    def _database_checkpoint(self, name: str):
        """The preserved catalog's database checkpoint of `name` (None before the lifecycle runs or
        before its first one)."""
        pc = self.lifecycle.preserved.get(name) if self.lifecycle is not None else None
        return pc.state.database_checkpoint if pc is not None else None

    # -- management ---------------------------------------------------------------------
    def persist_now(self, database: str, table: str = "", partition_key: str = "", deadline_s: float | None = None):
        """`iox persist` (server/manual_actions.py)."""
        return self.manual.persist(database, table, partition_key, deadline_s)

    def compact_now(self, database: str, table: str, partition_key: str, persisted: bool = False,
                    deadline_s: float | None = None):
        """`iox compact` (server/manual_actions.py)."""
        return self.manual.compact(database, table, partition_key, persisted, deadline_s)

    # -- poisoned messages (server/write_buffer/poison.py) ------------------------------------------
    def retry_poisoned(self, database: str, partition: int | None = None, offset: int | None = None):
        """`iox poison retry` (server/poison_admin.py)."""
        return self.poison.retry(database, partition, offset)

    def accept_poisoned(self, database: str, partition: int | None = None, offset: int | None = None):
        """`iox poison accept` (server/poison_admin.py)."""
        return self.poison.accept(database, partition, offset)

    # -- status -----------------------------------------------------------------------
    def status(self, database: str = "", pool_members: bool = False) -> management_pb2.GetStatusResponse:
        """`iox status` (server/status_document.py)."""
        return self.status_document.build(database, pool_members)
