"""SIGKILL between a downsampler's writes and the record of its progress (crash point
downsample_before_progress), twice: the next start emits the same windows again (they overwrite,
never add up) and then follows new writes, late points and deletes. Real `iox serve` processes; the
output is compared, exactly, with a plain-Python aggregation of what was acknowledged."""
from __future__ import annotations

import uuid

from iox_spark.catalog.crash_points import CrashPoint
from tests.crash.harness import ServerProcess
from tests.downsamplers import databases, downsampler, emitted_through
from tests.timestamps import S, T0
from tests.waiting import wait_for

EVERY_S = 5


def _want(points: dict) -> dict:
    groups: dict = {}
    for (host, t), v in points.items():
        groups.setdefault((host, t - t % (EVERY_S * S)), []).append(v)
    return {k: (sum(vs), len(vs)) for k, vs in groups.items()}


def _emitted(client, name: str, src: str, dest: str, points: dict) -> bool:
    through = {kp: hi + 1 for kp, hi in client.applied(src).items() if hi >= 0}
    d = downsampler(client, name)
    if d is None or not d["progress"] or dest not in databases(client) \
            or not emitted_through(client, name, dest, through):
        return False
    rows = client.query(dest, "SELECT * FROM cpu_5s").to_pylist()
    return {(r["host"], r["time_ns"]): (r["sum_v"], r["count_v"]) for r in rows} == _want(points)


def test_a_kill_before_the_progress_is_recorded_emits_the_same_windows_again(data_dir):
    src = f"d_{uuid.uuid4().hex[:8]}"
    dest, name = f"{src}_ds", f"{src}_ds.cpu_5s"
    points = {(h, T0 + s * S): s + (100 if h == "b" else 0) for h in ("a", "b") for s in range(20)}
    s1 = ServerProcess(data_dir, crash_at=CrashPoint.DOWNSAMPLE_BEFORE_PROGRESS).wait_ready()
    s1.client.write(src, "\n".join(f"cpu,host={h} v={v}i {t}" for (h, t), v in points.items()))
    s1.client.create_downsampler(src, "cpu", f"{EVERY_S}s", "sum(v),count(v)", dest)
    s1.wait_exit(60)  # its first round wrote every window, then died
    assert s1.proc.returncode == -9, s1.tail()
    s2 = ServerProcess(data_dir, crash_at=CrashPoint.DOWNSAMPLE_BEFORE_PROGRESS)
    try:  # the backfill again (no progress was recorded), and the same death: maybe before it is ready
        s2.wait_ready()
    except AssertionError:
        pass
    s2.wait_exit(60)
    assert s2.proc.returncode == -9, s2.tail()
    s3 = ServerProcess(data_dir).wait_ready()
    try:
        wait_for(lambda: _emitted(s3.client, name, src, dest, points), 90, "the windows emitted once more")
        late = {("a", T0 + 2 * S): 1000, ("c", T0 + 7 * S): 7, ("a", T0 + 31 * S): 31}
        s3.client.write(src, "\n".join(f"cpu,host={h} v={v}i {t}" for (h, t), v in late.items()))
        points.update(late)
        s3.client.delete(src, T0 + 10 * S, T0 + 15 * S, "host='b'", table="cpu")
        points = {k: v for k, v in points.items() if not (k[0] == "b" and T0 + 10 * S <= k[1] < T0 + 15 * S)}
        wait_for(lambda: _emitted(s3.client, name, src, dest, points), 90, "the late points and the delete emitted")
    finally:
        s3.kill()
