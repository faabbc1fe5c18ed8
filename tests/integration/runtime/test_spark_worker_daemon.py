"""The server's Python workers come from server/runtime/spark_worker_daemon.py and their sockets to the
JVM have TCP_NODELAY set; a mapInArrow through them returns exactly its rows."""
from __future__ import annotations


def _inspect(batches):
    import os
    import socket
    import stat

    import pyarrow as pa

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    nodelay = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with s:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                nodelay.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    for b in batches:
        n = b.num_rows
        yield pa.RecordBatch.from_arrays(
            [b.column("id"), pa.array([parent] * n), pa.array([min(nodelay) if nodelay else -1] * n)],
            names=["id", "parent", "nodelay"])


def test_python_workers_run_under_the_daemon_with_nodelay_sockets(iox_server):
    spark = iox_server.spark
    assert spark.conf.get("spark.python.daemon.module") == "iox_spark.server.runtime.spark_worker_daemon"
    rows = spark.range(0, 1000, 1, 2).mapInArrow(_inspect, "id long, parent string, nodelay long").collect()
    assert sorted(r["id"] for r in rows) == list(range(1000))
    assert {r["parent"].split()[-2] for r in rows} == {"iox_spark.server.runtime.spark_worker_daemon"}, {r["parent"] for r in rows}
    assert {r["nodelay"] for r in rows} == {1}
