"""The write path's retention check (pure)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from iox_spark.server.errors import OlderThanRetention
from iox_spark.server.write.retention_check import check_retention, first_line_older_than

NOW_S = 1_000_000.0
LO_NS = int((NOW_S - 3600) * 1e9)


def _batches(times):
    return {"cpu": ([], pa.table({"time": pa.array(times, pa.int64())}), None)}


def test_a_point_older_than_reader_lo_rejects_the_request_naming_its_line() -> None:
    body = b"cpu v=1 %d\n\n# c\ncpu v=2 %d\ncpu v=3\n" % (LO_NS + 5, LO_NS - 1)
    with pytest.raises(OlderThanRetention) as info:
        check_retention("db", 3600, _batches([LO_NS + 5, LO_NS - 1]), NOW_S, body, "ns")
    e = info.value
    assert (e.line, e.row, e.time_ns, e.reader_lo_ns, e.retention) == (4, 1, LO_NS - 1, LO_NS, "1h")
    assert "line 4" in str(e) and "1h" in str(e)


def test_points_at_reader_lo_or_without_retention_pass() -> None:
    check_retention("db", 3600, _batches([LO_NS, LO_NS + 1]), NOW_S)
    check_retention("db", None, _batches([0]), NOW_S)
    check_retention("db", 0, _batches([0]), NOW_S)


def test_line_lookup_uses_the_precision() -> None:
    lo_s = LO_NS // 10**9
    body = b"cpu v=1 %d\ncpu v=1 %d" % (lo_s + 1, lo_s - 1)
    assert first_line_older_than(body, "s", LO_NS) == 2
    assert first_line_older_than(b"cpu v=1\n", "s", LO_NS) is None
