"""Iceberg publication (lifecycle/iceberg_publication.py, lifecycle/iceberg_plan.py) against real
pyiceberg (a SQL catalog on SQLite) and real DuckDB (its Iceberg extension), on a real preserved
catalog in a local object store: a hypothesis state machine persists files, records deletes,
compacts, prunes and restarts the publisher, publishing now and then (so one publication may have
to follow several revisions), and checks after each publication and at the end that the Iceberg table holds exactly the
rows a plain-Python oracle computes from the acknowledged files and deletes, and that every
revision is published at most once, in order. A longer run than CI's:
``IOX_ICEBERG_EXAMPLES=400 IOX_ICEBERG_STEPS=30 .venv/bin/python -m pytest
tests/unit/lifecycle/test_iceberg_publication.py -k Publication --timeout=0`` (about 3 minutes;
``--timeout=0`` lifts pyproject.toml's 600 s per test).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.partition_keys import partition_key_of_day
from iox_spark.catalog.preserved_catalog import (AddDeletePredicate, AddParquet, PreservedCatalog,
                                                 PreservedCatalogConfig, RemoveParquet, SetTableSchema)
from iox_spark.lifecycle.iceberg_plan import published_files
from tests.iceberg_tables import duckdb
from iox_spark.lifecycle.iceberg_publication import (REVISION_PROPERTY, IcebergPublication, IcebergPublisher,
                                                     catalog_properties, owns_table)

DB, TABLE = "telemetry", "cpu"
#: the partition key of day 0 (1970-01-01), where the tests' rows with small times are
D0 = partition_key_of_day(0)
DAY = 86_400 * 10**9
COLUMNS = (("host", "tag", "string"), ("usage", "field", "float"), ("time", "time", "time"))
HOSTS = ("a", "b", "c")
#: the publication loop's clock in the tests that do not age anything
NOW = 2_000_000_000.0


def _oracle(files: dict, deletes: list) -> set:
    """{(host, usage, time_ns)}: each file's rows minus the deletes applying to it (rows written before
    the delete), then one row per (host, time_ns) with the last non-null usage by seq."""
    rows = []
    for key, frows in files.items():
        for r in frows:
            gone = any(key in d["applies_to"] and r["_iox_seq"] < d["seq"] and d["start"] <= r["time_ns"] < d["stop"]
                       and r["host"] == d["host"] for d in deletes)
            if not gone:
                rows.append(r)
    merged: dict = {}
    for r in sorted(rows, key=lambda r: r["_iox_seq"]):
        k = (r["host"], r["time_ns"])
        prev = merged.get(k)
        usage = r["usage"] if r["usage"] is not None else (prev["usage"] if prev else None)
        merged[k] = {"host": r["host"], "time_ns": r["time_ns"], "usage": usage}
    return {(r["host"], r["usage"], r["time_ns"]) for r in merged.values()}


class IcebergMachine(RuleBasedStateMachine):
    """Our catalog and files on one side, a plain model of them on the other; Iceberg must follow."""

    @initialize()
    def setup(self):
        self.dir = tempfile.mkdtemp(prefix="iox-iceberg-")
        self.store = LocalObjectStore(os.path.join(self.dir, "objects"))
        self.pc, _ = PreservedCatalog.create_or_load(self.store, DB, 1.0, PreservedCatalogConfig(
            transactions_until_checkpoint=3))
        self.pc.commit([SetTableSchema(TABLE, COLUMNS)], 1.0)
        self.props = catalog_properties("sqlite", self.dir, self.store)
        self.publisher = IcebergPublisher(self.props, self.store)
        self.model_files: dict = {}   # key -> rows
        self.model_deletes: list = []
        self.seq = 1
        self.n = 0
        self.checks = 0

    def _write(self, rows: list, day: int) -> AddParquet:
        self.n += 1
        key = f"{DB}/data/{TABLE}/day{day}/f{self.n:04d}.parquet"
        t = pa.table({"host": pa.array([r["host"] for r in rows], pa.string()),
                      "usage": pa.array([r["usage"] for r in rows], pa.float64()),
                      "time_ns": pa.array([r["time_ns"] for r in rows], pa.int64()),
                      "_iox_seq": pa.array([r["_iox_seq"] for r in rows], pa.int64())})
        fs, path = self.store.arrow_prepare_write(key)
        pq.write_table(t, path, filesystem=fs)
        self.store.arrow_finish_write([key])
        self.model_files[key] = rows
        return AddParquet(key=key, table=TABLE, partition_key=partition_key_of_day(day), row_count=len(rows),
                          size_bytes=1, min_time_ns=min(r["time_ns"] for r in rows),
                          max_time_ns=max(r["time_ns"] for r in rows), min_seq=min(r["_iox_seq"] for r in rows),
                          max_seq=max(r["_iox_seq"] for r in rows), schema=COLUMNS)

    @rule(day=st.integers(0, 1), points=st.lists(st.tuples(st.sampled_from(HOSTS + (None,)), st.integers(0, 6),
                                                           st.none() | st.floats(0, 100, allow_nan=False)),
                                                 min_size=1, max_size=6))
    def persist(self, day, points):
        rows = {}
        for host, t, usage in points:  # a persisted file is deduplicated: one row per (host, time)
            k = (host, t)
            prev = rows.get(k)
            rows[k] = {"host": host, "time_ns": day * DAY + t * 1000,
                       "usage": usage if usage is not None else (prev["usage"] if prev else None),
                       "_iox_seq": self.seq}
            self.seq += 1
        self.pc.commit([self._write(list(rows.values()), day)], 2.0)

    @precondition(lambda self: self.model_files)
    @rule(host=st.sampled_from(HOSTS), lo=st.integers(0, 6), width=st.integers(1, 4), day=st.integers(0, 1))
    def delete(self, host, lo, width, day):
        keys = tuple(sorted(self.model_files))
        start, stop = day * DAY + lo * 1000, day * DAY + (lo + width) * 1000
        self.pc.commit([AddDeletePredicate(table=TABLE, start_ns=start, stop_ns_exclusive=stop,
                                           predicate=(("host", "=", host),), seq=self.seq, applies_to=keys)], 3.0)
        self.model_deletes.append({"applies_to": set(keys), "seq": self.seq, "start": start, "stop": stop, "host": host})
        self.seq += 1

    @precondition(lambda self: len(self.model_files) >= 2)
    @rule(data=st.data())
    def compact(self, data):
        """Merges some files of one day into one (deletes applied, deduplicated), as a compaction does."""
        by_day: dict = {}
        for key in self.model_files:
            by_day.setdefault(int(key.split("/day")[1].split("/")[0]), []).append(key)
        days = [d for d, ks in by_day.items() if len(ks) >= 2]
        if not days:
            return
        day = data.draw(st.sampled_from(sorted(days)))
        keys = data.draw(st.lists(st.sampled_from(sorted(by_day[day])), min_size=2, max_size=4, unique=True))
        merged = _oracle({k: self.model_files[k] for k in keys},
                         [d for d in self.model_deletes if d["applies_to"] & set(keys)])
        if not merged:
            return
        max_seq = max(r["_iox_seq"] for k in keys for r in self.model_files[k])
        rows = [{"host": h, "usage": u, "time_ns": t, "_iox_seq": max_seq} for h, u, t in sorted(merged, key=repr)]
        add = self._write(rows, day)
        self.pc.commit([RemoveParquet(k) for k in keys] + [add], 4.0)
        for k in keys:
            del self.model_files[k]
        for d in self.model_deletes:
            d["applies_to"] -= set(keys)

    @precondition(lambda self: self.model_files)
    @rule()
    def prune_day0(self):
        keys = [k for k in self.model_files if "/day0/" in k]
        if not keys:
            return
        self.pc.commit([RemoveParquet(k) for k in keys], 5.0)
        for k in keys:
            del self.model_files[k]
        for d in self.model_deletes:
            d["applies_to"] -= set(keys)

    @rule()
    def publish(self):
        """Publishes every revision since the last publication (one or several) and checks Iceberg."""
        self.publisher.publish(self.pc.state)
        assert self.publisher.published_revision(DB) == self.pc.revision
        self._check()

    @rule()
    def restart_publisher(self):
        """A new server process: it knows only what Iceberg's snapshots say."""
        self.publisher = IcebergPublisher(self.props, self.store)

    def teardown(self):
        if hasattr(self, "pc"):
            self.publisher.publish(self.pc.state)
            self._check()
        shutil.rmtree(getattr(self, "dir", "/nonexistent"), ignore_errors=True)

    def _check(self):
        from pyiceberg.catalog import load_catalog

        cat = load_catalog("iox", **self.props)
        if not self.model_files and not cat.list_namespaces():
            return
        tbl = cat.load_table((DB, TABLE))
        got = tbl.scan(selected_fields=("host", "usage", "time_ns")).to_arrow().to_pylist()
        self.checks += 1
        assert sorted(((r["host"], r["usage"], r["time_ns"]) for r in got), key=repr) == \
            sorted(_oracle(self.model_files, self.model_deletes), key=repr), "Iceberg rows differ from the oracle"
        assert len(got) == len({(r["host"], r["time_ns"]) for r in got}), "a duplicate (series, time) in Iceberg"
        revisions = [int(s.summary.additional_properties[REVISION_PROPERTY]) for s in tbl.snapshots()]
        assert revisions == sorted(set(revisions)), f"a revision published twice or out of order: {revisions}"
        ours = {k for k in published_files(self.pc.state, TABLE) if not k.startswith(f"{DB}/iceberg/")}
        referenced = {f.file_path.split("/objects/", 1)[1] for f in
                      (e.data_file for m in tbl.current_snapshot().manifests(tbl.io)
                       for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True))}
        assert ours <= referenced, "a file needing no merge was not referenced where it is"
        # partitioned by day: each file's partition is the day of its rows, and a reader filtering on
        # that day plans only that day's files and reads exactly that day's rows
        spec = [(f.name, str(f.transform)) for f in tbl.spec().fields]
        assert spec == [("_iox_day", "identity")], spec
        # our write order is not shown: the table's columns are the files' others and the day
        assert [f.name for f in tbl.schema().fields] == ["host", "usage", "time_ns", "_iox_day"]
        for day in (0, 1):
            tasks = list(tbl.scan(row_filter=f"_iox_day = '{partition_key_of_day(day)}'").plan_files())
            assert all(t.file.partition[0] == day for t in tasks)
            got_day = tbl.scan(row_filter=f"_iox_day = '{partition_key_of_day(day)}'",
                               selected_fields=("host", "usage", "time_ns", "_iox_day")).to_arrow().to_pylist()
            assert all(str(r["_iox_day"]) == partition_key_of_day(day) for r in got_day)
            assert sorted(((r["host"], r["usage"], r["time_ns"]) for r in got_day), key=repr) == sorted(
                (r for r in _oracle(self.model_files, self.model_deletes) if r[2] // DAY == day), key=repr)


TestIcebergPublication = IcebergMachine.TestCase
TestIcebergPublication.settings = settings(max_examples=int(os.environ.get("IOX_ICEBERG_EXAMPLES", "12")),
                                           stateful_step_count=int(os.environ.get("IOX_ICEBERG_STEPS", "14")),
                                           deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _files(rows_by_key: dict, store: LocalObjectStore) -> list:
    out = []
    for key, rows in rows_by_key.items():
        t = pa.table({"host": pa.array([r[0] for r in rows], pa.string()),
                      "usage": pa.array([r[1] for r in rows], pa.float64()),
                      "time_ns": pa.array([r[2] for r in rows], pa.int64()),
                      "_iox_seq": pa.array([r[3] for r in rows], pa.int64())})
        fs, path = store.arrow_prepare_write(key)
        pq.write_table(t, path, filesystem=fs)
        store.arrow_finish_write([key])
        out.append(AddParquet(key=key, table=TABLE, partition_key=D0, row_count=len(rows), size_bytes=1,
                              min_time_ns=min(r[2] for r in rows), max_time_ns=max(r[2] for r in rows),
                              min_seq=min(r[3] for r in rows), max_seq=max(r[3] for r in rows), schema=COLUMNS))
    return out


def test_duckdb_reads_what_pyiceberg_reads_and_snapshots_carry_the_revision(tmp_path):
    store = LocalObjectStore(str(tmp_path / "objects"))
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    a, b = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1), ("b", 2.0, 20, 2)],
                   f"{DB}/data/{TABLE}/d/b.parquet": [("a", None, 30, 3)]}, store)
    pc.commit([SetTableSchema(TABLE, COLUMNS), a], 1.0)
    r_b = pc.commit([b], 2.0)
    r_del = pc.commit([AddDeletePredicate(table=TABLE, start_ns=0, stop_ns_exclusive=25, predicate=(("host", "=", "b"),),
                                          seq=5, applies_to=(a.key, b.key))], 3.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    publication = IcebergPublication(IcebergPublisher(props, store), lambda: {DB: pc}, owns_table)
    # the first publication of a database starts at its newest revision: one snapshot
    assert publication.run_once(NOW) == 1
    con = duckdb()
    from pyiceberg.catalog import load_catalog

    tbl = load_catalog("iox", **props).load_table((DB, TABLE))
    rows = con.execute(f"SELECT host, usage, time_ns FROM iceberg_scan('{tbl.metadata_location}') ORDER BY time_ns").fetchall()
    assert rows == [("a", 1.0, 10), ("a", None, 30)]
    summary = tbl.current_snapshot().summary.additional_properties
    assert summary[REVISION_PROPERTY] == str(r_del)
    assert json.loads(summary["iox.kafka-offsets"]) == {}
    # a new column in a later file reaches the Iceberg schema before the file (DuckDB reads it by name)
    c_key = f"{DB}/data/{TABLE}/d/c.parquet"
    t = pa.table({"host": ["c"], "usage": [3.0], "idle": pa.array([7], pa.int64()), "time_ns": pa.array([50], pa.int64()),
                  "_iox_seq": pa.array([9], pa.int64())})
    fs, path = store.arrow_prepare_write(c_key)
    pq.write_table(t, path, filesystem=fs)
    store.arrow_finish_write([c_key])
    cols = COLUMNS + (("idle", "field", "integer"),)
    r_c = pc.commit([SetTableSchema(TABLE, cols), AddParquet(key=c_key, table=TABLE, partition_key=D0, row_count=1,
                                                            size_bytes=1, min_time_ns=50, max_time_ns=50, min_seq=9,
                                                            max_seq=9, schema=cols)], 4.0)
    assert publication.run_once(NOW) == 1
    tbl = load_catalog("iox", **props).load_table((DB, TABLE))
    rows = con.execute(f"SELECT host, idle, time_ns FROM iceberg_scan('{tbl.metadata_location}') ORDER BY time_ns").fetchall()
    assert rows == [("a", None, 10), ("a", None, 30), ("c", 7, 50)]
    # every column a reader sees: the files' columns but our write order, and the day
    rel = con.execute(f"SELECT * FROM iceberg_scan('{tbl.metadata_location}') ORDER BY time_ns")
    assert [d[0] for d in rel.description] == ["host", "usage", "time_ns", "_iox_day", "idle"]
    assert len(rel.fetchall()) == 3
    assert [s.summary.additional_properties[REVISION_PROPERTY] for s in tbl.snapshots()] == [str(r_del), str(r_c)]
    assert r_b < r_del < r_c
    # nothing new: nothing committed, also by a publisher that starts again
    assert publication.run_once(NOW) == 0
    assert IcebergPublication(IcebergPublisher(props, store), lambda: {DB: pc}, owns_table).run_once(NOW) == 0


def test_a_fenced_catalog_publishes_nothing_and_off_is_no_publication(tmp_path):
    store = LocalObjectStore(str(tmp_path / "objects"))
    assert catalog_properties("off", str(tmp_path), store) is None
    with pytest.raises(ValueError, match="expected off, sqlite"):
        catalog_properties("sqlite-please", str(tmp_path), store)
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    (a,) = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1)]}, store)
    pc.commit([SetTableSchema(TABLE, COLUMNS), a], 1.0)
    other, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    other.commit([], 2.0)  # another server took the database: this one is fenced at its next commit
    from iox_spark.catalog.errors import RevisionConflict

    with pytest.raises(RevisionConflict):
        pc.commit([], 3.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    publication = IcebergPublication(IcebergPublisher(props, store), lambda: {DB: pc}, owns_table)
    assert publication.run_once(NOW) == 0
    from pyiceberg.catalog import load_catalog

    assert load_catalog("iox", **props).list_namespaces() == []


def test_old_snapshots_expire_and_only_then_their_files_are_free_for_cleanup(tmp_path, monkeypatch):
    """A compaction replaces two meeting files (published as one merged copy) by our merged file:
    the replaced snapshot keeps them referenced (published_keys, which the cleanup keeps) until it
    expires; then the copy no snapshot references is deleted, and only the current file stays kept."""
    import datetime as dt

    from iox_spark.lifecycle import iceberg_publication

    EPOCH = dt.date(1970, 1, 1)

    store = LocalObjectStore(str(tmp_path / "objects"))
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    a, b = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1), ("a", 2.0, 20, 2)],
                   f"{DB}/data/{TABLE}/d/b.parquet": [("a", 5.0, 20, 3)]}, store)  # an overwrite at 20
    pc.commit([SetTableSchema(TABLE, COLUMNS), a, b], 1.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    publisher = IcebergPublisher(props, store)
    publication = IcebergPublication(publisher, lambda: {DB: pc}, owns_table)
    assert publisher.published_keys(DB) is None  # not read yet: the cleanup waits
    now = dt.datetime.now(dt.timezone.utc).timestamp()
    assert publication.run_once(now) == 1
    (copy,) = publisher.published_keys(DB)
    assert copy.startswith(f"{DB}/iceberg/{TABLE}/data/")  # the two files meet: one merged copy
    from pyiceberg.catalog import load_catalog

    tbl = load_catalog("iox", **props).load_table((DB, TABLE))
    assert sorted(tbl.scan().to_arrow().to_pylist(), key=lambda r: r["time_ns"]) == [
        {"host": "a", "usage": 1.0, "time_ns": 10, "_iox_day": EPOCH},
        {"host": "a", "usage": 5.0, "time_ns": 20, "_iox_day": EPOCH}]
    (c,) = _files({f"{DB}/data/{TABLE}/d/c.parquet": [("a", 1.0, 10, 1), ("a", 5.0, 20, 3)]}, store)
    pc.commit([RemoveParquet(a.key), RemoveParquet(b.key), c], 2.0)
    # until the publication reached this revision, the cleanup waits: the revisions it has still to
    # publish may name files the catalog no longer references
    assert publication.published_keys(DB) is None
    assert publication.run_once(now + 1) == 1
    assert publication.published_keys(DB) == publisher.published_keys(DB)
    assert publisher.published_keys(DB) == {copy, c.key}  # the replaced snapshot still references the copy
    # maintenance is due every MAINTENANCE_INTERVAL_S; snapshots expire after SNAPSHOT_RETENTION_S
    assert publication.run_once(now + 2) == 0 and store.exists(copy)
    later = now + iceberg_publication.SNAPSHOT_RETENTION_S + iceberg_publication.MAINTENANCE_INTERVAL_S + 5
    assert publication.run_once(later) == 0
    assert publisher.published_keys(DB) == {c.key}
    assert not store.exists(copy)
    tbl = load_catalog("iox", **props).load_table((DB, TABLE))
    assert len(tbl.snapshots()) == 1
    assert duckdb().execute(f"SELECT count(*) FROM iceberg_scan('{tbl.metadata_location}')").fetchone() == (2,)


def test_a_table_another_writer_created_since_the_start_gets_only_what_it_lacks(tmp_path):
    """Two publishers on one catalog (an ingester pool's members sharing it): the table the first
    one found missing at its start was created and published by the other since; the first one's
    next publication adds only the file the table lacks (no row twice)."""
    store = LocalObjectStore(str(tmp_path / "objects"))
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    a, b = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1)],
                   f"{DB}/data/{TABLE}/d/b.parquet": [("b", 2.0, 20, 2)]}, store)
    pc.commit([SetTableSchema(TABLE, COLUMNS)], 1.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    first, other = IcebergPublisher(props, store), IcebergPublisher(props, store)
    assert first.publish(pc.state) == 0  # read the namespace: no table yet
    pc.commit([a], 2.0)
    assert other.publish(pc.state) == 1  # creates the table with `a`
    pc.commit([b], 3.0)
    assert first.publish(pc.state) == 1
    from pyiceberg.catalog import load_catalog

    tbl = load_catalog("iox", **props).load_table((DB, TABLE))
    assert sorted(r["host"] for r in tbl.scan().to_arrow().to_pylist()) == ["a", "b"]


def test_a_table_published_unpartitioned_is_partitioned_by_its_next_snapshot(tmp_path):
    """A table an earlier version published without partitions and with our write order as a column
    (its files referenced under the unpartitioned spec): the next revision's snapshot adds the day
    partitioning, drops the write order from the schema and references every file again, in one
    snapshot; pyiceberg and DuckDB read each row once, with its day and without the write order."""
    import datetime as dt

    from pyiceberg.catalog import load_catalog
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    store = LocalObjectStore(str(tmp_path / "objects"))
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    (a,) = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1)]}, store)
    r_a = pc.commit([SetTableSchema(TABLE, COLUMNS), a], 1.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    cat = load_catalog("iox", **props)
    cat.create_namespace(DB)
    path = f"file://{store.root_dir}/{a.key}"
    tbl = cat.create_table((DB, TABLE), schema=pq.read_schema(store.arrow_path(a.key)),
                           location=f"file://{store.root_dir}/{DB}/iceberg/{TABLE}", properties={"format-version": "2"})
    with tbl.transaction() as tx:
        tx.set_properties(**{"schema.name-mapping.default": tx.table_metadata.schema().name_mapping.model_dump_json()})
        with tx.update_snapshot(snapshot_properties={REVISION_PROPERTY: str(r_a)}).overwrite() as files:
            files.append_data_file(parquet_file_to_data_file(tbl.io, tx.table_metadata, path))
    # the next persist, a day later
    (b,) = _files({f"{DB}/data/{TABLE}/d1/b.parquet": [("b", 2.0, DAY + 5, 2)]}, store)
    b = dataclasses.replace(b, partition_key=partition_key_of_day(1))
    r_b = pc.commit([b], 2.0)
    assert IcebergPublisher(props, store).publish(pc.state) == 1
    tbl = cat.load_table((DB, TABLE))
    assert [(f.name, str(f.transform)) for f in tbl.spec().fields] == [("_iox_day", "identity")]
    assert [s.summary.additional_properties[REVISION_PROPERTY] for s in tbl.snapshots()] == [str(r_a), str(r_b)]
    assert sorted((t.file.file_path.rsplit("/", 1)[1], t.file.partition[0]) for t in tbl.scan().plan_files()) == \
        [("a.parquet", 0), ("b.parquet", 1)]
    expected = [("a", 1.0, 10, dt.date(1970, 1, 1)), ("b", 2.0, DAY + 5, dt.date(1970, 1, 2))]
    assert [f.name for f in tbl.schema().fields] == ["host", "usage", "time_ns", "_iox_day"]
    assert sorted(tuple(r.values()) for r in tbl.scan().to_arrow().to_pylist()) == expected
    con = duckdb()
    assert con.execute(f"SELECT * FROM iceberg_scan('{tbl.metadata_location}') "
                       "ORDER BY time_ns").fetchall() == expected
    assert con.execute(f"SELECT host FROM iceberg_scan('{tbl.metadata_location}') "
                       "WHERE _iox_day = DATE '1970-01-02'").fetchall() == [("b",)]


def test_a_stopping_publisher_returns_between_tables_and_the_next_one_commits_only_the_rest(tmp_path):
    """One revision changes two tables; the server stops after the first one's snapshot: the call
    returns at once, the revision counts as not published (the cleanup leaves the database alone),
    and the next publisher (after a restart) commits the other table only, each row once."""
    from pyiceberg.catalog import load_catalog

    store = LocalObjectStore(str(tmp_path / "objects"))
    pc, _ = PreservedCatalog.create_or_load(store, DB, 1.0)
    (a,) = _files({f"{DB}/data/{TABLE}/d/a.parquet": [("a", 1.0, 10, 1)]}, store)
    (m,) = _files({f"{DB}/data/mem/d/m.parquet": [("m", 2.0, 20, 2)]}, store)
    m = dataclasses.replace(m, table="mem")
    revision = pc.commit([SetTableSchema(TABLE, COLUMNS), SetTableSchema("mem", COLUMNS), a, m], 1.0)
    props = catalog_properties("sqlite", str(tmp_path), store)
    first = IcebergPublisher(props, store)
    asked: list = []

    def stopping() -> bool:  # the stop comes once one table is committed
        asked.append(1)
        return len(asked) > 1

    assert first.publish(pc.state, stopping=stopping) == 1
    assert first.published_revision(DB) != revision
    cat = load_catalog("iox", **props)
    assert [t[1] for t in cat.list_tables(DB)] == ["cpu"]
    second = IcebergPublisher(props, store)
    assert second.publish(pc.state) == 1 and second.published_revision(DB) == revision
    assert sorted(t[1] for t in cat.list_tables(DB)) == ["cpu", "mem"]
    for table, host in ((TABLE, "a"), ("mem", "m")):
        assert [r["host"] for r in cat.load_table((DB, table)).scan().to_arrow().to_pylist()] == [host]
    assert second.publish(pc.state) == 0
