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
- One archive per installation and JVM: its name carries PySpark's version and
  the Java binary (path and modification time), so an upgrade of either makes
  the next `python -m server.jvm_archive` build a new one.

Who calls it: `build_spark` adds `java_options()` to the driver's JVM options;
`python -m server.jvm_archive` (scripts/setup.sh, docker/Dockerfile) builds the
archive once by running a server through the demo's work (writes, queries, a
persist) with `-XX:ArchiveClassesAtExit`. `IOX_JVM_ARCHIVE` names another file,
or `off`. Driver side only; nothing here is pickled.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile

__all__ = ["ENV", "archive_path", "java_options", "build", "DUMP_OPTION"]

#: Environment variable: the archive's path, or "off" (no archive is used or built).
ENV = "IOX_JVM_ARCHIVE"
#: The JVM option that dumps an archive at exit; with it in a server's JVM options no archive is used.
DUMP_OPTION = "-XX:ArchiveClassesAtExit="
#: Silences the JVM's class-data-sharing messages (a mismatched archive; every class a dump leaves out).
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: How long the building JVM may take to dump the archive and exit after the server stopped.
_JVM_EXIT_TIMEOUT_S = 180
#: The database the build writes to (a scratch data directory, deleted afterwards).
_BUILD_DATABASE = "jvm_archive"


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

    real = os.path.realpath(java)
    try:
        stamp = f"{real}:{os.stat(real).st_mtime_ns}"
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
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {_QUIET_CDS}"


def build(path: str) -> bool:
    """Builds the archive at `path`: runs a server (embedded broker, scratch data directory)
    through writes, the demo's queries and a persist with DUMP_OPTION, stops it cleanly and waits
    for its JVM to dump the archive and exit. True when the archive is in place."""
    from .app import IoxServer
    from .broker import free_port
    from .client import IoxClient
    from .config import ServerConfig
    from .demo import _QUERIES, SAMPLE_LINE_PROTOCOL

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    data_dir = tempfile.mkdtemp(prefix="iox-jvm-archive-")
    port = free_port()
    cfg = ServerConfig(grpc_port=port, http_port=0, data_dir=data_dir, driver_memory="1g", bind_host="127.0.0.1",
                       spark_connect_port=0, broker_storage="memory",  # a throwaway server
                       # the dump warns about every class it leaves out (generated, signed JARs): quiet
                       extra_spark_conf={"spark.driver.extraJavaOptions": f"{DUMP_OPTION}{tmp} {_QUIET_CDS}"})
    server = IoxServer(cfg)
    jvm = None
    try:
        server.start()
        jvm = getattr(getattr(server.spark.sparkContext, "_gateway", None), "proc", None)
        with IoxClient(f"127.0.0.1:{port}") as client:
            client.wait_ready()
            client.wait_applied(_BUILD_DATABASE, client.write(_BUILD_DATABASE, SAMPLE_LINE_PROTOCOL), timeout_s=120)
            for _title, sql in _QUERIES:
                client.query(_BUILD_DATABASE, sql)
            client.persist(_BUILD_DATABASE, timeout_s=120)
            for _title, sql in _QUERIES:
                client.query(_BUILD_DATABASE, sql)
    finally:
        server.stop()
        if jvm is not None:  # the JVM exits on end of file on its stdin, dumping the archive first
            try:
                jvm.stdin.close()
            except OSError:
                pass
            jvm.wait(_JVM_EXIT_TIMEOUT_S)
        shutil.rmtree(data_dir, ignore_errors=True)
    if jvm is None or jvm.returncode != 0 or not os.path.isfile(tmp) or os.path.getsize(tmp) == 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        return False
    os.replace(tmp, path)
    return True


def main(argv=None) -> int:
    """`python -m server.jvm_archive [--path] [--force]`: prints the archive's path (--path), or
    builds it unless it exists (--force: again). Exit 0 when it is in place, 1 when it could not be
    built, 2 when archives are off or there is no Java."""
    args = sys.argv[1:] if argv is None else argv
    path = archive_path()
    if path is None:
        print(f"no JVM archive ({ENV}=off, or no java found)", file=sys.stderr)
        return 2
    if "--path" in args:
        print(path)
        return 0
    if os.path.isfile(path) and "--force" not in args:
        print(f"JVM archive in place: {path}")
        return 0
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if build(path):
        print(f"JVM archive built: {path} ({os.path.getsize(path) >> 20} MiB)")
        return 0
    print("JVM archive not built: servers start without it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
