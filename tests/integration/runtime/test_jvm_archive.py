"""The installation's class-data-sharing archive (server/runtime/jvm_archive.py, built by scripts/setup.sh)
is one the server's Spark JVM can map: a JVM that must share (`-Xshare:on`, which fails instead of
starting without it) starts the server's Spark application and runs a job."""
from __future__ import annotations

import os
import subprocess
import sys

from iox_spark.server.runtime.jvm_archive import archive_path
from tests.project_code import ROOT

_SCRIPT = """
import sys
from iox_spark.server.runtime.spark import build_spark
spark = build_spark("local[1]", "1g", sys.argv[1], 0, {"spark.driver.extraJavaOptions": "-Xshare:on"})
print("rows", spark.range(10).count(), flush=True)
"""


def test_the_installed_archive_maps_into_the_servers_spark_jvm(tmp_path):
    path = archive_path()
    assert path is not None and os.path.isfile(path), \
        f"no JVM archive at {path}: scripts/setup.sh builds it (python -m iox_spark.server.cli.build_jvm_archive)"
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "scratch")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "rows 10" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
