"""Every persist is published as Apache Iceberg (lifecycle/iceberg_publication.py) by the session's
server on its defaults (a SQL catalog on SQLite in its data directory): after writes, overwrites
across persists, a delete, a compaction of the files and more writes, pyiceberg and DuckDB read
exactly the rows our SQL answers, and each snapshot names the catalog revision it publishes."""
from __future__ import annotations

import os

from tests.iceberg_tables import duckdb_rows, iceberg_table, published_revisions, pyiceberg_rows
from tests.rows import write_applied
from tests.timestamps import T0
from tests.waiting import wait_for

COLUMNS = ("host", "v", "w", "time_ns")


def _published(srv, db: str, table: str):
    """The Iceberg table once it publishes the database's newest catalog revision."""
    data_dir = srv.config.abs_data_dir
    revision = srv.lifecycle.preserved[db].revision

    def ready():
        tbl = iceberg_table(data_dir, db, table)
        return tbl if revision in published_revisions(tbl) else None

    return wait_for(ready, timeout_s=60, what=f"Iceberg publishing revision {revision} of {db}")


def test_persisted_rows_read_the_same_through_pyiceberg_and_duckdb(iox_server, client, db):
    srv = iox_server
    write_applied(client, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(30)])
    client.persist(db)
    write_applied(client, db, [f"cpu,host=h0 v=1000 {T0}", f"cpu,host=h3 v=5 {T0 + 100}"])  # an overwrite
    client.persist(db)
    client.wait_applied(db, client.delete(db, T0 + 1, T0 + 2, "", "cpu"), timeout_s=90)  # h1 at T0+1
    write_applied(client, db, [f"cpu,host=h2 w=99i {T0 + 2}"])  # overwrites w only
    client.persist(db)
    ours = sorted((tuple(r[c] for c in COLUMNS) for r in
                   client.query(db, "SELECT host, v, w, time_ns FROM cpu").to_pylist()), key=repr)
    assert len(ours) == 30 and (("h0", 1000.0, 0, T0) in ours) and not any(r[3] == T0 + 1 for r in ours)
    tbl = _published(srv, db, "cpu")
    assert pyiceberg_rows(tbl, COLUMNS) == ours
    assert duckdb_rows(tbl, COLUMNS) == ours
    revisions = published_revisions(tbl)
    # one snapshot per catalog transaction that changed the files: each persist, and the delete's
    # record (the persist's own or the lifecycle's), in order, none twice
    assert revisions == sorted(set(revisions)) and len(revisions) >= 3
    assert revisions[-1] == srv.lifecycle.preserved[db].revision
    # a compaction of the three files: one snapshot that replaces them by our compacted file
    pkey = client.status(db)["databases"][0]["tables"][0]["partitions"][0]["key"]
    r = client.compact(db, "cpu", pkey, persisted=True)
    assert r["compacted"] is True
    tbl = _published(srv, db, "cpu")
    assert pyiceberg_rows(tbl, COLUMNS) == ours == duckdb_rows(tbl, COLUMNS)
    files = [t.file.file_path for t in tbl.scan().plan_files()]
    assert len(files) == 1 and files[0].endswith(r["added_file"])  # our file, referenced where it is
    assert os.path.exists(os.path.join(srv.store.root_dir, r["added_file"]))
