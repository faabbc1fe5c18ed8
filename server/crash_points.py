"""Fail points for crash tests: SIGKILL this process at a named moment.

`IOX_CRASH_AT=<point>[,<point>...]` (read once at import) makes `crash_point(point)`
kill the process with SIGKILL, exactly like an operator's `kill -9` at that
moment. Unset (production), `crash_point` is a no-op dictionary lookup.

Points: consume_before_applied (chunks built, offsets not yet applied),
compact_before_swap, persist_after_parquet (files written, catalog not committed),
persist_after_commit (committed, flush handle and chunks not yet swapped),
cleanup_before_delete, replay_batch (a micro-batch during replay after a restart),
txn_after_parts (a request's parts acknowledged, its commit decision not produced),
txn_after_decision (the commit decision acknowledged, the markers not produced).

Fault points, for tests of what the server does when applying a message fails:
`arm_fault(point, key)` (in the server's process) makes `fault_point(point, key)`
raise InjectedFault until `disarm_fault(point, key)`. Unarmed (production), it is one
dictionary truth test. Points: apply_table (key "<database>/<table>": the consumer
plans a chunk of that table's writes in a micro-batch).
"""
from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "POINTS", "fault_point", "arm_fault", "disarm_fault", "InjectedFault", "FAULT_POINTS"]

POINTS = frozenset({"consume_before_applied", "compact_before_swap", "persist_after_parquet",
                    "persist_after_commit", "cleanup_before_delete", "replay_batch", "txn_after_parts",
                    "txn_after_decision"})
_ARMED = frozenset(p for p in os.environ.get("IOX_CRASH_AT", "").split(",") if p)


def crash_point(point: str) -> None:
    if point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)


FAULT_POINTS = frozenset({"apply_table"})
#: point -> keys armed (see the module docstring)
_FAULTS: dict = {}


class InjectedFault(RuntimeError):
    """Raised by an armed fault point."""

    def __init__(self, point: str, key: str):
        self.point = point
        self.key = key
        super().__init__(f"injected fault at {point} for {key}")


def arm_fault(point: str, key: str) -> None:
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    _FAULTS.setdefault(point, set()).add(key)


def disarm_fault(point: str, key: str) -> None:
    keys = _FAULTS.get(point, set())
    keys.discard(key)
    if not keys:
        _FAULTS.pop(point, None)


def fault_point(point: str, key: str) -> None:
    if _FAULTS and key in _FAULTS.get(point, ()):
        raise InjectedFault(point, key)
