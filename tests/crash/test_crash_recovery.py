"""SIGKILL at chosen moments, restart, and exactly the acknowledged writes come back.

Real processes: `iox serve` subprocesses with the embedded broker (which outlives a
killed server and is reused by the next one on the same data directory).
"""
from __future__ import annotations

import os
import time
import uuid

import pytest

from iox_spark.catalog.crash_points import CrashPoint
from tests.crash.harness import ServerProcess, Writer, broker_record, stop_embedded_broker
from tests.timestamps import T0

# persist and compact quickly so the crash points are reached within seconds
LIFECYCLE = ["--persist-row-threshold", "150", "--late-arrive-window-s", "1", "--persist-age-threshold-s", "2",
             "--persisted-compaction-cold-s", "1", "--worker-backoff-ms", "200"]


@pytest.mark.parametrize("point", [CrashPoint.CONSUME_BEFORE_APPLIED, CrashPoint.COMPACT_BEFORE_SWAP,
                                   CrashPoint.PERSIST_AFTER_PARQUET, CrashPoint.PERSIST_AFTER_COMMIT,
                                   CrashPoint.COMPACT_PERSISTED_AFTER_PARQUET,
                                   CrashPoint.COMPACT_PERSISTED_AFTER_COMMIT])
def test_kill_at_point_then_restart_exactly_once(data_dir, point):
    w = Writer(f"c_{uuid.uuid4().hex[:8]}")
    # compaction needs persistence not to take the chunks first
    extra = ["--worker-backoff-ms", "200"] if point == CrashPoint.COMPACT_BEFORE_SWAP else LIFECYCLE
    if point in (CrashPoint.COMPACT_PERSISTED_AFTER_PARQUET, CrashPoint.COMPACT_PERSISTED_AFTER_COMMIT):  # persists every 150 rows; the 3rd file starts a compaction
        extra = LIFECYCLE + ["--persisted-compaction-file-threshold", "3"]
    s1 = ServerProcess(data_dir, crash_at=point, extra=extra).wait_ready()
    broker_pid = broker_record(data_dir)["pid"]
    w.write_until_dead(s1, n=60)
    assert s1.proc.returncode == -9, s1.tail()  # it died by SIGKILL at the crash point
    os.kill(broker_pid, 0)  # the embedded broker outlived the server
    s2 = ServerProcess(data_dir, extra=LIFECYCLE).wait_ready()
    try:
        assert broker_record(data_dir)["pid"] == broker_pid  # and was reused
        for _ in range(3):  # writes after the restart are ordered after the replay
            w.write_batch(s2.client)
        w.check(s2.client)
    finally:
        s2.kill()


def test_kill_during_replay_then_restart(data_dir):
    w = Writer(f"r_{uuid.uuid4().hex[:8]}")
    s1 = ServerProcess(data_dir).wait_ready()  # default thresholds: only the explicit persist acts
    for _ in range(10):
        w.write_batch(s1.client)
    w.check(s1.client)  # all applied
    assert s1.client.persist(w.db)["persisted"]  # part persisted, the rest replays
    for _ in range(10):
        w.write_batch(s1.client)
    s1.kill()
    s2 = ServerProcess(data_dir, crash_at=CrashPoint.REPLAY_BATCH, extra=LIFECYCLE)
    assert s2.wait_exit(240) == -9, s2.tail()  # killed while replaying
    s3 = ServerProcess(data_dir, extra=LIFECYCLE).wait_ready()
    try:
        w.check(s3.client)
        assert s3.client.status(w.db)["databases"][0]["replaying"] is False
    finally:
        s3.kill()


def test_clean_stop_persists_everything_and_a_new_epoch_keeps_order(data_dir):
    """SIGTERM with the embedded in-memory broker: everything is persisted before the broker
    stops; the next server gets a fresh broker (offsets start over) and keeps write order."""
    w = Writer(f"e_{uuid.uuid4().hex[:8]}")
    memory = ["--broker-storage", "memory"]
    s1 = ServerProcess(data_dir, extra=memory).wait_ready()  # default thresholds: nothing persists by itself
    for _ in range(5):
        w.write_batch(s1.client)
    s1.client.write(w.db, "over,k=a v=1 1700000000000000000\n")
    assert s1.terminate() == 0, s1.tail()
    assert not os.path.exists(os.path.join(data_dir, "broker.json"))  # the broker was stopped
    s2 = ServerProcess(data_dir, extra=memory).wait_ready()
    try:
        w.check(s2.client, wait_tokens=False)
        st = s2.client.status(w.db)["databases"][0]
        assert int(st["epoch"]) == 1
        tok = s2.client.write(w.db, "over,k=a v=2 1700000000000000000\n")  # same point, written later
        s2.client.wait_applied(w.db, tok, timeout_s=60)
        assert s2.client.query(w.db, "SELECT v FROM over").to_pylist() == [{"v": 2.0}]
    finally:
        s2.kill()


