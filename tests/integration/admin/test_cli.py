"""The `iox` client commands against the session's server (real subprocesses of the console script)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from tests.timestamps import T0

IOX = os.path.join(os.path.dirname(sys.executable), "iox")


def _iox(*args, stdin: str | None = None, addr: str):
    return subprocess.run([IOX, *args, "--addr", addr] if args[0] != "broker" else [IOX, *args],
                          input=stdin, capture_output=True, text=True, timeout=180)


def test_write_sql_status_persist_delete_commands(iox_server, db):
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    r = _iox("write", "--db", db, "-", stdin=f"cpu,host=a v=1.5 {T0}\ncpu,host=b v=2 {T0 + 1}\n", addr=addr)
    assert r.returncode == 0, r.stderr
    token = {int(k): v for k, v in json.loads(r.stdout)["token"].items()}
    from iox_spark.server.api.client import IoxClient

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
    assert json.loads(r.stdout)["persisted"][0]["rows"] == 2
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
    assert out["compacted"] is True and len(out["removed_files"]) == 2 and out["rows"] == 2 and out["added_file"]
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


def test_sql_json_writes_numbers_as_numbers(iox_server, db):
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    lp = f"mem,host=a free=10u,big=18446744073709551615u,i=-5i,f=1.5,s=\"x\",ok=true {T0}\n"
    r = _iox("write", "--db", db, "-", stdin=lp, addr=addr)
    assert r.returncode == 0, r.stderr
    from iox_spark.server.api.client import IoxClient

    with IoxClient(addr) as c:
        c.wait_applied(db, {int(k): v for k, v in json.loads(r.stdout)["token"].items()}, timeout_s=90)
    r = _iox("sql", "--db", db, "--format", "json",
             "SELECT host, free, big, i, f, s, ok, CAST('NaN' AS DOUBLE) AS nan, CAST('Infinity' AS DOUBLE) AS inf, "
             "CAST('-Infinity' AS DOUBLE) AS ninf, time_ns FROM mem", addr=addr)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and '"free": 10,' in r.stdout
    assert json.loads(r.stdout) == {"host": "a", "free": 10, "big": (1 << 64) - 1, "i": -5, "f": 1.5, "s": "x",
                                    "ok": True, "nan": None, "inf": None, "ninf": None, "time_ns": T0}


def test_write_a_file_in_several_requests(iox_server, db, tmp_path):
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    f = tmp_path / "big.lp"
    f.write_text("".join(f"cpu,host=h{i % 7} v={i},s=\"two\nlines\" {T0 + i}\n" for i in range(200)))
    r = _iox("write", "--db", db, "--batch-bytes", "1k", str(f), addr=addr)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # not a terminal: no progress bar
    token = {int(k): v for k, v in json.loads(r.stdout)["token"].items()}
    (last,) = token.values()  # one table: one message per request, on one Kafka partition
    assert last + 1 >= f.stat().st_size // 1024
    from iox_spark.server.api.client import IoxClient

    with IoxClient(addr) as c:
        c.wait_applied(db, token, timeout_s=90)
        rows = c.query(db, "SELECT count(*) AS n, sum(v) AS v, min(s) AS s FROM cpu").to_pylist()
    assert rows == [{"n": 200, "v": float(sum(range(200))), "s": "two\nlines"}]
    # a bad line in a later request: exit 1; the requests before it are written and said so
    f.write_text("".join(f"bad,host=h{i} v={i} {T0 + i}\n" for i in range(100)) + "bad v=oops\n")
    r = _iox("write", "--db", db, "--batch-bytes", "1k", str(f), addr=addr)
    assert r.returncode == 1 and "INVALID_ARGUMENT" in r.stderr and "bytes before it were written" in r.stderr


def test_status_shows_replay_progress_after_a_restart(iox_server, session_tmp, monkeypatch, caplog):
    """A server on a broker of its own replays what it applied before its restart (nothing persisted);
    status reports offsets done / to do, equal once replay caught up, and the server logs them."""
    import logging
    import uuid

    from iox_spark.server import app, replay_watch
    from iox_spark.server.runtime.broker import free_port, start_broker
    from iox_spark.server.api.client import IoxClient
    from tests.conftest import make_config

    monkeypatch.setattr(replay_watch, "REPLAY_LOG_INTERVAL_S", 0.2)
    broker = start_broker(free_port())
    cfg = make_config(os.path.join(session_tmp, f"replay-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=2, lifecycle={"worker_backoff_ms": 3_600_000})
    db = f"p_{uuid.uuid4().hex[:6]}"
    try:
        srv = app.IoxServer(cfg)
        srv.start()
        try:
            with IoxClient(f"127.0.0.1:{srv.grpc_port}") as c:
                for i in range(20):
                    token = c.write(db, f"cpu,host=h{i} v={i} {T0 + i}\n")
                c.wait_applied(db, token, timeout_s=90)
                st = c.status(db)["databases"][0]
                assert (st["replay_offsets_done"], st["replay_offsets_todo"]) == (0, 0)  # nothing replayed
        finally:
            srv.stop()  # an external broker: nothing is persisted on stop
        caplog.set_level(logging.INFO, logger="iox_spark.server.replay_watch")
        srv = app.IoxServer(cfg)
        srv.start()
        try:
            addr = f"127.0.0.1:{srv.grpc_port}"
            first = json.loads(_iox("status", "--db", db, addr=addr).stdout)["databases"][0]
            assert int(first["replay_offsets_todo"]) == 20 and 0 <= int(first["replay_offsets_done"]) <= 20
            r = _iox("status", "--db", db, "--wait-replay", addr=addr)
            assert r.returncode == 0 and "replay caught up" in r.stderr, r.stderr
            st = json.loads(r.stdout)["databases"][0]
            assert st["replaying"] is False
            assert st["replay_offsets_done"] == st["replay_offsets_todo"] == 20
            with IoxClient(addr) as c:
                assert c.query(db, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 20}]
            from tests.waiting import wait_for

            wait_for(lambda: any(f"replay of database {db}: done, 20 offsets" in m.getMessage()
                                 for m in caplog.records), 30, "the replay's log line")
        finally:
            srv.stop()
    finally:
        broker.stop()


def test_serve_on_a_taken_port_exits_at_once_naming_the_port_and_its_option(tmp_path):
    """Another process holds the gRPC, HTTP, Spark Connect, InfluxDB 3 or embedded broker's port: one
    line, exit 1, before Spark starts (and, but for the broker's own port, before the broker does); a
    second server on one host used to die in a traceback around Spark Connect's BindException."""
    import socket
    import time

    from iox_spark.server.runtime.broker import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("IOX_")}
    options = ("--grpc-port", "--http-port", "--spark-connect-port", "--influxdb3-port", "--broker-port")
    for option in options:
        ports = {o: free_port() for o in options}
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", ports[option]))
            holder.listen()
            t0 = time.monotonic()
            args = [IOX, "serve", "--data-dir", str(tmp_path / option.strip("-")), "--broker-storage", "memory"]
            for o, p in ports.items():
                args += [o, str(p)]
            r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 1, (option, r.stderr[-2000:])
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"port {ports[option]}" in errors[0] and option in errors[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr
