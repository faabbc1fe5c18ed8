"""A class-data-sharing (CDS) archive of the Spark JVM: every server starts faster.

Why: most of a server's start is the Spark JVM loading and verifying tens of
thousands of classes (Spark, Scala, Hadoop, Arrow). A dynamic CDS archive (Java
13+) keeps them parsed and verified in a file the JVM maps at its start.
Measured here (2 cores, a Spark session with the server's settings and its
first two jobs, three runs each): 8.5-10.8 s without the archive, 6.0-7.4 s
with it. Every start gains: `iox serve`, a restart after a crash, the tests'
servers.

Invariants:
- The archive is used, never needed: the JVM checks it (its own build, the class
  path) and runs without it when it does not match (`-Xshare:auto`, silently);
  a missing archive only means a slower start.
- A server never maps a half-written archive: the JVM that builds it dumps it to
  a temporary file when it exits, and the file is renamed into place only after
  that JVM exited.
- One archive per installation and JVM: its name carries PySpark's version, the
  Java binary (path and modification time) and the Spark home the JVM runs from
  (server/runtime/spark_home.py: the class path lies under it), so a change of
  any of them makes the next `python -m iox_spark.server.cli.build_jvm_archive` build a new one.

Who calls it: `build_spark` adds `java_options()` to the driver's JVM options;
`python -m iox_spark.server.cli.build_jvm_archive` (scripts/setup.sh, docker/Dockerfile) builds the
archive once by running a server through the demo's work (writes, queries, a
persist) with `-XX:ArchiveClassesAtExit`. `IOX_JVM_ARCHIVE` names another file,
or `off`. Driver side only; nothing here is pickled.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys

__all__ = ["ENV", "archive_path", "java_options", "DUMP_OPTION", "QUIET_CDS"]

#: Environment variable: the archive's path, or "off" (no archive is used or built).
ENV = "IOX_JVM_ARCHIVE"
#: The JVM option that dumps an archive at exit; with it in a server's JVM options no archive is used.
DUMP_OPTION = "-XX:ArchiveClassesAtExit="
#: Silences the JVM's class-data-sharing messages (a mismatched archive; every class a dump leaves out).
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _java_binary() -> str | None:
    """The `java` Spark's launcher runs: JAVA_HOME's, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.path.isfile(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def archive_path() -> str | None:
    """Where this installation's archive is (whether or not it exists); None when disabled or
    when there is no Java to build it for."""
    v = os.environ.get(ENV, "").strip()
    if v.lower() == "off":
        return None
    if v:
        return v
    java = _java_binary()
    if java is None:
        return None
    import pyspark

    from iox_spark.server.runtime import spark_home

    real = os.path.realpath(java)
    try:
        # the JVM's class path lies under the Spark home: an archive made from another is not used
        stamp = f"{real}:{os.stat(real).st_mtime_ns}:{os.environ.get(spark_home.ENV) or spark_home.path()}"
    except OSError:
        return None
    key = hashlib.sha1(stamp.encode()).hexdigest()[:12]
    return os.path.join(sys.prefix, "share", "iox", f"spark-{pyspark.__version__}-{key}.jsa")


def java_options(extra_java_options: str = "") -> str:
    """The driver JVM's options that map the archive: "" when there is none, or when
    `extra_java_options` dumps one (a JVM cannot do both)."""
    path = archive_path()
    if path is None or DUMP_OPTION in extra_java_options or not os.path.isfile(path):
        return ""
    # silently without it when it does not match this JVM (another build, another class path)
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET_CDS}"

