"""Tests of server/runtime/executor_check.py's comparison of the driver's and an executor's environment."""
from __future__ import annotations

from iox_spark.server.runtime.executor_check import (ExecutorEnvironmentMismatch, compare_environments,
                                           environment_of_this_process)


def test_this_process_imports_every_task_module():
    env = environment_of_this_process()
    assert env["missing"] == {} and env["python"].count(".") == 1 and env["pyarrow"]
    assert compare_environments(env, env) == []


def test_every_difference_is_named():
    driver = {"python": "3.11", "pyarrow": "26.0.1", "missing": {}}
    executor = {"python": "3.10", "pyarrow": "15.0.0", "missing": {"iox_spark.chunk_store.ipc_segments": "ModuleNotFoundError: x"}}
    diffs = compare_environments(driver, executor)
    assert diffs == ["module iox_spark.chunk_store.ipc_segments does not import on the executor (ModuleNotFoundError: x)",
                     "python 3.10 on the executor, 3.11 on the driver",
                     "pyarrow 15.0.0 on the executor, 26.0.1 on the driver"]
    e = ExecutorEnvironmentMismatch("spark://h:7077", diffs)
    assert e.differences == diffs and "spark://h:7077" in str(e) and "docs/OPERATIONS.md" in str(e)
