"""An ingester pool of two real servers on one broker and one S3 object store (moto): each applies and
persists only the Kafka partitions claimed for it, reads what the other persisted, and a claim of
one member's partition by the other hands it over exactly (the new owner resumes where the old
one's checkpoint ends; the old owner's later commits touching it are refused), and queries
through either member during handoffs answer every acknowledged write or UNAVAILABLE. Two members
racing conflicting types of one new column agree on one: the other is refused, nothing reads NULL."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import threading
import time
import uuid

import boto3
import grpc
import pyarrow as pa
import pytest

from iox_spark.catalog.errors import PartitionsNotOwned
from iox_spark.catalog.preserved_catalog import AddParquet
from iox_spark.catalog.sharding import partition_for
from iox_spark.server.runtime.broker import free_port, start_broker
from tests.conftest import make_config, start_server
from tests.iceberg_tables import server_table
from tests.crash.harness import IOX
from tests.integration.s3_fixture import moto_s3  # noqa: F401  (fixture)
from tests.waiting import wait_for
from tests.timestamps import T0, US
from tests.rows import table_values_and_times

PARTITIONS = 4
TABLES = {kp: next(f"m{i}" for i in range(1000) if partition_for(f"m{i}", PARTITIONS) == kp) for kp in range(PARTITIONS)}


def _write(client, db: str, written: dict, table: str, n: int) -> dict:
    start = len(written.setdefault(table, []))
    lines = [f"{table},host=h v={start + i} {T0 + (start + i) * US}" for i in range(n)]
    written[table].extend((float(start + i), T0 + (start + i) * US) for i in range(n))
    return client.write(db, "\n".join(lines))


def _names(client) -> set:
    return {d["name"] for d in client.status()["databases"]}


def _applied(client, db: str, kp: int) -> int:
    return client.applied(db).get(kp, -1)


@pytest.fixture
def s3_store(moto_s3, monkeypatch):  # noqa: F811
    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    bucket = f"pool-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1").create_bucket(Bucket=bucket)
    return {"object_store": f"s3://{bucket}/prefix", "s3_endpoint": moto_s3}


def test_two_members_split_the_partitions_and_hand_one_over(own_broker, session_tmp, s3_store):
    # a broker of its own: on the session's, both members' streams would read every topic the
    # session's earlier tests left there
    broker = own_broker
    db = f"pool_{uuid.uuid4().hex[:8]}"
    root = os.path.join(session_tmp, f"pool-{uuid.uuid4().hex[:6]}")
    # no persist unless asked; the fence probe reads the others' commits every 2 s
    # one Iceberg catalog for the pool (on S3 the default, a SQLite file per member, is refused)
    base = make_config(root + "-a", broker.bootstrap, http_port=0, **s3_store,
                       pool_member="ingester-a", iceberg_catalog=f"sqlite:///{root}-iceberg.db",
                       lifecycle={"worker_backoff_ms": 200, "persist_row_threshold": 10_000_000,
                                  "persist_age_threshold_s": 3600.0, "late_arrive_window_s": 3600.0})
    a, ca = start_server(base)
    b, cb = start_server(dataclasses.replace(base, data_dir=root + "-b", pool_member="ingester-b", grpc_port=0))
    try:
        got = ca.claim_partitions(db, [0, 1])
        assert [(c["partition"], c["epoch"]) for c in got["claimed"]] == [(0, 1), (1, 1)]
        got = cb.claim_partitions(db, [2, 3])
        assert [(c["partition"], c["epoch"]) for c in got["claimed"]] == [(2, 1), (3, 1)]

        written: dict = {}
        tokens = {kp: _write(ca, db, written, TABLES[kp], 3) for kp in range(PARTITIONS)}  # all through a
        for kp, owner in ((0, ca), (1, ca), (2, cb), (3, cb)):
            wait_for(lambda: _applied(owner, db, kp) >= tokens[kp][kp], 60, f"partition {kp} applied by its owner")
        # a non-owner applies nothing of a partition
        assert _applied(ca, db, 2) == -1 and _applied(cb, db, 0) == -1
        # scatter-gather: a query through a reads b's unpersisted rows of the tables b owns, and the
        # other way round
        for client in (ca, cb):
            for kp in range(PARTITIONS):
                assert table_values_and_times(client, db, TABLES[kp]) == written[TABLES[kp]]
        # read-your-writes through a member that does not own the partition: its owner waits
        resp = ca.write_response(db, f"{TABLES[3]},host=h v=99 {T0 + 99 * US}")
        written[TABLES[3]].append((99.0, T0 + 99 * US))
        assert table_values_and_times(ca, db, TABLES[3], after=resp.token_text, timeout_s=60) == written[TABLES[3]]
        # a delete through a of rows b holds unpersisted: applied by b, seen through a
        deleted = written[TABLES[3]].pop(0)
        dtok = ca.delete_response(db, deleted[1], deleted[1] + 1, "", TABLES[3]).token_text
        assert table_values_and_times(ca, db, TABLES[3], after=dtok, timeout_s=60) == written[TABLES[3]]

        # a database no member claimed yet: b reads its new topic and applies nothing of it (a new
        # topic is found when the source next lists the topics, in no order with the other topics'
        # messages: waited for as such)
        other = db + "_x"
        _write(ca, other, {}, TABLES[2], 2)
        later = _write(ca, db, written, TABLES[2], 1)
        wait_for(lambda: _applied(cb, db, 2) >= later[2], 60, "b to apply a later write")
        wait_for(lambda: other in _names(cb), 60, "b to read the new database's topic")
        assert set(cb.applied(other).values()) == {-1} and set(ca.applied(other).values()) == {-1}
        assert table_values_and_times(cb, other, TABLES[2]) == [] and table_values_and_times(ca, other, TABLES[2]) == []

        for client, others in ((ca, (2, 3)), (cb, (0, 1))):  # each persists its own, says it skipped the others'
            assert [(s["kafka_partition"], s["reason"]) for s in client.persist(db)["skipped"]] == [
                (kp, "not owned: another member of the pool applies and persists its writes") for kp in others]
        # each reads what the other persisted (an owner's answer names the catalog revision it
        # goes with, and the asking member reads the catalog that far first)
        for client in (ca, cb):
            for kp in range(PARTITIONS):
                assert table_values_and_times(client, db, TABLES[kp]) == written[TABLES[kp]], kp

        # rows of partition 1 a applied but did not persist: the new owner replays them
        t1 = _write(ca, db, written, TABLES[1], 2)
        wait_for(lambda: _applied(ca, db, 1) >= t1[1], 60, "a applies the new rows")
        got = cb.claim_partitions(db, [1])
        assert got["claimed"][0]["epoch"] == 2
        # b resumes right after what a persisted (its checkpoint), so it replays exactly the 2 rows
        assert got["claimed"][0]["resume_offset"] <= t1[1]
        wait_for(lambda: 1 not in ca.status(db)["databases"][0]["owned_partitions"], 60, "a to see the claim")
        # a's later commit touching the partition is refused
        pc = a.lifecycle.preserved[db]
        with pytest.raises(PartitionsNotOwned):
            pc.commit([AddParquet(key=f"{db}/data/x.parquet", table=TABLES[1], partition_key="p", row_count=1,
                                  size_bytes=1, min_time_ns=0, max_time_ns=0, min_seq=0, max_seq=0,
                                  schema=[["v", "field", "float"], ["time", "time", "time"]])], 1e9)
        t2 = _write(ca, db, written, TABLES[1], 2)  # written through a, applied by b
        wait_for(lambda: _applied(cb, db, 1) >= t2[1], 60, "b applies partition 1")
        assert _applied(ca, db, 1) < t2[1]

        ca.persist(db)
        cb.persist(db)
        for client in (ca, cb):  # every acknowledged row, exactly once
            for kp in range(PARTITIONS):
                assert table_values_and_times(client, db, TABLES[kp]) == written[TABLES[kp]], kp
        # both members publish their tables to the pool's one Iceberg catalog: every acknowledged row,
        # once (b's snapshots of partition 1's table follow a's in the same Iceberg table)
        for kp in range(PARTITIONS):
            wait_for(lambda: _iceberg_values_and_times(b, db, TABLES[kp]) == sorted(written[TABLES[kp]]), 60,
                     f"the Iceberg table of {TABLES[kp]}")
        # the members' files and catalog are in S3
        bucket = s3_store["object_store"][len("s3://"):].split("/")[0]
        keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_store["s3_endpoint"], region_name="us-east-1")
                .list_objects_v2(Bucket=bucket, Prefix=f"prefix/{db}/").get("Contents", [])]
        assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".txn") for k in keys)
        sa = ca.status(db)["databases"][0]
        sb = cb.status(db)["databases"][0]
        assert sa["owned_partitions"] == [0] and sb["owned_partitions"] == [1, 2, 3]
        owners = {o["partition"]: (o["owner"], o["epoch"]) for o in sb["owners"]}
        assert owners == {0: ("ingester-a", 1), 1: ("ingester-b", 2), 2: ("ingester-b", 1), 3: ("ingester-b", 1)}

        _racing_column_types(db, ca, cb)
        _filtered_reads(db, ca, cb)
        _queries_during_handoffs(db, ca, cb, written[TABLES[1]])
        _two_assigners(db, ca, cb, [f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{b.grpc_port}"], s3_store, root)
    finally:
        for c in (ca, cb):
            c.close()
        a.stop()
        b.stop()


def _iceberg_values_and_times(server, db: str, table: str):
    """[(v, time in ns)] of the table's Iceberg table, sorted; None while it does not exist."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        tbl = server_table(server, db, table)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    return sorted((r["v"], r["time_ns"]) for r in tbl.scan(selected_fields=("v", "time_ns")).to_arrow().to_pylist())


