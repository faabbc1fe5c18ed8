"""Authentication: one `iox serve` subprocess of its own (its own Spark application, so Spark
Connect has the token; the embedded broker in memory), with `--auth-token` (from IOX_AUTH_TOKEN)
and a TOML `--auth-tokens-file`; gRPC, HTTP, the CLI, Spark Connect and a SIGHUP reload against it.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from iox_spark.server.api.client import IoxClient
from iox_spark.server.runtime.broker import free_port
from tests.waiting import accepts_connections
from tests.timestamps import T0
from tests.project_code import ROOT

IOX = os.path.join(os.path.dirname(sys.executable), "iox")
MAIN = "main-" + uuid.uuid4().hex
WRITER = "writer-" + uuid.uuid4().hex
READER = "reader-" + uuid.uuid4().hex
NEW = "new-" + uuid.uuid4().hex
ADMIN_B = "admin-bucket-" + uuid.uuid4().hex
DB = "metrics"

TOKENS = f"""
[[tokens]]
name = "writer"
token = "{WRITER}"
databases = ["{DB}", "org_bucket"]
permissions = ["write"]

[[tokens]]
name = "reader"
token = "{READER}"
databases = ["*"]
permissions = ["query"]

[[tokens]]
name = "admin-of-one-bucket"
token = "{ADMIN_B}"
databases = ["org_bucket"]
permissions = ["write", "query", "delete", "admin"]
"""


class _Srv:
    pass


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    s = _Srv()
    s.tokens_file = str(d / "tokens.toml")
    with open(s.tokens_file, "w") as f:
        f.write(TOKENS)
    s.grpc_port, s.http_port, s.sc_port = free_port(), free_port(), free_port()
    env = dict(os.environ, IOX_AUTH_TOKEN=MAIN,
               IOX_SPARK_CONF="spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1")
    for var in ("IOX_TOKEN", "IOX_BIND_HOST", "IOX_INSECURE"):
        env.pop(var, None)
    s.log_path = str(d / "server.log")
    log = open(s.log_path, "ab")
    s.proc = subprocess.Popen(
        [IOX, "serve", "--data-dir", str(d / "data"), "--grpc-port", str(s.grpc_port), "--http-port",
         str(s.http_port), "--spark-connect-port", str(s.sc_port), "--driver-memory", "2g", "--partitions", "2",
         "--broker-storage", "memory", "--auth-tokens-file", s.tokens_file, "--write-path-rt-priority", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    s.addr = f"127.0.0.1:{s.grpc_port}"
    try:
        with IoxClient(s.addr) as c:  # health stays open: no token needed to wait
            deadline = time.monotonic() + 240
            while True:
                assert s.proc.poll() is None, s.log()
                if not accepts_connections(s.grpc_port):  # no call before it listens (see accepts_connections)
                    assert time.monotonic() < deadline, s.log()
                    time.sleep(0.05)
                    continue
                try:
                    c.wait_ready(2)
                    break
                except TimeoutError:
                    assert time.monotonic() < deadline, s.log()
        yield s
    finally:
        s.proc.send_signal(signal.SIGTERM)
        try:
            s.proc.wait(120)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
        log.close()


def _log(self) -> str:
    with open(self.log_path, errors="replace") as f:
        return f.read()[-5000:]


_Srv.log = _log


def _code(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


# -- gRPC ---------------------------------------------------------------------------------
def test_grpc_requires_a_token(srv):
    with IoxClient(srv.addr) as c:
        assert _code(lambda: c.write(DB, f"cpu v=1 {T0}"))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: c.query(DB, "SELECT 1"))[0] == grpc.StatusCode.UNAUTHENTICATED
        assert _code(lambda: c.status())[0] == grpc.StatusCode.UNAUTHENTICATED
        # reflection stays open
        stub = reflection_pb2_grpc.ServerReflectionStub(c.channel)
        resp = next(iter(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
        assert any(s.name == "iox.write.WriteService" for s in resp.list_services_response.service)
    with IoxClient(srv.addr, token="wrong") as c:
        code, details = _code(lambda: c.write(DB, f"cpu v=1 {T0}"))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "invalid token" in details


def test_grpc_with_the_main_token(srv):
    with IoxClient(srv.addr, token=MAIN) as c:
        tok = c.write(DB, f"cpu,host=a v=1 {T0}\ncpu,host=b v=2 {T0 + 1}")
        c.wait_visible(DB, tok, timeout_s=120)
        assert c.query(DB, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 2}]
        assert any(d["name"] == DB for d in c.status()["databases"])  # all databases: admin
        c.persist(DB)


def test_grpc_scoped_tokens(srv):
    with IoxClient(srv.addr, token=WRITER) as w:
        w.write(DB, f"cpu,host=c v=3 {T0 + 2}")
        code, details = _code(lambda: w.write("other", f"cpu v=1 {T0}"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'other'" in details
        code, details = _code(lambda: w.query(DB, "SELECT 1"))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "query" in details
        assert _code(lambda: w.delete(DB, 0, 1))[0] == grpc.StatusCode.PERMISSION_DENIED
    with IoxClient(srv.addr, token=READER) as r:
        assert r.query(DB, "SELECT 1 AS x").to_pylist() == [{"x": 1}]
        assert r.status(DB)["databases"][0]["name"] == DB  # one database: query
        assert DB in {d["name"] for d in r.status()["databases"]}  # a listing: every database it may query
        for admin_call in (lambda: r.persist(DB), lambda: r.compact(DB, "cpu", "p"),
                           lambda: r.retry_poisoned(DB), lambda: r.accept_poisoned(DB),
                           lambda: r.accept_lost_writes(DB)):
            code, details = _code(admin_call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in details
        assert _code(lambda: r.write(DB, f"cpu v=1 {T0}"))[0] == grpc.StatusCode.PERMISSION_DENIED


def test_flight_doget_needs_query_on_the_tickets_database(srv):
    import json

    import pyarrow.flight as fl

    def do_get(token, database):
        opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())] if token else [])
        ticket = fl.Ticket(json.dumps({"database": database, "sql_query": "SELECT 1 AS x", "query_type": "sql"}).encode())
        with fl.FlightClient(f"grpc+tcp://127.0.0.1:{srv.grpc_port}") as f:
            return f.do_get(ticket, opts).read_all().to_pylist()

    with IoxClient(srv.addr, token=MAIN) as m:  # the database exists
        m.write(DB, f"cpu,host=f v=1 {T0}")
    assert do_get(READER, DB) == [{"x": 1}]
    with pytest.raises(fl.FlightUnauthenticatedError):
        do_get(None, DB)
    with pytest.raises(fl.FlightUnauthorizedError, match="query"):
        do_get(WRITER, DB)  # write only
    with pytest.raises(fl.FlightUnauthorizedError, match="'metrics'"):
        do_get(ADMIN_B, DB)  # every permission, on another database


def test_flight_sql_needs_query_on_the_database_of_its_header_or_handle(srv):
    """ADBC's Flight SQL driver with a token: the `database` header is the database its scope is
    checked on; a statement handle naming another database is checked on that one (GetFlightInfo,
    DoGet, DoPut), so a forged handle reads nothing beyond the token's databases."""
    import adbc_driver_flightsql.dbapi as flight_sql
    import pyarrow as pa
    import pyarrow.flight as fl
    from adbc_driver_flightsql import DatabaseOptions
    from adbc_driver_manager import dbapi as adbc_dbapi

    from iox_spark.iox import flight_sql_pb2
    from iox_spark.server.api.flight_sql import pack

    with IoxClient(srv.addr, token=MAIN) as m:  # both databases exist, these rows applied
        m.wait_applied(DB, m.write(DB, f"cpu,host=fsql-m v=1 {T0}"), timeout_s=60)
        m.wait_applied("org_bucket", m.write("org_bucket", f"cpu,host=fsql-o v=2 {T0}"), timeout_s=60)

    def rows(token, database, sql="SELECT host FROM cpu WHERE host LIKE 'fsql-%'"):
        kwargs = {f"{DatabaseOptions.RPC_CALL_HEADER_PREFIX.value}database": database}
        if token:
            kwargs[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
        with flight_sql.connect(f"grpc://127.0.0.1:{srv.grpc_port}", db_kwargs=kwargs, autocommit=True) as c, \
                c.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()

    assert rows(READER, DB) == [("fsql-m",)]
    assert rows(ADMIN_B, "org_bucket") == [("fsql-o",)]
    with pytest.raises(adbc_dbapi.Error, match="(?i)unauthenticated|no token"):
        rows(None, DB)
    with pytest.raises(adbc_dbapi.Error, match="query"):
        rows(WRITER, DB)  # write only
    with pytest.raises(adbc_dbapi.Error, match="'metrics'"):
        rows(ADMIN_B, DB)  # every permission, on another database

    handle = json.dumps({"database": DB, "sql": "SELECT host FROM cpu WHERE host LIKE 'fsql-%'"}).encode()
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {ADMIN_B}".encode()),
                                         (b"database", b"org_bucket")])
    forged = fl.FlightDescriptor.for_command(pack(flight_sql_pb2.CommandPreparedStatementQuery(
        prepared_statement_handle=handle)))
    ticket = fl.Ticket(pack(flight_sql_pb2.TicketStatementQuery(statement_handle=handle)))
    with fl.FlightClient(f"grpc+tcp://127.0.0.1:{srv.grpc_port}") as f:
        with pytest.raises(fl.FlightUnauthorizedError, match="'metrics'"):
            f.get_flight_info(forged, opts)
        with pytest.raises(fl.FlightUnauthorizedError, match="'metrics'"):
            f.do_get(ticket, opts).read_all()
        with pytest.raises(fl.FlightUnauthorizedError, match="'metrics'"):
            # the call's status comes with whichever step hears of it first; at the latest at close
            writer, reader = f.do_put(forged, pa.schema([("0", pa.string())]), opts)
            try:
                writer.write_table(pa.table({"0": ["f"]}))
                writer.done_writing()
                reader.read()
            finally:
                writer.close()
        # the same handle of the token's own database is answered
        own = json.dumps({"database": "org_bucket", "sql": "SELECT host FROM cpu WHERE host LIKE 'fsql-%'"}).encode()
        own_ticket = fl.Ticket(pack(flight_sql_pb2.TicketStatementQuery(statement_handle=own)))
        assert f.do_get(own_ticket, opts).read_all().to_pylist() == [{"host": "fsql-o"}]


