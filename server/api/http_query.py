"""HTTP SQL queries: `GET /api/v3/query_sql?db=D&q=SQL`, answered as JSON (an array of row objects).

Invariant: an HTTP query goes through the same read barrier as gRPC Query (server/query/read_barrier.py,
`IoxServer.query`) and says what it reflects the same way, in response headers:
`X-Iox-Applied-Hi-Inclusive` and `X-Iox-Visible-Hi-Inclusive` (JSON objects {kafka partition: offset}),
`X-Iox-Partial` (true / false), `X-Iox-Topic`, `X-Iox-Topic-Id`, `X-Iox-Epoch`. Request headers:
`X-Iox-After: TOKEN` (a write token, e.g. a write's `X-Iox-Write-Token`: the query runs once that write is
visible), `X-Iox-Allow-Partial: true` (answer during a replay, marked partial) and `X-Iox-Timeout-S`
(the deadline of the waits, default `DEFAULT_TIMEOUT_S`). Errors map as the write API's do
(server/api/http_api.py `error_response`): a replay not caught up 503 with Retry-After, a token not
visible by the deadline 504, a token of another epoch or topic incarnation 409, a refused statement 403.

Runs in an HTTP worker thread (driver); the caller checks the `query` permission on the database.
"""
from __future__ import annotations

import base64
import json
import math
from decimal import Decimal

from server.errors import InvalidArgument

__all__ = ["QUERY_PATH", "AFTER_HEADER", "ALLOW_PARTIAL_HEADER", "TIMEOUT_HEADER", "DEFAULT_TIMEOUT_S",
           "MAX_TIMEOUT_S", "query_request", "answer"]

QUERY_PATH = "/api/v3/query_sql"
AFTER_HEADER = "X-Iox-After"
ALLOW_PARTIAL_HEADER = "X-Iox-Allow-Partial"
TIMEOUT_HEADER = "X-Iox-Timeout-S"
#: the deadline of an HTTP query's waits (replay, write token) when it names none
DEFAULT_TIMEOUT_S = 60.0
#: the longest deadline an HTTP query may ask for
MAX_TIMEOUT_S = 300.0


def query_request(qs: dict, headers) -> tuple[str, str, str, bool, float]:
    """(database, sql, after, allow_partial, timeout_s) of a request; InvalidArgument naming what is wrong."""
    database = (qs.get("db") or [""])[0]
    sql = (qs.get("q") or [""])[0]
    if not database:
        raise InvalidArgument("the db query parameter is required")
    if not sql.strip():
        raise InvalidArgument("the q query parameter (the SQL statement) is required")
    partial = (headers.get(ALLOW_PARTIAL_HEADER) or "false").strip().lower()
    if partial not in ("true", "false"):
        raise InvalidArgument(f"{ALLOW_PARTIAL_HEADER} must be true or false, got {partial!r}")
    raw = (headers.get(TIMEOUT_HEADER) or "").strip()
    try:
        timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout_s = -1.0
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InvalidArgument(f"{TIMEOUT_HEADER} must be seconds in (0, {MAX_TIMEOUT_S:g}], got {raw!r}")
    return database, sql, (headers.get(AFTER_HEADER) or "").strip(), partial == "true", timeout_s


def answer(res) -> tuple[list, bytes]:
    """(response headers, JSON body) of a QueryResult."""
    headers = [("X-Iox-Applied-Hi-Inclusive", _offsets(res.applied_hi_inclusive)),
               ("X-Iox-Visible-Hi-Inclusive", _offsets(res.visible_hi_inclusive)),
               ("X-Iox-Partial", "true" if res.partial else "false"), ("X-Iox-Topic", res.topic),
               ("X-Iox-Topic-Id", res.topic_id), ("X-Iox-Epoch", str(res.epoch))]
    rows = [{k: _jsonable(v) for k, v in r.items()} for r in res.table.to_pylist()]
    return headers, json.dumps(rows, allow_nan=False).encode()


def _offsets(offsets: dict) -> str:
    return json.dumps({str(kp): off for kp, off in sorted(offsets.items())}, separators=(",", ":"))


def _jsonable(v):
    """A result value as JSON has it: NaN and infinities null, decimals and times as text, bytes base64."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Decimal):
        return format(v, "f") if v.is_finite() else None
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)
