"""`iox verify` on a running server: which Kafka partitions it checks, with which queries, and
in an ingester pool which member checks which partition.

Invariant: every Kafka partition of the database is either checked by the server that applies
it (server/query/verify.py), or reported as not checked with the reason; a partition is never
silently left out. Outside a pool this server checks every partition; a pool member checks the
partitions it owns and asks each other owner for its own (`here_only`), so each partition is
compared with the answer of the member that holds its unpersisted rows.

When it runs: in the thread of a Verify RPC (driver), after the database's replay caught up
(the read barrier); its queries bypass the result limits (--max-query-rows / --max-query-bytes)
because the whole table is compared, and they run even on a member whose role is `ingester`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import DatabaseNotFoundError
from iox_spark.catalog.sharding import partition_for, topic_for
from iox_spark.chunk_store.views import quote
from iox_spark.server.errors import DatabaseNotFound, PoolMemberUnavailable
from iox_spark.server.query.engine import QueryEngine
from iox_spark.server.query.verify import (DEFAULT_MAX_DIFFERENCES, PartitionReport, VerifyReport, merge_reports,
                                 report_from_proto, verify_partition)

if TYPE_CHECKING:
    from typing import Callable

    from pyspark.sql import SparkSession

    from iox_spark.catalog.catalog import Catalog
    from iox_spark.server.pool.membership import PoolControl
    from iox_spark.server.query.read_barrier import ReadBarrier
    from iox_spark.server.query.tail import WriteBufferTail
    from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["VerifyControl"]

#: how long the check waits for a replay in progress to catch up
_REPLAY_WAIT_S = 300.0


class VerifyControl:
    """The Verify RPC of one server. `pool`: the server's PoolControl, or None outside a pool."""

    def __init__(self, spark: SparkSession, catalog: Catalog, tail: WriteBufferTail | None,
                 table_view_sql_of: Callable[[str, str], str | None], read_barrier: ReadBarrier,
                 write_buffer: WriteBuffer, pool: PoolControl | None = None):
        self.catalog = catalog
        self.read_barrier = read_barrier
        self.write_buffer = write_buffer
        self.pool = pool
        #: the same views and tail as user queries, without their result limits
        self.engine = QueryEngine(spark, catalog, tail, table_view_sql_of)

    def verify(self, database: str, table: str = "", max_differences: int = DEFAULT_MAX_DIFFERENCES,
               here_only: bool = False) -> VerifyReport:
        """Checks `database` (only `table` when given; `max_differences` 0: DEFAULT_MAX_DIFFERENCES); see
        the module docstring."""
        max_differences = max_differences or DEFAULT_MAX_DIFFERENCES
        if self.pool is not None and self.catalog.peek_database(database) is None:
            self.pool.learn_database(database)  # written through another member only
        db = self.catalog.peek_database(database)
        if db is None:
            raise DatabaseNotFound(database)
        self.read_barrier.pass_through(database, "", False, _REPLAY_WAIT_S)
        n = db.kafka_partitions
        owned, known = db.owned(), db.known_tables()
        kps = [partition_for(table, n)] if table else list(range(n))
        reports = [self._check_here(database, kp, [t for t in ([table] if table else known)
                                                   if partition_for(t, n) == kp], max_differences, not table)
                   for kp in kps if kp in owned]
        elsewhere = [kp for kp in kps if kp not in owned]
        report = VerifyReport(database, reports)
        if not elsewhere:
            return report
        if here_only or self.pool is None:
            return merge_reports(database, [report, VerifyReport(database, [
                PartitionReport(partition=kp, not_verified="not owned by this server") for kp in elsewhere])])
        return merge_reports(database, [report, self._ask_owners(database, table, elsewhere, max_differences)])

    def _check_here(self, database: str, kp: int, tables: list, max_differences: int,
                    every_table: bool) -> PartitionReport:
        def query(t: str):
            res = self.engine.run(database, f"SELECT * FROM {quote(t)}")
            return res.batches(), res.visible_hi_inclusive

        def bounds():
            n = self.catalog.database(database).kafka_partitions
            return self.write_buffer.partition_bounds(topic_for(database), n).get(kp, (0, 0))

        try:
            return verify_partition(database=database, kp=kp, tables=tables, catalog=self.catalog, query=query,
                                    bootstrap=self.write_buffer.bootstrap, bounds=bounds,
                                    max_differences=max_differences, every_table=every_table,
                                    member=self.pool.member if self.pool is not None else "")
        except DatabaseNotFoundError:
            raise DatabaseNotFound(database) from None

    def _ask_owners(self, database: str, table: str, kps: list, max_differences: int) -> VerifyReport:
        """The reports of the members that own `kps` (each asked for the partitions it owns)."""
        import grpc

        owners = {kp: owner for kp, owner, _epoch in self.pool.status(self.catalog.database(database))}
        by_owner: dict = {}
        out = []
        for kp in kps:
            owner = owners.get(kp)
            if owner is None:
                out.append(PartitionReport(partition=kp, not_verified="no member of the pool owns it"))
            else:
                by_owner.setdefault(owner, []).append(kp)
        reports = [VerifyReport(database, out)]
        for owner, theirs in sorted(by_owner.items()):
            try:
                addr = self.pool.address_of(owner, database)
                resp = self.pool.client_for(addr).verify_proto(database, table, max_differences, here_only=True)
                got = report_from_proto(resp)
                got.partitions = [p for p in got.partitions if p.partition in theirs]
                missing = set(theirs) - {p.partition for p in got.partitions}
                got.partitions += [PartitionReport(partition=kp, not_verified=f"{owner} did not check it")
                                   for kp in sorted(missing)]
                reports.append(got)
            except (grpc.RpcError, PoolMemberUnavailable) as e:
                why = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e)
                reports.append(VerifyReport(database, [PartitionReport(
                    partition=kp, not_verified=f"its owner {owner} could not check it ({why})") for kp in theirs]))
        return merge_reports(database, reports)
