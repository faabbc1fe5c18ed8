"""`iox verify` against real servers: the session's server while writes continue, and a server
whose persisted Parquet file was altered behind its back (a row lost, a value changed, a row
nobody wrote), which the check must name exactly, through the RPC and the command line."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from tests.crash.harness import ServerProcess
from tests.timestamps import S, T0

IOX = os.path.join(os.path.dirname(sys.executable), "iox")


def _iox(*args) -> subprocess.CompletedProcess:
    return subprocess.run([IOX, *args], capture_output=True, text=True, timeout=600)


def test_verify_agrees_with_a_database_written_deleted_persisted_and_written_to_meanwhile(client, db, iox_server):
    lines = [f"cpu,host=h{i % 3} v={i}i,w={i * 2}i {T0 + (i % 7) * S}" for i in range(40)]  # keys collide
    client.write(db, "\n".join(lines))
    client.write(db, f"mem,host=a,dc=x free=1.5 {T0}\ncpu,host=h9 v=1i {T0}")  # two tables: a transaction
    client.delete(db, T0, T0 + 3 * S, predicate='host="h1"', table="cpu")
    client.write(db, f"cpu,host=h1 v=99i {T0 + S}")
    client.persist(db)
    client.wait_applied(db, client.write(db, f"cpu,host=h2 u=5u {T0 + 2 * S}\ncpu,host=h4 s=\"x\",b=true,f=0.25 {T0 + 9 * S}"),
                        timeout_s=60)
    rows = client.query(db, "SELECT * FROM cpu").num_rows + client.query(db, "SELECT * FROM mem").num_rows

    r = client.verify(db)
    assert r["ok"] and r["difference_count"] == 0, r
    assert sum(p["rows_compared"] for p in r["partitions"]) == rows
    assert sum(p["rows_unjudged"] for p in r["partitions"]) == 0
    assert all(p["complete"] and not p["not_verified"] for p in r["partitions"])
    assert sorted(t for p in r["partitions"] for t in p["tables"]) == ["cpu", "mem"]

    out = _iox("verify", "--db", db, "--addr", f"127.0.0.1:{iox_server.grpc_port}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith(f"{db}: OK: the answers equal the write buffer"), out.stdout

    stop = threading.Event()
    errors: list = []

    def keep_writing():
        i = 0
        while not stop.is_set():
            try:
                client.write(db, f"cpu,host=h{i % 5} v={i}i {T0 + (i % 11) * S}")
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            i += 1
            stop.wait(0.01)

    t = threading.Thread(target=keep_writing, daemon=True)
    t.start()
    try:
        for _ in range(3):  # the answers and the write buffer move while it checks
            r = client.verify(db, table="cpu")
            assert r["ok"], [(p["visible_hi_inclusive"], p["to_exclusive"], p["differences"]) for p in r["partitions"]]
            assert [p["tables"] for p in r["partitions"] if not p["not_verified"]] == [["cpu"]]
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors


def test_verify_names_what_a_parquet_file_lost_changed_and_gained(own_broker, session_tmp):
    data = os.path.join(session_tmp, f"verify-{uuid.uuid4().hex[:6]}")
    db = f"vf_{uuid.uuid4().hex[:8]}"
    extra = ["--kafka-bootstrap", own_broker.bootstrap]
    srv = ServerProcess(data, extra=extra).wait_ready()
    try:
        srv.client.write(db, "\n".join(f"cpu,host=h{i} v={i}i {T0 + i * S}" for i in range(10)))
        srv.client.persist(db)
        assert srv.terminate() == 0, srv.tail()
        [path] = glob.glob(os.path.join(data, "objects", db, "data", "cpu", "*", "*.parquet"))
        t = pq.read_table(path)
        hosts = t.column("host").to_pylist()
        keep = [i for i, h in enumerate(hosts) if h != "h3"]  # h3 is lost
        t = t.take(keep)
        v = t.column("v").to_pylist()
        v[t.column("host").to_pylist().index("h5")] = 555  # h5's value changed
        t = t.set_column(t.schema.get_field_index("v"), "v", pa.array(v, t.schema.field("v").type))
        ghost = {n: [t.column(n)[0].as_py()] for n in t.column_names}
        ghost["host"], ghost["time_ns"] = ["h42"], [T0 + 42 * S]  # a row nobody wrote
        t = pa.concat_tables([t, pa.table(ghost, schema=t.schema)])
        pq.write_table(t, path)

        srv = ServerProcess(data, extra=extra).wait_ready()
        r = srv.client.verify(db)
        assert not r["ok"] and r["difference_count"] == 3, r
        diffs = sorted((d["kind"], d["tags"]["host"], d["time_ns"], d["want"], d["got"])
                       for p in r["partitions"] for d in p["differences"])
        assert diffs == [("different", "h5", T0 + 5 * S, {"v": 5}, {"v": 555}),
                         ("extra", "h42", T0 + 42 * S, None, {"v": 0}),
                         ("missing", "h3", T0 + 3 * S, {"v": 3}, None)]
        out = _iox("verify", "--db", db, "--addr", f"127.0.0.1:{srv.port}")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "missing   cpu,host=h3" in out.stdout and out.stdout.strip().endswith(f"{db}: FAILED: 3 difference(s)")
    finally:
        srv.kill()
