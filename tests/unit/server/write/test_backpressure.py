"""server/write/backpressure.py: a write is refused at the memory limit first, then while the lifecycle
holds backpressure (naming the buffer's bytes, the hard limit and the back-off), else taken."""
from __future__ import annotations

from types import SimpleNamespace

from iox_spark.server.errors import MemoryLimitReached, WriteBufferOverloaded
from iox_spark.server.write.backpressure import WriteBackpressure


def test_the_memory_limit_then_the_buffers_hard_limit_refuse_a_write():
    at_limit = MemoryLimitReached(900, 800, 1.0)
    guard = SimpleNamespace(refusal=lambda: None)
    lifecycle = SimpleNamespace(backpressure_engaged=False)
    catalog = SimpleNamespace(memory_bytes=lambda: 5000)
    rules = SimpleNamespace(buffer_size_hard_bytes=4000, worker_backoff_s=2.5)
    check = WriteBackpressure(guard, lifecycle, catalog, rules)
    assert check.refusal() is None
    lifecycle.backpressure_engaged = True
    e = check.refusal()
    assert isinstance(e, WriteBufferOverloaded)
    assert (e.buffer_bytes, e.hard_limit_bytes, e.retry_after_s) == (5000, 4000, 2.5)
    guard.refusal = lambda: at_limit
    assert check.refusal() is at_limit
