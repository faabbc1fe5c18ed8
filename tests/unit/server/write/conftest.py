"""test_line_protocol.py tests the Python parser (its shape fast path and bulk match against the
full parser): there, parse_lines runs without the C path (server.write._lpfast), as it does when the
extension is not built.  test_line_protocol_c.py runs the same tests again with the C path on.

`recording_buffer`: a write buffer that records what a real Router would produce (the router tests).
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _python_path_only_in_test_line_protocol(request, monkeypatch):
    if request.path.name == "test_line_protocol.py":
        from iox_spark.server.write import line_protocol as lp

        monkeypatch.setattr(lp, "_lpfast", None)
    yield


class _RecordingBuffer:
    """Stands in for the write buffer: records the tables of each produce."""

    def __init__(self):
        self.produced = []

    def ensure_topic(self, database):
        return f"iox.{database}"

    def topic_id(self, topic):
        return "id-1"

    def produce(self, database, writes):
        self.produced.append([w.table for w in writes])
        return {0: len(self.produced) - 1}


@pytest.fixture
def recording_buffer():
    return _RecordingBuffer()