def test_kill_during_cleanup_with_interleaved_partitions_and_deletes(data_dir):
    """Two tables on two Kafka partitions written in the same requests, a database-wide delete in
    between, a persist, then SIGKILL while the restarted server's first cleanup runs; after the
    next restart exactly the acknowledged rows the delete did not remove come back."""

    db = f"i_{uuid.uuid4().hex[:8]}"
    s1 = ServerProcess(data_dir).wait_ready()
    acked, n = set(), 0

    def write(client, count=4):
        nonlocal n
        for _ in range(count):
            ids = list(range(n, n + 40))
            n += 40
            lp = "\n".join(f"{t},src=w{i % 2} id={i}i {T0 + i}" for i in ids for t in ("cpu", "net"))
            client.write(db, lp)  # cpu and net live on different Kafka partitions
            acked.update(ids)

    write(s1.client)
    before_delete = set(acked)
    tok = s1.client.delete(db, T0, T0 + 10**12, "src = 'w1'")  # every table: one copy per partition
    s1.client.wait_applied(db, tok, timeout_s=120)
    assert s1.client.persist(db)["persisted"]
    write(s1.client)  # after the delete: src=w1 rows survive
    s1.kill()
    s2 = ServerProcess(data_dir, crash_at=CrashPoint.CLEANUP_BEFORE_DELETE)
    assert s2.wait_exit(240) == -9, s2.tail()  # killed in its first cleanup, while replaying or after
    s3 = ServerProcess(data_dir).wait_ready()
    try:
        s3.client.wait_caught_up(db, timeout_s=180)
        expect = sorted(i for i in acked if not (i in before_delete and i % 2 == 1))
        for table in ("cpu", "net"):
            ids = [r["id"] for r in s3.client.query(db, f"SELECT id FROM {table} ORDER BY id").to_pylist()]
            assert ids == expect, table
    finally:
        s3.kill()


def _two_table_request(lo: int, hi: int) -> str:
    """Rows lo..hi-1 of `cpu` and `net`, which live on different Kafka partitions (of 2)."""

    return "\n".join(f"{t},src=w id={i}i {T0 + i}" for i in range(lo, hi) for t in ("cpu", "net"))


def _ids(client, db, table) -> list:
    # a table whose parts were only read at start (aborted) has columns and no rows: it queries empty
    return [r["id"] for r in client.query(db, f"SELECT id FROM {table} ORDER BY id").to_pylist()]


@pytest.mark.parametrize("point,committed", [(CrashPoint.TXN_AFTER_PARTS, False),
                                             (CrashPoint.TXN_AFTER_DECISION, True)])
def test_kill_inside_a_multi_partition_request_applies_all_or_nothing(data_dir, point, committed):
    """SIGKILL between a request's parts and its commit decision (nothing of it may appear),
    or between the acknowledged decision and the markers (all of it must appear). The client
    got no success either way; acknowledged requests before it come back exactly once."""
    import grpc

    from iox_spark.catalog.sharding import partition_for

    # net is on the coordinator partition (the highest one the request touches)
    assert partition_for("cpu", 2) < partition_for("net", 2)
    db = f"x_{uuid.uuid4().hex[:8]}"
    fast_abort = ["--produce-timeout-ms", "1000", "--txn-timeout-s", "8"]
    s1 = ServerProcess(data_dir, crash_at=point, extra=fast_abort).wait_ready()
    s1.client.write(db, "solo,src=w id=0i 1\n")  # one message: not a transaction, not a crash point
    with pytest.raises(grpc.RpcError):
        s1.client.write(db, _two_table_request(0, 30))
    assert s1.wait_exit(60) == -9, s1.tail()
    s2 = ServerProcess(data_dir, extra=fast_abort).wait_ready()
    try:
        s2.client.wait_caught_up(db, timeout_s=180)
        deadline = time.monotonic() + 90
        while True:  # undecided parts wait for the decision's markers or the transaction timeout
            st = s2.client.status(db)["databases"][0]
            if st.get("pending_transaction_parts", 0) == 0 and st.get("pinned_transactions", 0) == 0:
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        expect = list(range(30)) if committed else []
        assert _ids(s2.client, db, "cpu") == expect
        assert _ids(s2.client, db, "net") == expect
        assert _ids(s2.client, db, "solo") == [0]
        tok = s2.client.write(db, _two_table_request(100, 110))  # the next request commits normally
        s2.client.wait_applied(db, tok, timeout_s=60)
        assert _ids(s2.client, db, "cpu") == expect + list(range(100, 110))
        assert _ids(s2.client, db, "net") == expect + list(range(100, 110))
    finally:
        s2.kill()


