"""Watermarks of a database per Kafka partition: how far its write buffer is applied, visible,
persisted, written, and how far behind the consumer is.

Per Kafka partition (all inclusive offsets, -1 = none):

- `applied_hi_inclusive`: every offset up to it is in the in-memory catalog. It advances only
  without gaps: a micro-batch advances it once the whole batch is applied (server/consume/ingest.py),
  a failed one leaves it where it was, and a held poisoned message keeps it before that message.
- `visible_hi_inclusive`: every offset up to it is queryable (applied, or read from the write
  buffer's tail, server/query/tail.py); >= applied.
- `persisted_hi_inclusive`: every offset up to it needs no replay: a restart would start reading
  the partition after it. It is what the preserved catalog's last committed database checkpoint
  of the current write-buffer epoch says (its min unpersisted offset - 1, or its max seen offset
  when nothing of it is unpersisted), as recovery's replay plan reads it (server/consume/recovery.py);
  never above `applied_hi_inclusive`.
- `high_watermark`: Kafka's end of the partition (exclusive: the next message's offset) as last read
  (server/write_buffer/kafka_ends.py), -1 while unknown.
- `lag_messages`: high_watermark - 1 - applied (>= 0; 0 when the end is unknown);
  `lag_bytes`: an ESTIMATE, lag_messages times the mean size of the messages this server produced
  to the partition since it started (`MessageSizes`; 0 when it produced none).

Pure functions plus one thread-safe recorder; driver side (status, /metrics, queries).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["PartitionWatermarks", "MessageSizes", "persisted_hi_inclusive", "partition_watermarks"]


@dataclass(frozen=True)
class PartitionWatermarks:
    partition: int
    applied_hi_inclusive: int
    visible_hi_inclusive: int
    persisted_hi_inclusive: int
    high_watermark: int
    lag_messages: int
    lag_bytes: int


def persisted_hi_inclusive(database_checkpoint, epoch: int, applied: dict) -> dict:
    """{kp: persisted_hi_inclusive} for the Kafka partitions of `applied` ({kp: applied_hi_inclusive}),
    from the preserved catalog's last database checkpoint (a RecordDatabaseCheckpoint or None) of
    write-buffer epoch `epoch` (one of another epoch says nothing of this one's offsets). Pure."""
    known = {}
    if database_checkpoint is not None and database_checkpoint.epoch == epoch:
        for kp, (lo, hi) in database_checkpoint.sequencer_numbers.items():
            known[int(kp)] = lo - 1 if lo is not None else hi
    return {kp: min(known.get(kp, -1), a) for kp, a in applied.items()}


class MessageSizes:
    """Per (topic, Kafka partition), how many messages this server produced and their bytes (value
    plus header keys and values), as Kafka acknowledged them; the write buffer's `on_acked` hook
    records them (any request thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sizes: dict = {}  # (topic, kp) -> [messages, bytes]

    def record(self, topic: str, messages: list) -> None:
        """`messages`: [(kafka partition, offset, headers [(key, value)] or None, value)]."""
        with self._lock:
            for kp, _off, headers, value in messages:
                n = len(value or b"") + sum(len(k or "") + len(v or b"") for k, v in (headers or ()))
                s = self._sizes.setdefault((topic, kp), [0, 0])
                s[0] += 1
                s[1] += n

    def mean_bytes(self, topic: str, kp: int) -> float | None:
        with self._lock:
            s = self._sizes.get((topic, kp))
        return s[1] / s[0] if s and s[0] else None

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._sizes if k[0] == topic]:
                del self._sizes[key]


def partition_watermarks(applied: dict, visible: dict, persisted: dict, ends: dict | None,
                         mean_bytes) -> list[PartitionWatermarks]:
    """The watermarks of each Kafka partition of `applied`, sorted by partition. `ends`: {kp: Kafka's
    end offset (exclusive)}, None when the broker could not be asked; `mean_bytes(kp)`: the mean
    message size or None. Pure."""
    out = []
    for kp in sorted(applied):
        a = applied[kp]
        end = ends.get(kp, -1) if ends is not None else -1
        lag = max(0, end - 1 - a) if end >= 0 else 0
        mean = mean_bytes(kp)
        out.append(PartitionWatermarks(partition=kp, applied_hi_inclusive=a,
                                       visible_hi_inclusive=max(a, visible.get(kp, a)),
                                       persisted_hi_inclusive=min(persisted.get(kp, -1), a),
                                       high_watermark=end, lag_messages=lag,
                                       lag_bytes=int(round(lag * mean)) if mean else 0))
    return out
