"""test_line_protocol.py tests the Python parser (its shape fast path and bulk match against the
full parser): there, parse_lines runs without the C path (server.write._lpfast), as it does when the
extension is not built.  test_line_protocol_c.py runs the same tests again with the C path on.
"""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _python_path_only_in_test_line_protocol(request, monkeypatch):
    if request.path.name == "test_line_protocol.py":
        from server.write import line_protocol as lp

        monkeypatch.setattr(lp, "_lpfast", None)
    yield
