"""Builds the server's one SparkSession (driver side).

Invariant: exactly one Spark application per server process; Python workers run
this interpreter (PYSPARK_PYTHON), forked by server/runtime/spark_worker_daemon.py; times
are UTC, and the `iox_kafka` source is registered before the stream starts. Spark
Connect, when enabled, is served from this same application so remote clients see
the same global temp views.
"""
from __future__ import annotations

import os
import sys

__all__ = ["build_spark", "SPARK_CONNECT_TOKEN_ENV", "lower_spark_priority", "use_query_pool", "QUERY_POOL",
           "usable_cpus"]

#: Most bytes of one Arrow batch Spark sends to a Python worker. It bounds the batches of
#: write-buffer payloads (rows of ~275 KB in the bench) that persist, the read-buffer move and
#: the chunk views read; rows of the read form are cut by maxRecordsPerBatch long before. In
#: isolation (10M bench rows as 2,000 payloads, one task, 4 runs each) the task read and merged
#: them in 0.41-0.57 s with 2 MiB batches, 0.40-0.47 s (once 0.77 s) with 4 MiB, 0.50-0.55 s with
#: 8 MiB, 0.86-1.19 s with 32 MiB and 1.06-1.23 s with 128 MiB.
_ARROW_BATCH_BYTES = 4 << 20
#: JVM options of the driver (added before `--spark-conf spark.driver.extraJavaOptions`). G1 regions
#: of 16 MiB (the JVM picks 1-2 MiB for a 2-6 GiB heap): an object of half a region or more is
#: "humongous", and in one run of the bench's 10M-point query scenario 13 such allocations started
#: concurrent marks of the whole heap (1-2 s of a core each), several beside timed queries; with
#: 16 MiB regions none was humongous.
_DRIVER_JAVA_OPTIONS = "-XX:G1HeapRegionSize=16m"
#: The longest a stop of the write-buffer stream waits for its micro-batch thread (Spark waits
#: forever by default): a micro-batch wedged in its foreachBatch (a stop racing the start of a
#: micro-batch, SPARK-57963) then fails the stop with a TimeoutException, which the consumer
#: logs, instead of hanging the server's shutdown or a restart of the stream. What the batch did
#: not apply is read again from Kafka.
_STREAM_STOP_TIMEOUT_MS = 120_000
#: The fair-scheduler pool users' queries run in (`use_query_pool`); micro-batches and the
#: lifecycle run in the default pool. With the weight and min share below a query's tasks take
#: the next free task slot instead of queueing behind every task of a running micro-batch (FIFO).
QUERY_POOL = "queries"
_POOLS_XML = """<?xml version="1.0"?>
<allocations>
  <pool name="{pool}"><schedulingMode>FIFO</schedulingMode><weight>8</weight><minShare>2</minShare></pool>
</allocations>
"""


#: where Spark Connect reads its token when `spark.connect.authenticate.token` is not set: the
#: token reaches a JVM this process launches in its environment, never on its command line (`ps`)
SPARK_CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: Spark Connect's own setting, read before the environment: used only when the JVM already runs
#: (its environment was fixed at its launch), set through py4j, so on no command line either
_SPARK_CONNECT_TOKEN_CONF = "spark.connect.authenticate.token"


