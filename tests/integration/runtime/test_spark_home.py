"""The server's Spark JVM runs from the installation's Spark home (server/runtime/spark_home.py), and
the Python processes it starts import the installed, compiled PySpark instead of the zip of its
sources that Spark puts first on their path."""
from __future__ import annotations

import os

import pyspark

from iox_spark.server.runtime import spark_home


def _paths(batches):
    import sys

    import pyarrow as pa
    import pyspark as worker_pyspark

    cached = worker_pyspark.__cached__ or ""
    for b in batches:
        n = b.num_rows
        yield pa.RecordBatch.from_arrays(
            [b.column("id"), pa.array([worker_pyspark.__file__] * n), pa.array([os.path.isfile(cached)] * n),
             pa.array(["\n".join(sys.path)] * n)], names=["id", "file", "compiled", "path"])


def test_the_jvm_runs_from_the_installations_spark_home_and_workers_import_the_installed_pyspark(iox_server):
    spark = iox_server.spark
    home = spark.sparkContext._jvm.System.getenv("SPARK_HOME")
    assert home == spark_home.path(), home
    assert os.path.realpath(os.path.join(home, "jars")) == os.path.join(spark_home.pyspark_dir(), "jars")
    assert not os.path.exists(os.path.join(home, "python", "lib", "pyspark.zip"))
    assert os.environ.get("SPARK_HOME") is None  # set for the JVM's launch only
    rows = spark.range(0, 100, 1, 2).mapInArrow(_paths, "id long, file string, compiled boolean, path string").collect()
    assert sorted(r["id"] for r in rows) == list(range(100))
    installed = os.path.realpath(pyspark.__file__)
    assert {os.path.realpath(r["file"]) for r in rows} == {installed}
    assert {r["compiled"] for r in rows} == {True}
    assert not [p for r in rows for p in r["path"].split("\n") if os.path.basename(p) == "pyspark.zip"
                and os.path.exists(p)]
