"""Persistence on real parts, against BOTH object stores (local directory, S3 on moto_server):
persist / compaction / unload keep every answer identical, automatic persist by rows and by age,
memory pressure unloads, restart recovers Parquet and replays the rest exactly once, cleanup.

Each backend gets a server of its own (sharing the session's Spark application) on a broker of
its own, with small lifecycle thresholds where the test needs the policy to act.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import time
import uuid

import boto3
import pyarrow.parquet as pq
import pytest

from iox_spark.catalog.object_store import object_store_from_url
from iox_spark.catalog.partition_keys import NS_PER_DAY, partition_key_of_day
from iox_spark.server.runtime.broker import start_broker
from iox_spark.server.api.client import IoxClient
from tests.conftest import make_config
from tests.waiting import wait_for
from tests.integration.s3_fixture import moto_s3  # noqa: F401  (fixture)
from tests.timestamps import T0
from tests.rows import write_applied
from tests.iceberg_tables import duckdb_rows, published_revisions, pyiceberg_rows, server_table, wait_published

Q = "SELECT host, count(*) AS n, sum(v) AS s, max(w) AS w FROM cpu GROUP BY host ORDER BY host"
Q2 = "SELECT host, count(*) AS n, sum(v) AS s FROM cpu GROUP BY host ORDER BY host"


@pytest.fixture(scope="module", params=["local", "s3"])
def backend(request, session_tmp, moto_s3):  # noqa: F811
    if request.param == "local":
        return {"object_store": os.path.join(session_tmp, f"objects-{uuid.uuid4().hex[:6]}"), "s3_endpoint": None}
    bucket = f"iox-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=bucket)
    return {"object_store": f"s3://{bucket}/prefix", "s3_endpoint": moto_s3}


@pytest.fixture(scope="module")
def aws_env():
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class _Running:
    def __init__(self, server, broker, cfg):
        self.server = server
        self.broker = broker
        self.cfg = cfg
        self.client = IoxClient(f"127.0.0.1:{server.grpc_port}")
        self.client.wait_ready(60)

    def restart(self):
        """Stops this server (not its broker) and starts a new one on the same data."""
        from iox_spark.server.app import IoxServer

        self.client.close()
        self.server.stop()
        import dataclasses

        cfg = dataclasses.replace(self.cfg, grpc_port=0, http_port=0)
        srv = IoxServer(cfg)
        srv.start()
        return _Running(srv, self.broker, cfg)

    def stop(self):
        self.client.close()
        self.server.stop()


def _start(session_tmp, backend, **lifecycle):
    from iox_spark.server.app import IoxServer

    b = start_broker()
    # one deployment = one broker + its own object-store namespace: a catalog whose topics
    # live on another broker is (rightly) refused at start as lost writes
    store = dict(backend, object_store=f"{backend['object_store'].rstrip('/')}/{uuid.uuid4().hex[:8]}")
    cfg = make_config(os.path.join(session_tmp, f"srv-{uuid.uuid4().hex[:6]}"), b.bootstrap, http_port=0,
                      lifecycle=lifecycle, **store)
    srv = IoxServer(cfg)
    srv.start()
    return _Running(srv, b, cfg)


@pytest.fixture(scope="module")
def manual(iox_server, session_tmp, backend, aws_env):
    """The policy never runs (one round an hour): only explicit persist/compact act."""
    r = _start(session_tmp, backend, worker_backoff_ms=3_600_000)
    yield r
    r.stop()
    r.broker.stop()


@pytest.fixture(scope="module")
def auto(iox_server, session_tmp, backend, aws_env):
    """Small thresholds and a tiny soft memory limit: the policy persists and unloads on its own."""
    r = _start(session_tmp, backend, worker_backoff_ms=200, persist_row_threshold=50, persist_age_threshold_s=2.0,
               late_arrive_window_s=1.0, persisted_compaction_cold_s=1.0, buffer_size_soft_bytes=1,
               buffer_size_hard_bytes=1 << 40)
    yield r
    r.stop()
    r.broker.stop()


def _partitions(c, db, table="cpu"):
    st = c.status(db)["databases"][0]
    return {p["key"]: p for t in st["tables"] if t["name"] == table for p in t["partitions"]}


def test_persist_keeps_answers_and_records_files(manual):
    c, db = manual.client, f"p_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(30)])
    write_applied(c, db, [f"cpu,host=h0 v=1000 {T0}"])  # overwrites one point's v: dedup across chunks
    before = c.query(db, Q).to_pylist()
    assert before == [{"host": "h0", "n": 10, "s": 1000.0 + sum(range(3, 30, 3)), "w": 27},
                      {"host": "h1", "n": 10, "s": float(sum(range(1, 30, 3))), "w": 28},
                      {"host": "h2", "n": 10, "s": float(sum(range(2, 30, 3))), "w": 29}]
    r = c.persist(db)
    assert [(p["table"], int(p["rows"])) for p in r["persisted"]] == [("cpu", 30)]
    assert c.query(db, Q).to_pylist() == before
    part = _partitions(c, db)["2023-11-14"]
    assert [ch["state"] for ch in part["chunks"]] == ["persisted"]
    assert len(part["files"]) == 1 and int(part["files"][0]["rows"]) == 30
    assert int(part["checkpoint"]["flush_timestamp_ns"]) == T0 + 29
    assert int(part["unpersisted_rows"]) == 0
    # the file really is in the object store, with the deduplicated rows
    store = object_store_from_url(manual.cfg.object_store, manual.cfg.s3_endpoint)
    fs, _ = store.arrow_fs()
    t = pq.read_table(store.arrow_path(part["files"][0]["key"]), filesystem=fs)
    assert t.num_rows == 30
    assert sorted(t.column("v").to_pylist())[-1] == 1000.0
    assert c.status(db)["databases"][0]["catalog_revision"] >= 1


def test_persist_and_compact_cover_every_write_acknowledged_before_them(manual):
    """`iox persist` right after a write persists it, though its micro-batch was not applied yet
    when the request came (the consumer is held back by the backpressure file): the request waits
    until the applied watermark reaches the write buffer's end as of the call. Past its deadline
    it answers DEADLINE_EXCEEDED and does nothing."""
    import threading

    import grpc

    c, db = manual.client, f"pw_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h0 v=0 {T0}"])
    pause = manual.server.pause_file
    open(pause, "w").close()
    # a trigger that asked for the end before the file existed may still take the next write: let it end
    query = manual.server.consumer._query
    wait_for(lambda: not query.status["isTriggerActive"], 30, "the stream's current trigger to end")
    try:
        tok = c.write(db, "\n".join(f"cpu,host=h{i % 3} v={i} {T0 + i}" for i in range(1, 31)))
        with pytest.raises(grpc.RpcError) as e:
            c.persist(db, timeout_s=3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        (kp, off), = tok.items()
        assert c.applied(db)[kp] < off  # still held back: nothing was persisted meanwhile
        assert not _partitions(c, db)["2023-11-14"]["files"]
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(r=c.persist(db)))
        t.start()
        wait_for(lambda: "persist_now" in _busy_threads(), 30, "the persist request to arrive")
    finally:
        os.unlink(pause)
    t.join(120)
    assert [(p["table"], int(p["rows"])) for p in out["r"]["persisted"]] == [("cpu", 31)]
    part = _partitions(c, db)["2023-11-14"]
    assert sum(int(f["rows"]) for f in part["files"]) == 31 and int(part["unpersisted_rows"]) == 0
    # compact likewise acts on what was written before it: the two new writes' chunks are compacted
    write_applied(c, db, [f"cpu,host=h0 v=100 {T0 + 40}"])
    c.write(db, f"cpu,host=h1 v=101 {T0 + 41}")
    r = c.compact(db, "cpu", "2023-11-14")
    assert r["compacted"] is True and int(r["rows"]) == 2
    assert c.query(db, "SELECT count(*) AS n, max(v) AS v FROM cpu").to_pylist() == [{"n": 33, "v": 101.0}]


def _busy_threads() -> str:
    """The functions the process's threads are in now (to wait for a request to be served)."""
    import sys
    import traceback

    return "".join("".join(traceback.format_stack(f)) for f in sys._current_frames().values())


