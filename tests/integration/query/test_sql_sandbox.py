"""The Query API's SQL sandbox on the real server (server/query/sql_sandbox.py): only queries over the
tables of the request's database run; statements that are no query are INVALID_ARGUMENT, reads
of files, of other databases' views, of catalog tables and calls of functions reaching the JVM or
the host are PERMISSION_DENIED, each naming what was refused; ordinary queries keep their exact
answers."""
from __future__ import annotations

import uuid

import grpc
import pytest

from iox_spark.server.api.client import IoxClient
from iox_spark.chunk_store.views import table_view_name
from tests.timestamps import T0
from tests.rows import query_rows

PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def sandbox(iox_server):
    """(client, my database, another database): `cpu` and `mem` in mine, `secret` in the other;
    mine also has a table named "global_temp, <other>__secret", whose name renders like the
    other database's view in a plan's JSON."""
    c = IoxClient(f"127.0.0.1:{iox_server.grpc_port}")
    c.wait_ready(60)
    mine, other = f"sbx_{uuid.uuid4().hex[:10]}", f"sbx_other_{uuid.uuid4().hex[:10]}"
    tok = c.write(mine, "\n".join([
        f"cpu,host=a usage=1.5 {T0}", f"cpu,host=a usage=2.5 {T0 + 1}", f"cpu,host=b usage=10 {T0}",
        f"mem,host=a free=100i {T0}", f"mem,host=b free=200i {T0}",
        f"global_temp\\,\\ {other}__secret v=7 {T0}",
    ]))
    c.wait_applied(mine, tok, timeout_s=60)
    c.wait_applied(other, c.write(other, f"secret,k=x password=\"hunter2\" {T0}"), timeout_s=60)
    yield c, mine, other
    c.close()


def _refused(client, db, sql) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        client.query(db, sql)
    return ei.value


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sql, fragment", [
    ("SELECT value FROM text.`/etc/passwd`", "text.`/etc/passwd`"),
    ("SELECT * FROM parquet.`/tmp`", "parquet.`/tmp`"),
    ("SELECT * FROM csv.`file:///etc/passwd`", "csv.`file:///etc/passwd`"),
    ("SELECT * FROM json.`/etc/passwd`", "json.`/etc/passwd`"),
    ("SELECT * FROM orc.`/etc/passwd`", "orc.`/etc/passwd`"),
    ("SELECT * FROM binaryFile.`/etc`", "binaryFile.`/etc`"),
    # the same, hidden in subqueries, a CTE, EXISTS / IN, VALUES, a table-valued function's argument
    ("SELECT (SELECT max(value) FROM text.`/etc/passwd`) AS x", "text.`/etc/passwd`"),
    ("SELECT * FROM cpu WHERE EXISTS (SELECT 1 FROM text.`/etc/hostname`)", "text.`/etc/hostname`"),
    ("SELECT * FROM cpu WHERE host IN (SELECT value FROM text.`/etc/hostname`)", "text.`/etc/hostname`"),
    ("WITH f AS (SELECT value FROM text.`/etc/passwd`) SELECT * FROM f", "text.`/etc/passwd`"),
    ("SELECT * FROM VALUES ((SELECT max(value) FROM text.`/etc/passwd`)) AS t(x)", "text.`/etc/passwd`"),
    ("SELECT * FROM explode((SELECT collect_list(value) FROM text.`/etc/passwd`))", "text.`/etc/passwd`"),
    ("EXPLAIN SELECT * FROM text.`/etc/passwd`", "text.`/etc/passwd`"),
])
def test_reading_files_is_permission_denied(sandbox, sql, fragment):
    client, mine, _ = sandbox
    err = _refused(client, mine, sql)
    assert err.code() == PERMISSION_DENIED, (sql, err.details())
    assert "reading files" in err.details() and fragment in err.details(), err.details()
    assert "root:" not in err.details()


