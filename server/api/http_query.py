"""HTTP SQL queries: `GET /api/v3/query_sql?db=D&q=SQL[&format=json|jsonl|csv|parquet|pretty][&params=JSON]`, or the
same as a JSON body `POST /api/v3/query_sql {"db", "q", "format", "params"}` (InfluxDB 3's), streamed as
the rows arrive. `params` is a JSON object {name: value} of the query's `$name` placeholders, bound as
literals (server/query/params.py).

`format` (InfluxDB 3's names): `json` (the default) an array of row objects, `jsonl` one row object per line,
`csv` a header line and one line per row (RFC 4180; NULL an empty field; nested values as JSON text),
`parquet` a Parquet file (a row group per batch), `pretty` an ASCII table (sent once every row arrived).
The answer streams (HTTP/1.1 chunked transfer encoding): rows are encoded batch by batch as Spark
returns them, never as Python objects of the whole result (but for `pretty`). Everything a query can refuse before its
first batch maps to a status; an error after the first rows were sent (the result grew over
`--max-query-bytes`, the query timed out) ends the connection without the chunked body's last chunk,
so a client never takes a cut-off answer for a whole one.

Invariant: an HTTP query goes through the same read barrier as gRPC Query (server/query/read_barrier.py,
`QueryService.query`, server/query_service.py) and says what it reflects the same way, in response headers:
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
import csv
import io
import json
import math
from dataclasses import dataclass
from decimal import Decimal

from iox_spark.server.errors import InvalidArgument

__all__ = ["QUERY_PATH", "AFTER_HEADER", "ALLOW_PARTIAL_HEADER", "TIMEOUT_HEADER", "DEFAULT_TIMEOUT_S",
           "MAX_TIMEOUT_S", "FORMATS", "QueryRequest", "query_request", "query_body", "query_params", "MAX_QUERY_BODY_BYTES",
           "answer_headers", "encoded_rows"]

QUERY_PATH = "/api/v3/query_sql"
AFTER_HEADER = "X-Iox-After"
ALLOW_PARTIAL_HEADER = "X-Iox-Allow-Partial"
TIMEOUT_HEADER = "X-Iox-Timeout-S"
#: the deadline of an HTTP query's waits (replay, write token) when it names none
DEFAULT_TIMEOUT_S = 60.0
#: the longest deadline an HTTP query may ask for
MAX_TIMEOUT_S = 300.0


#: the answer formats of `format=` and their content types (json is the default)
FORMATS = {"json": "application/json; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8",
           "csv": "text/csv; charset=utf-8", "parquet": "application/vnd.apache.parquet",
           "pretty": "text/plain; charset=utf-8"}


@dataclass(frozen=True)
class QueryRequest:
    """An HTTP query's parameters, checked."""

    database: str
    sql: str
    after: str
    allow_partial: bool
    timeout_s: float
    format: str = "json"

    @property
    def content_type(self) -> str:
        return FORMATS[self.format]


#: the largest JSON body of `POST /api/v3/query_sql`
MAX_QUERY_BODY_BYTES = 1024 * 1024


