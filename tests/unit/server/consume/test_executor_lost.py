"""A micro-batch that failed because an executor was lost is retried whole, never searched for a
poisoned message (server/consume/ingest.py `_executor_lost`)."""
from __future__ import annotations

from server.consume.ingest import _executor_lost


def test_lost_checkpoint_blocks_and_lost_executors_are_recognised_also_when_chained():
    assert _executor_lost(RuntimeError("[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_107_0 not found!"))
    assert _executor_lost(RuntimeError("Job aborted: ExecutorLostFailure (executor 0 exited caused by one of the "
                                       "running tasks)"))
    try:
        try:
            raise RuntimeError("Checkpoint block rdd_1_0 not found [CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND]")
        except RuntimeError as inner:
            raise ValueError("micro-batch failed") from inner
    except ValueError as outer:
        assert _executor_lost(outer)


def test_other_failures_are_not():
    assert not _executor_lost(ValueError("column type conflict"))
    e = ValueError("a")
    e.__context__ = e  # a cycle ends the walk
    assert not _executor_lost(e)
