"""raise_write_path_priority against real processes: every thread raised, later threads inherit,
a refusal by the kernel reported and nothing changed."""
import os
import subprocess
import sys

import pytest

from iox_spark.server.runtime.write_path_priority import PriorityResult, raise_write_path_priority

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

#: a child with three sleeping threads; each line on stdin starts one more, answered with its id
_CHILD = """
import sys, threading, time
def sleeper(): time.sleep(60)
for _ in range(3):
    threading.Thread(target=sleeper, daemon=True).start()
print("up", flush=True)
for _line in sys.stdin:
    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    print(t.native_id, flush=True)
"""


def _policies(pid: int) -> dict:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        out[int(tid)] = (os.sched_getscheduler(int(tid)), os.sched_getparam(int(tid)).sched_priority)
    return out


def test_every_thread_is_raised_and_a_thread_started_later_inherits_it():
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"
        assert set(_policies(child.pid).values()) == {(os.SCHED_OTHER, 0)}
        [res] = raise_write_path_priority([child.pid], 3)
        assert res == PriorityResult(child.pid, 4, None), "this machine must allow SCHED_RR (root or CAP_SYS_NICE)"
        assert set(_policies(child.pid).values()) == {(os.SCHED_RR, 3)}
        child.stdin.write("one more\n")
        child.stdin.flush()
        tid = int(child.stdout.readline())
        assert os.sched_getscheduler(tid) == os.SCHED_RR and os.sched_getparam(tid).sched_priority == 3
        assert len(_policies(child.pid)) == 5
    finally:
        child.kill()
        child.wait()


def test_a_refusal_is_reported_and_changes_nothing():
    """A process without the privilege (nobody, RLIMIT_RTPRIO 0) asks for itself."""
    script = (
        "import os, resource, sys\n"
        f"sys.path.insert(0, {ROOT!r})\n"
        "from server.runtime.write_path_priority import raise_write_path_priority\n"
        "if os.geteuid() == 0:\n"
        "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))\n"
        "[r] = raise_write_path_priority([os.getpid()], 1)\n"
        "print(r.threads_raised, r.not_raised is not None, os.sched_getscheduler(0) == os.SCHED_OTHER)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True", "True"]


def test_a_priority_outside_1_to_99_is_an_error_and_a_gone_process_is_no_error():
    with pytest.raises(ValueError):
        raise_write_path_priority([os.getpid()], 0)
    with pytest.raises(ValueError):
        raise_write_path_priority([os.getpid()], 100)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    [res] = raise_write_path_priority([child.pid], 1)
    assert res == PriorityResult(child.pid, 0, "no such process")
