"""Retention: a database's period hides older rows at once, refuses older writes, and after the
prune delay drops their day partitions and Parquet files (through preserved-catalog transactions,
sparing files a running query may read or an Iceberg snapshot not expired references); set through
gRPC, the CLI and the InfluxDB v2 buckets API (influxdb-client's BucketsApi). Reuses the session
server (its prune delay is changed for one test and restored)."""
from __future__ import annotations

import http.client
import io
import json
import threading
import time
import uuid
from contextlib import redirect_stdout

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.iceberg_tables import pyiceberg_rows, server_table, wait_published
from tests.waiting import wait_for

DAY_NS = 86_400 * 10**9


def _now_ns() -> int:
    return time.time_ns()


def _applied(server, db: str, token: dict) -> bool:
    d = server.catalog.peek_database(db)
    return d is not None and all(d.applied_hi_inclusive.get(int(kp), -1) >= off for kp, off in token.items())


def _scrape(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    assert resp.status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def _status(client, db: str) -> dict:
    return client.status(db)["databases"][0]


def test_retention_hides_at_once_then_prunes_partitions_and_files_after_the_delay(client, db, iox_server):
    now = _now_ns()
    old3, old2, recent = now - 3 * DAY_NS, now - 2 * DAY_NS, now - 3600 * 10**9
    client.write(db, f"cpu,host=a v=1 {old3}\ncpu,host=b v=2 {old3 + 1}\ncpu,host=a v=3 {old2}\n"
                     f"cpu,host=a v=4 {recent}\n")
    persisted = client.persist(db)["persisted"]
    files = sorted(f for p in persisted for f in p["files"])
    old_files = sorted(f for p in persisted if p["partition_key"] != _day(recent) for f in p["files"])
    assert len(persisted) == 3 and old_files
    store = iox_server.store
    # one more old row, applied but never persisted: it lives only in memory and the write buffer
    token = client.write(db, f"cpu,host=c v=5 {now - 4 * DAY_NS}\n")
    wait_for(lambda: _applied(iox_server, db, token), 60, "the unpersisted old row applied")
    assert len(client.query(db, "SELECT v FROM cpu")) == 5

    lifecycle = iox_server.lifecycle
    lifecycle.prune_delay_s = 10 * 86_400.0  # the pruner stays 10 days behind: nothing is pruned yet
    try:
        _hidden_at_once_then_pruned(client, db, iox_server, now, files, old_files, recent)
    finally:
        lifecycle.prune_delay_s = iox_server.config.prune_delay_s


def _hidden_at_once_then_pruned(client, db, iox_server, now, files, old_files, recent):
    lifecycle, store = iox_server.lifecycle, iox_server.store
    r = client.set_retention(db, 86_400)
    assert r["period_s"] == 86_400 and abs(r["reader_lo_ns"] - (now - DAY_NS)) < 120 * 10**9
    # hidden at once: only the recent row, though every partition and file is still there
    assert client.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 4.0}]
    assert client.query(db, "SELECT count(*) AS n FROM cpu WHERE time_ns < 0 OR v > 0").to_pylist() == [{"n": 1}]
    st = _status(client, db)
    assert st["retention_period_s"] == 86_400 and st.get("pruner_hi_ns", 0) <= now - 10 * DAY_NS
    assert len(st["tables"][0]["partitions"]) == 4 and all(store.exists(f) for f in files)

    # a query that planned (and pinned) before the prune, held after planning until the prune is done
    import iox_spark.server.query.engine as engine
    from iox_spark.chunk_store.chunk_data import release_chunk_data

    pins, real_to_arrow = iox_server.catalog.query_pins, engine.arrow_batches
    planned, release, answer = threading.Event(), threading.Event(), []

    def held_to_arrow(*a, **kw):
        planned.set()
        assert release.wait(60)
        return real_to_arrow(*a, **kw)

    engine.arrow_batches = held_to_arrow
    running = threading.Thread(target=lambda: answer.append(client.query(db, "SELECT count(*) AS n FROM cpu")))
    try:
        running.start()
        assert planned.wait(60) and pins.running() >= 1
        engine.arrow_batches = real_to_arrow  # only that query is held
        lifecycle.prune_delay_s = 0.0
        st = wait_for(lambda: (s := _status(client, db)).get("pruner_hi_ns", 0) > now - 10 * DAY_NS and s, 60,
                      "pruner_hi past the old rows")
        assert st["pruner_hi_ns"] == (now - DAY_NS) // DAY_NS * DAY_NS
        assert [p["key"] for p in st["tables"][0]["partitions"]] == [_day(recent)]
        # the running query may still read every pruned file: none is deleted, each whole
        assert all(store.exists(f) for f in old_files)
        assert sum(pq.read_table(io.BytesIO(store.get(f))).num_rows for f in old_files) == 3
    finally:
        engine.arrow_batches = real_to_arrow
        release.set()
        running.join(60)
    assert [t.to_pylist() for t in answer] == [[{"n": 1}]]  # it completed, with the rows of its plan
    # unpinned, the pruned files stay only while an Iceberg snapshot not expired references them:
    # the current one (the prune's) does not, and an Iceberg reader sees the recent row only
    wait_published(iox_server, db)
    assert pyiceberg_rows(server_table(iox_server, db, "cpu"), ("v",)) == [(4.0,)]
    assert set(old_files) <= iox_server.iceberg.published_keys(db)
    iox_server.lifecycle.delete_unpinned_files()
    assert all(store.exists(f) for f in files)
    iox_server.iceberg.run_once(time.time() + 10_000)  # expires the snapshots older than the retention
    assert not set(old_files) & iox_server.iceberg.published_keys(db)
    for chunk in iox_server.catalog.take_retired(time.time() + 1):  # as the lifecycle does after a grace
        release_chunk_data(iox_server.spark, chunk)
    iox_server.lifecycle.cleanup(time.time() + 10_000, 900.0)
    assert not any(store.exists(f) for f in old_files)
    assert all(store.exists(f) for f in files if f not in old_files)
    assert client.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 4.0}]
    # the preserved catalog: the files removed, and a database checkpoint that replays nothing of
    # the dropped unpersisted row (every Kafka partition fully persisted)
    pc = lifecycle.preserved[db]
    assert sorted(pc.state.files) == sorted(f for f in files if f not in old_files)
    assert pc.state.pruner_hi_ns == st["pruner_hi_ns"] and pc.state.retention_period_s == 86_400
    assert all(lo is None for lo, _hi in pc.state.database_checkpoint.sequencer_numbers.values())
    m = _scrape(iox_server.config.http_port)
    label = frozenset({("database", db)})
    assert m[("iox_pruned_partitions_total", label)] == 3
    assert m[("iox_pruned_files_total", label)] == len(old_files)
    assert m[("iox_pruner_hi_ns", label)] == st["pruner_hi_ns"]
    assert m[("iox_retention_seconds", label)] == 86_400
    assert abs(m[("iox_reader_lo_ns", label)] - (_now_ns() - DAY_NS)) < 120 * 10**9
    assert m[("iox_persists_total", label)] == 3 and m[("iox_persisted_rows_total", label)] == 4


