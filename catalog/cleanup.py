"""Cleanup of Parquet files the preserved catalog does not reference (storage part).

Invariant kept here: a Parquet file is deleted only if it is (1) not registered
in the given catalog state, (2) not in ``in_flight_keys`` (written by a persist
that has not committed yet, or read by a query planned on an older state), (3)
older than ``min_age_s`` by its store modification time — so a file whose
writer has not even registered it as in flight yet is still safe — and (4) no
other writer committed a revision newer than the caller's (docs/ARCHITECTURE.md invariant
8, "One committer"): right before the first delete the store is probed for the
next catalog revision; if another writer (a new owner of the database)
committed it, the caller's state is stale and may miss that owner's files, so
nothing is deleted and :class:`~catalog.errors.RevisionConflict` is raised: the
caller is fenced, exactly as if its own commit had lost that revision.

In a pool catalog other members' revisions are normal, so (4) is kept per Kafka partition
instead (lifecycle/worker.py ``cleanup``): a member deletes only files of the tables of the
partitions it owns, as of a refresh of the catalog right before the first delete (a later owner
writes its own files after its claim, so they are younger than ``min_age_s``), and only files it
already found unreferenced in a round at least ``min_age_s`` earlier (another member's query
planned on an older state may still read a file that a compaction replaced).

Ordering contract for callers (the lifecycle cleanup task, on the driver):
take the ``in_flight_keys`` snapshot *before* reading the catalog state (or
hold the persist "cleanup lock" across both), so that a file committed in
between is in at least one of them.  A caller that holds the database's
:class:`~catalog.preserved_catalog.PreservedCatalog` passes its
``newer_revision`` as the probe, so that its own commits made after it read
the state are not mistaken for another writer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from iox_spark.catalog.errors import RevisionConflict
from iox_spark.catalog.object_store import ObjectStore, data_prefix
from iox_spark.catalog.preserved_catalog import CatalogState, transaction_key

__all__ = ["DEFAULT_CLEANUP_MIN_AGE_S", "PARQUET_SUFFIX", "delete_unreferenced", "find_unreferenced"]

#: Suggested ``min_age_s``: far longer than any persist takes from write to commit.
DEFAULT_CLEANUP_MIN_AGE_S = 15 * 60.0
#: Only objects with this suffix under ``<db>/data/`` are considered.
PARQUET_SUFFIX = ".parquet"


def find_unreferenced(
    store: ObjectStore,
    db: str,
    state: CatalogState,
    in_flight_keys: Iterable[str],
    min_age_s: float,
    now_s: float,
    *,
    only: Callable[[str], bool] | None = None,
) -> list[str]:
    """Return the sorted keys of Parquet files under ``<db>/data/`` that may be deleted.

    Pure apart from one ``store.list``; runs on the driver.  ``now_s`` is the
    caller's clock in seconds since the epoch (compared with the objects'
    ``last_modified_s``); ``min_age_s`` must be >= 0.  ``only``: when given, a
    key it answers False for is never returned (a pool member's files of the
    partitions it does not own).  Does not look for newer revisions: only
    :func:`delete_unreferenced` (single committer) or the pool member's cleanup
    (lifecycle/worker.py) deletes.
    """
    if min_age_s < 0:
        raise ValueError(f"min_age_s must be >= 0, got {min_age_s}")
    referenced = set(state.files)
    for pred in state.delete_predicates:  # always a subset of files; kept for safety
        referenced.update(pred.applies_to)
    protected = referenced | set(in_flight_keys)
    out = [
        meta.key
        for meta in store.list(data_prefix(db))
        if meta.key.endswith(PARQUET_SUFFIX)
        and meta.key not in protected
        and now_s - meta.last_modified_s >= min_age_s
        and (only is None or only(meta.key))
    ]
    out.sort()
    return out


def delete_unreferenced(
    store: ObjectStore,
    db: str,
    state: CatalogState,
    in_flight_keys: Iterable[str],
    min_age_s: float,
    now_s: float,
    *,
    newer_revision: Callable[[], int | None] | None = None,
) -> list[str]:
    """Delete what :func:`find_unreferenced` returns; return the deleted keys.

    Before the first delete, asks ``newer_revision`` (the database's
    ``PreservedCatalog.newer_revision``) for a revision another writer
    committed after the caller's; without it, any transaction after
    ``state.revision`` counts as another writer's (``state`` must then be the
    committer's newest).  When there is one, deletes nothing and raises
    :class:`RevisionConflict` naming it.  Deleting is idempotent, so running
    two cleanups of one committer at once is harmless.
    """
    keys = find_unreferenced(store, db, state, in_flight_keys, min_age_s, now_s)
    if not keys:
        return keys
    revision = newer_revision() if newer_revision is not None else _next_revision_in_store(store, db, state)
    if revision is not None:
        raise RevisionConflict(db, revision, transaction_key(db, revision))
    for key in keys:
        store.delete(key)
    return keys


def _next_revision_in_store(store: ObjectStore, db: str, state: CatalogState) -> int | None:
    """``state.revision + 1`` when its transaction exists in the store, else None."""
    revision = state.revision + 1
    return revision if store.exists(transaction_key(db, revision)) else None
