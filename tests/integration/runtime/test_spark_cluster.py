"""The server on a real Spark standalone cluster with S3: `iox serve --spark-master spark://...`.

A master and a worker run in JVMs of their own (tests/integration/spark_cluster_fixture.py),
the worker's executor is a separate JVM, the object store is a real S3 protocol server
(moto_server) that the executors read and write directly, the write buffer is a broker of the
module's own. The server runs as a process of its own (this test process already holds a local
SparkSession; a second one against another master cannot live beside it) and is reached over
gRPC. The scenarios build on each other in file order: writes, queries and deletes; a persist
(Parquet in S3, none on the driver's disk); compaction of persisted files; the executor
SIGKILLed while writes go on (every acknowledged write queryable exactly once afterwards, and
a persist succeeds); a SIGKILL and restart of the server.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid

import boto3
import pytest

from tests.crash.harness import ServerProcess, Writer
from tests.integration.s3_fixture import MOTO_ACCESS_KEY_ID, MOTO_REGION, MOTO_SECRET_ACCESS_KEY, moto_s3  # noqa: F401
from tests.integration.spark_cluster_fixture import spark_cluster  # noqa: F401
from tests.waiting import wait_for

#: points per write request: payloads past the size of a driver-side (local) chunk, so the
#: chunks are built and held by Spark jobs (chunk_store/local_rows.py)
BIG = 2000
#: a few small writes too: those make driver-side chunks
SMALL = 20
PREFIX = "iox"


def _s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name=MOTO_REGION, aws_access_key_id=MOTO_ACCESS_KEY_ID,
                        aws_secret_access_key=MOTO_SECRET_ACCESS_KEY)


class _Env:
    """What the scenarios share: the cluster, the bucket, the server, the writers."""

    def __init__(self, cluster, endpoint, bootstrap):
        self.cluster, self.endpoint, self.bootstrap = cluster, endpoint, bootstrap
        self.bucket = f"cluster-{uuid.uuid4().hex[:12]}"
        _s3(endpoint).create_bucket(Bucket=self.bucket)
        self.data_dir = tempfile.mkdtemp(prefix="iox-cluster-server-")
        self.writers: dict = {}
        self.deleted: dict = {}  # db -> ids deleted
        self.server = None

    def start_server(self) -> ServerProcess:
        self.server = ServerProcess(
            self.data_dir,
            extra=["--kafka-bootstrap", self.bootstrap, "--spark-master", self.cluster.master_url,
                   "--object-store", f"s3://{self.bucket}/{PREFIX}", "--s3-endpoint", self.endpoint,
                   "--spark-nice", "0"],
            env={"AWS_ACCESS_KEY_ID": MOTO_ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": MOTO_SECRET_ACCESS_KEY,
                 "AWS_REGION": MOTO_REGION, "SPARK_LOCAL_IP": "127.0.0.1"}).wait_ready()
        return self.server

    def writer(self, name: str) -> Writer:
        if name not in self.writers:
            self.writers[name] = Writer(f"cluster_{name}_{uuid.uuid4().hex[:8]}")
        return self.writers[name]

    def s3_keys(self, db: str) -> list:
        resp = _s3(self.endpoint).list_objects_v2(Bucket=self.bucket, Prefix=f"{PREFIX}/{db}/data/")
        return sorted(o["Key"] for o in resp.get("Contents", ()))

    def parquet_on_driver(self) -> list:
        return [os.path.join(d, f) for d, _dirs, files in os.walk(self.data_dir) for f in files
                if f.endswith(".parquet")]

    def ids(self, db: str) -> list:
        return [r["id"] for r in self.server.client.query(db, "SELECT id FROM crash").to_pylist()]

    def expect_exactly(self, w: Writer) -> None:
        """Every acknowledged write of `w` not deleted is queryable exactly once, nothing else is."""
        deleted = self.deleted.get(w.db, set())
        if deleted:  # a query without a write token may be read before the last writes are visible
            wait_for(lambda: (w.acked - deleted) <= set(self.ids(w.db)), 120, "the acknowledged writes to be visible")
        ids = w.check(self.server.client, timeout_s=120) if not deleted else self.ids(w.db)
        assert len(ids) == len(set(ids)), f"duplicates: {len(ids) - len(set(ids))}"
        assert not (set(ids) & deleted), "deleted rows are back"
        assert (w.acked - deleted) <= set(ids) <= (w.acked | w.unacked) - deleted


@pytest.fixture(scope="module")
def env(spark_cluster, moto_s3, own_broker):  # noqa: F811
    e = _Env(spark_cluster, moto_s3, own_broker.bootstrap)
    e.start_server()
    try:
        yield e
    finally:
        if e.server is not None and e.server.proc.poll() is None:
            e.server.terminate(60)
        shutil.rmtree(e.data_dir, ignore_errors=True)


def _partition(client, db: str) -> dict:
    (d,) = client.status(db)["databases"]
    (t,) = [t for t in d["tables"] if t["name"] == "crash"]
    (p,) = t["partitions"]
    return p


def test_writes_queries_and_deletes(env):
    # the start checked that the executor runs the server's code
    assert f"executors of Spark master {env.cluster.master_url} run the server's code" in env.server.tail(1_000_000)
    w = env.writer("basic")
    c = env.server.client
    for n in (BIG, SMALL, BIG, SMALL, BIG):
        assert w.write_batch(c, n)
    env.expect_exactly(w)
    assert len(w.acked) == 3 * BIG + 2 * SMALL
    got = c.query(w.db, "SELECT src, count(*) AS n FROM crash GROUP BY src ORDER BY src").to_pylist()
    assert got == [{"src": f"w{k}", "n": sum(1 for i in w.acked if i % 4 == k)} for k in range(4)]
    tok = c.delete(w.db, 0, 2 ** 62, predicate="src = 'w1'", table="crash")
    c.wait_applied(w.db, tok, timeout_s=60)
    env.deleted[w.db] = {i for i in w.acked if i % 4 == 1}
    assert sorted(env.ids(w.db)) == sorted(w.acked - env.deleted[w.db])


def test_persist_writes_parquet_to_s3_and_nothing_to_the_driver_disk(env):
    w = env.writer("basic")
    c = env.server.client
    r = c.persist(w.db)
    (p,) = r["persisted"]
    assert p["rows"] == len(w.acked - env.deleted[w.db])
    keys = env.s3_keys(w.db)
    assert keys and all(k.endswith(".parquet") for k in keys)
    assert {f"{PREFIX}/{f}" for f in p["files"]} <= set(keys)
    assert env.parquet_on_driver() == []
    env.expect_exactly(w)


def test_compaction_of_persisted_files(env):
    w = env.writer("basic")
    c = env.server.client
    for n in (BIG, SMALL):
        assert w.write_batch(c, n)
    env.expect_exactly(w)
    c.persist(w.db)
    part = _partition(c, w.db)
    assert len(part["files"]) >= 2
    c.compact(w.db, "crash", part["key"], persisted=True)
    part = _partition(c, w.db)
    assert len(part["files"]) == 1 and part["files"][0]["rows"] == len(w.acked - env.deleted[w.db])
    env.expect_exactly(w)
    assert env.parquet_on_driver() == []


def test_executor_killed_while_writes_continue(env):
    w = env.writer("executor_loss")
    c = env.server.client
    for _ in range(3):  # chunks the executor built and held before it dies
        assert w.write_batch(c, BIG)
    env.expect_exactly(w)
    applied_before = set(w.acked)
    (before,) = wait_for(env.cluster.executor_pids, 30, "the application's executor")
    stop = threading.Event()
    errors: list = []

    def write():
        n = 0
        while not stop.is_set():
            try:
                w.write_batch(c, BIG if n % 2 == 0 else SMALL)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            n += 1
            time.sleep(0.05)

    t = threading.Thread(target=write, name="writer", daemon=True)
    t.start()
    wait_for(lambda: len(w.acked) >= 3 * BIG + 2 * BIG, 60, "writes before the kill")
    os.kill(before, signal.SIGKILL)
    # queries carry on: their tasks run again on the executor the worker starts
    ids = env.ids(w.db)
    assert len(ids) == len(set(ids)) and applied_before <= set(ids)
    after = wait_for(lambda: [p for p in env.cluster.executor_pids() if p != before], 90, "a new executor")
    acked_at_new = len(w.acked)
    wait_for(lambda: len(w.acked) >= acked_at_new + 2 * BIG, 120, "writes after the new executor started")
    stop.set()
    t.join(30)
    assert not errors, errors
    assert after and before not in env.cluster.executor_pids()
    assert not w.unacked, f"{len(w.unacked)} writes were refused while the executor was replaced"
    env.expect_exactly(w)
    r = c.persist(w.db)
    assert sum(p["rows"] for p in r["persisted"]) == len(w.acked)
    env.expect_exactly(w)
    assert env.parquet_on_driver() == []


def test_server_sigkill_and_restart(env):
    w = env.writer("restart")
    c = env.server.client
    for n in (BIG, SMALL, BIG):
        assert w.write_batch(c, n)
    env.expect_exactly(w)
    env.server.kill()
    env.start_server()
    for writer in env.writers.values():
        env.expect_exactly(writer)
    assert w.write_batch(env.server.client, BIG)
    env.expect_exactly(w)
    assert env.parquet_on_driver() == []
