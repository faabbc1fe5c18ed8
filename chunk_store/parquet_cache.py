"""Local copies of persisted Parquet objects, for Spark's native reader in local mode on S3.

Invariant: the copies take at most `max_bytes` of the local disk, counted when a copy is made (a
chunk whose files do not fit is read from the object store instead: `paths_for` answers None);
a copy is removed only once no chunk reads it (`sweep`, given the keys the catalog's chunks and
its retired chunks read) and no query that may have planned a read of it runs any more (the
copies go through the catalog's query pins, catalog/query_pins.py, like pruned files do). A copy
younger than `_FRESH_S` is never removed: the chunk it is made for may not be in the catalog yet.
Objects are copied streamed (never read whole into memory) and atomically (a temporary file
renamed), so a crash leaves no partial copy; the copies a previous run left are counted at start
and removed by the first sweep that finds no chunk reading them.

Where it runs: on the driver. `paths_for` in whichever thread registers a chunk's files (the
lifecycle, recovery, a pool's catalog refresh); `sweep` and `remove` in the lifecycle loop. Thread
safe. Not picklable (it holds a lock).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

__all__ = ["ParquetCache", "CachedCopy"]

#: a copy this young is kept whatever the catalog says: its chunk may be on its way in
_FRESH_S = 120.0
#: the suffix of a copy being written
_PARTIAL = ".partial"


@dataclass(frozen=True)
class CachedCopy:
    """A local copy handed to the query pins for removal (`ParquetCache.remove` deletes it)."""

    path: str


class ParquetCache:
    """The copies under `directory` (see the module docstring); `pins`: the catalog's QueryPins."""

    def __init__(self, directory: str, max_bytes: int, pins) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.directory = os.path.abspath(directory)
        self.max_bytes = max_bytes
        self._pins = pins
        self._lock = threading.Lock()
        #: path -> (size in bytes, time.monotonic() it was made or found)
        self._copies: dict[str, tuple[int, float]] = {}
        #: the sum of the sizes in `_copies`
        self._bytes = 0
        #: paths handed to the pins, not removed yet
        self._retiring: set[str] = set()
        os.makedirs(self.directory, exist_ok=True)
        found_at = time.monotonic() - _FRESH_S  # a previous run's copies are not fresh
        for dirpath, _dirs, files in os.walk(self.directory):
            for name in files:
                path = os.path.join(dirpath, name)
                if _PARTIAL in name:
                    _unlink(path)
                    continue
                try:
                    self._put(path, os.path.getsize(path), found_at)
                except OSError:
                    pass

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes

    def path_of(self, key: str) -> str:
        return os.path.join(self.directory, *key.split("/"))

    def paths_for(self, store, keys: list, sizes: list | None = None) -> list | None:
        """Local paths of the objects `keys` of `store`, copied first where missing; None when the
        missing ones do not fit under `max_bytes` (nothing is copied then). `sizes`: their sizes
        when known (the catalog's); without them only the copies held already are counted
        against the limit beforehand, and the new copies are counted once made."""
        paths = [self.path_of(k) for k in keys]
        with self._lock:
            for p in paths:  # a copy asked for again is in use: not one to remove
                if p in self._copies:
                    self._copies[p] = (self._copies[p][0], time.monotonic())
                    self._retiring.discard(p)
            missing = [(k, p, None if sizes is None else sizes[i]) for i, (k, p) in enumerate(zip(keys, paths))
                       if p not in self._copies]
            if not missing:
                return paths
            if self.max_bytes == 0:
                return None
            known = sum(s for _k, _p, s in missing if s is not None)
            if self._bytes + known > self.max_bytes:
                return None
        for key, path, _size in missing:
            with self._lock:
                if path in self._copies:  # another thread copied it meanwhile
                    continue
            size = self._copy(store, key, path)
            with self._lock:
                self._put(path, size, time.monotonic())
        return paths

    def _put(self, path: str, size: int, at: float) -> None:
        """Records the copy at `path` (made again by another thread meanwhile: counted once). Under the lock."""
        old = self._copies.get(path)
        self._bytes += size - (old[0] if old is not None else 0)
        self._copies[path] = (size, at)

    def _copy(self, store, key: str, path: str) -> int:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}{_PARTIAL}-{os.getpid()}-{threading.get_ident()}"
        try:
            store.download(key, tmp)
            os.replace(tmp, path)
        except BaseException:
            _unlink(tmp)
            raise
        return os.path.getsize(path)

    def sweep(self, read_keys: set) -> int:
        """Hands the copies no chunk reads (`read_keys`: the object keys the catalog's chunks, live
        and retired, read) and that are not fresh to the query pins; returns how many. Lifecycle loop."""
        read = {self.path_of(k) for k in read_keys}
        old = time.monotonic() - _FRESH_S
        with self._lock:
            gone = [p for p, (_size, at) in self._copies.items()
                    if p not in read and p not in self._retiring and at <= old]
            self._retiring.update(gone)
        if gone:
            self._pins.retire([CachedCopy(p) for p in gone])
        return len(gone)

    def remove(self, copy: CachedCopy) -> None:
        """Deletes a copy the query pins released (no running query can read it); a copy asked for
        again meanwhile (`paths_for`) stays."""
        with self._lock:  # the unlink too: a copy made again right after must not be the one deleted
            if copy.path not in self._retiring:
                return
            self._retiring.discard(copy.path)
            gone = self._copies.pop(copy.path, None)
            if gone is not None:
                self._bytes -= gone[0]
            _unlink(copy.path)

    def __reduce__(self):
        raise TypeError("ParquetCache is driver-only and must not be pickled")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
