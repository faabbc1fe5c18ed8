"""The read barrier: a query runs only once what it must reflect is there, or it says why not.

Invariant: a query never presents an incomplete answer as complete. Before a query of a database
runs, `ReadBarrier.pass_through`

1. refuses a write token (`after`, server/write_buffer/write_token.py) of another database
   (WriteTokenOfOtherDatabase, INVALID_ARGUMENT) or of another write-buffer epoch or topic
   incarnation of it (WriteTokenOfOtherIncarnation, FAILED_PRECONDITION): its offsets name other
   messages now;
2. while the database replays its write buffer after a restart (it has not yet applied what the
   write buffer held at start, server/replay_watch.py), waits for the replay up to the
   query's deadline, then raises ReplayNotCaughtUp (UNAVAILABLE) with the replay's progress;
   with `allow_partial` it does not wait and the answer is marked partial;
3. waits until every offset of the token is visible (applied, or read from the write buffer's
   tail), then lets the query run; past the deadline it raises WriteTokenNotVisible
   (DEADLINE_EXCEEDED).

When it runs: in the gRPC handler's thread (driver), before `QueryEngine.run`; it holds no lock
while waiting. The caller checks the query's own cut (`covered`) once more: watermarks only grow,
so a token covered here is covered by the cut.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from iox_spark.server.errors import (DatabaseNotFound, ReplayNotCaughtUp, WriteTokenNotVisible, WriteTokenOfOtherDatabase,
                           WriteTokenOfOtherIncarnation)
from iox_spark.server.write_buffer.write_token import InvalidWriteToken, WriteToken, parse_token

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog, Database

__all__ = ["ReadBarrier", "Passage", "ReplayState", "covered", "WAIT_SLICE_S"]

#: the longest a waiting query sleeps between two looks at the watermarks (the tail's visible
#: watermark grows without a notification; applied offsets wake it at once)
WAIT_SLICE_S = 0.05


@dataclass(frozen=True)
class ReplayState:
    """A database's replay of its write buffer at start: `replaying` until every Kafka partition
    applied `until` ({kp: offset}); `done` / `todo`: offsets replayed / to replay."""

    replaying: bool
    until: dict
    done: int = 0
    todo: int = 0


@dataclass(frozen=True)
class Passage:
    """What a query that passed the barrier reflects: `partial` when it runs during a replay."""

    partial: bool
    token: WriteToken | None


def covered(offsets: dict, visible: dict) -> bool:
    """Whether every {kp: offset} of a token is at or below the `visible` watermarks."""
    return all(visible.get(kp, -1) >= off for kp, off in offsets.items())


class ReadBarrier:
    """`catalog`: the in-memory catalog; `wait_applied(database, target, timeout_s)`: blocks until the
    database applied `target` ({kp: offset}) or the timeout passed (the ingestor's); `visible(db)`:
    {kp: visible_hi_inclusive} now; `replay_state(db)`: its ReplayState now."""

    def __init__(self, catalog: Catalog, wait_applied: Callable[[str, dict, float], dict | None],
                 visible: Callable[[Database], dict], replay_state: Callable[[Database], ReplayState]):
        self.catalog = catalog
        self._wait_applied = wait_applied
        self._visible = visible
        self._replay_state = replay_state

    def check_token(self, db: Database, token: WriteToken) -> None:
        """Raises when `token` is not of `db`'s topic, epoch and topic incarnation."""
        if token.topic != db.topic:
            raise WriteTokenOfOtherDatabase(db.name, db.topic, token.topic)
        beyond = sorted(kp for kp in token.offsets if kp >= db.kafka_partitions)
        if beyond:
            raise InvalidWriteToken(f"it names Kafka partition(s) {beyond}; topic {db.topic} has "
                                    f"{db.kafka_partitions}")
        _topic, topic_id, epoch = db.incarnation()
        other_incarnation = token.topic_id is not None and topic_id is not None and token.topic_id != topic_id
        if token.epoch != epoch or other_incarnation:
            raise WriteTokenOfOtherIncarnation(db.name, token.epoch, epoch, token.topic_id, topic_id)

    def pass_through(self, database: str, after: str, allow_partial: bool, timeout_s: float) -> Passage:
        """Returns once the query may run (see the module docstring), at most `timeout_s` seconds on."""
        t0 = time.monotonic()
        deadline = t0 + max(0.0, timeout_s)
        token = parse_token(after) if after else None
        db = self.catalog.peek_database(database)
        if db is None:
            if token is not None:
                raise DatabaseNotFound(database)
            return Passage(False, None)  # the engine answers NOT_FOUND
        if token is not None:
            self.check_token(db, token)
        partial = False
        while True:
            st = self._replay_state(db)
            if not st.replaying:
                break
            if allow_partial:
                partial = True
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplayNotCaughtUp(database, st.done, st.todo, time.monotonic() - t0)
            self._wait_applied(database, st.until, min(left, WAIT_SLICE_S * 10))
        if token is not None:
            while True:
                self.check_token(db, token)  # the epoch may change while it waits
                vis = self._visible(db)
                if covered(token.offsets, vis):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WriteTokenNotVisible(database, token.offsets, vis, time.monotonic() - t0)
                self._wait_applied(database, token.offsets, min(left, WAIT_SLICE_S))
        return Passage(partial, token)
