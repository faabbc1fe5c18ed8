"""The replay watch: how far each database's replay of its write buffer must reach, and how far it got.

Invariant: a database counts as replaying until every Kafka partition of it applied what the
write buffer held when the replay began (at start: server/consume/recovery.py `replay_until`,
capped by a freeze record; after a pool claim: the claimed partitions' ends,
server/pool/membership.py), a partition held at a poisoned message only up to the offset before
it. While it replays, the lifecycle holds its persists and compactions, queries wait or answer
partial (server/query/read_barrier.py), and status reports its progress.

Who calls it: `IoxServer` builds one at start; the lifecycle worker, the read barrier, the
write-buffer tail, the pool, status and /metrics read it from their threads (driver). Targets
change under the watch's own lock; applied offsets are read from the catalog as copies.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import below_holds
from iox_spark.server.consume.recovery import replay_progress
from iox_spark.server.query.read_barrier import ReplayState

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog, Database

__all__ = ["ReplayWatch", "REPLAY_LOG_INTERVAL_S"]

#: How often a start that replays the write buffer logs its progress (offsets done / to do per database)
REPLAY_LOG_INTERVAL_S = 5.0

log = logging.getLogger(__name__)


class ReplayWatch:
    """`catalog`: the in-memory catalog; `until`: {topic: {kp: last offset (inclusive) the replay
    must apply}}; `replay_from`: {topic: {kp: first offset the replay reads}}, for the progress;
    `on_caught_up()`: called once, when the last database caught up (the ingestor's replay row
    filters go then)."""

    def __init__(self, catalog: Catalog, until: dict, replay_from: dict,
                 on_caught_up: Callable[[], None] = lambda: None):
        self._catalog = catalog
        self._lock = threading.Lock()
        self._until = {t: dict(p) for t, p in until.items() if p}
        #: topic -> ({kp: first offset replayed}, {kp: replay target}), kept after the replay caught up
        self._plan = {t: (dict(replay_from.get(t, {})), dict(p)) for t, p in self._until.items()}
        self._on_caught_up = on_caught_up

    @property
    def planned(self) -> bool:
        """Whether the start replays anything (`log_progress` has something to log)."""
        return bool(self._plan)

    def targets(self, topic: str) -> dict:
        """{kp: offset} the replay of `topic` must still apply (a copy; empty once caught up)."""
        with self._lock:
            return dict(self._until.get(topic, {}))

    def replaying(self, db: Database) -> bool:
        """True until every Kafka partition of `db` caught up with its target. The lifecycle holds
        `db`'s persists and compactions until then; a database that replays long (a poisoned
        message held, a large backlog) holds no other database's."""
        until = self.targets(db.topic)
        if not until:
            return False
        applied = db.applied_offsets()
        return any(applied.get(kp, -1) < off for kp, off in until.items())

    def any_replaying(self) -> bool:
        """True until every database caught up; retires each one that did (`on_caught_up` runs
        when the last one does)."""
        with self._lock:
            topics = list(self._until)
        if not topics:
            return False
        for topic in topics:
            db = next((d for d in self._catalog.databases() if d.topic == topic), None)
            if db is not None and not self.replaying(db):
                with self._lock:
                    self._until.pop(topic, None)
        with self._lock:
            if self._until:
                return True
        self._on_caught_up()
        log.info("replay caught up")
        return False

    def state(self, db: Database) -> ReplayState:
        """The replay of `db` (server/query/read_barrier.py): replaying until its Kafka partitions
        applied their targets (a partition held at a poisoned message: up to it). No side effect."""
        until = self.targets(db.topic)
        if not until:
            return ReplayState(False, {})
        applied, held = db.applied_and_held()
        until = below_holds(until, held)  # a held partition applies nothing from its hold on
        if all(applied.get(kp, -1) >= off for kp, off in until.items()):
            return ReplayState(False, until)
        done, todo = self.progress(db)
        return ReplayState(True, until, done, todo)

    def progress(self, db: Database) -> tuple[int, int]:
        """(offsets done, offsets to do) of the replay of `db` at start; (0, 0) when it replayed nothing."""
        with self._lock:
            plan = self._plan.get(db.topic)
        if plan is None:
            return 0, 0
        return replay_progress(plan[0], plan[1], db.applied_offsets())

    def extend(self, topic: str, targets: dict) -> None:
        """A pool claim: the claimed partitions replay up to `targets` ({kp: offset}) before they count
        as caught up (server/pool/membership.py)."""
        if targets:
            with self._lock:
                self._until.setdefault(topic, {}).update(targets)

    def drop(self, topic: str, kps) -> None:
        """A pool member lost `kps` of `topic`: their replay is no longer waited for here."""
        with self._lock:
            until = self._until.get(topic)
            for kp in kps:
                if until is not None:
                    until.pop(kp, None)

    def forget(self, topic: str) -> None:
        """`topic`'s database continues in a new write-buffer epoch: its old targets go."""
        with self._lock:
            self._until.pop(topic, None)

    def log_progress(self, stopped: threading.Event, interval_s: float | None = None) -> None:
        """Logs each replaying database's progress every `interval_s` (None: REPLAY_LOG_INTERVAL_S)
        until every one caught up or `stopped` is set. Runs in its own daemon thread from start."""
        interval_s = REPLAY_LOG_INTERVAL_S if interval_s is None else interval_s
        with self._lock:
            pending = set(self._plan)
        t0 = time.monotonic()
        while pending and not stopped.wait(interval_s):
            for topic in sorted(pending):
                db = next((d for d in self._catalog.databases() if d.topic == topic), None)
                if db is None:
                    continue
                done, todo = self.progress(db)
                if done >= todo:
                    log.info("replay of database %s: done, %d offsets in %.0f s", db.name, todo,
                             time.monotonic() - t0)
                    pending.discard(topic)
                else:
                    log.info("replay of database %s: %d of %d offsets (%.1f%%)", db.name, done, todo,
                             100.0 * done / todo)
