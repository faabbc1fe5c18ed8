"""Publication of the preserved catalog as Apache Iceberg tables, exactly once and in order.

One Iceberg namespace per database and one Iceberg table per table, in an Iceberg catalog reached
through pyiceberg (a SQL catalog, by default on SQLite in the data directory, or a REST catalog).
The Iceberg table's data files are our persisted Parquet files, referenced where they are (no copy),
except where a merge is needed (lifecycle/iceberg_plan.py: deletes, files whose time ranges meet).
It is partitioned by day like our catalog: the identity of a DATE column ``_iox_day`` (catalog/schema.py
``DAY_COLUMN``), whose value each data file carries in Iceberg's manifests (the day of its partition
key), not in its rows; a table published unpartitioned by an earlier version is partitioned by its
next snapshot, which references all its files again. Its schema is the files' columns but our write
order ``_iox_seq`` (``_visible``: the published files need no deduplication by readers); a table
published with it by an earlier version drops it from its schema in its next snapshot.
Its metadata and those copies live in the object store under ``<db>/iceberg/<table>/``.

Invariant kept here: every revision of a database's preserved catalog that changes what a table's
Iceberg table must reference becomes exactly one Iceberg snapshot of that table, in revision order,
and its summary carries the revision (``iox.revision``), the transaction's uuid and the Kafka
offsets of the table's partition checkpoints at it. Never twice: a snapshot is committed only for
a revision above the table's ``iox.revision`` and only on top of the snapshot this publisher read
(pyiceberg's optimistic commit refuses it when another writer committed in between). Never skipped:
the publisher follows the log revision by revision (``read_next_state``) from the lowest
``iox.revision`` of the database's Iceberg tables, so after a crash between our commit and
Iceberg's (crash point ``iceberg_before_commit``) the next start publishes what is missing. A
database whose catalog has no Iceberg table yet is published from its newest revision (one snapshot
per table). A fenced catalog publishes nothing (its new owner does); in a pool a member publishes
the tables of the Kafka partitions it owns.

When it runs: :class:`IcebergPublication`'s thread, started by the server once the lifecycle runs,
every ``PUBLISH_INTERVAL_S``; a failing database is logged and retried at the next round without
stopping the others; it stops with the server (a publication not made is made at the next start).
Driver only; nothing here is picklable or runs on an executor.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from iox_spark.catalog.crash_points import CrashPoint, crash_point
from iox_spark.catalog.object_store import LocalObjectStore, ObjectStore, S3ObjectStore, encode_key_segment
from iox_spark.catalog.partition_keys import day_number_of_key
from iox_spark.catalog.preserved_catalog import CatalogState, read_next_state, read_state
from iox_spark.catalog.schema import DAY_COLUMN, SEQ_COLUMN
from iox_spark.lifecycle.errors import IcebergPublicationFailed
from iox_spark.lifecycle.iceberg_keys import KeyOverlap
from iox_spark.lifecycle.iceberg_plan import PublishedFile, changed_tables, iceberg_prefix, published_files

__all__ = ["CATALOG_NAME", "ICEBERG_OFF", "ICEBERG_SQLITE", "POOL_NEEDS_SHARED_CATALOG", "POOL_SQLITE_DIR", "PUBLISH_INTERVAL_S", "REVISION_PROPERTY", "catalog_properties",
           "IcebergPublisher", "IcebergPublication", "owns_table", "publication_for"]

log = logging.getLogger(__name__)

#: ``--iceberg-catalog`` values: no publication, and the default SQL catalog on SQLite in the data directory
ICEBERG_OFF = "off"
ICEBERG_SQLITE = "sqlite"
#: the default catalog's file in the data directory
SQLITE_FILE = "iceberg-catalog.db"
#: where the default catalog's file is for the members of an ingester pool: in the object-store
#: directory they share, so that every member publishes to (and every reader finds) one catalog
POOL_SQLITE_DIR = "iox~iceberg"
#: why an ingester pool on S3 cannot keep the default catalog
POOL_NEEDS_SHARED_CATALOG = (
    "the members of an ingester pool publish to one Iceberg catalog; the default (a SQLite file) is shared "
    "only through a local object-store directory: give every member the same --iceberg-catalog, a SQLAlchemy "
    "URI (postgresql://...) or an http(s):// REST catalog, or off")
#: the Iceberg catalog's name: a SQL catalog keeps the tables of each name apart, so a reader loads
#: it under this name (``pyiceberg.catalog.load_catalog("iox", type="sql", uri=...)``)
CATALOG_NAME = "iox"
#: how often the publication looks for new revisions, in seconds
PUBLISH_INTERVAL_S = 0.5
#: how long a snapshot replaced by a newer one stays readable (time travel), in seconds: the cleanup
#: of our files (lifecycle/worker.py, through its ``published_keys`` hook) and of the copies keeps
#: every file a snapshot not yet expired references
SNAPSHOT_RETENTION_S = 900.0
#: how often a table's snapshots older than ``SNAPSHOT_RETENTION_S`` are expired and the copies no
#: snapshot references any more are deleted, in seconds
MAINTENANCE_INTERVAL_S = 60.0
#: snapshot summary keys: the revision the snapshot publishes, its transaction, the Kafka offsets
REVISION_PROPERTY = "iox.revision"
TRANSACTION_PROPERTY = "iox.transaction"
OFFSETS_PROPERTY = "iox.kafka-offsets"
_NAME_MAPPING = "schema.name-mapping.default"


def catalog_properties(spec: str, data_dir: str, store: ObjectStore, *, pool: bool = False) -> dict[str, str] | None:
    """pyiceberg ``load_catalog`` properties for ``--iceberg-catalog`` ``spec``; None when ``off``.

    ``sqlite`` (the default): a SQL catalog in ``<data_dir>/iceberg-catalog.db``, or for a member of
    an ingester pool (``pool``) in ``<object-store>/iox~iceberg/iceberg-catalog.db``, the directory
    the pool's members share (on S3 there is no shared file: ServerConfig refuses that
    combination, and so does this function); ``http(s)://...``: a REST catalog; any other URI
    (``sqlite:///path``, ``postgresql://...``): a SQL catalog on that SQLAlchemy URI. The object
    store's S3 endpoint and credentials are the catalog's file IO's.
    """
    if spec == ICEBERG_OFF:
        return None
    if spec == ICEBERG_SQLITE:
        if pool and not isinstance(store, LocalObjectStore):
            raise ValueError(POOL_NEEDS_SHARED_CATALOG)
        directory = os.path.join(store.root_dir, POOL_SQLITE_DIR) if pool else os.path.abspath(data_dir)
        os.makedirs(directory, exist_ok=True)
        props = {"type": "sql", "uri": f"sqlite:///{os.path.join(directory, SQLITE_FILE)}"}
    elif spec.startswith(("http://", "https://")):
        props = {"type": "rest", "uri": spec}
    elif "://" in spec:
        props = {"type": "sql", "uri": spec}
    else:
        raise ValueError(f"--iceberg-catalog {spec!r}: expected off, sqlite, an http(s):// REST catalog URI "
                         "or a SQLAlchemy URI (sqlite:///path, postgresql://...)")
    props["warehouse"] = store.url
    if isinstance(store, S3ObjectStore):
        cfg = store.config
        props["s3.region"] = cfg.region
        if cfg.endpoint_url:
            props["s3.endpoint"] = cfg.endpoint_url
        if cfg.access_key_id is not None:
            props["s3.access-key-id"] = cfg.access_key_id
            props["s3.secret-access-key"] = cfg.secret_access_key
    return props


@dataclass
class _Published:
    """What this publisher knows of one Iceberg table: the table, its revision and its data files."""

    table: Any
    revision: int
    #: file path → pyiceberg DataFile of the current snapshot
    files: dict[str, Any] = field(default_factory=dict)
    #: paths of the files any snapshot not expired references (the current one's included)
    referenced: set[str] = field(default_factory=set)
    #: `now` of the last maintenance (0: none yet)
    maintained_s: float = 0.0


class IcebergPublisher:
    """Brings the Iceberg tables of databases up to their preserved catalogs (module docstring).

    Called from one thread at a time (the publication's); holds the pyiceberg catalog, opened on
    first use, and what it read of each table.
    """

    def __init__(self, properties: dict[str, str], store: ObjectStore) -> None:
        self._properties = dict(properties)
        self._store = store
        self._catalog = None
        self._tables: dict[tuple[str, str], _Published] = {}
        #: database → the revision every table of it was brought up to
        self._revision: dict[str, int] = {}
        self._state: dict[str, CatalogState] = {}
        #: database → object keys a snapshot not expired references (read by the cleanup's thread)
        self._published_keys: dict[str, frozenset] = {}
        self._keys_lock = threading.Lock()
        #: which files may share a (tags, time) key, so that only those are merged into copies
        self._overlap = KeyOverlap(store)

    def published_keys(self, db: str) -> frozenset | None:
        """Object keys of ``db``'s files a snapshot not expired references; None before this
        publisher read the database's Iceberg tables. Any thread."""
        with self._keys_lock:
            return self._published_keys.get(db)

    def published_revision(self, db: str) -> int | None:
        """The revision of ``db`` every table was brought up to, None before the first publication."""
        return self._revision.get(db)

    def publish(self, state: CatalogState, owns_table: Callable[[str], bool] = lambda _t: True,
                stopping: Callable[[], bool] = lambda: False) -> int:
        """Publishes every revision of ``state.db`` from the last one published up to ``state`` (the
        newest state of the database's catalog), one snapshot per table a revision changes; returns
        the snapshots committed. ``owns_table``: whether this server publishes a table (a pool member
        publishes its partitions' tables). ``stopping``: asked before each table's snapshot; once it
        says True, the call returns (the server is stopping) and the next publisher goes on from the
        tables committed, as after a kill. Raises IcebergPublicationFailed (the cause chained); what
        was committed before it stays, and the next call goes on from there."""
        db = state.db
        last = self._revision.get(db)
        if last is None:
            last = self._start(state)
        if last >= state.revision:
            return 0
        prev = self._state.get(db)
        committed = 0
        for revision in range(last + 1, state.revision + 1):
            if revision == state.revision:
                current = state
            elif prev is not None and prev.revision == revision - 1:
                current = read_next_state(self._store, db, prev)
            else:
                current = read_state(self._store, db, revision)
            if current is None or current.revision != revision:
                raise IcebergPublicationFailed(db, None, revision, "the catalog's transaction is not readable")
            before = prev if prev is not None and prev.revision == revision - 1 else None
            changed = changed_tables(before, current)
            if before is None:  # every table this publisher knows, also one whose files all went
                changed |= {t for (d, t) in self._tables if d == db}
            n, whole = self._publish_revision(current, owns_table, changed, stopping)
            committed += n
            if not whole:
                return committed
            self._revision[db] = revision
            self._state[db] = prev = current
        self._overlap.forget_except(encode_key_segment(db) + "/", state.files)
        return committed

    # -- internals -----------------------------------------------------------------------------

    def _iceberg(self):
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            self._catalog = load_catalog(CATALOG_NAME, **self._properties)
        return self._catalog

    def _start(self, state: CatalogState) -> int:
        """Reads the database's Iceberg tables; the revision to publish after (module docstring)."""
        cat = self._iceberg()
        db = state.db
        try:
            identifiers = cat.list_tables(db)
        except Exception as e:  # noqa: BLE001 - pyiceberg raises NoSuchNamespaceError for a new database
            if type(e).__name__ != "NoSuchNamespaceError":
                raise IcebergPublicationFailed(db, None, state.revision, "listing the namespace failed") from e
            identifiers = []
        revisions = []
        for ident in identifiers:
            table = ident[-1]
            self._tables[(db, table)] = p = self._read(cat.load_table((db, table)))
            revisions.append(p.revision)
            if p.revision > state.revision:
                log.warning("iceberg: %s.%s is published up to revision %d, above the catalog's %d; it is "
                            "left as it is until the catalog passes it", db, table, p.revision, state.revision)
        self._note_keys(db)
        return min(min(revisions), state.revision - 1) if revisions else state.revision - 1

    def _note_keys(self, db: str) -> None:
        keys = frozenset(self._key(path) for (d, _t), p in self._tables.items() if d == db for path in p.referenced)
        with self._keys_lock:
            self._published_keys[db] = frozenset(k for k in keys if k is not None)

    def _key(self, path: str) -> str | None:
        """The object key of a data file path of ours (None for a path outside the store)."""
        prefix = self._path("")
        return path[len(prefix):] if path.startswith(prefix) else None

    def _read(self, tbl, *, all_snapshots: bool = True) -> _Published:
        """What ``tbl`` references: the current snapshot's files and revision, and (``all_snapshots``)
        the files of every snapshot it keeps."""
        snap = tbl.current_snapshot()
        files: dict[str, Any] = {}
        revision = -1
        if snap is not None:
            revision = int(snap.summary.additional_properties.get(REVISION_PROPERTY, -1)) if snap.summary else -1
            files = _data_files(tbl, snap)
        referenced = set(files)
        if all_snapshots:
            for other in tbl.snapshots():
                if snap is None or other.snapshot_id != snap.snapshot_id:
                    referenced.update(_data_files(tbl, other))
        return _Published(tbl, revision, files, referenced)

    def _path(self, key: str) -> str:
        if isinstance(self._store, LocalObjectStore):
            return "file://" + os.path.join(self._store.root_dir, key)
        return f"{self._store.url}/{key}"

    def _publish_revision(self, state: CatalogState, owns_table: Callable[[str], bool], changed: set[str],
                          stopping: Callable[[], bool]) -> tuple[int, bool]:
        """Publishes ``state`` to the Iceberg tables of the tables in ``changed`` (changed_tables):
        (snapshots committed, whether every table was brought up to it: False once ``stopping``)."""
        db = state.db
        if not changed:
            return 0, True
        by_table: dict[str, list] = {}
        for f in state.files.values():
            if f.table in changed:
                by_table.setdefault(f.table, []).append(f)
        committed = 0
        for table in sorted(changed):
            if not owns_table(table):
                continue
            if stopping():
                return committed, False
            p = self._tables.get((db, table))
            if p is not None and p.revision >= state.revision:
                continue
            tags = tuple(name for name, role, _t in state.table_schemas.get(table, ()) if role == "tag")
            wanted = published_files(state, table, by_table.get(table, []),
                                     lambda f, earlier, tags=tags: self._overlap.shares_keys(f, earlier, tags))
            paths = {self._path(k): f for k, f in wanted.items()}
            if set(paths) == set(p.files if p is not None else ()):
                continue
            try:
                committed += self._commit(state, table, p, paths)
            except IcebergPublicationFailed:
                raise
            except Exception as e:
                raise IcebergPublicationFailed(db, table, state.revision, f"{type(e).__name__}: {e}") from e
        return committed, True

    def _commit(self, state: CatalogState, table: str, p: _Published | None, wanted: dict[str, PublishedFile]) -> int:
        """Commits one snapshot bringing ``table``'s Iceberg table to ``wanted``; 1 when it committed,
        0 when the table (created or changed by another writer meanwhile) needs nothing."""
        import pyarrow.parquet as pq
        from pyiceberg.exceptions import CommitFailedException

        db = state.db
        fs, _base = self._store.arrow_fs()
        if p is None:
            if not wanted:
                return 0
            first = next(iter(wanted.values()))
            if first.is_copy:
                _write_copy(self._store, state, table, first)
            cat = self._iceberg()
            cat.create_namespace_if_not_exists(db)
            location = self._path(iceberg_prefix(db, table)).rstrip("/")
            try:
                tbl = cat.create_table((db, table), location=location, properties={"format-version": "2"},
                                       # with the write order, which its first snapshot drops: the
                                       # column keeps a field id, that the name mapping gives it
                                       schema=pq.read_schema(self._store.arrow_path(first.key), filesystem=fs))
            except Exception as e:  # noqa: BLE001 - created since this publisher read the namespace: by
                # another writer sharing the catalog, or by this one before a crash
                if type(e).__name__ != "TableAlreadyExistsError":
                    raise
                tbl = cat.load_table((db, table))
            p = self._tables[(db, table)] = self._read(tbl)
            self._note_keys(db)
            if p.revision >= state.revision or set(p.files) == set(wanted):
                return 0
        current = p.files
        new = [path for path in wanted if path not in current]
        for path in new:
            if wanted[path].is_copy:
                _write_copy(self._store, state, table, wanted[path])
        # the columns of the files the table does not reference yet (the others' are in its schema)
        schemas = [_visible(pq.read_schema(self._store.arrow_path(wanted[path].key), filesystem=fs)) for path in new]
        tbl = p.table
        # a new table, or one an earlier version published unpartitioned: this snapshot adds the day
        # partitioning and references every file again under it (no data is copied)
        by_day = _partitioned_by_day(tbl.metadata)
        added = new if by_day else list(wanted)
        removed = [path for path in current if path not in wanted] if by_day else list(current)
        props = {REVISION_PROPERTY: str(state.revision), TRANSACTION_PROPERTY: state.transaction_uuid,
                 OFFSETS_PROPERTY: json.dumps(_offsets(state, table), sort_keys=True)}
        crash_point(CrashPoint.ICEBERG_BEFORE_COMMIT)
        try:
            with tbl.transaction() as tx:
                for schema in schemas:
                    with tx.update_schema() as update:
                        update.union_by_name(schema)
                if SEQ_COLUMN in {f.name for f in tx.table_metadata.schema().fields}:
                    # a new table, or one an earlier version published showing the write order
                    with tx.update_schema() as update:
                        update.delete_column(SEQ_COLUMN)
                if not by_day:
                    _partition_by_day(tx)
                tx.set_properties(**{_NAME_MAPPING: _name_mapping(tx.table_metadata)})
                with tx.update_snapshot(snapshot_properties=props).overwrite() as files:
                    for path in removed:
                        files.delete_data_file(current[path])
                    for path in added:
                        files.append_data_file(_data_file(tbl.io, tx.table_metadata, path, wanted[path].partition_key))
        except CommitFailedException as e:
            # another writer committed first: read the table again; the next round goes on from it
            self._tables[(db, table)] = self._read(self._iceberg().load_table((db, table)))
            self._note_keys(db)
            raise IcebergPublicationFailed(db, table, state.revision, "another writer committed first") from e
        after = self._read(tbl, all_snapshots=False)
        after.referenced |= p.referenced
        after.maintained_s = p.maintained_s
        self._tables[(db, table)] = after
        self._note_keys(db)
        return 1

    def maintain(self, db: str, now_s: float, owns_table: Callable[[str], bool] = lambda _t: True) -> list[str]:
        """For each Iceberg table of ``db`` not maintained in the last ``MAINTENANCE_INTERVAL_S``:
        expires the snapshots older than ``SNAPSHOT_RETENTION_S`` (never the current one) and deletes
        the copies no snapshot left references, written at least ``SNAPSHOT_RETENTION_S`` ago (one a
        crash left before its commit is written again when needed). Only the tables ``owns_table``
        answers True for: another owner maintains the others. Returns the deleted keys.
        ``now_s``: the caller's clock, seconds since the epoch."""
        import datetime as _dt

        from iox_spark.lifecycle.iceberg_plan import copies_prefix

        deleted: list[str] = []
        for (d, table), p in sorted(self._tables.items()):
            if d != db or now_s - p.maintained_s < MAINTENANCE_INTERVAL_S or not owns_table(table):
                continue
            tbl = p.table
            cutoff_ms = int((now_s - SNAPSHOT_RETENTION_S) * 1000)
            current = tbl.current_snapshot()
            old = [s.snapshot_id for s in tbl.snapshots()
                   if s.timestamp_ms < cutoff_ms and (current is None or s.snapshot_id != current.snapshot_id)]
            if old:
                tbl.maintenance.expire_snapshots().older_than(
                    _dt.datetime.fromtimestamp(cutoff_ms / 1000, tz=_dt.timezone.utc)).commit()
                tbl = self._iceberg().load_table((db, table))
            p = self._tables[(db, table)] = self._read(tbl)
            p.maintained_s = now_s
            self._note_keys(db)
            for meta in self._store.list(copies_prefix(db, table)):
                if meta.key.endswith(".parquet") and self._path(meta.key) not in p.referenced \
                        and now_s - meta.last_modified_s >= SNAPSHOT_RETENTION_S:
                    self._store.delete(meta.key)
                    deleted.append(meta.key)
        return deleted


def _partitioned_by_day(metadata) -> bool:
    """Whether a table's current partition spec is the identity of ``DAY_COLUMN`` (_partition_by_day)."""
    from pyiceberg.transforms import IdentityTransform

    names = {f.field_id: f.name for f in metadata.schema().fields}
    fields = metadata.spec().fields
    return (len(fields) == 1 and names.get(fields[0].source_id) == DAY_COLUMN
            and isinstance(fields[0].transform, IdentityTransform))


def _partition_by_day(tx) -> None:
    """Within ``tx``: adds ``DAY_COLUMN`` (a DATE: the UTC day of our partition, the same for every row of
    a file) and makes it the partition spec's one field, by identity. Iceberg keeps an identity
    partition's value in its manifests, so the column need not be in the data files: readers fill it
    from there, as the Iceberg spec's column projection rules ask (pyiceberg and DuckDB are tested),
    and prune files by it."""
    from pyiceberg.types import DateType

    if DAY_COLUMN not in {f.name for f in tx.table_metadata.schema().fields}:
        with tx.update_schema() as update:
            update.add_column(DAY_COLUMN, DateType(), doc="the UTC day of the row's partition")
    with tx.update_spec() as spec:
        for f in tx.table_metadata.spec().fields:
            spec.remove_field(f.name)
        spec.add_identity(DAY_COLUMN)


def _visible(arrow_schema):
    """The columns of one of our Parquet files that its Iceberg table shows: all but ``SEQ_COLUMN`` (our
    write order, used by our deduplication and deletes, which the published files already applied:
    lifecycle/iceberg_plan.py)."""
    i = arrow_schema.get_field_index(SEQ_COLUMN)
    return arrow_schema if i < 0 else arrow_schema.remove(i)


def _name_mapping(metadata) -> str:
    """The table's name mapping (JSON), by which readers give our files' columns (which carry no field
    ids) their field ids: the current schema's, and ``SEQ_COLUMN`` under the field id it had before the
    schema dropped it (a field id is never given again), so that a reader that maps every column of a
    file (pyiceberg does) finds it, and reads it as the dropped column it is: not at all."""
    from pyiceberg.table.name_mapping import MappedField, NameMapping

    fields = list(metadata.schema().name_mapping.root)  # a copy: the schema caches its mapping
    seq_ids = [f.field_id for s in metadata.schemas for f in s.fields if f.name == SEQ_COLUMN]
    if seq_ids and SEQ_COLUMN not in {f.name for f in metadata.schema().fields}:
        fields.append(MappedField(field_id=seq_ids[-1], names=[SEQ_COLUMN]))
    return NameMapping(fields).model_dump_json()


#: the field id ``SEQ_COLUMN``'s statistics are collected under while a data file is described (no
#: field of the table has it: Iceberg field ids are positive), then dropped
_HIDDEN_FIELD_ID = -1


def _data_file(io, metadata, path: str, partition_key: str):
    """The pyiceberg DataFile of our Parquet file at ``path`` (its column statistics, under ``metadata``'s
    field ids) in the day partition of ``partition_key``: pyiceberg's ``parquet_file_to_data_file``,
    with the partition value given, as the file has no ``DAY_COLUMN`` to infer it from, and with no
    statistics of ``SEQ_COLUMN``, which the table does not show (``_visible``)."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (MetricModeTypes, MetricsMode, StatisticsCollector,
                                      _check_pyarrow_schema_compatible, compute_statistics_plan,
                                      data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping)
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType

    input_file = io.new_input(path)
    with input_file.open() as stream:
        parquet_metadata = pq.read_metadata(stream)
    schema = metadata.schema()
    file_schema = parquet_metadata.schema.to_arrow_schema()
    _check_pyarrow_schema_compatible(schema, _visible(file_schema), format_version=metadata.format_version)
    stats_columns = compute_statistics_plan(schema, metadata.properties)
    mapping = parquet_path_to_id_mapping(schema)
    if SEQ_COLUMN in file_schema.names:
        mapping[SEQ_COLUMN] = _HIDDEN_FIELD_ID
        stats_columns[_HIDDEN_FIELD_ID] = StatisticsCollector(
            field_id=_HIDDEN_FIELD_ID, iceberg_type=LongType(), mode=MetricsMode(MetricModeTypes.NONE),
            column_name=SEQ_COLUMN)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata, stats_columns=stats_columns, parquet_column_mapping=mapping)
    for counts in (statistics.column_sizes, statistics.value_counts, statistics.null_value_counts,
                   statistics.nan_value_counts, statistics.column_aggregates):
        counts.pop(_HIDDEN_FIELD_ID, None)
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
        partition=Record(day_number_of_key(partition_key)), file_size_in_bytes=len(input_file), sort_order_id=None,
        spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None, **statistics.to_serialized_dict())


def _data_files(tbl, snapshot) -> dict[str, Any]:
    """File path → DataFile of every live data file of ``snapshot``."""
    return {entry.data_file.file_path: entry.data_file for manifest in snapshot.manifests(tbl.io)
            for entry in manifest.fetch_manifest_entry(tbl.io, discard_deleted=True)}


def _offsets(state: CatalogState, table: str) -> dict[str, dict[str, list[int]]]:
    """{partition key: {Kafka partition: [min unpersisted offset, max offset]}} of the table's checkpoints."""
    return {pkey: {str(kp): list(r) for kp, r in sorted(ck.sequencer_numbers.items())}
            for (t, pkey), ck in sorted(state.partition_checkpoints.items()) if t == table}


def _write_copy(store: ObjectStore, state: CatalogState, table: str, pf: PublishedFile) -> None:
    """Writes the copy ``pf`` (lifecycle/iceberg_plan.py): its sources' rows, each source's deletes
    applied, deduplicated across sources, in the columns of its sources. Idempotent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iox_spark.catalog.delete_predicate import literal_kind
    from iox_spark.chunk_store.arrow_merge import ArrowDelete, apply_deletes, deduplicate

    columns = state.table_schemas.get(table, ())
    col_types = {name: typ for name, role, typ in columns if role not in ("time",)}
    fs, _base = store.arrow_fs()
    deletes = dict(pf.deletes)
    parts = []
    for src in pf.sources:
        t = pq.read_table(store.arrow_path(src.key), filesystem=fs)
        if src.key in deletes:
            t = apply_deletes(t, [ArrowDelete(d.start_ns, d.stop_ns_exclusive, d.seq,
                                              tuple((c, op, v, literal_kind(v)) for c, op, v in d.predicate))
                                  for d in deletes[src.key]], col_types)
        parts.append(t)
    merged = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    if len(parts) > 1:
        names = set(merged.column_names)
        tags = [n for n, role, _t in columns if role == "tag" and n in names]
        fields = [n for n, role, _t in columns if role not in ("tag", "time") and n in names]
        order = merged.column_names
        merged = deduplicate(merged, tags, fields).select(order)
    out_fs, path = store.arrow_prepare_write(pf.key)
    pq.write_table(merged, path, filesystem=out_fs)
    store.arrow_finish_write([pf.key])


class IcebergPublication:
    """The thread that publishes every database's preserved catalog (module docstring).

    ``catalogs``: () → {database name: PreservedCatalog} (the lifecycle's); ``owns_table``:
    (PreservedCatalog, table) → whether this server publishes the table. ``start`` once, ``stop``
    at the server's stop (idempotent).
    """

    def __init__(self, publisher: IcebergPublisher, catalogs: Callable[[], dict],
                 owns_table: Callable[[Any, str], bool], interval_s: float = PUBLISH_INTERVAL_S) -> None:
        self._publisher = publisher
        self._catalogs = catalogs
        self._owns_table = owns_table
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures: dict[str, str] = {}

    @property
    def publisher(self) -> IcebergPublisher:
        return self._publisher

    def failures(self) -> dict[str, str]:
        """Database → why its last publication failed (empty when every one succeeded)."""
        return dict(self._failures)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="iceberg-publication", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the loop: a round in progress returns before its next table's snapshot (the next
        start goes on from the tables committed, as after a kill), so a backlog does not hold the
        server's stop."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(30)

    def published_keys(self, db: str) -> frozenset | None:
        """Object keys of ``db`` an Iceberg snapshot not expired references (lifecycle/hooks.py
        ``published_keys``); None (the cleanup leaves the database alone) until the publication
        reached the catalog's newest revision: the files of the revisions it has still to publish
        are read then, though the catalog may no longer reference them. Any thread."""
        pc = self._catalogs().get(db)
        if pc is not None and not pc.fenced:
            revision = self._publisher.published_revision(db)
            if revision is None or revision < pc.state.revision:
                return None
        return self._publisher.published_keys(db)

    def run_once(self, now_s: float) -> int:
        """One round over every database (publication, then maintenance when due); returns the
        snapshots committed. Never raises for one database. ``now_s``: the loop's clock."""
        committed = 0
        for name, pc in sorted(self._catalogs().items()):
            if self._stopped.is_set():
                break
            if pc.fenced:
                continue
            try:
                owns = lambda table, pc=pc: self._owns_table(pc, table)  # noqa: E731
                committed += self._publisher.publish(pc.state, owns, self._stopped.is_set)
                if self._stopped.is_set():
                    break
                self._publisher.maintain(name, now_s, owns)
                self._failures.pop(name, None)
            except Exception as e:  # noqa: BLE001 - one database's failure never stops the others
                if self._failures.get(name) != str(e):
                    log.warning("iceberg: publishing database %s failed (retried every %.1fs): %s", name,
                                self._interval_s, e, exc_info=not isinstance(e, IcebergPublicationFailed))
                self._failures[name] = str(e)
        return committed

    def _run(self) -> None:
        import time

        while not self._stopped.wait(self._interval_s):
            self.run_once(time.time())


def owns_table(pc, table: str) -> bool:
    """Whether this server publishes ``table`` of the database whose PreservedCatalog is ``pc``: every
    table of a database outside a pool; in a pool, the tables of the Kafka partitions it owns."""
    state = pc.state
    if not state.pooled:
        return True
    from iox_spark.catalog.sharding import partition_for

    return partition_for(table, state.pool_kafka_partitions) in pc.owned_partitions


def publication_for(spec: str, data_dir: str, store: ObjectStore,
                    catalogs: Callable[[], dict], *, pool: bool = False) -> IcebergPublication | None:
    """The publication ``--iceberg-catalog spec`` asks for (not started), None when ``off``; ``pool``:
    the server is a member of an ingester pool (catalog_properties)."""
    props = catalog_properties(spec, data_dir, store, pool=pool)
    if props is None:
        return None
    return IcebergPublication(IcebergPublisher(props, store), catalogs, owns_table)
