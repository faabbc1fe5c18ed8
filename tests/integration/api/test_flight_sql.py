"""Flight SQL on the gRPC port through ADBC's Flight SQL driver (adbc-driver-flightsql, its DBAPI):
statement queries with exact rows, prepared statements with positional and named parameters
bound as literals, the metadata a client asks on connect (adbc_get_objects: catalogs, schemas,
tables and their columns; table types; SqlInfo), the database chosen by the `database` header as
InfluxDB 3 clients send it, and errors with the status a client acts on."""
from __future__ import annotations

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pytest
from adbc_driver_flightsql import DatabaseOptions
from adbc_driver_manager import ProgrammingError
from adbc_driver_manager import dbapi as adbc_dbapi
from tests.timestamps import T0


def _connect(iox_server, database: str | None):
    kwargs = {f"{DatabaseOptions.RPC_CALL_HEADER_PREFIX.value}database": database} if database else {}
    # autocommit: queries need no transaction (the server has none)
    return flight_sql.connect(f"grpc://127.0.0.1:{iox_server.grpc_port}", db_kwargs=kwargs, autocommit=True)


@pytest.fixture
def conn(iox_server, client, db):
    token = client.write_response(db, "\n".join([
        f"cpu,host=a usage=1.5,n=3i {T0}",
        f"cpu,host=b usage=2.5,n=4i {T0 + 1000}",
        f"cpu,host=it's usage=9.5,n=5i {T0 + 2000}",
        f"mem,host=a free=7i {T0}",
    ])).token_text
    client.query(db, "SELECT 1 FROM cpu", after=token)  # every row visible
    with _connect(iox_server, db) as c:
        yield c


def test_a_statement_query_answers_its_exact_rows(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT host, usage, n, time FROM cpu ORDER BY time")
        t = cur.fetch_arrow_table()
    assert t.schema == pa.schema([("host", pa.string()), ("usage", pa.float64()), ("n", pa.int64()),
                                  ("time", pa.timestamp("us", tz="UTC"))])
    assert t.column("host").to_pylist() == ["a", "b", "it's"]
    assert t.column("n").to_pylist() == [3, 4, 5]
    assert t.column("time").cast(pa.int64()).to_pylist() == [T0 // 1000, T0 // 1000 + 1, T0 // 1000 + 2]
    with conn.cursor() as cur:
        cur.execute("SELECT host, sum(n) AS s FROM cpu GROUP BY host ORDER BY host")
        assert cur.fetchall() == [("a", 3), ("b", 4), ("it's", 5)]
        cur.execute("SELECT host FROM cpu WHERE host = 'zzz'")
        assert cur.fetch_arrow_table().num_rows == 0


def test_prepared_statements_bind_positional_and_named_parameters_as_literals(conn):
    with conn.cursor() as cur:
        cur.execute("SELECT n FROM cpu WHERE host = ? AND usage > ? ORDER BY n", ("it's", 1.0))
        assert cur.fetchall() == [(5,)]
        cur.execute("SELECT n FROM cpu WHERE host = ? ORDER BY n", ("a' OR '1'='1",))  # a value, never SQL
        assert cur.fetchall() == []
        cur.execute("SELECT n FROM cpu WHERE n >= ? AND n < ? ORDER BY n", (4, 6))
        assert cur.fetchall() == [(4,), (5,)]
        cur.execute("SELECT n, '?' AS q FROM cpu WHERE host = ? -- a comment with ?\nORDER BY n", ("b",))
        assert cur.fetchall() == [(4, "?")]
        cur.execute("SELECT n FROM cpu WHERE n = ? - ?", (9, -1))  # no comment out of a minus sign
        assert cur.fetchall() == []
        cur.execute("SELECT count(*) FROM cpu WHERE host = $host AND n > $min",
                    pa.record_batch([pa.array(["a"]), pa.array([2])], names=["host", "min"]))
        assert cur.fetchall() == [(1,)]


def test_a_query_with_a_placeholder_and_no_value_is_refused(conn):
    with conn.cursor() as cur, pytest.raises(adbc_dbapi.Error, match=r"placeholders"):
        cur.execute("SELECT n FROM cpu WHERE host = ?")
        cur.fetchall()


def test_get_objects_lists_the_databases_tables_and_their_columns(conn):
    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    assert [c["catalog_name"] for c in objects] == ["public"]
    schemas = objects[0]["catalog_db_schemas"]
    assert [s["db_schema_name"] for s in schemas] == ["iox"]
    tables = {t["table_name"]: t for t in schemas[0]["db_schema_tables"]}
    assert sorted(tables) == ["cpu", "mem"]
    assert {t["table_type"] for t in tables.values()} == {"BASE TABLE"}
    # the columns of SELECT *, in its order
    assert [c["column_name"] for c in tables["cpu"]["table_columns"]] == ["host", "n", "usage", "time", "time_ns"]
    assert [c["column_name"] for c in tables["mem"]["table_columns"]] == ["host", "free", "time", "time_ns"]
    only_cpu = conn.adbc_get_objects(depth="tables", table_name_filter="c%").read_all().to_pylist()
    assert [t["table_name"] for t in only_cpu[0]["catalog_db_schemas"][0]["db_schema_tables"]] == ["cpu"]
    assert conn.adbc_get_table_types() == ["BASE TABLE"]
    assert conn.adbc_get_table_schema("cpu").names == ["host", "n", "usage", "time", "time_ns"]


def test_get_info_names_the_server(conn):
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "iox-spark"
    assert info["vendor_arrow_version"] == pa.__version__


def test_the_database_comes_from_the_header_and_errors_say_what_to_do(iox_server, conn, db):
    with _connect(iox_server, None) as c, c.cursor() as cur:
        with pytest.raises(ProgrammingError, match="name the database in the 'database' header"):
            cur.execute("SELECT 1")
    with _connect(iox_server, db + "_none") as c, c.cursor() as cur:
        with pytest.raises(adbc_dbapi.Error, match="not found|NOT_FOUND"):
            cur.execute("SELECT * FROM cpu")
    with conn.cursor() as cur:
        with pytest.raises(adbc_dbapi.Error, match="query failed"):
            cur.execute("SELECT nope FROM cpu")
        with pytest.raises(adbc_dbapi.Error, match="refused|not allowed|read-only"):
            cur.execute("DROP TABLE cpu")
