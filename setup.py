"""Build hook: generates the gRPC/protobuf stubs (package `iox`) from proto/.

The stubs are never edited by hand nor committed: every build (regular or
editable) regenerates them from the .proto files, before setuptools looks for
the `iox` package (grpcio-tools is a build requirement in pyproject.toml).
"""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "proto"))
from build_stubs import generate  # noqa: E402


class _BuildWithStubs(build_py):
    def run(self):
        generate()
        super().run()


generate()
setup(cmdclass={"build_py": _BuildWithStubs})
