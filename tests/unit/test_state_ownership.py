"""The catalog owns its state: no module outside catalog/ assigns a field of a `Database`, a
`TablePartition` or a `Chunk`, deletes one or mutates one in place (a dict's or list's own
methods); it calls their operations (`hold`, `adopt_claim`, `record_lost_writes`, `hold_for`,
`record_persist`, `unload`, ...) instead, and never takes the catalog's lock (private, `_lock`):
a read or change at one instant is an operation that takes the lock itself. A Catalog's own
attributes (`pool_member`, `late_arrive_window_s`, ...) are set by its constructor and operations
only. Tests outside the catalog's own unit tests do neither: they set a catalog up through the
same operations.

Walks every module of the project's packages outside catalog/ (AST) and finds, for each name
of a field, an assignment to `X.<field>` (also `X.<field>[k] = ...`, `+=`, `del`) or a call
`X.<field>.<mutator>(...)`, where X is spelled as the catalog's code spells such an object: a
database `db`, `database` or `*_db`; a partition `part`, `partition` or `*_part`; a chunk `chunk`,
`c`, `*_chunk` or an item of `chunks`. The fields that hold catalog objects with operations of
their own (`deletes`, `txns`, `schemas`, `windows`) may have those called.
"""
from __future__ import annotations

import ast
import dataclasses
import os

from iox_spark.catalog.catalog import Catalog, Database, TablePartition
from iox_spark.catalog.chunk import Chunk
from tests.project_code import PACKAGES, ROOT, module_paths, suite_paths

FIELDS = {f.name for f in dataclasses.fields(Database)}
PARTITION_FIELDS = {f.name for f in dataclasses.fields(TablePartition)}
CHUNK_FIELDS = {f.name for f in dataclasses.fields(Chunk)}
#: what a Catalog holds (its attributes and properties), spelled `catalog`, `_catalog` or `cat`
CATALOG_FIELDS = set(vars(Catalog())) | {n for n, v in vars(Catalog).items() if isinstance(v, property)}
_MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
             "discard", "sort", "reverse"}
_OWN_OPERATIONS = {"deletes", "txns", "schemas", "windows"}


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _is_database(node: ast.AST) -> bool:
    name = _name(node)
    return name in ("db", "database") or name.endswith("_db")


def _is_partition(node: ast.AST) -> bool:
    name = _name(node)
    return name in ("part", "partition") or name.endswith("_part")


def _is_chunk(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript):
        return _name(node.value) == "chunks"
    name = _name(node)
    return name in ("chunk", "c") or name.endswith("_chunk")


def _is_catalog(node: ast.AST) -> bool:
    return _name(node) in ("catalog", "_catalog", "cat")


#: (fields, whether a node is such an object) of each kind of catalog object
_KINDS = ((FIELDS, _is_database), (PARTITION_FIELDS, _is_partition), (CHUNK_FIELDS, _is_chunk),
          (CATALOG_FIELDS, _is_catalog))


def _field_of(node: ast.AST) -> str | None:
    """The catalog object's field `node` (with any subscripts) names, or None."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        for fields, is_owner in _KINDS:
            if node.attr in fields and is_owner(node.value):
                return node.attr
    return None


def writes_outside_catalog(source: str) -> list[tuple[int, str]]:
    """(line, what) of every write of a Database, TablePartition or Chunk field in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                name = _field_of(el)
                if name is not None:
                    out.append((node.lineno, f"assigns {name}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            name = _field_of(node.func.value)
            if name is not None and name not in _OWN_OPERATIONS:
                out.append((node.lineno, f"{name}.{node.func.attr}(...)"))
    return out


def _modules():
    """Paths of every module outside catalog/."""
    return [p for m, p in module_paths(tuple(pkg for pkg in PACKAGES if pkg != "iox_spark.catalog")).items()]


def _tests():
    """Paths of every test module outside the catalog's own unit tests (and this one): a test sets
    the catalog up through its operations as the code does."""
    own = os.path.join(ROOT, "tests", "unit", "catalog") + os.sep
    return [p for p in suite_paths() if not p.startswith(own) and p != os.path.abspath(__file__)]


def test_the_walk_finds_writes_of_partitions_and_chunks():
    src = ("part.persisting = True\nc.state = 'closed'\nchunks[0].df = None\nold_part.files.append(f)\n"
           "part.windows.flush(h)\nout.state = 1\nx = part.files\n")
    assert writes_outside_catalog(src) == [(1, "assigns persisting"), (2, "assigns state"), (3, "assigns df"),
                                           (4, "files.append(...)")]


def test_the_walk_finds_each_kind_of_write():
    src = ("db.epoch = 1\ndb.applied_hi_inclusive[0] = 5\nself.db.lost_writes.extend(x)\n"
           "del db.partitions['t']['k']\nsrc_db.poisoned += [r]\ndb.topic_id, n = 'x', 1\n"
           "db.deletes.add(d)\nd.epoch = 2\nother.epoch = 3\nx = db.epoch\n")
    assert writes_outside_catalog(src) == [(1, "assigns epoch"), (2, "assigns applied_hi_inclusive"),
                                           (4, "assigns partitions"), (5, "assigns poisoned"),
                                           (6, "assigns topic_id"), (3, "lost_writes.extend(...)")]


def test_no_module_outside_the_catalog_writes_a_field_of_the_catalogs_objects():
    found = []
    for path in _modules() + _tests():
        with open(path, encoding="utf-8") as f:
            src = f.read()
        for line, what in writes_outside_catalog(src):
            found.append(f"{os.path.relpath(path, ROOT)}:{line}: {what}")
    assert found == []


def lock_blocks(source: str) -> list[int]:
    """Lines of every use of a catalog's lock in `source`: `X.lock` or `X._lock` (a `with`, an
    `acquire`, ...) where X is a catalog (spelled `catalog`, `_catalog`, `cat` or ending in
    `.catalog`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("lock", "_lock") and _is_catalog(node.value):
            out.append(node.lineno)
    return sorted(out)


def test_the_walk_finds_each_spelling_of_the_catalogs_lock():
    src = ("with catalog.lock:\n  pass\nwith self.catalog.lock:\n  pass\nwith self._catalog.lock:\n  pass\n"
           "with srv.catalog._lock, x:\n  pass\nwith self._lock:\n  pass\nwith other.lock:\n  pass\n"
           "cat.lock.acquire()\n")
    assert lock_blocks(src) == [1, 3, 5, 7, 13]


def test_the_catalogs_lock_is_private():
    assert not hasattr(Catalog(), "lock")


def test_no_module_outside_the_catalog_takes_the_catalogs_lock():
    """Each read or change at one instant is a Database or Catalog operation that takes the lock
    itself (`applied_and_held`, `snapshot`, `query_cut`, `drop_stale_foreign_chunks`, ...)."""
    found = []
    for path in _modules() + _tests():
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, ROOT)}:{line}" for line in lock_blocks(f.read())]
    assert found == [], ("the catalog's lock is taken outside catalog/: read or change the catalog through "
                         "its operations instead\n" + "\n".join(found))
