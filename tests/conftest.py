"""Shared fixtures: ONE real Tansu broker and ONE real in-process server (real Spark,
real gRPC) per test session, that is per pytest process (scripts/test.sh runs the suite in
IOX_TEST_WORKERS of them, each test file whole in one). Tests isolate themselves by unique
database names, and by data directories, brokers and ports of their own: never by a resource
of the machine that another process could hold.

Integration tests that cannot reach a required part fail (fixtures raise); they never skip.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid

import pytest

from iox_spark.server.runtime.broker import free_port, start_broker
from iox_spark.server.api.client import IoxClient
from iox_spark.server.config import ServerConfig

logging.getLogger("py4j").setLevel(logging.WARNING)


# The files that run longest, longest first: scripts/test.sh hands whole files to its worker
# processes in collection order (--no-loadscope-reorder), so these start first and no long file
# starts last, when the other worker has nothing left to run. A file not named keeps its place
# after them: crash tests, then integration tests, then unit tests.
_LONGEST_FILES_FIRST = (
    "tests/crash/test_crash_recovery.py",
    "tests/integration/lifecycle/test_persistence.py",
    "tests/integration/runtime/test_spark_cluster.py",
    "tests/crash/test_model.py",
    "tests/integration/pool/test_pool.py",
    "tests/crash/test_broker_lost_tail.py",
    "tests/integration/api/test_fuzz_requests.py",
    "tests/crash/test_shared_batches.py",
)
_DIRECTORIES_IN_ORDER = ("tests/crash/", "tests/integration/", "tests/unit/")


def _file_rank(path: str) -> tuple[int, int]:
    if path in _LONGEST_FILES_FIRST:
        return (0, _LONGEST_FILES_FIRST.index(path))
    for i, directory in enumerate(_DIRECTORIES_IN_ORDER):
        if path.startswith(directory):
            return (1 + i, 0)
    return (1 + len(_DIRECTORIES_IN_ORDER), 0)


def pytest_collection_modifyitems(config, items):
    """Orders the collected tests by file (see `_LONGEST_FILES_FIRST`); within a file, tests keep
    their order. A stable sort: every worker process collects the same order."""
    items.sort(key=lambda item: _file_rank(item.nodeid.split("::", 1)[0]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item (`item.rep_setup`, `item.rep_call`), so a
    fixture can tell whether its test passed (see `passed`)."""
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def passed(node) -> bool:
    """Whether the test `node` (a fixture's `request.node`) passed its setup and its call."""
    reports = [getattr(node, f"rep_{when}", None) for when in ("setup", "call")]
    return all(rep is not None and rep.passed for rep in reports)


@pytest.fixture(scope="session")
def broker():
    """A real Kafka-protocol broker (Tansu) for the whole session."""
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def own_broker():
    """A broker of the module's own, for servers a module starts besides the session's: a server
    started on the session broker finds every database the session's tests wrote before it and
    replays them all."""
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture(scope="session")
def session_tmp():
    d = tempfile.mkdtemp(prefix="iox-tests-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_config(data_dir: str, bootstrap: str | None, **kw) -> ServerConfig:
    """A test server's config: gRPC on a port the server binds itself (0; read `IoxServer.grpc_port`),
    so no other process can take it between choosing and binding. Not at real-time priority: an
    in-process server would raise the test process itself and every process it starts later."""
    base = dict(grpc_port=0, write_path_rt_priority=0, http_port=free_port(), data_dir=data_dir, kafka_bootstrap=bootstrap, partitions=4,
                driver_memory="3g", spark_connect_port=0, bind_host="127.0.0.1", trigger_interval_ms=100,
                produce_timeout_ms=5000)
    base.update(kw)
    return ServerConfig(**base)


def start_server(cfg: ServerConfig):
    """(server, client) of an in-process server on `cfg`, ready; a start that fails raises after
    the server stopped what it started."""
    from iox_spark.server.app import IoxServer

    srv = IoxServer(cfg)
    srv.start()
    c = IoxClient(f"127.0.0.1:{srv.grpc_port}")
    c.wait_ready(60)
    return srv, c


@pytest.fixture(scope="session")
def iox_server(broker, session_tmp):
    """The session's server: real Spark local[*], real gRPC, the session broker."""
    from iox_spark.server.app import IoxServer

    # the session's Spark application also serves Spark Connect (on a free port)
    srv = IoxServer(make_config(os.path.join(session_tmp, "main"), broker.bootstrap, spark_connect_port=free_port()))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(iox_server):
    c = IoxClient(f"127.0.0.1:{iox_server.grpc_port}")
    c.wait_ready(60)
    yield c
    c.close()


@pytest.fixture
def db():
    """A database name no other test uses."""
    return f"t_{uuid.uuid4().hex[:12]}"
