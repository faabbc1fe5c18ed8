"""When Kafka's end below offsets the server knows is a lost tail, and when it is a late read.

A broker may show less than it holds for a while: Tansu on object storage, loaded, shows
acknowledged offsets to readers seconds late, and its watermark can lag the log, so the end read at
it stops at a batch that is not the last. Such an end is short for a while, never for good. A broker
that lost its tail (a store that did not fsync, an unclean leader election, a restored backup)
stays short until it gives the offsets out again.

Invariant: a Kafka partition's tail counts as lost when Kafka gives an offset out again (the
caller's evidence, at once: the write buffer's confirmation); while the server runs, when its end
stays at or below an offset known written (applied or acknowledged) for `grace_s` in a row
(`TailWatch`); at start, where nothing else writes, when its end lies at or below an offset the
checkpoints name as read, or stops moving below one only acknowledged (`settled_bounds`). Pure but
for `settled_bounds`, which waits with the clock and sleep it is given.
"""
from __future__ import annotations

import threading
import time

__all__ = ["TAIL_LOSS_GRACE_S", "SETTLE_STABLE_S", "TailWatch", "settled_bounds"]

#: How long Kafka's end may stay at or below an offset known written before the tail counts as lost
TAIL_LOSS_GRACE_S = 30.0
#: At start: how long an end below an acknowledged offset must stay unchanged to count as settled
SETTLE_STABLE_S = 5.0


class TailWatch:
    """Run-time judge of one server's Kafka partitions (keys are the caller's, e.g. (database,
    epoch, kp)). Called by the server's tail check and write confirmations (driver, any thread);
    `now` in seconds."""

    def __init__(self, grace_s: float = TAIL_LOSS_GRACE_S):
        self.grace_s = grace_s
        #: key -> (when the end was first seen short, the offset it was short of)
        self._short: dict = {}
        self._lock = threading.Lock()

    def lost(self, key, end_exclusive: int, known_hi_inclusive: int, now: float) -> bool:
        """Whether Kafka's end `end_exclusive` of partition `key` is a lost tail, given the highest
        offset known written (applied or acknowledged)."""
        with self._lock:
            if end_exclusive > known_hi_inclusive:
                self._short.pop(key, None)
                return False
            first = self._short.get(key)
            if first is None or end_exclusive > first[1]:  # what it was short of then is there: a late read
                self._short[key] = (now, known_hi_inclusive)
                return False
            if now - first[0] >= self.grace_s:
                self._short.pop(key, None)
                return True
            return False

    def clear(self, key) -> None:
        """Partition `key`'s end was seen past every known offset (no longer short)."""
        with self._lock:
            self._short.pop(key, None)


def settled_bounds(read, bounds: dict, acked_hi_inclusive: dict, read_hi_inclusive: dict,
                   grace_s: float = TAIL_LOSS_GRACE_S, stable_s: float = SETTLE_STABLE_S,
                   clock=time.monotonic, sleep=time.sleep) -> dict:
    """`bounds` ({kp: (low, end)}, as `read()` answers) once no end is short only of acknowledged
    offsets: while a partition's end lies above every offset that was read from it
    (`read_hi_inclusive`) and at or below one acknowledged (`acked_hi_inclusive`), `read()` again,
    until each such end passed that offset, stayed the same for `stable_s`, or `grace_s` passed.
    Called by recovery at start (driver), where nothing else writes to the topic."""
    started = changed = clock()
    while True:
        short = {kp for kp, (_lo, end) in bounds.items()
                 if read_hi_inclusive.get(kp, -1) < end <= acked_hi_inclusive.get(kp, -1)}
        now = clock()
        if not short or now - changed >= stable_s or now - started >= grace_s:
            return bounds
        sleep(0.5)
        again = read()
        if any(again.get(kp, (0, 0))[1] != bounds[kp][1] for kp in short):
            changed = clock()
        bounds = again
