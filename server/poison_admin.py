"""`iox poison retry` and `iox poison accept`: an operator's word on the messages held as poisoned.

Invariant: a held message (server/write_buffer/poison.py) leaves its hold only while no
micro-batch runs (`WriteBufferConsumer.restart`): retried, its Kafka partition is read again
from it (one that fails again is held again, counting the attempt); accepted, it is recorded in
the preserved catalog first (so a replay skips it too), then marked accepted, and its partition
continues after it. Nothing else changes a held message.

When it runs: the gRPC management service calls `retry` and `accept` (through `IoxServer`);
driver only.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import Catalog
from iox_spark.iox import management_pb2
from iox_spark.server.errors import DatabaseNotFound, InvalidArgument, PoisonedMessageNotFound

if TYPE_CHECKING:
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.consumer import WriteBufferConsumer
    from iox_spark.server.consume.ingest import Ingestor

__all__ = ["PoisonControl", "poisoned_status"]

log = logging.getLogger(__name__)


def poisoned_status(out, db, r) -> None:
    """Fills a management_pb2.PoisonedMessage from the PoisonedMessage `r` of `db`."""
    out.topic, out.partition, out.offset, out.table, out.kind = db.topic, r.partition, r.offset, r.table, r.kind
    out.error, out.detected_at_s, out.last_failed_at_s = r.error, r.detected_at_s, r.last_failed_at_s
    out.state, out.attempts, out.epoch = r.state, r.attempts, r.epoch
    if r.accepted_at_s is not None:
        out.accepted_at_s = r.accepted_at_s


class PoisonControl:
    """Collaborators: the `catalog`; the `consumer` (WriteBufferConsumer: runs a change while no
    micro-batch runs and restarts the stream from the applied offsets); the `lifecycle`
    (LifecycleWorker: commits the accepted messages' record); the `ingestor` (Ingestor: the
    streaming source's holds file follows a change); `refuse_when_fenced(name)`: raises when
    another server owns the database (its record could not be committed)."""

    def __init__(self, catalog: Catalog, consumer: WriteBufferConsumer, lifecycle: LifecycleWorker, ingestor: Ingestor,
                 refuse_when_fenced: Callable[[str], None]):
        self._catalog = catalog
        self._consumer = consumer
        self._lifecycle = lifecycle
        self._ingestor = ingestor
        self._refuse_when_fenced = refuse_when_fenced

    def _held(self, database: str, partition: int | None, offset: int | None):
        """The database with HELD records of `partition` at `offset`; raises DatabaseNotFound,
        InvalidArgument, PoisonedMessageNotFound."""
        db = self._catalog.peek_database(database)
        if db is None:
            raise DatabaseNotFound(database)
        if offset is not None and partition is None:
            raise InvalidArgument("a poisoned message's offset needs its Kafka partition")
        if not db.poisoned_of(partition, offset):
            raise PoisonedMessageNotFound(database, partition, offset)
        return db

    def _answer(self, db, targets: list) -> management_pb2.PoisonedResponse:
        resp = management_pb2.PoisonedResponse()
        for r in db.poisoned_copies(targets):
            poisoned_status(resp.messages.add(), db, r)
        return resp

    def retry(self, database: str, partition: int | None = None, offset: int | None = None):
        """`iox poison retry`: the held messages (of `partition`, at `offset`) are applied again:
        their Kafka partitions are read again from them (the stream restarts from the applied
        offsets); one that fails again is held again (its record counts the attempt)."""
        db = self._held(database, partition, offset)

        def resolve():  # while no micro-batch runs
            targets = db.retry_poisoned(partition, offset)
            if not targets:
                raise PoisonedMessageNotFound(database, partition, offset)
            self._ingestor.poison_changed(db)
            return targets

        targets = self._consumer.restart(resolve)
        for r in targets:
            log.warning("database %s: retrying the poisoned message %s[%d]@%d (iox poison retry)", db.name, db.topic,
                        r.partition, r.offset)
        return self._answer(db, targets)

    def accept(self, database: str, partition: int | None = None, offset: int | None = None):
        """`iox poison accept`: the held messages (of `partition`, at `offset`) are skipped for good:
        recorded in the preserved catalog first (so a replay skips them too), then marked accepted,
        and their Kafka partitions continue after them."""
        from iox_spark.catalog.preserved_catalog import RecordAcceptedPoison

        db = self._held(database, partition, offset)
        self._refuse_when_fenced(database)  # the record cannot be committed

        def resolve():  # while no micro-batch runs
            now = time.time()
            targets, entries = db.poison_acceptance(partition, offset, now)
            if not targets:
                raise PoisonedMessageNotFound(database, partition, offset)
            self._lifecycle.commit_records(db, [RecordAcceptedPoison(messages=tuple(entries))], now)
            db.accept_poisoned(targets, now)  # read again from it, it is passed (server/consume/ingest.py `accepted`)
            self._ingestor.poison_changed(db)
            return targets

        targets = self._consumer.restart(resolve)
        for r in targets:
            log.warning("database %s: the poisoned message %s[%d]@%d is ACCEPTED as skipped (iox poison accept): it "
                        "is never applied; its partition continues after it", db.name, db.topic, r.partition, r.offset)
        return self._answer(db, targets)
