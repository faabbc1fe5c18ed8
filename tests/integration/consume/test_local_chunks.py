"""Local chunks on the real server (chunk_store/local_rows.py): a micro-batch's small writes of a table
become a chunk whose rows are held on the driver and whose view is a local relation of them; a
request too large to come along with the batch's metadata makes an ordinary write-buffer chunk; a
join of local chunks stays local; and a query of a small table with tail rows merges its local
chunks and the tail in Arrow, with exactly the rows of the merge in Spark SQL."""
from __future__ import annotations

import os
import time

from iox_spark.server.query import engine as query_mod
from tests.waiting import wait_for
from tests.timestamps import T0


def _chunks(srv, db, table):
    dbo = srv.catalog.database(db)
    return srv.catalog.table_chunks(dbo, table)  # a copy, taken under the catalog's lock


def _view_rows(srv, chunk):
    cols = [c[0] for c in chunk.columns if c[1] != "time"] + ["time_ns", "_iox_seq"]
    return sorted(tuple(r[c] for c in cols) for r in srv.spark.table(f"`{chunk.view}`").collect())


def _local_rows(chunk):
    cols = [c[0] for c in chunk.columns if c[1] != "time"] + ["time_ns", "_iox_seq"]
    return sorted(tuple(r[c] for c in cols) for r in chunk.local_rows.to_pylist())


def test_small_writes_make_local_chunks_whose_views_read_exactly_their_rows(iox_server, client, db):
    srv = iox_server
    client.write(db, f"cpu,host=a v=1 {T0}\ncpu,host=b v=2 {T0 + 1}\n")
    client.write(db, f"cpu,host=a v=3 {T0}\n")  # rewrites a point
    tok = client.write(db, f"cpu,host=c v=4,u=5u {T0 + 2}\n")  # a new field
    client.wait_applied(db, tok, timeout_s=60)
    chunks = _chunks(srv, db, "cpu")
    assert chunks and all(c.local_rows is not None for c in chunks), [c.storage for c in chunks]
    assert sum(c.local_rows.num_rows for c in chunks) == sum(c.rows for c in chunks) == 4
    for c in chunks:
        assert _view_rows(srv, c) == _local_rows(c)
    rows = client.query(db, "SELECT host, v, u, time_ns FROM cpu ORDER BY host").to_pylist()
    assert rows == [{"host": "a", "v": 3.0, "u": None, "time_ns": T0}, {"host": "b", "v": 2.0, "u": None,
                    "time_ns": T0 + 1}, {"host": "c", "v": 4.0, "u": 5, "time_ns": T0 + 2}]


def test_a_small_request_over_two_days_makes_a_local_chunk_per_day(iox_server, client, db):
    srv = iox_server
    day = 86_400 * 10**9
    tok = client.write(db, f"cpu,host=a v=1 {T0}\ncpu,host=b v=2 {T0 + day}\ncpu,host=c v=3 {T0 + day + 1}\n")
    client.wait_applied(db, tok, timeout_s=60)
    chunks = _chunks(srv, db, "cpu")
    assert sorted((c.partition_key, c.rows, c.local_rows.num_rows) for c in chunks) == [
        ("2023-11-14", 1, 1), ("2023-11-15", 2, 2)]
    for c in chunks:
        assert _view_rows(srv, c) == _local_rows(c)
    # the message's bytes are split between the days by rows (n // 3 and 2n // 3), not counted twice
    one, two = sorted(chunks, key=lambda c: c.rows)
    assert two.segment_bytes - 2 * one.segment_bytes in (0, 1, 2)
    assert client.query(db, "SELECT host, v FROM cpu ORDER BY host").to_pylist() == [
        {"host": "a", "v": 1.0}, {"host": "b", "v": 2.0}, {"host": "c", "v": 3.0}]


def test_a_request_too_large_to_come_along_makes_an_ordinary_write_buffer_chunk(iox_server, client, db):
    srv = iox_server
    lines = "".join(f"big,host=h{i:05d}_{'x' * 40} v={i} {T0 + i}\n" for i in range(3000))
    client.wait_applied(db, client.write(db, lines), timeout_s=60)
    chunks = _chunks(srv, db, "big")
    assert chunks and all(c.local_rows is None for c in chunks)
    assert client.query(db, "SELECT count(*) AS n, sum(v) AS s FROM big").to_pylist() == [
        {"n": 3000, "s": float(sum(range(3000)))}]


