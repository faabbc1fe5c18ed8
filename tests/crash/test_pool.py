"""An ingester pool under an assigner, with real processes: three ingesters (two in this process,
one its own process) on one broker (the module's own) and one object store. Writes go through every member; one is
frozen mid-stream and its partitions are handed over; another is killed with SIGKILL and the
assigner hands its partitions over once it stayed unreachable; the frozen one's later commit to a
partition it lost is refused. Afterwards every acknowledged write is answered exactly once through
each live member (the owners' unpersisted rows gathered from them), and a plain Spark session
reads the same rows with the `iox` data source."""
from __future__ import annotations

import dataclasses
import os
import uuid

import grpc
import pyarrow as pa
import pytest

from iox_spark.catalog.errors import PartitionsNotOwned
from iox_spark.catalog.preserved_catalog import RecordPartitionCheckpoint
from iox_spark.catalog.sharding import partition_for
from iox_spark.server.pool.assigner import Assigner
from tests.conftest import make_config, start_server
from tests.crash.harness import ServerProcess
from tests.waiting import wait_for
from tests.timestamps import T0, US
from tests.rows import table_values_and_times

PARTITIONS = 4
TABLES = {kp: next(f"w{i}" for i in range(1000) if partition_for(f"w{i}", PARTITIONS) == kp) for kp in range(PARTITIONS)}


class _Writes:
    """Acknowledged writes per table: (v, time) pairs; each write one point per table."""

    def __init__(self, db: str):
        self.db = db
        self.rows: dict = {t: [] for t in TABLES.values()}
        self.n = 0

    def write_all(self, client) -> dict:
        """One point to every table through `client`; returns the write token."""
        i = self.n
        self.n += 1
        lines = [f"{t},src=x v={i} {T0 + i * US}" for t in TABLES.values()]
        token = client.write(self.db, "\n".join(lines))
        for t in TABLES.values():
            self.rows[t].append((float(i), T0 + i * US))
        return token


def _source_rows(spark, store: str, db: str, table: str, **options) -> list:
    r = spark.read.format("iox").option("object_store", store).option("database", db).option("table", table)
    for k, v in options.items():
        r = r.option(k, v)
    got = r.load().toArrow()
    return sorted(zip(got.column("v").to_pylist(),
                      got.column("time").cast(pa.timestamp("ns")).cast(pa.int64()).to_pylist()))


def _owned(client, db: str) -> set:
    dbs = client.status(db)["databases"]
    return set(dbs[0]["owned_partitions"]) if dbs else set()


def _round_until(assigner, cond, timeout_s: float, what: str):
    def step():
        assigner.run_once()
        return cond()
    return wait_for(step, timeout_s, what, poll_s=0.5)


