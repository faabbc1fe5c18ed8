"""The Spark JVM in a cgroup of its own whose `cpu.idle` is 1: Linux's idle scheduling class for a
whole group of processes.

Why: the write path (gRPC, parsing, the Kafka producer) and the embedded broker must keep the CPU
while Spark's consume path, compactions and queries saturate it, or write acknowledgements wait
for a core. A nice value (`--spark-nice`, and the autogroup nice of the JVM's session) lowers the
JVM's weight, but a thread of the server that wakes still waits for the running JVM thread's
slice. A group with `cpu.idle` = 1 has the smallest weight and is preempted as soon as a thread
outside it wakes. Measured under the ack-latency load (686k points/s of 5,000-point requests for
25 s on 2 cores, the experiment harness beside the bench, alternating runs): the server's threads
waited 5.1-5.8 s on the run queue (for ~11.5 CPU-s) instead of 6.9-8.0 s, ack p99 18.6-20.2 ms
in three runs against 16.3-23.4 ms in three without, and the JVM's CPU time did not drop
(19.0-19.4 CPU-s against 19.1-20.1): it ran when the write path did not need the core. With
three idle leftover servers on the machine the difference was larger: 15.4-18.9 ms in five runs
against 21.7-32.8 ms in five.

Invariant: only the JVM the server started (with the processes it started so far, and what it starts later: Python
workers, which inherit the group) is moved; the server, the broker and anything else keep their
group. The group is named for the server's pid (`iox-spark-<pid>`). It can only be removed once
empty, and the JVM exits with the server's process (end of file on its stdin), after the
server's `stop` tried: so a server, when it starts, removes the empty groups of servers that are
gone.

Where it applies: Linux with a writable cpu controller, i.e. run as root (or with a delegated
cgroup): cgroup v1's `cpu` hierarchy, or cgroup v2 where the server's cgroup may enable `cpu` for
its children. Elsewhere `enter` returns None with the reason and the nice values alone apply.
Driver side only; nothing here is pickled.
"""
from __future__ import annotations

import os

__all__ = ["CpuIdleGroup", "cpu_controller_dir"]

_PREFIX = "iox-spark-"


class CpuIdleGroup:
    """A cgroup with `cpu.idle` = 1 holding one process tree. Created by `enter`; `remove` when
    the processes are gone."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def enter(cls, pid: int, owner_pid: int | None = None, root: str | None = None) -> tuple["CpuIdleGroup | None", str]:
        """Moves process `pid` (all its threads) and the processes it started so far into a new
        idle group named for `owner_pid` (default: this process); processes it starts later are
        born in it. Returns (the group, "") or (None, why not). Called by the server right after
        it started its Spark application. `root`: the cpu controller's directory of this
        process's cgroup (default: found in /proc)."""
        owner_pid = os.getpid() if owner_pid is None else owner_pid
        base = root if root is not None else cpu_controller_dir()
        if base is None:
            return None, "no cgroup cpu controller with cpu.idle is mounted"
        _remove_stale(base)
        path = os.path.join(base, f"{_PREFIX}{owner_pid}")
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "cpu.idle"), "w") as f:
                f.write("1")
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            for child in _descendants(pid):
                try:
                    with open(os.path.join(path, "cgroup.procs"), "w") as f:
                        f.write(str(child))
                except ProcessLookupError:
                    pass  # exited meanwhile
        except OSError as e:
            _rmdir(path)
            return None, f"{path}: {e.strerror or e}"
        return cls(path), ""

    def remove(self) -> bool:
        """Removes the group; False while a process is still in it (its leftover is removed by
        the next server's `enter`)."""
        return _rmdir(self.path)


def cpu_controller_dir(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> str | None:
    """The directory of this process's cgroup in a hierarchy with the cpu controller and
    `cpu.idle` (v1 `cpu`, else v2 with `cpu` enabled or enableable below it), or None."""
    try:
        mounts = open(mountinfo).read().splitlines()
        own = open(cgroup).read().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in own:  # hierarchy-id:controllers:path
        _hid, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            v1_path = path
        elif controllers == "" and _hid == "0":
            v2_path = path
    for line in mounts:
        pre, _, post = line.partition(" - ")
        fields, post_fields = pre.split(), post.split()
        if len(fields) < 5 or len(post_fields) < 3:
            continue
        mount_root, mount_point, fstype, opts = fields[3], fields[4], post_fields[0], post_fields[2]
        if fstype == "cgroup" and v1_path is not None and "cpu" in opts.split(","):
            d = _join(mount_point, mount_root, v1_path)
            if os.path.exists(os.path.join(d, "cpu.idle")):
                return d
        elif fstype == "cgroup2" and v2_path is not None:
            d = _join(mount_point, mount_root, v2_path)
            if _v2_cpu_for_children(d):
                return d
    return None


def _join(mount_point: str, mount_root: str, path: str) -> str:
    rel = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path
    return os.path.normpath(os.path.join(mount_point, rel.lstrip("/") if rel != "." else ""))


def _v2_cpu_for_children(d: str) -> bool:
    """True when children of cgroup v2 directory `d` get the cpu controller (enabling it if
    `d` may: only a cgroup without processes of its own, or the root)."""
    try:
        if "cpu" in open(os.path.join(d, "cgroup.subtree_control")).read().split():
            return True
        if "cpu" not in open(os.path.join(d, "cgroup.controllers")).read().split():
            return False
        with open(os.path.join(d, "cgroup.subtree_control"), "w") as f:
            f.write("+cpu")
        return True
    except OSError:
        return False


def _remove_stale(base: str) -> None:
    """Removes the empty groups of servers that are gone."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        tail = name[len(_PREFIX):]
        if name.startswith(_PREFIX) and tail.isdigit() and not _alive(int(tail)):
            _rmdir(os.path.join(base, name))


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` now (children first), from /proc/<pid>/task/*/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False
