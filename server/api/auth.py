"""Authentication and authorization of the gRPC and HTTP APIs.

Tokens: `--auth-token TOKEN` (every database, every permission) and `--auth-tokens-file PATH`
(scoped tokens, re-read on SIGHUP). Without either, the APIs are open (loopback only, unless
`--insecure`; see ServerConfig). Tokens are compared in constant time (hmac.compare_digest),
every known token each time, so the time of a check tells nothing about which one was close.

Tokens file (JSON, or TOML when the name ends in `.toml`):

    [[tokens]]
    name = "telegraf"             # optional; logged, never the token itself
    token = "s3cr3t-1"
    databases = ["metrics"]       # or ["*"]: every database
    permissions = ["write"]       # of write, query, delete, admin

    {"tokens": [{"name": "grafana", "token": "s3cr3t-2", "databases": ["*"], "permissions": ["query"]}]}

Permissions: `write` (Write, WriteArrow, HTTP writes), `query` (Query, Flight and Flight SQL, GetStatus, ListDatabases),
`delete` (Delete), `admin` (Persist, Compact, RetryPoisoned, AcceptPoisoned, AcceptLostWrites,
SetRetention, ClaimPartitions, Verify, the buckets API; Freeze, Unfreeze and `/metrics` on the whole
server). `RPC_PERMISSIONS` maps each RPC to what it needs.

Scope (invariant: a token never acts beyond its databases): a request that names a database needs
the permission on that database; a request that acts on the whole server (`SERVER_WIDE`: Freeze,
Unfreeze, `/metrics`), or that names no database where one is expected, needs a token for every
database (`*`); a listing (`LISTINGS`: ListDatabases, GetStatus without a database, the buckets
list) answers only the databases the token may use (`TokenScope.allows`). The gRPC interceptor
fails closed: a method of the server's own services that is not in `RPC_PERMISSIONS` is refused,
so an RPC added without a scope check cannot be called; health and reflection stay open.
"""
from __future__ import annotations

import contextvars
import dataclasses
import hmac
import itertools
import json
import logging
import threading

import grpc

from iox_spark.server.errors import ServerError

__all__ = ["WRITE", "QUERY", "DELETE", "ADMIN", "PERMISSIONS", "ALL_DATABASES", "RPC_PERMISSIONS", "TokenScope", "TokenTable", "Authenticator",
           "Unauthenticated", "PermissionDenied", "InvalidTokensFile", "load_tokens_file", "parse_tokens",
           "token_from_authorization", "AuthInterceptor", "required_permission", "SERVER_WIDE", "LISTINGS",
           "is_open", "current_scope", "request_database"]

log = logging.getLogger(__name__)

WRITE, QUERY, DELETE, ADMIN = "write", "query", "delete", "admin"
PERMISSIONS = (WRITE, QUERY, DELETE, ADMIN)
ALL_DATABASES = "*"

#: full gRPC method -> the permission it needs (on the request's database, see the module docstring).
#: A method of the server's own services not listed here is refused; health and reflection are open.
RPC_PERMISSIONS = {
    "/iox.write.WriteService/Write": WRITE,
    "/iox.write.WriteService/WriteArrow": WRITE,
    "/iox.query.QueryService/Query": QUERY,
    "/iox.query.QueryService/UnpersistedRows": QUERY,
    "/iox.delete.DeleteService/Delete": DELETE,
    "/iox.management.ManagementService/GetStatus": QUERY,
    "/iox.management.ManagementService/Persist": ADMIN,
    "/iox.management.ManagementService/Compact": ADMIN,
    "/iox.management.ManagementService/RetryPoisoned": ADMIN,
    "/iox.management.ManagementService/AcceptPoisoned": ADMIN,
    "/iox.management.ManagementService/AcceptLostWrites": ADMIN,
    "/iox.management.ManagementService/SetRetention": ADMIN,
    "/iox.management.ManagementService/ListDatabases": QUERY,
    "/iox.management.ManagementService/Freeze": ADMIN,
    "/iox.management.ManagementService/Unfreeze": ADMIN,
    "/iox.management.ManagementService/ClaimPartitions": ADMIN,
    "/iox.management.ManagementService/Verify": ADMIN,
    "/iox.management.ManagementService/CreateDownsampler": ADMIN,
    "/iox.management.ManagementService/ListDownsamplers": QUERY,
    "/iox.management.ManagementService/DropDownsampler": ADMIN,
    "/arrow.flight.protocol.FlightService/DoGet": QUERY,
    "/arrow.flight.protocol.FlightService/GetFlightInfo": QUERY,
    "/arrow.flight.protocol.FlightService/GetSchema": QUERY,
    "/arrow.flight.protocol.FlightService/DoAction": QUERY,
    "/arrow.flight.protocol.FlightService/DoPut": QUERY,
    "/arrow.flight.protocol.FlightService/ListActions": QUERY,
}


