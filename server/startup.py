"""The server's start, in the order its parts need each other: the write buffer (the embedded
broker or a Kafka cluster), Spark, recovery of every database from the preserved catalog and the
write buffer, and the HTTP servers. Each step builds its parts from the config and the parts of
the steps before it and returns them; `IoxServer._start` (server/app.py) runs the steps and keeps
what they return.

Invariant: nothing here answers a request; a step that fails raises, and the server stops what
the steps before it started (`IoxServer.start`).

Runs on the driver, once, in the thread that starts the server.
"""
from __future__ import annotations

import logging
import os
import time

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.sharding import database_of_topic, topic_for
from iox_spark.server.config import ServerConfig
from iox_spark.server.runtime import broker as broker_mod
from iox_spark.server.runtime import spark_connect
from iox_spark.server.runtime.spark import build_spark, lower_spark_priority
from iox_spark.server.write_buffer.producer import PartitionCountMismatch, WriteBuffer

__all__ = ["open_write_buffer", "open_spark", "parquet_cache_for", "recover_databases", "process_tree_bytes",
           "memory_guard_for", "fresh_file", "ack_fanout", "resumption_committer", "watch_losses",
           "broker_truncation_for", "serve_grpc", "serve_http",
           "advertised"]

log = logging.getLogger(__name__)


def advertised(bind_host: str, port: int) -> str:
    """host:port other hosts reach a server bound to `bind_host` at (the host's name when bound to
    every interface)."""
    import socket

    host = socket.getfqdn() if bind_host in ("0.0.0.0", "::", "") else bind_host
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def open_write_buffer(cfg: ServerConfig, data_dir: str) -> tuple:
    """(the embedded broker this data directory owns or None, the bootstrap address, the
    WriteBuffer): the Kafka cluster of `--kafka-bootstrap`, else the embedded broker, started or
    reused from an earlier run."""
    broker = None
    if cfg.kafka_bootstrap:
        bootstrap = cfg.kafka_bootstrap
    else:
        broker = broker_mod.start_or_reuse(data_dir, cfg.embedded_broker_port, cfg.broker_storage)
        bootstrap = broker.bootstrap
        if broker.in_memory:
            log.warning("embedded broker on %s (pid %s) keeps the write buffer IN MEMORY: a crash of the broker "
                        "or a restart of the host loses acknowledged writes not yet persisted (at most %g s "
                        "old); production runs a Kafka cluster (--kafka-bootstrap)",
                        bootstrap, broker.pid, cfg.lifecycle_rules().persist_age_threshold_s)
        else:
            log.info("embedded broker on %s (pid %s, storage %s%s)", bootstrap, broker.pid,
                     broker.storage, f" in {broker.store_dir}" if broker.store_dir else "")
    write_buffer = WriteBuffer(bootstrap, cfg.partitions, cfg.produce_timeout_ms, cfg.txn_timeout_s,
                               cfg.replication_factor if cfg.kafka_bootstrap else 1)
    return broker, bootstrap, write_buffer


def open_spark(cfg: ServerConfig, data_dir: str, scratch: str, owns_spark: bool) -> tuple:
    """(the Spark session, the token Spark Connect requires or None when it is off): Spark
    Connect is never served without a token (server/runtime/spark_connect.py); an ingester answers
    no query and serves none. On a cluster, the executors' environment is checked first."""
    from iox_spark.chunk_store.cluster import runs_local

    sc_port = 0 if cfg.role == "ingester" else cfg.spark_connect_port
    token = spark_connect.token_for(data_dir, sc_port, cfg.auth_token) if sc_port and owns_spark else None
    spark = build_spark(cfg.spark_master, cfg.driver_memory, scratch, sc_port, cfg.extra_spark_conf,
                        cfg.bind_host, token)
    if token is not None:
        log.info("Spark Connect on port %d needs its token: `iox spark-connect-url --data-dir %s` prints "
                 "sc://localhost:%d/;token=...", sc_port, data_dir, sc_port)
    if owns_spark and cfg.spark_nice:
        n = lower_spark_priority(spark, cfg.spark_nice)
        log.info("Spark JVM: %d thread(s) at nice %d", n, cfg.spark_nice)
    if not runs_local(spark):  # executors on other hosts: they must run this code
        from iox_spark.server.runtime.executor_check import check_executor_environment

        check_executor_environment(spark, cfg.spark_master)
    return spark, token


