"""When the streaming source asks the broker for a Kafka partition's end again.

Asking costs the broker. On s3:// storage (the durable embedded broker: Tansu on
SeaweedFS) each ask is a listing of the partition's stored batches: about 4 ms of
the store's time for a small partition, and one `get_watermark_offsets` (two
ListOffsets) took 43 ms at 2,000 batches, 93 ms at 5,000 and 194 ms at 10,000
(idle machine). Tansu in memory walks every record batch the partition holds
(4.3 ms of its CPU at 5,000 batches). Asked at every trigger (100 ms) for every
partition, one idle database of 4 partitions kept the durable broker's store at
84 listings a second (measured here), and each further database added as many.

Invariant kept by `EndPolls`: a partition is asked at every trigger while its high
watermark moved when it was last asked. A partition that did not move is asked
again only once a delay has passed since it was last asked; the delay doubles with
each unmoved answer from `first_delay_s` to at most `max_delay_s`, and falls back
to none as soon as the partition moves. A partition whose `AckMarks` mark changed
since the last trigger is asked at once: the server marks a partition each time
Kafka acknowledges a write of this server to it, so only another producer's write
(another member of an ingester pool, a client of the Kafka cluster) to a partition
that was idle can reach a micro-batch later than it would have, by at most
`max_delay_s`.

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

__all__ = ["AckMarks", "EndPolls", "DEFAULT_FIRST_DELAY_S", "DEFAULT_MAX_DELAY_S"]

#: the delay after a partition's first unmoved answer; it doubles with each further one
DEFAULT_FIRST_DELAY_S = 0.2
#: the longest an idle partition goes unasked (the extra apply latency of another producer's next write)
DEFAULT_MAX_DELAY_S = 1.0


@dataclass
class _Partition:
    high_watermark: int
    asked_at: float
    delay_s: float


@dataclass
class EndPolls:
    """Per (topic, partition): whether its end is due to be asked now; see the module invariant."""

    first_delay_s: float = DEFAULT_FIRST_DELAY_S
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    _parts: dict = field(default_factory=dict)

    def due(self, key, now: float) -> bool:
        """True when `key`'s end must be asked now (never asked, or its delay has passed)."""
        p = self._parts.get(key)
        return p is None or now - p.asked_at >= p.delay_s

    def answered(self, key, now: float, high: int) -> bool:
        """Records the broker's answer for `key` asked at `now`: its high watermark. Returns whether
        it moved since the last answer (True for the first)."""
        prev = self._parts.get(key)
        moved = prev is None or high != prev.high_watermark
        delay = 0.0 if moved else min(self.max_delay_s, max(self.first_delay_s, 2 * prev.delay_s))
        self._parts[key] = _Partition(high, now, delay)
        return moved


class AckMarks:
    """One empty file per Kafka partition in `directory` (`<topic>/<partition>`), whose modification
    time (set explicitly, in ns, so two marks never read the same) changes whenever Kafka
    acknowledged a write of this server to the partition. Picklable (a path)."""

    def __init__(self, directory: str):
        self.directory = directory

    def _path(self, topic: str, partition: int) -> str:
        return os.path.join(self.directory, topic, str(int(partition)))

    def touch(self, topic: str, partitions) -> None:
        """Marks each of `partitions` of `topic` (server side, after an acknowledgement; ~microseconds each)."""
        n = time.time_ns()
        for partition in set(partitions):
            path = self._path(topic, partition)
            try:
                os.utime(path, ns=(n, n))
            except FileNotFoundError:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "ab"):
                    pass
                os.utime(path, ns=(n, n))

    def topics(self) -> set[str]:
        """The topics marked at least once."""
        try:
            return set(os.listdir(self.directory))
        except FileNotFoundError:
            return set()

    def read(self, topic: str, partition: int) -> int | None:
        """The partition's mark (compare with an earlier one for a change), None when never marked."""
        try:
            return os.stat(self._path(topic, partition)).st_mtime_ns
        except FileNotFoundError:
            return None