def test_a_large_persist_writes_files_split_by_time_that_queries_and_a_restart_read_exactly(manual, monkeypatch):
    """From PARALLEL_WRITE_MIN_ROWS rows on a persist from the write-buffer form writes one file per
    thread, each a time range of its own: the persisted chunk reads both, the answers stay, and a
    restart (each file a chunk of its own) answers the same without deduplicating across them."""
    import iox_spark.lifecycle.persist as persist

    monkeypatch.setattr(persist, "PARALLEL_WRITE_MIN_ROWS", 10)
    c, db = manual.client, f"pp_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(40)])
    write_applied(c, db, [f"cpu,host=h{i % 3} v={1000 + i} {T0 + i}" for i in range(0, 40, 4)])  # rewrites 10 points' v
    before = c.query(db, Q).to_pylist()
    vs = {i: float(1000 + i if i % 4 == 0 else i) for i in range(40)}
    assert before == [{"host": f"h{h}", "n": len(range(h, 40, 3)), "s": sum(vs[i] for i in range(h, 40, 3)),
                       "w": max(range(h, 40, 3))} for h in range(3)]
    r = c.persist(db)
    assert [(p["table"], int(p["rows"]), len(p["files"])) for p in r["persisted"]] == [("cpu", 40, 2)]
    assert c.query(db, Q).to_pylist() == before
    part = _partitions(c, db)["2023-11-14"]
    assert [ch["state"] for ch in part["chunks"]] == ["persisted"]
    spans = sorted((int(f["min_time_ns"]) - T0, int(f["max_time_ns"]) - T0, int(f["rows"])) for f in part["files"])
    assert len(spans) == 2 and spans[0][1] < spans[1][0] and spans[0][0] == 0 and spans[1][1] == 39
    assert spans[0][2] + spans[1][2] == 40 and abs(spans[0][2] - spans[1][2]) <= 4
    r2 = manual.restart()
    try:
        assert r2.client.query(db, Q).to_pylist() == before
        part = _partitions(r2.client, db)["2023-11-14"]
        assert len(part["files"]) == 2 and len(part["chunks"]) == 2
    finally:
        manual.server, manual.client, manual.cfg = r2.server, r2.client, r2.cfg


def test_a_persist_run_as_one_task_per_executor_writes_disjoint_time_ranges_exactly(manual, monkeypatch):
    """On a cluster of several executors a large persist from the write-buffer form runs as one task
    per executor (here: the slots of three two-core executors), each merging and writing only its
    time range: overwrites and a delete come out exactly as one task gives them, the files' times
    never meet, and a restart reads the same."""
    import iox_spark.lifecycle.persist as persist

    monkeypatch.setattr(persist, "task_slots", lambda spark: 3 * persist.cores_per_executor(spark))
    monkeypatch.setattr(persist, "PERSIST_TASK_MIN_ROWS", 10)
    c, db = manual.client, f"pt_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(60)])
    write_applied(c, db, [f"cpu,host=h{i % 3} v={1000 + i} {T0 + i}" for i in range(0, 60, 5)])  # rewrites 12 points' v
    c.wait_applied(db, c.delete(db, T0 + 20, T0 + 30, table="cpu"), timeout_s=60)  # 20..29 (10 points, 2 rewritten)
    kept = [i for i in range(60) if not 20 <= i < 30]
    vs = {i: float(1000 + i if i % 5 == 0 else i) for i in kept}
    before = c.query(db, Q).to_pylist()
    assert before == [{"host": f"h{h}", "n": len([i for i in kept if i % 3 == h]),
                       "s": sum(vs[i] for i in kept if i % 3 == h), "w": max(i for i in kept if i % 3 == h)}
                      for h in range(3)]
    r = c.persist(db)
    assert [(p["table"], int(p["rows"]), len(p["files"])) for p in r["persisted"]] == [("cpu", 50, 3)]
    assert c.query(db, Q).to_pylist() == before
    part = _partitions(c, db)["2023-11-14"]
    spans = sorted((int(f["min_time_ns"]) - T0, int(f["max_time_ns"]) - T0, int(f["rows"])) for f in part["files"])
    assert sum(s[2] for s in spans) == 50 and spans[0][0] == 0 and spans[-1][1] == 59
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    r2 = manual.restart()
    try:
        assert r2.client.query(db, Q).to_pylist() == before
        assert len(_partitions(r2.client, db)["2023-11-14"]["files"]) == 3
    finally:
        manual.server, manual.client, manual.cfg = r2.server, r2.client, r2.cfg


def test_persist_splits_at_the_flush_timestamp_and_late_rows_stay(manual):
    c, db = manual.client, f"s_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=a v={i} {T0 + i}" for i in range(5)])
    c.persist(db)
    write_applied(c, db, [f"cpu,host=a v={10 + i} {T0 + 2 + i}" for i in range(5)])  # overlaps persisted times
    expect = [{"host": "a", "n": 7, "s": float(0 + 1 + sum(range(10, 15)))}]
    assert c.query(db, Q2).to_pylist() == expect
    c.persist(db)
    assert c.query(db, Q2).to_pylist() == expect
    part = _partitions(c, db)["2023-11-14"]
    assert len(part["files"]) == 2
    assert all(ch["state"] == "persisted" for ch in part["chunks"])


