"""The read plan: one preserved-catalog snapshot, turned into what each executor reads.

Invariants:

* One snapshot per read. The plan names one catalog revision (the newest committed
  when it is made, or the one asked for); every file, delete and schema in it is of
  that revision, and every partition of the read gets the plan pickled, so all of
  them read the same snapshot whatever the server commits meanwhile.
* The rows are the server's query rows of the table's persisted data: the table's
  files are grouped by time overlap (chunk_store/views.py ``overlap_groups``); a
  group's rows are merged as the table views merge chunks (each delete removes the
  rows written before it, ``_iox_seq < seq``, in its time range and matching its
  predicate; then one row per (tags, time), each field its last non-null value in
  write-buffer order). Two groups never share a (tags, time), so each group is read
  on its own by one input partition (small groups packed together, :func:`pack_groups`)
  and no shuffle is needed.
* Retention: no row older than the database's ``reader_lo`` (catalog/retention.py,
  from the retention period and the ``now_s`` the caller passes) or its pruner
  watermark is returned; files wholly older are not read.

:func:`load_snapshot` reads the object store (driver); :func:`plan_read` is pure.
The plan is a plain picklable value.
"""
from __future__ import annotations

from dataclasses import dataclass

from iox_spark.catalog.delete_predicate import literal_kind
from iox_spark.catalog.errors import CatalogError, InvalidKey
from iox_spark.catalog.object_store import ObjectStore
from iox_spark.catalog.preserved_catalog import CatalogState, ColumnSpec, read_state
from iox_spark.catalog.retention import reader_lo_ns
from iox_spark.chunk_store.arrow_merge import ArrowDelete, deletes_supported
from iox_spark.chunk_store.views import overlap_groups

from iox_spark.source.errors import (CatalogUnreadable, DatabaseNotFound, InvalidOption, RevisionNotFound,
                                     TableNotFound, UnsupportedDelete)

__all__ = ["PARTITION_BYTES", "OWNER_ROWS_KEY", "FileRef", "ReadPlan", "load_snapshot", "plan_read", "literal_kind",
           "pack_groups"]

#: the key of the pseudo file that stands for the owner's unpersisted rows in a plan's groups (no
#: object key is empty)
OWNER_ROWS_KEY = ""

#: groups of files are packed into one input partition up to this many Parquet bytes (a group
#: larger than it is a partition of its own), as Spark packs files (spark.sql.files.maxPartitionBytes)
PARTITION_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class FileRef:
    """One Parquet file of the plan: its key, the inclusive time range of its rows, its size."""

    key: str
    min_time_ns: int
    max_time_ns: int
    size_bytes: int = 0


@dataclass(frozen=True)
class ReadPlan:
    """What a read of one table returns, as of catalog ``revision``."""

    database: str
    table: str
    revision: int
    #: the table's columns (name, role, type) as the catalog records them, time included
    columns: tuple[ColumnSpec, ...]
    #: files grouped by time overlap, ordered by time: each group is merged on its own
    groups: tuple[tuple[FileRef, ...], ...]
    #: every delete recorded for the table, in commit order
    deletes: tuple[ArrowDelete, ...]
    #: rows with time_ns below it are not returned (retention); None: no bound
    reader_lo_ns: int | None = None
    #: the ingester pool owner's unpersisted rows (Arrow IPC, chunk layout; b"": none), read as the
    #: file named OWNER_ROWS_KEY of the groups (iox_spark/source/owner_rows.py)
    owner_rows: bytes = b""

    def tags(self) -> list[str]:
        """Tag names in the order the server's queries present them (by name)."""
        return sorted(c[0] for c in self.columns if c[1] == "tag")

    def fields(self) -> list[tuple[str, str]]:
        """(name, type) of the fields in the order the server's queries present them (by name)."""
        return sorted((c[0], c[2]) for c in self.columns if c[1] == "field")

    def value_columns(self) -> list[tuple[str, str]]:
        """(name, type) of tags then fields: the chunk layout an executor conforms every file to."""
        return [(t, "string") for t in self.tags()] + self.fields()


