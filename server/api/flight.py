"""Arrow Flight `DoGet` on the gRPC port, with InfluxDB 3's ticket: the InfluxDB 3 clients
(influxdb3-python's `InfluxDBClient3.query`, and the others) query this server unchanged.

Invariant: a ticket's query runs exactly as a Query RPC of the same SQL does (the same read
barrier, sandbox, retention, limits: `IoxServer.query`) and its rows are streamed as Arrow IPC
messages, one FlightData each (the schema first, then each record batch as Spark makes it, cut
at QUERY_BATCH_ROWS rows). A ticket is JSON `{"database": D, "sql_query": Q, "query_type": "sql"}`
as InfluxDB 3 reads it; a ticket that is not, another query type (InfluxQL) or query parameters
are refused with INVALID_ARGUMENT / UNIMPLEMENTED naming what to send instead. With tokens, it
needs the `query` permission on the ticket's database (server/api/auth.py `request_database`).

Where it runs: the gRPC server's handler threads (driver), registered by `build_grpc_server`.
"""
from __future__ import annotations

import json

import grpc
import pyarrow as pa

from iox import flight_pb2, flight_pb2_grpc

__all__ = ["FlightService", "ticket_query", "TicketQuery"]

#: InfluxDB 3's query types in a ticket
_SQL = "sql"


class TicketQuery:
    """What a ticket asks: `database`, `sql`."""

    def __init__(self, database: str, sql: str):
        self.database, self.sql = database, sql


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
    if not isinstance(kind, str) or kind.lower() != _SQL:
        raise _BadTicket(f"query_type {kind!r} is not served: send SQL (query_type \"sql\"; Spark SQL over the "
                         f"database's tables)", grpc.StatusCode.UNIMPLEMENTED)
    if doc.get("params"):
        raise _BadTicket("query parameters (\"params\") are not served: put the values in the SQL",
                         grpc.StatusCode.UNIMPLEMENTED)
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


class FlightService(flight_pb2_grpc.FlightServiceServicer):
    """The Flight service of an IoxServer (`server.query`)."""

    def __init__(self, server, batch_rows: int, abort):
        self.server = server
        self.batch_rows = batch_rows
        self._abort = abort  # server/api/grpc_services.py's: a ServerError's status

    def DoGet(self, request, context):  # noqa: N802 - the protocol's name
        try:
            q = ticket_query(request.ticket)
        except _BadTicket as e:
            context.abort(e.code, str(e))
        try:
            res = self.server.query(q.database, q.sql, "", False, deadline_s=context.time_remaining())
        except Exception as e:  # noqa: BLE001 - each cause has its status (_abort)
            self._abort(context, e)
        try:
            yield _flight_data(res.schema.serialize())
            for batch in res.batches():
                for off in range(0, batch.num_rows, self.batch_rows):
                    yield _flight_data(batch.slice(off, self.batch_rows).serialize())
        except Exception as e:  # noqa: BLE001
            self._abort(context, e)
        finally:
            res.close()