@pytest.mark.parametrize("parts", [1, 2])
def test_chunks_move_from_the_write_buffer_form_to_the_read_buffer_with_the_same_answers(manual, monkeypatch, parts):
    """Fresh chunks are held as the write buffer's IPC streams; the policy first merges closed ones
    among themselves (no row decoded), then moves chunks whose last write is read_buffer_delay_s old
    to the read buffer (deduplicated rows, keeping the IPC streams), and persist writes from those.
    Every step answers the same, duplicates and overwrites included. From ARROW_MERGE_MIN_ROWS rows
    the read form is `parts` checkpoints split by time, one Spark partition each."""
    import iox_spark.chunk_store.chunk_data as chunk_data
    import iox_spark.server.consume.ingest as ingest

    monkeypatch.setattr(chunk_data, "ARROW_MERGE_MIN_ROWS", 10 if parts > 1 else 10**9)
    # checkpointed segments, not local chunks (those move to the read buffer on the driver, a local
    # relation: tests/integration/consume/test_local_chunks.py)
    monkeypatch.setattr(ingest, "LOCAL_BUILD_MAX_BYTES", -1)
    c, db, srv = manual.client, f"m_{uuid.uuid4().hex[:8]}", manual.server
    for k in range(3):
        write_applied(c, db, [f"cpu,host=h{i % 3} v={k * 10 + i},w={k}i {T0 + k * 10 + i}" for i in range(10)])
    write_applied(c, db, [f"cpu,host=h0 v=500 {T0}", f"cpu,host=h0 w=7i {T0}"])  # overwrites: not deduplicated
    points = {(f"h{i % 3}", T0 + k * 10 + i): [float(k * 10 + i), k] for k in range(3) for i in range(10)}
    points[("h0", T0)] = [500.0, 7]
    expect = [{"host": h, "n": sum(1 for (hh, _t) in points if hh == h),
               "s": sum(v for (hh, _t), (v, _w) in points.items() if hh == h),
               "w": max(w for (hh, _t), (_v, w) in points.items() if hh == h)} for h in ("h0", "h1", "h2")]
    dbo = srv.catalog.database(db)

    def chunks():
        return [(ch.state, ch.storage, ch.rows, ch.segments_deduplicated)
                for ch in srv.catalog.table_chunks(dbo, "cpu")]

    # the router marked each request's keys unique: each of the first three is deduplicated alone,
    # the last one repeats a key within itself
    assert chunks() == [("closed", "write_buffer", 10, True)] * 3 + [("open", "write_buffer", 2, False)]
    assert c.query(db, Q).to_pylist() == expect
    assert list(dbo.queried_at) == ["cpu"]
    dbo.queried_at.clear()  # as if nobody had queried the table yet
    now = time.time()
    srv.lifecycle.run_once(now + 10)  # the closed chunks merge; the open one is still warm
    assert chunks() == [("closed", "write_buffer", 30, True), ("open", "write_buffer", 2, False)]
    assert c.query(db, Q).to_pylist() == expect
    # queried since its last write: the closed chunk moves once 2 s old, not 30 (the open one is warm)
    srv.lifecycle.run_once(now + 12)
    assert chunks() == [("closed", "read_buffer+write_buffer", 30, True), ("open", "write_buffer", 2, False)]
    assert srv.catalog.table_chunks(dbo, "cpu")[0].df.rdd.getNumPartitions() == parts
    assert c.query(db, Q).to_pylist() == expect
    for k in range(3):  # read buffer delay (30 s) and late-arrival window (300 s) passed: everything moves
        srv.lifecycle.run_once(now + 400 + k)
    assert chunks() == [("closed", "read_buffer+write_buffer", 30, False)]
    assert srv.catalog.table_chunks(dbo, "cpu")[0].deduplicated is True  # the read form is
    assert srv.catalog.table_chunks(dbo, "cpu")[0].df.rdd.getNumPartitions() == parts
    assert c.query(db, Q).to_pylist() == expect
    r = c.persist(db)
    assert [(p["table"], int(p["rows"])) for p in r["persisted"]] == [("cpu", 30)]
    assert chunks() == [("persisted", "object_store", 30, False)]
    assert c.query(db, Q).to_pylist() == expect


def test_requests_apart_in_time_need_no_dedup_though_their_chunks_hulls_overlap(manual):
    """Two unique-keyed requests merged into one chunk keep their own time spans: a later chunk
    falling in the gap between them overlaps the merged chunk's [min, max] hull but not its spans,
    so compaction keeps the merge known-deduplicated and persist writes without deduplicating."""
    from iox_spark.chunk_store.chunk_data import arrow_plan

    c, db, srv = manual.client, f"s_{uuid.uuid4().hex[:8]}", manual.server
    write_applied(c, db, [f"cpu,host=h{i % 2} v={i} {T0 + i}" for i in range(10)])
    write_applied(c, db, [f"cpu,host=h{i % 2} v={i} {T0 + i}" for i in range(20, 30)])
    assert c.compact(db, "cpu", "2023-11-14")["compacted"] is True
    write_applied(c, db, [f"cpu,host=h{i % 2} v={i} {T0 + i}" for i in range(10, 20)])  # the gap
    dbo = srv.catalog.database(db)
    chunks = srv.catalog.table_chunks(dbo, "cpu")
    assert [(ch.rows, ch.min_time_ns - T0, ch.max_time_ns - T0, ch.segments_deduplicated) for ch in chunks] == \
        [(20, 0, 29, True), (10, 10, 19, True)]
    assert chunks[0].time_spans == ((T0, T0 + 9), (T0 + 20, T0 + 29))
    assert arrow_plan(chunks, dbo.schemas.get("cpu"), dbo.table_deletes("cpu")) == ([], False)
    expect = [{"host": f"h{h}", "n": 15, "s": float(sum(range(h, 30, 2)))} for h in (0, 1)]
    assert c.query(db, Q2).to_pylist() == expect
    assert c.compact(db, "cpu", "2023-11-14")["compacted"] is True
    (merged,) = srv.catalog.table_chunks(dbo, "cpu")
    assert (merged.rows, merged.segments_deduplicated, merged.time_spans) == \
        (30, True, ((T0, T0 + 9), (T0 + 10, T0 + 19), (T0 + 20, T0 + 29)))
    assert c.query(db, Q2).to_pylist() == expect
    r = c.persist(db)
    assert [(p["table"], int(p["rows"])) for p in r["persisted"]] == [("cpu", 30)]
    assert c.query(db, Q2).to_pylist() == expect


