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


_CRASHED = "[PYTHON_EXCEPTION] Python worker exited unexpectedly (crashed). Consider setting ..."


def test_a_dead_python_worker_is_recognised_also_when_chained():
    from iox_spark.server.consume.ingest import worker_crashed

    assert worker_crashed(RuntimeError(_CRASHED))
    try:
        try:
            raise RuntimeError(_CRASHED)
        except RuntimeError as inner:
            raise ValueError("micro-batch failed") from inner
    except ValueError as outer:
        assert worker_crashed(outer) and not executor_lost(outer)
    assert not worker_crashed(ValueError("column type conflict"))


def _isolation(monkeypatch, failures: dict):
    """An Ingestor over a catalog with database `d` (2 Kafka partitions) whose `_apply` raises, for
    each attempt on messages of Kafka partition kp, the next exception of `failures[kp]` (None:
    applies); returns (ingestor, database, attempts as [(kp, offsets)])."""
    import iox_spark.server.consume.ingest as ingest
    from iox_spark.catalog.catalog import Catalog

    catalog = Catalog()
    db = catalog.ensure_database("d", "iox.d", 2)
    ing = ingest.Ingestor(None, catalog, 2)
    monkeypatch.setattr(ingest, "_ranges_condition", lambda msgs, F: None)
    monkeypatch.setattr(ingest, "INFRASTRUCTURE_BACKOFF_S", 0.0)
    attempts = []

    def apply(raw, msgs, accepted, batch_id, t0, F):
        kps = {m["kp"] for m in msgs}
        attempts.append((sorted(kps), [m["offset"] for m in msgs]))
        for kp in kps:
            e = failures[kp].pop(0) if failures[kp] else None
            if e is not None:
                raise e

    monkeypatch.setattr(ing, "_apply", apply)
    return ing, db, attempts


class _Raw:
    def filter(self, _cond):
        return self


def test_a_python_worker_killed_while_looking_for_a_poisoned_message_blames_none(monkeypatch):
    """The whole batch failed; applied one Kafka partition at a time, partition 0's first attempt
    meets a dead Python worker (killed from outside) and partition 1 applies: partition 0 is tried
    again, applies, and no message is set aside."""
    ing, db, attempts = _isolation(monkeypatch, {0: [RuntimeError(_CRASHED)], 1: []})
    meta = [{"topic": "iox.d", "kp": kp, "offset": off, "tbl": "t", "kind": "write"} for kp in (0, 1) for off in (5, 6)]
    ing._isolate(_Raw(), meta, set(), 7, 0.0, RuntimeError(_CRASHED), None)
    assert attempts == [([0], [5, 6]), ([0], [5, 6]), ([1], [5, 6])]
    assert db.poisoned == [] and ing._suspects == {}


def test_a_message_that_crashes_the_python_worker_on_its_own_is_set_aside(monkeypatch):
    """Message 6 of partition 0 crashes every worker it reaches; partition 1 applies: message 6,
    having crashed a worker twice on its own, is set aside, message 5 applies."""
    crashes = [RuntimeError(_CRASHED) for _ in range(6)]
    ing, db, attempts = _isolation(monkeypatch, {0: [], 1: []})
    import iox_spark.server.consume.ingest as ingest

    def apply(raw, msgs, accepted, batch_id, t0, F):
        attempts.append(([m["kp"] for m in msgs], [m["offset"] for m in msgs]))
        if any(m["kp"] == 0 and m["offset"] == 6 for m in msgs):
            raise crashes.pop()

    monkeypatch.setattr(ing, "_apply", apply)
    assert ingest.INFRASTRUCTURE_BACKOFF_S == 0.0
    meta = [{"topic": "iox.d", "kp": kp, "offset": off, "tbl": "t", "kind": "write"} for kp in (0, 1) for off in (5, 6)]
    ing._isolate(_Raw(), meta, set(), 7, 0.0, RuntimeError(_CRASHED), None)
    assert [(r.partition, r.offset) for r in db.poisoned] == [(0, 6)]
    assert attempts.count(([0], [6])) >= 2 and ([0], [5]) in attempts
