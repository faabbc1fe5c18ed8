"""GET /metrics: the router's stage histograms and acknowledged totals, through real gRPC and HTTP.

The session's server is shared, so each test reads the metrics before and after its own
requests and asserts the exact difference.
"""
from __future__ import annotations

import http.client

import grpc
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from iox_spark.server.metrics import WRITE_STAGE_BUCKETS_S, WRITE_STAGES
from tests.timestamps import T0


def _get(port: int, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def _scrape(port: int) -> dict:
    """{(sample name, frozenset of labels): value} of every sample /metrics serves."""
    status, ctype, body = _get(port, "/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def _delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def _count(d: dict, stage: str) -> float:
    return d.get(("iox_write_stage_seconds_count", frozenset({("stage", stage)})), 0.0)


def test_metrics_count_each_stage_and_exactly_the_acknowledged_writes(client, db, iox_server):
    port = iox_server.config.http_port
    before = _scrape(port)
    client.write(db, "".join(f"cpu,host=h{i} v={i} {T0 + i}\n" for i in range(7)))  # gRPC line protocol: 7
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # HTTP line protocol: 2 points
    conn.request("POST", f"/api/v2/write?org={db}&bucket=http", body=f"cpu v=1 {T0}\ncpu v=2 {T0 + 1}\n")
    assert conn.getresponse().status == 204
    conn.close()
    data = pa.table({"v": pa.array([1.0, 2.0, 3.0]), "t": pa.array([T0, T0 + 1, T0 + 2], pa.int64())})
    client.write_arrow(db, {"arr": (data, {"v": "field", "t": "time"})})  # gRPC Arrow: 3 points
    with pytest.raises(grpc.RpcError) as bad:  # parsed, rejected: never acknowledged
        client.write(db, f"cpu v=1 {T0}\ncpu v= {T0}\n")
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    d = _delta(before, _scrape(port))

    assert d[("iox_write_requests_total", frozenset())] == 3
    assert d[("iox_write_points_total", frozenset())] == 12
    assert _count(d, "parse") == 3  # two acknowledged line-protocol writes and the rejected one
    assert _count(d, "decode") == 1
    for stage in ("checks", "encode", "produce"):
        assert _count(d, stage) == 3, stage
    # every observation falls in a bucket: the +Inf bucket counts them all
    assert d[("iox_write_stage_seconds_bucket", frozenset({("stage", "produce"), ("le", "+Inf")}))] == 3
    assert d[("iox_write_stage_seconds_sum", frozenset({("stage", "produce")}))] > 0


def test_metrics_list_every_stage_and_bucket_and_only_answer_get(iox_server):
    port = iox_server.config.http_port
    samples = _scrape(port)
    for stage in WRITE_STAGES:
        les = {dict(labels)["le"] for name, labels in samples
               if name == "iox_write_stage_seconds_bucket" and dict(labels)["stage"] == stage}
        assert les == {repr(float(b)) for b in WRITE_STAGE_BUCKETS_S} | {"+Inf"}, stage
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/metrics", body=b"x")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Allow")) == (405, "GET")
        resp.read()
    finally:
        conn.close()
