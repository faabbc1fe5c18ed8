"""Token table, permissions per RPC and tokens files (server/api/auth.py), and the bind refusal."""
from __future__ import annotations

import json
import logging

import pytest

from iox_spark.iox import delete_pb2, flight_pb2, management_pb2, query_pb2, write_pb2
from iox_spark.server.api.auth import (ADMIN, ALL_DATABASES, PERMISSIONS, RPC_PERMISSIONS, Authenticator, InvalidTokensFile,
                             PermissionDenied, TokenScope, TokenTable, Unauthenticated, load_tokens_file,
                             parse_tokens, required_permission, token_from_authorization)
from iox_spark.server.config import InvalidConfig, ServerConfig, is_loopback
from iox_spark.catalog.catalog import Catalog

TOML = """
[[tokens]]
name = "telegraf"
token = "tok-write"
databases = ["metrics"]
permissions = ["write"]

[[tokens]]
name = "grafana"
token = "tok-read"
databases = ["*"]
permissions = ["query"]

[[tokens]]
name = "ops-metrics"
token = "tok-admin-metrics"
databases = ["metrics"]
permissions = ["write", "query", "delete", "admin"]
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_every_rpc_of_every_service_has_a_permission():
    methods = set()
    for mod, svc in ((write_pb2, "WriteService"), (query_pb2, "QueryService"),
                     (management_pb2, "ManagementService"), (delete_pb2, "DeleteService"),
                     (flight_pb2, "FlightService")):
        sd = mod.DESCRIPTOR.services_by_name[svc]
        methods |= {f"/{sd.full_name}/{m.name}" for m in sd.methods}
    assert methods == set(RPC_PERMISSIONS)
    assert set(RPC_PERMISSIONS.values()) <= set(PERMISSIONS)


def test_permissions_of_some_rpcs():
    for m in ("Persist", "Compact", "RetryPoisoned", "AcceptPoisoned", "AcceptLostWrites", "Freeze", "Verify"):
        assert required_permission(f"/iox.management.ManagementService/{m}", "db") == ADMIN
    assert required_permission("/iox.management.ManagementService/GetStatus", "") == "query"
    assert required_permission("/iox.management.ManagementService/ListDatabases", "") == "query"
    assert required_permission("/iox.write.WriteService/Write", "db") == "write"
    assert required_permission("/iox.delete.DeleteService/Delete", "db") == "delete"
    assert required_permission("/grpc.health.v1.Health/Check", None) is None


def test_scope_checks_database_and_permission():
    s = TokenScope("t", "x", frozenset({"a"}), frozenset({"write"}))
    s.check("write", "a")
    with pytest.raises(PermissionDenied, match="'b'") as e:
        s.check("write", "b")
    assert e.value.database == "b"
    with pytest.raises(PermissionDenied, match="query"):
        s.check("query", "a")
    TokenScope("all", "y", frozenset({ALL_DATABASES}), frozenset({"query"})).check("query", "anything")


def test_scope_of_the_whole_server_needs_every_database():
    admin_a = TokenScope("admin-a", "x", frozenset({"a"}), frozenset(PERMISSIONS))
    with pytest.raises(PermissionDenied, match="whole server"):
        admin_a.check(ADMIN, None)
    with pytest.raises(PermissionDenied, match="whole server"):
        admin_a.check(ADMIN, "")
    admin_a.check("query", "", listing=True)  # a listing: cut to its databases
    assert admin_a.allows("query", "a") and not admin_a.allows("query", "b")
    TokenScope("all", "y", frozenset({ALL_DATABASES}), frozenset({ADMIN})).check(ADMIN, None)


def test_table_authenticates_known_tokens_only():
    s = TokenScope("t", "secret", frozenset({"a"}), frozenset({"write"}))
    t = TokenTable([s])
    assert t.authenticate("secret") is s
    for bad in (None, "", "secre", "secret2", "SECRET"):
        with pytest.raises(Unauthenticated):
            t.authenticate(bad)


def test_authorization_header_schemes():
    assert token_from_authorization("Token abc") == "abc"
    assert token_from_authorization("Bearer abc") == "abc"
    assert token_from_authorization("bearer  abc ") == "abc"
    assert token_from_authorization("Basic abc") is None
    assert token_from_authorization("Token") is None
    assert token_from_authorization(None) is None


def test_toml_and_json_files(tmp_path):
    scopes = load_tokens_file(_write(tmp_path, "t.toml", TOML))
    assert [(s.name, s.databases, s.permissions) for s in scopes][:2] == [
        ("telegraf", frozenset({"metrics"}), frozenset({"write"})),
        ("grafana", frozenset({"*"}), frozenset({"query"}))]
    doc = {"tokens": [{"token": "j", "databases": "*", "permissions": ["write", "admin"]}]}
    (s,) = load_tokens_file(_write(tmp_path, "t.json", json.dumps(doc)))
    assert s.name == "tokens[0]" and s.permissions == {"write", "admin"} and s.databases == {"*"}
    assert "j" not in repr(s)


@pytest.mark.parametrize("doc, match", [
    ({}, "tokens"),
    ({"tokens": [{"token": "", "databases": ["a"], "permissions": ["write"]}]}, "token must"),
    ({"tokens": [{"token": "x", "databases": [], "permissions": ["write"]}]}, "databases"),
    ({"tokens": [{"token": "x", "databases": ["a"], "permissions": ["drop"]}]}, "unknown permission"),
    ({"tokens": [{"token": "x", "databases": ["a"], "permissions": ["write"], "extra": 1}]}, "unknown key"),
    ({"tokens": [{"token": "x", "databases": ["a"], "permissions": ["write"]},
                 {"token": "x", "databases": ["b"], "permissions": ["query"]}]}, "twice"),
])
def test_invalid_documents(doc, match):
    with pytest.raises(ValueError, match=match):
        parse_tokens(doc)


def test_invalid_files_name_the_file(tmp_path):
    for name, text in (("bad.json", "{nope"), ("bad.toml", "[[tokens]\n"), ("x.json", '{"tokens": 1}')):
        path = _write(tmp_path, name, text)
        with pytest.raises(InvalidTokensFile, match=name):
            load_tokens_file(path)
    with pytest.raises(InvalidTokensFile, match="cannot read"):
        load_tokens_file(str(tmp_path / "absent.json"))


def test_authenticator_main_token_and_reload_keeps_old_set_on_error(tmp_path, caplog):
    path = _write(tmp_path, "t.toml", TOML)
    a = Authenticator("main", path)
    assert a.enabled
    assert a.authorize("main", ADMIN, None).name == "auth-token"
    assert a.authorize("tok-write", "write", "metrics").name == "telegraf"
    with pytest.raises(PermissionDenied):
        a.authorize("tok-write", "write", "other")
    with pytest.raises(PermissionDenied):
        a.authorize("tok-read", ADMIN, None)
    # an invalid file: logged, the tokens in use stay
    _write(tmp_path, "t.toml", "[[tokens]]\ntoken = 1\n")
    with caplog.at_level(logging.ERROR, logger="iox_spark.server.api.auth"):
        assert a.reload() is False
    assert "keeping the 4 token(s)" in caplog.text
    assert a.authorize("tok-write", "write", "metrics")
    # a valid one replaces them
    _write(tmp_path, "t.toml", '[[tokens]]\ntoken = "new"\ndatabases = ["x"]\npermissions = ["query"]\n')
    assert a.reload() is True
    with pytest.raises(Unauthenticated):
        a.authorize("tok-write", "write", "metrics")
    assert a.authorize("new", "query", "x")
    assert a.authorize("main", "delete", "x")


def test_no_tokens_means_open():
    a = Authenticator()
    assert not a.enabled and a.authorize(None, ADMIN, None) is None


def test_loopback_hosts():
    for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(h), h
    for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"):
        assert not is_loopback(h), h


def test_bind_beyond_loopback_needs_a_token_or_insecure():
    assert ServerConfig().bind_host == "127.0.0.1"
    with pytest.raises(InvalidConfig) as e:
        ServerConfig(bind_host="0.0.0.0")
    assert e.value.field == "bind_host"
    assert "--auth-token" in str(e.value) and "--insecure" in str(e.value)
    ServerConfig(bind_host="0.0.0.0", insecure=True)
    ServerConfig(bind_host="0.0.0.0", auth_token="t")
    ServerConfig(bind_host="0.0.0.0", auth_tokens_file="f.toml", spark_connect_port=0)
    assert "t0ken" not in repr(ServerConfig(auth_token="t0ken"))


def test_spark_connect_always_gets_a_token_kept_by_its_owner_only(tmp_path):
    """Without --auth-token (a tokens file alone, or no token at all) Spark Connect gets a token of
    its own, generated once per data directory (0600), the same at the next start."""
    import os
    import stat

    from iox_spark.server.runtime import spark_connect

    ServerConfig(auth_tokens_file="f.toml", spark_connect_port=15002)  # no longer refused
    t1 = spark_connect.token_for(str(tmp_path), 15002, None)
    assert len(t1) >= 32 and stat.S_IMODE(os.stat(tmp_path / spark_connect.RECORD).st_mode) == 0o600
    assert spark_connect.token_for(str(tmp_path), 15003, None) == t1  # kept across starts, port updated
    assert spark_connect.connect_url(str(tmp_path)) == f"sc://localhost:15003/;token={t1}"
    assert spark_connect.token_for(str(tmp_path), 15002, "main-token") == "main-token"
    assert "main-token" not in (tmp_path / spark_connect.RECORD).read_text()
    assert spark_connect.connect_url(str(tmp_path)) == "sc://localhost:15002/;token=<the server's --auth-token>"
    with pytest.raises(spark_connect.NoSparkConnectRecord):
        spark_connect.connect_url(str(tmp_path / "elsewhere"))


def test_cli_serve_refuses_wide_bind_without_token(capsys, monkeypatch):
    from iox_spark.server.cli.main import main

    for var in ("IOX_AUTH_TOKEN", "IOX_AUTH_TOKENS_FILE", "IOX_INSECURE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit):
        main(["serve", "--bind-host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert "--bind-host" in err and "--auth-token" in err and "--insecure" in err


def test_cli_serve_refuses_invalid_tokens_file(capsys, tmp_path, monkeypatch):
    from iox_spark.server.cli.main import main

    monkeypatch.delenv("IOX_INSECURE", raising=False)
    with pytest.raises(SystemExit):
        main(["serve", "--auth-tokens-file", _write(tmp_path, "t.json", "[]"), "--spark-connect-port", "0"])
    assert "t.json" in capsys.readouterr().err


def test_cli_token_option_and_env(monkeypatch):
    from iox_spark.server.cli.main import build_parser

    assert build_parser().parse_args(["status", "--token", "abc"]).token == "abc"
    monkeypatch.setenv("IOX_TOKEN", "fromenv")
    assert build_parser().parse_args(["sql", "--db", "d", "select 1"]).token == "fromenv"
    monkeypatch.setenv("IOX_AUTH_TOKEN", "srv")
    monkeypatch.setenv("IOX_BIND_HOST", "0.0.0.0")
    ns = build_parser().parse_args(["serve"])
    assert ns.auth_token == "srv" and ns.bind_host == "0.0.0.0"


# -- HTTP, against a fake router ----------------------------------------------------------
class _Metrics:
    def render(self):
        return b"# metrics\n"


class _FakeRouter:
    max_request_bytes = 1000
    metrics = _Metrics()
    catalog = Catalog()  # knows no database: a 204 carries no write token

    def __init__(self):
        self.calls = []

    def write_line_protocol(self, database, body, precision="ns", **_):
        from iox_spark.server.write.router import WriteResult

        self.calls.append(database)
        return WriteResult({0: len(self.calls)}, 1, f"iox_{database}")


@pytest.fixture
def http_auth(tmp_path):
    import http.client

    from iox_spark.server.api.http_api import HttpWriteServer
    from iox_spark.server.runtime.broker import free_port

    auth = Authenticator("main", _write(tmp_path, "t.toml", TOML))
    router = _FakeRouter()
    srv = HttpWriteServer(router, "127.0.0.1", free_port(), authenticator=auth)
    srv.start()

    def req(method, path, body=b"", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            raw = r.read()
            return r.status, json.loads(raw) if "json" in (r.getheader("Content-Type") or "") else raw
        finally:
            conn.close()

    yield router, req
    srv.stop()


def test_http_tokens(http_auth):
    import base64

    router, req = http_auth
    v2 = "/api/v2/write?org=o&bucket=b"
    assert req("GET", "/health")[0] == 200 and req("GET", "/ping")[0] == 204 and req("HEAD", "/ping")[0] == 204
    st, body = req("POST", v2, b"m v=1")
    assert st == 401 and body["code"] == "unauthorized"
    assert req("POST", v2, b"m v=1", {"Authorization": "Token nope"})[0] == 401
    assert req("POST", v2, b"m v=1", {"Authorization": "Token main"})[0] == 204
    assert req("POST", v2, b"m v=1", {"Authorization": "Bearer main"})[0] == 204
    st, body = req("POST", v2, b"m v=1", {"Authorization": "Token tok-write"})
    assert st == 403 and body["code"] == "forbidden" and "'o_b'" in body["message"]
    assert req("POST", "/write?db=metrics&u=x&p=tok-write", b"m v=1")[0] == 204
    basic = base64.b64encode(b"user:tok-write").decode()
    assert req("POST", "/write?db=metrics", b"m v=1", {"Authorization": f"Basic {basic}"})[0] == 204
    st, body = req("POST", "/write?db=metrics&p=bad", b"m v=1")
    assert st == 401 and "error" in body
    st, body = req("POST", "/write?db=other&p=tok-write", b"m v=1")
    assert st == 403 and "'other'" in body["error"]
    assert req("GET", "/metrics")[0] == 401
    assert req("GET", "/metrics", headers={"Authorization": "Token tok-read"})[0] == 403
    assert req("GET", "/metrics", headers={"Authorization": "Token tok-admin-metrics"})[0] == 403  # one database
    assert req("GET", "/metrics", headers={"Authorization": "Token main"})[0] == 200
    assert router.calls == ["o_b", "o_b", "metrics", "metrics"]


# -- gRPC, against a stub service ---------------------------------------------------------
def test_grpc_interceptor(tmp_path):
    import grpc

    from iox_spark.server.api.auth import AuthInterceptor
    from iox_spark.server.api.client import IoxClient

    auth = Authenticator("main", _write(tmp_path, "t.toml", TOML))
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc
    from iox_spark.iox import management_pb2_grpc

    class Mgmt(management_pb2_grpc.ManagementServiceServicer):
        def GetStatus(self, request, context):
            return management_pb2.GetStatusResponse()

        def Persist(self, request, context):
            return management_pb2.PersistResponse()

    g = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[AuthInterceptor(auth)])
    management_pb2_grpc.add_ManagementServiceServicer_to_server(Mgmt(), g)
    h = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(h, g)
    port = g.add_insecure_port("127.0.0.1:0")
    g.start()
    try:
        def code(token, call):
            with IoxClient(f"127.0.0.1:{port}", token=token) as c:
                try:
                    call(c)
                    return grpc.StatusCode.OK
                except grpc.RpcError as e:
                    return e.code()

        assert code(None, lambda c: c.wait_ready(5)) == grpc.StatusCode.OK  # health: open
        assert code(None, lambda c: c.status("metrics")) == grpc.StatusCode.UNAUTHENTICATED
        assert code("bad", lambda c: c.status("metrics")) == grpc.StatusCode.UNAUTHENTICATED
        assert code("tok-read", lambda c: c.status("metrics")) == grpc.StatusCode.OK
        assert code("tok-read", lambda c: c.status()) == grpc.StatusCode.OK  # a listing, cut to its databases
        assert code("tok-read", lambda c: c.persist("metrics")) == grpc.StatusCode.PERMISSION_DENIED
        assert code("tok-write", lambda c: c.status("metrics")) == grpc.StatusCode.PERMISSION_DENIED
        assert code("main", lambda c: c.status()) == grpc.StatusCode.OK
        assert code("main", lambda c: c.persist("x")) == grpc.StatusCode.OK
    finally:
        g.stop(0)


def _services():
    """{full method: (request class, streams an answer)} of every RPC of the server's own services."""
    out = {}
    for mod, svc in ((write_pb2, "WriteService"), (query_pb2, "QueryService"),
                     (management_pb2, "ManagementService"), (delete_pb2, "DeleteService"),
                     (flight_pb2, "FlightService")):
        sd = mod.DESCRIPTOR.services_by_name[svc]
        for m in sd.methods:
            req_cls = getattr(mod, m.input_type.name, None) or _message_class(m.input_type)
            out[f"/{sd.full_name}/{m.name}"] = (req_cls, m.server_streaming, m.client_streaming)
    return out