def test_three_ingesters_an_assigner_a_freeze_and_a_kill(own_broker, session_tmp, spark_session_for_pool):
    # a broker of its own: on the session's, every member would claim, replay and hand over every
    # database the session's earlier tests left there
    broker = own_broker
    db = f"pl_{uuid.uuid4().hex[:8]}"
    root = os.path.join(session_tmp, f"pool3-{uuid.uuid4().hex[:6]}")
    store = root + "-objects"
    lifecycle = {"worker_backoff_ms": 200, "persist_row_threshold": 10_000_000, "persist_age_threshold_s": 3600.0,
                 "late_arrive_window_s": 3600.0}
    cfg_a = make_config(root + "-a", broker.bootstrap, http_port=0, object_store=store, pool_member="a",
                        lifecycle=lifecycle)
    a, ca = start_server(cfg_a)
    b, cb = start_server(dataclasses.replace(cfg_a, data_dir=root + "-b", pool_member="b", grpc_port=0))
    c = ServerProcess(root + "-c", extra=["--kafka-bootstrap", broker.bootstrap, "--partitions", str(PARTITIONS),
                                          "--object-store", store, "--pool-member", "c", "--role", "ingester",
                                          "--persist-row-threshold", "10000000",
                                          "--persist-age-threshold-s", "3600", "--late-arrive-window-s", "3600"])
    addr = {"a": f"127.0.0.1:{a.grpc_port}", "b": f"127.0.0.1:{b.grpc_port}"}
    assigner = None
    try:
        c.wait_ready()
        addr["c"] = f"127.0.0.1:{c.port}"
        w = _Writes(db)
        w.write_all(ca)  # creates the database
        assigner = Assigner([addr["a"], addr["b"], addr["c"]], os.path.join(root + "-a", "assigner.json"),
                            interval_s=0.5, unreachable_after_s=3.0, rebalance=False)  # handoffs only here
        clients = {"a": ca, "b": cb, "c": c.client}
        # fewest first, in pool order: a gets 0 and 3, b 1, c 2
        _round_until(assigner, lambda: [_owned(clients[m], db) for m in "abc"] == [{0, 3}, {1}, {2}], 60,
                     "every partition claimed")
        # nothing moves without cause
        assert [c for c in assigner.run_once().claims if c.database == db] == []
        with pytest.raises(grpc.RpcError) as info:  # c's role is ingester: no user queries
            c.client.query(db, f"SELECT * FROM {TABLES[2]}")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "role is ingester" in info.value.details()

        for client in (ca, cb, c.client, ca, cb, c.client):  # writes spread over the pool
            w.write_all(client)

        # freeze a mid-stream: its partitions go to the two others
        assert ca.freeze("test")["frozen"]
        _round_until(assigner, lambda: _owned(ca, db) == set() and _owned(cb, db) | _owned(c.client, db) == {0, 1, 2, 3},
                     60, "a's partitions handed over")
        # a, frozen, keeps answering and still takes writes (they go to Kafka for the owners)
        for client in (ca, cb, c.client):
            w.write_all(client)

        # kill c: once unreachable past the grace its partitions go to b (a is frozen)
        c_owned = _owned(c.client, db)
        c.kill()
        # while c is down and still owns its partitions: a query of one of its tables is
        # UNAVAILABLE (never an answer without c's unpersisted rows); one naming no table answers
        with pytest.raises(grpc.RpcError) as ei:
            ca.query(db, f"SELECT count(*) FROM {TABLES[min(c_owned)]}", timeout_s=30)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        assert ca.query(db, "SELECT 1 AS one").column("one").to_pylist() == [1]
        _round_until(assigner, lambda: _owned(cb, db) == {0, 1, 2, 3}, 90, "c's partitions handed over to b")
        for client in (ca, cb):
            w.write_all(client)

        # the frozen old owner's commit to a partition it lost is refused
        with pytest.raises(PartitionsNotOwned):
            a.lifecycle.preserved[db].commit(
                [RecordPartitionCheckpoint(table=TABLES[0], partition_key="p", flush_timestamp_ns=0)], 1e9)

        # every acknowledged write, exactly once, through a and b at once (no token, no waiting):
        # what the owners persisted and what b holds unpersisted (asked for by a), with b's replays
        # of the handed-over partitions
        w.write_all(cb)
        for client in (ca, cb):
            for t in TABLES.values():
                assert table_values_and_times(client, db, t) == w.rows[t], t
        assert c_owned  # c owned something when it was killed

        # a plain Spark session reads the same rows, the owner's unpersisted ones included
        spark = spark_session_for_pool
        for t in TABLES.values():
            assert _source_rows(spark, store, db, t, unpersisted="true") == sorted(w.rows[t])

        # persisted, the same rows again (the data source below reads the files)
        cb.persist(db)
        for client in (ca, cb):
            for t in TABLES.values():
                assert table_values_and_times(client, db, t) == w.rows[t]

        # and from the files alone once everything is persisted
        for t in TABLES.values():
            assert _source_rows(spark, store, db, t) == sorted(w.rows[t])
    finally:
        if assigner is not None:
            assigner.close()
        c.kill()
        for client in (ca, cb):
            client.close()
        a.stop()
        b.stop()


@pytest.fixture
def spark_session_for_pool(iox_server):
    """A plain Spark session of the test process (the one the in-process servers share): `iox` is
    found by Spark's data source lookup (pyspark_iox), nothing registered by hand."""
    return iox_server.spark.newSession()
