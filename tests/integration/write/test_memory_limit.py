"""Backpressure by real memory: at --memory-limit-bytes (the RSS of the server's process tree)
writes are refused with RESOURCE_EXHAUSTED / HTTP 503 + Retry-After until the tree is back under,
and nothing acknowledged is lost. Uses the session server, whose limit is lowered for the test
and restored (the guard reads its limit at each sample)."""
from __future__ import annotations

import http.client
import time

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iox_spark.server.runtime.memory_guard import NORMAL, REFUSING
from tests.waiting import wait_for
from tests.timestamps import T0


def _http_write(port: int, db: str, body: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", f"/write?db={db}", body=body)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Retry-After"), resp.read()
    finally:
        conn.close()


def _gauges(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return {s.name: s.value for fam in text_string_to_metric_families(body) for s in fam.samples if not s.labels}


def test_writes_are_refused_at_the_memory_limit_until_back_under(client, db, iox_server):
    guard, port = iox_server.memory_guard, iox_server.config.http_port
    assert guard.rss_bytes > 0 and guard.state == NORMAL  # the default: off, measuring only
    client.write(db, f"cpu v=0 {T0}\n")
    acked = [0]
    limit = guard.limit_bytes
    guard.limit_bytes = 1  # any process tree is over one byte
    try:
        wait_for(lambda: guard.state == REFUSING, 10, "the guard at its limit")
        g = _gauges(port)
        assert g["iox_memory_state"] == REFUSING and g["iox_memory_limit_bytes"] == 1
        assert g["iox_process_tree_rss_bytes"] > 100 << 20  # driver + Spark JVM
        with pytest.raises(grpc.RpcError) as e:
            client.write(db, f"cpu v=1 {T0 + 1}\n")
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--memory-limit-bytes" in e.value.details()
        assert dict(e.value.trailing_metadata()).get("retry-after-s") == "1.0"
        status, retry_after, body = _http_write(port, db, f"cpu v=2 {T0 + 2}\n")
        assert (status, retry_after) == (503, "1") and b"memory" in body
        assert iox_server.lifecycle.hooks.memory_pressure()  # the lifecycle frees memory first meanwhile
    finally:
        guard.limit_bytes = limit
    wait_for(lambda: guard.state == NORMAL, 10, "the guard back under")
    for i in (3, 4):  # accepted again
        client.write(db, f"cpu v={i} {T0 + i}\n")
        acked.append(i)
    assert _http_write(port, db, f"cpu v=5 {T0 + 5}\n")[0] == 204
    acked.append(5)
    deadline = time.monotonic() + 60
    while sorted(r["v"] for r in client.query(db, "SELECT v FROM cpu").to_pylist()) != [float(i) for i in acked]:
        assert time.monotonic() < deadline, "acknowledged writes not all queryable (or refused ones stored)"
        time.sleep(0.2)
    client.persist(db)  # returns once every acknowledged write is applied by micro-batches
    g = _gauges(port)
    assert g["iox_micro_batch_seconds_count"] >= 1 and g["iox_micro_batch_messages_sum"] >= len(acked)