def _flight_request(method: str, database: str, handle_database: str | None = None):
    """(request, metadata) of a Flight method naming `database` as its clients do: DoGet in
    InfluxDB 3's ticket, Flight SQL in the `database` header, or in a statement handle naming
    `handle_database` (then the header names `database`)."""
    from iox_spark.iox import flight_sql_pb2
    from iox_spark.server.api.flight_sql import pack

    md = [("database", database)] if database else []
    name = method.rsplit("/", 1)[1]
    if name == "DoGet":
        return flight_pb2.Ticket(ticket=json.dumps({"database": handle_database or database,
                                                    "sql_query": "SELECT 1"}).encode()), md
    handle = json.dumps({"database": handle_database, "sql": "SELECT 1"}).encode() if handle_database else None
    if name in ("GetFlightInfo", "GetSchema", "DoPut"):
        cmd = pack(flight_sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=handle)) if handle else \
            pack(flight_sql_pb2.CommandStatementQuery(query="SELECT 1"))
        descriptor = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.CMD, cmd=cmd)
        if name == "DoPut":
            return flight_pb2.FlightData(flight_descriptor=descriptor), md
        return descriptor, md
    if name == "DoAction":
        if handle:
            return flight_pb2.Action(type="ClosePreparedStatement", body=pack(
                flight_sql_pb2.ActionClosePreparedStatementRequest(prepared_statement_handle=handle))), md
        return flight_pb2.Action(type="CreatePreparedStatement", body=pack(
            flight_sql_pb2.ActionCreatePreparedStatementRequest(query="SELECT 1"))), md
    return flight_pb2.Empty(), md


