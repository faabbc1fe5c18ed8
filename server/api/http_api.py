"""InfluxDB v2 and 1.x compatible HTTP write API: `POST /api/v2/write`, `POST /write` (1.x, as
Telegraf's outputs.influxdb sends), `GET /health`, `GET|HEAD /ping`, and the server's Prometheus
metrics at `GET /metrics` (server/metrics.py).

Invariant: same all-or-nothing semantics as the gRPC Write: it calls the same
Router, and every error maps to the HTTP status of its gRPC status
(INVALID_ARGUMENT -> 400 `{"code": "invalid", ...}` naming the bad lines,
RESOURCE_EXHAUSTED -> 413, UNAVAILABLE -> 503 with Retry-After, NOT_FOUND -> 404,
FAILED_PRECONDITION (lost writes not accepted, a topic replaced, a database fenced: another server
committed a newer revision of its preserved catalog) -> 409, anything else -> 500). 204 is answered only after Kafka acknowledged the write,
with the write's token in `X-Iox-Write-Token` (server/write_buffer/write_token.py; a query's `after`).
A gzip body is decompressed with a limit: no body can grow past
`max_request_bytes` in memory, however well it compresses.

Mapping: database = `<org>_<bucket>` (`orgID` is used when `org` is absent);
`precision` is ns (default), us, ms or s.

InfluxDB 1.x: `POST /write?db=DB[&rp=RP][&precision=P]` writes to database `DB`, or `DB_RP` when
`rp` is given and is not 1.x's default policy `autogen` (a valid database name either way: letters, digits, '_' and '-', at most 64
characters); `precision` is n or ns (default), u or us, ms, s, m (minutes) or h (hours). Same body
limits, gzip and all-or-nothing semantics as /api/v2/write, the same statuses, but error bodies
are 1.x's `{"error": "..."}`. `/ping` answers 204
with `X-Influxdb-Version` and `X-Influxdb-Build`, or 200 `{"version": ...}` with `verbose=true`
(as 1.x: any value but empty, 0 and false).

InfluxDB 3: `POST /api/v3/write_lp?db=D[&precision=auto|nanosecond|...][&accept_partial=][&no_sync=]`
(server/write/lp_v3.py): the same router; partial writes and errors in InfluxDB 3's shapes
(`{"error": ..., "data": ...}`).

SQL queries (server/api/http_query.py): `GET /api/v3/query_sql?db=D&q=SQL[&format=json|jsonl|csv]`, rows
streamed as they arrive; the request
header `X-Iox-After` takes a write token, the answer's `X-Iox-*` headers say what it reflects.

InfluxDB v2 buckets (server/api/buckets.py): `GET|POST /api/v2/buckets`, `GET|PATCH
/api/v2/buckets/{id}` and `GET /api/v2/orgs`, enough for influxdb-client's BucketsApi; a bucket's
`retentionRules` are its database's retention period (a write of a point older than it: 422).

Authentication (when the server has tokens, server/api/auth.py): writes, queries (the `query`
permission on the database) and `/metrics` need a token, `/health`, `/ready` and `/ping` stay open. The token comes as `Authorization: Token T`
(influxdb-client's `token=`) or `Bearer T`, or as InfluxDB 1.x takes credentials: the `p` query
parameter or the password of Basic authorization (the user name is not checked). No token or an
unknown one: 401 (`{"code": "unauthorized", ...}`, 1.x `{"error": ...}`) and the body is not
read; a token without the `write` permission on the database (or `admin` for `/metrics`): 403
naming the database.

When it runs: started by the server (`--http-port`, 0 disables) after gRPC, in a
daemon thread; a bounded pool of `--http-workers` threads serves connections, as many more
wait, any further one is answered 503 with Retry-After and closed; stopped
by `IoxServer.stop()`.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
import queue
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

from iox_spark.server.errors import ColumnAgreementUnavailable, OwnerNotCaughtUp, OwnershipMoving, PoolMemberUnavailable, RoleRefuses
from iox_spark.server.errors import (BadLines, DatabaseFenced, DatabaseNotFound, TopicReplaced, WritesLost, DecompressedRequestTooLarge, InvalidArgument, RequestTooLarge,
                     WriteBufferOverloaded, WriteBufferUnavailable)
from iox_spark.server.write.line_protocol import ALL_PRECISIONS
from iox_spark.server.write.router import MAX_REPORTED_BAD_LINES
from iox_spark.server.metrics import CONTENT_TYPE_LATEST
from iox_spark.server.api.auth import ALL_DATABASES, PermissionDenied, Unauthenticated, token_from_authorization
from iox_spark.server.api.http_routes import SERVER_WIDE, find_route, methods_of
from iox_spark.server.errors import LinesRejected, OlderThanRetention, QueryTimedOut
from iox_spark.server.write_buffer.write_token import format_token, token_for
from iox_spark.server.errors import (NotAQuery, QueryRefused, ReplayNotCaughtUp, WriteTokenNotVisible,
                           WriteTokenOfOtherIncarnation)
from iox_spark.server.api.http_query import (DEFAULT_TIMEOUT_S, FORMATS, MAX_QUERY_BODY_BYTES, QUERY_PATH, answer_headers,
                                   encoded_rows, query_body, query_params, query_request)

__all__ = ["HttpWriteServer", "database_for", "database_for_v1", "precision_for_v1", "gunzip_limited",
           "error_response", "error_response_v1", "WRITE_PATH", "V1_WRITE_PATH", "V3_WRITE_PATH", "METRICS_PATH", "MAX_DRAIN_BYTES",
           "SERVER_VERSION", "WRITE_TOKEN_HEADER"]

log = logging.getLogger(__name__)

WRITE_PATH = "/api/v2/write"
#: InfluxDB 1.x's write endpoint
V1_WRITE_PATH = "/write"
#: InfluxQL: InfluxDB 1.x's query endpoint, and InfluxDB 3's
V1_QUERY_PATH = "/query"
V3_INFLUXQL_PATH = "/api/v3/query_influxql"
#: InfluxDB 3's write endpoint (server/write/lp_v3.py)
V3_WRITE_PATH = "/api/v3/write_lp"
#: InfluxDB 1.x precision names -> the parser's
V1_PRECISIONS = {"n": "ns", "ns": "ns", "u": "us", "us": "us", "ms": "ms", "s": "s", "m": "m", "h": "h"}
#: the server's metrics in the Prometheus text format
METRICS_PATH = "/metrics"
#: A body over the limit is still read (and dropped) up to this size so the client sees the 413;
#: past it the connection is closed without reading on.
MAX_DRAIN_BYTES = 64 * 1024 * 1024
#: The header of a 204 write answer holding the write's token (server/write_buffer/write_token.py): pass it to a
#: query (`iox sql --after`, QueryRequest.after) to read that write.
WRITE_TOKEN_HEADER = "X-Iox-Write-Token"
#: Largest body of a buckets API request (a bucket's JSON).
MAX_BUCKETS_BODY_BYTES = 64 * 1024
#: Reported in /health and the X-Influxdb-Version header.
SERVER_VERSION = "iox-spark"
#: Idle / slow connection timeout, seconds.
SOCKET_TIMEOUT_S = 60
_READ_CHUNK = 1 << 20


def database_for(org: str, bucket: str) -> str:
    """The database an InfluxDB v2 (org, bucket) writes to."""
    return f"{org}_{bucket}"


#: InfluxDB 1.x's default retention policy: writes naming it go where writes naming none go
DEFAULT_RETENTION_POLICY = "autogen"


def database_for_v1(db: str, rp: str = "") -> str:
    """The database an InfluxDB 1.x write (`db`, optional `rp`) goes to: `db` (also for 1.x's
    default retention policy `autogen`), or `<db>_<rp>`.
    Raises InvalidArgument without `db`; the router checks the name."""
    if not db:
        raise InvalidArgument("database is required (the db query parameter)")
    return f"{db}_{rp}" if rp and rp != DEFAULT_RETENTION_POLICY else db


def precision_for_v1(precision: str) -> str:
    """An InfluxDB 1.x precision (n, ns, u, us, ms, s, m, h; empty = ns) as the parser names it."""
    try:
        return V1_PRECISIONS[precision or "ns"]
    except KeyError:
        raise InvalidArgument(f"precision must be one of {', '.join(V1_PRECISIONS)}, got {precision!r}") from None


def compressed_cap(limit: int) -> int:
    """Largest gzip body worth decompressing: deflate never grows data by more than this."""
    return limit + limit // 100 + 1024


#: bytes of a gzip body fed to a member's decompressor at a time: a member that ends inside a piece
#: leaves the rest of that piece only (zlib copies it into `unused_data`), so a body of many small
#: members decompresses in time linear in its size
_GUNZIP_PIECE_BYTES = 4096


def gunzip_limited(data: bytes, limit: int) -> bytes:
    """Decompresses a (possibly multi-member) gzip body; never holds more than `limit` + 1 bytes of
    output, and takes time linear in the body's size however many members it has.

    Raises DecompressedRequestTooLarge past the limit, InvalidArgument for a corrupt or truncated body.
    """
    out = bytearray()
    mv = memoryview(data)
    pos, n = 0, len(mv)
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            if pos >= n:
                raise InvalidArgument("invalid gzip body: truncated")
            piece = mv[pos:pos + _GUNZIP_PIECE_BYTES]
            try:
                # max_length >= 1 here (len(out) <= limit); 0 would mean "unlimited"
                out += d.decompress(piece, limit + 1 - len(out))
            except zlib.error as e:
                raise InvalidArgument(f"invalid gzip body: {e}") from None
            # past the limit, or stopped at max_length with input left: over the limit either way
            if len(out) > limit or d.unconsumed_tail:
                raise DecompressedRequestTooLarge(limit)
            pos += len(piece) - len(d.unused_data)
        if pos >= n:
            return bytes(out)


def error_response(err: Exception) -> tuple[int, list, dict]:
    """(HTTP status, extra headers, JSON body) for an error, mirroring the gRPC mapping."""
    if isinstance(err, BadLines):
        lines = "; ".join(f"line {n}: {r}" for n, r in err.errors)
        more = len(err.errors) < err.total_bad
        msg = f"{err.total_bad} bad line(s), nothing written: {lines}" + (
            f" (and {err.total_bad - len(err.errors)} more)" if more else "")
        body = {"code": "invalid", "message": msg, "line": err.errors[0][0] if err.errors else None,
                "errors": [{"line": n, "message": r} for n, r in err.errors]}
        return 400, [], body
    if isinstance(err, OlderThanRetention):  # as InfluxDB answers points beyond a bucket's retention
        return 422, [], {"code": "unprocessable entity", "message": str(err), "line": err.line}
    if isinstance(err, InvalidArgument):
        return 400, [], {"code": "invalid", "message": str(err)}
    if isinstance(err, DatabaseNotFound):
        return 404, [], {"code": "not found", "message": str(err)}
    if isinstance(err, (WritesLost, TopicReplaced, DatabaseFenced, WriteTokenOfOtherIncarnation, RoleRefuses)):
        return 409, [], {"code": "conflict", "message": str(err)}
    if isinstance(err, NotAQuery):
        return 400, [], {"code": "invalid", "message": str(err)}
    if isinstance(err, QueryRefused):
        return 403, [], {"code": "forbidden", "message": str(err)}
    if isinstance(err, (WriteTokenNotVisible, QueryTimedOut)):
        return 504, [], {"code": "deadline exceeded", "message": str(err)}
    if isinstance(err, RequestTooLarge):
        return 413, [], {"code": "request too large", "message": str(err)}
    if isinstance(err, (WriteBufferUnavailable, WriteBufferOverloaded, ReplayNotCaughtUp, PoolMemberUnavailable,
                        OwnerNotCaughtUp, ColumnAgreementUnavailable, OwnershipMoving)):
        retry = max(1, math.ceil(err.retry_after_s))
        return 503, [("Retry-After", str(retry))], {"code": "unavailable", "message": str(err)}
    return 500, [], {"code": "internal error", "message": f"internal error: {err}"}


def error_response_v1(err: Exception) -> tuple[int, list, dict]:
    """As `error_response`, with InfluxDB 1.x's body: `{"error": "..."}`."""
    status, headers, body = error_response(err)
    return status, headers, {"error": body["message"]}


