"""The `iox` command line: serve, broker, write, sql, status, persist, compact, delete, poison,
accept-lost-writes, retention, downsample, verify, spark-connect-url, demo.

Every `serve` option can also be set by an `IOX_<OPTION>` environment variable
(e.g. `--grpc-port` <- IOX_GRPC_PORT); the command line wins.
Client commands take `--addr host:port` (IOX_ADDR, default localhost:8082) and
exit non-zero with the server's message on any error.

`iox write` sends an input larger than `--batch-bytes` in several requests, each cut at the end of
a line; on a terminal it draws a progress bar (bytes acknowledged) on stderr.
`iox sql --format json` writes one JSON object per row, every number a JSON number (see `json_value`).
`iox write` prints the write token twice: per Kafka partition (`token`) and printable (`write_token`, see
server/write_buffer/write_token.py), which `iox sql --after` takes; `--show-watermark` prints what the answer
reflects on stderr.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from iox_spark.server.cli.output import format_verify_report, print_table
from iox_spark.server.errors import ServerError
from iox_spark.server.write_buffer.producer import DEFAULT_REPLICATION_FACTOR
from iox_spark.server.runtime.broker import DEFAULT_BROKER_STORAGE, MEMORY_BROKER_MAX_PERSIST_AGE_S, STORAGE_DURABLE, STORAGE_MEMORY
from iox_spark.server.runtime.broker_truncation import DEFAULT_RETENTION_S as DEFAULT_BROKER_PERSISTED_RETENTION_S
from iox_spark.server.config import (DEFAULT_GRPC_WORKERS, DEFAULT_HTTP_WORKERS, DEFAULT_MAX_CONCURRENT_RPCS,
                           DEFAULT_MAX_QUERY_BYTES, DEFAULT_MAX_QUERY_ROWS, DEFAULT_PARQUET_CACHE_MAX_BYTES, DEFAULT_QUERY_TIMEOUT_S, DEFAULT_MAX_COLUMNS_PER_TABLE, DEFAULT_DATA_DIR, DEFAULT_DRIVER_MEMORY, DEFAULT_GRPC_PORT, DEFAULT_MAX_REQUEST_BYTES,
                     DEFAULT_PARTITIONS, DEFAULT_PRODUCE_TIMEOUT_MS, DEFAULT_ICEBERG_CATALOG, DEFAULT_TXN_TIMEOUT_S, DEFAULT_SPARK_CONNECT_PORT,
                     DEFAULT_SPARK_MASTER, DEFAULT_SPARK_NICE, DEFAULT_TAIL_MAX_BYTES, DEFAULT_TRIGGER_INTERVAL_MS,
                     DEFAULT_HTTP_PORT, DEFAULT_WRITE_PATH_RT_PRIORITY, DEFAULT_BIND_HOST, DEFAULT_PRUNE_DELAY_S,
                     DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_MEMORY_SOFT_FRACTION, DEFAULT_FREEZE_AT_PERCENT, DEFAULT_ROLE, TAIL_LOSS_GRACE_S, InvalidConfig, ServerConfig,
                     parse_memory_bytes)

__all__ = ["main", "build_parser", "parse_log_levels", "write_input", "SERVE_OPTIONS",
           "DEFAULT_WRITE_BATCH_BYTES", "config_from_args"]

#: `iox write`: the largest request it sends (below the server's default --max-request-bytes, 10 MiB)
DEFAULT_WRITE_BATCH_BYTES = 8 << 20


def _broker_storage(text: str) -> str:
    if text not in (STORAGE_DURABLE, STORAGE_MEMORY):
        raise argparse.ArgumentTypeError(f"{text!r}: durable or memory")
    return text


#: (flag, type, default, help) of `iox serve`; each also read from IOX_<FLAG>.
SERVE_OPTIONS = [
    ("--grpc-port", int, DEFAULT_GRPC_PORT, "gRPC port"),
    ("--http-port", int, DEFAULT_HTTP_PORT, "InfluxDB v2 and 1.x compatible HTTP write API port (0 disables)"),
    ("--influxdb3-port", int, 0, "InfluxDB 3's one port (8181 in InfluxDB 3): HTTP and gRPC (Arrow Flight) on one "
                                 "port, for clients given one address; needs --http-port (0 disables: the default)"),
    ("--data-dir", str, DEFAULT_DATA_DIR, "data directory (embedded broker record, scratch, objects)"),
    ("--kafka-bootstrap", str, None, "Kafka bootstrap servers; absent = embedded Tansu broker"),
    ("--partitions", int, DEFAULT_PARTITIONS, "Kafka partitions per database topic"),
    ("--replication-factor", int, DEFAULT_REPLICATION_FACTOR,
     "replicas of each Kafka partition of the topics the server creates (fewer when the cluster has fewer "
     "brokers, with a warning)"),
    ("--spark-master", str, DEFAULT_SPARK_MASTER, "Spark master URL"),
    ("--driver-memory", str, DEFAULT_DRIVER_MEMORY, "Spark driver memory (e.g. 4g)"),
    ("--produce-timeout-ms", int, DEFAULT_PRODUCE_TIMEOUT_MS, "max wait for Kafka's ack before UNAVAILABLE"),
    ("--txn-timeout-s", float, DEFAULT_TXN_TIMEOUT_S,
     "abort a multi-message request whose commit has not appeared this long after its parts"),
    ("--tail-loss-grace-s", float, TAIL_LOSS_GRACE_S,
     "how long the broker's end may stay below offsets known written before they count as lost (a "
     "loaded broker shows acknowledged writes late; an offset given out again counts at once)"),
    ("--trigger-interval-ms", int, DEFAULT_TRIGGER_INTERVAL_MS, "micro-batch trigger interval"),
    ("--spark-nice", int, DEFAULT_SPARK_NICE,
     "nice value (0-19) of the Spark JVM and its Python workers, so the write path keeps its CPU (0 = off)"),
    ("--write-path-rt-priority", int, DEFAULT_WRITE_PATH_RT_PRIORITY,
     "opt-in SCHED_RR priority (1-99) of the server's threads and its embedded broker, so a write never "
     "waits for a core behind Spark. RISK: real-time threads escape container CPU quotas and can starve "
     "the host; use only on a host the server owns (0 = off; where the kernel refuses, logged and ignored)"),
    ("--max-request-bytes", int, DEFAULT_MAX_REQUEST_BYTES,
     "largest write request accepted (after decompression and Arrow dictionary expansion; also the "
     "gRPC message size limit, plus framing)"),
    ("--grpc-workers", int, DEFAULT_GRPC_WORKERS, "threads serving gRPC requests"),
    ("--max-concurrent-rpcs", int, DEFAULT_MAX_CONCURRENT_RPCS,
     "gRPC requests in progress at once; more are answered RESOURCE_EXHAUSTED"),
    ("--http-workers", int, DEFAULT_HTTP_WORKERS,
     "threads serving HTTP connections; as many more wait, any further one is answered 503 with Retry-After"),
    ("--max-columns-per-table", int, DEFAULT_MAX_COLUMNS_PER_TABLE,
     "columns (tags, fields and time) one table may have; a write adding more is rejected (0 = no limit)"),
    ("--max-query-rows", int, DEFAULT_MAX_QUERY_ROWS,
     "rows of one query result; more is answered RESOURCE_EXHAUSTED (0 = no limit)"),
    ("--max-query-bytes", parse_memory_bytes, DEFAULT_MAX_QUERY_BYTES,
     "Arrow bytes of one query result (e.g. 1g); more is answered RESOURCE_EXHAUSTED (0 = no limit)"),
    ("--parquet-cache-max-bytes", parse_memory_bytes, DEFAULT_PARQUET_CACHE_MAX_BYTES,
     "local disk (e.g. 8g) the copies of persisted Parquet files may take when local Spark reads an S3 object "
     "store; a chunk whose files do not fit reads S3 directly (0 = no copies)"),
    ("--query-timeout-s", float, DEFAULT_QUERY_TIMEOUT_S,
     "seconds one query's Spark job may run; then it is cancelled and answered DEADLINE_EXCEEDED (HTTP 504) "
     "(0 = none)"),
    ("--tail-max-bytes", parse_memory_bytes, DEFAULT_TAIL_MAX_BYTES,
     "payload bytes of acknowledged writes not yet applied by Spark that queries read from the write "
     "buffer's tail (e.g. 256m; 0 = queries see applied writes only)"),
    ("--spark-connect-port", int, DEFAULT_SPARK_CONNECT_PORT, "Spark Connect port (0 disables)"),
    ("--prune-delay-s", float, DEFAULT_PRUNE_DELAY_S,
     "retention: how long after rows fell below a database's retention their day partitions and Parquet "
     "files are dropped (they are hidden from queries at once)"),
    ("--memory-limit-bytes", parse_memory_bytes, DEFAULT_MEMORY_LIMIT_BYTES,
     "RSS bound of the server's process tree (driver, Spark JVM, Python workers; e.g. 8g): past "
     "--memory-soft-fraction of it micro-batches read less and the lifecycle persists and unloads first, at "
     "it writes are refused (RESOURCE_EXHAUSTED / HTTP 503 + Retry-After) until back under (0 = off)"),
    ("--memory-soft-fraction", float, DEFAULT_MEMORY_SOFT_FRACTION,
     "fraction of --memory-limit-bytes where throttling starts"),
    ("--freeze-at-percent", float, DEFAULT_FREEZE_AT_PERCENT,
     "freeze (consume no new write-buffer offsets, persist everything held, keep answering queries; "
     "`iox unfreeze` ends it) once memory (of --memory-limit-bytes, else of the host) or the data "
     "directory's disk is this full, in percent (0 = never)"),
    ("--pool-member", str, None,
     "this server's name in an ingester pool (e.g. its address host:port): it applies and persists only "
     "the Kafka partitions claimed for it (`iox claim`, or the assigner); members share one Kafka cluster "
     "and one object store (see docs/OPERATIONS.md, Ingester pool)"),
    ("--pool-address", str, None,
     "ingester pool: the host:port other members reach this server's gRPC at (default --bind-host and the "
     "gRPC port; the host's name when bound to every interface)"),
    ("--role", str, DEFAULT_ROLE,
     "ingester pool: all (takes writes, owns what it claims, answers queries), ingester (answers no user "
     "query) or querier (claims nothing; answers queries with the owners' rows); ingester and querier need "
     "--pool-member"),
    ("--iceberg-catalog", str, DEFAULT_ICEBERG_CATALOG,
     "where every persist is published as Apache Iceberg tables (one namespace per database): sqlite (a SQL "
     "catalog in <data-dir>/iceberg-catalog.db; in a pool, one file in the shared object-store directory), an "
     "http(s):// REST catalog URI, a SQLAlchemy URI (postgresql://...), or off"),
    ("--broker-port", int, 0, "port of the embedded broker when it is started (0 = any free port)"),
    ("--broker-storage", _broker_storage, DEFAULT_BROKER_STORAGE,
     "storage of the embedded broker: durable (the default: acknowledged writes on disk under "
     "<data-dir>/broker-store, through its local S3 server; a few ms per produce) or memory (for development: "
     "a broker crash or host restart loses unpersisted writes, so --persist-age-threshold-s is then at most "
     f"{MEMORY_BROKER_MAX_PERSIST_AGE_S:g} s)"),
    ("--broker-persisted-retention-s", float, DEFAULT_BROKER_PERSISTED_RETENTION_S,
     "how long the durable embedded broker keeps a message once it is persisted, counted from when it was "
     "written (0: until persisted, as a write-ahead log is truncated after a snapshot; inf: every message, "
     "its store then grows without bound and each read of the broker slows with it)"),
    ("--bind-host", str, DEFAULT_BIND_HOST,
     "address gRPC, HTTP and Spark Connect bind to; beyond loopback only with --auth-token, --auth-tokens-file "
     "or --insecure"),
    ("--auth-token", str, None,
     "token every API requires (gRPC metadata and HTTP `authorization: Token <token>`; Spark Connect's "
     "`sc://host:port/;token=<token>`); every database, every permission"),
    ("--auth-tokens-file", str, None,
     "JSON or TOML file of scoped tokens (databases, permissions write/query/delete/admin), re-read on "
     "SIGHUP; see docs/OPERATIONS.md"),
    ("--object-store", str, None, "directory or s3://bucket/prefix for Parquet + catalog (default <data-dir>/objects)"),
    ("--s3-endpoint", str, None, "S3 endpoint URL (MinIO, moto); credentials from the usual AWS variables"),
]
#: lifecycle rule options of `iox serve` -> LifecycleRules field (default: IOx's, see lifecycle/rules.py)
LIFECYCLE_OPTIONS = [
    ("--persist-row-threshold", int, "persist_row_threshold"),
    ("--persist-age-threshold-s", float, "persist_age_threshold_s"),
    ("--late-arrive-window-s", float, "late_arrive_window_s"),
    ("--mub-row-threshold", int, "mub_row_threshold"),
    ("--read-buffer-delay-s", float, "read_buffer_delay_s"),
    ("--queried-read-buffer-delay-s", float, "queried_read_buffer_delay_s"),
    ("--buffer-size-soft-bytes", int, "buffer_size_soft_bytes"),
    ("--buffer-size-hard-bytes", int, "buffer_size_hard_bytes"),
    ("--worker-backoff-ms", int, "worker_backoff_ms"),
    ("--catalog-transactions-until-checkpoint", int, "catalog_transactions_until_checkpoint"),
    ("--max-active-compactions", int, "max_active_compactions"),
    ("--persisted-compaction-file-threshold", int, "persisted_compaction_file_threshold"),
    ("--persisted-compaction-cold-s", float, "persisted_compaction_cold_s"),
]


def _env_name(flag: str) -> str:
    return "IOX_" + flag.lstrip("-").replace("-", "_").upper()


def _add_addr(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", default=os.environ.get("IOX_ADDR", "localhost:8082"), help="server host:port")
    p.add_argument("--token", default=os.environ.get("IOX_TOKEN") or None,
                   help="token of a server started with --auth-token or --auth-tokens-file (env IOX_TOKEN)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="iox", description="write-buffered time-series ingest server on Kafka and Spark")
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run the server")
    for flag, typ, default, help_ in SERVE_OPTIONS:
        env = os.environ.get(_env_name(flag))
        s.add_argument(flag, type=typ, default=typ(env) if env is not None else default,
                       help=f"{help_} (env {_env_name(flag)}; default {default})")
    for flag, typ, fld in LIFECYCLE_OPTIONS:
        env = os.environ.get(_env_name(flag))
        s.add_argument(flag, type=typ, default=typ(env) if env is not None else None, dest=fld,
                       help=f"lifecycle rule {fld} (env {_env_name(flag)}; default: IOx's)")
    s.add_argument("--insecure", action="store_true",
                   default=os.environ.get("IOX_INSECURE", "") not in ("", "0", "false"),
                   help="allow a --bind-host beyond loopback without any token: every API open to the network "
                        "(env IOX_INSECURE)")
    s.add_argument("--object-store-shared", action="store_true",
                   default=os.environ.get("IOX_OBJECT_STORE_SHARED", "") not in ("", "0", "false"),
                   help="the --object-store directory is a shared file system mounted at the same path on every "
                        "Spark worker (needed for a directory with a non-local --spark-master) "
                        "(env IOX_OBJECT_STORE_SHARED)")
    s.add_argument("--skip-lost-writes", action="store_true",
                   default=os.environ.get("IOX_SKIP_LOST_WRITES", "") not in ("", "0", "false"),
                   help="start even when Kafka no longer holds offsets that are not persisted (they are lost; "
                        "logged and counted in status) (env IOX_SKIP_LOST_WRITES)")
    s.add_argument("--spark-conf", action="append", metavar="KEY=VALUE",
                   default=[kv for kv in os.environ.get("IOX_SPARK_CONF", "").split(";") if kv],
                   help="a Spark configuration property of the server's Spark application, repeatable "
                        "(env IOX_SPARK_CONF: KEY=VALUE;KEY=VALUE); spark.driver.extraJavaOptions is added to "
                        "the server's own JVM options")
    s.add_argument("--log-level", default=os.environ.get("IOX_LOG_LEVEL", "INFO"),
                   help="LEVEL[,LOGGER=LEVEL...]: the root level, then levels of single loggers, e.g. "
                        "WARNING,iox_spark.server.consume.ingest=DEBUG (each micro-batch's timings) (env IOX_LOG_LEVEL)")

    pe = sub.add_parser("persist", help="persist now (all partitions of the scope) and wait for the commit")
    _add_addr(pe)
    pe.add_argument("--db", required=True)
    pe.add_argument("--table", default="")
    pe.add_argument("--partition", default="")

    fr = sub.add_parser("freeze", help="freeze the server: consume no new write-buffer offsets, persist "
                                       "everything held, keep answering queries (until `iox unfreeze`)")
    _add_addr(fr)
    fr.add_argument("--reason", default="", help="shown in status (default: admin)")
    uf = sub.add_parser("unfreeze", help="end frozen mode: consuming resumes where it stopped")
    _add_addr(uf)
    cl = sub.add_parser("claim", help="ingester pool: claim Kafka partitions of a database for the server at "
                                      "--addr (fences their previous owner)")
    _add_addr(cl)
    cl.add_argument("--db", required=True)
    cl.add_argument("--partitions", required=True, help="comma-separated Kafka partitions, e.g. 0,2")

    de = sub.add_parser("delete", help="delete rows (sequenced with the writes)")
    _add_addr(de)
    de.add_argument("--db", required=True)
    de.add_argument("--table", default="", help="empty: every table")
    de.add_argument("--start", required=True, help="RFC3339 or integer nanoseconds (inclusive)")
    de.add_argument("--stop", required=True, help="RFC3339 or integer nanoseconds (exclusive)")
    de.add_argument("--predicate", default="", help="e.g. host = 'a' AND region != 'eu'")

    co = sub.add_parser("compact", help="compact the in-memory chunks of one partition (or its Parquet files)")
    _add_addr(co)
    co.add_argument("--db", required=True)
    co.add_argument("--table", required=True)
    co.add_argument("--partition", required=True)
    co.add_argument("--persisted", action="store_true",
                    help="merge the partition's Parquet files into one file (one catalog transaction)")

    po = sub.add_parser("poison", help="retry or accept (skip) write-buffer messages set aside because applying "
                                       "them failed (listed as `poisoned` in `iox status`)")
    po_sub = po.add_subparsers(dest="poison_cmd", required=True)
    for name, help_ in (("retry", "apply held messages again (after the cause of the failure was removed); one "
                                  "that fails again is held again"),
                        ("accept", "skip held messages for good (recorded, kept in status marked accepted); their "
                                   "Kafka partitions continue after them")):
        pp = po_sub.add_parser(name, help=help_)
        _add_addr(pp)
        pp.add_argument("--db", required=True)
        pp.add_argument("--partition", type=int, default=None, help="only the message held on this Kafka partition")
        pp.add_argument("--offset", type=int, default=None,
                        help="only if the held message is at this offset (with --partition)")

    al = sub.add_parser("accept-lost-writes", help="accept the database's lost writes while the server runs (as "
                                                   "a restart with --skip-lost-writes does); writes are taken again")
    _add_addr(al)
    al.add_argument("--db", required=True)

    rt = sub.add_parser("retention", help="set or remove a database's retention period (older rows are hidden at "
                                          "once, older writes refused, their partitions pruned after --prune-delay-s)")
    _add_addr(rt)
    rt.add_argument("--db", required=True)
    rt.add_argument("--period", required=True, type=_duration_s,
                    help="e.g. 30d, 12h, 90m, 3600s (or a number of seconds); 0 removes the retention")

    ds = sub.add_parser("downsample", help="continuous downsampling: aggregates of a table over event-time windows, "
                                           "kept up to date in another table (late points and deletes included)")
    ds_sub = ds.add_subparsers(dest="ds_cmd", required=True)
    dc = ds_sub.add_parser("create", help="create a downsampler: it emits every window of the source's history "
                                          "(from --start), then each window a write or a delete changes")
    _add_addr(dc)
    dc.add_argument("--db", required=True, help="the source database")
    dc.add_argument("--table", required=True, help="the source table")
    dc.add_argument("--every", required=True, help="the window: whole seconds (10s, 1m, 1h, 1d)")
    dc.add_argument("--agg", required=True, help='"mean(usage),max(usage),count(usage)": mean, min, max, sum, count, '
                                                 "first, last (output fields mean_usage, ...)")
    dc.add_argument("--group-by-tags", default="all", help='"all" (default: every tag of the source table) or "host,region"')
    dc.add_argument("--into", required=True, help="DST or DST.TABLE (default table: <table>_<every>)")
    dc.add_argument("--start", default="", help="the first window: RFC3339, integer nanoseconds or a duration before "
                                                 "now (30d); default: the whole history")
    dl = ds_sub.add_parser("list", help="every downsampler: its state, progress, lag and watermark")
    _add_addr(dl)
    dl.add_argument("--db", default="", help="only those of this database (as source or destination)")
    dd = ds_sub.add_parser("drop", help="drop a downsampler (what it emitted stays)")
    _add_addr(dd)
    dd.add_argument("name", help="<destination database>.<destination table>")

    ve = sub.add_parser("verify", help="the server checks what queries answer against its write buffer (every "
                                       "message Kafka still holds); exits 1 on any difference")
    _add_addr(ve)
    ve.add_argument("--db", required=True)
    ve.add_argument("--table", default="", help="only this table (default: every table)")
    ve.add_argument("--max-differences", type=int, default=20, help="differences listed per Kafka partition "
                                                                    "(all are counted)")
    ve.add_argument("--format", choices=("text", "json"), default="text")
    ve.add_argument("--timeout-s", type=float, default=3600.0)

    sc = sub.add_parser("spark-connect-url", help="print the Spark Connect URL of the server on a data directory, "
                                                  "with its token (sc://localhost:PORT/;token=...)")
    sc.add_argument("--data-dir", default=os.environ.get("IOX_DATA_DIR", "./data"))

    b = sub.add_parser("broker", help="run the embedded Kafka-protocol broker alone, in the foreground")
    b.add_argument("--port", type=int, default=9092)
    b.add_argument("--storage", default=os.environ.get("IOX_BROKER_STORAGE", DEFAULT_BROKER_STORAGE),
                   help="durable (messages on disk under --data-dir; the default), memory (lost when the broker "
                        "stops; for development) or s3://bucket/ (env IOX_BROKER_STORAGE)")
    b.add_argument("--data-dir", default=os.environ.get("IOX_BROKER_DATA_DIR", "./broker-data"),
                   help="where a durable broker keeps its messages (env IOX_BROKER_DATA_DIR)")

    w = sub.add_parser("write", help="write line protocol from FILE (or - for stdin)")
    _add_addr(w)
    w.add_argument("--db", required=True)
    w.add_argument("--precision", default="ns", choices=["ns", "us", "ms", "s"])
    w.add_argument("--batch-bytes", type=parse_memory_bytes, default=DEFAULT_WRITE_BATCH_BYTES,
                   help="largest request (e.g. 8m): a larger input is sent in several requests, each cut at "
                        "the end of a line and each all-or-nothing: when one fails, the ones before it stay "
                        f"written (default {DEFAULT_WRITE_BATCH_BYTES >> 20}m; at most the server's "
                        "--max-request-bytes)")
    w.add_argument("file")

    q = sub.add_parser("sql", help="run Spark SQL against a database")
    _add_addr(q)
    q.add_argument("--db", required=True)
    q.add_argument("--format", default="table", choices=["table", "csv", "json"])
    q.add_argument("--after", default="", metavar="TOKEN",
                   help="a write token as `iox write` prints it (write_token): run once that write is visible; "
                        "past --timeout-s the query fails with DEADLINE_EXCEEDED")
    q.add_argument("--timeout-s", type=float, default=120.0,
                   help="deadline of the query, waits included (default 120)")
    q.add_argument("--allow-partial", action="store_true",
                   help="while the database replays its write buffer after a restart, answer at once (marked "
                        "partial) instead of waiting for the replay")
    q.add_argument("--show-watermark", action="store_true",
                   help="after the answer, print on stderr what it reflects: per Kafka partition the applied and "
                        "visible offsets, the write-buffer epoch and whether it is partial")
    q.add_argument("query")

    st = sub.add_parser("status", help="print the catalog status as JSON")
    _add_addr(st)
    st.add_argument("--db", default="")
    st.add_argument("--wait-replay", action="store_true",
                    help="while a restarted server replays the write buffer, show a progress bar until it caught up")
    st.add_argument("--pool", action="store_true",
                    help="ingester pool: every member (asked through the one at --addr), the partitions it owns with "
                         "their epochs and lag")
    st.add_argument("--assigner", default=None, metavar="HOST:PORT",
                    help="ingester pool: the pool as the assigner serving its status at HOST:PORT (`iox assigner "
                         "--status-addr`) saw it in its last round: members, partitions, epochs, lag, rates, moves "
                         "(--token: the assigner's)")

    asg = sub.add_parser("assigner", help="ingester pool: assign each database's Kafka partitions to the "
                                          "ingesters (fewest first, pins, handoff of frozen or unreachable ones)")
    asg.add_argument("--ingesters", required=True, help="the pool: comma-separated gRPC addresses host:port")
    asg.add_argument("--pin", action="append", default=[], metavar="DB:PARTITION=HOST:PORT",
                     help="always assign this partition to this ingester while it is active (repeatable)")
    asg.add_argument("--state-file", default=os.environ.get("IOX_ASSIGNER_STATE_FILE", "./assigner-state.json"),
                     help="where the assignments are kept across restarts (env IOX_ASSIGNER_STATE_FILE)")
    asg.add_argument("--interval-s", type=float, default=2.0, help="seconds between rounds")
    asg.add_argument("--unreachable-after-s", type=float, default=30.0,
                     help="an ingester that does not answer this long loses its partitions to the others")
    from iox_spark.server.pool.assigner_policy import DEFAULT_REBALANCE_INTERVAL_S

    asg.add_argument("--no-rebalance", dest="rebalance", action="store_false",
                     help="move partitions only to hand them off (frozen, removed or unreachable members), never "
                          "to spread the load over the members")
    asg.add_argument("--rebalance-interval-s", type=float, default=DEFAULT_REBALANCE_INTERVAL_S,
                     help="the least seconds between two partition moves that spread the load")
    asg.add_argument("--token", default=os.environ.get("IOX_TOKEN") or None,
                     help="admin token of the ingesters (env IOX_TOKEN)")
    asg.add_argument("--object-store", default=os.environ.get("IOX_OBJECT_STORE") or None,
                     help="the pool's object store (directory or s3://bucket/prefix; env IOX_OBJECT_STORE): "
                          "assigners on it share a lease, one acts and the others stand by; without it, run "
                          "exactly one assigner")
    asg.add_argument("--s3-endpoint", default=None, help="S3 endpoint URL of --object-store (MinIO, moto)")
    from iox_spark.server.pool.assigner_lease import DEFAULT_LEASE_S

    asg.add_argument("--lease-s", type=float, default=DEFAULT_LEASE_S,
                     help="how long a renewal of the assigner lease holds it (renewed every round)")
    asg.add_argument("--status-addr", default=os.environ.get("IOX_ASSIGNER_STATUS_ADDR") or None,
                     metavar="HOST:PORT",
                     help="serve the pool's status over HTTP here: GET /status (JSON, what `iox status --assigner` "
                          "prints), /metrics (Prometheus), /health; with --token, all but /health need it (env "
                          "IOX_ASSIGNER_STATUS_ADDR; default: not served)")

    d = sub.add_parser("demo", help="start a server on embedded defaults, write sample data, query it")
    d.add_argument("--data-dir", default=None, help="default: a fresh temporary directory")
    d.add_argument("--grpc-port", type=int, default=0)
    d.add_argument("--keep-running", action="store_true", help="keep serving after the demo (Ctrl-C stops)")
    return ap


def _spark_conf(pairs: list) -> dict:
    out = {}
    for kv in pairs:
        key, sep, value = kv.partition("=")
        if not sep or not key.strip():
            raise InvalidConfig("spark_conf", kv, "must be KEY=VALUE")
        out[key.strip()] = value
    return out


def config_from_args(a) -> ServerConfig:
    return ServerConfig(grpc_port=a.grpc_port, http_port=a.http_port, influxdb3_port=a.influxdb3_port,
                        data_dir=a.data_dir, kafka_bootstrap=a.kafka_bootstrap or None,
                        partitions=a.partitions, replication_factor=a.replication_factor, spark_master=a.spark_master, driver_memory=a.driver_memory,
                        produce_timeout_ms=a.produce_timeout_ms, txn_timeout_s=a.txn_timeout_s,
                        tail_loss_grace_s=a.tail_loss_grace_s,
                        trigger_interval_ms=a.trigger_interval_ms, spark_nice=a.spark_nice,
                        write_path_rt_priority=a.write_path_rt_priority,
                        max_request_bytes=a.max_request_bytes, grpc_workers=a.grpc_workers,
                        max_concurrent_rpcs=a.max_concurrent_rpcs, http_workers=a.http_workers,
                        max_query_rows=a.max_query_rows, max_query_bytes=a.max_query_bytes, query_timeout_s=a.query_timeout_s,
                        parquet_cache_max_bytes=a.parquet_cache_max_bytes,
                        max_columns_per_table=a.max_columns_per_table,
                        prune_delay_s=a.prune_delay_s, memory_limit_bytes=a.memory_limit_bytes,
                        memory_soft_fraction=a.memory_soft_fraction, freeze_at_percent=a.freeze_at_percent,
                        pool_member=a.pool_member or None, pool_address=a.pool_address or None, role=a.role,
                        spark_connect_port=a.spark_connect_port,
                        tail_max_bytes=a.tail_max_bytes,
                        embedded_broker_port=a.broker_port, broker_storage=a.broker_storage,
                        broker_persisted_retention_s=a.broker_persisted_retention_s,
                        object_store=a.object_store,
                        s3_endpoint=a.s3_endpoint, object_store_shared=a.object_store_shared,
                        skip_lost_writes=a.skip_lost_writes,
                        bind_host=a.bind_host, auth_token=a.auth_token or None,
                        auth_tokens_file=a.auth_tokens_file or None, insecure=a.insecure,
                        extra_spark_conf=_spark_conf(a.spark_conf), iceberg_catalog=a.iceberg_catalog,
                        lifecycle={fld: getattr(a, fld) for _f, _t, fld in LIFECYCLE_OPTIONS
                                   if getattr(a, fld) is not None})


def _replay_progress(client, database: str, out=sys.stderr, interval_s: float = 0.5) -> None:
    """Draws a progress bar (offsets replayed / to replay, as status reports them) until no database
    replays."""
    import time

    while True:
        dbs = [d for d in client.status_proto(database).databases if d.replaying]
        if not dbs:
            out.write("\rreplay caught up" + " " * 50 + "\n")
            return
        done = sum(d.replay_offsets_done for d in dbs)
        total = sum(d.replay_offsets_todo for d in dbs)
        frac = min(1.0, done / total) if total else 1.0
        bar = "#" * int(frac * 40)
        out.write(f"\rreplaying [{bar:<40}] {frac * 100:5.1f}% ({done}/{total} offsets)")
        out.flush()
        time.sleep(interval_s)


class _WriteFailed(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def write_input(client, database: str, data, precision: str, batch_bytes: int, err=sys.stderr,
                responses: list | None = None) -> dict:
    """Writes line protocol `data` (bytes, or a read-only mmap of a file) in requests of at most
    `batch_bytes`, each cut at the end of a line; returns the merged write token {partition: offset}.

    `responses`: when given, the last request's WriteResponse is appended to it (its topic, epoch).
    When stderr (`err`) is a terminal, draws a progress bar of the bytes acknowledged. Raises
    `_WriteFailed` with the server's message and, for a later request, what was written before it.
    """
    import grpc
    from tqdm import tqdm

    from iox_spark.server.write.line_protocol import line_protocol_pieces

    token: dict = {}
    last = None
    total = len(data)
    pieces = line_protocol_pieces(data, batch_bytes) if total else iter([(0, 0)])
    lines_before = 0
    tty = hasattr(err, "isatty") and err.isatty()
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="writing", file=err,
              disable=not tty, delay=0.5, dynamic_ncols=True) as bar:
        for i, (start, stop) in enumerate(pieces):
            body = data[start:stop]
            try:
                last = client.write_response(database, body, precision)
                got = dict(last.token.offsets)
            except grpc.RpcError as e:
                msg = f"{e.code().name}: {e.details()}"
                if i:
                    done = {str(k): v for k, v in sorted(token.items())}
                    msg += (f"\n(request {i + 1}, input bytes [{start}, {stop}): its line numbers count from line "
                            f"{lines_before + 1} of the input, blank lines and comments not counted; the {start} "
                            f"bytes before it were written, write token {json.dumps(done)})")
                raise _WriteFailed(msg) from None
            for p, off in got.items():
                token[p] = max(off, token.get(p, off))
            lines_before += body.count(b"\n")
            bar.update(stop - start)
    if responses is not None and last is not None:
        responses.append(last)
    return token


def _token_text(resp, offsets: dict) -> str:
    """The printable write token (server/write_buffer/write_token.py) of the whole input: the merged
    `offsets` in the topic, epoch and topic incarnation of its last response `resp`."""
    from iox_spark.server.write_buffer.write_token import WriteToken, format_token

    if not resp.token_text:  # a server that answers no printable token
        return ""
    return format_token(WriteToken(resp.topic, resp.token.topic_id or None, resp.token.epoch, offsets))


def _read_input(path: str):
    """(data, close): stdin's bytes, or a read-only mmap of a regular file (its bytes for others)."""
    import mmap

    if path == "-":
        return sys.stdin.buffer.read(), lambda: None
    f = open(path, "rb")
    try:
        if os.fstat(f.fileno()).st_size:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            return m, lambda: (m.close(), f.close())
    except (OSError, ValueError):  # not mappable (a pipe, a device): read it
        pass
    try:
        return f.read(), lambda: None
    finally:
        f.close()


