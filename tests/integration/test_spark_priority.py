"""The session server's Spark JVM and the Python workers it starts run below the write path: in
an idle cgroup where this machine allows one (root with a writable cpu controller, as here and
in CI), and at the configured nice value."""
import os
import uuid

from server.cpu_idle_group import cpu_controller_dir
from server.spark import spark_jvm_pid


def _cpu_cgroup(pid: int) -> str:
    for line in open(f"/proc/{pid}/cgroup"):
        hid, controllers, path = line.rstrip("\n").split(":", 2)
        if "cpu" in controllers.split(",") or (hid == "0" and controllers == ""):
            return path
    raise AssertionError(f"no cpu cgroup line for {pid}")


def _live_children(pid: int) -> list[int]:
    """Children of `pid` that run (not zombies: the JVM leaves a `bash` it started unreaped)."""
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = [int(c) for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
        except OSError:
            continue
        out += [k for k in kids if open(f"/proc/{k}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    return out


def test_spark_jvm_and_its_python_workers_are_in_the_idle_group(iox_server, client):
    db = f"prio_{uuid.uuid4().hex[:6]}"
    client.wait_applied(db, client.write(db, "cpu v=1 1700000000000000000\n"), timeout_s=90)  # workers started
    jvm = spark_jvm_pid(iox_server.spark)
    assert jvm is not None
    if cpu_controller_dir() is None:
        assert iox_server.cpu_idle_group is None
        return
    group = iox_server.cpu_idle_group
    assert group is not None and os.path.basename(group.path) == f"iox-spark-{os.getpid()}"
    assert open(os.path.join(group.path, "cpu.idle")).read().strip() == "1"
    want = _cpu_cgroup(jvm)
    assert want.endswith(f"/iox-spark-{os.getpid()}")
    workers = _live_children(jvm)
    assert workers, "the JVM started no Python worker"
    assert {_cpu_cgroup(w) for w in workers} == {want}
    # the server (this process) and the broker are not in it
    assert _cpu_cgroup(os.getpid()) != want
    assert os.getpriority(os.PRIO_PROCESS, jvm) == iox_server.config.spark_nice
