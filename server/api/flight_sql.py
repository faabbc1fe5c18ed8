"""Flight SQL on the gRPC port: statement queries, prepared statements with parameters, and the
metadata commands Flight SQL clients call on connect (ADBC's Flight SQL driver, JDBC, Grafana's
FlightSQL data source).

Invariants:
- A query runs exactly as a Query RPC of the same SQL does (`QueryService.query`: the read barrier,
  the SQL sandbox, retention, limits), in the database that InfluxDB 3 clients name: the
  `database` header (or `bucket-name`, `bucket`, `iox-namespace-name`). GetFlightInfo plans the
  query for its schema and answers one endpoint on this server; DoGet of its ticket plans it again
  and streams its rows. Nothing is held between calls: a statement's handle and ticket carry the
  database and the SQL (JSON), so any member of a pool, or a restarted server, answers them.
- Prepared statements: CreatePreparedStatement answers a handle of the query as written; DoPut
  of one row of parameters answers (DoPutPreparedStatementResult) a new handle of the query with
  its placeholders (`?` in order, `$name` by column name) bound as literals
  (server/query/params.py); executing a handle whose placeholders are unbound is INVALID_ARGUMENT.
  ClosePreparedStatement has nothing to free.
- Metadata: one catalog (`public`) holding one schema (`iox`) holding the database's tables, of
  type `BASE TABLE`; GetTables gives each table's Arrow schema when asked; GetSqlInfo answers the
  server's name, version, Arrow version, read-only and the SQL dialect's facts. Results have the
  schemas Flight SQL defines.
- A command this module does not serve (updates, transactions, Substrait, keys, XDBC types) is
  NotServed (UNIMPLEMENTED) naming it.

Where it runs: the gRPC server's handler threads (driver), through server/api/flight.py's
FlightService, which streams the answers as FlightData. Token scopes are checked by
server/api/auth.py on the database `request_database` names (the handle's, else the header's).
"""
from __future__ import annotations

import json
import re

import pyarrow as pa
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from iox_spark.iox import flight_pb2, flight_sql_pb2 as sql_pb2
from iox_spark.server.api.api_parts import Queries
from iox_spark.server.errors import InvalidArgument, NotServed

__all__ = ["FlightSql", "flight_info", "unpack", "pack", "header_database", "request_database", "DATABASE_HEADERS",
           "CATALOG", "DB_SCHEMA", "TABLE_TYPE", "SQL_INFO_SCHEMA", "sql_info_table", "ACTIONS"]

#: the gRPC headers that name the database, in the order they are looked at (InfluxDB 3's names)
DATABASE_HEADERS = ("database", "bucket-name", "bucket", "iox-namespace-name")
#: the one catalog, and the one schema in it, that hold a database's tables (as InfluxDB 3 names them)
CATALOG = "public"
DB_SCHEMA = "iox"
TABLE_TYPE = "BASE TABLE"

_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
_SERVED = {cls.DESCRIPTOR.name: cls for cls in (
    sql_pb2.CommandGetSqlInfo, sql_pb2.CommandGetCatalogs, sql_pb2.CommandGetDbSchemas,
    sql_pb2.CommandGetTables, sql_pb2.CommandGetTableTypes, sql_pb2.CommandStatementQuery,
    sql_pb2.TicketStatementQuery, sql_pb2.CommandPreparedStatementQuery,
    sql_pb2.ActionCreatePreparedStatementRequest, sql_pb2.ActionClosePreparedStatementRequest)}

_CREATE_PREPARED = "CreatePreparedStatement"
_CLOSE_PREPARED = "ClosePreparedStatement"
#: the actions DoAction serves (ListActions)
ACTIONS = ((_CREATE_PREPARED, "Creates a prepared statement of a query: its handle"),
           (_CLOSE_PREPARED, "Closes a prepared statement"))

