"""`iox demo`: the main job on embedded defaults.

Starts a server (embedded Tansu broker, Spark local[*], objects in a local
directory), writes a sample line-protocol data set through the gRPC API, waits
until the write token is applied, runs Spark SQL queries and prints them, then
shuts down cleanly (unless --keep-running).
"""
from __future__ import annotations

import tempfile
import time

__all__ = ["run_demo", "SAMPLE_LINE_PROTOCOL"]

_T0 = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z

SAMPLE_LINE_PROTOCOL = "\n".join(
    [f"cpu,host=server{h:02d},region={'us-west' if h % 2 else 'eu-central'} "
     f"usage_user={10 + h * 1.5 + i * 0.25},usage_system={2 + h * 0.5},procs={100 + h + i}i "
     f"{_T0 + i * 10_000_000_000}" for h in range(1, 5) for i in range(6)]
    + [f"mem,host=server{h:02d} used_bytes={1_000_000 * h}u,swapping={'true' if h == 3 else 'false'} {_T0}"
       for h in range(1, 5)]
    + ['events,source=api message="user \\"alice\\" logged in",level="info" ' + str(_T0),
       'events,source=batch message="nightly job done",level="info" ' + str(_T0 + 1_000_000_000)]
    # a repeated point: the same series and time, written later, wins field by field
    + [f"cpu,host=server01,region=us-west usage_user=99.5 {_T0}"]
) + "\n"

_QUERIES = [
    ("Average CPU per host (the point at T0 of server01 was overwritten: last write wins)",
     "SELECT host, region, count(*) AS points, round(avg(usage_user), 2) AS avg_user, max(procs) AS max_procs "
     "FROM cpu GROUP BY host, region ORDER BY host"),
    ("Memory (unsigned integers and booleans)", "SELECT host, used_bytes, swapping, time FROM mem ORDER BY host"),
    ("Events (escaped strings)", "SELECT source, level, message, time_ns FROM events ORDER BY time_ns"),
]


def _show_iceberg(server, client, data_dir: str) -> None:
    """Persists the demo database and reads the Apache Iceberg table it is published to, as a user
    of pyiceberg would (lifecycle/iceberg_publication.py)."""
    from iox_spark.lifecycle.iceberg_publication import CATALOG_NAME, catalog_properties

    if server.iceberg is None:
        return
    client.persist("demo")
    revision = server.lifecycle.preserved["demo"].revision
    deadline = time.monotonic() + 60
    while (server.iceberg.publisher.published_revision("demo") or -1) < revision:
        if time.monotonic() > deadline:
            print("== the Iceberg publication did not catch up within 60 s (see the log)", flush=True)
            return
        time.sleep(0.1)
    from pyiceberg.catalog import load_catalog

    props = catalog_properties(server.config.iceberg_catalog, data_dir, server.store,
                               pool=server.config.pool_member is not None)
    tbl = load_catalog(CATALOG_NAME, **props).load_table(("demo", "cpu"))
    rows = tbl.scan(selected_fields=("host", "usage_user", "time_ns")).to_arrow().num_rows
    print(f"\n== persisted; published as Apache Iceberg: pyiceberg reads {rows} rows of demo.cpu from "
          f"load_catalog({CATALOG_NAME!r}, type='sql', uri={props['uri']!r})", flush=True)


def run_demo(data_dir: str | None, grpc_port: int, keep_running: bool) -> int:
    import logging

    from iox_spark.server.runtime.broker import free_port
    from iox_spark.server.cli.output import print_table
    from iox_spark.server.api.client import IoxClient
    from iox_spark.server.config import DEFAULT_SPARK_CONNECT_PORT, ServerConfig
    from iox_spark.server.app import IoxServer

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir = data_dir or tempfile.mkdtemp(prefix="iox-demo-")
    port = grpc_port or free_port()
    cfg = ServerConfig(grpc_port=port, data_dir=data_dir, driver_memory="2g", bind_host="127.0.0.1",
                       spark_connect_port=DEFAULT_SPARK_CONNECT_PORT if keep_running else 0)
    print(f"== starting iox (data dir {data_dir}, gRPC port {port}; embedded Kafka broker, Spark local[*])",
          flush=True)
    t0 = time.monotonic()
    server = IoxServer(cfg)
    try:
        server.start()
        print(f"== server up in {time.monotonic() - t0:.1f}s", flush=True)
        with IoxClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            n = SAMPLE_LINE_PROTOCOL.count("\n")
            t1 = time.monotonic()
            token = client.write("demo", SAMPLE_LINE_PROTOCOL)
            print(f"== wrote {n} points to database 'demo' through gRPC; write token "
                  f"(Kafka partition -> offset): {dict(sorted(token.items()))}", flush=True)
            client.wait_applied("demo", token, timeout_s=120)
            print(f"== queryable after {time.monotonic() - t1:.2f}s", flush=True)
            for title, sql in _QUERIES:
                print(f"\n-- {title}\n   {sql}", flush=True)
                print_table(client.query("demo", sql), "table")
            _show_iceberg(server, client, data_dir)
        if keep_running:
            print(f"\n== serving on 127.0.0.1:{port}; Spark Connect: "
                  f"sc://localhost:{DEFAULT_SPARK_CONNECT_PORT}/;token={server.spark_connect_token}"
                  f" (also printed by `iox spark-connect-url --data-dir {data_dir}`); Ctrl-C stops", flush=True)
            server.wait()
    finally:
        server.stop()
    print("== demo done", flush=True)
    return 0
