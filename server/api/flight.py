"""Arrow Flight on the gRPC port: `DoGet` with InfluxDB 3's ticket, so the InfluxDB 3 clients
(influxdb3-python's `InfluxDBClient3.query`, and the others) query this server unchanged, and
Flight SQL (GetFlightInfo, GetSchema, DoGet of its tickets, DoAction, DoPut, ListActions: the
commands are server/api/flight_sql.py's).

Invariant: a ticket's query runs exactly as a Query RPC of the same SQL does (the same read
barrier, sandbox, retention, limits: `QueryService.query`) and its rows are streamed as Arrow IPC
messages, one FlightData each (the schema first, then each record batch as Spark makes it, cut
at QUERY_BATCH_ROWS rows). A ticket is JSON `{"database": D, "sql_query": Q, "query_type": "sql"}`
as InfluxDB 3 reads it, with `"params": {name: value}` bound to the query's `$name` placeholders as
literals (server/query/params.py); query_type `influxql` is answered as InfluxDB 3 answers it
(server/api/influxql_answer.py); a ticket that is not, or another query type, is refused with
INVALID_ARGUMENT / UNIMPLEMENTED naming what to send instead. With tokens, it
needs the `query` permission on the ticket's database (server/api/auth.py `request_database`).

Where it runs: the gRPC server's handler threads (driver), registered by `build_grpc_server`.
"""
from __future__ import annotations

import io
import itertools
import json
import struct

import grpc
import pyarrow as pa

from iox_spark.iox import flight_pb2, flight_pb2_grpc
from iox_spark.server.api.api_parts import Queries
from iox_spark.server.api.flight_sql import ACTIONS, FlightSql, flight_info, header_database, unpack
from iox_spark.server.errors import InvalidArgument, NotServed

__all__ = ["FlightService", "ticket_query", "TicketQuery"]

#: InfluxDB 3's query types in a ticket
_SQL = "sql"
_INFLUXQL = "influxql"


class TicketQuery:
    """What a ticket asks: `database`, `sql` (the query text), `language` ("sql" or "influxql")."""

    def __init__(self, database: str, sql: str, language: str = "sql", params: dict | None = None):
        self.database, self.sql, self.language = database, sql, language
        #: InfluxQL's `$name` values (SQL's are bound into `sql` already)
        self.params = params or {}


class _BadTicket(ValueError):
    def __init__(self, message: str, code=grpc.StatusCode.INVALID_ARGUMENT):
        self.code = code
        super().__init__(message)