def query_body(body: bytes) -> dict:
    """The parameters of a `POST /api/v3/query_sql` JSON body (`{"db", "q", "format", "params"}`, as
    InfluxDB 3 takes them) in `parse_qs`'s shape, `params` as its JSON text; InvalidArgument when the
    body is not such an object."""
    try:
        doc = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidArgument(f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument('the body must be a JSON object {"db": ..., "q": ..., "format": ..., "params": {...}}')
    out = {}
    for key in ("db", "q", "format"):
        value = doc.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{key} must be a string")
        if value is not None:
            out[key] = [value]
    if doc.get("params") is not None:
        out["params"] = [json.dumps(doc["params"])]
    return out


def query_params(raw: str) -> dict:
    """The `params` query parameter (JSON text) as {name: value} (server/query/params.py
    `named_values`); InvalidArgument when it is not such an object."""
    from iox_spark.server.query.params import named_values

    try:
        value = json.loads(raw)
    except ValueError as e:
        raise InvalidArgument(f"params must be a JSON object of parameter values: {e}") from None
    return named_values(value)


def _bound(sql: str, raw: str) -> str:
    """`sql` with the `$name` placeholders bound to the JSON object `raw` (server/query/params.py)."""
    from iox_spark.server.query.params import bind_parameters

    return bind_parameters(sql, named=query_params(raw))


def query_request(qs: dict, headers) -> QueryRequest:
    """The checked parameters of a request (`qs`: the query string's, or `query_body`'s); its SQL with
    `params` bound; InvalidArgument naming what is wrong."""
    database = (qs.get("db") or [""])[0]
    sql = (qs.get("q") or [""])[0]
    if not database:
        raise InvalidArgument("the db query parameter is required")
    if not sql.strip():
        raise InvalidArgument("the q query parameter (the SQL statement) is required")
    sql = _bound(sql, (qs.get("params") or [""])[0].strip() or "{}")  # a placeholder without a value is refused
    fmt = (qs.get("format") or ["json"])[0].strip().lower() or "json"
    if fmt not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
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
    return QueryRequest(database, sql, (headers.get(AFTER_HEADER) or "").strip(), partial == "true", timeout_s, fmt)


def answer_headers(res) -> list:
    """The response headers of a QueryResult: what the answer reflects."""
    return [("X-Iox-Applied-Hi-Inclusive", _offsets(res.applied_hi_inclusive)),
            ("X-Iox-Visible-Hi-Inclusive", _offsets(res.visible_hi_inclusive)),
            ("X-Iox-Partial", "true" if res.partial else "false"), ("X-Iox-Topic", res.topic),
            ("X-Iox-Topic-Id", res.topic_id), ("X-Iox-Epoch", str(res.epoch))]


def encoded_rows(fmt: str, schema, batches):
    """The answer's body in `fmt`, as pieces of bytes, one per record batch (json's opening bracket
    and closing bracket, csv's header line are pieces of their own; parquet's footer is the last
    piece, each batch a row group; pretty, a table whose column widths depend on every row, is one
    piece once every batch arrived). Errors of `batches` propagate."""
    if fmt == "parquet":
        yield from _parquet_pieces(schema, batches)
        return
    if fmt == "pretty":
        yield _pretty(schema, batches)
        return
    names = list(schema.names)
    if fmt == "csv":
        yield _csv_line(names)
    elif fmt == "json":
        yield b"["
    first = True
    for b in batches:
        if b.num_rows == 0:
            continue
        rows = b.to_pylist()
        if fmt == "csv":
            out = io.StringIO()
            w = csv.writer(out, lineterminator="\r\n")
            w.writerows([[_csv_value(r[n]) for n in names] for r in rows])
            yield out.getvalue().encode()
            continue
        text = [json.dumps({k: _jsonable(v) for k, v in r.items()}, allow_nan=False) for r in rows]
        if fmt == "jsonl":
            yield ("\n".join(text) + "\n").encode()
        else:
            yield (("" if first else ",") + ",".join(text)).encode()
        first = False
    if fmt == "json":
        yield b"]"


class _Pieces(io.RawIOBase):
    """A write-only file whose bytes written since the last `take` are taken (a Parquet writer's sink)."""

    def __init__(self):
        super().__init__()
        self._parts: list = []
        self._pos = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        data = bytes(b)
        self._parts.append(data)
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


def _parquet_pieces(schema, batches):
    """A Parquet file of the batches, in pieces: each batch a row group, sent once written."""
    import pyarrow.parquet as pq

    sink = _Pieces()
    writer = pq.ParquetWriter(sink, schema)
    try:
        for b in batches:
            if b.num_rows:
                writer.write_batch(b)
                yield sink.take()
    finally:
        writer.close()
    yield sink.take()


def _pretty_value(v) -> str:
    """A result value in a `pretty` table: as a CSV field writes it."""
    return str(_csv_value(v))


def _pretty(schema, batches) -> bytes:
    """InfluxDB 3's `pretty` format: an ASCII table, a header row between rules, NULL empty."""
    names = list(schema.names)
    rows = [[_pretty_value(r[n]) for n in names] for b in batches for r in b.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "|" + "|".join(f" {c.ljust(w)} " for c, w in zip(cells, widths)) + "|"

    out = [rule, line(names), rule] + [line(r) for r in rows] + [rule]
    return ("\n".join(out) + "\n").encode()


def _csv_line(values: list) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(values)
    return out.getvalue().encode()


def _csv_value(v):
    """A result value as a CSV field: NULL empty, nested values as JSON text, the rest as JSON has them."""
    v = _jsonable(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, allow_nan=False)
    return v


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
