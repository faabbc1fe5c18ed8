"""The memory guard's states, throttle file and refusal, with a measured RSS fed in."""
from __future__ import annotations

import os

from server.errors import MemoryLimitReached, WriteBufferOverloaded
from server.runtime.memory_guard import NORMAL, REFUSING, THROTTLED, MemoryGuard, process_tree_rss_bytes


def test_states_follow_the_samples(tmp_path) -> None:
    rss = [0]
    throttle = str(tmp_path / "throttle")
    g = MemoryGuard(1000, 0.8, 100, throttle, messages_per_partition=2000, measure=lambda: rss[0])
    for value, state, refusing in [(100, NORMAL, False), (800, THROTTLED, False), (1000, REFUSING, True),
                                   (999, THROTTLED, False), (10, NORMAL, False)]:
        rss[0] = value
        assert g.sample() == state
        err = g.refusal()
        assert (err is not None) == refusing
        assert g.pressure() == (state != NORMAL)
        if state == NORMAL:
            assert not os.path.exists(throttle)
        else:
            assert open(throttle).read() == "200"  # a tenth of the messages per partition
    assert g.peak_rss_bytes == 1000 and g.refusing_samples == 1
    rss[0] = 5000
    g.sample()
    err = g.refusal()
    assert isinstance(err, MemoryLimitReached) and isinstance(err, WriteBufferOverloaded)
    assert (err.rss_bytes, err.limit_bytes, err.retry_after_s) == (5000, 1000, 1.0)
    g.stop()
    assert not os.path.exists(throttle)


def test_a_limit_of_zero_only_measures(tmp_path) -> None:
    g = MemoryGuard(0, 0.8, 100, str(tmp_path / "t"), 2000, measure=lambda: 10**12)
    assert g.sample() == NORMAL and g.refusal() is None and g.rss_bytes == 10**12


def test_process_tree_rss_counts_children() -> None:
    import subprocess
    import sys

    alone = process_tree_rss_bytes()
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(30)"])
    try:
        from tests.waiting import wait_for

        wait_for(lambda: process_tree_rss_bytes() > alone + (48 << 20), timeout_s=20, what="the child's RSS counted")
        assert process_tree_rss_bytes(child.pid) >= 48 << 20
    finally:
        child.kill()
        child.wait()
