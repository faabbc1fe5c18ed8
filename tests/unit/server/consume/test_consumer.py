"""The write-buffer consumer's restarts (server/consume/consumer.py) when a micro-batch outlives
its stream's stop: no new query starts while it applies, `restart` gives up after its bound
with nothing changed, and a batch of a stopped query that begins after a new query started
applies nothing. Spark's streaming query is a stand-in (the locks and generations are the logic
under test); the ingestor is the real one up to its read of the batch, replaced by a recorder."""
from __future__ import annotations

import threading

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.consume import consumer as consumer_mod
from iox_spark.server.consume.consumer import WriteBufferConsumer
from iox_spark.server.consume.ingest import Ingestor
from iox_spark.server.errors import StreamRestartTimedOut
from tests.waiting import wait_for


class _Query:
    """A started streaming query: `batch(df, id)` runs its foreachBatch function."""

    def __init__(self, fn):
        self.fn, self.isActive = fn, True

    def stop(self):
        self.isActive = False

    def exception(self):
        return None

    def batch(self, batch_id=0):
        self.fn(_Df(), batch_id)


class _Stream:
    """spark.readStream...start() and spark.readStream... .writeStream...start(): every step returns itself."""

    def __init__(self, started: list):
        self.started, self.fn = started, None

    def __getattr__(self, name):
        return lambda *a, **k: self

    @property
    def readStream(self):
        return self

    @property
    def writeStream(self):
        return self

    def foreachBatch(self, fn):
        self.fn = fn
        return self

    def start(self):
        q = _Query(self.fn)
        self.started.append(q)
        return q


class _Df:
    def localCheckpoint(self, eager=True):
        return self


@pytest.fixture
def parts(monkeypatch, tmp_path):
    """(consumer, ingestor, started queries, applied batch generations)"""
    started, applied = [], []
    ingestor = Ingestor(spark=None, catalog=Catalog(), kafka_partitions=1)
    monkeypatch.setattr("iox_spark.server.consume.ingest.release_df", lambda df: None)

    # past the generation checks, the batch's read and apply (Spark's) record the generation applying
    monkeypatch.setattr(Ingestor, "_apply_read", lambda self, raw, batch_id, t0: applied.append(self.stream_generation))
    consumer = WriteBufferConsumer(_Stream(started), ingestor.catalog, ingestor, bootstrap="b",
                                   scratch_dir=str(tmp_path), trigger_interval_ms=100,
                                   max_messages_per_partition=10, pause_file="", restart_batch_wait_s=0.3)
    monkeypatch.setattr(consumer_mod, "WATCHDOG_INTERVAL_S", 0.05)
    yield consumer, ingestor, started, applied
    consumer._stopping.set()


def test_a_restart_gives_up_with_nothing_changed_while_a_batch_of_the_stopped_stream_applies(parts):
    consumer, ingestor, started, applied = parts
    consumer.start({})
    assert len(started) == 1
    called = []
    ingestor.batch_lock.acquire()  # a batch of the first query applying past the stop
    try:
        with pytest.raises(StreamRestartTimedOut) as e:
            consumer.restart(lambda: called.append(1))
        assert e.value.waited_s >= 0.3
        assert called == []
        assert len(started) == 1 and not started[0].isActive
        # the watchdog does not start a query while that batch applies
        threading.Event().wait(0.3)
        assert len(started) == 1
    finally:
        ingestor.batch_lock.release()
    # once it ended, the watchdog starts the next query, of a new generation
    wait_for(lambda: len(started) == 2, 10, "the watchdog's next query", poll_s=0.02)
    assert started[1].isActive
    started[1].batch()
    assert applied == [ingestor.stream_generation]
    assert not ingestor.quiescing.is_set()


def test_a_batch_of_a_stopped_query_that_begins_after_a_restart_applies_nothing(parts):
    consumer, ingestor, started, applied = parts
    consumer.start({})
    first = started[0]
    first.batch(1)
    assert consumer.restart(lambda: "changed") == "changed"
    assert len(started) == 2
    first.batch(2)  # the stopped query's late batch
    assert applied == [1]
    started[1].batch(3)
    assert applied == [1, ingestor.stream_generation]


def test_a_batch_waiting_for_the_lock_through_a_restart_applies_nothing(parts):
    consumer, ingestor, started, applied = parts
    consumer.start({})
    first = started[0]
    ingestor.batch_lock.acquire()
    late = threading.Thread(target=first.batch, args=(7,))
    late.start()  # passed the first generation check, waits for the lock
    threading.Event().wait(0.1)
    restarted = threading.Thread(target=consumer.restart)
    restarted.start()
    # the stream stopped; the restart waits for the lock
    wait_for(lambda: ingestor.stream_generation == 2, 10, "the restart's stop", poll_s=0.02)
    ingestor.batch_lock.release()
    late.join(5)
    restarted.join(5)
    assert not late.is_alive() and not restarted.is_alive()
    assert len(started) == 2
    assert applied == []  # whichever got the lock first, the restart's stop had made the late batch stale
    started[1].batch(8)
    assert applied == [ingestor.stream_generation]
