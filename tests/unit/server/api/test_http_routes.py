"""Every HTTP route keeps a database-scoped token in its databases (server/api/http_routes.py).

The matrix is built from HTTP_ROUTES: each route has a request here (the test fails when a route
has none), sent with a token that has every permission on database `org_a` only. A route acting
on one database refuses it for `org_b` (403) before anything reaches the router, the query path
or the retention; a server-wide one refuses it; a listing answers `org_a`'s buckets and org only;
an open one needs no token. A real HTTP server, real tokens, a real buckets API over a catalog;
the router and the query path are fakes that record what reached them.
"""
from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.api.auth import Authenticator
from iox_spark.server.api.buckets import BucketsApi, object_id
from iox_spark.server.api.http_api import HttpWriteServer, database_for
from iox_spark.server.api.http_routes import (BUCKET_ID_PATTERN, DATABASE, HTTP_ROUTES, LISTING, OPEN, SERVER_WIDE,
                                              find_route, methods_of, route_pattern)
from iox_spark.server.errors import DatabaseNotFound
from iox_spark.server.runtime.broker import free_port
from iox_spark.server.write.router import WriteResult

MAIN, SCOPED = "main-token", "token-of-org-a"
TOKENS = json.dumps({"tokens": [{"name": "a-admin", "token": SCOPED, "databases": ["org_a"],
                                 "permissions": ["write", "query", "delete", "admin"]}]})
ORG_ID = object_id("org", "org")


def _q(**kw) -> str:
    return urllib.parse.urlencode(kw)


def _sql(db):
    return json.dumps({"db": db, "q": "SELECT 1"}).encode()


#: (method, route pattern) -> request for database `db` (as org `org`, bucket `db[4:]`): (path, body)
CASES = {
    ("GET", "/health"): lambda db: ("/health", b""),
    ("GET", "/ready"): lambda db: ("/ready", b""),
    ("GET", "/ping"): lambda db: ("/ping", b""),
    ("HEAD", "/ping"): lambda db: ("/ping", b""),
    ("GET", "/metrics"): lambda db: ("/metrics", b""),
    ("POST", "/api/v2/write"): lambda db: (f"/api/v2/write?{_q(org='org', bucket=db[4:])}", b"m v=1"),
    ("POST", "/write"): lambda db: (f"/write?{_q(db=db)}", b"m v=1"),
    ("POST", "/api/v3/write_lp"): lambda db: (f"/api/v3/write_lp?{_q(db=db)}", b"m v=1"),
    ("GET", "/api/v3/query_sql"): lambda db: (f"/api/v3/query_sql?{_q(db=db, q='SELECT 1')}", b""),
    ("POST", "/api/v3/query_sql"): lambda db: ("/api/v3/query_sql", _sql(db)),
    ("GET", "/query"): lambda db: (f"/query?{_q(db=db, q='SELECT v FROM m')}", b""),
    ("POST", "/query"): lambda db: ("/query", _q(db=db, q="SELECT v FROM m").encode()),
    ("GET", "/api/v3/query_influxql"): lambda db: (f"/api/v3/query_influxql?{_q(db=db, q='SELECT v FROM m')}", b""),
    ("POST", "/api/v3/query_influxql"): lambda db: ("/api/v3/query_influxql",
                                                     json.dumps({"db": db, "q": "SELECT v FROM m"}).encode()),
    ("GET", "/api/v2/orgs"): lambda db: ("/api/v2/orgs", b""),
    ("GET", "/api/v2/buckets"): lambda db: ("/api/v2/buckets", b""),
    ("POST", "/api/v2/buckets"): lambda db: ("/api/v2/buckets", json.dumps({"name": db[4:], "orgID": ORG_ID}).encode()),
    ("GET", BUCKET_ID_PATTERN): lambda db: (f"/api/v2/buckets/{object_id('bucket', db)}", b""),
    ("PATCH", BUCKET_ID_PATTERN): lambda db: (f"/api/v2/buckets/{object_id('bucket', db)}",
                                              json.dumps({"retentionRules": []}).encode()),
}


class _Metrics:
    def render(self):
        return b"# metrics\n"


