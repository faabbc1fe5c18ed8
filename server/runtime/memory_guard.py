"""Memory guard: the RSS of the server's whole process tree against `--memory-limit-bytes`.

What it measures: the resident memory of the server process and every process below it (the
Spark JVM, its Python workers, the streaming source's worker, an embedded broker started by this
process), plus the embedded broker and its store when the server reuses them from an earlier run
(they are not its children then), read from /proc (Linux); elsewhere through psutil when
installed. Each page is counted once: a process's proportional share (PSS, from
/proc/<pid>/smaps_rollup) splits a page its forked workers share among them, where the sum of
their RSS counted it once per worker (RSS where smaps_rollup cannot be read). Not the catalog's
size estimate: everything the kernel would count against the host.

What a sample costs: the kernel computes PSS by walking every resident page (15-20 ms of CPU per
GiB: 55-73 ms for a server tree of 3.4-3.6 GiB), where RSS (/proc/<pid>/statm) is a counter (2 ms
for the same tree). A process's RSS is never below its PSS, so the tree's RSS sum is an upper
bound: a sample first reads it, and reads PSS only when that bound reaches the soft fraction of
the limit (a state may change), or when the last PSS reading is older than `EXACT_MAX_AGE_S` (for
/metrics). The state a sample decides is the one the PSS reading would give.

States (`state`), re-evaluated at every sample:
- NORMAL: below `soft_fraction * limit`.
- THROTTLED: at or above the soft fraction: the write-buffer source takes at most
  `throttled_messages_per_partition` messages per Kafka partition per micro-batch (its read limit,
  through `throttle_file`, read by server/write_buffer/kafka_source.py), and the lifecycle policy
  unloads and persists first (`pressure()`, lifecycle/policy.py `memory_pressure`).
- REFUSING: at or above the limit: additionally `refusal()` returns MemoryLimitReached, which the
  router raises for every write (RESOURCE_EXHAUSTED / HTTP 503 with Retry-After) until a sample is
  back under the limit. Nothing acknowledged is affected: only new writes are refused.

With a limit of 0 the guard only measures (for /metrics) and never throttles or refuses.

When it runs: `start()` (by the server, after Spark started) runs a daemon thread sampling every
`interval_ms`; `stop()` (server shutdown) ends it and removes the throttle file. Driver side only.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from iox_spark.server.errors import MemoryLimitReached

__all__ = ["MemoryGuard", "NORMAL", "THROTTLED", "REFUSING", "process_tree_rss_bytes", "THROTTLE_DIVISOR",
           "RETRY_AFTER_S", "children_map"]

log = logging.getLogger(__name__)

NORMAL, THROTTLED, REFUSING = 0, 1, 2
#: under memory pressure a micro-batch takes this many times fewer messages per Kafka partition
THROTTLE_DIVISOR = 10
#: what a refused write is told to wait (Retry-After)
RETRY_AFTER_S = 1.0
#: how old the exact (PSS) figure of /metrics may get while the RSS bound keeps the tree under the
#: soft fraction of the limit (or no limit is set)
EXACT_MAX_AGE_S = 10.0


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # the command name may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        out.setdefault(int(fields[1]), []).append(int(name))
    return out


def _resident_of(pid: int, page: int, exact: bool = True) -> int:
    """The resident bytes of `pid`: its proportional share (PSS) when `exact`, else (or when PSS
    cannot be read) its RSS, which is never less; 0 when it is gone."""
    if exact:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * page
    except (OSError, IndexError, ValueError):
        return 0


def process_tree_rss_bytes(root_pid: int | None = None, extra_pids=(), exact: bool = True) -> int:
    """Resident bytes (each page once, see the module docstring) of `root_pid` (default: this
    process), all its descendants, and each of `extra_pids` with its descendants. `exact=False`:
    the sum of their RSS instead, an upper bound that costs no page walk (same value off Linux)."""
    root = os.getpid() if root_pid is None else root_pid
    if not os.path.isdir("/proc"):
        import psutil  # not Linux: psutil (optional dependency) reads the platform's tables

        p = psutil.Process(root)
        procs = [p] + p.children(recursive=True)
        for pid in extra_pids:
            try:
                e = psutil.Process(pid)
                procs += [e] + e.children(recursive=True)
            except psutil.Error:
                pass
        total = 0
        for q in procs:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
        return total
    page = os.sysconf("SC_PAGE_SIZE")
    children = children_map()
    total, stack, seen = 0, [root, *[p for p in extra_pids if p]], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _resident_of(pid, page, exact)
        stack.extend(children.get(pid, ()))
    return total


class MemoryGuard:
    """See the module docstring. `limit_bytes` and `soft_fraction` may be changed while it runs.
    `measure`: the tree's resident bytes, each page once; `bound`: a cheaper figure never below
    `measure`'s (None: every sample measures)."""

    def __init__(self, limit_bytes: int, soft_fraction: float, interval_ms: int, throttle_file: str,
                 messages_per_partition: int, measure=process_tree_rss_bytes, bound=None):
        self.limit_bytes = limit_bytes
        self.soft_fraction = soft_fraction
        self.interval_s = interval_ms / 1000.0
        self.throttle_file = throttle_file
        self.messages_per_partition = messages_per_partition
        self._measure = measure
        self._bound = bound
        #: `time.monotonic()` of the last `measure` reading (None: none yet)
        self._measured_at: float | None = None
        self.rss_bytes = 0
        self.peak_rss_bytes = 0
        self.state = NORMAL
        #: how many samples found the tree at or over the limit
        self.refusing_samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._throttled_at: int | None = None  # the cap written to throttle_file, None = no file

    @property
    def throttled_messages_per_partition(self) -> int:
        return max(1, self.messages_per_partition // THROTTLE_DIVISOR)

    def start(self) -> None:
        self.sample(time.monotonic())
        self._thread = threading.Thread(target=self._loop, name="memory-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._write_throttle(None)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample(time.monotonic())
            except Exception:  # keep sampling
                log.exception("memory guard: sampling failed")

    def sample(self, now_monotonic: float) -> int:
        """Measures once and updates the state (and the throttle file); returns the state.
        `now_monotonic`: `time.monotonic()` of the sample."""
        limit = self.limit_bytes
        soft = limit * self.soft_fraction  # at most the limit (config: 0 < soft_fraction <= 1)
        bound = self._bound() if self._bound is not None and self._measured_at is not None \
            and now_monotonic - self._measured_at < EXACT_MAX_AGE_S else None
        if bound is not None and (not limit or bound < soft):
            # the exact figure is at most the bound, so below every threshold too: the state is
            # decided on the bound, and rss_bytes keeps the last exact figure
            rss = bound
        else:
            rss = self._measure()
            self._measured_at = now_monotonic
            self.rss_bytes = rss
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if not limit:
            state = NORMAL
        elif rss >= limit:
            state = REFUSING
            self.refusing_samples += 1
        elif rss >= soft:
            state = THROTTLED
        else:
            state = NORMAL
        if state != self.state:
            (log.warning if state > self.state else log.info)(
                "memory: process tree at %d bytes of %d (%s)", rss, limit,
                ("normal", "throttling micro-batches, persisting and unloading first",
                 "refusing writes until back under")[state])
        self.state = state
        self._write_throttle(self.throttled_messages_per_partition if state != NORMAL else None)
        return state

    def _write_throttle(self, cap: int | None) -> None:
        if cap == self._throttled_at or not self.throttle_file:
            return
        if cap is None:
            try:
                os.unlink(self.throttle_file)
            except FileNotFoundError:
                pass
        else:
            tmp = f"{self.throttle_file}.tmp"
            with open(tmp, "w") as f:
                f.write(str(cap))
            os.replace(tmp, self.throttle_file)
        self._throttled_at = cap

    def pressure(self) -> bool:
        """True while throttled or refusing (the lifecycle frees memory first)."""
        return self.state != NORMAL

    def refusal(self) -> MemoryLimitReached | None:
        """The error to answer a write with while at the limit, else None."""
        if self.state != REFUSING:
            return None
        return MemoryLimitReached(self.rss_bytes, self.limit_bytes, RETRY_AFTER_S)
