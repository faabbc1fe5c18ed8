"""What the lifecycle worker asks of the server and tells it: one typed bundle of callables, given to
`LifecycleWorker` when it is built (lifecycle/worker.py).

Invariant: the lifecycle reaches the rest of the server only through these hooks, each called on
the lifecycle's own threads (its round, or the fence probe) with no catalog lock held; a hook that
raises is logged by the worker and never stops its round. A hook left at its default does nothing
(or answers "no").

Built once by the server (server/app.py) before the worker starts; immutable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = ["LifecycleHooks"]


def _no(*_args) -> bool:
    return False


def _none_published(_database: str) -> frozenset:
    return frozenset()


@dataclass(frozen=True)
class LifecycleHooks:
    #: (database, table): the table's view changed (chunks swapped in or out); None: no views
    refresh_view: Callable[[object, str], None] | None = None
    #: (database) -> whether its replay at start has not caught up (its persists and compactions wait)
    is_replaying: Callable[[object], bool] = _no
    #: (RevisionConflict) once a database is fenced: the server refuses its writes
    on_fenced: Callable[[Exception], None] | None = None
    #: (database, RecordDatabaseCheckpoint) after every committed persist: the resumption offsets
    on_persisted: Callable[[object, object], None] | None = None
    #: () -> whether the server's memory is near its limit (unload and persist first)
    memory_pressure: Callable[[], bool] = _no
    #: () -> whether the server is frozen (everything held is persisted)
    frozen: Callable[[], bool] = _no
    #: (database name, Kafka partitions) this pool member lost to another member's claim
    on_partitions_lost: Callable[[str, Iterable[int]], None] | None = None
    #: (database name, CatalogState) after the fence probe read the other members' commits
    on_catalog_refreshed: Callable[[str, object], None] | None = None
    #: (database name) -> object keys a snapshot published to Iceberg still references (cleanup keeps
    #: them); None while not known yet (cleanup then skips the database)
    published_keys: Callable[[str], frozenset | None] = _none_published