def _ticket_doc(raw: bytes):
    """The ticket's JSON value, or None when it is not JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def ticket_query(raw: bytes) -> TicketQuery:
    """The query of an InfluxDB 3 ticket; _BadTicket (with its gRPC status) when it is not one this
    server answers."""
    doc = _ticket_doc(raw)
    if doc is None:
        raise _BadTicket('the ticket is not InfluxDB 3\'s JSON {"database": ..., "sql_query": ..., '
                         '"query_type": "sql"}')
    if not isinstance(doc, dict):
        raise _BadTicket("the ticket is not a JSON object")
    database = doc.get("database") or doc.get("bucket") or ""
    sql = doc.get("sql_query")
    kind = (doc.get("query_type") or _SQL)
    if not isinstance(database, str) or not database:
        raise _BadTicket("the ticket names no database (\"database\")")
    if not isinstance(sql, str) or not sql.strip():
        raise _BadTicket("the ticket holds no query (\"sql_query\")")
    if not isinstance(kind, str) or kind.lower() not in (_SQL, _INFLUXQL):
        raise _BadTicket(f"query_type {kind!r} is not served: send query_type \"sql\" (Spark SQL over the "
                         f"database's tables) or \"influxql\"", grpc.StatusCode.UNIMPLEMENTED)
    from iox_spark.server.query.params import bind_parameters, named_values

    try:
        params = named_values(doc.get("params") or {})
        if kind.lower() == _INFLUXQL:
            return TicketQuery(database, sql, _INFLUXQL, params)
        sql = bind_parameters(sql, named=params)  # a placeholder without a value is refused too
    except InvalidArgument as e:
        raise _BadTicket(str(e)) from None
    return TicketQuery(database, sql)


def ticket_database(raw: bytes) -> str:
    """The database a ticket names ("" when it names none or is no ticket): what its token needs."""
    doc = _ticket_doc(raw)
    db = (doc.get("database") or doc.get("bucket")) if isinstance(doc, dict) else None
    return db if isinstance(db, str) else ""


def _flight_data(message_buffer) -> flight_pb2.FlightData:
    """One serialized Arrow IPC message as FlightData (its metadata flatbuffer and body)."""
    msg = pa.ipc.read_message(message_buffer)
    return flight_pb2.FlightData(data_header=msg.metadata.to_pybytes(),
                                 data_body=msg.body.to_pybytes() if msg.body is not None else b"")


def _ipc_table(messages) -> pa.Table:
    """The table of (data_header, data_body) pairs of FlightData: Arrow IPC messages, the schema first."""
    buf = io.BytesIO()
    for header, body in messages:
        if not header:
            continue
        pad = -(8 + len(header)) % 8  # the body starts 8-byte aligned
        buf.write(b"\xff\xff\xff\xff" + struct.pack("<i", len(header) + pad) + header + b"\x00" * pad + body)
    buf.write(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    return pa.ipc.open_stream(buf.getvalue()).read_all()


class FlightService(flight_pb2_grpc.FlightServiceServicer):
    """The Flight service over `queries` (server/api/api_parts.py `Queries`): InfluxDB 3's tickets,
    and Flight SQL (server/api/flight_sql.py)."""

    def __init__(self, queries: Queries, batch_rows: int, abort, scope=lambda: None):
        """`scope`: the token scope of the RPC being served (server/api/auth.py `current_scope`)."""
        self.queries = queries
        self.batch_rows = batch_rows
        self._abort = abort  # server/api/grpc_services.py's: a ServerError's status
        self._scope = scope
        self.sql = FlightSql(queries)

    def _stream(self, res, context):
        """FlightData of a QueryResult or a pa.Table: the schema, then its batches (each cut at
        batch_rows rows)."""
        try:
            yield _flight_data(res.schema.serialize())
            batches = res.batches() if hasattr(res, "batches") else res.to_batches()
            for batch in batches:
                for off in range(0, batch.num_rows, self.batch_rows):
                    yield _flight_data(batch.slice(off, self.batch_rows).serialize())
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)
        finally:
            if hasattr(res, "close"):
                res.close()

    def DoGet(self, request, context):  # noqa: N802 - the protocol's name
        try:
            command = unpack(request.ticket)
            res = None if command is None else \
                self.sql.answer(command, header_database(context.invocation_metadata()), context.time_remaining())
        except Exception as e:  # noqa: BLE001 - each cause has its status (_abort)
            self._abort(context, e)
        if res is not None:  # a Flight SQL ticket
            yield from self._stream(res, context)
            return
        try:
            q = ticket_query(request.ticket)
        except _BadTicket as e:
            context.abort(e.code, str(e))
        try:
            if q.language == _INFLUXQL:
                res = self._influxql(q, context)
            else:
                res = self.queries.query(q.database, q.sql, "", False, deadline_s=context.time_remaining())
        except Exception as e:  # noqa: BLE001 - each cause has its status (_abort)
            self._abort(context, e)
        yield from self._stream(res, context)

    def _influxql(self, q: TicketQuery, context):
        """InfluxQL's answer as InfluxDB 3 gives it (server/api/influxql_answer.py `V3Answer`): the first
        statement's table, streamed by `_stream` (which closes it). The statement runs up to its first
        series here: its error until then is INVALID_ARGUMENT; a later one ends the stream."""
        from iox_spark.server.api.influxql_answer import AnswerContext, V3Answer, run
        from iox_spark.server.query.influxql import InfluxQLSyntaxError

        try:
            results = run(AnswerContext(self.queries, self._scope(), context.time_remaining()), q.database, q.sql,
                          q.params)
        except InfluxQLSyntaxError as e:
            raise InvalidArgument(str(e)) from None
        try:
            first = next(results)
        except BaseException:
            results.close()
            raise
        if first.error is not None:
            results.close()
            raise InvalidArgument(first.error)
        return V3Answer(first)

    def _command(self, descriptor):
        if descriptor.type != flight_pb2.FlightDescriptor.CMD:
            raise NotServed("a FlightDescriptor of a path", "send a Flight SQL command (CMD)")
        command = unpack(descriptor.cmd)
        if command is None:
            raise InvalidArgument("the FlightDescriptor's command is not a Flight SQL command")
        return command

    def GetFlightInfo(self, request, context):  # noqa: N802
        try:
            schema, ticket = self.sql.plan(self._command(request), header_database(context.invocation_metadata()),
                                           context.time_remaining())
            return flight_info(request, schema, ticket)
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)

    def GetSchema(self, request, context):  # noqa: N802
        try:
            schema, _ticket = self.sql.plan(self._command(request), header_database(context.invocation_metadata()),
                                            context.time_remaining())
            return flight_pb2.SchemaResult(schema=schema.serialize().to_pybytes())
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)

    def DoAction(self, request, context):  # noqa: N802
        try:
            bodies = self.sql.act(request.type, request.body, header_database(context.invocation_metadata()),
                                  context.time_remaining())
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)
        for body in bodies:
            yield flight_pb2.Result(body=body)

    def ListActions(self, request, context):  # noqa: N802
        for name, description in ACTIONS:
            yield flight_pb2.ActionType(type=name, description=description)

    def DoPut(self, request_iterator, context):  # noqa: N802
        try:
            first = next(request_iterator, None)
            if first is None:
                raise InvalidArgument("a DoPut without a message")
            command = unpack(first.flight_descriptor.cmd) if first.HasField("flight_descriptor") else None
            rest = ((m.data_header, m.data_body) for m in request_iterator)
            parameters = _ipc_table(itertools.chain([(first.data_header, first.data_body)], rest))
            result = self.sql.bind(command, parameters)
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)
        yield flight_pb2.PutResult(app_metadata=result)
