"""`iox serve` on its defaults runs its write path at real-time priority: the server's threads and
its embedded broker's under SCHED_RR, the Spark JVM and its Python workers under the normal
policy (server/runtime/write_path_priority.py). A real server process, a real write applied and queried."""
import os
import tempfile

from bench.harness import process_tree
from tests.crash.harness import ServerProcess, broker_record, stop_embedded_broker


def _policies(pid: int) -> set | None:
    """(policy, priority) of each thread of `pid` still alive when read, None when `pid` has exited:
    a Spark thread or a Python worker can end between the listing and the read (a CI run failed
    with ProcessLookupError on a thread that had ended)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return None
    out = set()
    for t in threads:
        try:
            out.add((os.sched_getscheduler(int(t)), os.sched_getparam(int(t)).sched_priority))
        except ProcessLookupError:
            continue
    return out


def _exe(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return os.path.basename(f.read().split(b"\0")[0].decode())


def test_serve_raises_its_threads_and_its_broker_and_leaves_spark_at_the_normal_policy():
    with tempfile.TemporaryDirectory(prefix="iox-rt-") as d:
        srv = ServerProcess(d, extra=["--write-path-rt-priority", "2"]).wait_ready()
        try:
            tok = srv.client.write("rtdb", "m,h=a v=1i 1700000000000000000\nm,h=b v=2i 1700000000000000001\n")
            srv.client.wait_applied("rtdb", tok, timeout_s=120)
            assert srv.client.query("rtdb", "SELECT h, v FROM m ORDER BY h").to_pylist() == [
                {"h": "a", "v": 1}, {"h": "b", "v": 2}]
            assert _policies(srv.proc.pid) == {(os.SCHED_RR, 2)}
            rec = broker_record(d)
            broker, store = rec["pid"], rec.get("store_pid")
            assert _policies(broker) == {(os.SCHED_RR, 2)}
            if store is not None:  # the durable broker's store takes every produce: on the write path too
                assert _policies(store) == {(os.SCHED_RR, 2)}
            spark = [p for p in process_tree(srv.proc.pid) if p not in (srv.proc.pid, broker, store)]
            assert "java" in {_exe(p) for p in spark}, spark
            assert any(_exe(p).startswith("python") for p in spark), "the micro-batch ran in a Python worker"
            for p in spark:  # each one still running: every live thread at the normal policy
                assert _policies(p) in (None, {(os.SCHED_OTHER, 0)}), p
            assert "thread(s) of the server" in srv.tail(200_000) and "thread(s) of the embedded broker" in srv.tail(200_000)
        finally:
            srv.terminate()
            stop_embedded_broker(d)