def _jvm_running() -> bool:
    """Whether this process already launched Spark's JVM (PySpark's gateway), which a new
    application then reuses with the environment it was launched with."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity (a server started under `taskset`, or in
    a container pinned to a cpuset, has fewer than the host), at least 1. Driver side."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def build_spark(master: str, driver_memory: str, scratch_dir: str, spark_connect_port: int = 0,
                extra_conf: dict | None = None, spark_connect_host: str = "127.0.0.1",
                spark_connect_token: str | None = None):
    """`spark_connect_host`: the address Spark Connect binds; `spark_connect_token`: the bearer token
    its clients must send (`sc://host:port/;token=...`), None = none."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers must import this project's packages
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pp = os.environ.get("PYTHONPATH", "")
    if root not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = root + (os.pathsep + pp if pp else "")
    from pyspark.sql import SparkSession

    from iox_spark.chunk_store.cluster import is_local_master
    from iox_spark.server.runtime import jvm_archive, spark_home, spark_worker_daemon
    from iox_spark.server.write_buffer.kafka_source import IoxKafkaDataSource

    os.makedirs(scratch_dir, exist_ok=True)
    user_java_opts = (extra_conf or {}).get("spark.driver.extraJavaOptions", "")
    # the installation's class-data-sharing archive, when built (server/runtime/jvm_archive.py)
    java_opts = " ".join(x for x in (f"-Dderby.system.home={scratch_dir}", _DRIVER_JAVA_OPTIONS,
                                     jvm_archive.java_options(user_java_opts)) if x)
    pools = os.path.join(scratch_dir, "fair-scheduler.xml")
    with open(pools, "w") as f:
        f.write(_POOLS_XML.format(pool=QUERY_POOL))
    b = (SparkSession.builder.master(master).appName("iox")
         # queries are not queued behind micro-batches and lifecycle jobs (see QUERY_POOL)
         .config("spark.scheduler.mode", "FAIR")
         .config("spark.scheduler.allocation.file", pools)
         .config("spark.driver.memory", driver_memory)
         .config("spark.sql.session.timeZone", "UTC")
         # line protocol names are case sensitive: fields `t` and `T` are two columns
         .config("spark.sql.caseSensitive", "true")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.adaptive.enabled", "true")
         # a union of one-partition inputs (chunk checkpoints, the parts of an Arrow merge) runs
         # as many tasks as it has inputs, not one task reading them in turn (Spark 4's default)
         .config("spark.sql.unionOutputPartitioning", "false")
         # generated classes are named without their stage id, so identical stages (a union's
         # scans of a chunk's segments, one per micro-batch) compile once: reading 80 segments of
         # 4M points took 1.8-6 s against 0.7 s for one, 0.8-1.5 s with this
         .config("spark.sql.codegen.useIdInClassName", "false")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         # Arrow batches sent to Python workers are cut by bytes too: chunks in the write-buffer
         # form are rows of large IPC streams, and large batches move slower (_ARROW_BATCH_BYTES)
         .config("spark.sql.execution.arrow.maxBytesPerBatch", str(_ARROW_BATCH_BYTES))
         .config("spark.local.dir", os.path.join(scratch_dir, "local"))
         .config("spark.sql.warehouse.dir", os.path.join(scratch_dir, "warehouse"))
         .config("spark.driver.extraJavaOptions", java_opts)
         .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
         .config("spark.sql.streaming.stopTimeout", str(_STREAM_STOP_TIMEOUT_MS))
         .config("spark.python.worker.reuse", "true")
         # Python workers' sockets ACK at once: 40 ms less per mapInArrow (server/runtime/spark_worker_daemon.py)
         .config("spark.python.daemon.module", spark_worker_daemon.MODULE)
         .config("spark.sql.streaming.noDataMicroBatches.enabled", "false"))
    if is_local_master(master):
        # one shuffle partition per core this process may run on (local[*] counts them the same
        # way: the JVM honours the CPU affinity); on a cluster Spark's default with adaptive
        # execution coalescing small shuffles (--spark-conf spark.sql.shuffle.partitions=N sets it)
        b = b.config("spark.sql.shuffle.partitions", str(max(2, usable_cpus())))
    if spark_connect_port:
        b = (b.config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
             .config("spark.connect.grpc.binding.port", str(spark_connect_port))
             .config("spark.connect.grpc.binding.address", spark_connect_host))
        if spark_connect_token:
            if _jvm_running():
                # a JVM this process launched earlier (an earlier server's, stopped) read its
                # environment then: the token goes in the new application's conf, over py4j, which
                # Spark Connect reads before the environment; still on no command line
                b = b.config(_SPARK_CONNECT_TOKEN_CONF, spark_connect_token)
            else:
                os.environ[SPARK_CONNECT_TOKEN_ENV] = spark_connect_token
    for k, v in (extra_conf or {}).items():
        if k == "spark.driver.extraJavaOptions":  # added to ours, not instead of them
            v = f"{java_opts} {v}"
        b = b.config(k, v)
    # the installation's Spark home without PySpark's sources zip (server/runtime/spark_home.py),
    # unless the user names a Spark home of their own
    home = None if os.environ.get(spark_home.ENV) else spark_home.ensure()
    if home:
        os.environ[spark_home.ENV] = home
    try:
        _launch_jvm_in_own_session(b)
        spark = b.getOrCreate()
    finally:
        # the JVM read it at its launch; gone from this process, it reaches no later subprocess (a
        # PySpark Connect client started from here would take it for its own token)
        os.environ.pop(SPARK_CONNECT_TOKEN_ENV, None)
        if home:
            os.environ.pop(spark_home.ENV, None)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(IoxKafkaDataSource)
    from iox_spark.chunk_store.parquet_source import IoxParquetDataSource

    spark.dataSource.register(IoxParquetDataSource)
    return spark


def _launch_jvm_in_own_session(builder) -> None:
    """Starts the Spark JVM (PySpark's gateway) in a session of its own, unless this process
    already has one. On Linux with autogroup scheduling a session is a scheduling group: a JVM
    in the server's session would compete with the broker and other processes as one group with
    the server, taking CPU from the write path. In its own session it is a group of its own, of
    the same weight. The JVM still exits with the server: it stops on end of file on its stdin,
    a pipe from this process."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if _jvm_running() or os.name != "posix":
        return
    conf = SparkConf()
    for k, v in builder._options.items():
        conf.set(k, str(v))
    SparkContext._gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
    SparkContext._jvm = SparkContext._gateway.jvm


def use_query_pool(spark) -> None:
    """Runs the calling thread's Spark jobs in the QUERY_POOL fair-scheduler pool. Called by the
    query engine on the thread of each query (PySpark pins a Python thread to its own JVM thread,
    so the property stays with that thread's jobs)."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", QUERY_POOL)


def lower_spark_priority(spark, nice: int) -> int:
    """Sets the nice value of every thread of the Spark application's JVM; returns how many.

    Called by the server right after it started its Spark application (driver). Threads and
    processes the JVM creates later (executor threads, Python workers) inherit the value, so
    where threads of the server and the JVM compete by nice value (no autogroup scheduling:
    containers, systemd services) the consume path, lifecycle and query execution run below the
    server's own threads (gRPC handlers, the Kafka producer). The session the JVM runs in keeps
    its autogroup weight: a lower one yields Spark to every busy process of the host, and Spark
    needs CPU at once to start a Python worker (it must connect back within 10 s, or the
    write-buffer stream or the query that asked for it fails). Linux only; elsewhere, or
    without a JVM process of our own, nothing changes (returns 0).
    """
    gw = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gw, "proc", None)
    pid = getattr(proc, "pid", None)
    tasks = f"/proc/{pid}/task"
    if not nice or pid is None or not os.path.isdir(tasks):
        return 0
    done: set = set()
    for _ in range(2):  # a thread started during the first pass by a thread not yet lowered
        for tid in os.listdir(tasks):
            if tid in done:
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                done.add(tid)
            except (ProcessLookupError, PermissionError):
                pass
    return len(done)