@pytest.mark.parametrize("sql, function", [
    ("SELECT reflect('java.lang.System', 'getProperty', 'user.home') AS x", "reflect"),
    ("SELECT java_method('java.lang.System', 'getenv', 'HOME') AS x", "java_method"),
    ("SELECT try_reflect('java.lang.System', 'getenv', 'HOME') AS x", "try_reflect"),
    ("SELECT REFLECT('java.lang.System', 'getenv', 'HOME') AS x", "REFLECT"),
    ("SELECT system.builtin.reflect('java.lang.System', 'getenv', 'HOME') AS x", "system.builtin.reflect"),
    ("SELECT host FROM cpu WHERE host IN (SELECT java_method('java.lang.System', 'getenv', 'HOME'))",
     "java_method"),
    ("SELECT transform(array(1), x -> reflect('java.lang.System', 'getenv', 'HOME')) AS x", "reflect"),
    ("SELECT sum(usage) OVER w FROM cpu WINDOW w AS (PARTITION BY reflect('java.lang.Thread', 'dumpStack'))",
     "reflect"),
    ("SELECT * FROM cpu LATERAL VIEW java_method('java.lang.System', 'getenv', 'HOME') t AS x", "java_method"),
    ("SELECT input_file_name() AS f FROM cpu", "input_file_name"),
    ("SELECT from_xml('<a/>', 'a INT', map('rowValidationXSDPath', '/etc/passwd')) AS x", "from_xml"),
    ("SELECT * FROM read_files('/etc/passwd')", "read_files"),
    ("SELECT * FROM python_worker_logs()", "python_worker_logs"),
])
def test_functions_reaching_the_jvm_or_the_host_are_permission_denied(sandbox, sql, function):
    client, mine, _ = sandbox
    err = _refused(client, mine, sql)
    assert err.code() == PERMISSION_DENIED, (sql, err.details())
    assert f"function {function} is refused" in err.details(), err.details()


def test_functions_that_are_not_builtin_are_permission_denied(sandbox):
    client, mine, _ = sandbox
    for sql, name in [("SELECT default.my_udf(1) AS x", "default.my_udf"), ("SELECT no_such_fn(1) AS x", "no_such_fn"),
                      ("SELECT * FROM my_tvf(TABLE(cpu))", "my_tvf")]:
        err = _refused(client, mine, sql)
        assert err.code() == PERMISSION_DENIED and f"function {name} is refused" in err.details(), err.details()


def test_other_databases_views_are_permission_denied_and_stay(sandbox, iox_server):
    client, mine, other = sandbox
    view = table_view_name(other, "secret")
    assert view in {r.viewName for r in iox_server.spark.sql("SHOW VIEWS IN global_temp").collect()}
    for sql in [f"SELECT * FROM global_temp.{view}",
                f"SELECT * FROM `global_temp`.`{view}`",
                f"SELECT * FROM cpu WHERE EXISTS (SELECT * FROM global_temp.{view})",
                f"SELECT (SELECT max(password) FROM global_temp.{view}) AS p",
                f"WITH s AS (SELECT * FROM global_temp.{view}) SELECT * FROM s",
                f"SELECT sum(usage) OVER w FROM cpu WINDOW w AS (PARTITION BY (SELECT max(password) "
                f"FROM global_temp.{view}))",
                f"SELECT * FROM IDENTIFIER('global_temp.{view}')",
                f"DESCRIBE global_temp.{view}",
                f"SHOW COLUMNS FROM global_temp.{view}",
                f"SELECT * FROM global_temp.{table_view_name(mine, 'cpu')}"]:  # even its own database's
        err = _refused(client, mine, sql)
        assert err.code() == PERMISSION_DENIED, (sql, err.details())
        assert "global_temp" in err.details() and "hunter2" not in err.details(), err.details()
    # the other database's table by its bare name is no table of mine
    err = _refused(client, mine, "SELECT * FROM secret")
    assert err.code() == PERMISSION_DENIED and "secret is refused" in err.details(), err.details()
    for sql in [f"DROP VIEW global_temp.{view}", f"CREATE OR REPLACE GLOBAL TEMP VIEW {view} AS SELECT 1 AS x",
                f"ALTER VIEW global_temp.{view} AS SELECT 1 AS x"]:
        err = _refused(client, mine, sql)
        assert err.code() == INVALID_ARGUMENT and "is not a query" in err.details(), (sql, err.details())
    assert query_rows(client, other, "SELECT k, password FROM secret") == [{"k": "x", "password": "hunter2"}]


def test_a_name_rendering_like_another_databases_view_is_read_exactly(sandbox):
    """Mine has a table named "global_temp, <other>__secret": as one name it is mine; as two
    (global_temp.<other>__secret) it is the other database's view, refused."""
    client, mine, other = sandbox
    assert query_rows(client, mine, f"SELECT v FROM `global_temp, {other}__secret`") == [{"v": 7.0}]
    err = _refused(client, mine, f"SELECT * FROM `global_temp`.`{other}__secret`")
    assert err.code() == PERMISSION_DENIED and "hunter2" not in err.details(), err.details()


