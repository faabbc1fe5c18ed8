"""server/runtime/spark.py: what the Spark session is sized by."""
from __future__ import annotations

import os
import subprocess
import sys

from iox_spark.server.runtime.spark import usable_cpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def test_usable_cpus_are_the_affinity_not_the_hosts_cores():
    assert usable_cpus() == len(os.sched_getaffinity(0))
    one = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", "from server.runtime.spark import usable_cpus; print(usable_cpus())"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {one}))
    assert out.stdout.strip() == "1"
