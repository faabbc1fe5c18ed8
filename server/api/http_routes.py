"""Every route of the HTTP API, and who may call it: the HTTP twin of server/api/auth.py's
`RPC_PERMISSIONS`.

Invariant: the HTTP server (server/api/http_api.py) answers a request only through this table: a
(method, path) it does not name is 404 (or 405 naming the methods the path takes), so a route
cannot be added without saying who may call it. Access kinds:
- OPEN: no token (health, readiness, ping);
- SERVER_WIDE: `permission` on every database (a token for `*`), checked before the handler runs;
- DATABASE: `permission` on the database the request names, checked by the handler once it knows
  the database (from `db`, `org` + `bucket`, a bucket id or a JSON body) and before it reads or
  changes anything;
- LISTING: any valid token; the answer holds only what the token's databases allow.
tests/unit/server/api/test_http_routes.py calls every route with a token scoped to another
database and fails for a route that acts beyond it.

Pure data and lookups; imported by the HTTP server (driver).
"""
from __future__ import annotations

from dataclasses import dataclass

from iox_spark.server.api.auth import ADMIN, QUERY, WRITE

__all__ = ["OPEN", "SERVER_WIDE", "DATABASE", "LISTING", "Route", "HTTP_ROUTES", "BUCKET_ID_PATTERN", "route_pattern",
           "find_route", "methods_of"]

OPEN, SERVER_WIDE, DATABASE, LISTING = "open", "server-wide", "database", "listing"

#: how HTTP_ROUTES names `/api/v2/buckets/<id>` (any one path segment after the buckets path)
BUCKET_ID_PATTERN = "/api/v2/buckets/{id}"
_BUCKETS_PATH = "/api/v2/buckets"


@dataclass(frozen=True)
class Route:
    """`handler`: the name of the HTTP handler's method that answers it; `access` and
    `permission`: who may call it (see the module docstring)."""

    handler: str
    access: str
    permission: str | None = None


#: (method, path pattern) -> Route, for every request the HTTP API answers
HTTP_ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/health"): Route("_health", OPEN),
    ("GET", "/ready"): Route("_ready", OPEN),
    ("GET", "/ping"): Route("_ping", OPEN),
    ("HEAD", "/ping"): Route("_ping", OPEN),
    ("GET", "/metrics"): Route("_metrics", SERVER_WIDE, ADMIN),
    ("POST", "/api/v2/write"): Route("_post_write", DATABASE, WRITE),
    ("POST", "/write"): Route("_post_write", DATABASE, WRITE),
    ("POST", "/api/v3/write_lp"): Route("_post_write", DATABASE, WRITE),
    ("GET", "/api/v3/query_sql"): Route("_query", DATABASE, QUERY),
    ("POST", "/api/v3/query_sql"): Route("_post_query", DATABASE, QUERY),
    ("GET", "/query"): Route("_influxql", DATABASE, QUERY),
    ("POST", "/query"): Route("_post_query", DATABASE, QUERY),
    ("GET", "/api/v3/query_influxql"): Route("_influxql", DATABASE, QUERY),
    ("POST", "/api/v3/query_influxql"): Route("_post_query", DATABASE, QUERY),
    ("GET", "/api/v2/orgs"): Route("_get_buckets", LISTING, ADMIN),
    ("GET", _BUCKETS_PATH): Route("_get_buckets", LISTING, ADMIN),
    ("POST", _BUCKETS_PATH): Route("_post_buckets", DATABASE, ADMIN),
    ("GET", BUCKET_ID_PATTERN): Route("_get_buckets", DATABASE, ADMIN),
    ("PATCH", BUCKET_ID_PATTERN): Route("_patch_buckets", DATABASE, ADMIN),
}


def route_pattern(path: str) -> str:
    """The pattern of HTTP_ROUTES that `path` (without its query, no trailing slash) falls under:
    a bucket's path is BUCKET_ID_PATTERN, any other path is itself."""
    if path.startswith(_BUCKETS_PATH + "/") and "/" not in path[len(_BUCKETS_PATH) + 1:]:
        return BUCKET_ID_PATTERN
    return path


def find_route(method: str, path: str) -> Route | None:
    """The route answering `method` on `path`, or None."""
    return HTTP_ROUTES.get((method, route_pattern(path)))


def methods_of(path: str) -> list[str]:
    """The methods `path` takes (empty: no such path), for a 405's Allow header."""
    pattern = route_pattern(path)
    return sorted(m for m, p in HTTP_ROUTES if p == pattern)
