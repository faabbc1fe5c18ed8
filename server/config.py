"""Server configuration: one frozen dataclass, every default a named constant.

Invariant: a `ServerConfig` is complete and immutable once built; the CLI and
the `IOX_*` environment variables are the only ways to set it (server/cli/main.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from iox_spark.server.write_buffer.producer import DEFAULT_REPLICATION_FACTOR
from iox_spark.server.runtime.broker import DEFAULT_BROKER_STORAGE, MEMORY_BROKER_MAX_PERSIST_AGE_S, STORAGE_DURABLE, STORAGE_MEMORY
from iox_spark.server.runtime.broker_truncation import DEFAULT_RETENTION_S as DEFAULT_BROKER_PERSISTED_RETENTION_S
from iox_spark.server.errors import ServerError
from iox_spark.server.write_buffer.tail_loss import TAIL_LOSS_GRACE_S
#: the retention pruner's delay behind reader_lo (declared with the prune policy)
from iox_spark.lifecycle.prune_policy import DEFAULT_PRUNE_DELAY_S

__all__ = [
    "ServerConfig",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_DATA_DIR",
    "DEFAULT_PARTITIONS",
    "DEFAULT_SPARK_MASTER",
    "DEFAULT_DRIVER_MEMORY",
    "DEFAULT_PRODUCE_TIMEOUT_MS",
    "DEFAULT_TRIGGER_INTERVAL_MS",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_SPARK_CONNECT_PORT",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_TXN_TIMEOUT_S",
    "TAIL_LOSS_GRACE_S",
    "DEFAULT_SPARK_NICE",
    "DEFAULT_WRITE_PATH_RT_PRIORITY",
    "DEFAULT_TAIL_MAX_BYTES",
    "DEFAULT_GRPC_WORKERS",
    "DEFAULT_MAX_CONCURRENT_RPCS",
    "DEFAULT_HTTP_WORKERS",
    "DEFAULT_MAX_QUERY_ROWS",
    "DEFAULT_MAX_COLUMNS_PER_TABLE",
    "DEFAULT_MAX_QUERY_BYTES",
    "DEFAULT_PARQUET_CACHE_MAX_BYTES",
    "DEFAULT_QUERY_TIMEOUT_S",
    "DEFAULT_PRUNE_DELAY_S",
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "DEFAULT_MEMORY_SOFT_FRACTION",
    "DEFAULT_MEMORY_SAMPLE_INTERVAL_MS",
    "DEFAULT_ICEBERG_CATALOG",
    "InvalidConfig",
    "object_store_reachable",
    "parse_memory_bytes",
]

DEFAULT_GRPC_PORT = 8082
#: where persisted data is published as Apache Iceberg (lifecycle/iceberg_publication.py): a SQL
#: catalog on SQLite in the data directory
DEFAULT_ICEBERG_CATALOG = "sqlite"
DEFAULT_DATA_DIR = "./data"
#: Kafka partitions per database topic.
DEFAULT_PARTITIONS = 4
DEFAULT_SPARK_MASTER = "local[*]"
DEFAULT_DRIVER_MEMORY = "4g"
#: How long a write waits for Kafka's acknowledgement before answering UNAVAILABLE.
DEFAULT_PRODUCE_TIMEOUT_MS = 10_000
#: A request of several write-buffer messages whose commit decision has not appeared this long
#: after its parts is aborted by the consumer (its router died); must exceed twice the produce
#: timeout plus a margin (see write_buffer.txn_commit_deadline_s).
DEFAULT_TXN_TIMEOUT_S = 60.0
#: Streaming trigger interval of the write-buffer consumer.
DEFAULT_TRIGGER_INTERVAL_MS = 100
#: Largest accepted write request body (after decompression).
DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024
#: InfluxDB v2 compatible HTTP write API; 0 disables it.
DEFAULT_HTTP_PORT = 8086
#: Spark Connect endpoint inside the server's Spark application; 0 disables it.
DEFAULT_SPARK_CONNECT_PORT = 15002
#: Nice value (0-19) of the Spark application's JVM and the Python workers it starts: the
#: consume path, lifecycle and queries yield the CPU to the write path (request parsing, the
#: Kafka producer) and the broker, so acknowledgements stay fast while ingest saturates the
#: machine (IOx likewise keeps its write path off the executor that runs queries and
#: compactions). 0 = same priority as the server. Only a Spark application the server starts.
DEFAULT_SPARK_NICE = 10
#: SCHED_RR priority (1-99) of the server's own threads and its embedded broker's
#: (server/runtime/write_path_priority.py): a write's parsing, produce and acknowledgement take a core
#: as soon as they are runnable instead of waiting behind the Spark JVM's time slice, which
#: nice values alone do not prevent. 0 = off (the normal policy), the default: real-time threads
#: are not throttled by container CPU quotas (cgroup cpu.max) and a busy one can starve every
#: normal thread of its core, the host's included. Opt in only on a host the server owns.
#: Where the kernel refuses, the server logs it and serves.
DEFAULT_WRITE_PATH_RT_PRIORITY = 0
#: Payload bytes the write buffer's tail holds (server/query/tail.py): acknowledged writes
#: queryable before Spark applied them. 0 disables the tail (queries reflect applied writes only).
DEFAULT_TAIL_MAX_BYTES = 256 * 1024 * 1024
#: Threads serving gRPC requests.
DEFAULT_GRPC_WORKERS = 16
#: gRPC requests in progress at once (running or waiting for a worker thread); one more is
#: answered RESOURCE_EXHAUSTED by grpc itself. Four per worker thread.
DEFAULT_MAX_CONCURRENT_RPCS = 4 * DEFAULT_GRPC_WORKERS
#: Threads serving HTTP connections (a keep-alive connection holds one until it is idle for the
#: socket timeout); as many connections again wait for one, any further connection is answered
#: 503 with Retry-After and closed.
DEFAULT_HTTP_WORKERS = 32
#: Most columns (tags, fields and time) one table may have: a write adding more is rejected
#: (INVALID_ARGUMENT / HTTP 400), as IOx's namespace limit does with the same default. Spark plans
#: over thousands of columns fail to compile, so a table far wider cannot be queried.
DEFAULT_MAX_COLUMNS_PER_TABLE = 200
#: Rows of one query result; 0 = no limit (the byte limit still applies).
DEFAULT_MAX_QUERY_ROWS = 0
#: Arrow bytes of one query result; a larger result is answered RESOURCE_EXHAUSTED. 0 = no limit.
DEFAULT_MAX_QUERY_BYTES = 1024 * 1024 * 1024
#: Local disk the copies of persisted Parquet files may take (local Spark on an S3 object store:
#: chunk_store/parquet_cache.py); a chunk whose files do not fit reads the object store. 0 = no copies.
DEFAULT_PARQUET_CACHE_MAX_BYTES = 8 * 1024 ** 3
#: Seconds one query's Spark job may run before it is cancelled and answered DEADLINE_EXCEEDED; 0 = none.
DEFAULT_QUERY_TIMEOUT_S = 300.0
#: Address gRPC, HTTP and Spark Connect bind to: loopback only unless `--bind-host` widens it.
DEFAULT_BIND_HOST = "127.0.0.1"
#: RSS bound of the server's process tree (driver, Spark JVM, Python workers, the embedded broker);
#: 0 = off (the default: the JVM's own -Xmx and the buffer's hard limit still apply).
DEFAULT_MEMORY_LIMIT_BYTES = 0
#: Fraction of --memory-limit-bytes past which the server throttles: micro-batches read less and the
#: lifecycle persists and unloads first; at the limit writes are refused (RESOURCE_EXHAUSTED / 503).
DEFAULT_MEMORY_SOFT_FRACTION = 0.8
#: How often the RSS of the process tree is sampled.
DEFAULT_MEMORY_SAMPLE_INTERVAL_MS = 500
#: --freeze-at-percent: freeze (server/write_buffer/freeze.py) once memory or the data directory's disk
#: is this full, in percent; 0 = never (a server alone keeps ingesting up to its memory limit)
DEFAULT_FREEZE_AT_PERCENT = 0.0
#: --role: what a server does in an ingester pool
ROLES = ("all", "ingester", "querier")
DEFAULT_ROLE = "all"
#: Most write-buffer messages one micro-batch takes per Kafka partition.
DEFAULT_MAX_MESSAGES_PER_PARTITION_PER_BATCH = 2_000


def parse_memory_bytes(text: str) -> int:
    """'4g' / '512m' / '1024k' / '123' (bytes) -> bytes."""
    t = text.strip().lower()
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] == "b":
        t = t[:-1]
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def _int_in(value, lo: int, hi: float = float("inf")) -> bool:
    """An int (a bool is not one here) with lo <= value <= hi (both inclusive)."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name to bind) reaches this machine only."""
    import ipaddress

    h = host.strip().strip("[]")
    if h.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def object_store_reachable(spark_master: str, object_store_url: str, shared: bool) -> bool:
    """Whether the executors of `spark_master` can read and write the object store at
    `object_store_url`: always in local mode (chunk_store/cluster.py) and for S3; a directory
    with a cluster master only when declared `shared` (mounted at the same path everywhere). Pure."""
    from urllib.parse import urlsplit

    from iox_spark.chunk_store.cluster import is_local_master

    return is_local_master(spark_master) or shared or urlsplit(object_store_url).scheme.lower() == "s3"


