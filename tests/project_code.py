"""The product's code as the structure tests walk it: the repository root, its Python packages
(lowest layer first) and their modules. Tests that read the code (imports, crash points, who
writes the catalog's state) share it, so a package added to the product is walked by each."""
from __future__ import annotations

import os

__all__ = ["ROOT", "PACKAGES", "module_paths"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the product's packages (pyproject.toml installs them, with the generated `iox`), lowest first
PACKAGES = ("catalog", "chunk_store", "lifecycle", "iox_spark_source", "pyspark_iox", "server")


def module_paths(packages=PACKAGES) -> dict[str, str]:
    """{dotted module name: path} of every module of `packages` (a package by its own name)."""
    out = {}
    for pkg in packages:
        for dirpath, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[mod[:-len(".__init__")] if mod.endswith(".__init__") else mod] = path
    return out