def test_the_arrow_merge_of_write_buffer_chunks_has_the_rows_of_the_sql_merge(manual):
    """The read buffer's form built in Arrow (one task, or several splitting the rows by time) equals
    Spark SQL's GROUP BY merge of the same chunks row for row: repeated keys across and within requests, fields missing in a request
    (the last non-null value wins), an unsigned field, a delete with a predicate (removes only the
    rows written before it), and the layout's columns and types."""
    from iox_spark.chunk_store.chunk_data import arrow_merged_df, arrow_plan, merged_df

    c, db, srv = manual.client, f"a_{uuid.uuid4().hex[:8]}", manual.server
    # 20 points on 15 keys (host, time): i and i + 15 share one, the later wins
    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},u={i}u {T0 + i % 5}" for i in range(20)])
    write_applied(c, db, [f"cpu,host=h{i % 3} w=true {T0 + i}" for i in range(3, 8)])  # another field, 2 keys shared
    c.wait_applied(db, c.delete(db, T0, T0 + 4, "host='h1'", "cpu"), timeout_s=90)  # h1 at T0..T0+3
    write_applied(c, db, [f"cpu,host=h1,dc=x v=-{i}.5 {T0 + i}" for i in range(2, 4)])  # after the delete
    dbo = srv.catalog.database(db)
    chunks = srv.catalog.table_chunks(dbo, "cpu")
    schema, deletes = dbo.schemas.get("cpu"), dbo.table_deletes("cpu")
    plan = arrow_plan(chunks, schema, deletes)
    assert plan is not None and plan[1] is True and len(plan[0]) == 1
    sql_df = merged_df(srv.spark, schema, chunks, deletes)

    def rows(df):
        return {(r["dc"], r["host"], r["time_ns"] - T0): r.asDict() for r in df.collect()}

    # in one task, and split by time over two and three (each part deduplicated on its own)
    for parts in (1, 2, 3):
        arrow_df = arrow_merged_df(srv.spark, schema, chunks, plan, deletes, parts=parts)
        assert arrow_df.schema == sql_df.schema and arrow_df.rdd.getNumPartitions() == parts
        got = rows(arrow_df)
        assert len(got) == arrow_df.count() == 16
        assert got == rows(sql_df)
    first = {(f"h{i % 3}", i % 5) for i in range(15)} - {("h1", t) for t in range(4)}
    assert set(got) == {(None, h, t) for h, t in first | {("h2", 5), ("h0", 6), ("h1", 7)}} | \
        {("x", "h1", 2), ("x", "h1", 3)}
    r = got[(None, "h0", 3)]  # i = 3 then 18, then the second request's w
    assert (r["v"], int(r["u"]), r["w"]) == (18.0, 18, True)
    r = got[(None, "h2", 0)]  # i = 5 only
    assert (r["v"], int(r["u"]), r["w"]) == (5.0, 5, None)
    r = got[("x", "h1", 3)]
    assert (r["v"], r["u"], r["w"]) == (-3.5, None, None)


def test_queries_read_overlapping_write_buffer_chunks_through_an_arrow_merge_view(manual, monkeypatch):
    """A table view's group of overlapping write-buffer chunks (keys repeated across requests) reads
    a global temp view of their Arrow merge, with a delete applied, and answers exactly; the
    merge view is dropped with the chunks' data once they are replaced and released."""
    import iox_spark.chunk_store.chunk_data as chunk_data

    monkeypatch.setattr(chunk_data, "ARROW_MERGE_MIN_ROWS", 10)
    c, db, srv = manual.client, f"v_{uuid.uuid4().hex[:8]}", manual.server
    write_applied(c, db, [f"cpu,host=h{i % 4} v={i} {T0 + i % 10}" for i in range(40)])  # 40 points, 20 keys
    write_applied(c, db, [f"cpu,host=h{i % 4} v={100 + i} {T0 + i % 10}" for i in range(0, 40, 2)])  # rewrites 20
    c.wait_applied(db, c.delete(db, T0, T0 + 2, "host='h1'", "cpu"), timeout_s=90)  # h1 at T0, T0+1
    dbo = srv.catalog.database(db)
    chunks = srv.catalog.table_chunks(dbo, "cpu")
    assert [ch.storage for ch in chunks] == ["write_buffer"] * len(chunks) and len(chunks) >= 2
    # the view over both chunks (the first one alone had one of its own, kept until it is released)
    (merge_view,) = set.intersection(*(ch.merge_views for ch in chunks))
    views = set().union(*(ch.merge_views for ch in chunks))
    shown = {r.viewName for r in srv.spark.sql("SHOW VIEWS").collect() if r.isTemporary}  # the server's session's
    assert views <= shown
    # the keys of i and i + 20 coincide: the second request's value where it wrote (even i)
    want: dict = {}
    for i in range(40):
        want[(f"h{i % 4}", i % 10)] = i
    for i in range(0, 40, 2):
        want[(f"h{i % 4}", i % 10)] = 100 + i
    want = {k: v for k, v in want.items() if not (k[0] == "h1" and k[1] < 2)}
    got = c.query(db, "SELECT host, time_ns, v FROM cpu").to_pylist()
    assert {(r["host"], r["time_ns"] - T0): r["v"] for r in got} == {k: float(v) for k, v in want.items()}
    assert len(got) == len(want)
    assert c.compact(db, "cpu", "2023-11-14")["compacted"] is True  # one chunk, known deduplicated
    assert all(not ch.merge_views for ch in srv.catalog.table_chunks(dbo, "cpu"))
    srv.lifecycle.run_once(time.time() + 3600)  # past the grace period: the replaced chunks' data goes
    shown = {r.viewName for r in srv.spark.sql("SHOW VIEWS").collect() if r.isTemporary}
    assert not views & shown
    got = c.query(db, "SELECT host, time_ns, v FROM cpu").to_pylist()
    assert {(r["host"], r["time_ns"] - T0): r["v"] for r in got} == {k: float(v) for k, v in want.items()}


def test_a_table_view_refreshed_while_a_compaction_takes_over_its_chunks_segments(manual, monkeypatch):
    """A compaction hands the replaced chunks' segments to its new chunk (it rebinds their
    `segments` to []) while the micro-batch thread may be building the table view over the old
    chunks: the merge view is built from the segments read once, and the view answers exactly.
    (Before, the second read found none and the micro-batch failed.)"""
    import iox_spark.chunk_store.chunk_data as chunk_data

    monkeypatch.setattr(chunk_data, "ARROW_MERGE_MIN_ROWS", 10)
    c, db, srv = manual.client, f"h_{uuid.uuid4().hex[:8]}", manual.server
    write_applied(c, db, [f"cpu,host=h{i % 4} v={i} {T0 + i % 10}" for i in range(40)])
    write_applied(c, db, [f"cpu,host=h{i % 4} v={100 + i} {T0 + i % 10}" for i in range(0, 40, 2)])
    dbo = srv.catalog.database(db)
    chunks = srv.catalog.table_chunks(dbo, "cpu")
    assert len(chunks) >= 2 and all(ch.segments for ch in chunks)
    real_plan, handed = chunk_data.arrow_plan, {}

    def plan_then_hand_over(cs, schema, deletes):
        plan = real_plan(cs, schema, deletes)
        for ch in cs:  # what compact.py does once it swapped in the new chunk
            handed.setdefault(ch.id, ch.segments)
            ch.segments = []
        return plan

    monkeypatch.setattr(chunk_data, "arrow_plan", plan_then_hand_over)
    try:
        srv.ingestor.refresh_table_view(dbo, "cpu")
    finally:
        monkeypatch.setattr(chunk_data, "arrow_plan", real_plan)
        for ch in chunks:
            ch.segments = handed.get(ch.id, ch.segments)
    assert set(handed) == {ch.id for ch in chunks}
    want = {(f"h{i % 4}", i % 10): float(100 + i if i % 2 == 0 else i) for i in range(40)}
    got = c.query(db, "SELECT host, time_ns, v FROM cpu").to_pylist()
    assert {(r["host"], r["time_ns"] - T0): r["v"] for r in got} == want and len(got) == len(want)


