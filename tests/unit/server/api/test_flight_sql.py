"""server/api/flight_sql.py's pure parts: Flight SQL commands in and out of google.protobuf.Any,
the database a request names (the handle's before the header's), GetSqlInfo's union, and a
command not served named in an UNIMPLEMENTED error."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from iox_spark.iox import flight_pb2, flight_sql_pb2
from iox_spark.server.api.flight_sql import (SQL_INFO_SCHEMA, header_database, pack, request_database, sql_info_table,
                                   unpack)
from iox_spark.server.errors import NotServed

FLIGHT = "/arrow.flight.protocol.FlightService/"


def test_a_command_comes_back_from_its_any():
    cmd = flight_sql_pb2.CommandGetTables(include_schema=True, table_name_filter_pattern="c%")
    assert unpack(pack(cmd)) == cmd


def test_what_is_no_flight_sql_message_is_none_and_an_unknown_command_is_not_served():
    assert unpack(json.dumps({"database": "d", "sql_query": "SELECT 1"}).encode()) is None
    assert unpack(b"") is None
    other = any_pb2.Any(type_url="type.googleapis.com/some.Other", value=b"").SerializeToString()
    assert unpack(other) is None
    update = any_pb2.Any(type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementUpdate",
                         value=b"").SerializeToString()
    with pytest.raises(NotServed, match="CommandStatementUpdate"):
        unpack(update)


def test_the_database_header_in_influxdb3s_names():
    assert header_database([("database", "a"), ("bucket-name", "b")]) == "a"
    assert header_database([("Bucket-Name", "b")]) == "b"
    assert header_database([("iox-namespace-name", b"c")]) == "c"
    assert header_database([("authorization", "Bearer x")]) == ""


def test_a_statement_handle_names_its_database_before_the_header():
    handle = json.dumps({"database": "b", "sql": "SELECT 1"}).encode()
    md = [("database", "a")]
    prepared = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.CMD, cmd=pack(
        flight_sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=handle)))
    statement = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.CMD, cmd=pack(
        flight_sql_pb2.CommandStatementQuery(query="SELECT 1")))
    assert request_database(FLIGHT + "GetFlightInfo", prepared, md) == "b"
    assert request_database(FLIGHT + "GetFlightInfo", statement, md) == "a"
    assert request_database(FLIGHT + "DoPut", flight_pb2.FlightData(flight_descriptor=prepared), md) == "b"
    ticket = flight_pb2.Ticket(ticket=pack(flight_sql_pb2.TicketStatementQuery(statement_handle=handle)))
    assert request_database(FLIGHT + "DoGet", ticket, md) == "b"
    catalogs = flight_pb2.Ticket(ticket=pack(flight_sql_pb2.CommandGetCatalogs()))
    assert request_database(FLIGHT + "DoGet", catalogs, md) == "a"
    assert request_database(FLIGHT + "DoGet", flight_pb2.Ticket(ticket=b'{"database": "x"}'), md) is None
    forged = flight_pb2.Ticket(ticket=pack(flight_sql_pb2.TicketStatementQuery(statement_handle=b"nope")))
    assert request_database(FLIGHT + "DoGet", forged, md) == ""  # no database: only a token for all may try


def test_sql_info_answers_in_flight_sqls_union():
    t = sql_info_table([0, 3, 504, 12345])
    assert t.schema == SQL_INFO_SCHEMA
    assert t.column("info_name").to_pylist() == [0, 3, 504]
    assert t.column("value").to_pylist() == ["iox-spark", True, "`"]
    everything = sql_info_table([])
    assert everything.num_rows > 3 and everything.column("info_name").to_pylist() == \
        sorted(everything.column("info_name").to_pylist())
    assert pa.ipc.read_schema(pa.py_buffer(SQL_INFO_SCHEMA.serialize())) == SQL_INFO_SCHEMA
