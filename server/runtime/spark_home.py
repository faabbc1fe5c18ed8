"""The Spark home the server's JVM runs from: PySpark's own files, without the zip of its sources.

Why: Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the path of every Python process
it starts (`PythonUtils.sparkPythonPath`: the streaming source's runner, the Python data
sources' planners, the worker daemon and its workers). For a pip-installed PySpark that zip
holds the same sources as the installed package but no compiled bytecode, so each of those
processes compiles every PySpark module it imports, and the worker daemon's per-task
`importlib.invalidate_caches()` reads the zip's directory again. Measured on this machine (one
crash-test server life: start, one write applied, three more, SIGKILL; two runs each): the Python
processes Spark starts used 9.3-9.4 core-seconds with the zip and 3.9-4.4 without it, and the
first write was applied 8.8-9.2 s after the server answered instead of 4.7-5.4 s.

This module builds, once per installation, a directory that links every entry of the installed
PySpark package (`bin`, `jars`, `sbin`, `python/pyspark/shell.py`, ...) but
`python/lib/pyspark.zip`. With it as SPARK_HOME the JVM and its scripts find what they always found, and
the Python processes import the installed package, compiled by pip, from site-packages (the
same version: it is the package the zip was made of).

Invariants:
- Used, never needed: when the directory cannot be made (a read-only installation) or the user
  set SPARK_HOME (a Spark distribution of their own), the server runs from that home, as before.
- A server never runs from a half-made directory: it is made under a temporary name and renamed
  into place; a directory whose links do not point at the installed PySpark is not used.
- Driver side only: a cluster's executors run from their own Spark home (their workers'), and
  nothing here is read by them.

Who calls it: `build_spark` (server/runtime/spark.py) sets SPARK_HOME to `ensure()` for the
launch of its JVM; `jvm_archive.archive_path` names its archive after `path()`, since the JVM's
class path lies under it.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile

__all__ = ["ENV", "path", "ensure", "pyspark_dir"]

log = logging.getLogger(__name__)

#: The environment variable Spark's launcher reads (a user's value is left alone).
ENV = "SPARK_HOME"
#: The entry of PySpark's directory left out of the home, as a relative path: its sources without bytecode.
_SOURCES_ZIP = ("python", "lib", "pyspark.zip")


def pyspark_dir() -> str:
    """The installed PySpark package's directory (its real path)."""
    import pyspark

    return os.path.realpath(os.path.dirname(pyspark.__file__))


def path() -> str:
    """Where this installation's Spark home is (whether or not it exists yet)."""
    import pyspark

    return os.path.join(sys.prefix, "share", "iox", f"spark-home-{pyspark.__version__}")


def _is_complete(home: str, source: str) -> bool:
    """`home` links PySpark's jars and launch scripts at `source`."""
    return all(os.path.realpath(os.path.join(home, name)) == os.path.join(source, name)
               for name in ("jars", "bin"))


def _link_all_but(src: str, dst: str, leave_out: tuple[str, ...]) -> None:
    """Links every entry of `src` into `dst` but the relative path `leave_out`: the directories on
    the way to it are made in `dst` and linked entry by entry, and its last entry is not linked."""
    for name in sorted(os.listdir(src)):
        if name != leave_out[0]:
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
        elif len(leave_out) > 1 and os.path.isdir(os.path.join(src, name)):
            os.mkdir(os.path.join(dst, name))
            _link_all_but(os.path.join(src, name), os.path.join(dst, name), leave_out[1:])


def ensure() -> str | None:
    """This installation's Spark home, made when missing; None when it cannot be made (the caller
    runs Spark from PySpark's own directory). Safe against servers starting at once: the first
    rename wins and the others use its directory."""
    source = pyspark_dir()
    home = path()
    if _is_complete(home, source):
        return home
    parent = os.path.dirname(home)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".spark-home-", dir=parent)
    except OSError as e:
        log.info("Spark runs from %s: %s is not writable (%s)", source, parent, e)
        return None
    try:
        os.chmod(tmp, 0o755)
        _link_all_but(source, tmp, _SOURCES_ZIP)
        if os.path.lexists(home):  # links to an earlier PySpark at this version's path: moved away
            stale = tempfile.mkdtemp(prefix=".spark-home-stale-", dir=parent)
            try:
                os.rename(home, os.path.join(stale, "home"))  # fails if a server racing here moved it first
            finally:
                shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, home)  # fails if a server racing here put its own in place first
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_complete(home, source):  # another server made it first
            return home
        log.info("Spark runs from %s: its home without the sources zip was not made (%s)", source, e)
        return None
    return home