class InvalidConfig(ServerError, ValueError):
    def __init__(self, field: str, actual, reason: str):
        self.field = field
        self.actual = actual
        super().__init__(f"{field} = {actual!r}: {reason}")


@dataclass(frozen=True)
class ServerConfig:
    grpc_port: int = DEFAULT_GRPC_PORT
    data_dir: str = DEFAULT_DATA_DIR
    #: Kafka bootstrap servers; None = start (or reuse) the embedded Tansu broker.
    kafka_bootstrap: str | None = None
    partitions: int = DEFAULT_PARTITIONS
    spark_master: str = DEFAULT_SPARK_MASTER
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    produce_timeout_ms: int = DEFAULT_PRODUCE_TIMEOUT_MS
    txn_timeout_s: float = DEFAULT_TXN_TIMEOUT_S
    trigger_interval_ms: int = DEFAULT_TRIGGER_INTERVAL_MS
    spark_nice: int = DEFAULT_SPARK_NICE
    write_path_rt_priority: int = DEFAULT_WRITE_PATH_RT_PRIORITY
    tail_max_bytes: int = DEFAULT_TAIL_MAX_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    grpc_workers: int = DEFAULT_GRPC_WORKERS
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS
    http_workers: int = DEFAULT_HTTP_WORKERS
    max_query_rows: int = DEFAULT_MAX_QUERY_ROWS
    max_query_bytes: int = DEFAULT_MAX_QUERY_BYTES
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    parquet_cache_max_bytes: int = DEFAULT_PARQUET_CACHE_MAX_BYTES
    max_columns_per_table: int = DEFAULT_MAX_COLUMNS_PER_TABLE
    max_messages_per_partition_per_batch: int = DEFAULT_MAX_MESSAGES_PER_PARTITION_PER_BATCH
    #: retention: the pruner's delay behind reader_lo (catalog/retention.py, lifecycle/prune_policy.py)
    prune_delay_s: float = DEFAULT_PRUNE_DELAY_S
    #: RSS bound of the process tree; 0 = off (server/runtime/memory_guard.py)
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES
    memory_soft_fraction: float = DEFAULT_MEMORY_SOFT_FRACTION
    memory_sample_interval_ms: int = DEFAULT_MEMORY_SAMPLE_INTERVAL_MS
    #: freeze once memory (of --memory-limit-bytes, else of the host) or the data directory's disk is
    #: this full, in percent (exclusive 0, inclusive 100); 0 = never
    freeze_at_percent: float = DEFAULT_FREEZE_AT_PERCENT
    #: this server's name in an ingester pool (catalog/ownership.py); None = not a pool member (it
    #: applies every partition of every database). Members share one Kafka cluster and object store.
    pool_member: str | None = None
    #: the address other pool members reach this server's gRPC at (published in the object store
    #: under iox~pool/members/); None = --bind-host:port (the host's name when bound to every interface)
    pool_address: str | None = None
    #: ROLES: "all" (the default) takes writes, owns what it claims and answers queries; "ingester"
    #: answers no user query; "querier" claims nothing (in a pool it answers queries by gathering the
    #: owners' rows). A role other than "all" needs --pool-member.
    role: str = DEFAULT_ROLE
    spark_connect_port: int = DEFAULT_SPARK_CONNECT_PORT
    http_port: int = DEFAULT_HTTP_PORT
    #: InfluxDB 3's one port: HTTP and gRPC (Flight) on one port (server/api/one_port.py); 0 = off
    influxdb3_port: int = 0
    #: replication factor of the database topics this server creates (fewer replicas when the Kafka
    #: cluster has fewer brokers, with a warning; the embedded broker is one broker)
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    #: Embedded broker port; 0 = pick a free port.
    embedded_broker_port: int = 0
    #: Embedded broker storage: "durable" (on disk) or "memory" (development only; see server/runtime/broker.py)
    broker_storage: str = DEFAULT_BROKER_STORAGE
    #: how long the durable embedded broker keeps a message once persisted, counted from when it was
    #: written (0: until persisted; inf: every message, the store then grows without bound; see
    #: server/runtime/broker_truncation.py)
    broker_persisted_retention_s: float = DEFAULT_BROKER_PERSISTED_RETENTION_S
    #: Address gRPC, HTTP and Spark Connect bind to (a non-loopback one needs a token or `insecure`).
    bind_host: str = DEFAULT_BIND_HOST
    #: token every API requires (all databases, all permissions; also Spark Connect's); None = none
    auth_token: str | None = field(default=None, repr=False)
    #: scoped tokens (server/api/auth.py), re-read on SIGHUP; None = none
    auth_tokens_file: str | None = None
    #: serve beyond loopback without any token
    insecure: bool = False
    extra_spark_conf: dict = field(default_factory=dict)
    #: object store: a directory, or s3://bucket/prefix; None = <data_dir>/objects
    object_store: str | None = None
    #: S3 endpoint URL (MinIO, moto); None = AWS's
    s3_endpoint: str | None = None
    #: the object store directory is a shared file system mounted at the same path on every Spark
    #: worker (without it, a directory store with a non-local Spark master is refused)
    object_store_shared: bool = False
    #: start even when Kafka lost offsets the replay plan needs (logged, counted in status)
    skip_lost_writes: bool = False
    #: how long Kafka's end may stay at or below an offset this server knows was written (applied or
    #: acknowledged) before its tail counts as lost (server/write_buffer/tail_loss.py)
    tail_loss_grace_s: float = TAIL_LOSS_GRACE_S
    #: lifecycle rule overrides (LifecycleRules field -> value); absent = IOx defaults
    lifecycle: dict = field(default_factory=dict)
    #: the Iceberg catalog every persist is published to: "sqlite" (<data_dir>/iceberg-catalog.db),
    #: an http(s):// REST catalog, a SQLAlchemy URI, or "off" (lifecycle/iceberg_publication.py)
    iceberg_catalog: str = DEFAULT_ICEBERG_CATALOG

    def __post_init__(self) -> None:
        from iox_spark.server.write_buffer.producer import TXN_SLACK_S, txn_commit_deadline_s

        if not _int_in(self.spark_nice, 0, 19):
            raise InvalidConfig("spark_nice", self.spark_nice, "must be an integer from 0 to 19")
        if not _int_in(self.write_path_rt_priority, 0, 99):
            raise InvalidConfig("write_path_rt_priority", self.write_path_rt_priority,
                                "must be an integer from 0 (off) to 99")
        if not _int_in(self.influxdb3_port, 0, 65535):
            raise InvalidConfig("influxdb3_port", self.influxdb3_port, "must be a port from 0 (off) to 65535")
        if self.influxdb3_port and not self.http_port:
            raise InvalidConfig("influxdb3_port", self.influxdb3_port,
                                "needs the HTTP API (--http-port) it serves beside gRPC")
        if not _int_in(self.replication_factor, 1):
            raise InvalidConfig("replication_factor", self.replication_factor, "must be an integer >= 1")
        if not self.broker_persisted_retention_s >= 0:
            raise InvalidConfig("broker_persisted_retention_s", self.broker_persisted_retention_s,
                                "must be >= 0 seconds (inf keeps every message)")
        if self.broker_storage not in (STORAGE_DURABLE, STORAGE_MEMORY):
            raise InvalidConfig("broker_storage", self.broker_storage, "must be durable or memory")
        if not (isinstance(self.tail_loss_grace_s, (int, float)) and self.tail_loss_grace_s > 0):
            raise InvalidConfig("tail_loss_grace_s", self.tail_loss_grace_s, "must be a number of seconds > 0")
        if not _int_in(self.tail_max_bytes, 0):
            raise InvalidConfig("tail_max_bytes", self.tail_max_bytes, "must be a number of bytes >= 0 (0 disables)")

        for name in ("grpc_workers", "max_concurrent_rpcs", "http_workers", "max_request_bytes"):
            if not _int_in(getattr(self, name), 1):
                raise InvalidConfig(name, getattr(self, name), "must be an integer >= 1")
        for name in ("max_query_rows", "max_query_bytes", "max_columns_per_table", "parquet_cache_max_bytes"):
            if not _int_in(getattr(self, name), 0):
                raise InvalidConfig(name, getattr(self, name), "must be an integer >= 0 (0 = no limit)")
        if isinstance(self.query_timeout_s, bool) or not isinstance(self.query_timeout_s, (int, float)) \
                or not self.query_timeout_s >= 0:
            raise InvalidConfig("query_timeout_s", self.query_timeout_s, "must be a number of seconds >= 0 (0 = none)")

        if not (self.auth_token or self.auth_tokens_file or self.insecure or is_loopback(self.bind_host)):
            raise InvalidConfig("bind_host", self.bind_host,
                                "binding beyond loopback needs --auth-token or --auth-tokens-file (or --insecure "
                                "to serve without authentication)")

        if not _int_in(self.memory_limit_bytes, 0):
            raise InvalidConfig("memory_limit_bytes", self.memory_limit_bytes,
                                "must be a number of bytes >= 0 (0 = off)")
        if not (isinstance(self.memory_soft_fraction, (int, float)) and 0 < self.memory_soft_fraction <= 1):
            raise InvalidConfig("memory_soft_fraction", self.memory_soft_fraction,
                                "must be a fraction in (0, 1] (exclusive 0, inclusive 1)")
        if not _int_in(self.memory_sample_interval_ms, 10):
            raise InvalidConfig("memory_sample_interval_ms", self.memory_sample_interval_ms,
                                "must be an integer >= 10")
        if self.role not in ROLES:
            raise InvalidConfig("role", self.role, f"must be one of {', '.join(ROLES)}")
        if self.role != DEFAULT_ROLE and self.pool_member is None:
            raise InvalidConfig("role", self.role, "an ingester or querier is a member of a pool: set --pool-member")
        if self.pool_member is not None:
            from iox_spark.catalog.errors import InvalidAction
            from iox_spark.catalog.ownership import owner_name_check

            try:
                owner_name_check("pool_member", self.pool_member)
            except InvalidAction as e:
                raise InvalidConfig("pool_member", self.pool_member, e.reason) from None
        if isinstance(self.freeze_at_percent, bool) or not isinstance(self.freeze_at_percent, (int, float)) \
                or not 0 <= self.freeze_at_percent <= 100:
            raise InvalidConfig("freeze_at_percent", self.freeze_at_percent,
                                "must be a percentage in [0, 100] (0 = never freeze by usage)")
        if not (isinstance(self.prune_delay_s, (int, float)) and 0 <= self.prune_delay_s < float("inf")):
            raise InvalidConfig("prune_delay_s", self.prune_delay_s, "must be a number of seconds >= 0")
        if not isinstance(self.iceberg_catalog, str) or \
                not (self.iceberg_catalog in ("off", "sqlite") or "://" in self.iceberg_catalog):
            raise InvalidConfig("iceberg_catalog", self.iceberg_catalog,
                                "must be off, sqlite, an http(s):// REST catalog URI or a SQLAlchemy URI "
                                "(sqlite:///path, postgresql://...)")
        if self.pool_member is not None and self.iceberg_catalog == DEFAULT_ICEBERG_CATALOG \
                and self.object_store_url.startswith("s3://"):
            from iox_spark.lifecycle.iceberg_publication import POOL_NEEDS_SHARED_CATALOG

            raise InvalidConfig("iceberg_catalog", self.iceberg_catalog, POOL_NEEDS_SHARED_CATALOG)
        if not object_store_reachable(self.spark_master, self.object_store_url, self.object_store_shared):
            raise InvalidConfig("object_store", self.object_store_url,
                                f"a local directory is not reachable from the executors of Spark master "
                                f"{self.spark_master!r} on other hosts: use --object-store s3://bucket/prefix, or "
                                f"--object-store-shared when it is a shared file system mounted at this same path "
                                f"on every Spark worker")
        if txn_commit_deadline_s(self.txn_timeout_s, self.produce_timeout_ms) <= 0:
            raise InvalidConfig("txn_timeout_s", self.txn_timeout_s,
                                f"must exceed 2 x produce timeout + {TXN_SLACK_S:.0f} s = "
                                f"{2 * self.produce_timeout_ms / 1000 + TXN_SLACK_S:.0f} s")

    @property
    def object_store_url(self) -> str:
        return self.object_store or os.path.join(self.abs_data_dir, "objects")

    @property
    def memory_broker(self) -> bool:
        """The write buffer is the embedded broker in memory: a broker crash loses unpersisted writes."""
        return self.kafka_bootstrap is None and self.broker_storage == STORAGE_MEMORY

    def lifecycle_rules(self):
        """The lifecycle rules; with the in-memory embedded broker the persist age threshold is at
        most MEMORY_BROKER_MAX_PERSIST_AGE_S (what a broker crash can lose is bounded by it)."""
        from iox_spark.lifecycle.rules import LifecycleRules

        rules = LifecycleRules.for_driver_memory(self.driver_memory_bytes, **self.lifecycle)
        if self.memory_broker and rules.persist_age_threshold_s > MEMORY_BROKER_MAX_PERSIST_AGE_S:
            import dataclasses

            rules = dataclasses.replace(rules, persist_age_threshold_s=MEMORY_BROKER_MAX_PERSIST_AGE_S)
        return rules

    @property
    def abs_data_dir(self) -> str:
        return os.path.abspath(self.data_dir)

    @property
    def driver_memory_bytes(self) -> int:
        return parse_memory_bytes(self.driver_memory)