def test_a_delete_never_removes_a_later_write_across_restarts(data_dir):
    """Write two hosts, delete host a's first 50 s, write a point back at a deleted timestamp,
    persist, delete host b on the persisted data, SIGKILL, restart: host a keeps its 51 points
    (the one written after the delete included); again after a clean restart (new epoch)."""
    db, S = f"dl_{uuid.uuid4().hex[:8]}", 1_000_000_000
    q = "SELECT host, count(*) AS n, max(v) AS v FROM m GROUP BY host ORDER BY host"
    want = [{"host": "a", "n": 51, "v": 999}]
    servers = [ServerProcess(data_dir).wait_ready()]
    try:
        c = servers[0].client
        c.write(db, "\n".join(f"m,host={h} v={i}i {T0 + i * S}" for h in "ab" for i in range(100)))
        c.delete(db, T0, T0 + 50 * S, predicate='host="a"', table="m")
        c.write(db, f"m,host=a v=999i {T0 + 10 * S}")
        assert int(c.persist(db)["persisted"][0]["rows"]) == 151
        tok = c.delete(db, T0, T0 + 200 * S, predicate='host="b"', table="m")
        c.wait_applied(db, tok, timeout_s=60)
        assert c.query(db, q).to_pylist() == want
        servers[0].kill()
        servers.append(ServerProcess(data_dir).wait_ready())
        c = servers[-1].client
        c.wait_applied(db, tok, timeout_s=120)
        assert c.query(db, q).to_pylist() == want
        assert c.query(db, f"SELECT v FROM m WHERE time_ns = {T0 + 10 * S}").to_pylist() == [{"v": 999}]
        assert servers[-1].terminate() == 0, servers[-1].tail()
        servers.append(ServerProcess(data_dir).wait_ready())
        c = servers[-1].client
        c.wait_caught_up(db, 120)
        assert c.query(db, q).to_pylist() == want
    finally:
        for s in servers:
            s.kill()


def test_a_committed_request_whose_rows_are_not_persisted_survives_a_restart(data_dir):
    """A request of two tables is a transaction: its parts are applied at the offset of its commit
    decision, later than the parts themselves. Persisting one table records a replay start for the
    other's unpersisted rows; it must let replay read their part again, not start at the decision
    (which would leave the request without its parts: its rows lost)."""
    db = f"tx_{uuid.uuid4().hex[:8]}"
    s1 = ServerProcess(data_dir).wait_ready()
    servers = [s1]
    try:
        c = s1.client  # m and n live on Kafka partition 0 of 2
        tok = c.write(db, f"m,host=a v=1i {T0}\nn,host=a v=2i {T0}")
        c.wait_applied(db, tok, timeout_s=60)
        assert [p["table"] for p in c.persist(db, table="m")["persisted"]] == ["m"]
        s1.kill()
        s2 = ServerProcess(data_dir).wait_ready()
        servers.append(s2)
        s2.client.wait_caught_up(db, 120)
        assert s2.client.query(db, "SELECT host, v FROM n").to_pylist() == [{"host": "a", "v": 2}]
        assert s2.client.query(db, "SELECT host, v FROM m").to_pylist() == [{"host": "a", "v": 1}]
    finally:
        for s in servers:
            s.kill()


