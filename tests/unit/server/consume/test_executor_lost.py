"""A micro-batch that failed because an executor was lost is retried whole, never searched for a
poisoned message (server/consume/ingest.py `executor_lost`)."""
from __future__ import annotations

from iox_spark.server.consume.ingest import executor_lost


def test_lost_checkpoint_blocks_and_lost_executors_are_recognised_also_when_chained():
    assert executor_lost(RuntimeError("[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_107_0 not found!"))
    assert executor_lost(RuntimeError("Job aborted: ExecutorLostFailure (executor 0 exited caused by one of the "
                                       "running tasks)"))
    try:
        try:
            raise RuntimeError("Checkpoint block rdd_1_0 not found [CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND]")
        except RuntimeError as inner:
            raise ValueError("micro-batch failed") from inner
    except ValueError as outer:
        assert executor_lost(outer)


def test_other_failures_are_not():
    assert not executor_lost(ValueError("column type conflict"))
    e = ValueError("a")
    e.__context__ = e  # a cycle ends the walk
    assert not executor_lost(e)


def test_infrastructure_failures_are_retried_after_a_doubling_wait():
    from iox_spark.server.consume.ingest import infrastructure_backoff_s

    assert [infrastructure_backoff_s(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_an_executor_lost_while_looking_for_a_poisoned_message_blames_none(monkeypatch):
    """The whole batch failed; while its messages are applied one partition at a time, an executor
    is lost: the search stops, the loss is raised (the stream retries the batch after a wait), and
    no message is set aside."""
    import pytest

    import iox_spark.server.consume.ingest as ingest
    from iox_spark.catalog.catalog import Catalog

    catalog = Catalog()
    db = catalog.ensure_database("d", "iox.d", 2)
    ing = ingest.Ingestor(None, catalog, 2)
    monkeypatch.setattr(ingest, "_ranges_condition", lambda msgs, F: None)
    lost = RuntimeError("Job aborted: ExecutorLostFailure (executor 1 exited)")
    calls = []

    def apply(raw, msgs, accepted, batch_id, t0, F):
        calls.append([m["offset"] for m in msgs])
        raise lost if len(calls) == 1 else ValueError("a bad message")

    monkeypatch.setattr(ing, "_apply", apply)

    class Raw:
        def filter(self, _cond):
            return self

    meta = [{"topic": "iox.d", "kp": kp, "offset": off, "tbl": "t", "kind": "write"} for kp in (0, 1) for off in (5, 6)]
    with pytest.raises(RuntimeError, match="ExecutorLostFailure"):
        ing._isolate(Raw(), meta, set(), 7, 0.0, ValueError("the whole batch failed"), None)
    assert len(calls) == 1 and db.poisoned == [] and ing._suspects == {}
