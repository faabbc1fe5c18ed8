"""Watermarks per database and Kafka partition (status, /metrics), what each query answer reflects, and
read-your-writes with write tokens, through the session's real server (gRPC, HTTP, Kafka, Spark).

The applied watermark never passes a gap: a message whose micro-batch fails (the consumer's fault point
`apply_table`, armed in this process, catalog/crash_points.py) is held and its partition's applied offset
stays before it while later messages wait behind it, counted as lag; once retried, it catches up.
"""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iox_spark.catalog.crash_points import FaultPoint, arm_fault, disarm_fault
from iox_spark.catalog.sharding import partition_for, topic_for
from iox_spark.server.write_buffer.write_token import WriteToken, format_token, parse_token
from tests.waiting import wait_for
from tests.timestamps import T0

KP = partition_for("m", 4)
IOX = os.path.join(os.path.dirname(sys.executable), "iox")


def _marks(client, db) -> dict:
    """{kp: KafkaPartitionStatus dict} of `db`."""
    return {w["partition"]: w for w in client.status(db)["databases"][0]["write_buffer"]}


def _scrape(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def _metric(scraped: dict, name: str, db: str, kp: int, **labels) -> float:
    return scraped[(name, frozenset({"database": db, "partition": str(kp), **labels}.items()))]


def test_status_and_metrics_report_applied_visible_persisted_high_watermark_and_lag(client, db, iox_server):
    off = client.write(db, f"m v=1 {T0}\n")[KP]
    client.wait_applied(db, {KP: off}, timeout_s=90)
    # Kafka's ends of a new topic are read in the background (the status says -1 until then)
    w = wait_for(lambda: (m := _marks(client, db)[KP])["high_watermark"] >= 0 and m, 30, "Kafka's end read")
    assert (w["applied_hi_inclusive"], w["high_watermark"], w["lag_messages"], w["lag_bytes"]) == (off, off + 1, 0, 0)
    assert w["visible_hi_inclusive"] == off and w["persisted_hi_inclusive"] < off  # in memory only
    client.persist(db)
    w = _marks(client, db)[KP]
    assert w["persisted_hi_inclusive"] == off  # a restart reads nothing of it again
    scraped = _scrape(iox_server.config.http_port)
    for name, value in (("applied_hi_inclusive", off), ("visible_hi_inclusive", off), ("persisted_hi_inclusive", off),
                        ("high_watermark", off + 1)):
        assert _metric(scraped, "iox_watermark_offset", db, KP, watermark=name) == value
    assert _metric(scraped, "iox_write_buffer_lag_messages", db, KP) == 0
    other = (KP + 1) % 4  # a partition nothing was written to
    assert _metric(scraped, "iox_watermark_offset", db, other, watermark="applied_hi_inclusive") == -1


def test_a_failed_micro_batch_leaves_the_applied_watermark_behind_it_until_it_applies(client, db):
    first = client.write(db, f"m v=1 {T0}\n")[KP]
    client.wait_applied(db, {KP: first}, timeout_s=90)
    arm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    try:
        failing = client.write(db, f"m v=2 {T0 + 1}\n")[KP]
        later = client.write(db, f"io v=3 {T0 + 2}\n")[KP]  # "io" shares the Kafka partition: behind the gap
        assert partition_for("io", 4) == KP and later > failing
        wait_for(lambda: [r for r in client.status(db)["databases"][0]["poisoned"] if r["state"] == "held"], 120,
                 "the failing message to be held")
        w = _marks(client, db)[KP]
        assert w["applied_hi_inclusive"] == failing - 1  # never past the gap, though `later` was read
        assert w["visible_hi_inclusive"] == failing - 1  # nor visible past it
        assert w["high_watermark"] == later + 1 and w["lag_messages"] == later - failing + 1 and w["lag_bytes"] > 0
        assert [r["v"] for r in client.query(db, "SELECT v FROM m").to_pylist()] == [1.0]
    finally:
        disarm_fault(FaultPoint.APPLY_TABLE, f"{db}/m")
    client.retry_poisoned(db)
    client.wait_applied(db, {KP: later}, timeout_s=120)
    assert _marks(client, db)[KP]["lag_messages"] == 0
    assert [r["v"] for r in client.query(db, "SELECT v FROM m ORDER BY v").to_pylist()] == [1.0, 2.0]


def test_a_query_after_a_write_token_reads_that_write_or_delete_and_says_what_it_reflects(client, db):
    resp = client.write_response(db, f"m v=7 {T0}\n")
    token = parse_token(resp.token_text)
    assert token == WriteToken(topic_for(db), resp.token.topic_id or None, resp.token.epoch, dict(resp.token.offsets))
    # at once, without waiting for anything first: the query waits for the token itself
    table, info = client.query_with_watermark(db, "SELECT v FROM m", timeout_s=60, after=resp.token_text)
    assert table.to_pylist() == [{"v": 7.0}]
    assert info["visible_hi_inclusive"][KP] >= token.offsets[KP] and info["partial"] is False
    assert (info["topic"], info["epoch"], info["topic_id"]) == (topic_for(db), token.epoch, token.topic_id or "")
    # a delete's token too: the query reads after the delete
    deleted = client.delete_response(db, T0, T0 + 1, table="m")
    assert client.query(db, "SELECT v FROM m", timeout_s=60, after=deleted.token_text).num_rows == 0


def test_a_token_not_visible_by_the_deadline_is_deadline_exceeded_never_a_stale_answer(client, db):
    resp = client.write_response(db, f"m v=1 {T0}\n")
    t = parse_token(resp.token_text)
    far = format_token(WriteToken(t.topic, t.topic_id, t.epoch, {KP: t.offsets[KP] + 1_000_000}))
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        client.query(db, "SELECT v FROM m", timeout_s=3, after=far)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "write token is not visible" in e.value.details()  # the server's answer, before the client gave up
    assert time.monotonic() - t0 < 30


def test_tokens_of_another_epoch_topic_incarnation_or_database_are_refused(client, db):
    resp = client.write_response(db, f"m v=1 {T0}\n")
    t = parse_token(resp.token_text)
    cases = [(WriteToken(t.topic, t.topic_id, t.epoch + 1, t.offsets), grpc.StatusCode.FAILED_PRECONDITION,
              f"epoch {t.epoch + 1}"),
             (WriteToken(t.topic, "another-incarnation", t.epoch, t.offsets), grpc.StatusCode.FAILED_PRECONDITION,
              "another-incarnation"),
             (WriteToken(topic_for("x" + db), t.topic_id, t.epoch, t.offsets), grpc.StatusCode.INVALID_ARGUMENT,
              "not of database")]
    if t.topic_id is None:  # the broker gives topic ids; without one the incarnation cannot be checked
        pytest.fail("the write's token carries no topic id")
    for token, code, says in cases:
        with pytest.raises(grpc.RpcError) as e:
            client.query(db, "SELECT v FROM m", timeout_s=30, after=format_token(token))
        assert (e.value.code(), says in e.value.details()) == (code, True), e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        client.query(db, "SELECT v FROM m", timeout_s=30, after='{"0": 3}')
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "invalid write token" in e.value.details()


def test_http_write_token_header_round_trip_through_http_and_the_cli(iox_server, db):
    port, org, bucket = iox_server.config.http_port, db, "b"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", f"/api/v2/write?org={org}&bucket={bucket}", body=f"m v=5 {T0}\n")
    r = conn.getresponse()
    r.read()
    conn.close()
    assert r.status == 204
    text = r.getheader("X-Iox-Write-Token")
    assert parse_token(text).topic == topic_for(f"{org}_{bucket}")
    # the token back through a query request header, at once: the answer has the write
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/api/v3/query_sql?db={org}_{bucket}&q=SELECT%20v%20FROM%20m",
                 headers={"X-Iox-After": text, "X-Iox-Timeout-S": "60"})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    assert (r.status, json.loads(body)) == (200, [{"v": 5.0}]), body
    kp = partition_for("m", 4)
    assert json.loads(r.getheader("X-Iox-Visible-Hi-Inclusive"))[str(kp)] >= parse_token(text).offsets[kp]
    assert r.getheader("X-Iox-Partial") == "false" and r.getheader("X-Iox-Epoch") == str(parse_token(text).epoch)
    out = subprocess.run([IOX, "sql", "--addr", f"127.0.0.1:{iox_server.grpc_port}", "--db", f"{org}_{bucket}",
                          "--after", text, "--timeout-s", "60", "--show-watermark", "--format", "json",
                          "SELECT v FROM m"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"v": 5.0}]
    mark = json.loads(out.stderr.strip().splitlines()[-1])["watermark"]
    assert mark["visible_hi_inclusive"][str(kp)] >= parse_token(text).offsets[kp] and mark["partial"] is False
