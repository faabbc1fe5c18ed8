"""server/pool/rows.py: an owner's answer is cut into messages by bytes, not rows, and reads back whole."""
from __future__ import annotations

import pyarrow as pa

from iox_spark.server.pool.rows import rows_message_parts


def _read(parts: list) -> pa.Table:
    return pa.concat_tables([pa.ipc.open_stream(pa.py_buffer(p)).read_all() for p in parts if p])


def test_wide_rows_travel_in_messages_of_about_the_byte_bound():
    wide = pa.table({"s": ["x" * 10_000] * 1_000, "t": list(range(1_000))})  # ~10 MB
    parts = rows_message_parts(wide, message_bytes=1_000_000)
    assert 9 <= len(parts) <= 12 and max(len(p) for p in parts) < 1_300_000
    assert _read(parts).equals(wide)


def test_no_rows_is_one_empty_message_and_a_huge_row_travels_alone():
    assert rows_message_parts(None) == [b""] and rows_message_parts(pa.table({"a": pa.array([], pa.int64())})) == [b""]
    big = pa.table({"s": ["y" * 3_000_000, "z"]})
    parts = rows_message_parts(big, message_bytes=1_000_000)
    assert len(parts) == 2 and _read(parts).equals(big)