#: Flight SQL's schema of GetSqlInfo's answer
SQL_INFO_SCHEMA = pa.schema([
    pa.field("info_name", pa.uint32(), nullable=False),
    pa.field("value", pa.dense_union([
        pa.field("string_value", pa.utf8()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.field("item", pa.utf8()))),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32())))),
    ], type_codes=[0, 1, 2, 3, 4, 5]), nullable=False),
])
_CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
_DB_SCHEMAS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8()),
                                pa.field("db_schema_name", pa.utf8(), nullable=False)])
_TABLES_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
                            pa.field("table_name", pa.utf8(), nullable=False),
                            pa.field("table_type", pa.utf8(), nullable=False)])
_TABLES_WITH_SCHEMA = _TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
_TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])

# SqlInfo ids (FlightSql.proto's enum SqlInfo) and their values' union members
_STRING, _BOOL, _BIGINT, _INT32 = 0, 1, 2, 3
_SERVER_NAME, _SERVER_VERSION, _SERVER_ARROW_VERSION, _SERVER_READ_ONLY = 0, 1, 2, 3
_SERVER_SQL, _SERVER_SUBSTRAIT, _SERVER_TRANSACTION, _SERVER_CANCEL = 4, 5, 8, 9
_DDL_CATALOG, _DDL_SCHEMA, _DDL_TABLE, _IDENTIFIER_QUOTE_CHAR = 500, 501, 502, 504


def _server_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iox-spark")
    except PackageNotFoundError:
        return "unknown"


def _sql_info() -> dict[int, tuple[int, object]]:
    """{SqlInfo id: (union member, value)} this server answers."""
    return {
        _SERVER_NAME: (_STRING, "iox-spark"),
        _SERVER_VERSION: (_STRING, _server_version()),
        _SERVER_ARROW_VERSION: (_STRING, pa.__version__),
        _SERVER_READ_ONLY: (_BOOL, True),  # queries read; writes come through the write APIs
        _SERVER_SQL: (_BOOL, True),
        _SERVER_SUBSTRAIT: (_BOOL, False),
        _SERVER_TRANSACTION: (_INT32, 0),  # SQL_SUPPORTED_TRANSACTION_NONE
        _SERVER_CANCEL: (_BOOL, False),
        _DDL_CATALOG: (_BOOL, False),
        _DDL_SCHEMA: (_BOOL, False),
        _DDL_TABLE: (_BOOL, False),
        _IDENTIFIER_QUOTE_CHAR: (_STRING, "`"),
    }


def sql_info_table(ids) -> pa.Table:
    """GetSqlInfo's answer for `ids` (every id this server knows when empty; unknown ids are left out)."""
    known = _sql_info()
    wanted = [i for i in (ids or sorted(known)) if i in known]
    members: list[list] = [[] for _ in range(6)]
    type_ids, offsets = [], []
    for i in wanted:
        member, value = known[i]
        type_ids.append(member)
        offsets.append(len(members[member]))
        members[member].append(value)
    union_type = SQL_INFO_SCHEMA.field("value").type
    children = [pa.array(members[k], type=union_type.field(k).type) for k in range(6)]
    value = pa.UnionArray.from_dense(pa.array(type_ids, pa.int8()), pa.array(offsets, pa.int32()), children,
                                     [union_type.field(k).name for k in range(6)], list(range(6)))
    return pa.Table.from_arrays([pa.array(wanted, pa.uint32()), value], schema=SQL_INFO_SCHEMA)


def pack(message) -> bytes:
    """`message` in a serialized google.protobuf.Any (how Flight SQL sends each command)."""
    a = any_pb2.Any()
    a.Pack(message)
    return a.SerializeToString()


