"""When the streaming source asks the broker for a Kafka partition's end again.

Asking costs the broker. Tansu (the embedded broker) answers a ListOffsets by
walking every record batch the partition holds: 4.3 ms of its CPU for a
partition of 5,000 batches against 0.2 ms for an empty one (measured here),
and the source asks at every trigger (100 ms) for every partition of every
database topic. With two idle databases of 20,000 writes each, the broker of
an otherwise idle server used 0.35-0.42 of a core (0.05-0.08 at a 1 s trigger),
which queries and writes on a 2-core machine then lacked. On s3:// storage (the
durable embedded broker: Tansu on SeaweedFS) each ask lists the partition's
stored batches: one `get_watermark_offsets` (two ListOffsets) took 43 ms at
2,000 batches, 93 ms at 5,000 and 194 ms at 10,000 (idle machine).

Invariant kept by `EndPolls`: a partition is asked at every trigger while it
holds fewer than `backoff_from_offsets` offsets or its high watermark moved
when it was last asked. A partition that holds at least that many and did not
move is asked again only once a delay has passed since it was last asked; the
delay doubles with each unmoved answer from `first_delay_s` to at most
`max_delay_s`, and falls back to none as soon as the partition moves. A topic
whose `AckMarks` mark changed since the last trigger has all its partitions
asked at once: the server marks a topic each time Kafka acknowledges a write of
this server to it, so only another producer's write to a large idle partition
can reach a micro-batch later than it would have, by at most `max_delay_s`.

`EndPolls` is pure logic: the caller passes `now` (monotonic seconds). It lives
in the Python worker Spark starts for the streaming source (driver side); that
process shares nothing with the server's but options and files, hence the marks
are files: `AckMarks.touch` runs in the server (the write buffer's acknowledging
thread), `AckMarks.read` in the source's worker.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

__all__ = ["AckMarks", "EndPolls", "DEFAULT_BACKOFF_FROM_OFFSETS", "DEFAULT_FIRST_DELAY_S", "DEFAULT_MAX_DELAY_S"]

#: partitions holding fewer offsets are asked at every trigger (Tansu: under ~1 ms of its CPU per ask)
DEFAULT_BACKOFF_FROM_OFFSETS = 1_000
#: the delay after a large partition's first unmoved answer; it doubles with each further one
DEFAULT_FIRST_DELAY_S = 0.2
#: the longest a large idle partition goes unasked (the extra apply latency of its next write)
DEFAULT_MAX_DELAY_S = 1.0


@dataclass
class _Partition:
    high_watermark: int
    asked_at: float
    delay_s: float


@dataclass
class EndPolls:
    """Per (topic, partition): whether its end is due to be asked now; see the module invariant."""

    backoff_from_offsets: int = DEFAULT_BACKOFF_FROM_OFFSETS
    first_delay_s: float = DEFAULT_FIRST_DELAY_S
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    _parts: dict = field(default_factory=dict)

    def due(self, key, now: float) -> bool:
        """True when `key`'s end must be asked now (never asked, or its delay has passed)."""
        p = self._parts.get(key)
        return p is None or now - p.asked_at >= p.delay_s

    def answered(self, key, now: float, low: int, high: int) -> bool:
        """Records the broker's answer for `key` asked at `now`: its low and high watermarks.
        Returns whether the high watermark moved since the last answer (True for the first)."""
        prev = self._parts.get(key)
        moved = prev is None or high != prev.high_watermark
        if moved or high - max(low, 0) < self.backoff_from_offsets:
            delay = 0.0
        else:
            delay = min(self.max_delay_s, max(self.first_delay_s, 2 * prev.delay_s))
        self._parts[key] = _Partition(high, now, delay)
        return moved


class AckMarks:
    """One empty file per topic in `directory`, whose modification time (set explicitly, in ns, so
    two marks never read the same) changes whenever Kafka acknowledged a write of this server to
    the topic. Picklable (a path)."""

    def __init__(self, directory: str):
        self.directory = directory

    def _path(self, topic: str) -> str:
        return os.path.join(self.directory, topic)

    def touch(self, topic: str) -> None:
        """Marks `topic` (server side, after an acknowledgement; ~microseconds)."""
        path = self._path(topic)
        n = time.time_ns()
        try:
            os.utime(path, ns=(n, n))
        except FileNotFoundError:
            os.makedirs(self.directory, exist_ok=True)
            with open(path, "ab"):
                pass
            os.utime(path, ns=(n, n))

    def read(self, topic: str) -> int | None:
        """The topic's mark (compare with an earlier one for a change), None when never marked."""
        try:
            return os.stat(self._path(topic)).st_mtime_ns
        except FileNotFoundError:
            return None