class _BodyTooLarge(Exception):
    """The declared or streamed body is over the cap; `drained` says whether the connection is reusable."""

    def __init__(self, size: int, drained: bool):
        self.size = size
        self.drained = drained


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "iox"
    timeout = SOCKET_TIMEOUT_S

    # -- plumbing ---------------------------------------------------------------------
    def version_string(self) -> str:
        return self.server_version

    def log_message(self, fmt, *args):  # route the stdlib's access log to debug logging
        log.debug("%s %s", self.address_string(), fmt % args)

    @property
    def router(self):
        return self.server.router

    def _send(self, status: int, body: dict | bytes | None = None, headers: list = (), close: bool = False,
              content_type: str = "application/json; charset=utf-8") -> None:
        """`body`: a dict sent as JSON, or bytes sent as they are (as `content_type`)."""
        payload = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if status != 204:  # a 204 has no body and no Content-Length
            if payload:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("X-Influxdb-Version", SERVER_VERSION)
        self.send_header("X-Influxdb-Build", "OSS")
        self.end_headers()
        if payload and self.command != "HEAD":
            self.wfile.write(payload)

    def _send_error(self, err: Exception, close: bool = False) -> None:
        status, headers, body = (error_response_v1 if self._plain_errors() else error_response)(err)
        if status == 500:
            log.exception("internal error in the HTTP write API", exc_info=err)
        self._send(status, body, headers, close)

    def _encoding(self) -> str:
        enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if enc in ("", "identity"):
            return "identity"
        if enc in ("gzip", "x-gzip"):
            return "gzip"
        raise InvalidArgument(f"unsupported Content-Encoding {enc!r}: use gzip or identity")

    def _raw_cap(self) -> int:
        limit = self.router.max_request_bytes
        return compressed_cap(limit) if self._encoding() == "gzip" else limit

    def _declared_length(self) -> int | None:
        cl = self.headers.get("Content-Length")
        if cl is None:
            return None
        try:
            n = int(cl)
        except ValueError:
            raise InvalidArgument(f"invalid Content-Length {cl!r}") from None
        if n < 0:
            raise InvalidArgument(f"invalid Content-Length {cl!r}")
        return n

    def _chunked(self) -> bool:
        return "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()

    def handle_expect_100(self):
        """Answers 413 before the client sends a body that is declared too large."""
        try:
            if self.command == "POST" and not self._chunked():
                n = self._declared_length()
                if n is not None and n > self._raw_cap():
                    self._send_error(RequestTooLarge(n, self.router.max_request_bytes), close=True)
                    return False
        except InvalidArgument as e:
            self._send_error(e, close=True)
            return False
        return super().handle_expect_100()

    def _read_body(self, cap: int) -> bytes:
        if self._chunked():
            return self._read_chunked(cap)
        n = self._declared_length()
        if n is None:
            return b""
        if n > cap:
            drained = n <= MAX_DRAIN_BYTES and self._discard(n)
            raise _BodyTooLarge(n, drained)
        data = self.rfile.read(n)
        if len(data) != n:
            raise ConnectionError(f"body ended after {len(data)} of {n} bytes")
        return data

    def _discard(self, n: int) -> bool:
        while n > 0:
            got = self.rfile.read(min(n, _READ_CHUNK))
            if not got:
                return False
            n -= len(got)
        return True

    def _read_chunked(self, cap: int) -> bytes:
        out = bytearray()
        total = 0
        while True:
            line = self.rfile.readline(65537)
            if not line.endswith(b"\n"):
                raise InvalidArgument("malformed chunked body")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise InvalidArgument("malformed chunk size in chunked body") from None
            if size == 0:
                while True:  # trailers
                    t = self.rfile.readline(65537)
                    if t in (b"\r\n", b"\n", b""):
                        return bytes(out)
            total += size
            if total > cap:
                drained = total <= MAX_DRAIN_BYTES and self._discard(size + 2) and self._drain_chunks(total)
                raise _BodyTooLarge(total, drained)
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise ConnectionError("chunked body ended early")
            out += chunk
            self.rfile.readline(3)  # CRLF after the chunk

    def _drain_chunks(self, total: int) -> bool:
        while True:
            line = self.rfile.readline(65537)
            if not line.endswith(b"\n"):
                return False
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                return False
            if size == 0:
                while True:
                    t = self.rfile.readline(65537)
                    if t in (b"\r\n", b"\n"):
                        return True
                    if t == b"":
                        return False
            total += size
            if total > MAX_DRAIN_BYTES or not self._discard(size + 2):
                return False

    # -- routes -----------------------------------------------------------------------
    def _route(self) -> str:
        path = urlsplit(self.path).path
        return path.rstrip("/") or "/"

    def _v1(self) -> bool:
        """An InfluxDB 1.x request: errors in 1.x's form."""
        return self._route() == V1_WRITE_PATH

    def _plain_errors(self) -> bool:
        """Errors as `{"error": "..."}`: InfluxDB 1.x's form, and InfluxDB 3's."""
        return self._route() in (V1_WRITE_PATH, V3_WRITE_PATH, V1_QUERY_PATH, V3_INFLUXQL_PATH)

    def _ping(self) -> None:
        qs = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        verbose = (qs.get("verbose") or [""])[0]
        if verbose not in ("", "0", "false"):  # as InfluxDB 1.x
            self._send(200, {"version": SERVER_VERSION})
        else:
            self._send(204)

    # every request goes through server/api/http_routes.py's table, which says who may call it
    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def do_POST(self):
        self._dispatch()

    def do_PATCH(self):
        self._dispatch()

    def do_PUT(self):
        self._dispatch()

    def do_DELETE(self):
        self._dispatch()

    def _dispatch(self) -> None:
        """Answers the request through its route (`find_route`): a server-wide one is authorized
        here, a database one by its handler; a path it does not know is 404, a method the path
        does not take 405 with Allow (a body is drained first, so the connection stays usable)."""
        route = self._route()
        found = find_route(self.command, route)
        if found is None:
            allowed = methods_of(route)
            drained = self.command in ("GET", "HEAD") or self._drain_any()
            if not allowed:
                self._send(404, {"code": "not found", "message": f"no such endpoint: {route}"}, close=not drained)
                return
            message = f"use {' or '.join(allowed)} {route}"
            body = {"error": message} if self._plain_errors() else {"code": "method not allowed", "message": message}
            self._send(405, body, [("Allow", ", ".join(allowed))], close=not drained)
            return
        if found.access == SERVER_WIDE and not self._authorized(found.permission, None):
            return
        getattr(self, found.handler)()

    def _health(self) -> None:
        self._send(200, {"name": "iox", "message": "ready for queries and writes", "status": "pass",
                         "checks": [], "version": SERVER_VERSION, "commit": ""})

    def _ready(self) -> None:
        self._send(200, {"status": "ready"})

    def _metrics(self) -> None:
        self._send(200, self.router.metrics.render(), content_type=CONTENT_TYPE_LATEST)

    def _query(self, body: bytes | None = None) -> None:
        """`GET /api/v3/query_sql`, or POST with the JSON `body` (server/api/http_query.py); needs the
        `query` permission on the database. The first batch is read before the status is sent, so what
        refuses a query maps to its status."""
        try:
            qs = parse_qs(urlsplit(self.path).query, keep_blank_values=True) if body is None else query_body(body)
            req = query_request(qs, self.headers)
        except InvalidArgument as e:
            self._send_error(e)
            return
        if not self._authorized("query", req.database):
            return
        queries = getattr(self.server, "queries", None)
        if queries is None:
            self._send(404, {"code": "not found", "message": "no query API on this server"})
            return
        try:
            res = queries.query(req.database, req.sql, req.after, req.allow_partial, deadline_s=req.timeout_s)
            batches = res.batches()
            first = next(batches, None)
        except Exception as e:
            self._send_error(e)
            return
        rest = itertools.chain(() if first is None else (first,), batches)
        try:
            self._send_chunked(answer_headers(res), req.content_type, encoded_rows(req.format, res.schema, rest))
        finally:
            batches.close()

    def _influxql(self, body: bytes | None = None) -> None:
        """InfluxQL: InfluxDB 1.x's `/query?db=&q=&epoch=&chunked=&chunk_size=` (GET, or POST with the
        parameters in a form body) answered in 1.x's JSON; InfluxDB 3's `/api/v3/query_influxql`
        (as query_sql: `db`, `q`, `format`; a JSON body by POST) answered as a table. Needs the `query`
        permission on `db` (and on each database a statement names); SHOW DATABASES lists the
        token's databases (server/api/influxql_answer.py). The answer streams: the first statement
        runs up to its first series before the status is sent (what fails until then maps to a
        status, or to the statement's error in 1.x), the rest as the answer is written; an error
        after that cuts the answer off (`_send_chunked`)."""
        from iox_spark.server.api.influxql_answer import AnswerContext, EPOCHS, V3Answer, run, v1_chunks, v1_pieces
        from iox_spark.server.query.influxql import InfluxQLSyntaxError

        v1 = self._route() == V1_QUERY_PATH
        qs = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if body:
            if v1 or not body.lstrip().startswith(b"{"):
                try:
                    form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
                except UnicodeDecodeError:
                    form = {}
            else:
                try:
                    form = query_body(body)
                except InvalidArgument as e:
                    self._send_error(e)
                    return
            qs = {**qs, **form}
        database = (qs.get("db") or [""])[0]
        text = (qs.get("q") or [""])[0]
        epoch = (qs.get("epoch") or [""])[0] or None
        fmt = (qs.get("format") or ["json"])[0].strip().lower() or "json"
        problem = None
        if not text.strip():
            problem = 'missing required parameter "q"'
        elif v1 and epoch is not None and epoch not in EPOCHS:
            problem = f"invalid epoch {epoch!r}: one of {', '.join(EPOCHS)}"
        elif not v1 and fmt not in FORMATS:
            problem = f"format must be one of {', '.join(FORMATS)}, got {fmt!r}"
        elif not v1 and not database:
            problem = "the db query parameter is required"
        params = None
        raw_params = (qs.get("params") or [""])[0].strip()
        if problem is None and raw_params:
            try:
                params = query_params(raw_params)
            except InvalidArgument as e:
                problem = str(e)
        if problem is not None:
            self._send(400, {"error": problem})
            return
        auth = getattr(self.server, "authenticator", None)
        scope = None
        if auth is not None and auth.enabled:
            if database and not self._authorized("query", database):
                return
            try:
                scope = auth.authorize(self._presented_token(), None, None)
            except Unauthenticated as e:
                self._send(401, {"error": str(e)}, [("WWW-Authenticate", 'Token realm="iox"')])
                return
        queries = getattr(self.server, "queries", None)
        if queries is None:
            self._send(404, {"error": "no query API on this server"})
            return
        try:
            results = run(AnswerContext(queries, scope, DEFAULT_TIMEOUT_S), database, text, params)
        except InfluxQLSyntaxError as e:
            self._send(400, {"error": str(e)})
            return
        except Exception as e:  # noqa: BLE001 - a status the user can act on
            self._send_error(e)
            return
        try:
            try:
                first = next(results)
            except Exception as e:  # noqa: BLE001 - a status the user can act on
                self._send_error(e)
                return
            if v1:
                chunked = (qs.get("chunked") or [""])[0].lower() == "true"
                answer = itertools.chain([first], results)
                if chunked:
                    raw = (qs.get("chunk_size") or ["10000"])[0]
                    size = int(raw) if raw.isdigit() and int(raw) > 0 else 10000
                    pieces = v1_chunks(answer, epoch, size)
                else:
                    pieces = v1_pieces(answer, epoch)
                try:
                    self._send_chunked([], "application/json", pieces)
                finally:
                    pieces.close()
                return
            if first.error is not None:
                self._send(400, {"error": first.error})
                return
            table = V3Answer(first)
            try:
                self._send_chunked([], FORMATS[fmt], encoded_rows(fmt, table.schema, table.batches()))
            finally:
                table.close()
        finally:
            results.close()

    def _send_chunked(self, headers: list, content_type: str, pieces) -> None:
        """A 200 answer whose body is `pieces` (bytes), sent as they come in HTTP/1.1 chunks. An error
        while the pieces are made ends the connection without the last chunk (the client sees the
        answer cut off, never a shorter answer that looks whole)."""
        self.send_response(200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Influxdb-Version", SERVER_VERSION)
        self.send_header("X-Influxdb-Build", "OSS")
        self.end_headers()
        try:
            for piece in pieces:
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: the rest is not read
            return
        except Exception as e:  # noqa: BLE001 - the status is sent: the answer can only be cut off
            log.warning("HTTP query failed after its first rows were sent (answer cut off): %s", e)
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")

    def _get_buckets(self) -> None:
        self._buckets("GET")

    def _patch_buckets(self) -> None:
        self._buckets("PATCH")

    def _post_buckets(self) -> None:
        try:
            self._buckets("POST")
        except _BodyTooLarge as e:
            self._send_error(RequestTooLarge(e.size, MAX_BUCKETS_BODY_BYTES), close=not e.drained)

    def _buckets(self, method: str) -> None:
        """The InfluxDB v2 buckets and orgs API (server/api/buckets.py): any valid token; a bucket
        (its database) is listed, read, created or changed only with the `admin` permission on it,
        an org listed only with a bucket the token may administer (or named by the request)."""
        body = self._read_body(MAX_BUCKETS_BODY_BYTES) if method != "GET" else b""
        if not self._authorized(None, None):
            return
        api = getattr(self.server, "buckets", None)
        if api is None:
            self._send(404, {"code": "not found", "message": "no buckets API on this server"})
            return
        auth = getattr(self.server, "authenticator", None)
        scope = auth.table.authenticate(self._presented_token()) if auth is not None and auth.enabled else None
        may = (lambda database: scope is None or scope.allows("admin", database))  # noqa: E731
        try:
            status, out = api.handle(method, self._route(), urlsplit(self.path).query, body, may,
                                     may_all=may(ALL_DATABASES))
        except Exception as e:
            self._send_error(e)
            return
        self._send(status, out)

    def _post_query(self) -> None:
        """A POST to a query path: its body (a JSON document, or InfluxQL's form) read first."""
        try:
            body = self._read_body(MAX_QUERY_BODY_BYTES)
        except _BodyTooLarge as e:
            self._send_error(RequestTooLarge(e.size, MAX_QUERY_BODY_BYTES), close=not e.drained)
            return
        except InvalidArgument as e:
            self._send_error(e, close=True)
            return
        if self._route() == QUERY_PATH:
            self._query(body)
        else:
            self._influxql(body)

    def _post_write(self) -> None:
        try:
            self._write()
        except _BodyTooLarge as e:
            self._send_error(RequestTooLarge(e.size, self.router.max_request_bytes), close=not e.drained)
        except InvalidArgument as e:  # unreadable framing (Content-Length, chunks): the body state is unknown
            self._send_error(e, close=True)
        except (ConnectionError, TimeoutError, OSError) as e:
            log.debug("HTTP write connection failed: %s", e)
            self.close_connection = True

    def _presented_token(self) -> str | None:
        """The request's token: `Authorization: Token|Bearer T`, Basic's password, or the `p` parameter."""
        import base64
        import binascii

        header = self.headers.get("Authorization")
        token = token_from_authorization(header)
        if token is None and header and header.strip().lower().startswith("basic "):
            try:
                token = base64.b64decode(header.strip()[6:].strip(), validate=True).decode().partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                token = None
        if token is None:
            token = (parse_qs(urlsplit(self.path).query).get("p") or [None])[0]
        return token or None

    def _authorized(self, permission: str | None, database: str | None, close: bool = False) -> bool:
        """True when the request may go on; otherwise answers 401 or 403 and returns False."""
        auth = getattr(self.server, "authenticator", None)
        if auth is None or not auth.enabled:
            return True
        try:
            auth.authorize(self._presented_token(), permission, database)
            return True
        except Unauthenticated as e:
            status, code, msg = 401, "unauthorized", str(e)
            headers = [("WWW-Authenticate", 'Token realm="iox"')]
        except PermissionDenied as e:
            status, code, msg, headers = 403, "forbidden", str(e), []
        body = {"error": msg} if self._plain_errors() else {"code": code, "message": msg}
        self._send(status, body, headers, close=close)
        return False

    def _drain_any(self) -> bool:
        try:
            self._read_body(MAX_DRAIN_BYTES)
            return True
        except Exception:
            return False

    def _write(self) -> None:
        if self._route() == V3_WRITE_PATH:
            return self._write_v3()
        limit = self.router.max_request_bytes
        try:
            encoding = self._encoding()
            qs = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
            org = (qs.get("org") or qs.get("orgID") or [""])[0]
            bucket = (qs.get("bucket") or [""])[0]
            precision = (qs.get("precision") or ["ns"])[0] or "ns"
            db, rp = (qs.get("db") or [""])[0], (qs.get("rp") or [""])[0]
        except InvalidArgument as e:
            self._send_error(e, close=not self._drain_any())
            return
        raw = self._token_then_body(encoding, limit)
        if raw is None:
            return
        try:
            if self._v1():  # consistency: ignored
                database, kw = database_for_v1(db, rp), {"precisions": ALL_PRECISIONS}
                precision = precision_for_v1(precision)
            else:
                if not bucket:
                    raise InvalidArgument("the bucket query parameter is required")
                if not org:
                    raise InvalidArgument("the org (or orgID) query parameter is required")
                database, kw = database_for(org, bucket), {}
            if not self._authorized("write", database):
                return
            body = gunzip_limited(raw, limit) if encoding == "gzip" else raw
            res = self.router.write_line_protocol(database, body, precision, **kw)
        except Exception as e:
            self._send_error(e)
            return
        token = token_for(self.router.catalog, database, res.token)
        self._send(204, headers=[(WRITE_TOKEN_HEADER, format_token(token))] if token is not None else [])


    def _token_then_body(self, encoding: str, limit: int) -> bytes | None:
        """A write's body, read once its token is known (an unknown one: 401 and the body is not
        read, None); at most `limit` bytes once decompressed (the raw cap of `encoding`)."""
        if not self._authorized(None, None, close=True):
            return None
        return self._read_body(compressed_cap(limit) if encoding == "gzip" else limit)

    def _write_v3(self) -> None:
        """`POST /api/v3/write_lp` (server/write/lp_v3.py): 204 when every line was written; 400
        `{"error": "partial write of line protocol occurred", "data": [rejected lines]}` when the
        others were (accept_partial), `{"error": "parsing failed for write_lp endpoint", "data":
        first rejected line}` when nothing was."""
        limit = self.router.max_request_bytes
        try:
            encoding = self._encoding()
            qs = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
            database = (qs.get("db") or [""])[0]
            precision = (qs.get("precision") or ["auto"])[0] or "auto"
            accept_partial = _v3_flag(qs, "accept_partial", True)
            no_sync = _v3_flag(qs, "no_sync", False)
            if not database:
                raise InvalidArgument("the db query parameter is required")
        except InvalidArgument as e:
            self._send_error(e, close=not self._drain_any())
            return
        raw = self._token_then_body(encoding, limit)
        if raw is None:
            return
        try:
            if not self._authorized("write", database):
                return
            body = gunzip_limited(raw, limit) if encoding == "gzip" else raw
            res, rejected = self.router.write_lp_v3(database, body, precision, accept_partial, no_sync)
        except LinesRejected as e:
            if accept_partial:
                body = {"error": "partial write of line protocol occurred", "data": [r.as_json() for r in e.rejected]}
            else:
                body = {"error": "parsing failed for write_lp endpoint", "data": e.rejected[0].as_json()}
            self._send(400, body)
            return
        except Exception as e:
            self._send_error(e)
            return
        token = token_for(self.router.catalog, database, res.token) if res.token else None
        headers = [(WRITE_TOKEN_HEADER, format_token(token))] if token is not None else []
        if rejected:
            self._send(400, {"error": "partial write of line protocol occurred",
                             "data": [r.as_json() for r in rejected[:MAX_REPORTED_BAD_LINES]]}, headers)
        else:
            self._send(204, headers=headers)


def _v3_flag(qs: dict, name: str, default: bool) -> bool:
    """A true/false query parameter of /api/v3/write_lp; InvalidArgument for anything else."""
    raw = (qs.get(name) or [""])[0].strip().lower()
    if raw == "":
        return default
    if raw in ("true", "false"):
        return raw == "true"
    raise InvalidArgument(f"{name} must be true or false, got {raw!r}")


#: Seconds a client is told to wait (Retry-After) when every HTTP worker is busy and the queue is full.
BUSY_RETRY_AFTER_S = 1
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
                  b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s")


class _Server(HTTPServer):
    """An HTTP server with `workers` threads: an accepted connection waits in a queue of as many
    places for a free one; when the queue is full it is answered 503 with Retry-After and closed
    (never a thread per connection)."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, router, workers: int = 32):
        self.router = router
        self.workers = workers
        self._queue: queue.Queue = queue.Queue(maxsize=workers)
        #: workers serving a connection now (`_work`); an int under the GIL, read by `busy_workers`
        self.busy = 0
        self._busy_lock = threading.Lock()
        # an IPv6 address (or a name that resolves to one first) binds an IPv6 socket; `::` also
        # takes IPv4 connections (dual stack), as gRPC's `[::]` does
        self.address_family = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_STREAM)[0][0]
        super().__init__(addr, handler)
        self._threads = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True) for i in range(workers)]
        for t in self._threads:
            t.start()

    def server_bind(self):
        if self.address_family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def process_request(self, request, client_address):
        try:
            self._queue.put_nowait((request, client_address))
        except queue.Full:
            self._refuse(request)

    def _refuse(self, request) -> None:
        body = json.dumps({"code": "unavailable", "message": f"server busy: all {self.workers} HTTP workers "
                                                             f"are serving connections; retry later"}).encode()
        try:
            request.settimeout(1.0)
            request.sendall(_BUSY_RESPONSE % (BUSY_RETRY_AFTER_S, len(body), body))
        except OSError:
            pass
        self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, client_address = item
            with self._busy_lock:
                self.busy += 1
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - a broken connection must not end the worker
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                with self._busy_lock:
                    self.busy -= 1

    def handle_error(self, request, client_address):
        log.debug("HTTP connection from %s failed", client_address, exc_info=True)

    def server_close(self):
        super().server_close()
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break


class HttpWriteServer:
    def __init__(self, router, host: str, port: int, authenticator=None, workers: int = 32):
        self.router = router
        #: server/api/auth.py's Authenticator; None (or one without tokens) = no authentication
        self.authenticator = authenticator
        self.host = host
        self.port = port
        #: threads serving connections (--http-workers)
        self.workers = workers
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._httpd = _Server((self.host, self.port), _Handler, self.router, self.workers)
        self._httpd.authenticator = self.authenticator
        self._httpd.buckets = getattr(self, "buckets", None)
        #: the query path (server/api/api_parts.py `Queries`): SQL (server/api/http_query.py) and InfluxQL
        #: (server/api/influxql_answer.py); None: no query endpoint
        self._httpd.queries = getattr(self, "queries", None)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="http-write-api", daemon=True)
        self._thread.start()
        log.info("InfluxDB v2 and 1.x HTTP write API on %s:%s", self.host, self.port)

    @property
    def busy_workers(self) -> int:
        """Workers serving a connection now (0 when stopped)."""
        httpd = self._httpd
        return httpd.busy if httpd is not None else 0

    @property
    def connections_waiting(self) -> int:
        """Accepted connections waiting for a free worker (at most `workers`; past that a new one is
        answered 503). 0 when stopped."""
        httpd = self._httpd
        return httpd._queue.qsize() if httpd is not None else 0

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