def unpack(raw: bytes):
    """The Flight SQL message packed in `raw`, or None when `raw` is no Flight SQL message (an
    InfluxDB 3 JSON ticket, say); NotServed for a Flight SQL command this server does not serve."""
    if not raw or raw[:1] != b"\x0a":  # an Any starts with its type_url (field 1, bytes)
        return None
    try:
        a = any_pb2.Any.FromString(raw)
    except DecodeError:
        return None
    if not a.type_url.startswith(_PREFIX):
        return None
    name = a.type_url[len(_PREFIX):]
    cls = _SERVED.get(name)
    if cls is None:
        raise NotServed(f"the Flight SQL command {name}",
                        "this server answers queries (CommandStatementQuery, prepared statements) and the "
                        "catalog, schema, table, table type and SqlInfo commands")
    try:
        return cls.FromString(a.value)
    except DecodeError as e:
        raise InvalidArgument(f"the Flight SQL {name} could not be read: {e}") from e


def header_database(metadata) -> str:
    """The database the gRPC `metadata` names (DATABASE_HEADERS), "" when none."""
    values = {}
    for k, v in metadata or ():
        values.setdefault(k.lower(), v if isinstance(v, str) else v.decode("utf-8", "replace"))
    for name in DATABASE_HEADERS:
        if values.get(name):
            return values[name]
    return ""


def _handle(database: str, sql: str) -> bytes:
    return json.dumps({"database": database, "sql": sql}, separators=(",", ":")).encode()


def _statement(handle: bytes) -> tuple[str, str]:
    """(database, sql) of a statement handle of this server; InvalidArgument for anything else."""
    try:
        doc = json.loads(handle.decode("utf-8"))
        database, sql = doc["database"], doc["sql"]
    except (UnicodeDecodeError, ValueError, TypeError, KeyError):
        raise InvalidArgument("the statement handle is not one of this server's") from None
    if not isinstance(database, str) or not isinstance(sql, str):
        raise InvalidArgument("the statement handle is not one of this server's")
    return database, sql


def _handle_database(message) -> str | None:
    """The database a message's statement handle names (None: the message has no handle)."""
    if isinstance(message, sql_pb2.TicketStatementQuery):
        handle = message.statement_handle
    elif isinstance(message, (sql_pb2.CommandPreparedStatementQuery, sql_pb2.ActionClosePreparedStatementRequest)):
        handle = message.prepared_statement_handle
    else:
        return None
    try:
        return _statement(handle)[0]
    except InvalidArgument:
        return ""


def request_database(method: str, request, metadata) -> str | None:
    """The database a Flight request names for its token check: the statement handle's when it
    carries one, else the `database` header's ("" for none); None when `request` is no Flight SQL
    request (an InfluxDB 3 ticket: see server/api/flight.py). Never raises."""
    try:
        if method.endswith("/DoGet"):
            message = unpack(request.ticket)
        elif method.endswith(("/GetFlightInfo", "/GetSchema")):
            message = unpack(request.cmd)
        elif method.endswith("/DoAction"):
            message = unpack(request.body) if request.type == _CLOSE_PREPARED else None
        elif method.endswith("/DoPut"):
            message = unpack(request.flight_descriptor.cmd) if request is not None else None
        else:
            message = None
    except (NotServed, InvalidArgument):
        message = None
    if method.endswith("/DoGet") and message is None:
        return None
    db = _handle_database(message)
    return db if db is not None else header_database(metadata)


def _like(pattern: str | None):
    """A compiled regex of an SQL LIKE pattern (`%` any run, `_` one character; `\\` escapes), or
    None for no pattern (everything matches)."""
    if pattern is None:
        return None
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _matches(regex, value: str) -> bool:
    return regex is None or regex.fullmatch(value) is not None


