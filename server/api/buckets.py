"""InfluxDB v2 buckets and organizations, enough for influxdb-client's BucketsApi:
`GET /api/v2/buckets[?name=&org=&orgID=&id=]`, `GET /api/v2/buckets/{id}`, `POST /api/v2/buckets`
(`{"name", "orgID", "retentionRules": [{"type": "expire", "everySeconds": N}]}`),
`PATCH /api/v2/buckets/{id}` (`retentionRules`), and `GET /api/v2/orgs[?org=NAME|orgID=ID]`
(the client looks an org's id up by name before it creates a bucket).

Mapping: bucket `B` of org `O` is database `O_B` (as the write API maps it,
server/api/http_api.py `database_for`); its retention rule is the database's retention period
(`everySeconds` 0, or no rule: none; server/retention_admin.py). Ids are derived, never stored:
an org's id is the first 16 hex digits of SHA-256 of `org:` + its name, a bucket's of
`bucket:` + its database name, so a bucket id maps to one database deterministically, across
restarts and servers. An org is known once named (by a lookup or a write path); a bucket is any
database whose name starts with a known org's name and `_` (or, without one, splits at its first `_`).

Invariant: a token only sees and changes the buckets of databases it may administer (`may`);
every answer is JSON; bad input is 400 (`{"code": "invalid", ...}`), an unknown bucket or
org 404, an existing bucket 422 (`conflict`), as InfluxDB answers; no request changes anything
unless the retention commit succeeded. Called from the HTTP API's worker threads (driver).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import threading
from urllib.parse import parse_qs

from iox_spark.catalog.retention import MAX_RETENTION_S

__all__ = ["BucketsApi", "BUCKETS_PATH", "ORGS_PATH", "object_id", "handles"]

BUCKETS_PATH = "/api/v2/buckets"
ORGS_PATH = "/api/v2/orgs"


def object_id(kind: str, name: str) -> str:
    """The 16-hex-digit InfluxDB id of an org or bucket (`kind`) called `name`."""
    return hashlib.sha256(f"{kind}:{name}".encode()).hexdigest()[:16]


def handles(route: str) -> bool:
    """Whether `route` (a path without its query) is one of this module's."""
    return route == ORGS_PATH or route == BUCKETS_PATH or route.startswith(BUCKETS_PATH + "/")


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str):
        self.status, self.code, self.message = status, code, message
        super().__init__(message)


