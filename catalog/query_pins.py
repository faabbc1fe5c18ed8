"""Query pins: which running queries may still read something the catalog already removed.

Invariant kept here: an object retired at epoch ``e`` (``retire``) is handed out for
deletion (``take_unpinned``) only once no query pinned at an epoch ``<= e`` is still
running: a query pins (``pin``) before it reads the catalog and unpins when its answer is
complete, so a query planned before a file was removed from the catalog finishes reading it,
and a query planned after never sees it. Epoch-based reclamation: no per-file bookkeeping
in the query path, one counter and one dict of running tickets.

Thread-safe (one lock; `release_later` takes none, so a finalizer may call it at any moment).
Driver only; not picklable on purpose (it holds a lock).
"""
from __future__ import annotations

import collections
import itertools
import threading

__all__ = ["QueryPins"]


class QueryPins:
    """Pins of running queries and the objects waiting for them (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._tickets = itertools.count(1)
        #: ticket -> the epoch the query pinned at
        self._running: dict[int, int] = {}
        #: (epoch retired at, objects)
        self._waiting: list[tuple[int, tuple]] = []
        #: tickets released by `release_later`, dropped from `_running` under the lock at its next use
        self._released: collections.deque = collections.deque()

    def pin(self) -> int:
        """Called by a query before it reads the catalog; returns its ticket for `unpin`."""
        with self._lock:
            ticket = next(self._tickets)
            self._running[ticket] = self._epoch
            return ticket

    def unpin(self, ticket: int) -> None:
        """Called once the query's answer is complete (or it failed); unknown tickets are ignored."""
        with self._lock:
            self._running.pop(ticket, None)

    def release_later(self, ticket: int) -> None:
        """`unpin` without taking the lock (a deque append): for a finalizer of an answer dropped
        unread, which may run inside any allocation, also one made under this lock."""
        self._released.append(ticket)

    def _drain(self) -> None:
        """Under the lock: the tickets `release_later` released leave `_running`."""
        while self._released:
            self._running.pop(self._released.popleft(), None)

    def running(self) -> int:
        """How many queries hold a pin now."""
        with self._lock:
            self._drain()
            return len(self._running)

    def retire(self, objects) -> int:
        """`objects` were removed from the catalog now: queries pinned from now on never read them.
        Returns the epoch they were retired at."""
        with self._lock:
            retired_at = self._epoch
            self._epoch += 1
            objs = tuple(objects)
            if objs:
                self._waiting.append((retired_at, objs))
            return retired_at

    def take_unpinned(self) -> list:
        """Removes and returns the retired objects no running query can read any more."""
        with self._lock:
            self._drain()
            oldest = min(self._running.values(), default=None)
            free = [o for at, objs in self._waiting if oldest is None or oldest > at for o in objs]
            self._waiting = [(at, objs) for at, objs in self._waiting if not (oldest is None or oldest > at)]
            return free

    def waiting_objects(self) -> set:
        """The retired objects that still wait for running queries (cleanup must spare them)."""
        with self._lock:
            return {o for _at, objs in self._waiting for o in objs}

    def waiting(self) -> int:
        """How many retired objects still wait for running queries."""
        with self._lock:
            return sum(len(objs) for _at, objs in self._waiting)
