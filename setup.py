"""Build hook: generates the gRPC/protobuf stubs (package `iox_spark.iox`) from proto/, compiles the
line protocol parser's C extension `iox_spark.server.write._lpfast`, and installs the repository's
folders under the one root package `iox_spark` (`_PACKAGE_DIRS`).

The stubs are never edited by hand nor committed: every build (regular or
editable) regenerates them from the .proto files, before setuptools looks for
the `iox_spark.iox` package (grpcio-tools is a build requirement in pyproject.toml).

`iox_spark.server.write._lpfast` (server/write/_lpfast.c, plain C against Python.h, no other headers)
needs a C compiler; an editable install builds it in place (server/*.so). It is
optional: without a compiler the install still succeeds and
iox_spark.server.write.line_protocol uses its Python path (tests/unit/server/write/test_line_protocol_c.py
fails then, so CI notices).
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "proto"))
from build_stubs import generate  # noqa: E402


class _BuildWithStubs(build_py):
    def run(self):
        generate()
        super().run()


#: where each installed package's code lives in the repository: one root package, `iox_spark`, so that
#: nothing generic (`server`, `catalog`, ...) lands at the top of site-packages; `pyspark_iox` stays at the
#: top because Spark registers the data source of each top-level `pyspark_*` module by itself
_PACKAGE_DIRS = {
    "iox_spark": "iox_spark",
    "iox_spark.catalog": "catalog",
    "iox_spark.chunk_store": "chunk_store",
    "iox_spark.lifecycle": "lifecycle",
    "iox_spark.server": "server",
    "pyspark_iox": "pyspark_iox",
}


def _packages() -> list:
    """Every package under `_PACKAGE_DIRS` (a folder with an `__init__.py`), by its installed name."""
    root = os.path.dirname(os.path.abspath(__file__))
    out = []
    for name, folder in _PACKAGE_DIRS.items():
        for dirpath, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, os.path.join(root, folder))
                out.append(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return out


generate()
setup(
    cmdclass={"build_py": _BuildWithStubs},
    package_dir=_PACKAGE_DIRS,
    packages=_packages(),
    ext_modules=[Extension("iox_spark.server.write._lpfast", ["server/write/_lpfast.c"], extra_compile_args=["-O3"], optional=True)],
)
