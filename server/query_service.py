"""The query service: a user's SQL answered completely, or refused with the reason.

Invariant: an answer reflects every write its token names and, in an ingester pool, every owner's
unpersisted rows of the tables it reads; an answer that may lack some is never returned as complete.
A query first passes the read barrier (server/query/read_barrier.py: the replay caught up or
`allow_partial`, the token visible), then, in a pool, gathers the other members' unpersisted rows
(server/pool/membership.py), then runs (server/query/engine.py); a partition handed over while it ran
answers OwnershipMoving (UNAVAILABLE: ask again), a token its cut does not cover
WriteTokenNotVisible. An ingester answers no query.

Who calls it: the gRPC Query service, Flight, Flight SQL and InfluxQL (server/api/), through
`IoxServer`, in handler threads (driver).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from iox_spark.server.deadlines import wait_budget_s
from iox_spark.server.errors import DatabaseNotFound, NotAPoolMember, OwnershipMoving, RoleRefuses, WriteTokenNotVisible
from iox_spark.server.query.read_barrier import covered

if TYPE_CHECKING:
    from iox_spark.catalog.catalog import Catalog
    from iox_spark.server.pool.membership import PoolControl
    from iox_spark.server.query.engine import QueryEngine
    from iox_spark.server.query.read_barrier import ReadBarrier

__all__ = ["QueryService", "QUERY_WAIT_MAX_S"]

#: How long a query waits at most (less when its deadline is nearer) for a replay to catch up or for its
#: write token to become visible
QUERY_WAIT_MAX_S = 120.0


class QueryService:
    """`role`: the server's role (an `ingester` answers no query); `catalog`: the in-memory catalog;
    `read_barrier`: ReadBarrier; `engine`: QueryEngine; `pool`: PoolControl, None outside a pool."""

    def __init__(self, role: str, catalog: Catalog, read_barrier: ReadBarrier, engine: QueryEngine,
                 pool: PoolControl | None):
        self._role = role
        self._catalog = catalog
        self._read_barrier = read_barrier
        self._engine = engine
        self._pool = pool

    def _learn(self, database: str) -> None:
        """In a pool, a database written through another member only is learnt from the store first."""
        if self._pool is not None and self._catalog.peek_database(database) is None:
            self._pool.learn_database(database)

    def query(self, database: str, sql: str, after: str = "", allow_partial: bool = False,
              deadline_s: float | None = None):
        """Runs `sql` once the read barrier passed, waiting at most QUERY_WAIT_MAX_S or until a little
        before the request's deadline `deadline_s`. Returns the QueryResult with `partial`, `topic`,
        `topic_id` and `epoch` set; the caller reads its batches or closes it (its rows stream from
        Spark while read)."""
        if self._role == "ingester":
            raise RoleRefuses("ingester", "answer queries", "query a querier or an all member of the pool")
        timeout_s = wait_budget_s(deadline_s, QUERY_WAIT_MAX_S)
        t0 = time.monotonic()
        pool = self._pool
        self._learn(database)
        passage = self._read_barrier.pass_through(database, after, allow_partial, timeout_s)
        remote = None
        losses = pool.losses if pool is not None else 0
        if pool is not None:  # the other members' unpersisted rows of the tables they own
            remote = pool.gather_for_query(database, sql, passage.token.offsets if passage.token else {},
                                           max(0.1, timeout_s - (time.monotonic() - t0)))
        res = self._engine.run(database, sql) if remote is None else self._engine.run(database, sql, remote=remote)
        if pool is not None and pool.losses != losses:
            # a partition read here as its owner's may have been handed over (its unpersisted rows
            # dropped) before the query took its chunks: never an answer that may lack them
            res.close()
            raise OwnershipMoving(database, f"member {pool.member!r} handed one over as the query started")
        db = self._catalog.peek_database(database)
        if passage.token is not None and not covered(passage.token.offsets, res.visible_hi_inclusive):
            # cannot happen while watermarks only grow; never answer without the write
            res.close()
            raise WriteTokenNotVisible(database, passage.token.offsets, res.visible_hi_inclusive, 0.0)
        # decided before the query's cut: a replay that caught up meanwhile may make it complete anyway
        res.partial = passage.partial
        if db is not None:
            res.topic, topic_id, res.epoch = db.incarnation()
            res.topic_id = topic_id or ""
        return res

    def table_columns(self, database: str) -> dict:
        """{table: [(column, role, type)]} of a database's tables, as its schemas hold them (InfluxQL's
        tags and fields); DatabaseNotFound when there is no such database."""
        self._learn(database)
        db = self._catalog.peek_database(database)
        if db is None:
            raise DatabaseNotFound(database)
        return db.table_columns()

    def database_names(self) -> list:
        """The names of the databases this server knows, sorted."""
        return sorted(d.name for d in self._catalog.databases())

    def unpersisted_rows(self, database: str, tables: list, wait_applied: dict, deadline_s: float | None,
                         written_before: dict | None = None, scans: dict | None = None, max_bytes: int = 0):
        """The UnpersistedRows RPC (server/pool/rows.py): this pool member's answer."""
        if self._pool is None:
            raise NotAPoolMember(f"unpersisted rows of {database!r}")
        timeout_s = wait_budget_s(deadline_s, QUERY_WAIT_MAX_S)
        return self._pool.answer_rows(database, tables, wait_applied, timeout_s, written_before, scans, max_bytes)