def _day(t_ns: int) -> str:
    from iox_spark.catalog.partition_keys import partition_key_of_day

    return partition_key_of_day(t_ns // DAY_NS)


def test_writes_older_than_the_retention_are_rejected_whole(client, db, iox_server):
    from iox_spark.server.cli.main import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["retention", "--addr", f"127.0.0.1:{iox_server.grpc_port}", "--db", db, "--period", "12h"]) == 0
    assert json.loads(out.getvalue())["period_s"] == 43_200
    now = _now_ns()
    old = now - 13 * 3600 * 10**9
    with pytest.raises(grpc.RpcError) as e:
        client.write(db, f"cpu v=1 {now}\ncpu v=2 {old}\n")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "line 2" in e.value.details() and "12h" in e.value.details()
    arrow = pa.table({"v": pa.array([1.0, 2.0]), "t": pa.array([now, old], pa.int64())})
    with pytest.raises(grpc.RpcError) as e:
        client.write_arrow(db, {"arr": (arrow, {"v": "field", "t": "time"})})
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "row 1" in e.value.details()
    port = iox_server.config.http_port
    org, bucket = db.split("_", 1)
    for path, body in [(f"/api/v2/write?org={org}&bucket={bucket}&precision=s", f"cpu v=3 {now // 10**9}\n"
                                                                              f"cpu v=4 {old // 10**9}\n"),
                       (f"/write?db={db}", f"cpu v=5 {old}\n")]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        conn.close()
        assert resp.status == 422, answer
        assert "retention" in (answer.get("message") or answer.get("error"))
    # within the retention: accepted. The database's first stored write: the write buffer's tail may
    # pick it up from Kafka a moment after the acknowledgement, so the query waits for its token
    client.wait_visible(db, client.write(db, f"cpu v=6 {now}\n"))
    assert client.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 6.0}]  # nothing rejected was stored
    with pytest.raises(grpc.RpcError) as e:
        client.set_retention(db, -1)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.set_retention(db, 0)["period_s"] == 0  # removed: old points are taken again
    client.wait_visible(db, client.write(db, f"cpu v=7 {old}\n"))
    assert sorted(r["v"] for r in client.query(db, "SELECT v FROM cpu").to_pylist()) == [6.0, 7.0]


