"""Spark Connect inside the server's Spark application: remote clients see every table as
`global_temp.<database>__<table>`, with exactly the rows `iox sql` gives.

The client runs in a subprocess (a real remote Spark Connect client, pyspark[connect]).
"""
from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import urllib.parse

from tests.integration.spark_connect_client import remote_sql, run_client
from tests.waiting import wait_for
from tests.timestamps import T0


def _http_jsonl(server, db: str, sql: str) -> tuple:
    """(status, body) of the HTTP query `sql` on `db`, answered as JSON lines."""
    conn = http.client.HTTPConnection("127.0.0.1", server.config.http_port, timeout=60)
    try:
        conn.request("GET", f"/api/v3/query_sql?{urllib.parse.urlencode({'db': db, 'q': sql, 'format': 'jsonl'})}")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_spark_connect_sees_two_databases_like_iox_sql(iox_server, client, db):
    port = iox_server.config.spark_connect_port
    assert port
    db2 = db + "_b"
    t1 = client.write(db, "\n".join(f"cpu,host=h{i % 3} v={i} {T0 + i}" for i in range(30)))
    t2 = client.write(db2, "\n".join(f"mem,host=h{i % 2} used={i}i {T0 + i}" for i in range(10)))
    client.wait_applied(db, t1, timeout_s=90)
    client.wait_applied(db2, t2, timeout_s=90)
    q1 = "SELECT host, count(*) AS n, sum(v) AS s FROM {} GROUP BY host ORDER BY host"
    q2 = "SELECT host, sum(used) AS u FROM {} GROUP BY host ORDER BY host"

    stop = threading.Event()

    def keep_writing():  # writes continue while the remote client queries
        i = 0
        while not stop.is_set() and i < 50:
            client.write(db + "_c", f"bg v={i} {T0 + i}\n")
            i += 1

    w = threading.Thread(target=keep_writing)
    w.start()
    try:
        remote = remote_sql(port, {"cpu": q1.format(f"global_temp.`{db}__cpu`"),
                                "mem": q2.format(f"global_temp.`{db2}__mem`")}, iox_server.spark_connect_token)
    finally:
        stop.set()
        w.join()
    ours_cpu = client.query(db, q1.format("cpu")).to_pylist()
    ours_mem = client.query(db2, q2.format("mem")).to_pylist()
    assert remote["cpu"] == ours_cpu == [{"host": f"h{h}", "n": 10, "s": float(sum(range(h, 30, 3)))}
                                         for h in range(3)]
    assert remote["mem"] == ours_mem == [{"host": "h0", "u": 20}, {"host": "h1", "u": 25}]

    # after a persist (the view is swapped to the persisted chunk) the answer is the same
    client.persist(db)
    remote = remote_sql(port, {"cpu": q1.format(f"global_temp.`{db}__cpu`")}, iox_server.spark_connect_token)
    assert remote["cpu"] == ours_cpu


def test_remote_query_running_across_a_view_swap_completes_consistently(iox_server, client, db):
    """A slow remote query plans against the current chunks; a persist swaps the table view while it
    runs; the query still completes with the answer of the moment it was planned."""
    port = iox_server.config.spark_connect_port
    tok = client.write(db, "\n".join(f"cpu,host=h{i % 3} v={i} {T0 + i}" for i in range(30)))
    client.wait_applied(db, tok, timeout_s=90)
    slow = (f"SELECT count(*) AS n, sum(c.v) AS s FROM global_temp.`{db}__cpu` c "
            f"CROSS JOIN (SELECT id FROM range(20000000)) r")
    result = {}

    def run():
        result.update(remote_sql(port, {"slow": slow}, iox_server.spark_connect_token))

    t = threading.Thread(target=run)
    t.start()
    import time

    tracker = iox_server.spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 120
    while not tracker.getActiveJobsIds():  # the remote query is running in the server's Spark
        assert t.is_alive() and time.monotonic() < deadline, "the remote query never started"
        time.sleep(0.05)
    client.persist(db)  # swaps the view to the persisted chunk and retires the old ones
    t.join(300)
    assert result["slow"] == [{"n": 30 * 20_000_000, "s": float(sum(range(30))) * 20_000_000}]
    assert client.query(db, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 30}]