def load_snapshot(store: ObjectStore, database: str, revision: int | None) -> CatalogState:
    """The catalog state of `database` as of `revision` (None: the newest). Driver side."""
    try:
        state = read_state(store, database, revision)
    except InvalidKey as exc:
        raise InvalidOption("database", str(exc)) from exc
    except CatalogError as exc:
        raise CatalogUnreadable(database, str(exc)) from exc
    if state is None:
        raise DatabaseNotFound(store.url, database)
    if revision is not None and state.revision != revision:
        raise RevisionNotFound(database, revision, state.revision)
    return state


def plan_read(state: CatalogState, table: str, now_s: float, owner=None) -> ReadPlan:
    """The plan of reading `table` from `state`; `now_s` (the caller's clock) places the retention
    bound; `owner`: the pool owner's unpersisted rows (owner_rows.OwnerRows) to read with the files
    (its columns and deletes join the plan's). Raises TableNotFound when neither the snapshot nor the
    owner has a schema for it, UnsupportedDelete when a delete cannot be evaluated. Pure."""
    columns = state.table_schemas.get(table)
    if owner is not None and owner.columns:
        have = {c[0] for c in columns or ()}
        columns = tuple(columns or ()) + tuple(tuple(c) for c in owner.columns if c[0] not in have)
    if columns is None:
        raise TableNotFound(state.db, table, state.revision, sorted(state.table_schemas))
    deletes = tuple(ArrowDelete(p.start_ns, p.stop_ns_exclusive, p.seq,
                                tuple((c, op, v, literal_kind(v)) for c, op, v in p.predicate))
                    for p in state.delete_predicates if p.table is None or p.table == table)
    if owner is not None:
        deletes += tuple(owner.deletes)
    col_types = {c[0]: c[2] for c in columns if c[1] != "time"}
    for d in deletes:
        if not deletes_supported([d], col_types):
            raise UnsupportedDelete(table, d.terms)
    lo = _reader_lo(state, now_s)
    files = sorted((FileRef(f.key, f.min_time_ns, f.max_time_ns, f.size_bytes) for f in state.files.values()
                    if f.table == table and (lo is None or f.max_time_ns >= lo)),
                   key=lambda f: (f.min_time_ns, f.key))
    extra = b""
    if owner is not None and owner.ipc and (lo is None or owner.max_time_ns >= lo):
        extra = owner.ipc
        files = sorted(files + [FileRef(OWNER_ROWS_KEY, owner.min_time_ns, owner.max_time_ns, len(extra))],
                       key=lambda f: (f.min_time_ns, f.key))
    groups = tuple(tuple(g) for g in overlap_groups(files))
    return ReadPlan(database=state.db, table=table, revision=state.revision, columns=tuple(columns),
                    groups=groups, deletes=deletes, reader_lo_ns=lo, owner_rows=extra)


def pack_groups(groups, target_bytes: int = PARTITION_BYTES) -> list[tuple]:
    """`groups` (of FileRef) packed in order into runs of at most `target_bytes` Parquet bytes each
    (a group alone may exceed it): each run is one input partition. Pure."""
    runs: list[list] = []
    used = 0
    for g in groups:
        size = sum(f.size_bytes for f in g)
        if not runs or used + size > target_bytes:
            runs.append([])
            used = 0
        runs[-1].append(g)
        used += size
    return [tuple(r) for r in runs]


def _reader_lo(state: CatalogState, now_s: float) -> int | None:
    """The oldest time returned: the retention's reader_lo at `now_s`, never below the pruner's
    watermark (rows below it may be gone from some files and not yet from others)."""
    bounds = [b for b in (reader_lo_ns(state.retention_period_s, now_s), state.pruner_hi_ns) if b is not None]
    return max(bounds) if bounds else None
