"""The lifecycle worker: runs the pure policy and carries out its actions.

When it runs: a daemon thread started by the server after recovery; every
`worker_backoff_ms` it snapshots each database, asks `policy.decide` for
actions and executes them one at a time (compact in memory, persist, compact
persisted files, unload, backpressure); it also releases retired chunk data after a grace period and
deletes unreferenced Parquet files. It stops on server shutdown.

Fencing (docs/ARCHITECTURE.md invariant 8, "One committer") is per database. A database is
fenced when another writer (a second server on the same object store) committed
a revision of its preserved catalog that this server did not: found when a
commit of this server loses its revision (RevisionConflict), when cleanup finds
the next revision right before deleting (catalog/cleanup.py), or by the fence
probe, a second daemon thread that every `FENCE_PROBE_INTERVAL_S` asks the store
whether the next revision of each database it holds a preserved catalog of
exists (`PreservedCatalog.newer_revision`: one existence check per database,
independent of how long a lifecycle round takes), so a server that does not
commit learns it within seconds. From then on the database never commits again
here (no persist, no persisted compaction, no delete mailbox flush, no database
record) and its files are never cleaned up; `fenced` names it with the revision
and `on_fenced` is called once, so the server refuses its writes and deletes
(FAILED_PRECONDITION) and reports it in `iox status`. Decision: the process is
not stopped — its other databases, queries and health keep being served; only
the fenced database stops. The fenced database's in-memory chunks are still
compacted and unloaded and backpressure still follows the buffer size, but
what the new owner writes to a shared write buffer is still applied to memory
here until the server restarts.

In an ingester pool (catalog/ownership.py) fencing is per Kafka partition instead: the
database's preserved catalog takes every member's commits, and this server acts only on the
tables of the partitions it owns (`Database.owns_table`: the snapshot the policy sees, the
retention round). A commit refused with PartitionsNotOwned, or the fence probe's `refresh`
finding a claim, reports the partitions lost (`on_partitions_lost`); after each refresh the new
state goes to `on_catalog_refreshed`, so the server registers the other members' files for its
queries. In a pool catalog cleanup deletes only the unreferenced files of the tables of the
partitions this server owns, once they were unreferenced for `CLEANUP_MIN_AGE_S` (catalog/cleanup.py).

Retention (catalog/retention.py): every round, for each database with a retention period,
`prune_policy.decide_prune` gives the new `reader_lo_ns` and the day partitions entirely
below the prune bound (reader_lo `prune_delay_s` ago). Each is pruned in its own
preserved-catalog transaction (its Parquet files removed, the delete mailbox flushed and,
when it held unpersisted rows, a database checkpoint past them where no other partition's
rows hold it back; the consumer drops rows of days below `pruner_hi_ns` that a replay brings
again, server/consume/ingest.py), then dropped from memory; a failing prune is logged and the others go on. Its files
are deleted from the store only once no query that was running when they left the catalog
still runs (catalog/query_pins.py). `pruner_hi_ns` is recorded (RecordPruned) after the
prunes of a round, never past a partition that failed or was busy.

The server's side of all this is the worker's `hooks` (lifecycle/hooks.py: `on_fenced`,
`on_partitions_lost`, `on_catalog_refreshed`, `memory_pressure`, ...), given at construction.

Memory pressure (the `memory_pressure` hook, from the server's RSS sampler): while
true, the policy unloads every persisted chunk and force-persists first
(lifecycle/policy.py `DatabaseState.memory_pressure`).

Invariant: all decisions come from `policy.decide(state, rules, now)` and
`prune_policy.decide_prune(state, now)`; this module only observes and executes (a fenced
database's committing actions are dropped).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

from iox_spark.catalog.catalog import PERSISTING, Catalog
from iox_spark.catalog.cleanup import delete_unreferenced, find_unreferenced
from iox_spark.catalog.errors import PartitionsNotOwned, RevisionConflict
from iox_spark.catalog.object_store import table_of_parquet_key
from iox_spark.catalog.partition_moves import (checkpoint_without, claim_to_prune, drop_pruned, give_back, partitions_of,
                                               visit_owned_partitions)
from iox_spark.catalog.preserved_catalog import RecordPruned, transaction_key
from iox_spark.catalog.sharding import partition_for

from iox_spark.catalog.crash_points import CrashPoint, crash_point

from iox_spark.chunk_store.chunk_data import release_chunk_data
from iox_spark.lifecycle.compact import compact_chunks
from iox_spark.lifecycle.compact_persisted import compact_persisted_chunks
from iox_spark.lifecycle.persist import InFlightFiles, chunk_states, mailbox_actions, persist_partition
from iox_spark.lifecycle.policy import (Backpressure, CompactChunks, CompactPersistedChunks, DatabaseState, DropChunk, PartitionState,
                     PersistChunks, UnloadChunk, decide)
from iox_spark.lifecycle.prune_policy import (DEFAULT_PRUNE_DELAY_S, AdvancePrunerHi, PartitionRef, PrunePartition, RetentionState, SetReaderLo,
                                    day_bounds_ns, decide_prune)
from iox_spark.chunk_store.parquet_cache import CachedCopy
from iox_spark.lifecycle.hooks import LifecycleHooks
from iox_spark.lifecycle.rules import LifecycleRules
from iox_spark.lifecycle.unload import unload_chunk

__all__ = ["LifecycleWorker", "RETIRED_GRACE_S", "CLEANUP_INTERVAL_S", "MAILBOX_FLUSH_INTERVAL_S",
           "PARQUET_CACHE_SWEEP_INTERVAL_S", "FENCE_PROBE_INTERVAL_S"]

log = logging.getLogger(__name__)

#: How long replaced chunk data stays readable for queries planned before the swap.
RETIRED_GRACE_S = 120.0
#: How often deletes that hit persisted files are recorded in the preserved catalog
#: even when no persist happens (each persist flushes the mailbox too).
MAILBOX_FLUSH_INTERVAL_S = 10.0
#: How often the local copies of Parquet files no chunk reads are handed for removal (chunk_store/parquet_cache.py)
PARQUET_CACHE_SWEEP_INTERVAL_S = 30.0
#: How often unreferenced Parquet files are looked for.
CLEANUP_INTERVAL_S = 300.0
#: A Parquet file younger than this is never deleted by cleanup (an in-flight persist may own it).
CLEANUP_MIN_AGE_S = 900.0
#: How often the fence probe asks the store whether another writer committed the next catalog revision
#: of a database (one existence check per database each time).
FENCE_PROBE_INTERVAL_S = 2.0
#: Actions that commit to the preserved catalog: never carried out for a fenced database.
_COMMITTING_ACTIONS = (PersistChunks, CompactPersistedChunks)


class LifecycleWorker:
    def __init__(self, spark, catalog: Catalog, rules: LifecycleRules, store, preserved: dict, pause_file: str,
                 hooks: LifecycleHooks = LifecycleHooks(), cache=None, prune_delay_s: float = DEFAULT_PRUNE_DELAY_S,
                 metrics=None):
        """`hooks`: what it asks of the server and tells it (lifecycle/hooks.py); `cache`: local copies
        of S3 Parquet files read by unloaded chunks; `prune_delay_s`: the retention task's delay
        behind reader_lo (see prune_policy); `metrics`: the server's operation metrics
        (server/operation_metrics.py), where persists, compactions and prunes are counted, or None."""
        self.spark = spark
        self.catalog = catalog
        self.rules = rules
        self.store = store
        #: database name -> PreservedCatalog (the one committer of that database)
        self.preserved = preserved
        self.pause_file = pause_file
        self.hooks = hooks
        #: local copies of S3 Parquet files read by unloaded chunks
        self.parquet_cache = cache
        self.backpressure_engagements = 0
        self.in_flight = InFlightFiles()
        self.backpressure_engaged = False
        self.actions_done: list = []
        #: one action at a time; reentrant: `paused` holders commit records (`commit_records`)
        self._action_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = None
        self._probe_thread = None
        #: how often the fence probe runs (seconds)
        self.fence_probe_interval_s = FENCE_PROBE_INTERVAL_S
        #: database name -> the catalog revision another writer committed (see the module docstring)
        self._fenced: dict[str, int] = {}
        self._fence_lock = threading.Lock()
        self._last_cleanup = 0.0
        #: pool catalogs: database name -> {file key: `now` of the cleanup that first found it
        #: unreferenced in a partition this server owns}
        self._pool_unreferenced_since: dict[str, dict[str, float]] = {}
        self._last_mailbox_flush = 0.0
        self._last_cache_sweep = 0.0
        self.last_error: str | None = None
        #: the retention task's delay behind reader_lo (see prune_policy)
        self.prune_delay_s = prune_delay_s
        self.metrics = metrics

    # -- thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="lifecycle", daemon=True)
        self._thread.start()
        self._probe_thread = threading.Thread(target=self._probe_loop, name="fence-probe", daemon=True)
        self._probe_thread.start()

    def stop(self) -> None:
        self._stop.set()
        for t in (self._thread, self._probe_thread):
            if t is not None:
                t.join(60)

    def _loop(self) -> None:
        while not self._stop.wait(self.rules.worker_backoff_ms / 1000.0):
            try:
                self.run_once(time.time())
            except RevisionConflict as e:  # fences that database only; the others go on
                self._fence(e)
            except Exception as e:  # keep going: the next round retries
                self.last_error = repr(e)
                log.exception("lifecycle round failed")

    # -- fencing ------------------------------------------------------------------------
    @property
    def fenced(self) -> dict[str, int]:
        """{database: the catalog revision another writer committed} of every fenced database."""
        out = {name: pc.fenced_at for name, pc in list(self.preserved.items()) if pc.fenced_at is not None}
        with self._fence_lock:
            out.update(self._fenced)
        return out

    def fenced_revision(self, db_name: str) -> int | None:
        """The catalog revision another writer committed to `db_name`, or None while this server owns it."""
        with self._fence_lock:
            revision = self._fenced.get(db_name)
        if revision is None:
            pc = self.preserved.get(db_name)
            revision = pc.fenced_at if pc is not None else None
        return revision

    def _check_not_fenced(self, db_name: str) -> None:
        """Raises RevisionConflict when `db_name` is fenced (before anything is written for a commit)."""
        revision = self.fenced_revision(db_name)
        if revision is not None:
            raise RevisionConflict(db_name, revision, transaction_key(db_name, revision))

    def _fence(self, e: RevisionConflict) -> None:
        """Records that `e.db` is fenced at `e.revision`; logs and calls `on_fenced` once per database."""
        with self._fence_lock:
            if e.db in self._fenced:
                return
            self._fenced[e.db] = e.revision
        log.critical("database %s: another writer committed revision %d of its preserved catalog (%s): this "
                     "server no longer commits to it, cleans it up or accepts writes and deletes for it; its "
                     "other databases are served on", e.db, e.revision, e)
        if self.hooks.on_fenced is not None:
            try:
                self.hooks.on_fenced(e)
            except Exception:
                log.exception("database %s: the fencing callback failed", e.db)

    def probe_fencing(self) -> dict[str, int]:
        """Asks the store, for each database this server holds a preserved catalog of and that is not
        fenced yet, whether another writer committed its next revision; fences those found. Returns
        {database: revision} of the databases fenced by this call. A store error is logged and that
        database is asked again next time."""
        found = {}
        for name, pc in list(self.preserved.items()):
            if self.fenced_revision(name) is not None:
                continue
            if self._pooled(pc):
                fenced_at = self._probe_pooled(name, pc)
                if fenced_at is not None:
                    found[name] = fenced_at
                continue
            try:
                revision = pc.newer_revision()
            except Exception as e:
                log.warning("database %s: probing the preserved catalog for a newer revision failed: %s", name, e)
                continue
            if revision is not None:
                self._fence(RevisionConflict(name, revision, transaction_key(name, revision)))
                found[name] = revision
        return found

    def _pooled(self, pc) -> bool:
        """Whether `pc` is (or, on a pool member, may become) a pool catalog."""
        return pc.state.pooled or self.catalog.pool_member

    def _probe_pooled(self, name: str, pc) -> int | None:
        """A pool catalog: another member's revisions are normal (read them, and what was lost); a
        pool member's catalog that no member claimed yet becomes one with another's first claim,
        which is read too; only a revision that is no claim fences it (returned, else None)."""
        self._refresh_pooled(name, pc)
        if pc.fenced_at is None:
            return None
        self._fence(RevisionConflict(name, pc.fenced_at, transaction_key(name, pc.fenced_at)))
        return pc.fenced_at

    def _refresh_pooled(self, name: str, pc) -> None:
        """A pool catalog: reads the other members' transactions; reports the partitions lost to a
        claim, then the new state (their files, for queries). A store error is logged."""
        try:
            lost = pc.refresh()
        except Exception as e:
            log.warning("database %s: reading the pool catalog failed: %s", name, e)
            return
        if lost:
            self._lost(name, tuple(sorted(lost)))
        if self.hooks.on_catalog_refreshed is not None:
            try:
                self.hooks.on_catalog_refreshed(name, pc.state)
            except Exception:
                log.exception("database %s: taking the pool catalog's new state failed", name)

    def _lost(self, name: str, partitions: tuple) -> None:
        log.warning("database %s: Kafka partitions %s are owned by another pool member now: no longer applied "
                    "or persisted here", name, list(partitions))
        if self.hooks.on_partitions_lost is not None and partitions:
            try:
                self.hooks.on_partitions_lost(name, partitions)
            except Exception:
                log.exception("database %s: giving up Kafka partitions %s failed", name, list(partitions))

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.fence_probe_interval_s):
            try:
                self.probe_fencing()
            except Exception:  # keep probing
                log.exception("fence probe failed")

    # -- one round ----------------------------------------------------------------------
    def snapshot(self, db, now: float) -> DatabaseState:
        def state(table: str, key: str, part) -> PartitionState:
            w = part.windows
            return PartitionState(
                table=table, partition_key=key, chunks=tuple(chunk_states(part)),
                persistable_row_count=w.persistable_row_count(now) if w else 0,
                unpersisted_row_count=w.unpersisted_row_count() if w else 0,
                time_of_first_unpersisted_write=w.time_of_first_unpersisted_write() if w else None,
                flush_timestamp_ns=w.peek_flush_timestamp_ns(now) if w else None,
                persisting=part.persisting, compacting=part.compacting,
                time_of_last_query=db.queried_at.get(table))
        parts = visit_owned_partitions(self.catalog, db, now, state)
        return DatabaseState(buffer_size_bytes=self.catalog.memory_bytes(), partitions=tuple(parts),
                             replaying=self.hooks.is_replaying(db), backpressure_engaged=self.backpressure_engaged,
                             memory_pressure=bool(self.hooks.memory_pressure()), frozen=bool(self.hooks.frozen()))

    def run_once(self, now: float) -> list:
        done = []
        for db in self.catalog.databases():
            if db.retention_period_s:
                try:
                    done += self.retention_round(db, now)
                except RevisionConflict as e:
                    self._fence(e)
                except Exception as e:  # the next round retries
                    self.last_error = repr(e)
                    log.exception("retention round of %s failed", db.name)
            try:
                for action in decide(self.snapshot(db, now), self.rules, now):
                    if self._stop.is_set():
                        return done
                    if isinstance(action, _COMMITTING_ACTIONS) and self.fenced_revision(db.name) is not None:
                        continue  # never commits again (see the module docstring)
                    try:
                        if self.execute(db, action, now):
                            done.append(action)
                    except RevisionConflict:
                        raise
                    except PartitionsNotOwned as e:  # a pool member lost partitions: stop applying them
                        self._lost(e.db, e.partitions)
                    except Exception as e:  # this action only: the others go on, the next round retries it
                        self.last_error = repr(e)
                        log.exception("database %s: lifecycle action %s failed", db.name, action)
            except RevisionConflict as e:
                self._fence(e)
        for chunk in self.catalog.take_retired(now - RETIRED_GRACE_S):
            self._guarded("releasing a retired chunk's data", release_chunk_data, self.spark, chunk)
        self._guarded("deleting unpinned files", self.delete_unpinned_files)
        if now - self._last_mailbox_flush >= MAILBOX_FLUSH_INTERVAL_S:
            self._last_mailbox_flush = now
            self._guarded("flushing the delete mailboxes", self.flush_mailboxes, now)
        if now - self._last_cleanup >= CLEANUP_INTERVAL_S:
            self._last_cleanup = now
            self._guarded("cleanup", self.cleanup, now, CLEANUP_MIN_AGE_S)
        if self.parquet_cache is not None and now - self._last_cache_sweep >= PARQUET_CACHE_SWEEP_INTERVAL_S:
            self._last_cache_sweep = now
            self._guarded("sweeping the local Parquet copies", self.sweep_parquet_cache)
        return done

    def sweep_parquet_cache(self) -> int:
        """Hands the local Parquet copies no chunk reads (live or retired) to the query pins; the
        copies they release are deleted by `delete_unpinned_files`. Returns how many were handed."""
        read = {k for c in self.catalog.all_chunks() for k in c.parquet_keys} | self.catalog.retired_parquet_keys()
        return self.parquet_cache.sweep(read)

    def _guarded(self, what: str, fn, *args) -> None:
        """Runs one step of a round; its failure is logged and recorded, the round's other steps
        go on (the next round retries it). RevisionConflict fences as everywhere."""
        try:
            fn(*args)
        except RevisionConflict:
            raise
        except Exception as e:
            self.last_error = repr(e)
            log.exception("lifecycle: %s failed", what)

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
                t0 = time.perf_counter()
                c = compact_chunks(self.spark, self.catalog, db, action.table, action.partition_key,
                                   tuple(action.chunk_ids), now, self.hooks.refresh_view,
                                   to_read_buffer=action.to_read_buffer)
                if c is not None and self.metrics is not None:
                    self.metrics.compacted(db.name, "memory", c.rows, time.perf_counter() - t0)
                return c is not None
            if isinstance(action, CompactPersistedChunks):
                log.info("compacting %d Parquet file(s) of %s/%s/%s (%s)", len(action.chunk_ids), db.name,
                         action.table, action.partition_key, action.reason)
                return self.compact_persisted(db, action.table, action.partition_key, tuple(action.chunk_ids),
                                              now) is not None
            if isinstance(action, UnloadChunk):
                return unload_chunk(self.spark, self.catalog, db, action.table, action.partition_key,
                                    action.chunk_id, self.store, self.parquet_cache)
            if isinstance(action, DropChunk):
                log.warning("persistence is disabled and memory is short: ignoring %s", action)
                return False
        raise TypeError(f"unknown action {action!r}")

    def persist(self, db, table: str, partition_key: str, now: float, force: bool):
        preserved = self.preserved_for(db.name, now)  # raises RevisionConflict when fenced
        t0 = time.perf_counter()
        r = persist_partition(self.spark, self.catalog, db, table, partition_key, self.store, preserved,
                              self.in_flight, now, force, self.hooks.refresh_view, self.parquet_cache)
        if r is not None and self.metrics is not None:
            self.metrics.persisted(db.name, r.rows_persisted, time.perf_counter() - t0)
        if r is not None and self.hooks.on_persisted is not None:
            self.hooks.on_persisted(db, r.database_checkpoint)
        return r

    def persist_now(self, db, table: str | None, partition_key: str | None, now: float) -> list:
        """`iox persist`: persists every partition of the scope now, regardless of thresholds.
        Raises RevisionConflict, writing nothing, when the database is fenced."""
        out = []
        self._check_not_fenced(db.name)
        with self._action_lock:
            for t, k in db.partition_keys(table, partition_key):
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
            return compact_chunks(self.spark, self.catalog, db, table, partition_key, None, now, self.hooks.refresh_view)

    def compact_persisted(self, db, table: str, partition_key: str, chunk_ids: tuple | None, now: float):
        """Merges the partition's Parquet files into one (see lifecycle/compact_persisted.py)."""
        preserved = self.preserved_for(db.name, now)
        t0 = time.perf_counter()
        r = compact_persisted_chunks(self.spark, self.catalog, db, table, partition_key, chunk_ids, self.store,
                                     preserved, self.in_flight, now, self.hooks.refresh_view, self.parquet_cache)
        if r is not None and self.metrics is not None:
            self.metrics.compacted(db.name, "persisted", r.rows, time.perf_counter() - t0)
        return r

    def compact_persisted_now(self, db, table: str, partition_key: str, now: float):
        with self._action_lock:
            try:
                return self.compact_persisted(db, table, partition_key, None, now)
            except RevisionConflict as e:
                self._fence(e)
                raise

    def preserved_for(self, db_name: str, now: float):
        """The database's PreservedCatalog (loaded or created on first use). Raises RevisionConflict when
        the database is fenced, so that nothing is written for a commit that cannot happen."""
        self._check_not_fenced(db_name)
        pc = self.preserved.get(db_name)
        if pc is None:
            from iox_spark.catalog.preserved_catalog import PreservedCatalog, PreservedCatalogConfig

            cfg = PreservedCatalogConfig(transactions_until_checkpoint=self.rules.catalog_transactions_until_checkpoint)
            pc, _state = PreservedCatalog.create_or_load(self.store, db_name, now, cfg)
            self.preserved[db_name] = pc
        return pc

    def database_checkpoint(self, db_name: str):
        """The preserved catalog's database checkpoint of `db_name` (RecordDatabaseCheckpoint), None
        before its first one. Any thread."""
        pc = self.preserved.get(db_name)
        return pc.state.database_checkpoint if pc is not None else None

    def record_database(self, db, now: float) -> bool:
        """Records `db` (its topic, Kafka topic id and epoch) in its preserved catalog if the catalog
        holds no database checkpoint yet; True when it committed one. Called by the server before
        the first write to a database is produced, so that a write buffer that loses the database's
        writes before any persist is detected at the next start (server/consume/recovery.py), not silently
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

    def commit_records(self, db, actions: list, now: float) -> int:
        """Commits `actions` (records of the database that are not data: lost writes, accepted
        poisoned messages, a database checkpoint of a new write-buffer epoch) in one preserved-catalog
        transaction; returns its revision. Raises RevisionConflict, fencing the database, when
        another writer owns it (nothing is written then)."""
        with self._action_lock:
            pc = self.preserved_for(db.name, now)
            try:
                return pc.commit(actions, now)
            except RevisionConflict as e:
                self._fence(e)
                raise

    @contextlib.contextmanager
    def paused(self):
        """No lifecycle action runs while this is held (a database starts a new write-buffer epoch:
        nothing may persist or compact its partitions meanwhile)."""
        with self._action_lock:
            yield

    def mark_checkpoint_complete(self, db, now: float) -> bool:
        """Commits the database's last checkpoint again, marked complete, if nothing of the database is
        unpersisted (every partition's windows empty): its topic then holds nothing that is not in
        Parquet, so losing the topic loses nothing (server/consume/recovery.py continues in a new epoch). True
        when committed. Called by the server after its topic was replaced while it ran."""
        with self._action_lock:
            pc = self.preserved.get(db.name)
            if pc is None or pc.state.database_checkpoint is None:
                return False
            if db.has_unpersisted_rows():
                return False
            numbers = dict(pc.state.database_checkpoint.sequencer_numbers)
            try:
                pc.commit([db.checkpoint_action(numbers, complete=True)], now)
            except RevisionConflict as e:
                self._fence(e)
                raise
            return True

    def flush_mailboxes(self, now: float) -> int:
        """Records pending deletes that hit persisted files in the preserved catalog; returns how many.
        A fenced database is skipped (one found fenced now is recorded so)."""
        n = 0
        with self._action_lock:
            for db in self.catalog.databases():
                try:
                    n += self._flush_mailbox(db, now)
                except RevisionConflict as e:
                    self._fence(e)
        return n

    def _flush_mailbox(self, db, now: float) -> int:
        pc = self.preserved.get(db.name)
        if pc is None or not db.deletes.unrecorded():
            return 0
        self._check_not_fenced(db.name)
        actions: list = []
        flushed = mailbox_actions(db, pc, [], actions)
        if actions:
            pc.commit(actions, now)
            db.deletes.mark_recorded(flushed)
        return len(flushed) if actions else 0

    def cleanup(self, now: float, min_age_s: float) -> list:
        """Deletes Parquet files no retained transaction references (never in-flight ones, nor files an
        Iceberg snapshot not expired references: `LifecycleHooks.published_keys`). A fenced
        database is never cleaned up; one whose next revision another writer committed (checked right
        before deleting, catalog/cleanup.py) loses nothing and is fenced."""
        deleted = []
        for db_name, pc in list(self.preserved.items()):
            if self.fenced_revision(db_name) is not None:
                continue
            # before reading the state: see catalog/cleanup.py; files that retired chunks (replaced by a
            # compaction of persisted files) still read stay until those chunks are released, files an
            # Iceberg snapshot references until it expires
            in_flight = self._in_use_keys()
            crash_point(CrashPoint.CLEANUP_BEFORE_DELETE)
            published = self.hooks.published_keys(db_name)
            if published is None:
                continue  # which files the Iceberg snapshots reference is not known yet
            in_flight |= published
            if self._pooled(pc):
                deleted += self._cleanup_pooled(db_name, pc, in_flight, now, min_age_s)
                continue
            try:
                deleted += delete_unreferenced(self.store, db_name, pc.state, in_flight, min_age_s, now,
                                               newer_revision=pc.newer_revision)
            except RevisionConflict as e:
                self._fence(e)
        if deleted:
            log.info("cleanup deleted %d unreferenced file(s)", len(deleted))
        return deleted

    def _in_use_keys(self) -> set:
        """Keys no cleanup deletes: this server's persists in flight, files retired chunks still
        read, files of queries still running when they left the catalog."""
        return self.in_flight.snapshot() | self.catalog.retired_parquet_keys() | \
            self.catalog.query_pins.waiting_objects()

    def _cleanup_pooled(self, name: str, pc, in_flight: set, now: float, min_age_s: float) -> list:
        """Cleanup of pool catalog `pc` (see catalog/cleanup.py): deletes the files of the tables of
        the Kafka partitions this server owns that no transaction references, none of `in_flight`,
        found unreferenced by a round at least `min_age_s` before `now` and still unreferenced and
        owned after a refresh right before the first delete. Returns the deleted keys."""
        if self._probe_pooled(name, pc) is not None:
            return []  # fenced by a single committer: never cleaned up again
        since = self._pool_unreferenced_since.get(name, {})
        candidates = find_unreferenced(self.store, name, pc.state, in_flight, min_age_s, now,
                                       only=self._owned_file_check(name, pc))
        since = {key: since.get(key, now) for key in candidates}  # forgets keys no longer candidates
        self._pool_unreferenced_since[name] = since
        due = [key for key in candidates if now - since[key] >= min_age_s]
        if not due:
            return []
        if self._probe_pooled(name, pc) is not None:
            return []
        owned, files = self._owned_file_check(name, pc), pc.state.files
        deleted = []
        for key in due:
            if owned(key) and key not in files:  # a claim since the listing: the new owner's now
                self.store.delete(key)
                deleted.append(key)
                since.pop(key, None)
        return deleted

    @staticmethod
    def _owned_file_check(name: str, pc):
        """key -> whether it is a Parquet file of a table of a Kafka partition `pc` says this server
        owns (as of `pc`'s newest state)."""
        owned, n = pc.owned_partitions, pc.state.pool_kafka_partitions

        def check(key: str) -> bool:
            table = table_of_parquet_key(name, key)
            return bool(owned) and n is not None and table is not None and partition_for(table, n) in owned
        return check

    # -- retention ------------------------------------------------------------------------
    def retention_state(self, db) -> RetentionState:
        parts = tuple(PartitionRef(t, k, busy=busy) for t, k, busy in partitions_of(self.catalog, db, owned_only=True))
        return RetentionState(period_s=db.retention_period_s, prune_delay_s=self.prune_delay_s,
                              pruner_hi_ns=db.pruner_hi_ns, partitions=parts)

    def retention_round(self, db, now: float) -> list:
        """Runs `decide_prune` for `db` and carries its actions out (see the module docstring);
        returns the actions that changed something. Raises RevisionConflict when fenced."""
        done: list = []
        failed_from: int | None = None  # start of the earliest partition that could not be pruned
        for action in decide_prune(self.retention_state(db), now):
            if isinstance(action, SetReaderLo):
                db.raise_reader_lo(action.reader_lo_ns)
                continue
            if self.fenced_revision(db.name) is not None:
                break  # never commits again
            if isinstance(action, PrunePartition):
                try:
                    pruned = self.prune_partition(db, action.table, action.partition_key, now)
                except RevisionConflict:
                    raise
                except Exception:
                    log.exception("pruning %s/%s/%s failed (retried next round)", db.name, action.table,
                                  action.partition_key)
                    pruned = False
                if pruned:
                    done.append(action)
                else:
                    start = day_bounds_ns(action.partition_key)[0]
                    failed_from = start if failed_from is None else min(failed_from, start)
            elif isinstance(action, AdvancePrunerHi):
                target = action.pruner_hi_ns if failed_from is None else min(action.pruner_hi_ns, failed_from)
                if db.pruner_hi_ns is not None and target <= db.pruner_hi_ns:
                    continue
                self.commit_records(db, [RecordPruned(pruner_hi_ns=target)], now)
                db.set_pruner_hi(target)
                done.append(AdvancePrunerHi(target))
        return done

    def prune_partition(self, db, table: str, partition_key: str, now: float) -> bool:
        """Drops one partition below the retention: one preserved-catalog transaction removes its
        Parquet files (with the delete mailbox flushed first, as a persist does) and, when it held
        unpersisted rows, records a database checkpoint that no longer replays them; then its
        chunks leave memory (retired: queries planned before still read them) and its files wait
        for the queries running now (catalog/query_pins.py). False when it is busy or held (a failed
        micro-batch not applied again yet); raises what the commit raises."""
        from iox_spark.catalog.preserved_catalog import RemoveParquet

        with self._action_lock:  # no other commit of the lifecycle meanwhile
            pc = self.preserved_for(db.name, now)
            def plan(part, unpersisted: bool) -> tuple:
                keys = sorted(k for k, f in pc.state.files.items()
                              if f.table == table and f.partition_key == partition_key)
                actions: list = []
                flushed = mailbox_actions(db, pc, [], actions)
                actions += [RemoveParquet(key=k) for k in keys]
                if unpersisted:
                    actions.append(db.checkpoint_action(checkpoint_without(self.catalog, db, part)))
                return keys, actions, flushed
            claimed = claim_to_prune(self.catalog, db, table, partition_key, plan)
            if claimed is None:
                return False
            part, (keys, actions, flushed), unpersisted = claimed
            # the commit (an object-store write, retried on S3) outside the catalog lock: micro-batches
            # and queries go on meanwhile; what they add after the checkpoint was built has later offsets
            try:
                if actions:
                    pc.commit(actions, now)
            except BaseException:
                give_back(self.catalog, part, PERSISTING)
                raise
            chunks = drop_pruned(self.catalog, db, table, partition_key, part, flushed)
            self.hooks.refresh_view(db, table)
            self.catalog.retire(chunks, now)
            self.catalog.query_pins.retire(keys)
        log.info("retention: pruned %s/%s/%s (%d chunk(s), %d file(s)%s)", db.name, table, partition_key,
                 len(chunks), len(keys), ", unpersisted rows dropped" if unpersisted else "")
        if self.metrics is not None:
            self.metrics.pruned(db.name, 1, len(keys))
        self.delete_unpinned_files()
        return True

    def delete_unpinned_files(self) -> list:
        """Deletes the pruned Parquet files no running query can read any more and no Iceberg
        snapshot not expired references (`LifecycleHooks.published_keys`; also while that is not
        known yet): those stay for the cleanup, which deletes them once unreferenced (they are
        not in the catalog any more); so does a file whose delete failed (logged)."""
        deleted = []
        published: dict = {}
        for key in self.catalog.query_pins.take_unpinned():
            if isinstance(key, CachedCopy):  # a local copy (chunk_store/parquet_cache.py), not an object
                self._guarded("removing a local Parquet copy", self.parquet_cache.remove, key)
                continue
            if self._published_by_iceberg(key, published):
                continue
            try:
                self.store.delete(key)
                deleted.append(key)
            except Exception as e:
                log.warning("deleting the pruned file %s failed (cleanup retries): %s", key, e)
        return deleted

    def _published_by_iceberg(self, key: str, published: dict) -> bool:
        """Whether an Iceberg snapshot not expired may reference ``key`` (a database's file; True
        while the publication has not read that database). ``published``: the call's cache."""
        for name in list(self.preserved):
            if table_of_parquet_key(name, key) is None:
                continue
            if name not in published:
                published[name] = self.hooks.published_keys(name)
            return published[name] is None or key in published[name]
        return False

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
