"""Finding the cpu controller's cgroup (fake /proc files), and moving a real process into an idle
group where this machine allows it (root with a writable cpu controller)."""
import os
import subprocess
import sys

import pytest

from server.cli import _parse_bool
from server.config import InvalidConfig, ServerConfig
from server.cpu_idle_group import CpuIdleGroup, cpu_controller_dir


def _proc_files(tmp_path, mountinfo: str, cgroup: str):
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "cgroup").write_text(cgroup)
    return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")


def test_v1_cpu_hierarchy_of_this_process(tmp_path):
    cpu = tmp_path / "cg" / "cpu" / "svc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.idle").write_text("0")
    mi, cg = _proc_files(
        tmp_path,
        f"30 25 0:26 / {tmp_path}/cg/memory rw - cgroup cgroup rw,memory\n"
        f"31 25 0:27 / {tmp_path}/cg/cpu rw,relatime - cgroup cgroup rw,cpu\n",
        "4:memory:/other\n1:cpu:/svc\n0::/\n")
    assert cpu_controller_dir(mi, cg) == str(cpu)


def test_v1_without_cpu_idle_is_not_used(tmp_path):
    (tmp_path / "cg" / "cpu").mkdir(parents=True)
    mi, cg = _proc_files(tmp_path, f"31 25 0:27 / {tmp_path}/cg/cpu rw - cgroup cgroup rw,cpu,cpuacct\n",
                         "1:cpu,cpuacct:/\n")
    assert cpu_controller_dir(mi, cg) is None


def test_v2_with_cpu_enabled_for_children(tmp_path):
    d = tmp_path / "unified" / "user.slice"
    d.mkdir(parents=True)
    (d / "cgroup.controllers").write_text("cpu io memory pids\n")
    (d / "cgroup.subtree_control").write_text("cpu memory\n")
    mi, cg = _proc_files(tmp_path, f"35 25 0:30 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n",
                         "0::/user.slice\n")
    assert cpu_controller_dir(mi, cg) == str(d)


def test_v2_without_the_cpu_controller(tmp_path):
    d = tmp_path / "unified"
    d.mkdir()
    (d / "cgroup.controllers").write_text("io memory pids\n")
    (d / "cgroup.subtree_control").write_text("memory\n")
    mi, cg = _proc_files(tmp_path, f"35 25 0:30 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n", "0::/\n")
    assert cpu_controller_dir(mi, cg) is None


def test_unreadable_proc_files_mean_no_controller(tmp_path):
    assert cpu_controller_dir(str(tmp_path / "absent"), str(tmp_path / "absent2")) is None


def test_a_real_process_moves_into_an_idle_group_or_the_reason_is_given():
    """On this machine (root, cgroup v1 cpu) the child lands in `iox-spark-<owner>` with cpu.idle 1,
    and the group is removed once the child is gone; without a writable controller, None + why."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        group, why = CpuIdleGroup.enter(child.pid, owner_pid=child.pid)
        if cpu_controller_dir() is None:
            assert group is None and why
            return
        assert group is not None, why
        assert os.path.basename(group.path) == f"iox-spark-{child.pid}"
        assert open(os.path.join(group.path, "cpu.idle")).read().strip() == "1"
        assert [int(p) for p in open(os.path.join(group.path, "cgroup.procs")).read().split()] == [child.pid]
        assert not group.remove()  # the child is still in it
    finally:
        child.kill()
        child.wait()
    assert group.remove() and not os.path.exists(group.path)


def test_stale_groups_of_dead_servers_are_removed_at_the_next_enter():
    base = cpu_controller_dir()
    if base is None:
        assert CpuIdleGroup.enter(os.getpid())[0] is None
        return
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = os.path.join(base, f"iox-spark-{dead.pid}")
    os.makedirs(stale)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        group, why = CpuIdleGroup.enter(child.pid, owner_pid=child.pid)
        assert group is not None, why
        assert not os.path.exists(stale)
    finally:
        child.kill()
        child.wait()
        group.remove()


@pytest.mark.parametrize("text,value", [("true", True), ("1", True), ("On", True), ("false", False),
                                        ("0", False), ("no", False)])
def test_spark_cpu_idle_option_values(text, value):
    assert _parse_bool(text) is value


def test_spark_cpu_idle_rejects_other_values():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        _parse_bool("maybe")
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(spark_cpu_idle="yes")
    assert ei.value.field == "spark_cpu_idle"
    assert ServerConfig().spark_cpu_idle is True