def _iso(ts_s: float) -> str:
    return datetime.datetime.fromtimestamp(ts_s, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _period_of(rules) -> int:
    """The retention period of InfluxDB `retentionRules` (None or [] = none)."""
    if rules is None:
        return 0
    if not isinstance(rules, list) or len(rules) > 1:
        raise _HttpError(400, "invalid", "retentionRules must be a list of at most one rule")
    if not rules:
        return 0
    rule = rules[0]
    if not isinstance(rule, dict) or rule.get("type", "expire") != "expire":
        raise _HttpError(400, "invalid", "a retention rule must be {\"type\": \"expire\", \"everySeconds\": N}")
    every = rule.get("everySeconds")
    if isinstance(every, bool) or not isinstance(every, int) or not 0 <= every <= MAX_RETENTION_S:
        raise _HttpError(400, "invalid", f"everySeconds must be an integer from 0 (infinite) to {MAX_RETENTION_S}")
    return every


class BucketsApi:
    """The buckets API of one server. Collaborators: the `catalog` (which databases exist, their
    retention); `set_retention(database, period_s)` (server/retention_admin.py `RetentionControl.set`);
    `database_for(org, bucket)` (the write API's mapping, server/api/http_api.py); `started_at_s`
    (wall seconds: the creation time of a bucket this server did not create). See the module docstring."""

    def __init__(self, catalog, set_retention, database_for, started_at_s: float):
        self._catalog = catalog
        self._set_retention = set_retention
        self._started_at_s = started_at_s
        self.database_for = database_for
        self._lock = threading.Lock()
        #: org id -> org name, of every org named to this server
        self._orgs: dict[str, str] = {}
        self._created_at: dict[str, float] = {}

    def _org(self, name: str) -> str:
        oid = object_id("org", name)
        with self._lock:
            self._orgs.setdefault(oid, name)
        return oid

    def _buckets(self) -> list[tuple[str, str, str]]:
        """[(org, bucket, database)] of every database the server knows."""
        with self._lock:
            orgs = sorted(set(self._orgs.values()), key=len, reverse=True)
        out = []
        for db in self._catalog.databases():
            org = next((o for o in orgs if db.name.startswith(o + "_") and len(db.name) > len(o) + 1), None)
            if org is None:
                org, sep, _rest = db.name.partition("_")
                if not sep or not _rest:
                    continue
            out.append((org, db.name[len(org) + 1:], db.name))
        return out

    def _bucket_json(self, org: str, bucket: str, database: str) -> dict:
        db = self._catalog.peek_database(database)
        period = (db.retention_period_s or 0) if db is not None else 0
        bid = object_id("bucket", database)
        created = _iso(self._created_at.get(database, self._started_at_s))
        return {"id": bid, "orgID": self._org(org), "type": "user", "name": bucket, "description": "",
                "retentionRules": [{"type": "expire", "everySeconds": period, "shardGroupDurationSeconds": 86400}]
                if period else [], "createdAt": created, "updatedAt": created, "labels": [],
                "links": {"self": f"{BUCKETS_PATH}/{bid}", "org": f"{ORGS_PATH}/{self._org(org)}"}}

    def handle(self, method: str, route: str, query: str, body: bytes, may=None, may_all: bool = True) -> tuple[int, dict]:
        """(HTTP status, JSON body) of one request. `may(database)`: whether the request's token may
        administer that database (None: every one): a bucket it may not is not listed, and reading,
        creating or changing it is 403. `may_all`: whether it may administer every database; if
        not, the orgs listed are those with a bucket it may administer, and those the request names."""
        try:
            return self._handle(method, route, parse_qs(query, keep_blank_values=True), body,
                                may if may is not None else (lambda _database: True), may_all or may is None)
        except _HttpError as e:
            return e.status, {"code": e.code, "message": e.message}

    @staticmethod
    def _allowed(may, database: str) -> None:
        if not may(database):
            raise _HttpError(403, "forbidden", f"the token may not administer database {database!r}")

    def _handle(self, method: str, route: str, qs: dict, body: bytes, may, may_all: bool) -> tuple[int, dict]:
        arg = lambda k: (qs.get(k) or [""])[0]  # noqa: E731
        if route == ORGS_PATH:
            if method != "GET":
                raise _HttpError(405, "method not allowed", f"use GET {ORGS_PATH}")
            if arg("org"):
                self._org(arg("org"))
            named = bool(arg("org") or arg("orgID"))
            visible = {org for org, _bucket, database in self._buckets() if may(database)}
            with self._lock:
                orgs = [{"id": i, "name": n} for i, n in sorted(self._orgs.items(), key=lambda kv: kv[1])
                        if (not arg("org") or n == arg("org")) and (not arg("orgID") or i == arg("orgID"))
                        and (may_all or named or n in visible)]
            return 200, {"links": {"self": ORGS_PATH}, "orgs": orgs}
        bucket_id = route[len(BUCKETS_PATH) + 1:] if route != BUCKETS_PATH else ""
        if method == "GET":
            found = [b for b in self._buckets()
                     if (not arg("name") or b[1] == arg("name")) and (not arg("org") or b[0] == arg("org"))
                     and (not arg("orgID") or object_id("org", b[0]) == arg("orgID"))
                     and (not (arg("id") or bucket_id) or object_id("bucket", b[2]) == (arg("id") or bucket_id))]
            if bucket_id:
                if not found:
                    raise _HttpError(404, "not found", f"bucket {bucket_id} not found")
                self._allowed(may, found[0][2])
                return 200, self._bucket_json(*found[0])
            return 200, {"links": {"self": BUCKETS_PATH},
                         "buckets": [self._bucket_json(*b) for b in found if may(b[2])]}
        req = self._json(body)
        if method == "POST" and not bucket_id:
            name, org_id = req.get("name"), req.get("orgID")
            if not isinstance(name, str) or not name:
                raise _HttpError(400, "invalid", "name is required")
            with self._lock:
                org = self._orgs.get(org_id) if isinstance(org_id, str) else None
            if org is None:
                raise _HttpError(404, "not found", f"organization {org_id!r} not found (look it up by name at "
                                                   f"{ORGS_PATH}?org=NAME first)")
            database = self.database_for(org, name)
            self._allowed(may, database)
            period = _period_of(req.get("retentionRules"))
            if self._catalog.peek_database(database) is not None:
                raise _HttpError(422, "conflict", f"bucket with name {name} already exists")
            self._apply(database, period)
            self._created_at.setdefault(database, self._now())
            return 201, self._bucket_json(org, name, database)
        if method == "PATCH" and bucket_id:
            match = [b for b in self._buckets() if object_id("bucket", b[2]) == bucket_id]
            if not match:
                raise _HttpError(404, "not found", f"bucket {bucket_id} not found")
            org, name, database = match[0]
            self._allowed(may, database)
            if req.get("name") not in (None, name):
                raise _HttpError(400, "invalid", "renaming a bucket is not supported (it names its database)")
            if "retentionRules" in req:
                self._apply(database, _period_of(req.get("retentionRules")))
            return 200, self._bucket_json(org, name, database)
        raise _HttpError(405, "method not allowed", f"{method} {BUCKETS_PATH}{'/' + bucket_id if bucket_id else ''} "
                                                    "is not supported")

    def _apply(self, database: str, period_s: int) -> None:
        from iox_spark.server.errors import InvalidArgument

        try:
            self._set_retention(database, period_s)
        except InvalidArgument as e:
            raise _HttpError(400, "invalid", str(e)) from None

    @staticmethod
    def _now() -> float:
        import time

        return time.time()

    @staticmethod
    def _json(body: bytes) -> dict:
        try:
            req = json.loads(body.decode("utf-8")) if body else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _HttpError(400, "invalid", f"the body is not JSON: {e}") from None
        if not isinstance(req, dict):
            raise _HttpError(400, "invalid", "the body must be a JSON object")
        return req
