"""Request deadlines: how long a server-side wait may last so that its answer still reaches the client.

Invariant: a wait on behalf of a request with a deadline gives up `ANSWER_MARGIN_S` before it, so
the client receives the reason (CatchUpTimedOut, WriteTokenNotVisible, ...) instead of its own
DEADLINE_EXCEEDED; a request without a deadline waits at most the operation's own cap. Pure.
"""
from __future__ import annotations

__all__ = ["ANSWER_MARGIN_S", "wait_budget_s"]

#: How much sooner than a request's deadline a wait gives up, so its answer reaches the client in time
ANSWER_MARGIN_S = 0.25


def wait_budget_s(deadline_s: float | None, cap_s: float) -> float:
    """Seconds a wait may last: `cap_s` without a deadline (`deadline_s`: seconds left, None when the
    request has none), else what is left of it less ANSWER_MARGIN_S, at most `cap_s`, never negative."""
    if deadline_s is None:
        return cap_s
    return max(0.0, min(deadline_s - ANSWER_MARGIN_S, cap_s))
