"""A real ``moto_server`` S3 endpoint on 127.0.0.1 for integration tests.

Invariant kept here: while the session fixture :func:`moto_s3` is active, its
endpoint URL answers S3 requests; if the server cannot start the fixture
fails the test loudly (never skips), and the process is stopped at the end of
the session.  Importing the fixture into several modules/conftests shares one
server process (reference counted).

The server is moto_server's own WSGI application (the one the ``moto_server``
console script runs) served with ``threaded=False``: moto checks S3's
conditional-write precondition (``If-None-Match: *``) and then stores the
object without a lock, so its threaded server lets two concurrent conditional
PUTs of one key both succeed, which real S3 never does (it answers 412 or
409).  Serving one request at a time makes moto's check-and-store atomic like
S3's, so the catalog's compare-and-swap fencing is tested against S3
semantics rather than a moto race (seen in CI: two of eight concurrent
writers "won").

Tests use the credentials in :data:`MOTO_ACCESS_KEY_ID` /
:data:`MOTO_SECRET_ACCESS_KEY` (moto accepts any) and create their own
buckets; the fixture changes no environment variables.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "MOTO_ACCESS_KEY_ID",
    "MOTO_REGION",
    "MOTO_SECRET_ACCESS_KEY",
    "MOTO_START_TIMEOUT_S",
    "MOTO_STOP_TIMEOUT_S",
    "moto_s3",
]

#: Seconds to wait for moto_server to answer after starting it.
MOTO_START_TIMEOUT_S = 60.0
#: Seconds to wait for moto_server to exit after SIGTERM before SIGKILL.
MOTO_STOP_TIMEOUT_S = 10.0
#: Credentials and region for clients of the moto endpoint (any value works).
MOTO_ACCESS_KEY_ID = "testing"
MOTO_SECRET_ACCESS_KEY = "testing"
MOTO_REGION = "us-east-1"

_START_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.1


@dataclass
class _Server:
    proc: subprocess.Popen
    endpoint: str
    log_path: Path
    users: int = 0


_lock = threading.Lock()
_server: _Server | None = None


#: Runs moto_server's WSGI app one request at a time (see the module docstring).
_SERIAL_MOTO_SERVER = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
run_simple(sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app),
           threaded=False, request_handler=MotoRequestHandler)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, limit_chars: int = 4000, delete: bool = False) -> str:
    try:
        return path.read_text(errors="replace")[-limit_chars:]
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    finally:
        if delete:
            try:
                path.unlink()
            except OSError:
                pass


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=MOTO_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=MOTO_STOP_TIMEOUT_S)


def _start_once() -> _Server | str:
    """Start moto_server on a free port; return the server or a failure description."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    fd, log_name = tempfile.mkstemp(prefix="moto_server-", suffix=".log")
    log_path = Path(log_name)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERIAL_MOTO_SERVER, "127.0.0.1", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + MOTO_START_TIMEOUT_S
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"moto_server exited with {proc.returncode}; log:\n{_log_tail(log_path, delete=True)}"
        try:
            # The moto management API answers once the server is up.
            with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2) as resp:
                if resp.status == 200:
                    return _Server(proc=proc, endpoint=endpoint, log_path=log_path)
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last_error = repr(exc)
        time.sleep(_POLL_INTERVAL_S)
    _stop(proc)
    return (
        f"moto_server did not answer on {endpoint} within {MOTO_START_TIMEOUT_S}s "
        f"(last error {last_error}); log:\n{_log_tail(log_path, delete=True)}"
    )


def _acquire() -> str:
    global _server
    with _lock:
        if _server is None or _server.proc.poll() is not None:
            failures = []
            for _ in range(_START_ATTEMPTS):  # a free port can be taken between probe and bind
                started = _start_once()
                if isinstance(started, _Server):
                    _server = started
                    break
                failures.append(started)
            else:
                pytest.fail("cannot start moto_server:\n" + "\n---\n".join(failures))
        _server.users += 1
        return _server.endpoint


def _release() -> None:
    global _server
    with _lock:
        if _server is None:
            return
        _server.users -= 1
        if _server.users <= 0:
            _stop(_server.proc)
            try:
                _server.log_path.unlink()
            except OSError:
                pass
            _server = None


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Session fixture: yields the endpoint URL (``http://127.0.0.1:PORT``) of a running moto_server."""
    endpoint = _acquire()
    try:
        yield endpoint
    finally:
        _release()
