"""Continuous downsampling on the session server: a downsampler emits every window of its source's
history (persisted and in memory) first, then each window a write, a late point or a delete
changes; its output is compared, exactly, with a plain-Python aggregation of what was written. Created,
listed and dropped through gRPC and the CLI; bad definitions are refused whole."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import time
import uuid
from contextlib import redirect_stdout

import grpc
import pytest

from iox_spark.catalog.downsampling import record_key
from iox_spark.server.cli.main import main as cli_main
from iox_spark.server.runtime.broker import start_broker
from tests.conftest import make_config, start_server
from tests.downsamplers import databases, downsampler, emitted_through
from tests.timestamps import T0
from tests.waiting import wait_for

S = 10**9
EVERY_S = 10


def _caught_up(client, name: str, src: str, dest: str, acked: dict | None = None) -> bool:
    """The downsampler emitted every offset of `acked` ({kp: offset} acknowledged by the source) and
    everything its source applied, and the destination applied what it wrote."""
    found = downsampler(client, name)
    if found is None or found["last_error"] or found["state"] != "running":
        return False
    applied = {kp: hi for kp, hi in client.applied(src).items() if hi >= 0}
    for kp, off in (acked or {}).items():
        applied[int(kp)] = max(applied.get(int(kp), -1), off)
    return emitted_through(client, name, dest, {kp: hi + 1 for kp, hi in applied.items()})


def _want(points: dict) -> dict:
    """{(host, window start): (mean, max, count)} of {(host, t): usage}."""
    groups: dict = {}
    for (host, t), v in points.items():
        groups.setdefault((host, t - t % (EVERY_S * S)), []).append(v)
    return {k: (sum(vs) / len(vs), max(vs), len(vs)) for k, vs in groups.items()}


def _got(client, dest: str, table: str) -> dict:
    if dest not in databases(client) or \
            table not in {t["name"] for d in client.status(dest)["databases"] for t in d["tables"]}:
        return {}
    rows = client.query(dest, f"SELECT * FROM {table}").to_pylist()
    return {(r["host"], r["time_ns"]): (r["mean_usage"], r["max_usage"], r["count_usage"]) for r in rows}


def _acked(acked: dict, token: dict) -> None:
    for kp, off in token.items():
        acked[int(kp)] = max(acked.get(int(kp), -1), off)


def _write(client, db: str, points: dict, new: dict, acked: dict) -> None:
    _acked(acked, client.write(db, "\n".join(f"cpu,host={h} usage={v} {t}" for (h, t), v in new.items())))
    points.update(new)


def _settle(client, name: str, src: str, dest: str, points: dict, acked: dict) -> None:
    wait_for(lambda: _caught_up(client, name, src, dest, acked), 60, f"downsampler {name} to catch up")
    assert _got(client, dest, "cpu_10s") == _want(points)


def test_backfill_then_writes_late_points_and_deletes_are_emitted_exactly(client, db, iox_server):
    dest = f"{db}_ds"
    name = f"{dest}.cpu_10s"
    points: dict = {}
    acked: dict = {}
    # history: persisted, then more in memory, in three windows
    _write(client, db, points, {("a", T0 + s * S): float(s) for s in range(0, 25, 2)}, acked)
    client.persist(db)
    _write(client, db, points, {("b", T0 + s * S): float(10 * s) for s in range(1, 25, 3)}, acked)
    created = client.create_downsampler(db, "cpu", "10s", "mean(usage),max(usage),count(usage)", dest,
                                        group_by_tags="host")
    assert created["name"] == name and created["state"] == "backfilling" and created["every_ns"] == EVERY_S * S
    assert created["group_by_tags"] == ["host"] and created["aggregates"] == ["mean(usage)", "max(usage)",
                                                                              "count(usage)"]
    _settle(client, name, db, dest, points, acked)
    # a point of a new window, then a late one into the first window, overwriting one and adding one
    _write(client, db, points, {("a", T0 + 41 * S): 7.5}, acked)
    _write(client, db, points, {("a", T0 + 2 * S): 100.0, ("c", T0 + 3 * S): 1.0}, acked)
    _settle(client, name, db, dest, points, acked)
    # a delete of host b in the second window: its window is emitted again; an emptied window goes
    _acked(acked, client.delete(db, T0 + 10 * S, T0 + 20 * S, "host='b'", table="cpu"))
    points = {k: v for k, v in points.items() if not (k[0] == "b" and T0 + 10 * S <= k[1] < T0 + 20 * S)}
    _acked(acked, client.delete(db, T0 + 40 * S, T0 + 50 * S, "", table="cpu"))
    points = {k: v for k, v in points.items() if not T0 + 40 * S <= k[1] < T0 + 50 * S}
    _settle(client, name, db, dest, points, acked)
    # persisted and compacted source rows change nothing
    client.persist(db)
    _write(client, db, points, {("b", T0 + 5 * S): 3.0}, acked)
    _settle(client, name, db, dest, points, acked)

    status = client.status(db)["downsamplers"]
    assert [d["name"] for d in status] == [name] and status[0]["lag_messages"] == 0
    assert status[0]["watermark_ns"] <= max(t for _h, t in points)
    dropped = client.drop_downsampler(name)
    assert dropped["name"] == name
    assert name not in [d["name"] for d in client.list_downsamplers()]
    assert not iox_server.store.exists(record_key(name))


def test_every_tag_by_default_and_first_last_sum_min(client, db):
    dest = f"{db}_all"
    client.write(db, "\n".join([f"m,host=a,dc=x v=1i,s=\"p\" {T0}", f"m,host=a,dc=x v=5i,s=\"q\" {T0 + 2 * S}",
                                f"m,host=a,dc=y v=2i {T0 + S}", f"m,host=b v=4i {T0 + 61 * S}"]))
    client.create_downsampler(db, "m", "1m", "sum(v),min(v),first(s),last(s),count(s)", f"{dest}.m1")
    name = f"{dest}.m1"

    def done():
        ok = _caught_up(client, name, db, dest)
        return ok and dest in databases(client) and \
            len(client.query(dest, "SELECT * FROM m1").to_pylist()) == 3

    wait_for(done, 60, "the downsampler's first round")
    rows = sorted(client.query(dest, "SELECT * FROM m1").to_pylist(), key=lambda r: (r["time_ns"], r["dc"] or ""))
    t0w = T0 - T0 % (60 * S)
    got = [(r["host"], r["dc"], r["time_ns"], r["sum_v"], r["min_v"], r["first_s"], r["last_s"], r["count_s"])
           for r in rows]
    assert got == [("a", "x", t0w, 6, 1, "p", "q", 2), ("a", "y", t0w, 2, 2, None, None, 0),
                   ("b", None, t0w + 60 * S, 4, 4, None, None, 0)]
    client.drop_downsampler(name)


def test_windows_older_than_the_destinations_retention_are_not_emitted_and_never_stall_it(client, db):
    """A destination with a shorter retention than the source's history: the windows that start
    before what it keeps are left out (their points would be hidden there, and a write holding one
    is refused whole), and every later window is emitted, late points included."""
    every = 2 * 3600 * S
    dest = f"{db}_ret"
    name = f"{dest}.cpu_2h"
    now = time.time_ns()
    old = now - now % every - every  # the window before the current one: 2-4 h ago
    # the destination keeps from 10 minutes after that window's start on: the window itself
    # starts before its retention, its second half is within it, the current window is all in it
    period_s = (now - old) // S - 600
    client.set_retention(dest, period_s)
    points = {("a", old + 1200 * S): 1.0, ("a", old + 1300 * S): 3.0, ("a", old + every + S): 5.0}
    acked: dict = {}
    _write(client, db, {}, points, acked)
    client.create_downsampler(db, "cpu", "2h", "mean(usage),max(usage),count(usage)", dest, group_by_tags="host")

    def settled(want: dict) -> bool:
        return _caught_up(client, name, db, dest, acked) and _got(client, dest, "cpu_2h") == want

    wait_for(lambda: settled({("a", old + every): (5.0, 5.0, 1)}), 60, f"downsampler {name} to emit the current window")
    # a late point in the old window and one in the current window: the latter is emitted, the former
    # changes nothing there, and no round fails
    _write(client, db, {}, {("a", old + 1400 * S): 7.0, ("a", old + every + 2 * S): 9.0}, acked)
    wait_for(lambda: settled({("a", old + every): (7.0, 9.0, 2)}), 60, f"downsampler {name} to emit the late points")
    assert downsampler(client, name)["last_error"] == ""
    client.drop_downsampler(name)


def test_a_destination_that_lost_the_emitted_writes_gets_every_window_again(session_tmp):
    """The destination's topic is lost with the downsampler's writes in it (unpersisted), after the
    downsampler recorded its progress; the server starts with --skip-lost-writes and the destination
    continues in a new write-buffer epoch: the downsampler emits every window again, so the
    destination holds them all (its progress alone would say they were emitted)."""
    from confluent_kafka.admin import AdminClient

    broker = start_broker()
    cfg = make_config(os.path.join(session_tmp, f"dsl-{uuid.uuid4().hex[:6]}"), broker.bootstrap, partitions=1,
                      lifecycle={"worker_backoff_ms": 3_600_000})  # nothing persisted by the lifecycle
    src = f"dl_{uuid.uuid4().hex[:6]}"
    dest, name = f"{src}_ds", f"{src}_ds.cpu_10s"
    points = {(h, T0 + s * S): float(s) for h in ("a", "b") for s in range(0, 30, 3)}
    acked: dict = {}
    try:
        srv, c = start_server(cfg)
        try:
            _write(c, src, {}, points, acked)
            c.create_downsampler(src, "cpu", "10s", "mean(usage),max(usage),count(usage)", dest,
                                 group_by_tags="host")
            _settle(c, name, src, dest, points, acked)
            epoch = c.status(dest)["databases"][0]["epoch"]
        finally:
            c.close()
            srv.stop()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([f"iox.{dest}"])[f"iox.{dest}"].result(timeout=30)
        srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, skip_lost_writes=True))
        try:
            st = c.status(dest)["databases"][0]
            assert st["epoch"] > epoch and st["lost_writes"], st  # the emitted writes are gone

            def emitted_again() -> bool:  # the progress alone was caught up before the start already
                return _caught_up(c, name, src, dest, acked) and _got(c, dest, "cpu_10s") == _want(points)

            wait_for(emitted_again, 60, f"downsampler {name} to emit every window again")
            _write(c, src, points, {("a", T0 + 4 * S): 40.0}, acked)
            wait_for(emitted_again, 60, f"downsampler {name} to emit the late point")
        finally:
            c.close()
            srv.stop()
    finally:
        broker.stop()


@pytest.mark.parametrize("kw, says", [
    (dict(every="0s"), "every"),
    (dict(every="1.5x"), "every"),
    (dict(aggregates="median(usage)"), "median"),
    (dict(aggregates="mean(host)"), "not a field"),
    (dict(aggregates="mean(nope)"), "not a field"),
    (dict(aggregates="count(usage),count(usage)"), "twice"),
    (dict(group_by_tags="nope"), "not a tag"),
    (dict(into=""), "--into"),
    (dict(into="bad name"), "destination database"),
    (dict(start="yesterday"), "start"),
    (dict(table="nope"), "does not exist"),
])
def test_bad_definitions_are_refused_whole(client, db, kw, says):
    client.write(db, f"cpu,host=a usage=1 {T0}")
    args = dict(database=db, table="cpu", every="10s", aggregates="mean(usage)", into=f"{db}_x", group_by_tags="all")
    args.update(kw)
    with pytest.raises(grpc.RpcError) as e:
        client.create_downsampler(**args)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in e.value.details(), e.value.details()
    assert all(d["source_database"] != db for d in client.list_downsamplers())


def test_cli_creates_lists_and_drops_and_names_a_missing_one(client, db, iox_server, capsys):
    client.write(db, f"cpu,host=a usage=1 {T0}")
    addr = f"127.0.0.1:{iox_server.grpc_port}"
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["downsample", "create", "--addr", addr, "--db", db, "--table", "cpu", "--every", "1h",
                         "--agg", "max(usage)", "--into", f"{db}_h"]) == 0
    assert json.loads(out.getvalue())["name"] == f"{db}_h.cpu_1h"
    with pytest.raises(grpc.RpcError) as e:
        client.create_downsampler(db, "cpu", "1h", "max(usage)", f"{db}_h")
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["downsample", "list", "--addr", addr, "--db", db]) == 0
    assert [d["name"] for d in json.loads(out.getvalue())["downsamplers"]] == [f"{db}_h.cpu_1h"]
    with redirect_stdout(io.StringIO()):
        assert cli_main(["downsample", "drop", "--addr", addr, f"{db}_h.cpu_1h"]) == 0
    with pytest.raises(SystemExit) as ex:
        cli_main(["downsample", "drop", "--addr", addr, f"{db}_h.cpu_1h"])
    assert ex.value.code == 1 and "NOT_FOUND" in capsys.readouterr().err


def test_a_destination_table_with_a_column_of_another_type_is_refused(client, db):
    client.write(db, f"cpu,host=a usage=1 {T0}")
    client.write(f"{db}_d", f'cpu_1m,host=a mean_usage="text" {T0}')
    with pytest.raises(grpc.RpcError) as e:
        client.create_downsampler(db, "cpu", "1m", "mean(usage)", f"{db}_d")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "mean_usage" in e.value.details(), \
        e.value.details()
    assert all(d["source_database"] != db for d in client.list_downsamplers())
