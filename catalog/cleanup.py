"""Cleanup of Parquet files the preserved catalog does not reference (storage part).

Invariant kept here: a Parquet file is deleted only if it is (1) not registered
in the given catalog state, (2) not in ``in_flight_keys`` (written by a persist
that has not committed yet, or read by a query planned on an older state), and
(3) older than ``min_age_s`` by its store modification time — so a file whose
writer has not even registered it as in flight yet is still safe.

Ordering contract for callers (the lifecycle cleanup task, on the driver):
take the ``in_flight_keys`` snapshot *before* reading the catalog state (or
hold the persist "cleanup lock" across both), so that a file committed in
between is in at least one of them.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog.object_store import ObjectStore, data_prefix
from catalog.preserved_catalog import CatalogState

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
) -> list[str]:
    """Return the sorted keys of Parquet files under ``<db>/data/`` that may be deleted.

    Pure apart from one ``store.list``; runs on the driver.  ``now_s`` is the
    caller's clock in seconds since the epoch (compared with the objects'
    ``last_modified_s``); ``min_age_s`` must be >= 0.
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
) -> list[str]:
    """Delete what :func:`find_unreferenced` returns; return the deleted keys.

    Deleting is idempotent, so running two cleanups at once is harmless.
    """
    keys = find_unreferenced(store, db, state, in_flight_keys, min_age_s, now_s)
    for key in keys:
        store.delete(key)
    return keys