def parquet_cache_for(cfg: ServerConfig, spark, store, catalog: Catalog, data_dir: str):
    """The ParquetCache of local mode on S3 (Parquet files copied to `<data-dir>/parquet-cache`, up
    to its byte limit, and read natively), else None: on a cluster the executors read the object
    store themselves (nothing of it on the driver's disk); a local object store is read in place."""
    from iox_spark.catalog.object_store import LocalObjectStore
    from iox_spark.chunk_store.cluster import runs_local
    from iox_spark.chunk_store.parquet_cache import ParquetCache

    if runs_local(spark) and not isinstance(store, LocalObjectStore):
        return ParquetCache(os.path.join(data_dir, "parquet-cache"), cfg.parquet_cache_max_bytes, catalog.query_pins)
    return None


def recover_databases(cfg: ServerConfig, spark, catalog: Catalog, store, write_buffer: WriteBuffer, rules,
                      parquet_cache, acked) -> tuple:
    """(the Recovery of server/consume/recovery.py, {database: losses this start found}): every
    database of the preserved catalogs and of the write buffer's topics recovered into `catalog`
    (`acked`: what earlier runs acknowledged, server/write_buffer/ack_log.py). A topic of another
    partition count stops the start (PartitionCountMismatch)."""
    from iox_spark.server.consume.recovery import list_catalog_databases, recover

    topics = write_buffer.list_database_topics()
    for topic, n in topics.items():
        if n != cfg.partitions:
            raise PartitionCountMismatch(topic, cfg.partitions, n)
    databases = sorted(set(list_catalog_databases(store)) | {database_of_topic(t) for t in topics})
    t_recover = time.time()
    # an ingester pool member's catalog (`Catalog.pool_member`) applies only the Kafka partitions
    # claimed for it (server/pool/membership.py)
    rec = recover(spark, catalog, store, cfg.partitions, t_recover, rules.catalog_transactions_until_checkpoint,
                  databases, write_buffer, cfg.skip_lost_writes, parquet_cache, pool_member=cfg.pool_member,
                  acked=acked, tail_loss_grace_s=cfg.tail_loss_grace_s)
    for name in databases:
        catalog.ensure_database(name, topic_for(name), cfg.partitions)
    # losses found by this start (the preserved catalog also lists those of earlier runs)
    lost_at_start = {db.name: n for db in catalog.databases()
                     if (n := sum(1 for r in db.lost_write_ranges() if r.detected_at_s >= t_recover))}
    return rec, lost_at_start


def process_tree_bytes(get_broker):
    """`tree_bytes(exact=True)`: the resident bytes of this process tree (server/runtime/memory_guard.py),
    with the embedded broker and its store (`get_broker()`, None without one) counted too, also when
    reused from an earlier run (no children of this process then); their pids are read at each
    sample: the supervisor may restart them."""
    from iox_spark.server.runtime.memory_guard import process_tree_rss_bytes

    def broker_pids() -> list:
        broker = get_broker()
        return [p for p in ((broker.pid, broker.store_pid) if broker is not None else ()) if p]

    def tree_bytes(exact: bool = True) -> int:
        return process_tree_rss_bytes(extra_pids=broker_pids(), exact=exact)

    return tree_bytes


def memory_guard_for(cfg: ServerConfig, scratch: str, tree_bytes):
    """The MemoryGuard (not started) of the process tree's resident bytes (`tree_bytes`) against
    --memory-limit-bytes; it throttles the consumer through `<scratch>/memory-throttle`."""
    from iox_spark.server.runtime.memory_guard import MemoryGuard

    return MemoryGuard(cfg.memory_limit_bytes, cfg.memory_soft_fraction, cfg.memory_sample_interval_ms,
                       os.path.join(scratch, "memory-throttle"), cfg.max_messages_per_partition_per_batch,
                       measure=tree_bytes, bound=lambda: tree_bytes(exact=False))


def fresh_file(path: str) -> str:
    """`path`, with what an earlier run left there removed (a control file the consumer reads:
    the poisoned messages' holds, backpressure: none at start)."""
    if os.path.exists(path):
        os.unlink(path)
    return path


def ack_fanout(acked_marks, message_sizes, tail):
    """The write buffer's `on_acked(topic, messages)` hook (in the acknowledging request's thread):
    marks the partitions written for the streaming source (server/write_buffer/end_polls.py
    AckMarks), records the messages' sizes and hands them to the tail (None: no tail)."""
    def on_acked(topic: str, messages: list) -> None:
        acked_marks.touch(topic, (m[0] for m in messages))
        message_sizes.record(topic, messages)
        if tail is not None:
            tail.feed(topic, messages)

    return on_acked


