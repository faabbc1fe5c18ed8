"""Build hook: generates the gRPC/protobuf stubs (package `iox`) from proto/, and
compiles the line protocol parser's C extension `server.write._lpfast`.

The stubs are never edited by hand nor committed: every build (regular or
editable) regenerates them from the .proto files, before setuptools looks for
the `iox` package (grpcio-tools is a build requirement in pyproject.toml).

`server.write._lpfast` (server/write/_lpfast.c, plain C against Python.h, no other headers)
needs a C compiler; an editable install builds it in place (server/*.so). It is
optional: without a compiler the install still succeeds and
server.write.line_protocol uses its Python path (tests/unit/server/write/test_line_protocol_c.py
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


generate()
setup(
    cmdclass={"build_py": _BuildWithStubs},
    ext_modules=[Extension("server.write._lpfast", ["server/write/_lpfast.c"], extra_compile_args=["-O3"], optional=True)],
)
