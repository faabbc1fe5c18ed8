"""Kafka's end offsets of each database's topic, as status and /metrics report them.

Invariant: an answer is never below what this server saw acknowledged or applied (both are
below the end), and never waits on Kafka for longer than KAFKA_ENDS_WAIT_S: a read older than
KAFKA_ENDS_MAX_AGE_S starts a new one in the background (one per topic at a time) while the
last one answers; only a topic never read waits, for its first read. A failed read keeps the
last one. An unreachable broker thus never holds status or a scrape up.

Who calls it: `Visibility.watermarks` (server/query/visibility.py: status, /metrics; driver threads); the reads run in
threads of their own. `forget` drops a topic whose database continues in a new epoch.
"""
from __future__ import annotations

import logging
import threading
import time

__all__ = ["KafkaEnds", "KAFKA_ENDS_MAX_AGE_S", "KAFKA_ENDS_WAIT_S"]

#: How long Kafka's end offsets read for status and /metrics (`high_watermark`, lag) are reused: each read
#: asks the broker, and clients poll status
KAFKA_ENDS_MAX_AGE_S = 1.0
#: How long status and /metrics wait for the first read of a topic's Kafka ends (later reads go on in the
#: background while they answer with the last one: an unreachable broker never holds status up for longer)
KAFKA_ENDS_WAIT_S = 1.0

log = logging.getLogger(__name__)


class KafkaEnds:
    """`write_buffer`: the WriteBuffer (`partition_bounds`, `acked_of`); `catalog`: the Catalog
    whose applied offsets raise an answer."""

    def __init__(self, write_buffer, catalog, max_age_s: float = KAFKA_ENDS_MAX_AGE_S,
                 wait_s: float = KAFKA_ENDS_WAIT_S):
        self._write_buffer = write_buffer
        self._catalog = catalog
        self._max_age_s = max_age_s
        self._wait_s = wait_s
        self._lock = threading.Lock()
        #: topic -> (time.monotonic() of the read, {kafka partition: end offset})
        self._read: dict = {}
        #: topic -> (time.monotonic() it started, threading.Event set when done) of the read in progress
        self._reading: dict = {}

    def ends(self, db) -> dict | None:
        """{kp: Kafka's end offset} of `db`'s topic as last read, raised to what this server saw
        acknowledged and applied since; None when never read."""
        topic = db.topic
        with self._lock:
            now = time.monotonic()
            read = self._read.get(topic)
            reading = None
            if read is None or now - read[0] > self._max_age_s:
                reading = self._reading.get(topic)
                if reading is None:
                    reading = self._reading[topic] = (now, threading.Event())
                    threading.Thread(target=self._read_ends, args=(db, reading[1]), daemon=True,
                                     name=f"kafka-ends-{db.name}").start()
        if reading is not None and read is None:
            reading[1].wait(max(0.0, self._wait_s - (time.monotonic() - reading[0])))
            with self._lock:
                read = self._read.get(topic)
        if read is None:
            return None
        ends = dict(read[1])
        acked = self._write_buffer.acked_of(topic)
        applied = db.applied_offsets()
        for kp in ends:
            ends[kp] = max(ends[kp], acked.get(kp, -1) + 1, applied.get(kp, -1) + 1)
        return ends

    def forget(self, topic: str) -> None:
        """The last read of `topic` goes (its database continues in a new write-buffer epoch)."""
        with self._lock:
            self._read.pop(topic, None)

    def _read_ends(self, db, done: threading.Event) -> None:
        try:
            t = time.monotonic()
            ends = {kp: end for kp, (_lo, end) in
                    self._write_buffer.partition_bounds(db.topic, db.kafka_partitions).items()}
            with self._lock:
                self._read[db.topic] = (t, ends)
        except Exception as e:  # KafkaException, or the write buffer closing
            log.debug("watermarks of %s: Kafka's ends not read: %s", db.name, e)
        finally:
            with self._lock:
                self._reading.pop(db.topic, None)
            done.set()