def test_an_admin_token_of_one_database_never_acts_beyond_it(srv):
    """Server-wide operations need a token for every database; listings show its databases only;
    another database's retention cannot be set, by RPC or through the buckets API."""
    from iox_spark.iox import management_pb2

    with IoxClient(srv.addr, token=MAIN) as m:
        m.write("org_other", f"cpu v=1 {T0}")
        m.write("org_bucket", f"cpu v=1 {T0}")
    with IoxClient(srv.addr, token=ADMIN_B) as a:
        for server_wide in (lambda: a.freeze("x"), lambda: a.unfreeze()):
            code, details = _code(server_wide)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "whole server" in details
        assert [d["name"] for d in a.status()["databases"]] == ["org_bucket"]
        code, details = _code(lambda: a.status_proto(pool_members=True))  # the pool's members
        assert code == grpc.StatusCode.PERMISSION_DENIED and "whole server" in details
        names = a.mgmt_stub.ListDatabases(management_pb2.ListDatabasesRequest(), timeout=30).names
        assert list(names) == ["org_bucket"]
        assert _code(lambda: a.status("org_other"))[0] == grpc.StatusCode.PERMISSION_DENIED
        with IoxClient(srv.addr, token=MAIN) as m:  # frozen: the status names each database's offsets
            m.freeze("auth test")
            try:
                assert {"org_other", "org_bucket"} <= set(m.status()["freeze"]["offsets"])
                for status in (a.status(), a.status("org_bucket")):  # the token's databases only
                    assert status["freeze"]["frozen"] and set(status["freeze"]["offsets"]) == {"org_bucket"}
            finally:
                m.unfreeze()
        assert _code(lambda: a.set_retention("org_other", 3600))[0] == grpc.StatusCode.PERMISSION_DENIED
        assert a.set_retention("org_bucket", 0)["database"] == "org_bucket"
    auth = {"Authorization": f"Token {ADMIN_B}", "Content-Type": "application/json"}
    assert _http(srv.http_port, "GET", "/metrics", headers=auth)[0] == 403
    assert _http(srv.http_port, "GET", "/api/v2/orgs?org=org", headers=auth)[0] == 200
    st, raw = _http(srv.http_port, "GET", "/api/v2/buckets", headers=auth)
    assert st == 200 and [b["name"] for b in json.loads(raw)["buckets"]] == ["bucket"]
    st, raw = _http(srv.http_port, "GET", "/api/v2/buckets", headers={"Authorization": f"Token {MAIN}"})
    everything = {b["name"]: b["id"] for b in json.loads(raw)["buckets"]}
    assert {"bucket", "other"} <= set(everything)
    rule = json.dumps({"retentionRules": [{"type": "expire", "everySeconds": 3600}]}).encode()
    st, raw = _http(srv.http_port, "PATCH", f"/api/v2/buckets/{everything['other']}", rule, auth)
    assert st == 403 and "org_other" in json.loads(raw)["message"]
    with IoxClient(srv.addr, token=MAIN) as m:
        assert not m.status("org_other")["databases"][0].get("retention_period_s")  # untouched
    assert _http(srv.http_port, "GET", f"/api/v2/buckets/{everything['other']}", headers=auth)[0] == 403
    st, _raw = _http(srv.http_port, "PATCH", f"/api/v2/buckets/{everything['bucket']}",
                     json.dumps({"retentionRules": []}).encode(), auth)
    assert st == 200