def test_a_join_of_local_chunks_is_a_local_chunk_with_their_rows(iox_server, client, db):
    """The lifecycle's join of write-buffer chunks (no move to the read buffer) keeps them local;
    `iox compact` moves them to the read buffer."""
    from iox_spark.lifecycle.policy import CompactChunks

    srv = iox_server
    client.wait_applied(db, client.write(db, f"cpu,host=a v=1 {T0}\n"), timeout_s=60)
    client.wait_applied(db, client.write(db, f"cpu,host=b ok=true {T0 + 1}\n"), timeout_s=60)
    expected = [{"host": "a", "v": 1.0, "ok": None}, {"host": "b", "v": None, "ok": True}]

    def joined() -> bool:  # by this compaction, or by the lifecycle's (which may also come in between)
        chunks = _chunks(srv, db, "cpu")
        if len(chunks) <= 1:
            return True
        action = CompactChunks("cpu", "2023-11-14", tuple(c.id for c in chunks), to_read_buffer=False)
        return srv.lifecycle.execute(srv.catalog.database(db), action, time.time()) is True

    wait_for(joined, 30, "the two chunks joined", poll_s=0.1)
    (chunk,) = _chunks(srv, db, "cpu")
    assert chunk.local_rows is not None and chunk.df is None and chunk.rows == 2
    assert _view_rows(srv, chunk) == _local_rows(chunk)
    assert client.query(db, "SELECT host, v, ok FROM cpu ORDER BY host").to_pylist() == expected
    client.wait_applied(db, client.write(db, f"cpu,host=c v=3 {T0 + 2}\n"), timeout_s=60)
    assert client.compact(db, "cpu", "2023-11-14")["compacted"] is True
    (moved,) = _chunks(srv, db, "cpu")
    # merged on the driver: the read form is a local relation, the chunk stays local
    assert moved.local_rows is not None and moved.df is not None and moved.storage == "read_buffer+write_buffer"
    assert client.query(db, "SELECT host, v, ok FROM cpu ORDER BY host").to_pylist() == expected + [
        {"host": "c", "v": 3.0, "ok": None}]


def test_local_chunks_move_to_the_read_buffer_on_the_driver_and_queries_of_them_run_no_job(
        iox_server, client, db, monkeypatch):
    """A move of local chunks to the read buffer merges them on the driver (a rewrite merged, a
    catalog delete materialised); the chunk stays local, a query that filters and projects it is
    answered without a Spark job (DataFrame.toArrow, which always runs one, is never called), an
    aggregate still runs one, and a persist writes the same rows."""
    from pyspark.sql import DataFrame

    from iox_spark.lifecycle.policy import CompactChunks

    srv = iox_server
    client.write(db, f"cpu,host=a v=1,w=10i {T0}\ncpu,host=b v=2 {T0 + 1}\ncpu,host=c v=3 {T0 + 2}\n")
    client.write(db, f"cpu,host=a v=5 {T0}\n")  # a rewrite: v from it, w kept
    client.wait_applied(db, client.delete(db, T0 + 1, T0 + 2, "host = 'b'", table="cpu"), timeout_s=60)
    # the lifecycle's move (its policy makes it once the table was queried or after a delay)
    # (retried: the lifecycle may join the chunks meanwhile, and the action then names gone ones)
    deadline = time.monotonic() + 30
    while True:
        action = CompactChunks("cpu", "2023-11-14", tuple(c.id for c in _chunks(srv, db, "cpu")),
                               to_read_buffer=True)
        if srv.lifecycle.execute(srv.catalog.database(db), action, time.time()):
            break
        assert time.monotonic() < deadline, "the move to the read buffer never ran"
        time.sleep(0.1)
    (moved,) = _chunks(srv, db, "cpu")
    assert moved.local_rows is not None and moved.df is not None and moved.rows == 2
    assert moved.local_rows.num_rows == 4  # the rows its segments decode to, kept as they are
    assert sorted(r["host"] for r in srv.spark.table(f"`{moved.view}`").collect()) == ["a", "c"]
    expected = [{"host": "a", "v": 5.0, "w": 10}, {"host": "c", "v": 3.0, "w": None}]

    def no_job(self):
        raise AssertionError("DataFrame.toArrow ran a Spark job for a local relation")

    with monkeypatch.context() as m:
        m.setattr(DataFrame, "toArrow", no_job)
        # (no ORDER BY: Spark folds a filter and a projection of a local relation into one, not a sort)
        rows = client.query(db, "SELECT host, v, w FROM cpu WHERE v > 0").to_pylist()
        assert sorted(rows, key=lambda r: r["host"]) == expected
        with_tail = client.write(db, f"cpu,host=d v=4 {T0 + 3}\n")
        client.wait_visible(db, with_tail, timeout_s=30)
        rows = client.query(db, "SELECT host FROM cpu WHERE host IN ('a', 'd')").to_pylist()
        assert sorted(r["host"] for r in rows) == ["a", "d"]
    assert client.query(db, "SELECT count(*) AS n, sum(v) AS s FROM cpu").to_pylist() == [{"n": 3, "s": 12.0}]
    client.wait_applied(db, with_tail, timeout_s=60)
    client.persist(db, "cpu", "2023-11-14")
    assert client.query(db, "SELECT host, v, w FROM cpu ORDER BY host").to_pylist() == expected[:1] + [
        {"host": "c", "v": 3.0, "w": None}, {"host": "d", "v": 4.0, "w": None}]
    stored = [c for c in _chunks(srv, db, "cpu") if c.parquet_keys]
    assert sum(c.rows for c in stored) == 3