def test_the_lifecycle_acting_on_a_half_applied_batch_loses_nothing(data_dir):
    """The lifecycle acts while a micro-batch is half applied: its chunks (and their persistence
    windows) are in the catalog, its transaction state and applied offsets not yet. The policy
    persists (row threshold) within that time, twice:
    - a delete and a later write of the row it deletes, in flight together: the persist merges
      the new row with the deleted one, and must apply the delete first (the deleted field does
      not come back, before or after a restart);
    - a two-table request (a transaction): the persist of one table must leave replay able to
      read the request's parts again, since the other table's rows are in no Parquet file.
      The persisted table (net) is the one on the request's coordinator partition: its part is
      applied at the decision, so its chunk is in the batch the gate holds whatever the timing.
      (cpu's part is applied at its marker, produced after the decision was acknowledged: a
      batch that read the decision but not yet the marker holds net's chunk only, and the
      marker waits behind the gate.)
    A batch that adds chunks is held half applied for as long as the test's gate file exists
    (`IOX_DELAY_GATE`), i.e. until the test saw the persist and the offsets not yet applied.
    The server is killed once everything is applied, and the restart answers the same."""
    from iox_spark.catalog.crash_points import DELAY_ENV, DELAY_GATE_ENV
    from iox_spark.catalog.sharding import partition_for
    from tests.waiting import wait_for

    # net is on the coordinator partition (the highest one the request touches)
    assert partition_for("cpu", 2) < partition_for("net", 2)
    db, S = f"ha_{uuid.uuid4().hex[:8]}", 1_000_000_000
    gate = os.path.join(data_dir, "half-applied-gate")
    policy = ["--persist-row-threshold", "3", "--late-arrive-window-s", "1", "--persist-age-threshold-s", "3600",
              "--worker-backoff-ms", "200"]
    s1 = ServerProcess(data_dir, extra=policy,
                       env={DELAY_ENV: "batch_chunks_added=0", DELAY_GATE_ENV: gate}).wait_ready()
    servers = [s1]
    c = s1.client

    def persisted_while_applying(table: str, write) -> None:
        """Runs `write` (it returns its token) with the gate closed, waits for the policy to
        persist `table`, checks that the batch is still half applied, then opens the gate."""
        def has_files():
            return any(p.get("files") for d in c.status(db).get("databases", []) for t in d.get("tables", [])
                       if t["name"] == table for p in t.get("partitions", []))

        with open(gate, "w"):
            pass
        try:
            tok = write()
            wait_for(has_files, 120, f"the policy to persist {table}")
            applied = c.applied(db)
            assert any(applied.get(kp, -1) < off for kp, off in tok.items()), \
                f"{table} was persisted only once the batch was applied ({applied} >= {tok}): the test shows nothing"
        finally:
            os.remove(gate)
        c.wait_applied(db, tok, timeout_s=60)

    m = "SELECT host, v, w FROM m ORDER BY host"
    m_want = [{"host": "a", "v": None, "w": 2}, {"host": "b", "v": None, "w": 3}]
    try:
        c.wait_applied(db, c.write(db, f"m,host=a v=1i {T0}"), timeout_s=60)

        def delete_and_write():
            c.delete(db, T0, T0 + S, predicate='host="a"', table="m")
            return c.write(db, f"m,host=a w=2i {T0}\nm,host=b w=3i {T0}")

        persisted_while_applying("m", delete_and_write)
        assert c.query(db, m).to_pylist() == m_want

        persisted_while_applying("net", lambda: c.write(db, "\n".join(
            [f"net,src=w id={i}i {T0 + i}" for i in range(3)] + [f"cpu,src=w id=3i {T0}"])))
        assert _ids(c, db, "net") == [0, 1, 2] and _ids(c, db, "cpu") == [3]
        s1.kill()
        s2 = ServerProcess(data_dir, extra=policy).wait_ready()
        servers.append(s2)
        s2.client.wait_caught_up(db, 120)
        assert _ids(s2.client, db, "net") == [0, 1, 2]
        assert _ids(s2.client, db, "cpu") == [3]
        assert s2.client.query(db, m).to_pylist() == m_want
    finally:
        for s in servers:
            s.kill()


def test_a_lost_in_memory_broker_is_found_at_start_from_the_first_write_on(data_dir):
    """Nothing persisted yet, the server and its in-memory broker SIGKILLed: the next server
    refuses to start (the database and its topic were recorded at its first write), naming
    --skip-lost-writes; with it, it starts and lists the accepted loss."""
    db = f"lw_{uuid.uuid4().hex[:8]}"
    memory = ["--broker-storage", "memory"]
    s1 = ServerProcess(data_dir, extra=memory).wait_ready()
    servers = [s1]
    try:
        s1.client.wait_applied(db, s1.client.write(db, f"m v=1i {T0}"), timeout_s=60)
        s1.kill()
        stop_embedded_broker(data_dir)
        s2 = ServerProcess(data_dir, extra=memory)
        servers.append(s2)
        assert s2.wait_exit(180) not in (None, 0), s2.tail()
        assert "no longer holds offsets" in s2.tail(20_000) and "--skip-lost-writes" in s2.tail(20_000)
        s3 = ServerProcess(data_dir, extra=memory + ["--skip-lost-writes"]).wait_ready()
        servers.append(s3)
        st = s3.client.status(db)["databases"][0]
        assert st["lost_writes"] and all(r["accepted"] for r in st["lost_writes"])
        s3.client.wait_applied(db, s3.client.write(db, f"m v=2i {T0 + 1}"), timeout_s=60)
        assert s3.client.query(db, "SELECT v FROM m").to_pylist() == [{"v": 2}]
    finally:
        for s in servers:
            s.kill()
