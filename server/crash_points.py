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
"""
from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "POINTS"]

POINTS = frozenset({"consume_before_applied", "compact_before_swap", "persist_after_parquet",
                    "persist_after_commit", "cleanup_before_delete", "replay_batch", "txn_after_parts",
                    "txn_after_decision"})
_ARMED = frozenset(p for p in os.environ.get("IOX_CRASH_AT", "").split(",") if p)


def crash_point(point: str) -> None:
    if point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