def _message_class(descriptor):
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def test_every_rpc_keeps_a_database_scoped_token_in_its_databases(tmp_path):
    """The matrix from RPC_PERMISSIONS: a token with every permission on database `a` only may call
    each RPC for `a`, never for `b`, never one acting on the whole server (Freeze, Unfreeze, or a
    database left empty), except a listing (answered with its databases only, by the handler);
    a method of our services the table does not name is refused (the interceptor fails closed)."""
    from concurrent import futures

    import grpc

    from iox_spark.server.api.auth import LISTINGS, SERVER_WIDE, AuthInterceptor

    auth = Authenticator("main", _write(tmp_path, "t.json", json.dumps(
        {"tokens": [{"name": "a-all", "token": "tok-a", "databases": ["a"], "permissions": list(PERMISSIONS)}]})))
    methods = _services()

    def answer(request, context):
        return management_pb2.ListDatabasesResponse()  # any message: the client does not parse it

    def stream(request, context):
        yield management_pb2.ListDatabasesResponse()

    def stream_stream(requests, context):
        list(requests)
        yield management_pb2.ListDatabasesResponse()

    handlers = {}
    for full, (req_cls, streams, streamed) in list(methods.items()) + [(
            "/iox.management.ManagementService/NotInTable", (management_pb2.ListDatabasesRequest, False, False))]:
        svc, name = full[1:].split("/")
        ser = lambda m: m.SerializeToString()  # noqa: E731
        h = (grpc.stream_stream_rpc_method_handler(stream_stream, req_cls.FromString, ser) if streamed else
             grpc.unary_stream_rpc_method_handler(stream, req_cls.FromString, ser) if streams else
             grpc.unary_unary_rpc_method_handler(answer, req_cls.FromString, ser))
        handlers.setdefault(svc, {})[name] = h
    g = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[AuthInterceptor(auth)])
    g.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(svc, hs) for svc, hs in handlers.items()])
    port = g.add_insecure_port("127.0.0.1:0")
    g.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        def call(method, req_cls, streams, database, token="tok-a", streamed=False, handle_database=None):
            req, md = req_cls(), []
            if "database" in req_cls.DESCRIPTOR.fields_by_name:
                req.database = database
            if method.startswith("/arrow.flight.protocol.FlightService/"):
                req, md = _flight_request(method, database, handle_database)
            md = md + [("authorization", f"Token {token}")]
            try:
                if streamed:
                    list(channel.stream_stream(method, req_cls.SerializeToString, lambda b: b)(iter([req]), metadata=md,
                                                                                               timeout=10))
                elif streams:
                    list(channel.unary_stream(method, req_cls.SerializeToString, lambda b: b)(req, metadata=md,
                                                                                              timeout=10))
                else:
                    channel.unary_unary(method, req_cls.SerializeToString, lambda b: b)(req, metadata=md, timeout=10)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

        ok, denied = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED
        flight = "/arrow.flight.protocol.FlightService/"
        for method, (req_cls, streams, streamed) in sorted(methods.items()):
            names_db = ("database" in req_cls.DESCRIPTOR.fields_by_name
                        or (method.startswith(flight) and method not in LISTINGS))  # a ticket, a header, a handle
            assert names_db or method in SERVER_WIDE | LISTINGS, f"{method}: no database, no listing, not server-wide"
            want_a = denied if method in SERVER_WIDE else ok
            assert call(method, req_cls, streams, "a", streamed=streamed) == want_a, method
            if names_db and method not in SERVER_WIDE:
                assert call(method, req_cls, streams, "b", streamed=streamed) == denied, method
                assert call(method, req_cls, streams, "", streamed=streamed) == \
                    (ok if method in LISTINGS else denied), method
            if method.startswith(flight) and method not in LISTINGS:  # a handle of another database than the header's
                assert call(method, req_cls, streams, "a", streamed=streamed, handle_database="b") == denied, method
            assert call(method, req_cls, streams, "b", token="main", streamed=streamed) == ok, method
        assert call("/iox.management.ManagementService/NotInTable", management_pb2.ListDatabasesRequest, False,
                    "a", token="main") == denied
    finally:
        channel.close()
        g.stop(0)