def test_the_assigner_spreads_the_partitions_to_a_member_that_joins(session_tmp, s3_store):
    """A member that joins a pool whose one member owns every partition gets half of them from the
    assigner, one at a time and no faster than the rebalancing interval; every acknowledged row is
    read exactly once through either member, before and after, and then nothing moves."""
    from iox_spark.server.pool.assigner import Assigner

    own_broker = start_broker()  # a pool of its own: the module's broker belongs to another pool's object store
    db = f"pool_{uuid.uuid4().hex[:8]}"
    root = os.path.join(session_tmp, f"pool-{uuid.uuid4().hex[:6]}")
    port_b = free_port()
    base = make_config(root + "-a", own_broker.bootstrap, http_port=0, **s3_store, pool_member="ingester-a",
                       iceberg_catalog="off",
                       lifecycle={"worker_backoff_ms": 200, "persist_row_threshold": 10_000_000,
                                  "persist_age_threshold_s": 3600.0, "late_arrive_window_s": 3600.0})
    a = b = ca = cb = assigner = None
    try:
        a, ca = start_server(base)
        addresses = [f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{port_b}"]
        assigner = Assigner(addresses, root + "-assigner.json", interval_s=0.3, unreachable_after_s=3600.0,
                            rebalance_interval_s=1.0)
        written: dict = {}
        tokens = {kp: _write(ca, db, written, TABLES[kp], 3) for kp in range(PARTITIONS)}

        def owned_by_a_alone() -> bool:
            assigner.run_once()
            return _owned(ca, db) == list(range(PARTITIONS))
        wait_for(owned_by_a_alone, 60, "the only member to own every partition")
        for kp in range(PARTITIONS):
            wait_for(lambda: _applied(ca, db, kp) >= tokens[kp][kp], 60, f"partition {kp} applied")
        ca.persist(db)  # half the rows persisted, half in memory when the partitions move
        tokens = {kp: _write(ca, db, written, TABLES[kp], 2) for kp in range(PARTITIONS)}
        for kp in range(PARTITIONS):
            wait_for(lambda: _applied(ca, db, kp) >= tokens[kp][kp], 60, f"partition {kp} applied again")

        b, cb = start_server(dataclasses.replace(base, data_dir=root + "-b", pool_member="ingester-b",
                                                 grpc_port=port_b))
        moves = []

        def balanced() -> bool:
            now = time.time()  # the round's clock, as the assigner's rule reads it
            d = assigner.run_once(now)
            if d.rebalanced is not None:
                moves.append((now, d.rebalanced, d.moved[d.rebalanced]))
            return len(_owned(ca, db)) == 2 and len(_owned(cb, db)) == 2
        wait_for(balanced, 180, "the assigner to give half the partitions to the new member")
        assert [m[2] for m in moves] == [tuple(addresses)] * 2, moves
        assert moves[1][0] - moves[0][0] >= 1.0, moves
        assert sorted(_owned(ca, db) + _owned(cb, db)) == list(range(PARTITIONS))
        for client in (ca, cb):  # every acknowledged row exactly once, or UNAVAILABLE while a new owner replays
            for kp in range(PARTITIONS):
                wait_for(lambda: _whole_or_unavailable(client, db, TABLES[kp], written[TABLES[kp]]), 60,
                         f"partition {kp} answered through either member")
        tokens = {kp: _write(ca, db, written, TABLES[kp], 2) for kp in range(PARTITIONS)}
        for kp, owner in ((kp, ca if kp in _owned(ca, db) else cb) for kp in range(PARTITIONS)):
            wait_for(lambda: _applied(owner, db, kp) >= tokens[kp][kp], 60, f"partition {kp} applied by its owner")
        for client in (ca, cb):
            for kp in range(PARTITIONS):
                assert table_values_and_times(client, db, TABLES[kp]) == written[TABLES[kp]], kp
        later = time.monotonic() + 2.0
        while time.monotonic() < later:  # balanced: past the interval, nothing moves
            assert assigner.run_once().moved == {}
        # `iox status --pool` through either member: both members, what each owns, at which epoch
        for client in (ca, cb):
            members = {m["member"]: m for m in client.pool_status()["members"]}
            assert set(members) == {"ingester-a", "ingester-b"}
            for name, owner, epoch in (("ingester-a", ca, 1), ("ingester-b", cb, 2)):
                m = members[name]
                assert m["reachable"] and not m["frozen"] and m["address"] == addresses[name == "ingester-b"]
                [d] = [d for d in m["databases"] if d["name"] == db]
                assert [p["partition"] for p in d["partitions"]] == _owned(owner, db)
                for p in d["partitions"]:  # moved ones were claimed again (epoch 2)
                    assert p["epoch"] == epoch and p["applied_hi_inclusive"] >= tokens[p["partition"]][p["partition"]]
                    assert p["lag_messages"] >= 0
        out = subprocess.run([IOX, "status", "--pool", "--addr", addresses[1]], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert {m["member"] for m in json.loads(out.stdout)["members"]} == {"ingester-a", "ingester-b"}
        _status_through_the_assigner(assigner, db, addresses, {"ingester-a": _owned(ca, db),
                                                               "ingester-b": _owned(cb, db)})
    finally:
        if assigner is not None:
            assigner.close()
        for c in (ca, cb):
            if c is not None:
                c.close()
        for srv in (a, b):
            if srv is not None:
                srv.stop()
        own_broker.stop()


def _whole_or_unavailable(client, db: str, table: str, expected: list) -> bool:
    """Whether a query of `table` answered (then with exactly `expected`: never an incomplete
    answer), False when it answered UNAVAILABLE."""
    try:
        t = client.query(db, f"SELECT v, time FROM {table} ORDER BY time")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        return False
    got = list(zip(t.column("v").to_pylist(), t.column("time").cast(pa.timestamp("ns")).cast(pa.int64()).to_pylist()))
    assert got == expected, (table, got)
    return True


def _owned(client, db: str) -> list:
    return client.status(db)["databases"][0]["owned_partitions"]


def _racing_column_types(db: str, ca, cb, n: int = 5) -> None:
    """Integer writes of a new column through a and string writes of it through b, at once: one
    type wins pool-wide, every write of the other is refused whole, no acknowledged value is NULL."""
    start, results = threading.Barrier(2), {}

    def writes(client, name, value):
        start.wait()
        for i in range(n):
            try:
                tok = client.write(db, f"race,host={name} c={value(i)} {T0 + (i * 2 + (name == 'b')) * US}")
                results[(name, i)] = tok
            except grpc.RpcError as e:
                results[(name, i)] = e

    threads = [threading.Thread(target=writes, args=(ca, "a", lambda i: f"{i}i")),
               threading.Thread(target=writes, args=(cb, "b", lambda i: f'"s{i}"'))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    acked = {k for k, r in results.items() if not isinstance(r, grpc.RpcError)}
    assert len(results) == 2 * n and len({name for name, _i in acked}) == 1, results
    winner = next(iter(acked))[0]
    for (name, _i), r in results.items():
        if name != winner:
            assert r.code() == grpc.StatusCode.INVALID_ARGUMENT and "'c'" in r.details(), r
    assert len(acked) == n
    expected = sorted(i if winner == "a" else f"s{i}" for i in range(n))
    for client in (ca, cb):  # without a token: a query holds what was acknowledged before it
        got = client.query(db, "SELECT c FROM race").column("c").to_pylist()
        assert len(got) == n and None not in got and sorted(got) == expected, got


def _owners(client, db: str) -> dict:
    return {o["partition"]: (o["owner"], o["epoch"]) for o in client.status(db)["databases"][0]["owners"]}


def _two_assigners(db: str, ca, cb, addresses: list, s3_store: dict, root: str) -> None:
    """Two `iox assigner` processes on the pool's object store: one holds the lease and acts, the
    other stands by; the active one killed, the standby takes over from what the members own (no
    claim flips back), then acts (the partitions of a frozen member handed over)."""
    wait_for(lambda: set(_owners(cb, db)) == set(range(PARTITIONS)), 60, "every partition owned")
    before = _owners(cb, db)
    procs, logs = [], []
    try:
        for name in ("one", "two"):
            logs.append(f"{root}-assigner-{name}.log")
            procs.append(subprocess.Popen(
                [IOX, "assigner", "--ingesters", ",".join(addresses), "--state-file", f"{root}-assigner-{name}.json",
                 "--interval-s", "0.3", "--lease-s", "4", "--unreachable-after-s", "60", "--no-rebalance",
                 "--object-store", s3_store["object_store"], "--s3-endpoint", s3_store["s3_endpoint"]],
                stdout=open(logs[-1], "wb"), stderr=subprocess.STDOUT))

        def log_of(i: int) -> str:
            return open(logs[i], errors="replace").read()

        def roles():
            """(active, standby, term): the assigner whose newest term taken is the newest of both
            and not lost since, and the other standing by after whatever it held (on a loaded host a
            holder's renewal may come late and the lease change hands before the kill: the test
            follows the holder of the moment)."""
            held = []
            for i in (0, 1):
                text = log_of(i)
                taken = [(m.start(), int(m.group(1))) for m in re.finditer(r"assigner lease term (\d+) taken", text)]
                lost = [m.start() for m in re.finditer(r"assigner lease term \d+ lost", text)]
                standby = [m.start() for m in re.finditer(r"standby: the assigner lease is held by", text)]
                last_taken = taken[-1] if taken else (-1, 0)
                holding = bool(taken) and not any(at > last_taken[0] for at in lost)
                waiting = bool(standby) and standby[-1] > max([last_taken[0]] + lost)
                held.append((holding, waiting, last_taken[1]))
            for i, j in ((0, 1), (1, 0)):
                if held[i][0] and held[j][1] and held[i][2] > held[j][2]:
                    return i, j, held[i][2]
            return None

        active, standby, term = wait_for(roles, 60, "one assigner holding the lease, the other standing by")
        assert _owners(cb, db) == before  # the first holder started from what the members own
        procs[active].kill()
        procs[active].wait(10)
        wait_for(lambda: f"assigner lease term {term + 1} taken" in log_of(standby), 30,
                 "the standby to take the lease")
        assert procs[standby].poll() is None, log_of(standby)
        assert _owners(cb, db) == before, log_of(standby)  # nothing flipped at the takeover
        assert ca.freeze("assigner lease test")["frozen"]  # the new holder acts: a's partitions go to b
        wait_for(lambda: cb.status(db)["databases"][0]["owned_partitions"] == list(range(PARTITIONS)), 60,
                 "the frozen member's partitions handed over by the new holder")
        assert "handoff:" in log_of(standby) and "handoff:" not in log_of(active)
    except (AssertionError, TimeoutError) as e:  # what each assigner did, with the failure
        raise AssertionError(f"{e}\nowners before: {before}\n" + "\n".join(
            f"--- {path}:\n{open(path, errors='replace').read()[-4000:]}" for path in logs)) from e
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        ca.unfreeze()


def _status_through_the_assigner(assigner, db: str, addresses: list, owned: dict) -> None:
    """`iox status --assigner`: the pool as the assigner's last round saw it, over its status
    endpoint (with its token): both members, what each owns, the two rebalancing moves."""
    from iox_spark.server.pool.assigner_status import AssignerStatusServer

    assigner.run_once()
    status = AssignerStatusServer(assigner, "127.0.0.1", 0, token="assigner-token").start()
    try:
        addr = f"127.0.0.1:{status.port}"
        out = subprocess.run([IOX, "status", "--assigner", addr, "--token", "assigner-token"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        st = json.loads(out.stdout)
        assert st["role"] == "alone" and st["rounds"] >= 3
        members = {m["member"]: m for m in st["members"]}
        for name, parts in owned.items():
            [d] = [d for d in members[name]["databases"] if d["name"] == db]
            assert [p["partition"] for p in d["partitions"]] == parts and members[name]["reachable"]
        assert sorted((x["partition"], x["address"]) for x in st["assignments"] if x["database"] == db) == \
            sorted((kp, addresses[name == "ingester-b"]) for name, parts in owned.items() for kp in parts)
        assert [(m["from"], m["to"], m["why"]) for m in st["moves"]] == [(addresses[0], addresses[1], "rebalance")] * 2
        refused = subprocess.run([IOX, "status", "--assigner", addr], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "answered 401" in refused.stderr, refused.stderr
    finally:
        status.stop()


def _filtered_reads(db: str, ca, cb) -> None:
    """b owns partition 3: a query through a sends b what it reads of the table (its tags' and time's
    conditions, the fields it names), b answers only those rows and fields, under --max-query-bytes,
    and the answer through a is exact."""
    from iox_spark.iox import query_pb2

    table = next(f"f{i}" for i in range(1000) if partition_for(f"f{i}", PARTITIONS) == 3)
    lines = [f"{table},host={'g' if i % 2 else 'k'} v={i},w={i * 10}i {T0 + i * US}" for i in range(20)]
    tok = ca.write(db, "\n".join(lines))
    rows = ca.query(db, f"SELECT host, v, time FROM {table} WHERE host = 'g' AND time >= TIMESTAMP "
                        f"'2023-11-14 22:13:20.000005' ORDER BY time", timeout_s=60)
    assert rows.column("v").to_pylist() == [float(i) for i in range(5, 20, 2)]
    assert set(rows.column("host").to_pylist()) == {"g"}
    n = ca.query(db, f"SELECT count(*) AS n, sum(w) AS sw FROM {table} WHERE v >= 3 AND host = 'k'", timeout_s=60)
    assert (n.column("n").to_pylist(), n.column("sw").to_pylist()) == ([8], [sum(i * 10 for i in range(4, 20, 2))])
    # what b sends for such a read: the rows of host g, the field w and no other
    req = query_pb2.UnpersistedRowsRequest(database=db, tables=[table], wait_applied={3: tok[3]}, reads=[
        query_pb2.TableRead(table=table, where_sql="`host` = 'g'", prune_fields=True, fields=["w"])])
    got = [m for m in cb.query_stub.UnpersistedRows(req, timeout=60) if m.table == table]
    sent = pa.concat_tables([pa.ipc.open_stream(pa.py_buffer(m.arrow_ipc)).read_all() for m in got if m.arrow_ipc])
    assert sorted(sent.column("w").to_pylist()) == [i * 10 for i in range(1, 20, 2)]
    assert "v" not in sent.column_names and set(sent.column("host").to_pylist()) == {"g"}
    # an answer past the asker's byte bound is refused, not sent
    req.max_bytes = 10
    with pytest.raises(grpc.RpcError) as e:
        list(cb.query_stub.UnpersistedRows(req, timeout=60))
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-query-bytes" in e.value.details()


def _queries_during_handoffs(db: str, ca, cb, before: list, handoffs: int = 3) -> None:
    """Partition 1 (b owns it) handed to the other member `handoffs` times while writes go through
    both members and queries without a token through both: each answer holds every write
    acknowledged before the query started, once, or is UNAVAILABLE (or past its deadline); never an
    answer missing one."""
    table, kp = TABLES[1], 1
    sql = f"SELECT v, time FROM {table}"
    acked, unknown, failures, answers = list(before), [], [], {"complete": 0, "unavailable": 0}
    lock, stop = threading.Lock(), threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            v = 1000 + i
            try:
                (ca, cb)[i % 2].write(db, f"{table},host=h v={v} {T0 + v * US}")
            except grpc.RpcError:
                unknown.append((float(v), T0 + v * US))
            else:
                with lock:
                    acked.append((float(v), T0 + v * US))
            i += 1

    def querier(client):
        while not stop.is_set():
            with lock:
                expected = set(acked)
            try:
                t = client.query(db, sql, timeout_s=60)
            except grpc.RpcError as e:  # marked: no answer (a loaded host may also pass the deadline)
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    failures.append(f"{e.code().name}: {e.details()}")
                with lock:
                    answers["unavailable"] += 1
                continue
            rows = list(zip(t.column("v").to_pylist(),
                            t.column("time").cast(pa.timestamp("ns")).cast(pa.int64()).to_pylist()))
            if len(rows) != len(set(rows)) or not expected <= set(rows):
                failures.append(f"an answer missed {sorted(expected - set(rows))[:5]} or repeated a row")
            with lock:
                answers["complete"] += 1

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=querier, args=(c,)) for c in (ca, cb)]
    for th in threads:
        th.start()
    try:
        owner, other, names = cb, ca, {ca: "ingester-a", cb: "ingester-b"}
        for _ in range(handoffs):
            with lock:
                seen = sum(answers.values())
            other.claim_partitions(db, [kp])
            wait_for(lambda: kp not in owner.status(db)["databases"][0]["owned_partitions"], 60,
                     f"{names[owner]} to see the claim")
            # a few queries through each member after the old owner let go (answered or refused)
            wait_for(lambda: sum(answers.values()) >= seen + 4 or failures, 120, "queries after the handoff")
            owner, other = other, owner
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert not failures, failures[:5]
    assert answers["complete"] >= 2 * handoffs, answers
    for client in (ca, cb):  # once it settled: every acknowledged row, exactly once
        rows = table_values_and_times(client, db, table)
        assert len(rows) == len(set(rows)) and set(acked) <= set(rows) <= set(acked) | set(unknown)


def test_a_server_outside_a_pool_refuses_a_claim(client, db):
    with pytest.raises(grpc.RpcError) as info:
        client.claim_partitions(db, [0])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not a member of an ingester pool" in info.value.details()