def resumption_committer(write_buffer: WriteBuffer, get_truncation):
    """The lifecycle's `on_persisted(db, db_checkpoint)`: bounded input reliance. After a persist,
    Kafka is told where a replay would start, and the durable embedded broker's store may drop
    what is below it (`get_truncation()`: server/runtime/broker_truncation.py, None without one)."""
    def on_persisted(db, db_checkpoint) -> None:
        offsets = {kp: (lo if lo is not None else hi + 1) for kp, (lo, hi) in db_checkpoint.sequencer_numbers.items()}
        truncation = get_truncation()
        if truncation is not None:
            truncation.advance(db_checkpoint.topic, offsets, time.time())
        try:
            write_buffer.commit_resumption_offsets(db.name, offsets)
        except Exception:
            log.exception("committing resumption offsets of %s", db.name)

    return on_persisted


def watch_losses(cfg: ServerConfig, catalog: Catalog, write_buffer: WriteBuffer, lifecycle, consumer, metrics,
                 stopped, replaying, refuse_when_fenced, forget_epoch, ack_log):
    """The LostWritesControl (server/lost_writes_admin.py), running: the write buffer asks it before
    each produce and tells it each acknowledged request and each topic it meets; a database whose
    broker lost its tail at start continues once its replay is persisted; the tail checks run in a
    thread until `stopped` is set."""
    import threading

    from iox_spark.server.lost_writes_admin import LostWritesControl

    losses = LostWritesControl(catalog, write_buffer, lifecycle, consumer, metrics, cfg.partitions,
                               cfg.tail_loss_grace_s, stopped, replaying=replaying,
                               refuse_when_fenced=refuse_when_fenced, forget_epoch=forget_epoch, ack_log=ack_log)
    write_buffer.guard, write_buffer.confirm, write_buffer.on_topic = losses.guard, losses.confirm, losses.on_topic
    for db in catalog.databases():
        if db.loss_state()[2] is not None:  # the tail lost, found by recovery
            losses.continue_after_tail_lost(db, lost=False)
    threading.Thread(target=losses.run_tail_checks, name="tail-check", daemon=True).start()
    return losses


def broker_truncation_for(cfg: ServerConfig, get_broker, metrics):
    """The running BrokerTruncation (server/runtime/broker_truncation.py): what is persisted leaves
    the durable embedded broker's store; None without one, in a pool, or when persisted messages
    are kept for ever."""
    import math

    from iox_spark.server.runtime.broker_truncation import BrokerTruncation

    broker = get_broker()
    if broker is None or broker.store_port is None or cfg.pool_member is not None \
            or math.isinf(cfg.broker_persisted_retention_s):
        return None

    def store_port():
        b = get_broker()  # the supervisor may have restarted it
        return b.store_port if b is not None else None

    return BrokerTruncation(store_port, cfg.broker_persisted_retention_s, metrics).start()


def serve_grpc(cfg: ServerConfig, api, authenticator) -> tuple:
    """(the gRPC server, its health servicer, the port it bound), serving the services over `api`
    (server/api/api_parts.py ApiParts); health says NOT_SERVING until the server says otherwise."""
    from iox_spark.server.api.grpc_services import build_grpc_server

    g, health, port = build_grpc_server(api, cfg.bind_host, cfg.grpc_port, authenticator=authenticator,
                                        max_workers=cfg.grpc_workers, max_request_bytes=cfg.max_request_bytes,
                                        max_concurrent_rpcs=cfg.max_concurrent_rpcs)
    g.start()
    return g, health, port


def serve_http(cfg: ServerConfig, api, authenticator, grpc_port: int) -> tuple:
    """(the HTTP server or None without --http-port, the InfluxDB 3 one-port server or None), both
    serving: the InfluxDB v1/v2/v3 HTTP APIs over `api` (server/api/api_parts.py ApiParts), and the
    one port in front of gRPC and HTTP. A port taken raises PortTaken."""
    if not cfg.http_port:
        return None, None
    from iox_spark.server.api.buckets import BucketsApi
    from iox_spark.server.api.http_api import HttpWriteServer, database_for

    http = HttpWriteServer(api.router, cfg.bind_host, cfg.http_port, authenticator=authenticator,
                           workers=cfg.http_workers)
    http.buckets = BucketsApi(api.catalog, api.set_retention, database_for, time.time())  # /api/v2/buckets
    http.queries = api.queries  # /api/v3/query_sql, InfluxQL's /query and /api/v3/query_influxql
    http.start()
    if not cfg.influxdb3_port:
        return http, None
    from iox_spark.server.api.one_port import OnePortServer
    from iox_spark.server.runtime.ports import PortTaken

    target = "127.0.0.1" if cfg.bind_host in ("0.0.0.0", "::", "", "localhost") else cfg.bind_host
    try:  # last: both servers behind it are serving
        return http, OnePortServer(cfg.bind_host, cfg.influxdb3_port, grpc_port, http.port, target).start()
    except OSError as e:
        http.stop()
        raise PortTaken(cfg.bind_host, cfg.influxdb3_port, "--influxdb3-port", str(e)) from None
