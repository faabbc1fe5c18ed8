"""A query right after a restart never presents an incomplete answer as complete.

Real processes: acknowledged points written to an `iox serve` subprocess, SIGKILL, a restart on the same
data directory whose micro-batches are slowed by the delay point `apply_batch` (catalog/crash_points.py),
so its replay of the write buffer takes seconds; queries sent at once answer UNAVAILABLE with the replay's
progress (or nothing by the client's deadline), or every acknowledged row; with allow_partial the answer is
marked partial and says which offsets it reflects; once the replay caught up, the full rows.
"""
from __future__ import annotations

import time
import uuid

import grpc
import pytest

from iox_spark.catalog.crash_points import DELAY_ENV
from tests.crash.harness import ServerProcess
from tests.timestamps import T0

#: how long the restarted server holds each micro-batch before applying it: its replay stays observable for
#: seconds, also on a loaded machine
_BATCH_DELAY_S = 20
#: the client's deadline of each query sent while the replay has not caught up
_QUERY_TIMEOUT_S = 4.0


def test_a_query_at_once_after_a_restart_answers_all_acknowledged_rows_or_unavailable(data_dir, monkeypatch):
    db = f"rq_{uuid.uuid4().hex[:8]}"
    s1 = ServerProcess(data_dir).wait_ready()
    try:
        # three acknowledged points, never persisted: one write-buffer message, replayed in one micro-batch
        last = s1.client.write(db, "".join(f"crash,src=a id={i}i {T0 + i}\n" for i in range(3)), timeout_s=30)
        s1.client.wait_applied(db, last, timeout_s=90)
    finally:
        s1.kill()
    monkeypatch.setenv(DELAY_ENV, f"apply_batch={_BATCH_DELAY_S}")
    s2 = ServerProcess(data_dir).wait_ready()
    try:
        c = s2.client
        # at once: the replay has not caught up. A loaded machine may not answer by the client's deadline:
        # asked again (the replay's only micro-batch is held for _BATCH_DELAY_S meanwhile)
        asked_until = time.monotonic() + _BATCH_DELAY_S / 2
        while True:
            with pytest.raises(grpc.RpcError) as e:
                c.query(db, "SELECT id FROM crash", timeout_s=_QUERY_TIMEOUT_S)
            if e.value.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > asked_until:
                break
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
        assert "replaying its write buffer" in e.value.details() and "0 of 1 offsets done" in e.value.details()
        table, info = c.query_with_watermark(db, "SHOW TABLES", timeout_s=30, allow_partial=True)
        assert info["partial"] is True, info  # accepted as partial, and marked so
        (kp,) = last
        assert info["applied_hi_inclusive"][kp] < last[kp]
        # asked again and again from now on: never fewer rows presented as complete
        deadline = time.monotonic() + 120
        while True:
            try:
                table, info = c.query_with_watermark(db, "SELECT id FROM crash ORDER BY id", timeout_s=5)
            except grpc.RpcError as err:
                # the replay's progress, or no answer at all by the client's own deadline
                assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), err.details()
                assert time.monotonic() < deadline, s2.tail()
                continue
            assert [r["id"] for r in table.to_pylist()] == [0, 1, 2] and info["partial"] is False
            break
    finally:
        s2.kill()