# -- HTTP ---------------------------------------------------------------------------------
def _http(port, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        raw = r.read()
        return r.status, raw
    finally:
        conn.close()


def test_influxql_needs_query_on_every_database_it_reads_and_lists_only_the_tokens(srv):
    """`/query`: the `db` parameter's database, and each database a statement names (ON), is checked
    against the token's scope; SHOW DATABASES lists the token's databases only."""
    from urllib.parse import quote

    from influxdb import InfluxDBClient
    from influxdb.exceptions import InfluxDBClientError

    with IoxClient(srv.addr, token=MAIN) as m:  # both databases exist
        m.write(DB, f"cpu,host=iql-m v=1 {T0}")
        m.write("org_bucket", f"cpu,host=iql-o v=2 {T0}")

    def query(token, db, q):
        headers = {"Authorization": f"Token {token}"} if token else {}
        st, raw = _http(srv.http_port, "GET", f"/query?db={db}&q={quote(q)}", headers=headers)
        return st, json.loads(raw)

    st, doc = query(READER, DB, "SELECT v FROM cpu WHERE host = 'iql-m'")
    assert st == 200 and doc["results"][0]["series"][0]["values"][0][1] == 1.0
    assert query(None, DB, "SHOW MEASUREMENTS")[0] == 401
    st, doc = query(ADMIN_B, DB, "SHOW MEASUREMENTS")  # every permission, on another database
    assert st == 403 and "'metrics'" in doc["error"]
    st, doc = query(WRITER, DB, "SHOW MEASUREMENTS")
    assert st == 403 and "query" in doc["error"]
    st, doc = query(ADMIN_B, "org_bucket", "SHOW DATABASES; SHOW MEASUREMENTS ON metrics")
    assert st == 200 and doc["results"][0]["series"][0]["values"] == [["org_bucket"]]
    assert "'metrics'" in doc["results"][1]["error"]
    # the 1.x client sends the token as the password
    c = InfluxDBClient(host="127.0.0.1", port=srv.http_port, username="any", password=ADMIN_B, database="org_bucket")
    try:
        assert [p["host"] for p in c.query("SELECT v, host FROM cpu WHERE host =~ /^iql/").get_points()] == ["iql-o"]
        with pytest.raises(InfluxDBClientError, match="'metrics'"):
            c.query("SELECT v FROM cpu", database=DB)
    finally:
        c.close()


def test_http_open_endpoints_and_metrics(srv):
    assert _http(srv.http_port, "GET", "/health")[0] == 200
    assert _http(srv.http_port, "GET", "/ping")[0] == 204
    st, raw = _http(srv.http_port, "GET", "/metrics")
    assert st == 401 and json.loads(raw)["code"] == "unauthorized"
    assert _http(srv.http_port, "GET", "/metrics", headers={"Authorization": f"Token {READER}"})[0] == 403
    st, raw = _http(srv.http_port, "GET", "/metrics", headers={"Authorization": f"Bearer {MAIN}"})
    assert st == 200 and b"# " in raw


def test_http_v2_write_needs_the_token(srv):
    line = f"cpu v=1 {T0}".encode()
    path = "/api/v2/write?org=org&bucket=bucket"
    for headers in ({}, {"Authorization": "Token wrong"}, {"Authorization": "Basic !!"}):
        st, raw = _http(srv.http_port, "POST", path, line, headers)
        body = json.loads(raw)
        assert st == 401 and body["code"] == "unauthorized" and body["message"], (headers, raw)
    st, raw = _http(srv.http_port, "POST", "/api/v2/write?org=org&bucket=elsewhere", line,
                    {"Authorization": f"Token {WRITER}"})
    assert st == 403 and "org_elsewhere" in json.loads(raw)["message"]
    assert _http(srv.http_port, "POST", path, line, {"Authorization": f"Token {WRITER}"})[0] == 204
    assert _http(srv.http_port, "POST", path, line, {"Authorization": f"Bearer {MAIN}"})[0] == 204


def test_influxdb_client_with_token(srv):
    from influxdb_client import InfluxDBClient, Point
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException

    with InfluxDBClient(url=f"http://127.0.0.1:{srv.http_port}", token=WRITER, org="org") as ic:
        ic.write_api(write_options=SYNCHRONOUS).write(bucket="bucket", record=Point("cpu").field("v", 1.0))
    with InfluxDBClient(url=f"http://127.0.0.1:{srv.http_port}", token="wrong", org="org") as ic:
        with pytest.raises(ApiException) as e:
            ic.write_api(write_options=SYNCHRONOUS).write(bucket="bucket", record=Point("cpu").field("v", 1.0))
        assert e.value.status == 401


def test_http_v1_credentials(srv):
    line = f"cpu v=1 {T0}".encode()
    assert _http(srv.http_port, "POST", f"/write?db={DB}&u=any&p={WRITER}", line)[0] == 204
    basic = base64.b64encode(f"telegraf:{MAIN}".encode()).decode()
    assert _http(srv.http_port, "POST", f"/write?db={DB}", line, {"Authorization": f"Basic {basic}"})[0] == 204
    assert _http(srv.http_port, "POST", f"/write?db={DB}", line, {"Authorization": f"Token {MAIN}"})[0] == 204
    st, raw = _http(srv.http_port, "POST", f"/write?db={DB}&u=any&p=wrong", line)
    assert st == 401 and "error" in json.loads(raw)
    st, raw = _http(srv.http_port, "POST", f"/write?db=secret&p={WRITER}", line)
    assert st == 403 and "'secret'" in json.loads(raw)["error"]


# -- CLI ----------------------------------------------------------------------------------
def _iox(*args, env=None):
    e = dict(os.environ)
    e.pop("IOX_TOKEN", None)
    e.update(env or {})
    return subprocess.run([IOX, *args], capture_output=True, text=True, timeout=120, env=e, cwd=ROOT)


def test_cli_token(srv):
    r = _iox("status", "--addr", srv.addr, "--db", DB)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr
    r = _iox("status", "--addr", srv.addr, "--db", DB, "--token", READER)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["databases"][0]["name"] == DB
    r = _iox("persist", "--addr", srv.addr, "--db", DB, env={"IOX_TOKEN": READER})
    assert r.returncode == 1 and "PERMISSION_DENIED" in r.stderr
    r = _iox("sql", "--addr", srv.addr, "--db", DB, "--format", "json", "SELECT 1 AS x", env={"IOX_TOKEN": MAIN})
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[0]) == {"x": 1}, r.stderr