def _fail_view_refreshes(monkeypatch, srv, db: str, failures: int) -> list:
    """Makes the first `failures` table view refreshes of database `db` raise; returns the list
    that records, per injected failure, whether that refresh asked for Arrow merges."""
    real, failed = srv.ingestor.refresh_table_view, []

    def flaky(dbo, table, arrow_merge=True):
        if dbo.name == db and len(failed) < failures:
            failed.append(arrow_merge)
            raise RuntimeError("injected: the table view could not be refreshed")
        return real(dbo, table, arrow_merge)

    monkeypatch.setattr(srv.ingestor, "refresh_table_view", flaky)
    return failed


@pytest.mark.parametrize("failures", [1, 2])
def test_a_micro_batch_whose_view_refresh_fails_is_applied_once(manual, monkeypatch, failures):
    """A micro-batch whose table view refresh fails once, after its chunks are in the catalog,
    retries the refresh with SQL merges only and is applied. Failing twice fails the batch: its
    chunks are withdrawn and it is applied again in parts (server/write_buffer/poison.py: the refresh works
    then, so nothing is set aside and the stream needs no restart; the persistence windows keep the
    offsets its first attempt recorded). Either way every point is there exactly once."""
    c, db, srv = manual.client, f"f_{uuid.uuid4().hex[:8]}", manual.server
    write_applied(c, db, [f"cpu,host=h{i} v={i},w=1i {T0 + i}" for i in range(4)])
    restarts = srv.consumer.restarts
    failed = _fail_view_refreshes(monkeypatch, srv, db, failures)
    write_applied(c, db, [f"cpu,host=h{i} v={10 + i},w=2i {T0 + 100 + i}" for i in range(4)])
    assert failed == [True, False][:failures]
    assert srv.consumer.restarts == restarts
    assert srv.catalog.database(db).poisoned == []
    assert c.query(db, Q).to_pylist() == [{"host": f"h{i}", "n": 2, "s": float(10 + 2 * i), "w": 2}
                                          for i in range(4)]
    assert sum(ch.rows for ch in srv.catalog.table_chunks(srv.catalog.database(db), "cpu")) == 8
    write_applied(c, db, [f"cpu,host=h{i} v=100,w=3i {T0 + 200 + i}" for i in range(4)])  # the stream goes on
    assert [r["n"] for r in c.query(db, Q).to_pylist()] == [3] * 4


def test_no_persist_lands_between_a_failed_micro_batch_and_its_retry(manual, monkeypatch):
    """A micro-batch that fails after recording its offsets in the persistence windows leaves
    them there (its retry does not record them again) while its chunks are withdrawn. A persist
    between the failure and the retry would checkpoint those offsets as persisted without their
    rows, and the retried rows would be recorded in no window (lost in a crash before the next
    persist): persists of the database are held until the retry is applied."""
    c, db, srv = manual.client, f"h_{uuid.uuid4().hex[:8]}", manual.server
    write_applied(c, db, [f"cpu,host=h{i} v={i},w=1i {T0 + i}" for i in range(4)])
    dbo = srv.catalog.database(db)
    real_withdraw, during = srv.ingestor._withdraw, []
    _fail_view_refreshes(monkeypatch, srv, db, 2)  # the refresh and its SQL-only retry: the batch fails

    def withdraw_then_persist(added):
        real_withdraw(added)
        if any(d.name == db for d, _chunk in added):  # the stream has not applied the batch again yet
            during.append((dict(dbo.failed_batch_hi), srv.lifecycle.persist_now(dbo, None, None, time.time())))

    monkeypatch.setattr(srv.ingestor, "_withdraw", withdraw_then_persist)
    write_applied(c, db, [f"cpu,host=h{i} v={10 + i},w=2i {T0 + 100 + i}" for i in range(4)])
    assert len(during) == 1
    held, persisted = during[0]
    assert held and max(held.values()) >= 0 and persisted == []
    assert dbo.failed_batch_hi == {}  # applied again
    part = _partitions(c, db)["2023-11-14"]
    assert int(part["unpersisted_rows"]) == 8 and part.get("files", []) == []  # every row still recorded
    r = c.persist(db)
    assert sum(int(p["rows"]) for p in r["persisted"]) == 8
    assert c.query(db, Q).to_pylist() == [{"host": f"h{i}", "n": 2, "s": float(10 + 2 * i), "w": 2}
                                          for i in range(4)]
    assert int(_partitions(c, db)["2023-11-14"]["unpersisted_rows"]) == 0


def test_compaction_keeps_answers(manual):
    c, db = manual.client, f"c_{uuid.uuid4().hex[:8]}"
    for k in range(3):
        write_applied(c, db, [f"cpu,host=h{i} v={k * 10 + i},w={k}i {T0 + i}" for i in range(4)])
    before = c.query(db, Q).to_pylist()
    assert before == [{"host": f"h{i}", "n": 1, "s": float(20 + i), "w": 2} for i in range(4)]
    assert len(_partitions(c, db)["2023-11-14"]["chunks"]) == 3
    r = c.compact(db, "cpu", "2023-11-14")
    assert r["compacted"] is True and int(r["rows"]) == 4
    assert c.query(db, Q).to_pylist() == before
    chunks = _partitions(c, db)["2023-11-14"]["chunks"]
    assert len(chunks) == 1 and int(chunks[0]["rows"]) == 4


@pytest.mark.parametrize("form", ["write_buffer", "read_buffer_only"])
def test_persisting_a_compacted_chunk(manual, form):
    """One compacted (deduplicated) chunk and no delete. Compaction keeps the chunk's write-buffer
    form, so persist merges its IPC streams in Arrow and the persisted chunk reads its file; a chunk
    without that form (as replay builds them) has its rows checkpoint written as it is and kept as
    the persisted chunk's data. Either way, releasing the retired chunk afterwards leaves the answers
    intact, and the file holds whole row groups."""
    from iox_spark.chunk_store.chunk_data import release_chunk_data, release_df

    c, db, srv = manual.client, f"r_{uuid.uuid4().hex[:8]}", manual.server
    n = 9_000
    for k in range(3):  # 27,000 rows: more than Spark's 10,000-row Arrow batches
        write_applied(c, db, [f"cpu,host=h{i % 3} v={k * n + i},w={k}i {T0 + k * n + i}" for i in range(n)])
    expect = [{"host": f"h{h}", "n": n, "s": float(sum(range(h, 3 * n, 3))), "w": 2} for h in range(3)]
    assert c.query(db, Q).to_pylist() == expect
    dbo = srv.catalog.database(db)
    assert {ch.storage for ch in srv.catalog.table_chunks(dbo, "cpu")} == {"write_buffer"}
    assert c.compact(db, "cpu", "2023-11-14")["compacted"] is True
    [compacted] = srv.catalog.table_chunks(dbo, "cpu")
    assert compacted.storage == "read_buffer+write_buffer" and compacted.rows == 3 * n
    assert [ch["storage"] for ch in _partitions(c, db)["2023-11-14"]["chunks"]] == ["read_buffer+write_buffer"]
    data = compacted.df
    if form == "read_buffer_only":
        for seg in compacted.segments:
            release_df(seg)
        compacted.segments = []
    r = c.persist(db)
    assert [(p["table"], int(p["rows"])) for p in r["persisted"]] == [("cpu", 3 * n)]
    [persisted] = srv.catalog.table_chunks(dbo, "cpu")
    assert persisted.state == "persisted"
    if form == "write_buffer":
        assert persisted.storage == "object_store" and persisted.df is None
    else:
        assert persisted.df is data and compacted.df is None
    for ch in srv.catalog.take_retired(time.time() + 1):
        release_chunk_data(srv.spark, ch)
    assert c.query(db, Q).to_pylist() == expect
    store = object_store_from_url(manual.cfg.object_store, manual.cfg.s3_endpoint)
    fs, _ = store.arrow_fs()
    f = pq.ParquetFile(store.arrow_path(_partitions(c, db)["2023-11-14"]["files"][0]["key"]), filesystem=fs)
    assert (f.metadata.num_rows, f.metadata.num_row_groups) == (3 * n, 1)