#: RPCs (by RPC_PERMISSIONS key) that act on the whole server: a token for every database only
SERVER_WIDE = frozenset({"/iox.management.ManagementService/Freeze", "/iox.management.ManagementService/Unfreeze"})
#: RPCs that, without a database, list the databases: they answer only the token's (`TokenScope.allows`)
LISTINGS = frozenset({"/iox.management.ManagementService/ListDatabases", "/iox.management.ManagementService/GetStatus",
                      "/iox.management.ManagementService/ListDownsamplers",
                      "/arrow.flight.protocol.FlightService/ListActions"})
#: services that stay open (no token): health checks and reflection
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")


def required_permission(method: str, database: str | None) -> str | None:
    """The permission `method` needs for `database` (None: the method is open)."""
    return RPC_PERMISSIONS.get(method)


_FLIGHT = "/arrow.flight.protocol.FlightService/"


def request_database(method: str, request, metadata=()) -> str:
    """The database `request` of `method` names ("" for none): its `database` field; for Flight, the
    database of its InfluxDB 3 ticket (server/api/flight.py), or of its Flight SQL statement handle,
    else of its `database` header (server/api/flight_sql.py `request_database`; `metadata`: the
    call's). For a DoPut, `request` is its first message."""
    if method.startswith(_FLIGHT):
        from iox_spark.server.api.flight import ticket_database
        from iox_spark.server.api.flight_sql import request_database as flight_sql_database

        db = flight_sql_database(method, request, metadata)
        if db is None:  # an InfluxDB 3 ticket
            return ticket_database(request.ticket)
        return db
    return getattr(request, "database", "")


def is_open(method: str) -> bool:
    """Whether a gRPC method needs no token (health and reflection)."""
    return method.startswith(OPEN_SERVICES)


class Unauthenticated(ServerError):
    """No token, or an unknown one (UNAUTHENTICATED / HTTP 401)."""


class PermissionDenied(ServerError):
    """A known token without the permission or the database (PERMISSION_DENIED / HTTP 403)."""

    def __init__(self, message: str, database: str | None = None):
        self.database = database
        super().__init__(message)


class InvalidTokensFile(ServerError, ValueError):
    def __init__(self, path: str, reason: str):
        self.path = path
        super().__init__(f"tokens file {path}: {reason}")


@dataclasses.dataclass(frozen=True)
class TokenScope:
    name: str
    token: str = dataclasses.field(repr=False)
    #: database names, or ALL_DATABASES
    databases: frozenset
    permissions: frozenset

    def check(self, permission: str, database: str | None, listing: bool = False) -> None:
        """Raises PermissionDenied unless this token has `permission` on `database`. None or "" is
        the whole server, which needs a token for every database, unless the request is a
        `listing` (its answer is then cut to what `allows` says)."""
        if permission not in self.permissions:
            what = f" on database {database!r}" if database else ""
            raise PermissionDenied(f"token {self.name!r} lacks the {permission} permission{what}", database)
        if database:
            if not self.allows(permission, database):
                raise PermissionDenied(f"token {self.name!r} may not use database {database!r}", database)
        elif not listing and ALL_DATABASES not in self.databases:
            raise PermissionDenied(f"token {self.name!r} may use only database(s) {', '.join(sorted(self.databases))}: "
                                   f"this acts on the whole server and needs a token for every database (\"*\")")

    def allows(self, permission: str, database: str) -> bool:
        """Whether this token has `permission` on `database` (what a listing shows)."""
        return permission in self.permissions and (ALL_DATABASES in self.databases or database in self.databases)