def test_catalog_tables_and_views_are_permission_denied_and_not_listed(sandbox, iox_server):
    """A table of Spark's catalog (made over Spark Connect, say) is not readable by its name, nor
    listed by SHOW TABLES."""
    client, mine, other = sandbox
    name = f"sbx_admin_{uuid.uuid4().hex[:8]}"
    iox_server.spark.sql(f"CREATE TABLE default.{name} USING parquet AS SELECT 42 AS answer")
    try:
        for sql in [f"SELECT * FROM {name}", f"SELECT * FROM default.{name}",
                    f"SELECT * FROM spark_catalog.default.{name}", f"TABLE {name}", f"DESCRIBE {name}"]:
            err = _refused(client, mine, sql)
            assert err.code() == PERMISSION_DENIED and name in err.details(), (sql, err.details())
        tables = client.query(mine, "SHOW TABLES").column("tableName").to_pylist()
        assert sorted(tables) == ["cpu", f"global_temp, {other}__secret", "mem"]
    finally:
        iox_server.spark.sql(f"DROP TABLE IF EXISTS default.{name}")
    for sql, where in [("SHOW TABLES IN global_temp", "global_temp"), ("SHOW TABLES IN default", "default"),
                       ("SHOW COLUMNS FROM cpu IN global_temp", "global_temp")]:
        err = _refused(client, mine, sql)
        assert err.code() == PERMISSION_DENIED and f"{where} is refused" in err.details(), (sql, err.details())


