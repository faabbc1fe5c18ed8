"""Column types of the writes replay will apply, known before the server takes writes.

When it runs: once, in `IoxServer.start`, after `recover` planned the replay and
before the router serves its first request; it stops when every Kafka partition's
replay range was read (or fails the start when Kafka stalls).

Invariant: when the server starts taking writes, every table's schema holds the
column types of every write Kafka holds in the replay range, not only of what is
persisted, so a write that conflicts with a type known only to the write buffer
is rejected at once instead of landing next to it. Only the message headers
matter (iox-kind, iox-table, iox-schema); payloads are not decoded. Runs on the
driver.
"""
from __future__ import annotations

import json
import logging
import time

from iox_spark.catalog.catalog import Database
from iox_spark.catalog.schema import Column, ColumnTypeConflict
from iox_spark.catalog.transactions import PART

# READ_STALL_TIMEOUT_S: how long Kafka may deliver nothing before the start fails (as a micro-batch read)
from iox_spark.server.write_buffer.kafka_source import LIST_FETCH_WAIT_MS, READ_STALL_TIMEOUT_S, consumer_positions, reader_consumer
from iox_spark.server.write_buffer.wire_format import header_problem, header_text
from iox_spark.server.errors import ServerError

__all__ = ["load_replay_schemas", "ReplaySchemasStalled"]

log = logging.getLogger(__name__)

#: How long one `consume` call waits for the next message when the consumer holds none (as
#: `kafka_source.read`: ranges with gaps hold fewer messages than offsets, so no call waits for more).
_CONSUME_TIMEOUT_S = 0.05


class ReplaySchemasStalled(ServerError):
    def __init__(self, topic: str, partition: int, expected: int, actual: int):
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.actual = actual
        super().__init__(f"{topic}[{partition}]: reading the replay range for column types stalled at offset "
                         f"{actual}, expected to reach {expected} (Kafka unavailable?)")


def load_replay_schemas(bootstrap: str, db: Database, start_offsets: dict[int, int],
                        until_inclusive: dict[int, int]) -> int:
    """Merges the schema of every write (and transaction part) in [start, until] of each Kafka
    partition into ``db.schemas``, in offset order; returns how many messages were read.

    An offset the broker returns no message for is a gap (a transaction control record, a record
    removed by compaction or retention), as in `kafka_source.read`: a partition's range is read
    once the broker went past `until` (a message beyond it, or the consumer's position,
    `consumer_positions`), never because nothing arrived. Raises ReplaySchemasStalled when a
    partition makes no progress for READ_STALL_TIMEOUT_S. A type conflicting with one already
    known is logged and skipped, as the consumer does.
    """
    from confluent_kafka import TopicPartition

    todo = {kp: (start_offsets.get(kp, 0), hi) for kp, hi in until_inclusive.items()
            if hi >= start_offsets.get(kp, 0)}
    if not todo:
        return 0
    # a new consumer (no position before this assignment's records) whose fetches may list a long partition
    c = reader_consumer(bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})
    read = 0
    try:
        c.assign([TopicPartition(db.topic, kp, lo) for kp, (lo, _hi) in sorted(todo.items())])
        next_offset = {kp: lo for kp, (lo, _hi) in todo.items()}  # every offset below it: read, or a gap
        last_progress = time.monotonic()
        wait = False  # the last call brought nothing: wait for the next message
        while left := sorted(kp for kp, (_lo, hi) in todo.items() if next_offset[kp] <= hi):
            # what the consumer holds, no more than the ranges can still hold, without waiting; after
            # a call that brought nothing, one message (a range with gaps holds fewer messages than
            # offsets, and a control record ends no wait)
            msgs = (c.consume(1, timeout=_CONSUME_TIMEOUT_S) if wait
                    else c.consume(min(1000, sum(todo[kp][1] - next_offset[kp] + 1 for kp in left)), timeout=0))
            progress = False
            for m in msgs:
                if m.error() is not None or m.partition() not in todo:
                    continue
                kp, off = m.partition(), m.offset()
                if off < next_offset[kp] or next_offset[kp] > todo[kp][1]:
                    continue
                progress = True
                if off > todo[kp][1]:
                    next_offset[kp] = todo[kp][1] + 1  # the broker is past the range: the rest are gaps
                    continue
                next_offset[kp] = off + 1  # offsets skipped on the way are gaps
                read += 1
                h = dict(m.headers() or [])
                if h.get("iox-kind") not in (b"write", PART.encode()) or "iox-schema" not in h:
                    continue
                text = [header_text(h, f"iox-{k}") for k in ("format", "kind", "table", "schema", "days", "txn",
                                                             "txn-info")]
                if header_problem(*text) is not None:
                    continue  # the consumer skips it too (and logs why)
                table, cols = text[2], [Column(*c) for c in json.loads(text[3])]
                try:
                    db.schemas.merge(table, cols)
                except ColumnTypeConflict as e:
                    log.error("write buffer holds a conflicting type (%s) at %s[%d]@%d", e, db.topic, kp, off)
            # every message below a position was returned by the calls above: the rest are control
            # records or gaps
            for kp, passed in consumer_positions(c, db.topic, left).items():
                if passed > next_offset[kp]:
                    next_offset[kp] = min(passed, todo[kp][1] + 1)
                    progress = True
            wait = not progress
            if progress:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                kp = next(k for k, (_lo, hi) in todo.items() if next_offset[k] <= hi)
                raise ReplaySchemasStalled(db.topic, kp, todo[kp][1], next_offset[kp])
    finally:
        c.close()
    log.info("database %s: column types of %d write-buffer message(s) to replay loaded", db.name, read)
    return read