class TokenTable:
    """The known tokens; `authenticate` compares the presented one against every one of them."""

    def __init__(self, scopes=()):
        self.scopes = tuple(scopes)

    def __len__(self) -> int:
        return len(self.scopes)

    def authenticate(self, presented: str | None) -> TokenScope:
        if not presented:
            raise Unauthenticated("a token is required (authorization: Token <token>)")
        given = presented.encode()
        found = None
        for s in self.scopes:  # no early exit: every token is compared
            if hmac.compare_digest(given, s.token.encode()) and found is None:
                found = s
        if found is None:
            raise Unauthenticated("invalid token")
        return found


def _as_list(entry: dict, key: str, where: str) -> list:
    v = entry.get(key)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise ValueError(f"{where}: {key} must be a non-empty list of strings")
    return v


def parse_tokens(doc) -> list:
    """TokenScopes of a parsed tokens file (`{"tokens": [...]}`); raises ValueError naming the entry."""
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
        raise ValueError('expected a top-level "tokens" list')
    out, seen = [], set()
    for i, e in enumerate(doc["tokens"]):
        where = f"tokens[{i}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: must be a table/object")
        unknown = set(e) - {"name", "token", "databases", "permissions"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        token = e.get("token")
        if not isinstance(token, str) or not token.strip():
            raise ValueError(f"{where}: token must be a non-empty string")
        if token in seen:
            raise ValueError(f"{where}: the same token appears twice")
        seen.add(token)
        name = e.get("name", where)
        if not isinstance(name, str):
            raise ValueError(f"{where}: name must be a string")
        dbs = _as_list(e, "databases", where)
        perms = _as_list(e, "permissions", where)
        bad = [p for p in perms if p not in PERMISSIONS]
        if bad:
            raise ValueError(f"{where}: unknown permission(s) {', '.join(bad)} (use {', '.join(PERMISSIONS)})")
        out.append(TokenScope(name, token, frozenset(dbs), frozenset(perms)))
    return out


def load_tokens_file(path: str) -> list:
    """TokenScopes of a JSON or TOML (`*.toml`) tokens file; raises InvalidTokensFile."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidTokensFile(path, f"cannot read it: {e.strerror or e}") from None
    try:
        if path.lower().endswith(".toml"):
            import tomllib

            doc = tomllib.loads(raw.decode())
        else:
            doc = json.loads(raw)
        return parse_tokens(doc)
    except InvalidTokensFile:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidTokensFile(path, str(e)) from None


class Authenticator:
    """The server's tokens: `--auth-token` (everything) plus the tokens file, re-read by `reload`."""

    def __init__(self, auth_token: str | None = None, tokens_file: str | None = None):
        self.auth_token = auth_token or None
        self.tokens_file = tokens_file or None
        self._lock = threading.Lock()
        self.table = self._build(load_tokens_file(self.tokens_file) if self.tokens_file else [])

    @property
    def enabled(self) -> bool:
        return bool(self.auth_token or self.tokens_file)

    def _build(self, scoped: list) -> TokenTable:
        base = [TokenScope("auth-token", self.auth_token, frozenset({ALL_DATABASES}), frozenset(PERMISSIONS))] \
            if self.auth_token else []
        return TokenTable(base + [s for s in scoped if s.token != self.auth_token])

    def reload(self) -> bool:
        """Re-reads the tokens file; an invalid one is logged and the tokens in use are kept."""
        if not self.tokens_file:
            return False
        try:
            scoped = load_tokens_file(self.tokens_file)
        except InvalidTokensFile as e:
            log.error("%s; keeping the %d token(s) in use", e, len(self.table))
            return False
        with self._lock:
            self.table = self._build(scoped)
        log.info("tokens file %s reloaded: %d scoped token(s)", self.tokens_file, len(scoped))
        return True

    def authorize(self, presented: str | None, permission: str | None, database: str | None,
                  listing: bool = False) -> TokenScope | None:
        """The token's scope when it may make the request (`TokenScope.check`); raises
        Unauthenticated or PermissionDenied. None when authentication is off."""
        if not self.enabled:
            return None
        scope = self.table.authenticate(presented)
        if permission is not None:
            scope.check(permission, database, listing)
        return scope


def token_from_authorization(value: str | None) -> str | None:
    """The token of an `authorization` value: `Token T` or `Bearer T` (case-insensitive scheme)."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() in ("token", "bearer") and rest.strip():
        return rest.strip()
    return None


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks the `authorization` metadata of every RPC of RPC_PERMISSIONS (others, health and
    reflection, stay open) and, once the request is read, its `database` against the token's scope."""

    def __init__(self, authenticator: Authenticator):
        self.auth = authenticator

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if not self.auth.enabled or is_open(method):
            return continuation(handler_call_details)
        presented = None
        for k, v in handler_call_details.invocation_metadata or ():
            if k == "authorization":
                presented = token_from_authorization(v if isinstance(v, str) else v.decode())
                break
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if method not in RPC_PERMISSIONS:  # fails closed: no scope check is known for it
            return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED,
                             f"{method} is not open to tokens (no permission is defined for it)")
        try:
            scope = self.auth.authorize(presented, None, None)  # the token, before the request is parsed
        except Unauthenticated as e:
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, str(e))

        metadata = tuple(handler_call_details.invocation_metadata or ())

        def check(request, context) -> None:
            database = "" if method in SERVER_WIDE else request_database(method, request, metadata)
            try:
                scope.check(required_permission(method, database), database, listing=method in LISTINGS)
            except PermissionDenied as e:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary_unary(request, context):
                check(request, context)
                token = _SCOPE.set(scope)
                try:
                    return inner(request, context)
                finally:
                    _SCOPE.reset(token)

            return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            inner_s = handler.unary_stream

            def unary_stream(request, context):
                check(request, context)
                token = _SCOPE.set(scope)
                try:
                    yield from inner_s(request, context)
                finally:
                    _SCOPE.reset(token)

            return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer,
                                                        handler.response_serializer)
        if handler.stream_stream is not None:  # Flight DoPut: checked on its first message
            inner_ss = handler.stream_stream

            def stream_stream(request_iterator, context):
                first = next(request_iterator, None)
                check(first, context)
                token = _SCOPE.set(scope)
                try:
                    yield from inner_ss(itertools.chain(() if first is None else (first,), request_iterator), context)
                finally:
                    _SCOPE.reset(token)

            return grpc.stream_stream_rpc_method_handler(stream_stream, handler.request_deserializer,
                                                         handler.response_serializer)
        return _refusing(handler, grpc.StatusCode.UNIMPLEMENTED, "streaming requests are not served")


#: the scope of the token of the RPC a gRPC handler thread serves (None: no tokens configured)
_SCOPE: contextvars.ContextVar = contextvars.ContextVar("iox_token_scope", default=None)


def current_scope() -> TokenScope | None:
    """The token scope of the RPC being served in this thread (None: the server has no tokens);
    what a listing handler cuts its answer with."""
    return _SCOPE.get()


def _refusing(handler, code, message: str):
    """A handler of `handler`'s kind that answers `code` without parsing the request."""
    def refuse(_request, context):
        context.abort(code, message)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, None, handler.response_serializer)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(refuse, None, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, None, handler.response_serializer)
