"""Real-time CPU scheduling for the write path: the server's own threads and its embedded broker.

Invariant: once `raise_write_path_priority` reported a process as raised, every thread of it
runs under SCHED_RR at the given priority, and threads it creates later inherit that policy
(the kernel copies it on clone). A runnable write-path thread (a gRPC handler parsing a
request, the Kafka producer's threads, the broker answering the produce) therefore takes a core
at once instead of waiting behind the Spark JVM's time slice: the consume path, compactions and
queries run in the JVM and its Python workers, separate processes under the normal policy
(at their own nice value: spark.py), so they only ever get the CPU the write path leaves.

Where it runs: called once by `IoxServer.start` on the driver, after the Spark JVM and the
embedded broker started. A process forked later by a raised thread would inherit the policy,
so nothing may be started that way afterwards; the server starts no process after `start`.

Bounds: the write path itself is bounded (requests are at most `max_request_bytes`, the Python
threads share one GIL, the broker answers produces and fetches), and the kernel's real-time
throttling (`/proc/sys/kernel/sched_rt_runtime_us`, 95% of every second by default) leaves
normal threads CPU even if a raised thread never blocked. Where the kernel refuses (no
CAP_SYS_NICE, an RLIMIT_RTPRIO below the priority, no real-time budget in the cgroup) nothing
changes: the server logs it and serves at the normal policy; a scheduling preference is never
a reason not to serve. Linux only; elsewhere every process is reported as not raised.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

__all__ = ["raise_write_path_priority", "raise_server_and_broker", "PriorityResult", "MIN_RT_PRIORITY",
           "MAX_RT_PRIORITY"]

#: SCHED_RR priorities the kernel accepts (1 = lowest real-time priority, still above every
#: normal thread; the kernel's own interrupt threads run at 50).
MIN_RT_PRIORITY = 1
MAX_RT_PRIORITY = 99

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PriorityResult:
    """What `raise_write_path_priority` did to one process."""
    pid: int
    #: threads now at the real-time policy
    threads_raised: int
    #: why the process keeps its policy (the kernel's refusal, the process gone), or None
    not_raised: str | None = None


def raise_write_path_priority(pids: list[int], priority: int) -> list[PriorityResult]:
    """Puts every thread of each process in `pids` under SCHED_RR at `priority` (1-99).

    Threads that exit meanwhile are skipped; a thread started by one not yet raised is caught
    by the second pass (and later ones inherit from a raised creator). A process the kernel
    refuses (it refuses the first thread already: the privilege is the process's), or one
    that is gone, is left as it was: its result says why. Never raises for either.
    """
    if not MIN_RT_PRIORITY <= priority <= MAX_RT_PRIORITY:
        raise ValueError(f"real-time priority {priority} is not in {MIN_RT_PRIORITY}-{MAX_RT_PRIORITY}")
    return [_raise_process(pid, priority) for pid in pids]


def raise_server_and_broker(broker, priority: int) -> list[PriorityResult]:
    """This process's threads and the embedded `broker`'s (its store's too: a durable broker
    acknowledges once its store wrote) at `priority`, each outcome logged; a refusal is never fatal.
    `broker`: server/runtime/broker.py's handle, None with an external Kafka cluster (not touched)."""
    me = os.getpid()
    pids = [me] + ([broker.pid] if broker is not None else [])
    if broker is not None and broker.store_pid is not None:
        pids.append(broker.store_pid)
    results = raise_write_path_priority(pids, priority)
    for r in results:
        what = "server" if r.pid == me else "embedded broker" if r.pid == pids[1] else "embedded broker's store"
        if r.not_raised:
            _log.warning("write path: the %s (pid %d) keeps the normal CPU policy, SCHED_RR priority %d was not "
                         "set (%s); --write-path-rt-priority 0 turns this off", what, r.pid, priority, r.not_raised)
        else:
            _log.info("write path: %d thread(s) of the %s (pid %d) at SCHED_RR priority %d", r.threads_raised,
                      what, r.pid, priority)
    return results


def _raise_process(pid: int, priority: int) -> PriorityResult:
    policy = getattr(os, "SCHED_RR", None)
    tasks = f"/proc/{pid}/task"
    if policy is None:
        return PriorityResult(pid, 0, "no per-thread real-time scheduling on this platform")
    if not os.path.isdir(tasks):
        return PriorityResult(pid, 0, "no such process")
    param = os.sched_param(priority)
    done: set = set()
    for _ in range(2):
        try:
            tids = os.listdir(tasks)
        except FileNotFoundError:
            return PriorityResult(pid, len(done), "the process exited")
        for tid in tids:
            if tid in done:
                continue
            try:
                os.sched_setscheduler(int(tid), policy, param)
                done.add(tid)
            except ProcessLookupError:
                pass
            except PermissionError as e:
                return PriorityResult(pid, len(done), e.strerror or str(e))
    return PriorityResult(pid, len(done))
