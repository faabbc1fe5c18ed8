"""What the Spark application runs on: a local master or a cluster, and the task slots it offers.

Invariant: a local master (`local`, `local[N]`, `local[*]`, `local[N,F]`) keeps
everything in one process and one host, so executors may read the driver's disk
and blocks live as long as the driver; any other master (`spark://`, `yarn`,
`k8s://`, ...) runs executors in processes of their own, possibly on other
hosts, that may be lost at any time. Parallelism of the work the lifecycle and
the query engine plan follows the task slots the cluster offers
(`SparkContext.defaultParallelism`: the cores of a local master, the total
cores of the registered executors on a cluster, at least 2), never a constant.

Runs on the driver; the pure functions are called with plain values, the
others read the live SparkContext (a cheap JVM call) each time, so executors
that join or leave change the next plan.
"""
from __future__ import annotations

__all__ = ["is_local_master", "master_of", "runs_local", "task_slots", "cores_per_executor", "slots_per_executor",
           "parts_for", "MIN_TASK_SLOTS"]

#: the fewest task slots planned for: Spark's own floor of defaultParallelism on a cluster
MIN_TASK_SLOTS = 2



def is_local_master(master: str) -> bool:
    """Whether `master` is Spark's local mode (driver and executor in one JVM on this host). Pure."""
    m = (master or "").strip().lower()
    return m == "local" or m.startswith("local[")


def master_of(spark) -> str:
    """The master URL of the running application of `spark` (a SparkSession)."""
    sc = spark.sparkContext
    # read once per context (a JVM call): it never changes while the context lives
    master = getattr(sc, "_iox_master", None)
    if master is None:
        master = sc._iox_master = sc.master
    return master


def runs_local(spark) -> bool:
    """Whether `spark`'s application runs in local mode (`is_local_master` of its master)."""
    return is_local_master(master_of(spark))


def task_slots(spark) -> int:
    """Task slots the application offers now: `defaultParallelism` (at least MIN_TASK_SLOTS). In
    local mode it never changes and is read once."""
    sc = spark.sparkContext
    if runs_local(spark):
        slots = getattr(sc, "_iox_local_slots", None)
        if slots is None:
            slots = sc._iox_local_slots = max(MIN_TASK_SLOTS, int(sc.defaultParallelism))
        return slots
    return max(MIN_TASK_SLOTS, int(sc.defaultParallelism))


def slots_per_executor(total_slots: int, executors: int, executor_cores: int | None) -> int:
    """Cores one task may use beside its own on its executor's host (threads inside one task):
    `executor_cores` when configured (spark.executor.cores), else the slots spread over the
    `executors` (local mode: one executor holding every slot). At least 1. Pure."""
    if executor_cores:
        return max(1, int(executor_cores))
    return max(1, int(total_slots) // max(1, int(executors)))


def cores_per_executor(spark) -> int:
    """`slots_per_executor` of the running application (local mode: every task slot)."""
    if runs_local(spark):
        return task_slots(spark)
    sc = spark.sparkContext
    conf = sc.getConf().get("spark.executor.cores")
    executors = max(1, sc._jsc.sc().getExecutorIds().size())
    return slots_per_executor(task_slots(spark), executors, int(conf) if conf else None)


def parts_for(slots: int, cap_exclusive: int | None = None) -> int:
    """How many tasks side by side for `slots` task slots: `slots` (at least 1), below
    `cap_exclusive` when given (e.g. no more parts than inputs + 1). Pure."""
    n = max(1, int(slots))
    if cap_exclusive is not None:
        n = max(1, min(n, cap_exclusive - 1))
    return n
