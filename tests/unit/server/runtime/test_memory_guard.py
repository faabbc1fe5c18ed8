"""The memory guard's states, throttle file and refusal, with a measured RSS fed in."""
from __future__ import annotations

import os

from iox_spark.server.errors import MemoryLimitReached, WriteBufferOverloaded
from iox_spark.server.runtime.memory_guard import (EXACT_MAX_AGE_S, NORMAL, REFUSING, THROTTLED, MemoryGuard,
                                         process_tree_rss_bytes)


def test_states_follow_the_samples(tmp_path) -> None:
    rss = [0]
    throttle = str(tmp_path / "throttle")
    g = MemoryGuard(1000, 0.8, 100, throttle, messages_per_partition=2000, measure=lambda: rss[0])
    for value, state, refusing in [(100, NORMAL, False), (800, THROTTLED, False), (1000, REFUSING, True),
                                   (999, THROTTLED, False), (10, NORMAL, False)]:
        rss[0] = value
        assert g.sample(0.0) == state
        err = g.refusal()
        assert (err is not None) == refusing
        assert g.pressure() == (state != NORMAL)
        if state == NORMAL:
            assert not os.path.exists(throttle)
        else:
            assert open(throttle).read() == "200"  # a tenth of the messages per partition
    assert g.peak_rss_bytes == 1000 and g.refusing_samples == 1
    rss[0] = 5000
    g.sample(0.0)
    err = g.refusal()
    assert isinstance(err, MemoryLimitReached) and isinstance(err, WriteBufferOverloaded)
    assert (err.rss_bytes, err.limit_bytes, err.retry_after_s) == (5000, 1000, 1.0)
    g.stop()
    assert not os.path.exists(throttle)


def test_a_limit_of_zero_only_measures(tmp_path) -> None:
    g = MemoryGuard(0, 0.8, 100, str(tmp_path / "t"), 2000, measure=lambda: 10**12)
    assert g.sample(0.0) == NORMAL and g.refusal() is None and g.rss_bytes == 10**12


def test_the_exact_figure_is_read_only_when_the_bound_reaches_the_soft_fraction_or_it_is_old(tmp_path) -> None:
    exact, bound, reads = [100], [300], []

    def measure():
        reads.append(exact[0])
        return exact[0]

    g = MemoryGuard(1000, 0.8, 100, str(tmp_path / "t"), 2000, measure=measure, bound=lambda: bound[0])
    assert g.sample(0.0) == NORMAL and reads == [100]  # the first sample is exact
    exact[0] = 200
    assert g.sample(1.0) == NORMAL and reads == [100] and g.rss_bytes == 100  # bound 300 < 800
    bound[0], exact[0] = 850, 790  # the bound at the soft fraction: the exact figure decides
    assert g.sample(2.0) == NORMAL and reads == [100, 790] and g.rss_bytes == 790
    bound[0], exact[0] = 1200, 1000
    assert g.sample(3.0) == REFUSING and g.refusal().rss_bytes == 1000
    bound[0], exact[0] = 500, 400  # back under: the bound alone says normal, as the exact figure would
    assert g.sample(4.0) == NORMAL and g.refusal() is None and reads == [100, 790, 1000]
    exact[0] = 450
    assert g.sample(3.0 + EXACT_MAX_AGE_S) == NORMAL and reads[-1] == 450 and g.rss_bytes == 450  # aged out
    g.stop()


def test_without_a_limit_the_exact_figure_is_refreshed_as_it_ages(tmp_path) -> None:
    reads = []
    g = MemoryGuard(0, 0.8, 100, str(tmp_path / "t"), 2000, measure=lambda: reads.append(1) or 10**12,
                    bound=lambda: 10**13)
    for t in (0.0, 1.0, EXACT_MAX_AGE_S - 0.1, EXACT_MAX_AGE_S, EXACT_MAX_AGE_S + 1):
        assert g.sample(t) == NORMAL
    assert len(reads) == 2 and g.rss_bytes == 10**12


def test_the_rss_bound_is_never_below_the_exact_figure() -> None:
    """On a process whose memory no longer changes (it allocated, then waits on its stdin)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(32 << 20); print(1, flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"1\n"
        exact, bound = process_tree_rss_bytes(child.pid), process_tree_rss_bytes(child.pid, exact=False)
        assert 32 << 20 <= exact <= bound
    finally:
        child.kill()
        child.wait()


_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(b'\\x01') * (64 << 20); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(60)
"""


def test_process_tree_rss_counts_children() -> None:
    """A process whose child holds 64 MiB (every page touched): its tree counts the child's pages,
    the process alone does not. Measured on a tree of its own, not the test process's (whose other
    children, a Spark JVM or a broker, grow and shrink meanwhile)."""
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        child = process_tree_rss_bytes(child_pid)
        assert child >= 64 << 20
        tree = process_tree_rss_bytes(parent.pid)
        assert tree >= child + (1 << 20)  # the child, and the parent's own pages
        assert process_tree_rss_bytes(parent.pid, exact=False) >= tree - (1 << 20)  # RSS sums bound it
    finally:
        parent.kill()
        parent.wait()


_FORKED = """
import os, sys, time
b = bytearray(b"\\x01") * (128 << 20)  # 128 MiB, every page touched
for _ in range(3):
    if os.fork() == 0:  # a worker sharing those pages (copy on write, none written)
        time.sleep(60)
        os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def test_pages_forked_workers_share_count_once_and_reused_processes_count_too() -> None:
    """The sum of RSS counted 128 MiB four times (a parent and three forked workers sharing it);
    proportional shares count it once. A process given as an extra root (a broker reused from an
    earlier run: not a child) counts with its own children."""
    import subprocess
    import sys

    from iox_spark.server.runtime.memory_guard import children_map

    parent = subprocess.Popen([sys.executable, "-c", _FORKED], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        pids = [parent.pid] + children_map().get(parent.pid, [])
        assert len(pids) == 4
        rss = sum(int(open(f"/proc/{p}/statm").read().split()[1]) * 4096 for p in pids)
        tree = process_tree_rss_bytes(parent.pid)
        assert rss > 4 * (120 << 20)  # what the RSS sum said
        assert (120 << 20) < tree < 2 * (128 << 20), tree  # once, plus each interpreter's own pages
        other = subprocess.Popen(["sleep", "60"])  # a tree the forked workers are not in
        try:
            alone = process_tree_rss_bytes(other.pid)
            assert process_tree_rss_bytes(other.pid, extra_pids=[parent.pid]) >= alone + (120 << 20)
        finally:
            other.kill()
            other.wait()
    finally:
        for pid in children_map().get(parent.pid, []):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
