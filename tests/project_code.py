"""The product's code as the structure tests walk it: the repository root, its Python packages
(lowest layer first) and their modules. Tests that read the code (imports, crash points, who
writes the catalog's state) share it, so a package added to the product is walked by each."""
from __future__ import annotations

import os

__all__ = ["ROOT", "PACKAGES", "module_paths", "suite_paths"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the product's packages by their installed names (setup.py maps each to its folder; the generated
#: `iox_spark.iox` is left out), lowest first
PACKAGES = {
    "iox_spark.catalog": "catalog",
    "iox_spark.chunk_store": "chunk_store",
    "iox_spark.lifecycle": "lifecycle",
    "iox_spark.source": os.path.join("iox_spark", "source"),
    "pyspark_iox": "pyspark_iox",
    "iox_spark.server": "server",
}


def module_paths(packages=tuple(PACKAGES)) -> dict[str, str]:
    """{installed dotted module name: path} of every module of `packages` (a package by its own name)."""
    out = {}
    for pkg in packages:
        folder = os.path.join(ROOT, PACKAGES[pkg])
        for dirpath, _dirs, files in os.walk(folder):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, folder)[:-3].replace(os.sep, ".")
                    mod = pkg if rel == "__init__" else pkg + "." + rel.removesuffix(".__init__")
                    out[mod] = path
    return out


def suite_paths() -> list[str]:
    """Paths of every Python module under tests/ (the tests and their helpers)."""
    return [os.path.join(dirpath, f) for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "tests"))
            for f in sorted(files) if f.endswith(".py")]