class _Router:
    max_request_bytes = 1 << 20
    metrics = _Metrics()

    def __init__(self, catalog, reached):
        self.catalog, self.reached = catalog, reached

    def write_line_protocol(self, database, body, precision="ns", **_):
        self.reached.append(("write", database))
        return WriteResult({0: 1}, 1, f"iox_{database}")

    def write_lp_v3(self, database, body, precision, accept_partial, no_sync):
        self.reached.append(("write", database))
        return WriteResult({0: 1}, 1, f"iox_{database}"), []


class _Queries:
    """The query path: records the database of every query that reached it, answers none."""

    def __init__(self, reached):
        self.reached = reached

    def query(self, database, *_a, **_kw):
        self.reached.append(("query", database))
        raise DatabaseNotFound(database)

    def __getattr__(self, name):  # InfluxQL's other calls (SHOW ...): recorded the same way
        def call(database=None, *_a, **_kw):
            self.reached.append((name, database))
            raise DatabaseNotFound(str(database))
        return call


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("routes") / "tokens.json"
    path.write_text(TOKENS)
    catalog = Catalog()
    for name in ("org_a", "org_b", "other_c"):
        catalog.ensure_database(name, f"iox.{name}", 2)
    reached: list = []
    srv = HttpWriteServer(_Router(catalog, reached), "127.0.0.1", free_port(),
                          authenticator=Authenticator(MAIN, str(path)))
    srv.buckets = BucketsApi(catalog, lambda database, period_s: reached.append(("retention", database)),
                             database_for, 0.0)
    srv.queries = _Queries(reached)
    srv.start()

    def req(method, path, body=b"", token=None):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            headers = {"Authorization": f"Token {token}"} if token else {}
            conn.request(method, path, body=body or None, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    for org in ("org", "other"):  # orgs the server knows (a client looks them up by name)
        assert req("GET", f"/api/v2/orgs?org={org}", token=MAIN)[0] == 200
    yield req, reached
    srv.stop()


def test_every_route_has_a_request_in_the_matrix():
    assert set(CASES) == set(HTTP_ROUTES)


@pytest.mark.parametrize("key", sorted(HTTP_ROUTES), ids=lambda key: f"{key[0]} {key[1]}")
def test_a_token_of_one_database_never_acts_beyond_it(served, key):
    req, reached = served
    method, _pattern = key
    route = HTTP_ROUTES[key]
    path, body = CASES[key]("org_b")
    reached.clear()
    status, raw = req(method, path, body, SCOPED)
    if route.access == OPEN:
        assert status < 400 and req(method, path, body)[0] < 400  # no token needed
    elif route.access == SERVER_WIDE:
        assert status == 403 and req(method, path, body, MAIN)[0] == 200
    elif route.access == DATABASE:
        assert status == 403 and "org_b" in raw.decode(), (status, raw)
        assert reached == []  # nothing reached the router, the query path or the retention
        own_path, own_body = CASES[key]("org_a")
        assert req(method, own_path, own_body, SCOPED)[0] not in (401, 403)
    else:
        assert route.access == LISTING and status == 200
        doc = json.loads(raw)
        if "buckets" in doc:
            assert [b["name"] for b in doc["buckets"]] == ["a"]
            assert {b["name"] for b in json.loads(req(method, path, body, MAIN)[1])["buckets"]} == {"a", "b", "c"}
        else:
            assert [o["name"] for o in doc["orgs"]] == ["org"]
            assert [o["name"] for o in json.loads(req(method, path, body, MAIN)[1])["orgs"]] == ["org", "other"]
    if route.access != OPEN:
        assert req(method, path, body)[0] == 401  # no token


def test_a_path_or_method_outside_the_table_is_answered_404_or_405(served):
    req, reached = served
    reached.clear()
    assert req("GET", "/nope", token=MAIN)[0] == 404
    assert req("DELETE", "/api/v2/buckets/" + object_id("bucket", "org_a"), token=MAIN)[0] == 405
    assert req("PUT", "/api/v2/write", b"m v=1", MAIN)[0] == 405
    assert req("GET", "/api/v2/buckets/x/y", token=MAIN)[0] == 404
    assert reached == []
    assert route_pattern("/api/v2/buckets/0123") == BUCKET_ID_PATTERN and find_route("PATCH", "/api/v2/buckets/0123")
    assert methods_of("/api/v2/write") == ["POST"] and methods_of("/nope") == []
