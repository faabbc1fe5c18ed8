"""catalog/crash_points.py: one registry of crash points, used by the code and the crash tests."""
from __future__ import annotations

import ast

import pytest

from iox_spark.catalog.crash_points import CrashPoint, DelayPoint, InvalidDelay, UnknownCrashPoint, armed_delays, armed_points
from tests.project_code import module_paths


def _placed_points(fn: str = "crash_point", registry: str = "CrashPoint") -> list[str]:
    """Every `crash_point(CrashPoint.X)` (`fn(registry.X)`) in the product's code, as member names."""
    out = []
    for path in module_paths().values():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == fn:
                arg = node.args[0]
                assert (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
                        and arg.value.id == registry), \
                    f"{path}:{node.lineno}: {fn} takes a {registry} member, not {ast.dump(arg)}"
                out.append(arg.attr)
    return out


def test_every_point_is_placed_exactly_once_and_only_registered_points_are():
    placed = _placed_points()
    assert sorted(placed) == sorted(p.name for p in CrashPoint)


def test_armed_points_parses_the_environment_value():
    assert armed_points("") == frozenset()
    assert armed_points("persist_after_parquet, replay_batch") == {CrashPoint.PERSIST_AFTER_PARQUET,
                                                                   CrashPoint.REPLAY_BATCH}


def test_an_unknown_name_fails_naming_it():
    with pytest.raises(UnknownCrashPoint) as e:
        armed_points("persist_after_parquet,persist_after_parquett")
    assert e.value.name == "persist_after_parquett"
    assert "persist_after_parquett" in str(e.value)


def test_every_delay_point_is_placed_exactly_once():
    assert sorted(_placed_points("delay_point", "DelayPoint")) == sorted(p.name for p in DelayPoint)


def test_armed_delays_parses_points_and_seconds():
    assert armed_delays("") == {}
    assert armed_delays(" apply_batch=2.5 ") == {DelayPoint.APPLY_BATCH: 2.5}
    with pytest.raises(UnknownCrashPoint):
        armed_delays("apply_batchh=1")
    for bad in ("apply_batch", "apply_batch=x", "apply_batch=-1", "apply_batch=nan"):
        with pytest.raises(InvalidDelay):
            armed_delays(bad)


def test_a_gated_delay_point_waits_while_its_gate_file_exists(tmp_path, monkeypatch):
    import threading
    import time

    import iox_spark.catalog.crash_points as cp

    gate = tmp_path / "gate"
    gate.write_text("")
    monkeypatch.setenv(cp.DELAY_GATE_ENV, str(gate))
    monkeypatch.setattr(cp, "_DELAYS", {DelayPoint.BATCH_CHUNKS_ADDED: 0.0})
    cp.delay_point(DelayPoint.BATCH_CHUNKS_ADDED)  # not gated: passes at once
    cp.delay_point(DelayPoint.APPLY_BATCH, gated=True)  # not armed: passes at once
    passed = threading.Event()
    t = threading.Thread(target=lambda: (cp.delay_point(DelayPoint.BATCH_CHUNKS_ADDED, gated=True), passed.set()))
    t.start()
    assert not passed.wait(0.3)  # held while the gate exists
    gate.unlink()
    assert passed.wait(5)
    t.join()
    monkeypatch.setattr(cp, "DELAY_GATE_MAX_S", 0.2)
    gate.write_text("")
    t0 = time.monotonic()
    cp.delay_point(DelayPoint.BATCH_CHUNKS_ADDED, gated=True)  # a gate never removed holds at most its bound
    assert 0.2 <= time.monotonic() - t0 < 5
