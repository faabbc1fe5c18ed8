"""Manual lifecycle actions: `iox persist` and `iox compact`, on what was written before them.

Invariant: a manual action acts on every write acknowledged before the request (whoever
produced it), not on what a micro-batch happened to apply already: it first waits until the
database applied the write buffer's end as of the call (a Kafka partition held at a poisoned
message, a freeze or a fence: up to its hold), within the request's deadline. What it could not
cover is said in the answer, never reported as done.

Who calls it: the management gRPC service (server/api/grpc_services.py) through `IoxServer`, in
handler threads (driver); the persist and compaction run in that thread (lifecycle/worker.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import DatabaseNotFoundError, below_holds
from iox_spark.catalog.sharding import partition_for, topic_for
from iox_spark.iox import management_pb2
from iox_spark.server.deadlines import wait_budget_s
from iox_spark.server.errors import CatchUpTimedOut, DatabaseNotFound, WriteBufferUnavailable

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["ManualActions", "CATCH_UP_TIMEOUT_S"]

#: How long `iox persist` / `iox compact` wait at most (less when the request's deadline is nearer) for the
#: writes acknowledged before them to be applied
CATCH_UP_TIMEOUT_S = 120.0


class ManualActions:
    """`catalog`: the in-memory catalog; `write_buffer`: the producer (Kafka's ends); `wait_applied(
    database, target, timeout_s)`: the ingestor's wait; `lifecycle`: the lifecycle worker;
    `partitions`: Kafka partitions per database topic."""

    def __init__(self, catalog: Catalog, write_buffer: WriteBuffer,
                 wait_applied: Callable[[str, dict, float], dict | None], lifecycle: LifecycleWorker,
                 partitions: int):
        self._catalog = catalog
        self._write_buffer = write_buffer
        self._wait_applied = wait_applied
        self._lifecycle = lifecycle
        self._partitions = partitions

    def caught_up(self, database: str, deadline_s: float | None = None):
        """The database once every write acknowledged before this call is applied (`iox persist`,
        `iox compact`: they act on what was written before them, not on what a micro-batch
        happened to apply already).

        The target is the write buffer's true end per Kafka partition as of the call (whoever
        produced it), for a partition held at a poisoned message the offset before it; waits at most
        `deadline_s` (None: CATCH_UP_TIMEOUT_S). Raises DatabaseNotFound when neither the catalog
        nor Kafka knows the database, CatchUpTimedOut past the deadline, WriteBufferUnavailable when
        Kafka cannot be asked. Called from gRPC threads (driver)."""
        timeout_s = wait_budget_s(deadline_s, CATCH_UP_TIMEOUT_S)
        try:
            bounds = self._write_buffer.partition_bounds(topic_for(database), self._partitions)
        except Exception as e:  # KafkaException, or the write buffer closing
            raise WriteBufferUnavailable(f"cannot read the end of {topic_for(database)}: {e}") from e
        target = {kp: end - 1 for kp, (_lo, end) in bounds.items() if end > 0}
        db = self._catalog.peek_database(database)
        if db is not None and db.may_hold:  # a held partition applies nothing from its held message on
            target = below_holds(target, db.held_offsets())
        if not bounds:
            try:
                return self._catalog.database(database)
            except DatabaseNotFoundError:
                raise DatabaseNotFound(database) from None
        applied = self._wait_applied(database, target, timeout_s)
        if applied is None or any(applied.get(kp, -1) < off for kp, off in target.items()):
            raise CatchUpTimedOut(database, target, applied or {}, timeout_s)
        return self._catalog.database(database)

    def persist(self, database: str, table: str = "", partition_key: str = "", deadline_s: float | None = None):
        """Persists what was written before the call (`caught_up`) of the database, one table or one
        partition of it; the answer names what was persisted and, with why, what was not: Kafka
        partitions held (fenced, frozen, not owned, a poisoned message) and table partitions busy."""
        db = self.caught_up(database, deadline_s)
        resp = management_pb2.PersistResponse()
        for r in self._lifecycle.persist_now(db, table or None, partition_key or None, time.time()):
            resp.persisted.add(table=r.table, partition_key=r.partition_key, rows=r.rows_persisted,
                               files=list(r.files), revision=r.revision, flush_timestamp_ns=r.flush_timestamp_ns)
        # what this persist could not cover, and why
        kps = {partition_for(table, db.kafka_partitions)} if table else set(range(db.kafka_partitions))
        for kp, holds in db.hold_reasons().items():
            if kp in kps:
                off, why = holds[0]
                resp.skipped.add(kafka_partition=kp, reason=_held_reason(why, off))
        for t, k, why in db.unpersisted_partitions(table, partition_key):
            if why is not None:
                resp.skipped.add(table=t, partition_key=k, reason=why,
                                 kafka_partition=partition_for(t, db.kafka_partitions))
        return resp

    def compact(self, database: str, table: str, partition_key: str, persisted: bool = False,
                deadline_s: float | None = None):
        """Compacts one table partition once what was written before the call is applied: its
        in-memory chunks into one, or (`persisted`) its Parquet files into one."""
        db = self.caught_up(database, deadline_s)
        if persisted:
            r = self._lifecycle.compact_persisted_now(db, table, partition_key, time.time())
            if r is None:
                return management_pb2.CompactResponse(compacted=False)
            return management_pb2.CompactResponse(compacted=True, rows=r.rows, removed_files=list(r.removed),
                                                  added_file=r.added or "", revision=r.revision)
        c = self._lifecycle.compact_now(db, table, partition_key, time.time())
        if c is None:
            return management_pb2.CompactResponse(compacted=False)
        return management_pb2.CompactResponse(compacted=True, chunk_id=c.id, rows=c.rows)


def _held_reason(why: str, offset: int) -> str:
    """Why a persist did not cover a held Kafka partition (`Database.hold_reasons`' `why`)."""
    if why == "not owned":
        return f"{why}: another member of the pool applies and persists its writes"
    return f"{why}: its writes from offset {offset} on are not applied here, they wait in Kafka"
