"""Imports point downward: catalog <- chunk_store <- lifecycle <- server, and inside server by role.

Walks every module of the project's packages (AST, imports inside functions
included) and fails on an import of a higher layer or on an import cycle. The
layers, lowest first, are `LAYERS`; a module belongs to the longest prefix that
names it. Each package's `__init__.py` states the same rule in words.
"""
from __future__ import annotations

import ast
import os

import pytest

from tests.project_code import ROOT, module_paths, suite_paths


#: lowest first; a module may import its own layer and the ones before it
LAYERS = [
    "iox_spark.iox",                  # generated gRPC stubs
    "iox_spark.catalog",              # shared vocabulary and the catalog itself
    "iox_spark.chunk_store",          # chunk forms in Spark, their views and merges
    "iox_spark.lifecycle",            # the policy and its actions: persist, compaction, unload
    "iox_spark.source",     # the users' Spark data source: reads catalog and lifecycle, never server
    "pyspark_iox",          # Spark's automatic registration of that data source
    "iox_spark.server.errors",        # the server's error vocabulary
    "iox_spark.server.operation_metrics",  # micro-batch, lifecycle, retention and memory metrics
    "iox_spark.server.metrics",
    "iox_spark.server.write_buffer",  # Kafka: producer, wire format, streaming source
    "iox_spark.server.runtime",       # processes: Spark, the embedded broker, JVM archive, priorities
    "iox_spark.server.pool",          # the ingester pool's package (its modules have layers of their own below)
    "iox_spark.server.pool.identity",  # an ingester pool's Kafka cluster and object store, checked at a member's start
    "iox_spark.server.config",
    "iox_spark.server.deadlines",     # how long a wait for a request may last
    "iox_spark.server.consume",       # micro-batches into the catalog, recovery
    "iox_spark.server.write",         # line protocol, router, deletes
    "iox_spark.server.query",         # SQL over a database, the write buffer's tail
    "iox_spark.server.pool.rows",     # an owner's unpersisted rows as another pool member asks for them
    "iox_spark.server.api",           # gRPC and HTTP surfaces, the client
    "iox_spark.server.pool.assigner_policy",  # the ingester pool's assignment decisions (pure)
    "iox_spark.server.pool.assigner_lease",  # one assigner at a time: its lease in the object store
    "iox_spark.server.pool.assigner",  # the assigner process (talks to the ingesters through the client)
    "iox_spark.server.pool.assigner_status",  # the assigner's status endpoint (HTTP)
    "iox_spark.server.replay_watch",  # how far each database's replay of its write buffer must reach
    "iox_spark.server.retention_admin",  # retention settings, their status and the scrape-time gauges
    "iox_spark.server.epoch_reset",  # what is forgotten of a database's old write-buffer epoch
    "iox_spark.server.fence_admin",  # a database another server committed to: its writes refused, its buffer held
    "iox_spark.server.freeze_admin",  # frozen mode of a running server
    "iox_spark.server.lost_writes_admin",  # losses of the write buffer found while running, and their acceptance
    "iox_spark.server.poison_admin",  # retrying and accepting poisoned messages
    "iox_spark.server.pool.membership",  # ingester pool membership: claims, losses, the other members' files
    "iox_spark.server.verify_admin",  # `iox verify`: which partitions a server checks, the pool's owners the rest
    "iox_spark.server.query_service",  # a user's SQL: the read barrier, the pool's rows, the engine
    "iox_spark.server.downsampling",  # continuous downsampling: the downsamplers' rounds and records
    "iox_spark.server.manual_actions",  # `iox persist` / `iox compact` on what was written before them
    "iox_spark.server.status_document",  # what `iox status` answers
    "iox_spark.server.clean_stop",    # the in-memory broker's clean stop: drain, persist, a complete checkpoint
    "iox_spark.server.startup",       # the steps of the server's start
    "iox_spark.server.app",           # the composition root
    "iox_spark.server.cli",           # the command line
]


MODULES = module_paths()


def _layer(module: str) -> int | None:
    best = None
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(LAYERS[best]):
                best = i
    if best is None and module == "iox_spark.server":
        return LAYERS.index("iox_spark.server.errors")
    return best


def _generated(name: str) -> bool:
    return name == "iox_spark.iox" or name.startswith("iox_spark.iox.")


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (a module, or the package holding a name)."""
    while name:
        if name in MODULES or _generated(name):
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: str) -> set[str]:
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_pkg = path.endswith("__init__.py")
    pkg = module if is_pkg else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for n in names:
            target = _resolve(n)
            if target is not None and target != module and (target in MODULES or _generated(target)):
                out.add(target)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) is None] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_downward(module):
    own = _layer(module)
    upward = sorted(t for t in GRAPH[module] if not _generated(t) and _layer(t) > own)
    assert upward == [], f"{module} ({LAYERS[own]}) imports higher layers: {upward}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph; packages' own
    `__init__` imports of their submodules excluded (a package re-exporting is not a cycle)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def edges(m):
        return [t for t in GRAPH.get(m, ()) if t in MODULES and not t.startswith(m + ".")]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    assert cycles == []


@pytest.mark.parametrize("package", sorted(m for m, p in MODULES.items() if p.endswith("__init__.py")))
def test_each_package_says_its_job_and_what_it_may_import(package):
    doc = ast.get_docstring(ast.parse(open(MODULES[package], encoding="utf-8").read()))
    assert doc and "may import" in doc.lower(), f"{package}/__init__.py: a docstring with its job and what it may import"


def test_no_test_imports_a_private_name():
    """Tests use what a module offers (its public names, in `__all__`), and a helper two test modules
    share lives in a helper module of its own (such as tests/integration/foreign_messages.py),
    never as a private name of one test module imported by another."""
    found = []
    for path in suite_paths():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [(os.path.relpath(path, ROOT), node.lineno, f"{node.module}.{a.name}")
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