def _duration_s(text: str) -> int:
    """argparse type of a retention period (catalog/retention.py `parse_duration_s`)."""
    from iox_spark.catalog.retention import parse_duration_s

    try:
        return parse_duration_s(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _client_call(fn):
    import grpc

    try:
        return fn()
    except grpc.RpcError as e:
        sys.stderr.write(f"error: {e.code().name}: {e.details()}\n")
        sys.exit(1)


def parse_log_levels(text: str) -> tuple[str, dict]:
    """'WARNING,iox_spark.server.consume.ingest=DEBUG' -> ('WARNING', {'iox_spark.server.consume.ingest': 'DEBUG'}). The root level comes
    first and may be left out ('iox_spark.server.consume.ingest=DEBUG' keeps INFO). Raises ValueError naming a bad part."""
    known = {"CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"}
    root, levels = "INFO", {}
    for i, part in enumerate(p.strip() for p in text.split(",")):
        name, eq, level = part.rpartition("=")
        level = level.strip().upper()
        if level not in known:
            raise ValueError(f"{part!r}: the level must be one of {', '.join(sorted(known))}")
        if not eq:
            if i:
                raise ValueError(f"{part!r}: only the first part may be a level alone (the root logger's)")
            root = level
        elif not name.strip():
            raise ValueError(f"{part!r}: a logger name is missing before '='")
        else:
            levels[name.strip()] = level
    return root, levels


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "serve":
        try:
            root_level, levels = parse_log_levels(a.log_level)
        except ValueError as e:
            build_parser().error(f"--log-level: {e}")
        logging.basicConfig(level=root_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        from iox_spark.server.app import IoxServer

        try:
            cfg = config_from_args(a)
        except InvalidConfig as e:
            build_parser().error(f"--{e.field.replace('_', '-')}: {e}")
        if cfg.auth_tokens_file:
            from iox_spark.server.api.auth import InvalidTokensFile, load_tokens_file

            try:
                load_tokens_file(cfg.auth_tokens_file)
            except InvalidTokensFile as e:
                build_parser().error(f"--auth-tokens-file: {e}")
        srv = IoxServer(cfg)
        srv.install_signal_handlers()  # a SIGTERM while it starts stops it cleanly once started
        try:
            srv.start()
        except ServerError as e:  # a start refused for a reason the operator acts on: one line, no traceback
            sys.stderr.write(f"error: {e}\n")
            return 1
        from iox_spark.server.runtime.gc_pauses import GcPauseRecorder, freeze_startup_heap

        GcPauseRecorder(srv.router.metrics.observe_gc_pause).install()
        frozen = freeze_startup_heap()
        logging.getLogger("iox_spark.server").info("%d objects of the start frozen out of garbage collection", frozen)
        print(f"iox serving gRPC on port {srv.grpc_port}", flush=True)
        srv.wait()
        return 0
    if a.cmd == "spark-connect-url":
        from iox_spark.server.runtime.spark_connect import connect_url

        try:
            print(connect_url(os.path.abspath(a.data_dir)))
        except ServerError as e:
            sys.stderr.write(f"error: {e}\n")
            return 1
        return 0
    if a.cmd == "broker":
        from iox_spark.server.runtime.broker import run_foreground

        try:
            return run_foreground(a.port, a.storage, a.data_dir)
        except ServerError as e:  # its port taken, its executable missing
            sys.stderr.write(f"error: {e}\n")
            return 1
    if a.cmd == "assigner":
        return _run_assigner(a)
    if a.cmd == "demo":
        from iox_spark.server.cli.demo import run_demo

        return run_demo(a.data_dir, a.grpc_port, a.keep_running)

    from iox_spark.server.api.client import IoxClient

    client = IoxClient(a.addr, token=a.token)
    if a.cmd == "write":
        if a.batch_bytes < 1:
            build_parser().error("--batch-bytes: must be at least 1")
        data, close = _read_input(a.file)
        last: list = []
        try:
            token = write_input(client, a.db, data, a.precision, a.batch_bytes, responses=last)
        except _WriteFailed as e:
            sys.stderr.write(f"error: {e.message}\n")
            return 1
        finally:
            close()
        print(json.dumps({"token": {str(k): v for k, v in sorted(token.items())},
                          "write_token": _token_text(last[0], token) if last else ""}))
        return 0
    if a.cmd == "sql":
        if not a.timeout_s > 0:
            build_parser().error("sql: --timeout-s must be more than 0")
        table, info = _client_call(lambda: client.query_with_watermark(a.db, a.query, a.timeout_s, a.after,
                                                                       a.allow_partial))
        print_table(table, a.format)
        if a.show_watermark:
            sys.stderr.write(json.dumps({"watermark": info}) + "\n")
        if info.get("partial"):
            sys.stderr.write("warning: PARTIAL answer: the database is still replaying its write buffer; acknowledged "
                             "writes past the watermark above are missing\n")
        return 0
    if a.cmd == "persist":
        r = _client_call(lambda: client.persist(a.db, a.table, a.partition))
        print(json.dumps(r, indent=2))
        for s in r.get("skipped", []):
            where = f"{s['table']}/{s['partition_key']}" if s["table"] else f"Kafka partition {s['kafka_partition']}"
            sys.stderr.write(f"warning: not persisted: {where}: {s['reason']}\n")
        return 0
    if a.cmd == "delete":
        r = _client_call(lambda: client.delete_response(a.db, a.start, a.stop, a.predicate, a.table))
        print(json.dumps({"token": {str(k): v for k, v in sorted(r.offsets.items())}, "write_token": r.token_text}))
        return 0
    if a.cmd == "compact":
        r = _client_call(lambda: client.compact(a.db, a.table, a.partition, persisted=a.persisted))
        print(json.dumps(r, indent=2))
        return 0
    if a.cmd == "poison":
        if a.offset is not None and a.partition is None:
            build_parser().error("poison: --offset needs --partition")
        act = client.retry_poisoned if a.poison_cmd == "retry" else client.accept_poisoned
        r = _client_call(lambda: act(a.db, a.partition, a.offset))
        print(json.dumps({"messages": r}, indent=2))
        return 0
    if a.cmd == "accept-lost-writes":
        print(json.dumps(_client_call(lambda: client.accept_lost_writes(a.db)), indent=2))
        return 0
    if a.cmd == "retention":
        print(json.dumps(_client_call(lambda: client.set_retention(a.db, a.period)), indent=2))
        return 0
    if a.cmd == "downsample":
        if a.ds_cmd == "create":
            call = lambda: client.create_downsampler(a.db, a.table, a.every, a.agg, a.into, a.group_by_tags,  # noqa: E731
                                                     a.start)
        elif a.ds_cmd == "list":
            call = lambda: {"downsamplers": client.list_downsamplers(a.db)}  # noqa: E731
        else:
            call = lambda: client.drop_downsampler(a.name)  # noqa: E731
        print(json.dumps(_client_call(call), indent=2))
        return 0
    if a.cmd == "claim":
        try:
            parts = [int(p) for p in a.partitions.split(",") if p.strip()]
        except ValueError:
            build_parser().error(f"claim: --partitions must be comma-separated integers, got {a.partitions!r}")
        print(json.dumps(_client_call(lambda: client.claim_partitions(a.db, parts)), indent=2))
        return 0
    if a.cmd in ("freeze", "unfreeze"):
        call = (lambda: client.freeze(a.reason)) if a.cmd == "freeze" else client.unfreeze
        print(json.dumps(_client_call(call), indent=2))
        return 0
    if a.cmd == "verify":
        if a.max_differences < 1:
            build_parser().error("verify: --max-differences must be at least 1")
        r = _client_call(lambda: client.verify(a.db, a.table, a.max_differences, a.timeout_s))
        print(json.dumps(r, indent=2) if a.format == "json" else format_verify_report(r))
        return 0 if r["ok"] else 1
    if a.cmd == "status":
        if a.assigner:
            return _assigner_status(a.assigner, a.token)
        if a.pool:
            from iox_spark.server.api.client import NotAPoolMember

            try:
                print(json.dumps(_client_call(client.pool_status), indent=2))
            except NotAPoolMember as e:
                sys.stderr.write(f"error: {e}\n")
                return 1
            return 0
        if a.wait_replay:
            _client_call(lambda: _replay_progress(client, a.db))
        print(json.dumps(_client_call(lambda: client.status(a.db)), indent=2))
        return 0
    return 2


def _host_port(text: str, option: str) -> tuple:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{option} must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _assigner_status(addr: str, token: str | None) -> int:
    """`iox status --assigner HOST:PORT`: prints the assigner's GET /status."""
    import urllib.error
    import urllib.request

    try:
        host, port = _host_port(addr, "--assigner")
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    req = urllib.request.Request(f"http://{host}:{port}/status",
                                 headers={"Authorization": f"Token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            print(json.dumps(json.loads(resp.read()), indent=2))
        return 0
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail).get("message", detail)
        except ValueError:
            pass
        sys.stderr.write(f"error: the assigner at {addr} answered {e.code}: {detail}\n")
    except (urllib.error.URLError, OSError) as e:
        sys.stderr.write(f"error: cannot reach the assigner's status at {addr} ({getattr(e, 'reason', e)}); "
                         f"is it running with --status-addr {addr}?\n")
    return 1


def _run_assigner(a) -> int:
    import signal

    from iox_spark.server.pool.assigner import Assigner, AssignerStateCorrupt, parse_pins
    from iox_spark.server.pool.assigner_status import AssignerStatusServer

    pool = [x.strip() for x in a.ingesters.split(",") if x.strip()]
    try:
        pins = parse_pins(a.pin, pool)
        lease = None
        if a.object_store:
            import socket

            from iox_spark.catalog.object_store import object_store_from_url
            from iox_spark.server.pool.assigner_lease import AssignerLease

            if not a.lease_s >= a.interval_s * 2:
                raise ValueError(f"--lease-s {a.lease_s} must be at least twice --interval-s {a.interval_s}")
            lease = AssignerLease(object_store_from_url(a.object_store, a.s3_endpoint),
                                  f"{socket.gethostname()}:{os.getpid()}", a.lease_s)
        if not a.rebalance_interval_s > 0:
            raise ValueError(f"--rebalance-interval-s must be > 0, got {a.rebalance_interval_s}")
        status_at = _host_port(a.status_addr, "--status-addr") if a.status_addr else None
        assigner = Assigner(pool, a.state_file, pins, token=a.token, interval_s=a.interval_s,
                            unreachable_after_s=a.unreachable_after_s, lease=lease, rebalance=a.rebalance,
                            rebalance_interval_s=a.rebalance_interval_s)
    except (ValueError, AssignerStateCorrupt) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    status = None
    if status_at is not None:
        try:
            status = AssignerStatusServer(assigner, *status_at, token=a.token).start()
        except OSError as e:
            assigner.close()
            sys.stderr.write(f"error: cannot serve the assigner's status on {a.status_addr} ({e.strerror or e}); "
                             f"choose another --status-addr\n")
            return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if lease is None:
        logging.getLogger("iox_spark.server.pool.assigner").warning("no --object-store: no lease, so run exactly one assigner")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: assigner.stop())
    if status is not None:
        logging.getLogger("iox_spark.server.pool.assigner").info("status served on http://%s:%d/status", status_at[0], status.port)
    try:
        assigner.run()
    finally:
        if status is not None:
            status.stop()
        assigner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