# -- Spark Connect ------------------------------------------------------------------------
_SC_CLIENT = textwrap.dedent('''
    import sys
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    print(spark.sql("SELECT 41 + 1 AS x").collect()[0].x)
''')


def _spark_connect(url: str):
    return subprocess.run([sys.executable, "-c", _SC_CLIENT, url], capture_output=True, text=True, timeout=300)


def test_spark_connect_requires_the_token(srv):
    r = _spark_connect(f"sc://localhost:{srv.sc_port}/;token={MAIN}")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "42", r.stderr[-3000:]
    for url in (f"sc://localhost:{srv.sc_port}/;token=wrong", f"sc://127.0.0.1:{srv.sc_port}"):
        r = _spark_connect(url)
        assert r.returncode != 0 and "42" not in r.stdout
        assert "UNAUTHENTICATED" in r.stderr or "nvalid" in r.stderr, r.stderr[-3000:]


# -- SIGHUP -------------------------------------------------------------------------------
def _until(pred, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_sighup_reloads_the_tokens_file_and_keeps_it_when_invalid(srv):
    def works(token) -> bool:
        with IoxClient(srv.addr, token=token) as c:
            try:
                c.status(DB)
                return True
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
                return False

    assert not works(NEW)
    try:
        with open(srv.tokens_file, "w") as f:
            f.write(TOKENS + f'\n[[tokens]]\ntoken = "{NEW}"\ndatabases = ["{DB}"]\npermissions = ["query"]\n')
        srv.proc.send_signal(signal.SIGHUP)
        _until(lambda: works(NEW))
        with open(srv.tokens_file, "w") as f:
            f.write("[[tokens]]\ntoken = 42\n")
        srv.proc.send_signal(signal.SIGHUP)
        _until(lambda: "keeping the" in srv.log())
        assert works(NEW) and works(READER) and works(MAIN)
        assert srv.proc.poll() is None
    finally:
        with open(srv.tokens_file, "w") as f:
            f.write(TOKENS)
        srv.proc.send_signal(signal.SIGHUP)
    _until(lambda: not works(NEW))


# -- the bind refusal ---------------------------------------------------------------------
def test_wide_bind_without_a_token_is_refused(tmp_path):
    r = _iox("serve", "--data-dir", str(tmp_path), "--bind-host", "0.0.0.0",
             env={"IOX_AUTH_TOKEN": "", "IOX_AUTH_TOKENS_FILE": "", "IOX_INSECURE": ""})
    assert r.returncode == 2
    assert "--bind-host" in r.stderr and "--auth-token" in r.stderr and "--insecure" in r.stderr
    r = _iox("serve", "--data-dir", str(tmp_path), env={"IOX_BIND_HOST": "::", "IOX_AUTH_TOKEN": ""})
    assert r.returncode == 2 and "--insecure" in r.stderr