def test_to_arrow_of_a_local_relation_equals_spark_toarrow(iox_server):
    """server/query/engine.py `arrow_batches` converts a local relation's rows on the driver: the same table
    (types, time zone, nulls, an empty result) as DataFrame.toArrow."""
    import pyarrow as pa

    spark = iox_server.spark.newSession()
    t = pa.table({"host": ["a", None, "c"], "v": [1.5, None, -2.0], "n": pa.array([1, None, -3], pa.int64()),
                  "u": pa.array([2**64 - 1, None, 0], pa.uint64()).cast(pa.decimal128(20, 0)),
                  "ok": [True, None, False], "time_ns": pa.array([T0, T0 + 1, T0 + 2], pa.int64())})
    spark.createDataFrame(t).createOrReplaceTempView("x")
    for sql in ["SELECT host, v, n, u, ok, timestamp_micros(time_ns DIV 1000) AS time FROM x WHERE v IS NULL OR v > 0",
                "SELECT * FROM x", "SELECT host FROM x WHERE host = 'nobody'", "SELECT host, host AS h2 FROM x"]:
        df = spark.sql(sql)
        assert df._jdf.queryExecution().executedPlan().nodeName() == "LocalTableScan", sql
        schema, batches = query_mod.arrow_batches(df)
        ours, theirs = pa.Table.from_batches(list(batches), schema=schema), df.toArrow()
        assert ours.schema == theirs.schema and ours.equals(theirs), sql


def test_a_query_merges_local_chunks_and_the_tail_as_the_sql_merge_does(iox_server, client, db, monkeypatch):
    """Local chunks plus the tail's rewrites, new columns and deletes (a catalog delete and a tail
    delete): the Arrow merge on the driver gives the rows of the SQL merge of the chunks' views."""
    srv = iox_server
    client.write(db, f"cpu,host=a v=1,w=10i {T0}\ncpu,host=b v=2 {T0 + 1}\ncpu,host=c v=3 {T0 + 2}\n")
    client.delete(db, T0 + 2, T0 + 3, "host = 'c'", table="cpu")
    tok = client.write(db, f"cpu,host=d v=4 {T0 + 3}\n")
    client.wait_applied(db, tok, timeout_s=60)
    open(srv.pause_file, "w").close()
    try:
        # a trigger that asked for the ends before the file existed may still take the next write
        query = srv.consumer._query
        wait_for(lambda: not query.status["isTriggerActive"], 30, "the stream's current trigger to end")
        toks = [client.write(db, f"cpu,host=a v=5 {T0}\n"),  # a rewrite: v from the tail, w kept
                client.write(db, f"cpu,host=e v=6,ok=true {T0 + 4}\n"),  # a new column
                client.delete(db, T0 + 1, T0 + 2, "host = 'b'", table="cpu"),  # a chunk row, from the tail
                client.write(db, f"cpu,host=b v=7 {T0 + 1}\n")]  # after that delete: stays
        for t in toks:
            client.wait_visible(db, t, timeout_s=30)
        chunks = _chunks(srv, db, "cpu")
        assert chunks and all(c.local_rows is not None for c in chunks)
        sql = "SELECT host, v, w, ok, time_ns FROM cpu ORDER BY host"
        local = srv.query_engine.run(db, sql)
        assert any(local.applied_hi_inclusive.get(int(kp), -1) < off for kp, off in toks[-1].items()), \
            "the consumer applied writes while held: the tail was not read"
        monkeypatch.setattr(query_mod, "_local_merge", lambda *a, **k: None)
        via_sql = srv.query_engine.run(db, sql)
    finally:
        os.unlink(srv.pause_file)
    expected = [{"host": "a", "v": 5.0, "w": 10, "ok": None, "time_ns": T0},
                {"host": "b", "v": 7.0, "w": None, "ok": None, "time_ns": T0 + 1},
                {"host": "d", "v": 4.0, "w": None, "ok": None, "time_ns": T0 + 3},
                {"host": "e", "v": 6.0, "w": None, "ok": True, "time_ns": T0 + 4}]
    assert local.table.to_pylist() == expected
    assert via_sql.table.to_pylist() == expected
    assert local.table.schema == via_sql.table.schema