@pytest.mark.parametrize("merge", ["arrow", "spark"])
def test_compacting_persisted_files_keeps_answers_deletes_and_restart(manual, merge, monkeypatch, caplog):
    """Three files (overwrites across them, a recorded delete on the first) become one file in
    one transaction, merged in Arrow (one task) or, above ARROW_COMPACTION_MAX_ROWS, by Spark;
    answers, the delete and a restart agree; the old files go only once the chunks reading them
    are released."""
    from iox_spark.lifecycle import compact_persisted
    from iox_spark.chunk_store.chunk_data import release_chunk_data

    if merge == "spark":
        monkeypatch.setattr(compact_persisted, "ARROW_COMPACTION_MAX_ROWS", 0)
    caplog.set_level(logging.INFO, logger="iox_spark.lifecycle.compact_persisted")

    c, db = manual.client, f"k_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(30)])
    c.persist(db)
    write_applied(c, db, [f"cpu,host=h0 v=1000 {T0}", f"cpu,host=h3 v=5 {T0 + 100}"])  # overwrite + a new series
    c.persist(db)
    c.wait_applied(db, c.delete(db, T0 + 1, T0 + 2, "", "cpu"), timeout_s=90)  # removes h1 at T0+1
    write_applied(c, db, [f"cpu,host=h2 w=99i {T0 + 2}"])  # overwrites w only: v of T0+2 stays 2
    c.persist(db)
    expect = [{"host": "h0", "n": 10, "s": 1000.0 + sum(range(3, 30, 3)), "w": 27},
              {"host": "h1", "n": 9, "s": float(sum(range(4, 30, 3))), "w": 28},
              {"host": "h2", "n": 10, "s": float(sum(range(2, 30, 3))), "w": 99},
              {"host": "h3", "n": 1, "s": 5.0, "w": None}]
    assert c.query(db, Q).to_pylist() == expect
    old = [f["key"] for f in _partitions(c, db)["2023-11-14"]["files"]]
    assert len(old) == 3
    pc = manual.server.lifecycle.preserved[db]
    # recorded by the third persist, naming every file of the table then (its own included)
    assert [set(p.applies_to) for p in pc.state.delete_predicates] == [set(old)]
    r = c.compact(db, "cpu", "2023-11-14", persisted=True)
    assert r["compacted"] is True and int(r["rows"]) == 30 and sorted(r["removed_files"]) == sorted(old)
    merged_by = [m.getMessage().split("merged ")[1].split(")")[0] for m in caplog.records
                 if m.name == "iox_spark.lifecycle.compact_persisted" and db in m.getMessage()]
    assert merged_by == ["in Arrow" if merge == "arrow" else "by Spark"]
    assert c.query(db, Q).to_pylist() == expect
    part = _partitions(c, db)["2023-11-14"]
    assert [f["key"] for f in part["files"]] == [r["added_file"]] and int(part["files"][0]["rows"]) == 30
    assert [ch["state"] for ch in part["chunks"]] == ["persisted"]
    assert set(pc.state.files) == {r["added_file"]} and pc.state.delete_predicates == []
    # a second request has nothing to merge
    assert c.compact(db, "cpu", "2023-11-14", persisted=True)["compacted"] is False
    # the replaced files stay while retired chunks (queries planned before the swap) read them
    srv, store = manual.server, manual.server.store
    assert manual.server.lifecycle.cleanup(time.time() + 10_000, 900.0) == []
    assert all(store.exists(k) for k in old)
    for ch in srv.catalog.take_retired(time.time() + 1):
        release_chunk_data(srv.spark, ch)
    # and while an Iceberg snapshot not expired references them: the first persist's snapshot names
    # its file (the later ones a merged copy: the files share keys, and the delete applies to them)
    wait_published(srv, db)
    first = [k for k in srv.lifecycle.cleanup(time.time() + 10_000, 900.0) if k.startswith(f"{db}/")]
    kept = set(old) - set(first)
    assert len(kept) == 1 and kept <= srv.iceberg.published_keys(db)
    srv.iceberg.run_once(time.time() + 10_000)  # expires the snapshots older than the retention
    then = srv.lifecycle.cleanup(time.time() + 10_000, 900.0)  # (also other tests' databases' files)
    assert sorted(first + [k for k in then if k.startswith(f"{db}/")]) == sorted(old)
    assert c.query(db, Q).to_pylist() == expect
    if merge == "spark":
        return  # the commit a restart reads is the same for both merges: one restart suffices
    r2 = manual.restart()
    try:
        assert r2.client.query(db, Q).to_pylist() == expect
        assert [f["key"] for f in _partitions(r2.client, db)["2023-11-14"]["files"]] == [r["added_file"]]
    finally:
        manual.server, manual.client, manual.cfg = r2.server, r2.client, r2.cfg