def test_spark_connect_is_never_served_without_a_token(iox_server, tmp_path):
    """The session's server has no --auth-token: it generated one, kept (0600) in its data directory;
    `iox spark-connect-url` prints the URL with it; a client without it is refused."""
    import os
    import stat

    data_dir = iox_server.config.abs_data_dir
    path = os.path.join(data_dir, "spark-connect.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    iox = os.path.join(os.path.dirname(sys.executable), "iox")
    r = subprocess.run([iox, "spark-connect-url", "--data-dir", data_dir], capture_output=True, text=True, timeout=60)
    port = iox_server.config.spark_connect_port
    assert r.returncode == 0 and r.stdout.strip() == f"sc://localhost:{port}/;token={iox_server.spark_connect_token}"
    assert len(iox_server.spark_connect_token) >= 32
    r = run_client(f"sc://127.0.0.1:{port}", {"x": "SELECT 1 AS x"})
    assert r.returncode != 0 and ("UNAUTHENTICATED" in r.stderr or "nvalid" in r.stderr), r.stderr[-2000:]
    r = subprocess.run([iox, "spark-connect-url", "--data-dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("error: no Spark Connect record")


def test_the_views_apply_retention_like_iox_sql(iox_server, client, db):
    """A database's retention hides the same rows from a Spark Connect client as from `iox sql`, in
    memory and persisted, from the moment it is set; removing it shows them again."""
    import time

    port, day_ns = iox_server.config.spark_connect_port, 86_400 * 10**9
    now = time.time_ns()
    tok = client.write(db, f"cpu,host=a v=1 {now - 3 * day_ns}\ncpu,host=b v=2 {now - 3600 * 10**9}\n")
    client.wait_applied(db, tok, timeout_s=90)
    client.persist(db)
    tok = client.write(db, f"cpu,host=c v=3 {now - 2 * day_ns}\ncpu,host=d v=4 {now - 60 * 10**9}\n")
    client.wait_applied(db, tok, timeout_s=90)
    q = "SELECT host, v FROM {} ORDER BY host"
    view = f"global_temp.`{db}__cpu`"
    everything = [{"host": h, "v": float(i + 1)} for i, h in enumerate("abcd")]
    assert remote_sql(port, {"q": q.format(view)}, iox_server.spark_connect_token)["q"] == everything
    lifecycle = iox_server.lifecycle
    lifecycle.prune_delay_s = 10 * 86_400.0  # hidden, not pruned: removing the retention shows them again
    try:
        client.set_retention(db, 86_400)
        recent = [{"host": "b", "v": 2.0}, {"host": "d", "v": 4.0}]
        assert client.query(db, q.format("cpu")).to_pylist() == recent
        assert remote_sql(port, {"q": q.format(view)}, iox_server.spark_connect_token)["q"] == recent
        client.set_retention(db, 0)
    finally:
        lifecycle.prune_delay_s = iox_server.config.prune_delay_s
    assert client.query(db, q.format("cpu")).to_pylist() == everything
    assert remote_sql(port, {"q": q.format(view)}, iox_server.spark_connect_token)["q"] == everything


def test_a_remote_client_replacing_or_dropping_a_table_view_does_not_change_what_queries_read(
        iox_server, client, db):
    """The gRPC and HTTP query path reads the views this server made, not the global ones by name: a
    Spark Connect client that replaces or drops `global_temp.<database>__<table>` changes what it
    reads itself, until the table's next change, and nothing else."""
    port = iox_server.config.spark_connect_port
    tok = client.write(db, "\n".join(f"cpu,host=h{i % 2} v={i} {T0 + i}" for i in range(10)) + "\n"
                           f"mem,host=a used=7i {T0}")
    client.wait_applied(db, tok, timeout_s=90)
    client.persist(db)  # persisted chunks: queries read the table views, not the local rows
    q_cpu, q_mem = "SELECT host, sum(v) AS s FROM cpu GROUP BY host ORDER BY host", "SELECT used FROM mem"
    expect_cpu, expect_mem = [{"host": "h0", "s": 20.0}, {"host": "h1", "s": 25.0}], [{"used": 7}]
    assert client.query(db, q_cpu).to_pylist() == expect_cpu and client.query(db, q_mem).to_pylist() == expect_mem
    remote = remote_sql(port, {
        "replace": f"CREATE OR REPLACE GLOBAL TEMP VIEW `{db}__cpu` AS SELECT 'x' AS host, CAST(1 AS DOUBLE) AS v",
        "drop": f"DROP VIEW global_temp.`{db}__mem`",
        "cpu": f"SELECT host, sum(v) AS s FROM global_temp.`{db}__cpu` GROUP BY host"},
        iox_server.spark_connect_token)
    assert remote["cpu"] == [{"host": "x", "s": 1.0}]  # the client reads what it made
    assert client.query(db, q_cpu).to_pylist() == expect_cpu
    assert client.query(db, q_mem).to_pylist() == expect_mem
    assert _http_jsonl(iox_server, db, "SELECT used FROM mem") == (200, b'{"used": 7}\n')
    # the table's next change makes its view again
    client.wait_applied(db, client.write(db, f"cpu,host=h0 v=100 {T0 + 100}"), timeout_s=90)
    client.persist(db)
    wait_for(lambda: remote_sql(port, {"cpu": f"SELECT sum(v) AS s FROM global_temp.`{db}__cpu`"},
                             iox_server.spark_connect_token)["cpu"] == [{"s": 145.0}], 60, "the view made again")


def test_a_remote_client_neither_sees_nor_changes_the_chunk_views_queries_read(iox_server, client, db):
    """The chunk views the gRPC and HTTP query path reads are temp views of the server's own session
    (chunk_store/chunk_views.py): a Spark Connect client finds none of them, in its session or in
    `global_temp`, and dropping or replacing one by name changes only its own session."""
    port = iox_server.config.spark_connect_port
    tok = client.write(db, "\n".join(f"cpu,host=h{i % 2} v={i} {T0 + i}" for i in range(10)))
    client.wait_applied(db, tok, timeout_s=90)
    client.persist(db)  # persisted chunks: queries read the chunk views, not the local rows
    dbo = iox_server.catalog.database(db)
    names = sorted(c.view for c in iox_server.catalog.table_chunks(dbo, "cpu") if c.view is not None)
    assert names
    q = "SELECT host, sum(v) AS s FROM cpu GROUP BY host ORDER BY host"
    expect = [{"host": "h0", "s": 20.0}, {"host": "h1", "s": 25.0}]
    assert client.query(db, q).to_pylist() == expect
    statements = {"global": "SHOW VIEWS IN global_temp", "own": "SHOW VIEWS"}
    for i, name in enumerate(names):
        statements[f"drop{i}"] = f"DROP VIEW IF EXISTS `{name}`"
        statements[f"dropg{i}"] = f"DROP VIEW IF EXISTS global_temp.`{name}`"
        statements[f"replace{i}"] = f"CREATE OR REPLACE TEMP VIEW `{name}` AS SELECT 'x' AS host"
        statements[f"replaceg{i}"] = f"CREATE OR REPLACE GLOBAL TEMP VIEW `{name}` AS SELECT 'x' AS host"
    remote = remote_sql(port, statements, iox_server.spark_connect_token)
    seen = {r["viewName"] for r in remote["global"] + remote["own"]}
    assert not {v for v in seen if v.startswith(("iox_chunk_", "iox_merge_"))}, seen
    assert f"{db}__cpu" in seen  # the table view Spark Connect reads
    assert client.query(db, q).to_pylist() == expect
    assert _http_jsonl(iox_server, db, "SELECT count(*) AS n FROM cpu") == (200, b'{"n": 10}\n')
    # the global views the client made under those names are its own, and the server's table view
    # still reads the server's chunks
    assert remote_sql(port, {"cpu": f"SELECT count(*) AS n FROM global_temp.`{db}__cpu`"},
                   iox_server.spark_connect_token)["cpu"] == [{"n": 10}]
    for name in names:
        iox_server.spark.catalog.dropGlobalTempView(name)  # the client's
