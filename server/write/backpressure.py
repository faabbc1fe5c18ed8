"""Backpressure on the write path: which refusal, if any, a write gets before anything of it is done.

Invariant (docs/ARCHITECTURE.md invariant 7, "Bounded memory"): while the process tree is at
`--memory-limit-bytes` (server/runtime/memory_guard.py), a write is refused with
MemoryLimitReached; while the in-memory buffer is over its hard limit (the lifecycle engaged
backpressure: lifecycle/policy.py), with WriteBufferOverloaded naming the buffer's bytes, the
limit and when to retry. Both answer RESOURCE_EXHAUSTED / HTTP 503 and lose nothing.

When it runs: `refusal` in request threads, first thing of every write (the router's
`overload_check`). Driver only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from iox_spark.server.errors import ServerError, WriteBufferOverloaded

if TYPE_CHECKING:
    from iox_spark.catalog.catalog import Catalog
    from iox_spark.lifecycle.rules import LifecycleRules
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.runtime.memory_guard import MemoryGuard

__all__ = ["WriteBackpressure"]


class WriteBackpressure:
    """Collaborators: the `memory_guard` (MemoryGuard: `refusal`), the `lifecycle` (LifecycleWorker:
    `backpressure_engaged`), the `catalog` (its buffer's bytes) and the lifecycle `rules` (the hard
    limit, the back-off a refused writer is told)."""

    def __init__(self, memory_guard: MemoryGuard, lifecycle: LifecycleWorker, catalog: Catalog,
                 rules: LifecycleRules):
        self._memory_guard = memory_guard
        self._lifecycle = lifecycle
        self._catalog = catalog
        self._rules = rules

    def refusal(self) -> ServerError | None:
        """The error to refuse a write with now, or None."""
        refusal = self._memory_guard.refusal()
        if refusal is not None:
            return refusal
        if not self._lifecycle.backpressure_engaged:
            return None
        return WriteBufferOverloaded(self._catalog.memory_bytes(), self._rules.buffer_size_hard_bytes,
                                     self._rules.worker_backoff_s)
