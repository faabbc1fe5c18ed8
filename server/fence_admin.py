"""A fenced database: what a server does once another server committed to its preserved catalog.

Invariant (docs/ARCHITECTURE.md invariant 8, "One committer"): once the lifecycle found a
newer revision of a database's preserved catalog committed by another server (a lost commit,
its fence probe, or cleanup's check: lifecycle/worker.py), this server never acknowledges a
write or delete to that database again (`refuse_when_fenced` raises DatabaseFenced, HTTP 409,
naming the revision), and it applies no more of its write buffer: every Kafka partition of
it is held past what is applied (`Database.hold_after_applied(FENCED)`), so its memory of the
database stops growing and its queries answer what it held when fenced. Its other databases
are served on.

When it runs: `refuse_when_fenced` in request threads (the router, retention, poisoned
messages, lost writes call it before anything of a request is done); `on_fenced` in the
lifecycle's thread, once per database. Driver only.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import FENCED, Catalog
from iox_spark.server.errors import DatabaseFenced

if TYPE_CHECKING:
    from iox_spark.catalog.errors import RevisionConflict
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.ingest import Ingestor

__all__ = ["FenceControl"]

log = logging.getLogger(__name__)


class FenceControl:
    """Collaborators: the `catalog`; the `lifecycle` (LifecycleWorker: `fenced_revision`, the one
    record of which databases are fenced); the `ingestor` (Ingestor: `poison_changed`, so the
    streaming source's holds file follows a new hold)."""

    def __init__(self, catalog: Catalog, lifecycle: LifecycleWorker, ingestor: Ingestor):
        self._catalog = catalog
        self._lifecycle = lifecycle
        self._ingestor = ingestor

    def refuse_when_fenced(self, database: str) -> None:
        """Raises DatabaseFenced when another server committed a newer revision of `database`'s
        preserved catalog."""
        revision = self._lifecycle.fenced_revision(database)
        if revision is not None:
            raise DatabaseFenced(database, revision)

    def on_fenced(self, err: RevisionConflict) -> None:
        """The lifecycle's `on_fenced`: `err` (a catalog RevisionConflict) names the database and the
        other server's revision. Holds every Kafka partition of the database past what is applied."""
        log.error("database %s: another server committed revision %d of its preserved catalog; its writes and "
                  "deletes are refused and its write buffer no longer applied from now on, its other databases "
                  "are served on (restart to load the catalog again)", err.db, err.revision)
        db = self._catalog.peek_database(err.db)
        if db is None:
            return
        db.hold_after_applied(FENCED)
        self._ingestor.poison_changed(db)
