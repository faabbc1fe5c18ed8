"""server/pool/assigner_status.py: a real assigner's status over real HTTP. Its members here do not
answer (nothing listens at their addresses): the status says so, with each member's error; the
token guards every route but /health; /metrics counts what the rounds saw."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from iox_spark.server.pool.assigner import Assigner
from iox_spark.server.pool.assigner_status import AssignerStatusServer
from iox_spark.server.runtime.broker import free_port


def _get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Token {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def served(tmp_path):
    members = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    a = Assigner(members, str(tmp_path / "state.json"), interval_s=0.1)
    s = AssignerStatusServer(a, "127.0.0.1", 0, token="sekret").start()
    yield a, s, members
    s.stop()
    a.close()


def test_the_status_names_each_member_and_why_it_did_not_answer(served):
    a, s, members = served
    code, body = _get(s.port, "/status", "sekret")
    st = json.loads(body)
    assert code == 200 and st["rounds"] == 0 and st["role"] == "alone" and st["assignments"] == []
    assert [(m["address"], m["reachable"], m["error"]) for m in st["members"]] == \
        [(m, False, "not asked yet") for m in members]
    a.run_once(now=1_000.0)
    st = json.loads(_get(s.port, "/status", "sekret")[1])
    assert st["rounds"] == 1 and st["moves"] == []
    assert [m["address"] for m in st["members"]] == members
    assert all(not m["reachable"] and m["error"].startswith("UNAVAILABLE") for m in st["members"]), st["members"]


def test_the_token_guards_status_and_metrics_not_health(served):
    a, s, _members = served
    a.run_once(now=1_000.0)
    assert _get(s.port, "/health") == (200, "ok\n")
    for path in ("/status", "/metrics"):
        code, body = _get(s.port, path)
        assert code == 401 and "token" in json.loads(body)["message"]
        assert _get(s.port, path, "wrong")[0] == 401
    code, text = _get(s.port, "/metrics", "sekret")
    assert code == 200
    lines = {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l and l[0] != "#"}
    assert lines["iox_assigner_rounds_total"] == 1.0 and lines["iox_assigner_members"] == 2.0
    assert lines["iox_assigner_members_reachable"] == 0.0 and lines["iox_assigner_active"] == 1.0
    assert lines['iox_assigner_moves_total{why="rebalance"}'] == 0.0
    assert _get(s.port, "/nope", "sekret")[0] == 404


def test_a_taken_status_port_is_one_line_naming_the_option(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "iox_spark.server.cli.main", "assigner", "--ingesters", "127.0.0.1:1",
                              "--state-file", str(tmp_path / "s.json"), "--status-addr", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"127.0.0.1:{port}" in out.stderr and "--status-addr" in out.stderr
