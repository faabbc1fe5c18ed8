"""The `iox` client commands against the session's server (real subprocesses of the console script)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

IOX = os.path.join(os.path.dirname(sys.executable), "iox")
T0 = 1_700_000_000_000_000_000


def _iox(*args, stdin: str | None = None, addr: str):
    return subprocess.run([IOX, *args, "--addr", addr] if args[0] != "broker" else [IOX, *args],
                          input=stdin, capture_output=True, text=True, timeout=180)


def test_write_sql_status_persist_delete_commands(iox_server, db):
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    r = _iox("write", "--db", db, "-", stdin=f"cpu,host=a v=1.5 {T0}\ncpu,host=b v=2 {T0 + 1}\n", addr=addr)
    assert r.returncode == 0, r.stderr
    token = {int(k): v for k, v in json.loads(r.stdout)["token"].items()}
    from server.client import IoxClient

    with IoxClient(addr) as c:
        c.wait_applied(db, token, timeout_s=90)
    r = _iox("sql", "--db", db, "--format", "json", "SELECT host, v, time_ns FROM cpu ORDER BY host", addr=addr)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"host": "a", "v": 1.5, "time_ns": T0}, {"host": "b", "v": 2.0, "time_ns": T0 + 1}]
    r = _iox("sql", "--db", db, "--format", "csv", "SELECT host FROM cpu ORDER BY host", addr=addr)
    assert r.stdout.splitlines() == ["host", "a", "b"]
    r = _iox("sql", "--db", db, "SELECT count(*) AS n FROM cpu", addr=addr)
    assert "| 2 " in r.stdout and "1 row(s)" in r.stdout
    r = _iox("status", "--db", db, "--wait-replay", addr=addr)
    assert r.returncode == 0 and "replay caught up" in r.stderr
    st = json.loads(r.stdout)["databases"][0]
    assert st["name"] == db and [t["name"] for t in st["tables"]] == ["cpu"]
    r = _iox("persist", "--db", db, addr=addr)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["persisted"][0]["rows"] == "2"
    r = _iox("delete", "--db", db, "--table", "cpu", "--start", str(T0), "--stop", str(T0 + 1),
             "--predicate", "host = 'a'", addr=addr)
    assert r.returncode == 0, r.stderr
    token = {int(k): v for k, v in json.loads(r.stdout)["token"].items()}
    with IoxClient(addr) as c:
        c.wait_applied(db, token, timeout_s=90)
    r = _iox("sql", "--db", db, "--format", "json", "SELECT host FROM cpu", addr=addr)
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"host": "b"}]
    # a second file, then both merged into one (the delete applied)
    r = _iox("write", "--db", db, "-", stdin=f"cpu,host=c v=3 {T0 + 2}\n", addr=addr)
    with IoxClient(addr) as c:
        c.wait_applied(db, {int(k): v for k, v in json.loads(r.stdout)["token"].items()}, timeout_s=90)
    assert _iox("persist", "--db", db, addr=addr).returncode == 0
    r = _iox("compact", "--db", db, "--table", "cpu", "--partition", "2023-11-14", "--persisted", addr=addr)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["compacted"] is True and len(out["removed_files"]) == 2 and out["rows"] == "2" and out["added_file"]
    r = _iox("sql", "--db", db, "--format", "json", "SELECT host FROM cpu ORDER BY host", addr=addr)
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"host": "b"}, {"host": "c"}]


def test_errors_exit_non_zero_with_the_servers_message(iox_server, db):
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    r = _iox("write", "--db", db, "-", stdin="not line protocol\n", addr=addr)
    assert r.returncode != 0 and "INVALID_ARGUMENT" in r.stderr and "line 1" in r.stderr
    r = _iox("sql", "--db", "no_such_database_here", "SELECT 1", addr=addr)
    assert r.returncode != 0 and "NOT_FOUND" in r.stderr
    r = _iox("delete", "--db", db, "--start", "x", "--stop", "y", addr=addr)
    assert r.returncode != 0