def test_every_persist_is_published_to_iceberg_and_read_the_same_by_pyiceberg_and_duckdb(manual, backend):
    """On the default Iceberg catalog (lifecycle/iceberg_publication.py): after writes, an overwrite
    across persists, a delete, a compaction of the files, a restart and more writes, pyiceberg and
    DuckDB read exactly the rows our SQL answers; one snapshot per catalog transaction that changed
    the files, each naming its revision, in order, none twice (also across the restart)."""
    cols = ("host", "v", "w", "time_ns")
    c, db = manual.client, f"ice_{uuid.uuid4().hex[:8]}"

    def ours(client):
        return sorted((tuple(r[k] for k in cols) for r in
                       client.query(db, "SELECT host, v, w, time_ns FROM cpu").to_pylist()), key=repr)

    def published(server):
        revision = wait_published(server, db)
        tbl = server_table(server, db, "cpu")
        revisions = published_revisions(tbl)
        assert revisions == sorted(set(revisions)) and revisions[-1] == revision, revisions
        with IoxClient(f"127.0.0.1:{server.grpc_port}") as client:  # `iox status` says so
            st = client.status(db)["databases"][0]
        assert (st["iceberg_published_revision"], st["iceberg_error"]) == (revision, "")
        return tbl, revisions

    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(30)])
    c.persist(db)
    write_applied(c, db, [f"cpu,host=h0 v=1000 {T0}", f"cpu,host=h3 v=5 {T0 + 100}"])  # overwrites h0 at T0
    c.persist(db)
    c.wait_applied(db, c.delete(db, T0 + 1, T0 + 2, "", "cpu"), timeout_s=90)  # removes h1 at T0+1
    write_applied(c, db, [f"cpu,host=h2 w=99i {T0 + 2}"])  # overwrites w only
    c.persist(db)
    expect = ours(c)
    assert len(expect) == 30 and ("h0", 1000.0, 0, T0) in expect and not [r for r in expect if r[3] == T0 + 1]
    tbl, revisions = published(manual.server)
    assert len(revisions) >= 3  # each persist; the delete's record may be a transaction of its own
    assert pyiceberg_rows(tbl, cols) == expect == duckdb_rows(tbl, cols, backend["s3_endpoint"])
    r = c.compact(db, "cpu", "2023-11-14", persisted=True)
    assert r["compacted"] is True
    tbl, after = published(manual.server)
    assert after[:len(revisions)] == revisions and len(after) == len(revisions) + 1
    assert pyiceberg_rows(tbl, cols) == expect == duckdb_rows(tbl, cols, backend["s3_endpoint"])
    files = [t.file.file_path for t in tbl.scan().plan_files()]
    assert len(files) == 1 and files[0].endswith("/" + r["added_file"])  # our file, where it is: no copy
    r2 = manual.restart()
    try:
        write_applied(r2.client, db, [f"cpu,host=h4 v=4 {T0 + 200}", f"cpu,host=h5 v=5 {T0 + NS_PER_DAY}"])
        r2.client.persist(db)
        expect = ours(r2.client)
        tbl, again = published(r2.server)
        # nothing published twice; one snapshot for each day's persist (a transaction each)
        assert again[:len(after)] == after and len(again) == len(after) + 2
        assert pyiceberg_rows(tbl, cols) == expect == duckdb_rows(tbl, cols, backend["s3_endpoint"])
        # partitioned by day like our catalog: each row's `_iox_day` is its UTC day, each data file is
        # in its partition's day, and a reader filtering on a day reads that day's files only
        days = sorted((tuple(r[:3]) + (r[3], dt.datetime.fromtimestamp(r[3] // 10**9, dt.timezone.utc).date())
                       for r in expect), key=repr)
        assert pyiceberg_rows(tbl, cols + ("_iox_day",)) == days == duckdb_rows(tbl, cols + ("_iox_day",),
                                                                                 backend["s3_endpoint"])
        assert sorted(t.file.partition[0] for t in tbl.scan().plan_files()) == \
            [T0 // NS_PER_DAY] * 2 + [T0 // NS_PER_DAY + 1]  # the compacted file and h4's, and h5's
        # the columns readers see: the table's and the day, not our write order (`_iox_seq`)
        assert sorted(f.name for f in tbl.schema().fields) == sorted(cols + ("_iox_day",))
        (second,) = tbl.scan(row_filter=f"_iox_day = '{partition_key_of_day(T0 // NS_PER_DAY + 1)}'").plan_files()
        assert second.file.record_count == 1
    finally:
        manual.server, manual.client, manual.cfg = r2.server, r2.client, r2.cfg


def test_the_policy_compacts_the_files_of_a_cold_partition(auto, caplog):
    caplog.set_level(logging.INFO, logger="iox_spark.lifecycle.worker")
    c, db = auto.client, f"f_{uuid.uuid4().hex[:8]}"
    for k in range(3):  # three forced persists: three files, then the partition goes cold (no write for 1 s)
        write_applied(c, db, [f"cpu,host=h{i % 2} v={k * 100 + i} {T0 + k * 100 + i}" for i in range(10)])
        c.persist(db)
    part = wait_for(lambda: len(_partitions(c, db)["2023-11-14"]["files"]) == 1 and _partitions(c, db)["2023-11-14"],
                    90, "the policy's compaction of the persisted files")
    assert int(part["files"][0]["rows"]) == 30
    # the worker says why: the files are under the default 10-file threshold, so the partition went
    # cold (on a loaded machine it may go cold between two of the persists: 2 files, then 2 again)
    said = [r.getMessage() for r in caplog.records if f"Parquet file(s) of {db}/cpu/2023-11-14" in r.getMessage()]
    assert said and all(m.startswith("compacting ") and m.endswith("(cold)") for m in said), said
    assert {m.split()[1] for m in said} <= {"2", "3"}, said
    assert c.query(db, Q2).to_pylist() == [
        {"host": "h0", "n": 15, "s": float(sum(k * 100 + i for k in range(3) for i in range(0, 10, 2)))},
        {"host": "h1", "n": 15, "s": float(sum(k * 100 + i for k in range(3) for i in range(1, 10, 2)))}]


def test_restart_recovers_parquet_and_replays_the_rest_exactly_once(manual, request):
    c, db = manual.client, f"r_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=a v={i} {T0 + i}" for i in range(10)])
    c.persist(db)
    write_applied(c, db, [f"cpu,host=a v={100 + i} {T0 + 100 + i}" for i in range(5)])  # unpersisted
    write_applied(c, db, [f"cpu,host=b v=1 {T0}"])
    before = c.query(db, Q2).to_pylist()
    assert before == [{"host": "a", "n": 15, "s": float(sum(range(10)) + sum(range(100, 105)))},
                      {"host": "b", "n": 1, "s": 1.0}]
    r2 = manual.restart()
    try:
        tok = r2.client.write(db, f"cpu,host=c v=7 {T0}\n")  # after replay, in order
        r2.client.wait_applied(db, tok, timeout_s=120)
        after = r2.client.query(db, Q2).to_pylist()
        assert after == before + [{"host": "c", "n": 1, "s": 7.0}]
        # column types survive the restart: v is a float, an integer write conflicts
        import grpc

        with pytest.raises(grpc.RpcError) as ei:
            r2.client.write(db, f"cpu,host=d v=1i {T0}\n")
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cpu" in ei.value.details() and "'v'" in ei.value.details()
        st = r2.client.status(db)["databases"][0]
        assert st["replaying"] is False
        part = _partitions(r2.client, db)["2023-11-14"]
        assert len(part["files"]) == 1
    finally:
        manual.server, manual.client, manual.cfg = r2.server, r2.client, r2.cfg


def test_automatic_persist_by_rows_and_unload_under_memory_pressure(auto, iox_server):
    c, db = auto.client, f"a_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=h{i % 4} v={i} {T0 + i}" for i in range(200)])
    expect = c.query(db, Q2).to_pylist()
    # rows >= persist_row_threshold and older than the late-arrival window: persisted (from the
    # write-buffer form, so nothing of it stays in memory; a persisted chunk that kept its rows in
    # memory would be unloaded by the soft limit of 1 byte)
    part = wait_for(lambda: (_partitions(c, db).get("2023-11-14") or {}).get("files") and
                    all(ch["storage"] == "object_store" for ch in _partitions(c, db)["2023-11-14"]["chunks"]) and
                    _partitions(c, db)["2023-11-14"], 90, "persist + unload")
    assert sum(int(f["rows"]) for f in part["files"]) == 200
    assert expect == [{"host": f"h{h}", "n": 50, "s": float(sum(range(h, 200, 4)))} for h in range(4)]
    assert c.query(db, Q2).to_pylist() == expect
    # a Spark Connect client reads the unloaded (Parquet-only) chunks too, local or S3
    from tests.integration.spark_connect_client import remote_sql

    remote = remote_sql(iox_server.config.spark_connect_port, {"q": Q2.replace("FROM cpu", f"FROM global_temp.`{db}__cpu`")},
                     iox_server.spark_connect_token)
    assert remote["q"] == expect


