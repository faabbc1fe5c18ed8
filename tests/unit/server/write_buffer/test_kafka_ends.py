"""server/write_buffer/kafka_ends.py: Kafka's ends for status, never below what was acknowledged
or applied, never waiting on a broker that does not answer beyond the first read's wait."""
from __future__ import annotations

import threading

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.write_buffer.kafka_ends import KafkaEnds
from tests.waiting import wait_for


class _Buffer:
    """A write buffer whose `partition_bounds` answers `ends` once `answer` is set (or raises `fail`)."""

    def __init__(self, ends: dict):
        self.ends = ends
        self.acked: dict = {}
        self.answer = threading.Event()
        self.answer.set()
        self.fail: Exception | None = None
        self.calls = 0  # reads started
        self.reads = 0  # reads answered or failed

    def partition_bounds(self, topic, n):
        self.calls += 1
        self.answer.wait(30)
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return {kp: (0, end) for kp, end in self.ends.items()}

    def acked_of(self, topic):
        return dict(self.acked)


def _db():
    cat = Catalog()
    return cat, cat.ensure_database("d", "iox.d", 2)


def test_the_first_read_is_awaited_and_raised_to_what_was_acknowledged_and_applied():
    cat, db = _db()
    wb = _Buffer({0: 5, 1: 3})
    wb.acked = {1: 7}  # acknowledged here after Kafka's end was read
    cat.advance_applied(db, {0: 9})
    assert KafkaEnds(wb, cat).ends(db) == {0: 10, 1: 8}


def test_a_stale_read_answers_at_once_while_the_next_one_runs_and_a_failed_read_keeps_the_last():
    cat, db = _db()
    wb = _Buffer({0: 5, 1: 3})
    ends = KafkaEnds(wb, cat, max_age_s=0.0, wait_s=5.0)
    assert ends.ends(db) == {0: 5, 1: 3}
    wb.answer.clear()  # the broker stops answering
    wb.ends = {0: 6, 1: 4}
    assert ends.ends(db) == {0: 5, 1: 3}  # the last read, not waiting for the one it started
    assert ends.ends(db) == {0: 5, 1: 3}
    wait_for(lambda: wb.calls >= 2, timeout_s=10, what="the background read to start")
    assert wb.calls == 2  # one read at a time: the first, and the one in the background
    wb.answer.set()
    wait_for(lambda: ends.ends(db) == {0: 6, 1: 4}, timeout_s=10, what="the background read's ends")
    wb.fail = RuntimeError("broker away")
    before = wb.reads
    wait_for(lambda: ends.ends(db) == {0: 6, 1: 4} and wb.reads > before + 1, timeout_s=10,
             what="reads that fail, answered by the last one read")


def test_a_topic_never_read_from_a_broker_that_does_not_answer_is_unknown_after_the_wait():
    cat, db = _db()
    wb = _Buffer({0: 5})
    wb.answer.clear()
    assert KafkaEnds(wb, cat, wait_s=0.05).ends(db) is None
    wb.answer.set()


def test_a_forgotten_topic_is_read_again():
    cat, db = _db()
    wb = _Buffer({0: 5, 1: 3})
    ends = KafkaEnds(wb, cat, max_age_s=3600.0)
    assert ends.ends(db) == {0: 5, 1: 3} and wb.reads == 1
    wb.ends = {0: 0, 1: 0}  # a new epoch's topic
    assert ends.ends(db) == {0: 5, 1: 3} and wb.reads == 1  # fresh enough: not read again
    ends.forget("iox.d")
    assert ends.ends(db) == {0: 0, 1: 0} and wb.reads == 2
