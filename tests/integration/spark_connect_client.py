"""A real remote Spark Connect client (pyspark[connect]) in a subprocess, for the tests that read a
server's tables through Spark Connect (test_spark_connect, test_persistence)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

__all__ = ["remote_sql", "run_client"]

_CLIENT = textwrap.dedent('''
    import json, sys
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    out = {}
    for name, sql in json.loads(sys.argv[2]).items():
        out[name] = [r.asDict() for r in spark.sql(sql).collect()]
    print(json.dumps(out, default=str))
''')


def run_client(url: str, queries: dict) -> subprocess.CompletedProcess:
    """The client process run on `url` (`sc://...`) with `queries` ({name: SQL}); its last line of
    output is the JSON {name: rows as dicts} when it exits with 0."""
    return subprocess.run([sys.executable, "-c", _CLIENT, url, json.dumps(queries)],
                          capture_output=True, text=True, timeout=300)


def remote_sql(port: int, queries: dict, token: str) -> dict:
    """{name: rows as dicts} of each of `queries` ({name: SQL}) run through Spark Connect at
    `sc://localhost:port` with `token`; fails the test with the client's stderr if it fails."""
    r = run_client(f"sc://localhost:{port}/;token={token}", queries)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