class FlightSql:
    """The Flight SQL commands over `queries` (server/api/api_parts.py `Queries`). Each answer is an
    Arrow schema and its record batches; server/api/flight.py turns them into FlightInfo and FlightData."""

    def __init__(self, queries: Queries):
        self.queries = queries

    # -- GetFlightInfo / GetSchema --------------------------------------------------------------
    def plan(self, command, database: str, deadline_s: float | None) -> tuple[pa.Schema, bytes]:
        """(schema, ticket) of a command of a FlightDescriptor: the schema its DoGet answers."""
        if isinstance(command, sql_pb2.CommandStatementQuery):
            db, sql = self._database(database), command.query
            ticket = pack(sql_pb2.TicketStatementQuery(statement_handle=_handle(db, sql)))
            return self._query_schema(db, sql, deadline_s), ticket
        if isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            db, sql = _statement(command.prepared_statement_handle)
            ticket = pack(sql_pb2.TicketStatementQuery(statement_handle=command.prepared_statement_handle))
            return self._query_schema(db, sql, deadline_s), ticket
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return SQL_INFO_SCHEMA, pack(command)
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return _CATALOGS_SCHEMA, pack(command)
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            return _DB_SCHEMAS_SCHEMA, pack(command)
        if isinstance(command, sql_pb2.CommandGetTables):
            return (_TABLES_WITH_SCHEMA if command.include_schema else _TABLES_SCHEMA), pack(command)
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return _TABLE_TYPES_SCHEMA, pack(command)
        raise NotServed(f"the Flight SQL command {type(command).__name__} in a FlightDescriptor",
                        "send a query or a catalog command")

    # -- DoGet ------------------------------------------------------------------------------------
    def answer(self, command, database: str, deadline_s: float | None):
        """The answer to a ticket's command: a QueryResult (the caller reads its batches or closes
        it) for a statement, else a pa.Table."""
        if isinstance(command, sql_pb2.TicketStatementQuery):
            db, sql = _statement(command.statement_handle)
            return self._run(db, sql, deadline_s)
        if isinstance(command, sql_pb2.CommandGetSqlInfo):
            return sql_info_table(list(command.info))
        if isinstance(command, sql_pb2.CommandGetCatalogs):
            return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=_CATALOGS_SCHEMA)
        if isinstance(command, sql_pb2.CommandGetDbSchemas):
            rows = []
            if (not command.HasField("catalog") or command.catalog == CATALOG) and \
                    _matches(_like(command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern")
                                   else None), DB_SCHEMA):
                rows.append({"catalog_name": CATALOG, "db_schema_name": DB_SCHEMA})
            return pa.Table.from_pylist(rows, schema=_DB_SCHEMAS_SCHEMA)
        if isinstance(command, sql_pb2.CommandGetTables):
            return self._tables(command, database, deadline_s)
        if isinstance(command, sql_pb2.CommandGetTableTypes):
            return pa.Table.from_pylist([{"table_type": TABLE_TYPE}], schema=_TABLE_TYPES_SCHEMA)
        raise NotServed(f"the Flight SQL command {type(command).__name__} in a ticket",
                        "send the ticket GetFlightInfo answered")

    # -- DoAction ---------------------------------------------------------------------------------
    def act(self, action_type: str, body: bytes, database: str, deadline_s: float | None) -> list[bytes]:
        """The Result bodies of an action."""
        if action_type == _CREATE_PREPARED:
            request = unpack(body)
            if not isinstance(request, sql_pb2.ActionCreatePreparedStatementRequest):
                raise InvalidArgument("CreatePreparedStatement needs an ActionCreatePreparedStatementRequest")
            if request.HasField("transaction_id"):
                raise NotServed("a transaction", "run the query without one (queries are read-only)")
            db = self._database(database)
            schema = b""
            from iox_spark.server.query.params import placeholders

            positional, named = placeholders(request.query)
            if not positional and not named:  # a query without parameters is planned now for its schema
                schema = self._query_schema(db, request.query, deadline_s).serialize().to_pybytes()
            result = sql_pb2.ActionCreatePreparedStatementResult(
                prepared_statement_handle=_handle(db, request.query), dataset_schema=schema)
            return [pack(result)]
        if action_type == _CLOSE_PREPARED:
            request = unpack(body)
            if not isinstance(request, sql_pb2.ActionClosePreparedStatementRequest):
                raise InvalidArgument("ClosePreparedStatement needs an ActionClosePreparedStatementRequest")
            return []  # nothing is held for a statement
        raise NotServed(f"the action {action_type!r}",
                        f"this server's actions are {', '.join(name for name, _ in ACTIONS)}")

    # -- DoPut ------------------------------------------------------------------------------------
    def bind(self, command, parameters: pa.Table) -> bytes:
        """A DoPut of `parameters` to a prepared statement: the DoPutPreparedStatementResult (serialized)
        naming the handle of its query with the parameters bound."""
        if not isinstance(command, sql_pb2.CommandPreparedStatementQuery):
            raise NotServed(f"a DoPut of {type(command).__name__}" if command is not None else "a DoPut of no command",
                            "this server takes no writes over Flight SQL: use the write APIs")
        from iox_spark.server.query.params import bind_parameters, placeholders

        db, sql = _statement(command.prepared_statement_handle)
        if parameters.num_rows != 1:
            raise InvalidArgument(f"bind one row of parameters to a query ({parameters.num_rows} given)")
        row = parameters.to_pylist()[0]
        _positional, named = placeholders(sql)
        if named:
            bound = bind_parameters(sql, named=row)
        else:
            bound = bind_parameters(sql, positional=[row[name] for name in parameters.column_names])
        return sql_pb2.DoPutPreparedStatementResult(prepared_statement_handle=_handle(db, bound)).SerializeToString()

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _database(database: str) -> str:
        if not database:
            raise InvalidArgument(f"name the database in the {DATABASE_HEADERS[0]!r} header (or "
                                  f"{', '.join(repr(h) for h in DATABASE_HEADERS[1:])})")
        return database

    def _run(self, database: str, sql: str, deadline_s: float | None):
        from iox_spark.server.query.params import bind_parameters

        bind_parameters(sql)  # unbound placeholders: InvalidArgument before Spark sees them
        return self.queries.query(database, sql, "", False, deadline_s=deadline_s)

    def _query_schema(self, database: str, sql: str, deadline_s: float | None) -> pa.Schema:
        res = self._run(database, sql, deadline_s)
        res.close()  # planned, not run: its rows are read at DoGet
        return res.schema

    def _tables(self, command, database: str, deadline_s: float | None) -> pa.Table:
        schema = _TABLES_WITH_SCHEMA if command.include_schema else _TABLES_SCHEMA
        db = self._database(database)
        in_catalog = not command.HasField("catalog") or command.catalog == CATALOG
        schema_ok = _matches(_like(command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern")
                                   else None), DB_SCHEMA)
        types_ok = not command.table_types or TABLE_TYPE in command.table_types
        if not (in_catalog and schema_ok and types_ok):
            return schema.empty_table()
        names = self._run(db, "SHOW TABLES", deadline_s).table.column("tableName").to_pylist()
        wanted = _like(command.table_name_filter_pattern if command.HasField("table_name_filter_pattern") else None)
        rows = []
        for name in sorted(n for n in names if _matches(wanted, n)):
            row = {"catalog_name": CATALOG, "db_schema_name": DB_SCHEMA, "table_name": name, "table_type": TABLE_TYPE}
            if command.include_schema:
                quoted = "`" + name.replace("`", "``") + "`"
                row["table_schema"] = self._query_schema(db, f"SELECT * FROM {quoted}", deadline_s) \
                    .serialize().to_pybytes()
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=schema)


def flight_info(descriptor, schema: pa.Schema, ticket: bytes):
    """The FlightInfo of a planned command: its schema and one endpoint, this server, with `ticket`."""
    return flight_pb2.FlightInfo(schema=schema.serialize().to_pybytes(), flight_descriptor=descriptor,
                                 endpoint=[flight_pb2.FlightEndpoint(ticket=flight_pb2.Ticket(ticket=ticket))],
                                 total_records=-1, total_bytes=-1, ordered=True)
