"""catalog/crash_points.py: one registry of crash points, used by the code and the crash tests."""
from __future__ import annotations

import ast
import os

import pytest

from catalog.crash_points import CrashPoint, DelayPoint, InvalidDelay, UnknownCrashPoint, armed_delays, armed_points

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _placed_points(fn: str = "crash_point", registry: str = "CrashPoint") -> list[str]:
    """Every `crash_point(CrashPoint.X)` (`fn(registry.X)`) in the product's code, as member names."""
    out = []
    for pkg in ("catalog", "lifecycle", "server"):
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
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
