"""The server: wires broker, write buffer, Spark, consumer, catalog, query and gRPC.

When it runs: `iox serve` builds one `IoxServer`, calls `start()` and blocks in
`wait()` until SIGTERM/SIGINT, then `stop()` shuts down in reverse order
(gRPC stops taking requests, the stream stops, producers close, the embedded
broker this data directory owns is stopped).

No feature lives here; each has its room and states its own contract: a fenced database
(server/fence_admin.py), poisoned messages (server/poison_admin.py), lost writes
(server/lost_writes_admin.py), freeze, retention, the ingester pool (server/pool/), queries
(server/query_service.py), the status document; the longer start steps are server/startup.py.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from grpc_health.v1 import health_pb2

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.config import ServerConfig, is_loopback
from iox_spark.server.api.auth import Authenticator
from iox_spark.server.consume.consumer import WriteBufferConsumer
from iox_spark.server.write_buffer.end_polls import AckMarks
from iox_spark.server.api.api_parts import ApiParts
from iox_spark.server.api.grpc_services import SERVICE_NAMES
from iox_spark.server.write_buffer.ack_log import AckLog
from iox_spark.server.consume.ingest import Ingestor
from iox_spark.server.consume.txn_repair import TransactionRepair
from iox_spark.server.query.engine import QueryEngine
from iox_spark.server.query.read_barrier import ReadBarrier
from iox_spark.server.consume.watermarks import MessageSizes
from iox_spark.server.write.backpressure import WriteBackpressure
from iox_spark.server.write.router import Router
from iox_spark.server.runtime.broker_supervisor import BrokerSupervisor
from iox_spark.server.write_buffer.kafka_ends import KafkaEnds
from iox_spark.server.query.tail import WriteBufferTail
from iox_spark.server.runtime.write_path_priority import raise_server_and_broker
from iox_spark.server.runtime.ports import check_ports_free
from iox_spark.server.runtime.stop_signals import StopSignals
from iox_spark.server.retention_admin import RetentionControl, operation_gauges
from iox_spark.server.epoch_reset import EpochReset
from iox_spark.server.fence_admin import FenceControl
from iox_spark.server.freeze_admin import FreezeControl
from iox_spark.server.poison_admin import PoisonControl
from iox_spark.server.pool.membership import PoolControl, claims_of, column_agreement
from iox_spark.server.replay_watch import ReplayWatch
from iox_spark.server.status_document import StatusDocument
from iox_spark.server.query_service import QueryService
from iox_spark.server.query.visibility import Visibility
from iox_spark.server.clean_stop import drain_and_persist
from iox_spark.server.manual_actions import ManualActions
from iox_spark.lifecycle.iceberg_publication import publication_for
from iox_spark.server.verify_admin import VerifyControl
from iox_spark.server.downsampling import Downsamplers
from iox_spark.server.write_buffer.freeze import cap_replay_until
from iox_spark.server.startup import (ack_fanout, advertised, fresh_file, memory_guard_for, open_spark, open_write_buffer,
                                      parquet_cache_for, process_tree_bytes, recover_databases, resumption_committer,
                                      serve_grpc, serve_http, watch_losses,
                                      broker_truncation_for)

__all__ = ["IoxServer"]

log = logging.getLogger(__name__)


class IoxServer:
    """The composition root: `start` builds every part from `config` and the parts built before it
    (server/startup.py holds the longer steps), hands the APIs their parts (`ApiParts`) and
    serves; `stop` stops them in reverse order. No feature lives here: each has its module
    (docs/ARCHITECTURE.md, the server's rooms)."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.catalog = Catalog(config.lifecycle_rules().late_arrive_window_s,
                               pool_member=config.pool_member is not None)
        #: the parts `start` builds, None until built (`stop` skips a part not built): the embedded
        #: broker and the truncation of its durable store, the ingester pool membership
        #: (server/pool/), each database's replay (server/replay_watch.py), Kafka's ends
        #: (server/write_buffer/kafka_ends.py), lost writes and poisoned messages' controls
        self.broker = self.broker_truncation = self.spark = self.write_buffer = self.consumer = None
        self.grpc = self.grpc_port = self._health = self.authenticator = self.started_at = None
        self.lifecycle = self.tail = self.pool = self.replay = self.kafka_ends = self.losses = self.poison = None
        self.iceberg = self.downsamplers = None
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._signals = StopSignals(self.reload_tokens)

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
        self.broker, bootstrap, self.write_buffer = open_write_buffer(cfg, data_dir)
        self.bootstrap = bootstrap
        self.kafka_ends = KafkaEnds(self.write_buffer, self.catalog)
        from iox_spark.catalog.object_store import object_store_from_url

        self.store = object_store_from_url(cfg.object_store_url, cfg.s3_endpoint)
        if cfg.pool_member is not None:  # the pool's Kafka cluster and object store, or no start (before Spark)
            from iox_spark.server.pool.identity import establish_pool_identity

            establish_pool_identity(self.store, bootstrap, cfg.pool_member, cfg.object_store_url,
                                    cfg.replication_factor if cfg.kafka_bootstrap else 1, time.time())
        # what earlier runs acknowledged, and where this one records what it acknowledges
        self.ack_log = AckLog(data_dir)
        scratch = os.path.join(data_dir, "spark")
        #: the token Spark Connect requires (never none: server/runtime/spark_connect.py); None when it is off
        self.spark, self.spark_connect_token = open_spark(cfg, data_dir, scratch, self._owns_spark)
        self.rules = cfg.lifecycle_rules()
        self.parquet_cache = parquet_cache_for(cfg, self.spark, self.store, self.catalog, data_dir)
        rec, self._lost_at_start = recover_databases(cfg, self.spark, self.catalog, self.store, self.write_buffer,
                                                     self.rules, self.parquet_cache, self.ack_log.at_start)
        # frozen mode (server/write_buffer/freeze.py): a record a previous run left stays in force, and
        # the replay reads only up to what was applied when the server froze
        tree_bytes = process_tree_bytes(lambda: self.broker)
        self.freeze = FreezeControl(self.catalog, data_dir, cfg.freeze_at_percent, cfg.memory_limit_bytes, rss=tree_bytes)
        self.freeze.hold_recorded()
        from iox_spark.server.consume.replay_schemas import load_replay_schemas
        from iox_spark.catalog.sharding import database_of_topic
        from iox_spark.lifecycle.hooks import LifecycleHooks
        from iox_spark.lifecycle.worker import LifecycleWorker

        replay_until = {t: p for t, p in cap_replay_until(rec.replay_until, self.freeze.record).items() if p}
        # once the replay caught up, no replayed row can be in a persisted file: the row filters go
        self.replay = ReplayWatch(self.catalog, replay_until, rec.replay_from,
                                  on_caught_up=lambda: self.ingestor.drop_row_filters())
        for topic, until in replay_until.items():  # types of Kafka-only tables, before any write
            load_replay_schemas(bootstrap, self.catalog.database(database_of_topic(topic)),
                                rec.start_offsets.get(topic, {}), until)
        # which Kafka partitions are held at a poisoned message (server/write_buffer/poison.py): none at start
        holds_file = fresh_file(os.path.join(scratch, "poison-holds.json"))
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
        self.query_engine = QueryEngine(self.spark, self.catalog, self.tail, self.ingestor.table_view_sql_of,
                                        cfg.max_query_rows, cfg.max_query_bytes, cfg.query_timeout_s)
        self.router = Router(  # in a pool, column types are the pool's (catalog/pool_schema.py)
            self.catalog, self.write_buffer, cfg.partitions, cfg.max_request_bytes,
            max_columns_per_table=cfg.max_columns_per_table,
            agree_columns=None if cfg.pool_member is None else column_agreement(self.store, cfg.pool_member))
        for name, n in self._lost_at_start.items():
            self.router.metrics.lost_writes(name, n)
        self.ingestor.metrics = self.router.metrics
        self.message_sizes = MessageSizes()
        self.write_buffer.on_acked = ack_fanout(self.acked_marks, self.message_sizes, self.tail)
        self.visibility = Visibility(self.catalog, self.tail, self.kafka_ends, self.message_sizes,
                                     lambda name: None if self.lifecycle is None else self.lifecycle.database_checkpoint(name))
        self.read_barrier = ReadBarrier(self.catalog, self.ingestor.wait_applied, self.visibility.for_barrier,
                                        self.replay.state)
        self.router.metrics.watch_watermarks(self.visibility.all_watermarks)
        self.pause_file = fresh_file(os.path.join(data_dir, "backpressure"))
        self.memory_guard = memory_guard_for(cfg, scratch, tree_bytes)
        self.router.metrics.operation.watch(lambda: operation_gauges(self.catalog, self.memory_guard, self.replay))
        self.consumer = WriteBufferConsumer(
            self.spark, self.catalog, self.ingestor, bootstrap, os.path.join(scratch, "streams"),
            cfg.trigger_interval_ms, cfg.max_messages_per_partition_per_batch, self.pause_file,
            self.acked_marks.directory, holds_file, throttle_file=self.memory_guard.throttle_file,
            freeze_file=self.freeze.path)
        self.memory_guard.start()
        # the replay's ends were confirmed exactly: its first micro-batch reads up to them at once
        self.consumer.start(rec.start_offsets, {t: {kp: until + 1 for kp, until in parts.items()}
                                                for t, parts in rec.replay_until.items()})
        if self.replay.planned:
            threading.Thread(target=self.replay.log_progress, args=(self._stopped,), name="replay-progress",
                             daemon=True).start()
        if self.tail is not None:
            self.tail.start()
        self.broker_truncation = broker_truncation_for(cfg, lambda: self.broker, self.router.metrics)
        pooled = cfg.pool_member is not None
        # the fence control and the pool are built on the lifecycle: its hooks reach them once they exist
        hooks = LifecycleHooks(
            refresh_view=self.ingestor.refresh_table_view,
            is_replaying=self.replay.replaying,
            on_fenced=lambda conflict: self.fence.on_fenced(conflict),
            on_persisted=resumption_committer(self.write_buffer, lambda: self.broker_truncation),
            memory_pressure=self.memory_guard.pressure,
            frozen=lambda: self.freeze.frozen,
            on_partitions_lost=(lambda name, partitions: self.pool.lose(name, partitions)) if pooled else None,
            on_catalog_refreshed=(lambda name, state: self.pool.take_state(name, state)) if pooled else None,
            published_keys=lambda name: frozenset() if self.iceberg is None else self.iceberg.published_keys(name))
        self.lifecycle = LifecycleWorker(self.spark, self.catalog, self.rules, self.store, rec.preserved,
                                         self.pause_file, hooks, cache=self.parquet_cache,
                                         prune_delay_s=cfg.prune_delay_s, metrics=self.router.metrics.operation)
        self.iceberg = publication_for(cfg.iceberg_catalog, data_dir, self.store, lambda: dict(self.lifecycle.preserved),
                                       pool=pooled)
        self.fence = FenceControl(self.catalog, self.lifecycle, self.ingestor)
        self.pool = None if cfg.pool_member is None else PoolControl(
            cfg.pool_member, catalog=self.catalog, write_buffer=self.write_buffer, lifecycle=self.lifecycle,
            consumer=self.consumer, ingestor=self.ingestor, replay=self.replay, spark=self.spark, store=self.store,
            parquet_cache=self.parquet_cache, query_engine=self.query_engine, visibility=self.visibility,
            partitions=cfg.partitions, auth_token=cfg.auth_token)
        self.verifier = VerifyControl(self.spark, self.catalog, self.tail, self.ingestor.table_view_sql_of,
                                      self.read_barrier, self.write_buffer, self.pool)
        self.lifecycle.start()
        if self.iceberg is not None:
            self.iceberg.start()
        self.freeze.start(self.consumer)
        if self.freeze.frozen:
            log.warning("frozen since %.0f (%s): no new write-buffer offsets are consumed until `iox unfreeze`",
                        self.freeze.record.since_s, self.freeze.record.reason)
        forget_epoch = EpochReset(self.ingestor, self.replay, self.kafka_ends, self.message_sizes, self.write_buffer,
                                  self.tail).forget
        self.losses = watch_losses(cfg, self.catalog, self.write_buffer, self.lifecycle, self.consumer,
                                   self.router.metrics, self._stopped, self.replay.replaying,
                                   self.fence.refuse_when_fenced, forget_epoch, self.ack_log)
        self.poison = PoisonControl(self.catalog, self.consumer, self.lifecycle, self.ingestor,
                                    refuse_when_fenced=self.fence.refuse_when_fenced)
        self.queries = QueryService(cfg.role, self.catalog, self.read_barrier, self.query_engine, self.pool)
        self.retention = RetentionControl(self.catalog, self.lifecycle, self.ingestor, cfg.partitions,
                                          self.fence.refuse_when_fenced)
        self.manual = ManualActions(self.catalog, self.write_buffer, self.ingestor.wait_applied, self.lifecycle,
                                    cfg.partitions)
        self.downsamplers = Downsamplers(self.catalog, self.store, self.queries, self.read_barrier, self.router,
                                         self.write_buffer, self.rules.late_arrive_window_s,
                                         pool_member=cfg.pool_member is not None)
        self.status_document = StatusDocument(self.catalog, self.lifecycle, self.freeze, self.replay,
                                              self.visibility.watermarks, self.store, cfg.pool_member, self.iceberg,
                                              self.downsamplers.list)
        TransactionRepair(self.ingestor, self.write_buffer, self._stopped).start()
        self.router.overload_check = WriteBackpressure(self.memory_guard, self.lifecycle, self.catalog,
                                                       self.rules).refusal
        self.router.database_check = self.fence.refuse_when_fenced
        self.api = ApiParts(
            catalog=self.catalog, router=self.router, write_buffer=self.write_buffer, queries=self.queries,
            status=self.status_document.build, persist=self.manual.persist, compact=self.manual.compact,
            retry_poisoned=self.poison.retry, accept_poisoned=self.poison.accept, accept_lost_writes=self.losses.accept,
            set_retention=self.retention.set, freeze=self.freeze.freeze, unfreeze=self.freeze.unfreeze,
            claim_partitions=claims_of(self.pool, cfg.role), verify=self.verifier.verify,
            downsamplers=self.downsamplers)
        self.grpc, self._health, self.grpc_port = serve_grpc(cfg, self.api, self.authenticator)
        if self.pool is not None:  # where the other members ask this one for its unpersisted rows
            self.pool.publish_address(cfg.pool_address or advertised(cfg.bind_host, self.grpc_port))
        self.http, self.one_port = serve_http(cfg, self.api, self.authenticator, self.grpc_port)
        if cfg.write_path_rt_priority:  # last: every process the server starts is running by now
            raise_server_and_broker(self.broker, cfg.write_path_rt_priority)
        if self.broker is not None:
            BrokerSupervisor(lambda: self.broker, data_dir, cfg.broker_storage, self._stopped, self._stop_lock,
                             on_restarted=lambda nb: setattr(self, "broker", nb)).start()
        for name in ("",) + SERVICE_NAMES:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if cfg.role != "ingester":  # an ingester answers no query: a downsampler's rounds need them
            self.downsamplers.start()
        self.started_at = time.time()
        log.info("iox serving gRPC on port %s (started in %.1fs)", self.grpc_port, time.monotonic() - t0)

    def reload_tokens(self) -> bool:
        """Re-reads `--auth-tokens-file` (SIGHUP); an invalid file is logged and the tokens in use stay."""
        return self.authenticator.reload() if self.authenticator is not None else False

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT ask `wait` to stop the server, SIGHUP re-reads the tokens file
        (server/runtime/stop_signals.py). Main thread only, before `start`: a signal that comes
        while the server starts is a clean stop once it started."""
        self._signals.install()

    def wait(self) -> None:
        """Blocks until SIGTERM/SIGINT (main thread only), then stops."""
        self._signals.install()
        self._signals.wait_for_stop(self._stopped, self.stop)

    def stop(self) -> None:
        """Stops every part in the reverse order of `start` (a part not started yet is skipped):
        requests first, then the stream, the producers and Spark, the embedded broker last.
        Idempotent; `wait` calls it, also a start that failed."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            if self._health is not None:
                self._health.enter_graceful_shutdown()
            if self.grpc is not None:
                self.grpc.stop(grace=5).wait(10)
            # the router last of the APIs: no_sync writes handed to the producer, Kafka acknowledges them first
            # downsamplers before the router: a round's writes need it
            self._stop_parts(("downsamplers", "stop"), ("one_port", "stop"), ("http", "stop"), ("router", "close"))
            if self.broker is not None and self.broker.in_memory and \
                    self.lifecycle is not None and self.consumer is not None:
                drain_and_persist(self.catalog, self.write_buffer, self.lifecycle, self.replay)
            self._stop_parts(("iceberg", "stop"), ("lifecycle", "stop"), ("broker_truncation", "close"), ("memory_guard", "stop"),
                             ("freeze", "stop"), ("pool", "close"), ("tail", "stop"), ("consumer", "stop"),
                             ("write_buffer", "close"), ("ack_log", "close"))
            if self.spark is not None and getattr(self, "_owns_spark", False):
                try:
                    self.spark.stop()
                except Exception:
                    log.exception("stopping Spark")
            if self.broker is not None:
                self.broker.stop()
            self._stopped.set()
            log.info("iox stopped")

    def _stop_parts(self, *parts: tuple[str, str]) -> None:
        """Calls, in order, the method named of each part (attribute name, method name) that was built."""
        for attr, method in parts:
            part = getattr(self, attr, None)
            if part is not None:
                getattr(part, method)()