@pytest.mark.parametrize("sql, statement", [
    ("CREATE TABLE x (a INT) USING parquet", "CreateTable"),
    ("CREATE TABLE x USING parquet LOCATION '/tmp/x' AS SELECT 1 AS a", "CreateTableAsSelect"),
    ("CREATE OR REPLACE TEMP VIEW cpu AS SELECT 1 AS a", "CreateViewCommand"),
    ("CREATE TEMPORARY FUNCTION f(x INT) RETURNS INT RETURN x + 1", "CreateSQLFunctionCommand"),
    ("CREATE FUNCTION f AS 'com.example.F' USING JAR '/tmp/x.jar'", "CreateFunction"),
    ("DROP TABLE cpu", "DropTable"),
    ("DROP VIEW cpu", "DropView"),
    ("ALTER VIEW cpu AS SELECT 1 AS a", "AlterViewAs"),
    ("INSERT INTO cpu VALUES (1)", "InsertIntoStatement"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/out' USING parquet SELECT * FROM cpu", "InsertIntoDir"),
    ("WITH c AS (SELECT * FROM cpu) INSERT INTO mem SELECT * FROM c", "InsertIntoStatement"),
    ("DELETE FROM cpu WHERE usage > 1", "DeleteFromTable"),
    ("UPDATE cpu SET usage = 1", "UpdateTable"),
    ("MERGE INTO cpu USING mem ON cpu.host = mem.host WHEN MATCHED THEN DELETE", "MergeIntoTable"),
    ("CACHE TABLE cpu", "CacheTable"),
    ("CACHE TABLE c2 AS SELECT * FROM cpu", "CacheTableAsSelect"),
    ("UNCACHE TABLE cpu", "UncacheTable"),
    ("CLEAR CACHE", "ClearCacheCommand"),
    ("REFRESH TABLE cpu", "RefreshTable"),
    ("ANALYZE TABLE cpu COMPUTE STATISTICS", "AnalyzeTable"),
    ("MSCK REPAIR TABLE cpu", "RepairTable"),
    ("SET spark.sql.runSQLOnFiles=true", "SetCommand"),
    ("SET", "SetCommand"),
    ("RESET", "ResetCommand"),
    ("RESET spark.sql.runSQLOnFiles", "ResetCommand"),
    ("ADD JAR /tmp/x.jar", "AddJarsCommand"),
    ("ADD FILE /etc/passwd", "AddFilesCommand"),
    ("ADD ARCHIVE /tmp/x.zip", "AddArchivesCommand"),
    ("LIST FILES", "ListFilesCommand"),
    ("USE global_temp", "SetCatalogAndNamespace"),
    ("SHOW VIEWS IN global_temp", "ShowViews"),
    ("SHOW FUNCTIONS", "ShowFunctions"),
    ("DESCRIBE FUNCTION reflect", "DescribeFunction"),
    ("EXECUTE IMMEDIATE 'SELECT 1'", "UnresolvedExecuteImmediate"),
    ("EXPLAIN CREATE TABLE x (a INT) USING parquet", "CreateTable"),
])
def test_statements_that_are_no_query_are_invalid_argument(sandbox, sql, statement):
    client, mine, _ = sandbox
    err = _refused(client, mine, sql)
    assert err.code() == INVALID_ARGUMENT, (sql, err.details())
    assert f"{statement} is not a query" in err.details(), err.details()


@pytest.mark.parametrize("sql, construct", [
    ("SELECT TRANSFORM(host) USING 'cat /etc/passwd' AS (x) FROM cpu", "ScriptTransformation"),
    ("SELECT * FROM IDENTIFIER('global' || '_temp.x')", "PlanWithUnresolvedIdentifier"),
    ("SELECT IDENTIFIER('ref' || 'lect')('java.lang.System', 'getenv', 'HOME') AS x",
     "ExpressionWithUnresolvedIdentifier"),
])
def test_query_constructs_outside_the_sandbox_are_permission_denied(sandbox, sql, construct):
    client, mine, _ = sandbox
    err = _refused(client, mine, sql)
    assert err.code() == PERMISSION_DENIED and f"{construct} is refused" in err.details(), err.details()


def test_a_refused_statement_changed_nothing(sandbox):
    client, mine, _ = sandbox
    for sql in ["DROP VIEW cpu", "CREATE OR REPLACE TEMP VIEW cpu AS SELECT 1 AS a", "SET spark.sql.runSQLOnFiles=true",
                "CACHE TABLE cpu"]:
        _refused(client, mine, sql)
    assert query_rows(client, mine, "SELECT host, usage FROM cpu ORDER BY host, usage") == [
        {"host": "a", "usage": 1.5}, {"host": "a", "usage": 2.5}, {"host": "b", "usage": 10.0}]


def test_the_query_session_reads_no_path_and_has_no_reflect(iox_server):
    """Should a plan slip past the check, the session it runs in still refuses: path reads are
    off and the denied functions are gone from its registry (other sessions keep theirs)."""
    from pyspark.errors import AnalysisException

    from iox_spark.server.errors import QueryRefused
    from iox_spark.server.query.sql_sandbox import check_query

    session = iox_server.spark.newSession()
    with pytest.raises(QueryRefused):
        check_query(session, "any", "SELECT value FROM text.`/etc/passwd`")
    assert session.conf.get("spark.sql.runSQLOnFiles") == "false"
    for sql in ["SELECT value FROM text.`/etc/passwd`", "SELECT reflect('java.lang.System', 'getenv', 'HOME')"]:
        with pytest.raises(AnalysisException):
            session.sql(sql).collect()
    assert iox_server.spark.sql("SELECT reflect('java.lang.String', 'valueOf', 1) AS x").collect()[0].x == "1"


# --- queries that run ----------------------------------------------------------------------------

def test_aggregates_joins_ctes_and_subqueries_answer_exactly(sandbox):
    client, mine, _ = sandbox
    assert query_rows(client, mine, "SELECT host, count(*) AS n, sum(usage) AS s, max(usage) AS m FROM cpu "
                               "GROUP BY host ORDER BY host") == [
        {"host": "a", "n": 2, "s": 4.0, "m": 2.5}, {"host": "b", "n": 1, "s": 10.0, "m": 10.0}]
    assert query_rows(client, mine, "SELECT c.host, c.usage, m.free FROM cpu c JOIN mem m ON c.host = m.host "
                               "AND c.time_ns = m.time_ns ORDER BY c.host") == [
        {"host": "a", "usage": 1.5, "free": 100}, {"host": "b", "usage": 10.0, "free": 200}]
    assert query_rows(client, mine, "WITH hi AS (SELECT host, max(usage) AS m FROM cpu GROUP BY host), "
                               "top AS (SELECT * FROM hi WHERE m > 5) SELECT host, m FROM top") == [
        {"host": "b", "m": 10.0}]
    assert query_rows(client, mine, "SELECT host, free FROM mem WHERE host IN (SELECT host FROM cpu WHERE usage > 5) "
                               "AND EXISTS (SELECT 1 FROM cpu) AND free > (SELECT min(free) FROM mem)") == [
        {"host": "b", "free": 200}]
    assert query_rows(client, mine, "SELECT (SELECT count(*) FROM cpu) AS n, (SELECT sum(free) FROM mem) AS f") == [
        {"n": 3, "f": 300}]
    # a CTE named like a table of the database reads the CTE
    assert query_rows(client, mine, "WITH mem AS (SELECT 1 AS one) SELECT one FROM mem") == [{"one": 1}]


def test_window_functions_and_named_windows_answer_exactly(sandbox):
    client, mine, _ = sandbox
    expected = [{"host": "a", "usage": 1.5, "rn": 2}, {"host": "a", "usage": 2.5, "rn": 1},
                {"host": "b", "usage": 10.0, "rn": 1}]
    assert query_rows(client, mine, "SELECT host, usage, row_number() OVER (PARTITION BY host ORDER BY time_ns DESC) "
                               "AS rn FROM cpu ORDER BY host, usage") == expected
    assert query_rows(client, mine, "SELECT host, usage, row_number() OVER w AS rn FROM cpu "
                               "WINDOW w AS (PARTITION BY host ORDER BY time_ns DESC) ORDER BY host, usage") == expected
    assert query_rows(client, mine, "SELECT host, sum(usage) OVER (PARTITION BY host) AS s FROM cpu QUALIFY "
                               "row_number() OVER (PARTITION BY host ORDER BY time_ns) = 1 ORDER BY host") == [
        {"host": "a", "s": 4.0}, {"host": "b", "s": 10.0}]


def test_table_valued_functions_values_and_lateral_views_answer_exactly(sandbox):
    client, mine, _ = sandbox
    assert query_rows(client, mine, "SELECT sum(id) AS s, count(*) AS n FROM range(10)") == [{"s": 45, "n": 10}]
    assert query_rows(client, mine, "SELECT * FROM range(1, 4) AS r(i) JOIN (SELECT count(*) AS n FROM cpu) "
                               "ORDER BY i") == [{"i": 1, "n": 3}, {"i": 2, "n": 3}, {"i": 3, "n": 3}]
    assert query_rows(client, mine, "SELECT a, b FROM VALUES (1, 'x'), (2, NULL) AS t(a, b) ORDER BY a") == [
        {"a": 1, "b": "x"}, {"a": 2, "b": None}]
    assert query_rows(client, mine, "SELECT host, x FROM mem LATERAL VIEW explode(array(1, 2)) t AS x "
                               "WHERE host = 'a' ORDER BY x") == [{"host": "a", "x": 1}, {"host": "a", "x": 2}]
    assert query_rows(client, mine, "SELECT * FROM stack(2, 'p', 1, 'q', 2) AS s(k, v) ORDER BY k") == [
        {"k": "p", "v": 1}, {"k": "q", "v": 2}]
    assert query_rows(client, mine, "SELECT system.builtin.abs(-3) AS a, builtin.lower('X') AS l") == [{"a": 3, "l": "x"}]


def test_explain_describe_and_show_tables_run(sandbox):
    client, mine, other = sandbox
    plan = client.query(mine, "EXPLAIN SELECT host, count(*) FROM cpu GROUP BY host").column(0).to_pylist()[0]
    assert "Physical Plan" in plan
    assert client.query(mine, "DESCRIBE cpu").column("col_name").to_pylist()[:2] == ["host", "usage"]
    assert client.query(mine, "SHOW COLUMNS FROM mem").column(0).to_pylist()[:2] == ["host", "free"]
    assert client.query(mine, "DESCRIBE SELECT host FROM cpu").column("col_name").to_pylist() == ["host"]
    assert sorted(client.query(mine, "SHOW TABLES").column("tableName").to_pylist()) == [
        "cpu", f"global_temp, {other}__secret", "mem"]


def test_a_table_read_with_options_is_still_the_table(sandbox):
    """Options given to a relation (WITH ('path' = ...)) do not turn a table view into a file read."""
    client, mine, _ = sandbox
    assert query_rows(client, mine, "SELECT host, free FROM mem WITH ('path' = '/etc/passwd') ORDER BY host") == [
        {"host": "a", "free": 100}, {"host": "b", "free": 200}]


def test_unknown_names_and_bad_sql(sandbox):
    client, mine, _ = sandbox
    err = _refused(client, mine, "SELECT * FROM no_such_table")
    assert err.code() == PERMISSION_DENIED and "no_such_table is refused" in err.details(), err.details()
    err = _refused(client, mine, "SELEC 1")
    assert err.code() == INVALID_ARGUMENT and "query failed" in err.details(), err.details()
    err = _refused(client, mine, "SELECT nope FROM cpu")
    assert err.code() == INVALID_ARGUMENT and "nope" in err.details(), err.details()