def test_influxdb_client_buckets_api_creates_and_updates_a_bucket_with_retention(client, iox_server):
    from influxdb_client import BucketRetentionRules, InfluxDBClient
    from influxdb_client.rest import ApiException

    org, name = f"o{uuid.uuid4().hex[:8]}", "metrics"
    with InfluxDBClient(url=f"http://127.0.0.1:{iox_server.config.http_port}", token="unused", org=org) as ic:
        api = ic.buckets_api()
        created = api.create_bucket(bucket_name=name, org=org,
                                    retention_rules=BucketRetentionRules(type="expire", every_seconds=3600))
        assert created.name == name and created.retention_rules[0].every_seconds == 3600
        database = f"{org}_{name}"
        assert _status(client, database)["retention_period_s"] == 3600
        found = api.find_bucket_by_name(name)
        assert found.id == created.id and found.org_id == created.org_id
        found.retention_rules = [BucketRetentionRules(type="expire", every_seconds=7200)]
        updated = api.update_bucket(found)
        assert updated.retention_rules[0].every_seconds == 7200
        assert _status(client, database)["retention_period_s"] == 7200
        assert api.find_bucket_by_id(created.id).retention_rules[0].every_seconds == 7200
        with pytest.raises(ApiException) as e:
            api.create_bucket(bucket_name=name, org=org)
        assert e.value.status == 422
        # a write through the client beyond the retention is refused with 422
        from influxdb_client.client.write_api import SYNCHRONOUS

        with pytest.raises(ApiException) as e:
            ic.write_api(write_options=SYNCHRONOUS).write(bucket=name, org=org,
                                                           record=f"cpu v=1 {_now_ns() - 3 * 3600 * 10**9}")
        assert e.value.status == 422
    assert iox_server.lifecycle.preserved[database].state.retention_period_s == 7200


def test_retention_survives_a_restart_and_pruned_rows_are_not_replayed(own_broker, session_tmp):
    """The period is in the preserved catalog; a pruned partition that was never persisted leaves a
    database checkpoint past its offsets, so the replay after a restart does not bring it back (the
    restarted server's pruner stays 10 days behind: a replayed row would show)."""
    import dataclasses
    import os

    from tests.conftest import make_config, start_server

    cfg = make_config(os.path.join(session_tmp, f"ret-{uuid.uuid4().hex[:6]}"), own_broker.bootstrap, http_port=0,
                      prune_delay_s=0.0, lifecycle={"worker_backoff_ms": 200})
    db = f"r_{uuid.uuid4().hex[:8]}"
    now = _now_ns()
    recent = now - 60 * 10**9
    srv, c = start_server(cfg)
    try:
        token = c.write(db, f"cpu v=1 {now - 3 * DAY_NS}\ncpu v=2 {recent}\n")
        wait_for(lambda: _applied(srv, db, token), 60, "both rows applied")
        c.set_retention(db, 86_400)
        wait_for(lambda: [p["key"] for p in _status(c, db)["tables"][0]["partitions"]] == [_day(recent)], 30,
                 "the old, unpersisted partition pruned")
        assert srv.lifecycle.preserved[db].state.files == {}  # nothing was ever persisted
    finally:
        c.close()
        srv.stop()
    srv, c = start_server(dataclasses.replace(cfg, prune_delay_s=10 * 86_400.0))
    try:
        c.wait_caught_up(db)
        st = _status(c, db)
        assert st["retention_period_s"] == 86_400 and st["pruner_hi_ns"] >= (now - 2 * DAY_NS) // DAY_NS * DAY_NS
        assert [p["key"] for p in st["tables"][0]["partitions"]] == [_day(recent)]
        assert c.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 2.0}]
        with pytest.raises(grpc.RpcError) as e:
            c.write(db, f"cpu v=3 {now - 2 * DAY_NS}\n")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        c.close()
        srv.stop()
