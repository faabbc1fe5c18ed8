"""Fixtures of the crash tests (real `iox serve` processes, tests/crash/harness.py)."""
from __future__ import annotations

import shutil
import tempfile

import pytest

from tests.conftest import passed
from tests.crash.harness import stop_embedded_broker


@pytest.fixture
def data_dir(request):
    """The servers' data directory (named for the test module); its embedded broker is stopped
    after the test; removed after a test that passed, kept (with the servers' logs) after one that
    failed."""
    d = tempfile.mkdtemp(prefix=f"iox-{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_')}-")
    yield d
    stop_embedded_broker(d)
    if passed(request.node):
        shutil.rmtree(d, ignore_errors=True)