def test_automatic_persist_by_age(auto):
    c, db = auto.client, f"g_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=x v=1 {T0}"])  # 1 row: below the row threshold, so only age persists it
    part = wait_for(lambda: (_partitions(c, db).get("2023-11-14") or {}).get("files") and
                    _partitions(c, db)["2023-11-14"], 90, "persist by age")
    assert sum(int(f["rows"]) for f in part["files"]) == 1
    assert c.query(db, "SELECT host, v FROM cpu").to_pylist() == [{"host": "x", "v": 1.0}]


def test_local_copies_of_s3_files_are_bounded_and_go_once_no_chunk_reads_them(manual, monkeypatch):
    """Local Spark on S3 reads persisted files from local copies (chunk_store/parquet_cache.py) while
    they fit --parquet-cache-max-bytes, and from S3 directly past it, with the same answers; the
    copies of files a compaction replaced go once their chunks are released. On a local object
    store the files are read in place: no copies."""
    from iox_spark.chunk_store import parquet_cache
    from iox_spark.chunk_store.chunk_data import release_chunk_data
    from iox_spark.lifecycle.unload import unload_chunk

    srv, c, db = manual.server, manual.client, f"pc_{uuid.uuid4().hex[:8]}"
    cache = srv.parquet_cache
    if manual.cfg.s3_endpoint is None:
        assert cache is None
        return
    dbo = None

    def unload_all():
        for ch in [ch for ch in srv.catalog.table_chunks(dbo, "cpu") if ch.state == "persisted"]:
            assert unload_chunk(srv.spark, srv.catalog, dbo, "cpu", ch.partition_key, ch.id, srv.store, cache)

    write_applied(c, db, [f"cpu,host=h{i % 3} v={i},w={i}i {T0 + i}" for i in range(30)])
    c.persist(db)
    write_applied(c, db, [f"cpu,host=h3 v=5 {T0 + 100}"])
    c.persist(db)
    dbo = srv.catalog.database(db)
    expect = c.query(db, Q).to_pylist()
    assert [r["n"] for r in expect] == [10, 10, 10, 1]
    unload_all()
    old = [f["key"] for f in _partitions(c, db)["2023-11-14"]["files"]]
    assert len(old) == 2 and all(os.path.exists(cache.path_of(k)) for k in old)
    assert c.query(db, Q).to_pylist() == expect
    # the compacted file does not fit: its chunk reads S3 directly, with the same answers
    monkeypatch.setattr(cache, "max_bytes", cache.bytes_held)
    r = c.compact(db, "cpu", "2023-11-14", persisted=True)
    assert r["compacted"] is True and sorted(r["removed_files"]) == sorted(old)
    unload_all()
    assert not os.path.exists(cache.path_of(r["added_file"]))
    assert c.query(db, Q).to_pylist() == expect
    # the replaced files' copies go once the chunks reading them are released
    monkeypatch.setattr(parquet_cache, "_FRESH_S", 0.0)
    assert all(os.path.exists(cache.path_of(k)) for k in old)
    for ch in srv.catalog.take_retired(time.time() + 1):
        release_chunk_data(srv.spark, ch)
    assert srv.lifecycle.sweep_parquet_cache() >= 2
    srv.lifecycle.delete_unpinned_files()
    assert not any(os.path.exists(cache.path_of(k)) for k in old)
    assert c.query(db, Q).to_pylist() == expect


def test_cleanup_deletes_orphans_only(manual):
    c, db = manual.client, f"o_{uuid.uuid4().hex[:8]}"
    write_applied(c, db, [f"cpu,host=a v=1 {T0}"])
    c.persist(db)
    store = manual.server.store
    orphan = f"{db}/data/cpu/2023-11-14/{uuid.uuid4()}.parquet"
    store.put(orphan, b"not referenced by any transaction")
    kept = [f["key"] for f in _partitions(c, db)["2023-11-14"]["files"]]
    wait_published(manual.server, db)  # until then the cleanup leaves the database alone
    deleted = manual.server.lifecycle.cleanup(time.time() + 10_000, 900.0)
    assert orphan in deleted
    assert not store.exists(orphan)
    assert all(store.exists(k) for k in kept)
    assert c.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 1.0}]


def test_restart_twice_after_a_full_checkpoint_file(iox_server, session_tmp, backend, aws_env):
    """Loading starts from the newest full checkpoint (.ckpt) plus later transactions; two restarts
    in a row give the same answer, exactly once."""
    r = _start(session_tmp, backend, worker_backoff_ms=3_600_000, catalog_transactions_until_checkpoint=2)
    db = f"k_{uuid.uuid4().hex[:8]}"
    try:
        # revision 1 records the database at its first write; three persists: revisions 2..4, a full
        # checkpoint at revision 2 and 4
        for k in range(3):
            write_applied(r.client, db, [f"cpu,host=h{k} v={k} {T0 + k}"])
            r.client.persist(db)
        write_applied(r.client, db, [f"cpu,host=late v=9 {T0 + 9}"])  # only in Kafka
        expect = [{"host": "h0", "n": 1, "s": 0.0}, {"host": "h1", "n": 1, "s": 1.0},
                  {"host": "h2", "n": 1, "s": 2.0}, {"host": "late", "n": 1, "s": 9.0}]
        assert r.client.query(db, Q2).to_pylist() == expect
        keys = [m.key for m in r.server.store.list(f"{db}/catalog/")]
        assert any(k.endswith(".ckpt") for k in keys), keys
        for _ in range(2):
            r = r.restart()
            r.client.wait_caught_up(db)
            assert r.client.query(db, Q2).to_pylist() == expect
            assert int(r.client.status(db)["databases"][0]["catalog_revision"]) == 4
    finally:
        r.stop()
        r.broker.stop()
