"""What the tests write and read back: a write waited for, a query's rows, a table's (value, time)
pairs.

Shared by the integration and crash tests, against a real server's client
(server/api/client.py `IoxClient`).
"""
from __future__ import annotations

import grpc
import pyarrow as pa

__all__ = ["query_rows", "values_and_times", "table_values_and_times", "write_applied"]


def query_rows(client, db: str, sql: str, after: str = "") -> list:
    """The rows of `sql` on `db` as dicts (after the write token `after`, when given)."""
    return client.query(db, sql, after=after).to_pylist()


def values_and_times(table: pa.Table, value: str = "v") -> list:
    """[(value, time in ns)] of an answer with the columns `value` and `time`, in its order."""
    times = table.column("time").cast(pa.timestamp("ns")).cast(pa.int64()).to_pylist()
    return list(zip(table.column(value).to_pylist(), times))


def table_values_and_times(client, db: str, table: str, after: str = "", timeout_s: float = 120.0) -> list:
    """[(v, time in ns)] of `table` in time order; [] while the table is unknown to the server
    asked (in a pool: nobody applied or persisted it yet)."""
    try:
        t = client.query(db, f"SELECT v, time FROM {table} ORDER BY time", after=after, timeout_s=timeout_s)
    except grpc.RpcError as e:
        if after:
            raise
        assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) or \
            "is not a table of the database" in e.details(), e
        return []
    return values_and_times(t)


def write_applied(client, db: str, lines: list, timeout_s: float = 90.0) -> dict:
    """Writes `lines` (line protocol) in one request and waits until the server applied it; the
    write's token."""
    token = client.write(db, "\n".join(lines) + "\n")
    client.wait_applied(db, token, timeout_s=timeout_s)
    return token
