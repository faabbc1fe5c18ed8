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
`max_delay_s`, and falls back to none as soon as the partition moves. An answer
that shows no more than this server's own acknowledged writes (`AckMarks`,
whatever the partition's size) backs off the same way: the source knows those
writes' end without asking (Kafka gave their offsets), so only another
producer's write to a partition this server writes to can reach a micro-batch
later than it would have, by at most `max_delay_s`, as for a large idle one.

`EndPolls` is pure logic: the caller passes `now` (monotonic seconds). It lives
in the Python worker Spark starts for the streaming source (driver side); that
process shares nothing with the server's but options and files, hence the marks
are files: `AckMarks.touch` runs in the server (the write buffer's acknowledging
thread), `AckMarks.read` in the source's worker.
"""
from __future__ import annotations

import json
import os
import threading
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

    def answered(self, key, now: float, low: int, high: int, explained: bool = False) -> bool:
        """Records the broker's answer for `key` asked at `now`: its low and high watermarks;
        `explained`: the high watermark is not beyond this server's own acknowledged writes (the
        source knew that end already). Returns whether the high watermark moved since the last
        answer (True for the first)."""
        prev = self._parts.get(key)
        moved = prev is None or high != prev.high_watermark
        if explained:
            delay = self.first_delay_s if prev is None else min(self.max_delay_s, max(self.first_delay_s, 2 * prev.delay_s))
        elif moved or high - max(low, 0) < self.backoff_from_offsets:
            delay = 0.0
        else:
            delay = min(self.max_delay_s, max(self.first_delay_s, 2 * prev.delay_s))
        self._parts[key] = _Partition(high, now, delay)
        return moved


class AckMarks:
    """One small JSON file per topic in `directory`: {Kafka partition: the highest offset Kafka
    acknowledged to this server + 1}, replaced whole (write and rename) whenever an acknowledgement
    moves an end, so a reader sees the old ends or the new ones, never a part.

    The offsets are exact (Kafka's delivery reports give each message's offset), and every offset
    below an end exists or is a gap, so the streaming source takes them for ends without asking the
    broker. `touch` and `forget` run in the server (the write buffer's acknowledging threads;
    ~tens of microseconds), `read` in the source's worker. Picklable (the directory; a copy
    starts with no ends of its own)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._ends: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"directory": self.directory}

    def __setstate__(self, state):
        self.__init__(state["directory"])

    def _path(self, topic: str) -> str:
        return os.path.join(self.directory, topic)

    def touch(self, topic: str, ends: dict[int, int]) -> None:
        """Records `ends` ({Kafka partition: acknowledged offset + 1}) of `topic`: each end only
        moves up; the file is rewritten when one moved."""
        with self._lock:
            known = self._ends.setdefault(topic, {})
            moved = {kp: end for kp, end in ends.items() if end > known.get(kp, -1)}
            if not moved:
                return
            known.update(moved)
            path = self._path(topic)
            tmp = path + ".tmp"
            try:
                f = open(tmp, "w")
            except FileNotFoundError:
                os.makedirs(self.directory, exist_ok=True)
                f = open(tmp, "w")
            with f:
                json.dump({str(kp): end for kp, end in known.items()}, f)
            os.replace(tmp, path)

    def clear(self) -> None:
        """Drops every topic's ends: a server calls it at start, before its source reads them (the
        offsets a process got acknowledged are its own; a broker's offsets can start over between
        runs)."""
        with self._lock:
            self._ends.clear()
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return
            for name in names:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass

    def forget(self, topic: str) -> None:
        """Drops `topic`'s ends (its offsets started over: a new topic, or a broker that lost its
        tail); later acknowledgements mark it anew."""
        with self._lock:
            self._ends.pop(topic, None)
            try:
                os.unlink(self._path(topic))
            except FileNotFoundError:
                pass

    def read(self, topic: str) -> dict[int, int]:
        """{Kafka partition: end} of `topic` ({} when never marked, or unreadable)."""
        try:
            with open(self._path(topic)) as f:
                return {int(kp): int(end) for kp, end in json.load(f).items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}
