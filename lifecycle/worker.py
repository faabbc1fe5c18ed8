"""The lifecycle worker: runs the pure policy and carries out its actions.

When it runs: a daemon thread started by the server after recovery; every
`worker_backoff_ms` it snapshots each database, asks `policy.decide` for
actions and executes them one at a time (compact in memory, persist, compact
persisted files, unload, backpressure); it also releases retired chunk data after a grace period and
deletes unreferenced Parquet files. It stops on server shutdown, or when a
commit lost the race for a catalog revision (fencing: another writer owns the
database, this server must stop).

Invariant: all decisions come from `policy.decide(state, rules, now)`; this
module only observes and executes.
"""
from __future__ import annotations

import logging
import threading
import time

from catalog.catalog import Catalog
from catalog.cleanup import delete_unreferenced
from catalog.errors import RevisionConflict

from server.crash_points import crash_point

from .chunk_data import release_chunk_data
from .compact import compact_chunks
from .compact_persisted import compact_persisted_chunks
from .persist import InFlightFiles, chunk_states, mailbox_actions, persist_partition
from .policy import (Backpressure, CompactChunks, CompactPersistedChunks, DatabaseState, DropChunk, PartitionState,
                     PersistChunks, UnloadChunk, decide)
from .rules import LifecycleRules
from .unload import unload_chunk

__all__ = ["LifecycleWorker", "RETIRED_GRACE_S", "CLEANUP_INTERVAL_S", "MAILBOX_FLUSH_INTERVAL_S"]

log = logging.getLogger(__name__)

#: How long replaced chunk data stays readable for queries planned before the swap.
RETIRED_GRACE_S = 120.0
#: How often deletes that hit persisted files are recorded in the preserved catalog
#: even when no persist happens (each persist flushes the mailbox too).
MAILBOX_FLUSH_INTERVAL_S = 10.0
#: How often unreferenced Parquet files are looked for.
CLEANUP_INTERVAL_S = 300.0
#: A Parquet file younger than this is never deleted by cleanup (an in-flight persist may own it).
CLEANUP_MIN_AGE_S = 900.0


