"""SIGKILL between a catalog commit and its Iceberg snapshot (crash point iceberg_before_commit):
the snapshot is not there, and the next start publishes it, once; pyiceberg and DuckDB then read
exactly the rows our SQL answers, in the columns the table has and its day (not our write order).
Real `iox serve` processes on the default Iceberg catalog."""
from __future__ import annotations

import uuid

from iox_spark.catalog.crash_points import CrashPoint
from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.preserved_catalog import read_state
from tests.crash.harness import ServerProcess, Writer
from tests.iceberg_tables import duckdb_rows, iceberg_table, published_revisions, pyiceberg_rows
from tests.waiting import wait_for

LIFECYCLE = ["--persist-row-threshold", "150", "--late-arrive-window-s", "1", "--persist-age-threshold-s", "2",
             "--worker-backoff-ms", "200"]
COLUMNS = ("src", "id", "time_ns")


def test_a_kill_before_the_iceberg_commit_is_published_once_by_the_next_start(data_dir):
    import os

    w = Writer(f"i_{uuid.uuid4().hex[:8]}")
    s1 = ServerProcess(data_dir, crash_at=CrashPoint.ICEBERG_BEFORE_COMMIT, extra=LIFECYCLE).wait_ready()
    w.write_until_dead(s1, n=60)
    assert s1.proc.returncode == -9, s1.tail()  # died at the crash point: a persist committed, Iceberg did not
    store = LocalObjectStore(os.path.join(data_dir, "objects"))
    committed = read_state(store, w.db).revision
    created = iceberg_table(data_dir, w.db, w.table)  # created, with the files' columns, then the kill
    assert committed not in published_revisions(created)
    assert "_iox_seq" in {f.name for f in created.schema().fields}
    s2 = ServerProcess(data_dir, extra=LIFECYCLE).wait_ready()
    try:
        w.write_batch(s2.client)
        w.check(s2.client)
        s2.client.persist(w.db)
        newest = read_state(store, w.db).revision

        def published():
            tbl = iceberg_table(data_dir, w.db, w.table)
            return tbl if newest in published_revisions(tbl) else None

        tbl = wait_for(published, timeout_s=60, what=f"Iceberg publishing revision {newest}")
        revisions = published_revisions(tbl)
        assert revisions == sorted(set(revisions)) and committed in revisions, revisions
        ours = sorted((tuple(r[c] for c in COLUMNS) for r in
                       s2.client.query(w.db, f"SELECT src, id, time_ns FROM {w.table}").to_pylist()), key=repr)
        assert len(ours) == len(w.acked) + len(w.unacked & {r[1] for r in ours})
        assert pyiceberg_rows(tbl, COLUMNS) == ours
        assert duckdb_rows(tbl, COLUMNS) == ours
        # partitioned by day, also when the kill came between the table's creation and its first snapshot
        assert [(f.name, str(f.transform)) for f in tbl.spec().fields] == [("_iox_day", "identity")]
        # and without the write order, which the table's first snapshot dropped from its schema
        assert sorted(f.name for f in tbl.schema().fields) == sorted(COLUMNS + ("_iox_day",))
    finally:
        s2.kill()
