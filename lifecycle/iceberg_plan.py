"""Which data files an Iceberg table of one table references at one revision of the preserved catalog.

Invariant kept here: the rows of the files :func:`published_files` names, read as one Iceberg
table, are exactly the rows our SQL answers for the table's persisted files at that revision:
deletes applied (a delete takes the rows of the files it applies to written before it,
``_iox_seq < seq``, catalog/preserved_catalog.py ``AddDeletePredicate``), and one row per
(tags, ``time_ns``), each field its last non-null value in ``_iox_seq`` order, as the table views
deduplicate (chunk_store/arrow_merge.py). A persisted file is deduplicated in itself, and files of
one partition whose time ranges do not meet cannot hold the same (tags, time), nor can files that share
no key (the caller's ``shares_keys`` answers that from the files' contents), so such a file with no
delete applying to it is published as it is: Iceberg references our Parquet file, nothing is copied.
Only files that need a merge are rewritten: each group of files of one partition whose time ranges
meet and that may share a key (transitively), and each file a delete applies to, becomes one *copy*
holding the merged, deleted rows, under ``<db>/iceberg/<table>/data/<partition>/`` with a name that
is a hash of its sources and deletes. The same state always gives the same copies under the same
keys (``shares_keys`` is a function of the files' immutable contents), so writing a copy again is
harmless and a publication can be repeated after a crash.

Pure logic on catalog values: no I/O, no clock, no Spark. Called on the driver by
lifecycle/iceberg_publication.py.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

from iox_spark.catalog.object_store import encode_key_segment
from iox_spark.catalog.preserved_catalog import AddDeletePredicate, AddParquet, CatalogState

__all__ = ["PublishedFile", "SharesKeys", "published_files", "changed_tables", "iceberg_prefix", "copies_prefix"]


def iceberg_prefix(db: str, table: str) -> str:
    """``<db>/iceberg/<table>/``: the Iceberg table's location in the object store (its metadata and copies)."""
    return f"{encode_key_segment(db)}/iceberg/{encode_key_segment(table)}/"


def copies_prefix(db: str, table: str) -> str:
    """``<db>/iceberg/<table>/data/``: where the copies of a table's merged files are written."""
    return f"{iceberg_prefix(db, table)}data/"


@dataclass(frozen=True)
class PublishedFile:
    """One data file of the Iceberg table: one of our Parquet files, or a copy merging ``sources``."""

    #: object-store key of the file Iceberg references
    key: str
    partition_key: str
    #: our files whose rows it holds, by ``min_seq``
    sources: tuple[AddParquet, ...]
    #: per source key, the deletes that apply to it (commit order); empty for none
    deletes: tuple[tuple[str, tuple[AddDeletePredicate, ...]], ...]

    @property
    def is_copy(self) -> bool:
        """Whether the file must be written (merged or deleted rows), not our own file referenced."""
        return len(self.sources) > 1 or bool(self.deletes)


def changed_tables(before: CatalogState | None, after: CatalogState) -> set[str]:
    """The tables whose published files may differ between ``before`` and ``after`` (a later state of
    the same catalog): those of files added or removed and of delete predicates recorded or changed
    (every table with files when ``before`` is None). A table outside it publishes the same files."""
    if before is None:
        return {f.table for f in after.files.values()}
    out = {after.files[k].table for k in after.files.keys() - before.files.keys()}
    out |= {before.files[k].table for k in before.files.keys() - after.files.keys()}
    if before.delete_predicates != after.delete_predicates:
        for d in set(before.delete_predicates) ^ set(after.delete_predicates):
            out |= {s.files[k].table for s in (before, after) for k in d.applies_to if k in s.files}
    return out


#: (a file, the earlier files of its partition whose time ranges meet it) → the keys of those that
#: may hold a (tags, time) key it holds; answering "may" for a file that shares none is safe (a copy
#: more), leaving out one that shares a key is not
SharesKeys = Callable[[AddParquet, list[AddParquet]], set[str]]


def published_files(state: CatalogState, table: str, files: list[AddParquet] | None = None,
                    shares_keys: SharesKeys | None = None) -> dict[str, PublishedFile]:
    """Key → :class:`PublishedFile` of every data file the Iceberg table of ``table`` references at
    ``state`` (empty when the table has no persisted file). ``files``: the table's files of
    ``state`` when the caller has them (else found in ``state.files``). ``shares_keys``: which files
    whose time ranges meet may share a key (`SharesKeys`, asked with files in ``(min_seq, key)``
    order, each about the earlier ones); None: every one may."""
    if files is None:
        files = [f for f in state.files.values() if f.table == table]
    deletes: dict[str, list[AddDeletePredicate]] = {}
    for d in state.delete_predicates:
        if d.table is not None and d.table != table:
            continue
        for key in d.applies_to:
            deletes.setdefault(key, []).append(d)
    by_partition: dict[str, list[AddParquet]] = {}
    for f in files:
        by_partition.setdefault(f.partition_key, []).append(f)
    out: dict[str, PublishedFile] = {}
    for pkey, group in by_partition.items():
        for component in _merged_groups(group, shares_keys):
            applying = tuple((f.key, tuple(deletes[f.key])) for f in component if deletes.get(f.key))
            sources = tuple(sorted(component, key=lambda f: (f.min_seq, f.key)))
            if len(sources) == 1 and not applying:
                key = sources[0].key
            else:
                key = _copy_key(state.db, table, pkey, sources, applying)
            out[key] = PublishedFile(key=key, partition_key=pkey, sources=sources, deletes=applying)
    return out


def _merged_groups(files: list[AddParquet], shares_keys: SharesKeys | None) -> list[list[AddParquet]]:
    """The files grouped so that two files whose time ranges meet and that may share a key (also
    through others) are in one group."""
    out: list[list[AddParquet]] = []
    for group in _meeting_time_ranges(files):
        if len(group) == 1 or shares_keys is None:
            out.append(group)
            continue
        ordered = sorted(group, key=lambda f: (f.min_seq, f.key))
        parent = {f.key: f.key for f in ordered}

        def root(k: str) -> str:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for i, f in enumerate(ordered):
            meeting = [g for g in ordered[:i] if g.min_time_ns <= f.max_time_ns and f.min_time_ns <= g.max_time_ns]
            for k in shares_keys(f, meeting) if meeting else ():
                parent[root(k)] = root(f.key)
        by_root: dict[str, list[AddParquet]] = {}
        for f in group:
            by_root.setdefault(root(f.key), []).append(f)
        out.extend(by_root.values())
    return out


def _meeting_time_ranges(files: list[AddParquet]) -> list[list[AddParquet]]:
    """The files grouped so that two files whose ``[min_time_ns, max_time_ns]`` ranges meet (inclusive,
    also through others) are in one group."""
    groups: list[list[AddParquet]] = []
    hi = None
    for f in sorted(files, key=lambda f: (f.min_time_ns, f.max_time_ns, f.key)):
        if groups and f.min_time_ns <= hi:
            groups[-1].append(f)
            hi = max(hi, f.max_time_ns)
        else:
            groups.append([f])
            hi = f.max_time_ns
    return groups


def _copy_key(db: str, table: str, partition_key: str, sources: tuple[AddParquet, ...],
              applying: tuple[tuple[str, tuple[AddDeletePredicate, ...]], ...]) -> str:
    ident = json.dumps([[f.key for f in sources], [[k, [d.to_json() for d in ds]] for k, ds in applying]],
                       sort_keys=True, default=str)
    digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
    return f"{copies_prefix(db, table)}{encode_key_segment(partition_key)}/{digest}.parquet"