class LifecycleWorker:
    def __init__(self, spark, catalog: Catalog, rules: LifecycleRules, store, preserved: dict, refresh_view,
                 pause_file: str, is_replaying=lambda: False, on_fenced=None, on_persisted=None,
                 cache_dir: str | None = None):
        self.spark = spark
        self.catalog = catalog
        self.rules = rules
        self.store = store
        #: database name -> PreservedCatalog (the one committer of that database)
        self.preserved = preserved
        self.refresh_view = refresh_view
        self.pause_file = pause_file
        self.is_replaying = is_replaying
        self.on_fenced = on_fenced
        #: local copies of S3 Parquet files read by unloaded chunks
        self.cache_dir = cache_dir
        #: called with (db, RecordDatabaseCheckpoint) after every committed persist
        self.on_persisted = on_persisted
        self.backpressure_engagements = 0
        self.in_flight = InFlightFiles()
        self.backpressure_engaged = False
        self.fenced = False
        self.actions_done: list = []
        self._action_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._last_cleanup = 0.0
        self._last_mailbox_flush = 0.0
        self.last_error: str | None = None

    # -- thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lifecycle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _loop(self) -> None:
        while not self._stop.wait(self.rules.worker_backoff_ms / 1000.0):
            try:
                self.run_once(time.time())
            except RevisionConflict as e:
                self._fence(e)
                return
            except Exception as e:  # keep going: the next round retries
                self.last_error = repr(e)
                log.exception("lifecycle round failed")

    def _fence(self, e: Exception) -> None:
        self.fenced = True
        log.critical("another writer committed to the preserved catalog (%s): this server stops", e)
        if self.on_fenced is not None:
            self.on_fenced(e)

    # -- one round ----------------------------------------------------------------------
    def snapshot(self, db, now: float) -> DatabaseState:
        parts = []
        with self.catalog.lock:
            for table, by_key in db.partitions.items():
                for key, part in by_key.items():
                    w = part.windows
                    if w is not None:
                        w.rotate(now)
                    parts.append(PartitionState(
                        table=table, partition_key=key, chunks=tuple(chunk_states(part)),
                        persistable_row_count=w.persistable_row_count(now) if w else 0,
                        unpersisted_row_count=w.unpersisted_row_count() if w else 0,
                        time_of_first_unpersisted_write=w.time_of_first_unpersisted_write() if w else None,
                        flush_timestamp_ns=w.peek_flush_timestamp_ns(now) if w else None,
                        persisting=part.persisting, compacting=part.compacting,
                        time_of_last_query=db.queried_at.get(table)))
        return DatabaseState(buffer_size_bytes=self.catalog.memory_bytes(), partitions=tuple(parts),
                             replaying=self.is_replaying(), backpressure_engaged=self.backpressure_engaged)

    def run_once(self, now: float) -> list:
        done = []
        for db in self.catalog.databases():
            for action in decide(self.snapshot(db, now), self.rules, now):
                if self._stop.is_set():
                    return done
                if self.execute(db, action, now):
                    done.append(action)
        for chunk in self.catalog.take_retired(now - RETIRED_GRACE_S):
            release_chunk_data(self.spark, chunk)
        if now - self._last_mailbox_flush >= MAILBOX_FLUSH_INTERVAL_S:
            self._last_mailbox_flush = now
            self.flush_mailboxes(now)
        if now - self._last_cleanup >= CLEANUP_INTERVAL_S:
            self._last_cleanup = now
            self.cleanup(now, CLEANUP_MIN_AGE_S)
        return done

    def execute(self, db, action, now: float) -> bool:
        """Carries out one action; True when it changed something."""
        with self._action_lock:
            if isinstance(action, Backpressure):
                self._set_backpressure(action.engaged)
                return True
            if isinstance(action, PersistChunks):
                log.info("persisting %s/%s/%s (%s)", db.name, action.table, action.partition_key, action.reason)
                return self.persist(db, action.table, action.partition_key, now, action.force) is not None
            if isinstance(action, CompactChunks):
                return compact_chunks(self.spark, self.catalog, db, action.table, action.partition_key,
                                      tuple(action.chunk_ids), now, self.refresh_view,
                                      to_read_buffer=action.to_read_buffer) is not None
            if isinstance(action, CompactPersistedChunks):
                log.info("compacting %d Parquet file(s) of %s/%s/%s (%s)", len(action.chunk_ids), db.name,
                         action.table, action.partition_key, action.reason)
                return self.compact_persisted(db, action.table, action.partition_key, tuple(action.chunk_ids),
                                              now) is not None
            if isinstance(action, UnloadChunk):
                return unload_chunk(self.spark, self.catalog, db, action.table, action.partition_key,
                                    action.chunk_id, self.store, self.cache_dir)
            if isinstance(action, DropChunk):
                log.warning("persistence is disabled and memory is short: ignoring %s", action)
                return False
        raise TypeError(f"unknown action {action!r}")

    def persist(self, db, table: str, partition_key: str, now: float, force: bool):
        preserved = self.preserved_for(db.name, now)
        r = persist_partition(self.spark, self.catalog, db, table, partition_key, self.store, preserved,
                              self.in_flight, now, force, self.refresh_view, self.cache_dir)
        if r is not None and self.on_persisted is not None:
            self.on_persisted(db, r.database_checkpoint)
        return r

    def persist_now(self, db, table: str | None, partition_key: str | None, now: float) -> list:
        """`iox persist`: persists every partition of the scope now, regardless of thresholds."""
        out = []
        with self._action_lock:
            with self.catalog.lock:
                scope = [(t, k) for t, parts in db.partitions.items() for k in parts
                         if (not table or t == table) and (not partition_key or k == partition_key)]
            for t, k in sorted(scope):
                try:
                    r = self.persist(db, t, k, now, force=True)
                except RevisionConflict as e:
                    self._fence(e)
                    raise
                if r is not None:
                    out.append(r)
            # like every persist, flush the delete mailbox, also when there was nothing new to persist
            try:
                self._flush_mailbox(db, now)
            except RevisionConflict as e:
                self._fence(e)
                raise
        return out

    def compact_now(self, db, table: str, partition_key: str, now: float):
        with self._action_lock:
            return compact_chunks(self.spark, self.catalog, db, table, partition_key, None, now, self.refresh_view)

    def compact_persisted(self, db, table: str, partition_key: str, chunk_ids: tuple | None, now: float):
        """Merges the partition's Parquet files into one (see lifecycle/compact_persisted.py)."""
        preserved = self.preserved_for(db.name, now)
        return compact_persisted_chunks(self.spark, self.catalog, db, table, partition_key, chunk_ids, self.store,
                                        preserved, self.in_flight, now, self.refresh_view, self.cache_dir)

    def compact_persisted_now(self, db, table: str, partition_key: str, now: float):
        with self._action_lock:
            try:
                return self.compact_persisted(db, table, partition_key, None, now)
            except RevisionConflict as e:
                self._fence(e)
                raise

    def preserved_for(self, db_name: str, now: float):
        pc = self.preserved.get(db_name)
        if pc is None:
            from catalog.preserved_catalog import PreservedCatalog, PreservedCatalogConfig

            cfg = PreservedCatalogConfig(transactions_until_checkpoint=self.rules.catalog_transactions_until_checkpoint)
            pc, _state = PreservedCatalog.create_or_load(self.store, db_name, now, cfg)
            self.preserved[db_name] = pc
        return pc

    def record_database(self, db, now: float) -> bool:
        """Records `db` (its topic, Kafka topic id and epoch) in its preserved catalog if the catalog
        holds no database checkpoint yet; True when it committed one. Called by the server before
        the first write to a database is produced, so that a write buffer that loses the database's
        writes before any persist is detected at the next start (server/recovery.py), not silently
        read as an empty topic. Raises what the commit raises."""
        with self._action_lock:
            pc = self.preserved_for(db.name, now)
            if pc.state.database_checkpoint is not None:
                return False
            try:
                pc.commit([db.checkpoint_action({})], now)
            except RevisionConflict as e:
                self._fence(e)
                raise
            return True

    def mark_checkpoint_complete(self, db, now: float) -> bool:
        """Commits the database's last checkpoint again, marked complete, if nothing of the database is
        unpersisted (every partition's windows empty): its topic then holds nothing that is not in
        Parquet, so losing the topic loses nothing (server/recovery.py continues in a new epoch). True
        when committed. Called by the server after its topic was replaced while it ran."""
        with self._action_lock:
            pc = self.preserved.get(db.name)
            if pc is None or pc.state.database_checkpoint is None:
                return False
            with self.catalog.lock:
                if any(p.windows is not None and p.windows.unpersisted_row_count()
                       for parts in db.partitions.values() for p in parts.values()):
                    return False
            numbers = dict(pc.state.database_checkpoint.sequencer_numbers)
            try:
                pc.commit([db.checkpoint_action(numbers, complete=True)], now)
            except RevisionConflict as e:
                self._fence(e)
                raise
            return True

    def flush_mailboxes(self, now: float) -> int:
        """Records pending deletes that hit persisted files in the preserved catalog; returns how many."""
        with self._action_lock:
            return sum(self._flush_mailbox(db, now) for db in self.catalog.databases())

    def _flush_mailbox(self, db, now: float) -> int:
        pc = self.preserved.get(db.name)
        if pc is None or not db.deletes.unrecorded():
            return 0
        actions: list = []
        flushed = mailbox_actions(db, pc, [], actions)
        if actions:
            pc.commit(actions, now)
            db.deletes.mark_recorded(flushed)
        return len(flushed) if actions else 0

    def cleanup(self, now: float, min_age_s: float) -> list:
        """Deletes Parquet files no retained transaction references (never in-flight ones)."""
        deleted = []
        for db_name, pc in list(self.preserved.items()):
            # before reading the state: see catalog/cleanup.py; files that retired chunks (replaced by a
            # compaction of persisted files) still read stay until those chunks are released
            in_flight = self.in_flight.snapshot() | self.catalog.retired_parquet_keys()
            crash_point("cleanup_before_delete")
            deleted += delete_unreferenced(self.store, db_name, pc.state, in_flight, min_age_s, now)
        if deleted:
            log.info("cleanup deleted %d unreferenced file(s)", len(deleted))
        return deleted

    def _set_backpressure(self, engaged: bool) -> None:
        import os

        self.backpressure_engaged = engaged
        if engaged:
            self.backpressure_engagements += 1
            open(self.pause_file, "w").close()
            log.warning("buffer over its hard limit: backpressure engaged")
        elif os.path.exists(self.pause_file):
            os.unlink(self.pause_file)
            log.info("backpressure released")
