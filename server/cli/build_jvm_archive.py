"""`python -m iox_spark.server.cli.build_jvm_archive`: builds the Spark JVM's class-data-sharing archive.

Runs a throwaway server (embedded in-memory broker, scratch data directory) through the demo's
writes and queries and a persist with the JVM option that dumps the classes it loaded
(server/runtime/jvm_archive.py says why and how a server maps the archive). The dump goes to a
temporary file that is renamed into place only after the JVM exited, so a server never maps a
half-written archive. Run once by scripts/setup.sh and docker/Dockerfile; driver side only.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from iox_spark.server.runtime.jvm_archive import DUMP_OPTION, ENV, QUIET_CDS, archive_path

__all__ = ["build", "main"]

#: How long the building JVM may take to dump the archive and exit after the server stopped.
_JVM_EXIT_TIMEOUT_S = 180
#: The database the build writes to (a scratch data directory, deleted afterwards).
_BUILD_DATABASE = "jvm_archive"


def build(path: str) -> bool:
    """Builds the archive at `path`: runs a server (embedded broker, scratch data directory)
    through writes, the demo's queries and a persist with DUMP_OPTION, stops it cleanly and waits
    for its JVM to dump the archive and exit. True when the archive is in place."""
    from iox_spark.server.app import IoxServer
    from iox_spark.server.runtime.broker import free_port
    from iox_spark.server.api.client import IoxClient
    from iox_spark.server.config import ServerConfig
    from iox_spark.server.cli.demo import _QUERIES, SAMPLE_LINE_PROTOCOL

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    data_dir = tempfile.mkdtemp(prefix="iox-jvm-archive-")
    port = free_port()
    cfg = ServerConfig(grpc_port=port, http_port=0, data_dir=data_dir, driver_memory="1g", bind_host="127.0.0.1",
                       spark_connect_port=0, broker_storage="memory",  # a throwaway server
                       # the dump warns about every class it leaves out (generated, signed JARs): quiet
                       extra_spark_conf={"spark.driver.extraJavaOptions": f"{DUMP_OPTION}{tmp} {QUIET_CDS}"})
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
    """`python -m iox_spark.server.cli.build_jvm_archive [--path] [--force]`: prints the archive's path (--path), or
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
