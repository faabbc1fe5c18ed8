"""Spark Connect requires its token also when the server's Spark application runs in a JVM that this
process launched earlier (an earlier server's, stopped): that JVM's environment was fixed at its
launch, so the token cannot reach it there.

One process (a subprocess, so that no other test's JVM is in it) launches Spark without Spark
Connect, stops it, then builds the server's Spark with Spark Connect and a token; real remote
clients then connect with and without the token.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from iox_spark.server.runtime.broker import free_port
from tests.integration.spark_connect_client import remote_sql, run_client

_SERVER = textwrap.dedent('''
    import sys
    from pyspark.sql import SparkSession
    from iox_spark.server.runtime.spark import build_spark

    scratch, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    first = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    first.stop()
    spark = build_spark("local[1]", "1g", scratch, spark_connect_port=port, spark_connect_token=token)
    print("ready", flush=True)
    sys.stdin.read()  # serves until the test closes our stdin
    spark.stop()
''')


def test_spark_connect_requires_its_token_in_a_jvm_launched_before(tmp_path):
    port, token = free_port(), "t" * 40
    env = dict(os.environ)
    env.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(tmp_path), str(port), token],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", "the server process did not start its Spark"
        assert remote_sql(port, {"x": "SELECT 2 AS x"}, token) == {"x": [{"x": 2}]}  # serving once "ready"
        r = run_client(f"sc://127.0.0.1:{port}", {"x": "SELECT 1 AS x"})
        assert r.returncode != 0 and ("UNAUTHENTICATED" in r.stderr or "nvalid" in r.stderr), r.stderr[-2000:]
        r = run_client(f"sc://localhost:{port}/;token={'u' * 40}", {"x": "SELECT 1 AS x"})
        assert r.returncode != 0, r.stdout
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
