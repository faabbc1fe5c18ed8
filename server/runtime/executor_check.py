"""The executors run the server's code: checked once at start on a cluster.

Invariant: a server on a non-local Spark master (chunk_store/cluster.py) serves only
after one executor has imported the packages its tasks run (`catalog`,
`lifecycle`, the streaming source, the Python worker daemon) under the same
Python minor version and pyarrow version as the driver; a mismatch stops the
start with `ExecutorEnvironmentMismatch` naming what differs. How the code gets
there is the deployment's job (docs/OPERATIONS.md: every Spark worker runs the
same installation, at the same interpreter path, as the server; PySpark starts
executors' Python workers with the driver's `PYSPARK_PYTHON`).

When no executor is registered within EXECUTOR_CHECK_TIMEOUT_S the check is
skipped with a warning (Spark queues the work until one registers; a worker
joining later is not checked). Runs on the driver, once, from `IoxServer.start`.
"""
from __future__ import annotations

import logging
import threading

from iox_spark.server.errors import ServerError

__all__ = ["EXECUTOR_CHECK_TIMEOUT_S", "ExecutorEnvironmentMismatch", "environment_of_this_process",
           "check_executor_environment", "compare_environments"]

#: how long the start waits for an executor to answer the check
EXECUTOR_CHECK_TIMEOUT_S = 60.0
#: modules the executors' Python workers import for the server's tasks
_TASK_MODULES = ("iox_spark.catalog.object_store", "iox_spark.chunk_store.ipc_segments", "iox_spark.chunk_store.arrow_merge", "iox_spark.chunk_store.parquet_source",
                 "iox_spark.server.write_buffer.kafka_source", "iox_spark.server.runtime.spark_worker_daemon")
_JOB_GROUP = "iox-executor-check"

log = logging.getLogger(__name__)


class ExecutorEnvironmentMismatch(ServerError):
    """An executor cannot run the server's tasks: `differences` says what differs from the driver."""

    def __init__(self, master: str, differences: list):
        self.master = master
        self.differences = list(differences)
        super().__init__(f"the executors of Spark master {master!r} cannot run the server's tasks: "
                         f"{'; '.join(self.differences)}. Every Spark worker must run the same installation of the "
                         f"server, at the same interpreter path, as the server (see docs/OPERATIONS.md)")


def environment_of_this_process() -> dict:
    """{"python": "3.11", "pyarrow": version, "missing": {module: error}} of this process. Picklable;
    runs on the driver and, as the check's task, on an executor."""
    import importlib
    import sys

    missing = {}
    for name in _TASK_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # ImportError, or a module failing at import
            missing[name] = f"{type(e).__name__}: {e}"
    try:
        import pyarrow

        pyarrow_version = pyarrow.__version__
    except ImportError:
        pyarrow_version = None
    return {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "pyarrow": pyarrow_version,
            "missing": missing}


def compare_environments(driver: dict, executor: dict) -> list:
    """What differs between the driver's and an executor's `environment_of_this_process`
    (empty: none). Pure."""
    out = [f"module {m} does not import on the executor ({err})" for m, err in sorted(executor["missing"].items())]
    for key in ("python", "pyarrow"):
        if driver.get(key) != executor.get(key):
            out.append(f"{key} {executor.get(key)} on the executor, {driver.get(key)} on the driver")
    return out


def _probe(_):
    return [environment_of_this_process()]


def check_executor_environment(spark, master: str, timeout_s: float = EXECUTOR_CHECK_TIMEOUT_S) -> bool:
    """Runs the check (one task) and raises ExecutorEnvironmentMismatch on a difference; False when
    no executor answered within `timeout_s` (logged, the job is cancelled), True when one matched."""
    sc = spark.sparkContext
    result: dict = {}

    def run():
        sc.setJobGroup(_JOB_GROUP, "executor environment check", interruptOnCancel=True)
        try:
            result["env"] = sc.parallelize([0], 1).mapPartitions(_probe).collect()[0]
        except Exception as e:  # the task failed: an executor that cannot even start the worker
            result["error"] = e

    t = threading.Thread(target=run, name="executor-check", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        sc.cancelJobGroup(_JOB_GROUP)
        log.warning("no executor of Spark master %s answered within %.0f s: the executors' environment is not "
                    "checked; work waits until executors register", master, timeout_s)
        return False
    if "error" in result:
        raise ExecutorEnvironmentMismatch(master, [f"a task failed: {str(result['error']).splitlines()[0][:500]}"])
    differences = compare_environments(environment_of_this_process(), result["env"])
    if differences:
        raise ExecutorEnvironmentMismatch(master, differences)
    log.info("executors of Spark master %s run the server's code (python %s, pyarrow %s)", master,
             result["env"]["python"], result["env"]["pyarrow"])
    return True
