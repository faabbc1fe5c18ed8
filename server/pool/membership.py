"""Membership of an ingester pool: claiming Kafka partitions, losing them, seeing the others' files.

Invariant (catalog/ownership.py keeps the one-writer-per-partition rule in the preserved catalog):
this server applies and persists a database's Kafka partition only while it owns it
(`Database.owned_partitions`); every other partition is held (`Database.hold`, NOT_OWNED) at the
offset after what it applied, so nothing of it is applied here. A claim
(`claim`, the ClaimPartitions admin call the assigner makes) commits the claim first (which fences
the previous owner for those partitions), then, while no micro-batch runs, drops what this server
still held of those partitions' tables in memory, registers the files the previous owners
persisted, and resumes each partition at the start of its replay plan from the claimed catalog
state (the previous owner's checkpoints): nothing it persisted is applied again, nothing it did
not persist is skipped. Losing a partition (`lose`: a commit refused, or the catalog's refresh
finding a claim) holds it again and drops its tables' unpersisted rows here (its new owner
replays them from Kafka). After every refresh of a pool catalog, the other members' new files
are registered and their removed files dropped (`take_state`), so a query here reads what every
member persisted. A state older than one taken already is not taken (it would drop the files of
a newer one); a query takes the catalog up to the revision the owners' answers go with unless a
state at least as new was taken (a catalog refreshed, its state not yet taken, does not count).

When it runs: created by `IoxServer.start` when --pool-member is set; `claim` in gRPC threads,
`lose` and `take_state` in the lifecycle's threads. Driver side.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import below_holds
from iox_spark.catalog.checkpoint import DatabaseCheckpoint, PartitionCheckpoint, ReplayPlanner, UnpersistedOffsets
from iox_spark.catalog.partition_keys import day_number_of_key
from iox_spark.catalog.preserved_catalog import RecordDatabaseCheckpoint
from iox_spark.catalog.schema import Column
from iox_spark.catalog.seq_layout import current_seq_origin
from iox_spark.catalog.sharding import partition_for, topic_for
from iox_spark.iox import management_pb2

from iox_spark.server.consume.recovery import add_recorded_delete, register_persisted_file
from iox_spark.server.errors import InvalidArgument, StreamRestartTimedOut

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from iox_spark.catalog.catalog import Catalog, Database
    from iox_spark.catalog.object_store import ObjectStore
    from iox_spark.catalog.preserved_catalog import CatalogState
    from iox_spark.chunk_store.parquet_cache import ParquetCache
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.consumer import WriteBufferConsumer
    from iox_spark.server.consume.ingest import Ingestor
    from iox_spark.server.query.engine import QueryEngine
    from iox_spark.server.query.visibility import Visibility
    from iox_spark.server.replay_watch import ReplayWatch
    from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["PoolControl", "check_reachable", "claims_of", "column_agreement"]

log = logging.getLogger(__name__)

#: after an owner answered that it no longer owns a partition: the pause before the pool catalog
#: is read again and the new owner asked
_OWNER_MOVED_RETRY_S = 0.2

#: a query's read of Kafka's ends (`written_before`) waits at most this long; after a failed read,
#: queries rely on this member's own acknowledged writes for this long before they ask Kafka again
_ENDS_TIMEOUT_S = 2.0
_ENDS_RETRY_AFTER_S = 5.0

#: chunk states whose rows are in Parquet (kept when a partition is lost; the rest is dropped)
_PERSISTED_STATES = ("persisted", "unloaded")


def check_reachable(member: str, address: str, host: str, others: list) -> None:
    """Raises PoolAddressUnreachable when `address` (host:port) is a loopback one and a member of
    `others` (published records) recorded another host; logs a member on another host that
    published a loopback address (this one cannot reach it). Pure but for the log."""
    from iox_spark.server.config import is_loopback
    from iox_spark.server.errors import PoolAddressUnreachable

    def loopback(addr: str) -> bool:
        return is_loopback(addr.rsplit(":", 1)[0] if addr.count(":") == 1 or addr.startswith("[") else addr)

    elsewhere = [r for r in others if isinstance(r.get("host"), str) and r["host"] != host]
    if loopback(address) and elsewhere:
        raise PoolAddressUnreachable(member, address, elsewhere[0]["member"], elsewhere[0]["host"], host)
    for r in elsewhere:
        if loopback(r["address"]):
            log.warning("pool member %r on host %r published the loopback address %s: this member (on %r) "
                        "cannot reach it", r["member"], r["host"], r["address"], host)


def claims_of(pool: "PoolControl | None", role: str):
    """The ClaimPartitions call (`iox claim`, the assigner) of a server in `role` whose pool membership
    is `pool` (None: not a member): `claim(database, partitions)`, refused by a querier and outside a pool."""
    from iox_spark.server.errors import NotAPoolMember, RoleRefuses

    def claim(database: str, partitions) -> management_pb2.ClaimPartitionsResponse:
        if role == "querier":
            raise RoleRefuses("querier", "claim partitions", "list only ingester and all members in the assigner's "
                                                             "--ingesters")
        if pool is None:
            raise NotAPoolMember(f"claiming partitions of {database!r}")
        return pool.claim(database, list(partitions))

    return claim


def column_agreement(store, member: str):
    """The router's `agree_columns` of pool member `member` (request threads):
    `agree(database, columns)`, the pool's columns of `columns` (catalog/pool_schema.py);
    ColumnAgreementUnavailable when the store cannot be asked."""
    from iox_spark.catalog.pool_schema import reserve_columns
    from iox_spark.server.errors import ColumnAgreementUnavailable

    def agree(database: str, columns: dict) -> dict:
        try:
            return reserve_columns(store, database, columns, member)
        except Exception as e:  # noqa: BLE001  (the object store's errors, an unreadable reservation)
            raise ColumnAgreementUnavailable(database, f"{type(e).__name__}: {e}") from e

    return agree


class PoolControl:
    """This server's membership of an ingester pool under the name `member`. Collaborators: the
    `catalog`; the `write_buffer` (WriteBuffer: topics, Kafka's ends, acknowledged offsets); the
    `lifecycle` (LifecycleWorker: the pool catalogs, claims, pauses); the `consumer`
    (WriteBufferConsumer: restarts the stream while no micro-batch runs); the `ingestor` (Ingestor:
    table views, replay row filters, waits for applied offsets); the `replay` (ReplayWatch); `spark`,
    the object `store` and the `parquet_cache` (registering the others' files); the `query_engine`
    (what a query reads) and `visibility` (what this member shows); the topics' `partitions`; the
    `auth_token` this member asks the others with."""

    def __init__(self, member: str, *, catalog: Catalog, write_buffer: WriteBuffer, lifecycle: LifecycleWorker,
                 consumer: WriteBufferConsumer, ingestor: Ingestor, replay: ReplayWatch, spark: SparkSession,
                 store: ObjectStore, parquet_cache: ParquetCache | None, query_engine: QueryEngine,
                 visibility: Visibility, partitions: int, auth_token: str | None):
        self.member = member
        self._catalog, self._write_buffer, self._lifecycle = catalog, write_buffer, lifecycle
        self._consumer, self._ingestor, self._replay = consumer, ingestor, replay
        self._spark, self._store, self._parquet_cache = spark, store, parquet_cache
        self._query_engine, self._visibility = query_engine, visibility
        self._partitions, self._auth_token = partitions, auth_token
        #: one claim or loss at a time
        self._lock = threading.Lock()
        #: one `take_state` at a time (the catalog probe, a claim and queries call it): a file is
        #: registered once
        self._state_lock = threading.Lock()
        #: database -> revision of the newest catalog state taken (`take_state`)
        self._taken_revision: dict[str, int] = {}
        #: database -> (files, delete predicates, table schemas) of that state: the next one is
        #: taken as its difference from these
        self._taken: dict[str, tuple] = {}
        #: gRPC clients of the other members by address, and their addresses by member name
        self._clients: dict = {}
        self._addresses: dict = {}
        self._lock_clients = threading.Lock()
        #: where the other members reach this one (`publish_address`)
        self.address: str | None = None
        #: how many times this member lost partitions (`lose`): a query whose start saw a loss retries
        self.losses = 0
        #: time.monotonic() of the last failed read of Kafka's ends (`written_before`)
        self._ends_failed_at: float | None = None

    # -- claiming ----------------------------------------------------------------------------
    def claim(self, database: str, partitions) -> management_pb2.ClaimPartitionsResponse:
        """Claims `partitions` of `database` for this server (see the module docstring); returns
        the epochs claimed and where each partition resumes."""
        from iox_spark.server.write.router import validate_database_name

        validate_database_name(database)
        n = self._partitions
        kps = sorted(set(int(p) for p in partitions))
        if not kps or any(not 0 <= p < n for p in kps):
            raise InvalidArgument(f"partitions must name Kafka partitions 0..{n - 1}, got {list(partitions)}")
        now = time.time()
        with self._lock:
            topic = self._write_buffer.ensure_topic(database)
            db = self._catalog.ensure_database(database, topic, n)
            if db.topic_id is None:
                db.adopt_topic_id(self._write_buffer.topic_id(topic))
            pc = self._lifecycle.preserved_for(database, now)
            bounds = self._write_buffer.partition_bounds(topic, n)
            out = management_pb2.ClaimPartitionsResponse(database=database)

            # the topic incarnation the pool's offsets are of, recorded with the first claim: a topic
            # lost before the first persist is then found at the next start (LostWrites)
            first = RecordDatabaseCheckpoint(topic=topic, kafka_partitions=n, epoch=db.epoch,
                                             topic_id=db.topic_id, seq_origin=db.seq_origin)

            def between():
                fresh = not db.holds_chunks()
                epochs = pc.claim(kps, n, self.member, now, first_checkpoint=first)
                state = pc.state
                self._adopt(db, state, set(kps), bounds, fresh, now)
                for kp in kps:
                    out.claimed.add(partition=kp, epoch=epochs[kp],
                                    resume_offset=db.applied_hi_inclusive.get(kp, -1) + 1)
                out.catalog_revision = state.revision

            # no persist or compaction runs meanwhile: one of a partition claimed again would commit
            # from windows and chunks `_adopt` drops
            with self._lifecycle.paused():
                self._consumer.restart(between)
        log.info("pool member %s claimed %s partitions %s", self.member, database, kps)
        return out

    def _adopt(self, db, state, kps: set, bounds: dict, fresh: bool, now: float) -> None:
        """Takes over `kps` of `db` from the claimed catalog `state`. Runs while no micro-batch runs."""
        catalog = self._catalog
        n = db.kafka_partitions
        dbck = state.database_checkpoint
        if fresh and dbck is not None:  # a database this server held nothing of: its catalog's epoch and seqs
            db.set_epoch(dbck.epoch, current_seq_origin(state)[0])
        for table, cols in state.table_schemas.items():
            db.schemas.merge(table, [Column(*c) for c in cols])
        self._drop_unpersisted(db, kps)
        self.take_state(db.name, state)
        mine = [t for t in set(db.table_names()) | {f.table for f in state.files.values()}
                if partition_for(t, n) in kps]
        planner = ReplayPlanner()
        for (table, pkey), ck in state.partition_checkpoints.items():
            if partition_for(table, n) not in kps:
                continue
            catalog.set_partition_checkpoint(db, table, pkey, ck)
            if ck.epoch != db.epoch:
                continue
            planner.register_partition_checkpoint(PartitionCheckpoint(
                table=table, partition_key=pkey, flush_timestamp_ns=ck.flush_timestamp_ns,
                offsets={kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in ck.sequencer_numbers.items()
                         if kp in kps}))
            self._ingestor.add_row_filter(db.name, table, day_number_of_key(pkey), ck.flush_timestamp_ns,
                                          {kp: v for kp, v in ck.sequencer_numbers.items() if kp in kps})
        if dbck is not None and dbck.epoch == db.epoch:
            planner.register_database_checkpoint(DatabaseCheckpoint(
                {kp: UnpersistedOffsets(lo, hi) for kp, (lo, hi) in dbck.sequencer_numbers.items() if kp in kps}))
        plan = planner.build()
        planned = set(plan.kafka_partitions())
        starts, until = {}, {}
        for kp in sorted(kps):
            lo, end = bounds.get(kp, (0, 0))
            start = plan.start_offset(kp) if kp in planned else None
            starts[kp] = start = lo if start is None else max(start, lo)
            if end - 1 >= start:
                until[kp] = end - 1
        # the replay's targets first: nothing of the partitions is applied here before they are adopted
        self._replay.extend(topic_for(db.name), until)
        db.adopt_claim(starts)
        for table in mine:
            self._ingestor.refresh_table_view(db, table)

    # -- losing ------------------------------------------------------------------------------
    def lose(self, database: str, partitions) -> None:
        """Another member claimed `partitions` of `database`: hold them and drop their tables'
        unpersisted rows here (see the module docstring). Idempotent."""
        db = self._catalog.peek_database(database)
        if db is None:
            return
        kps = set(partitions)
        with self._lock:
            def between():
                if not db.lose_claim(kps):
                    return
                self.losses += 1  # `lose` holds self._lock meanwhile
                self._drop_unpersisted(db, kps)
                self._replay.drop(db.topic, kps)

            while True:  # no caller retries a loss: a batch that outlives the stream's stop is waited out
                try:
                    with self._lifecycle.paused():
                        self._consumer.restart(between)
                    return
                except StreamRestartTimedOut as e:
                    log.warning("database %s: giving up Kafka partitions %s waits for a micro-batch: %s",
                                database, sorted(kps), e)

    def _drop_unpersisted(self, db, kps: set) -> None:
        """Drops the in-memory rows of the tables of `kps` that are not in Parquet (their owner
        replays them from Kafka); their persisted chunks stay. Ownership changes here (a claim, a
        loss): the next state is taken against everything registered, not as a difference (this
        member's own files of a table it lost are another owner's to remove now)."""
        catalog = self._catalog
        with self._state_lock:
            self._taken.pop(db.name, None)
        dropped, tables = db.drop_unpersisted_of(kps, _PERSISTED_STATES)
        if dropped:
            catalog.retire(dropped, time.time())
        for table in tables:
            self._ingestor.refresh_table_view(db, table)

    # -- the other members' files ----------------------------------------------------------
    def take_state(self, database: str, state: CatalogState) -> None:
        """Registers the files and delete predicates of `state` (a pool catalog's newest) of the
        tables this server does not own, and drops the chunks of their files `state` removed."""
        with self._state_lock:
            if state.revision <= self._taken_revision.get(database, -1):
                return  # this state or a newer one was taken: its files are the ones to read
            if self._take_state(database, state):
                self._taken_revision[database] = state.revision

    def taken_revision(self, database: str) -> int:
        """The revision of the newest state of `database`'s catalog taken here (-1: none)."""
        with self._state_lock:
            return self._taken_revision.get(database, -1)

    def _take_state(self, database: str, state) -> bool:
        """Registers what `state` added since the state taken last, and drops what it removed; the
        first state of a database is compared with everything registered. Only the table partitions
        the difference touches are visited (a pool catalog of 10,000
        files is not walked at every refresh)."""
        db = self._catalog.peek_database(database)
        if db is None:
            return False
        now = time.time()
        prev = self._taken.get(database)
        if prev is None:  # everything registered counts (the start registered the files it found)
            removed = None
            added = state.files
            touched = None
        else:
            prev_files, _prev_deletes, _prev_schemas = prev
            removed = {k: prev_files[k] for k in prev_files.keys() - state.files.keys()}
            added = {k: state.files[k] for k in state.files.keys() - prev_files.keys()}
            touched = {(f.table, f.partition_key) for f in (*removed.values(), *added.values())}
        gone = (lambda k: k not in state.files) if removed is None else removed.__contains__
        known, retired, changed = db.drop_stale_foreign_chunks(touched, gone, state.files.__contains__)
        new = [f for k, f in sorted(added.items(), key=lambda kv: (kv[1].table, kv[1].partition_key, kv[1].min_seq))
               if k not in known and not db.owns_table(f.table)]
        for f in new:
            register_persisted_file(self._spark, self._catalog, self._store, db, f, now, self._parquet_cache)
            changed.add(f.table)
        prev_deletes = frozenset() if prev is None else prev[1]
        deletes = [(_delete_identity(dp), dp) for dp in state.delete_predicates]
        for identity, dp in deletes:
            if dp.table is not None and identity not in prev_deletes and not db.owns_table(dp.table):
                add_recorded_delete(db, dp)
        prev_schemas = {} if prev is None else prev[2]
        for table, cols in state.table_schemas.items():
            if prev_schemas.get(table) != cols and not db.owns_table(table):
                db.schemas.merge(table, [Column(*c) for c in cols])
        if retired:
            self._catalog.retire(retired, now)
        for table in changed:
            self._ingestor.refresh_table_view(db, table)
        self._taken[database] = (state.files, frozenset(identity for identity, _dp in deletes),
                                 dict(state.table_schemas))
        return True

    # -- scatter-gather (server/pool/rows.py) --------------------------------------------
    def answer_rows(self, database: str, tables: list, wait_applied: dict, timeout_s: float,
                    written_before: dict | None = None, scans: dict | None = None, max_bytes: int = 0):
        """This member's UnpersistedRows answer (server/pool/rows.py), per table its unpersisted
        rows, its deletes and the catalog revision they go with; one message without a table when
        none is asked. Only the rows and fields of `scans` ({table: TableScan}, a table without
        one: all), none older than the database's retention; QueryResultTooLarge past `max_bytes`
        (0: no limit). NotPartitionOwner when it does not own a partition of `tables` or
        `wait_applied` (also when it loses one before it read that table's rows). It answers once
        `wait_applied`'s offsets (a write token's) are applied (WriteTokenNotVisible past
        `timeout_s`) and `_barrier`'s are (OwnerNotCaughtUp past it)."""
        import json

        from iox_spark.catalog.catalog import DatabaseNotFoundError
        from iox_spark.iox import query_pb2

        from iox_spark.server.errors import DatabaseNotFound, OwnerNotCaughtUp, WriteTokenNotVisible
        from iox_spark.catalog.retention import reader_lo_ns

        from iox_spark.server.pool.rows import deletes_to_json, owner_rows, rows_message_parts

        try:
            db = self._catalog.database(database)
        except DatabaseNotFoundError:
            raise DatabaseNotFound(database) from None
        n = db.kafka_partitions
        asked = {partition_for(t, n) for t in tables} | set(wait_applied)
        owned = set(db.owned_partitions or ())  # a frozenset, replaced whole: no lock
        if asked - owned:
            raise self._not_owner(database, asked - owned)
        t0 = time.monotonic()
        barrier = self._barrier(db, asked, written_before or {})
        target = {kp: max(off, barrier.get(kp, -1)) for kp, off in wait_applied.items()}
        target.update({kp: off for kp, off in barrier.items() if kp not in target})
        if target:
            self._ingestor.wait_applied(database, target, timeout_s)
        applied_now = db.applied_offsets()
        applied = {kp: applied_now.get(kp, -1) for kp in owned}
        if any(applied.get(kp, -1) < off for kp, off in wait_applied.items()):
            raise WriteTokenNotVisible(database, wait_applied, applied, time.monotonic() - t0)
        behind = {kp: (applied.get(kp, -1), off) for kp, off in barrier.items() if applied.get(kp, -1) < off}
        if behind:
            raise OwnerNotCaughtUp(database, self.member, behind, time.monotonic() - t0)
        pc = self._lifecycle.preserved.get(database)
        revision = (lambda: pc.revision) if pc is not None else (lambda: -1)
        if not tables:
            yield query_pb2.UnpersistedRowsResponse(catalog_revision=revision(), applied_hi_inclusive=applied)
            return
        lo = reader_lo_ns(db.retention_period_s, time.time())
        for table in tables:
            r = owner_rows(self._spark, self._catalog, db, table, revision, (scans or {}).get(table), lo, max_bytes)
            if r is None:  # lost since the check above: its rows are its new owner's now
                raise self._not_owner(database, {partition_for(table, n)})
            columns, deletes = json.dumps(r.columns), deletes_to_json(r.deletes)
            for part in rows_message_parts(r.rows):
                yield query_pb2.UnpersistedRowsResponse(table=table, arrow_ipc=part, columns_json=columns,
                                                        deletes_json=deletes, catalog_revision=r.catalog_revision,
                                                        applied_hi_inclusive=applied)

    def _barrier(self, db, partitions: set, written_before: dict) -> dict:
        """{kp: offset} of `partitions` this owner applies before it answers: what the asking member
        acknowledged before the query started (`written_before`), what this member acknowledged, and
        its replay (after a restart or a claim), each only as far as the partition is not held here
        (a poisoned message, a freeze): a held partition answers what it applied, as a query of a
        server outside a pool does."""
        acked = self._write_buffer.acked_of(db.topic)
        until = self._replay.targets(db.topic)
        held = db.held_offsets()
        wanted = {kp: max(written_before.get(kp, -1), acked.get(kp, -1), until.get(kp, -1)) for kp in partitions}
        return {kp: off for kp, off in below_holds(wanted, held).items() if off >= 0}

    def _not_owner(self, database: str, partitions: set):
        """NotPartitionOwner naming who owns `partitions` now, as far as this member's catalog knows."""
        from iox_spark.server.errors import NotPartitionOwner

        pc = self._lifecycle.preserved.get(database) if self._lifecycle is not None else None
        owners = {kp: (o.owner, o.epoch) for kp, o in (pc.state.owners.items() if pc is not None else ())
                  if kp in partitions}
        return NotPartitionOwner(database, self.member, partitions, owners)

    def gather_for_query(self, database: str, sql: str, wait_applied: dict, timeout_s: float):
        """For a query through this member, before it runs: waits until what was written before it
        (`written_before`) of the partitions it reads that this member owns is visible here, and
        gathers ({table: OwnerRows}, {kp: applied at its owner}) of the tables it reads that other
        members own, and of the partitions of `wait_applied` (a write token) they own; None when
        there are none. Each owner answers once it applied what was written before the query. An
        owner that no longer owns a partition says so: the owners are read again from the pool
        catalog and asked again until `timeout_s` passed. Reads the catalog up to the revision the
        owners' answers go with first (server/pool/rows.py). Raises PoolMemberUnavailable,
        OwnerNotCaughtUp, OwnershipMoving."""
        from iox_spark.server.errors import OwnershipMoving
        from iox_spark.server.pool.rows import OwnerMoved

        db = self._catalog.peek_database(database)
        if db is None or db.owned_partitions is None or self._lifecycle is None:
            return None
        deadline = time.monotonic() + timeout_s
        read, scans = self._query_engine.reads(db, sql)
        written_before = self.written_before(db, {partition_for(t, db.kafka_partitions) for t in read})
        pc = self._lifecycle.preserved.get(database)
        fresh = pc is None
        if fresh:  # a database this member never persisted nor claimed (a querier's): read its catalog
            pc = self._lifecycle.preserved_for(database, time.time())
            pc.refresh()
            self.take_state(database, pc.state)
        moved = None
        while True:
            try:
                self._wait_visible(db, written_before, deadline)
                return self._gather_once(db, pc, fresh, read, wait_applied, written_before,
                                         max(0.1, deadline - time.monotonic()), scans)
            except OwnerMoved as e:
                moved = e
            if time.monotonic() + _OWNER_MOVED_RETRY_S >= deadline:
                raise OwnershipMoving(database, f"{moved.member}: {moved.message}")
            time.sleep(_OWNER_MOVED_RETRY_S)  # the claim is committed; let its new owner take it up
            pc.refresh()
            self.take_state(database, pc.state)
            fresh = False

    def learn_database(self, database: str) -> None:
        """Makes `database` known here when its Kafka topic exists although this member never saw
        it: another member took its writes, and this one lists new topics only while it consumes
        (not while frozen). A query or verify through it then gathers from the owners instead of
        answering NOT_FOUND. Kafka that cannot be asked leaves it unknown. Request threads."""
        from iox_spark.server.write.router import validate_database_name

        try:
            validate_database_name(database)
            topic = topic_for(database)
            if topic not in self._write_buffer.list_database_topics():
                return
            topic_id = self._write_buffer.topic_id(topic)
        except Exception as e:  # noqa: BLE001  (an invalid name, Kafka away: NOT_FOUND as before)
            log.debug("pool member %s: database %r not learnt from Kafka (%s)", self.member, database, e)
            return
        db = self._catalog.ensure_database(database, topic, self._partitions)
        db.adopt_topic_id(topic_id)

    def written_before(self, db: Database, partitions: set) -> dict:
        """{kp: offset} of `partitions` written before now: the highest this member got acknowledged
        and Kafka's end (another member's acknowledged writes; a Kafka that cannot be asked within
        _ENDS_TIMEOUT_S leaves this member's own, for _ENDS_RETRY_AFTER_S). Kafka's end is its
        watermark: exact on Kafka; Tansu on object storage, loaded, may show a write to readers late."""
        out = {kp: off for kp, off in self._write_buffer.acked_of(db.topic).items() if kp in partitions}
        failed = self._ends_failed_at
        if partitions and (failed is None or time.monotonic() - failed > _ENDS_RETRY_AFTER_S):
            try:
                ends = self._write_buffer.high_watermarks([db.topic], db.kafka_partitions,
                                                        timeout_s=_ENDS_TIMEOUT_S).get(db.topic, {})
                self._ends_failed_at = None
            except Exception as e:  # noqa: BLE001  (Kafka away: what this member knows it wrote)
                log.debug("pool query of %s: Kafka's ends unknown (%s)", db.name, e)
                self._ends_failed_at = time.monotonic()
                ends = {}
        else:
            ends = {}
        for kp, end in ends.items():
            if kp in partitions and end - 1 > out.get(kp, -1):
                out[kp] = end - 1
        return out

    def _wait_visible(self, db, written_before: dict, deadline: float) -> None:
        """Waits until this member's visible offsets (applied, or in the write buffer's tail) of the
        partitions it owns reach `written_before`, as far as a partition is not held here;
        OwnerNotCaughtUp past `deadline`."""
        from iox_spark.server.errors import OwnerNotCaughtUp

        t0 = time.monotonic()
        while True:
            owned = set(db.owned_partitions or ())  # a frozenset, replaced whole: no lock
            held = db.held_offsets()
            target = below_holds({kp: off for kp, off in written_before.items() if kp in owned}, held)
            vis = self._visibility.visible(db)
            behind = {kp: (vis.get(kp, -1), off) for kp, off in target.items() if vis.get(kp, -1) < off}
            if not behind:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise OwnerNotCaughtUp(db.name, self.member, behind, time.monotonic() - t0)
            self._ingestor.wait_applied(db.name, {kp: off for kp, (_v, off) in behind.items()}, min(left, 0.05))

    def _gather_once(self, db, pc, fresh: bool, read: list, wait_applied: dict, written_before: dict,
                     timeout_s: float, scans: dict | None = None):
        """One round of `gather_for_query` with the owners `pc` names now; OwnerMoved when one of
        them answers that it does not own a partition asked, or when this member claimed one it
        has not taken up yet (`claim` commits first, then resumes the partition here). `scans`:
        what the query reads of each table (server/query/pushdown.py), sent to the owners."""
        import grpc

        from iox_spark.server.errors import PoolMemberUnavailable, QueryResultTooLarge, WriteTokenNotVisible
        from iox_spark.server.pool.rows import NOT_OWNER_METADATA, OwnerMoved, gather, reads_of

        database, n = db.name, db.kafka_partitions
        owned = db.owned()  # in a pool: those claimed
        needed = {partition_for(t, n) for t in read} | set(wait_applied)
        if not fresh and any(kp not in owned and kp not in pc.state.owners for kp in needed):
            # a partition with no owner known here: a claim the fence probe has not read yet
            # (else its owner's rows would be missing from the answer, not waited for)
            pc.refresh()
            self.take_state(database, pc.state)
        adopting = sorted(kp for kp in needed if kp not in owned and kp in pc.state.owners
                          and pc.state.owners[kp].owner == self.member)
        if adopting:  # claimed by this member, not taken up yet: neither here nor elsewhere are its rows
            raise OwnerMoved(self.member, adopting, f"this member is taking over Kafka partitions {adopting}")
        owners = {kp: o.owner for kp, o in pc.state.owners.items() if kp not in owned and o.owner != self.member}
        tables = [t for t in read if partition_for(t, n) in owners]
        wait = {kp: off for kp, off in wait_applied.items() if kp in owners}
        if not tables and not wait:
            return None
        max_bytes = self._query_engine.max_bytes

        def fetch(member, name, ts, w, left_s):
            from iox_spark.iox import query_pb2

            addr = self.address_of(member, name)
            kps = {kp for kp, a in owners.items() if a == member}
            req = query_pb2.UnpersistedRowsRequest(database=name, tables=ts, wait_applied=w, written_before={
                kp: off for kp, off in written_before.items() if kp in kps}, max_bytes=max_bytes,
                reads=reads_of({t: s for t, s in (scans or {}).items() if t in ts}))
            try:
                return list(self._client(addr).query_stub.UnpersistedRows(req, timeout=left_s))
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    not_owned = dict(e.trailing_metadata() or ()).get(NOT_OWNER_METADATA)
                    if not_owned is not None:
                        raise OwnerMoved(member, [int(p) for p in not_owned.split(",") if p], e.details()) from None
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and w:
                    raise WriteTokenNotVisible(name, w, {}, left_s) from None
                if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and max_bytes:
                    raise QueryResultTooLarge("bytes", max_bytes, "--max-query-bytes") from None
                with self._lock_clients:  # it may come back elsewhere: read its address again next time
                    self._addresses.pop(member, None)
                raise PoolMemberUnavailable(name, f"{member} ({addr})", f"{e.code().name}: {e.details()}") from None

        rows, applied, revision = gather(db, tables, owners, wait, fetch, timeout_s, max_bytes)
        if revision > self.taken_revision(database):  # files the owners persisted by then: take them first
            if revision > pc.revision:  # (the catalog probe may have read them, and not taken them yet)
                pc.refresh()
            self.take_state(database, pc.state)
        return rows, applied

    def publish_address(self, address: str) -> None:
        """Records where the other members reach this one (`MEMBERS_PREFIX`<name>.json) and the
        host it runs on, at start once gRPC serves; a later start overwrites it. Raises
        PoolAddressUnreachable (nothing published) for a loopback address while another member
        runs on another host."""
        import socket

        from iox_spark.catalog.ownership import member_address_key, member_address_record, read_member_records

        host = socket.gethostname()
        others = [r for r in read_member_records(self._store) if r["member"] != self.member]
        check_reachable(self.member, address, host, others)
        self._store.put(member_address_key(self.member), member_address_record(self.member, address,
                                                                                     time.time(), host))
        self.address = address

    def address_of(self, member: str, database: str) -> str:
        """The gRPC address `member` published (cached until a call to it fails); PoolMemberUnavailable
        when it published none."""
        from iox_spark.catalog.ownership import read_member_address

        from iox_spark.server.errors import PoolMemberUnavailable

        with self._lock_clients:
            addr = self._addresses.get(member)
        if addr is not None:
            return addr
        try:
            addr = read_member_address(self._store, member)
        except ValueError as e:
            raise PoolMemberUnavailable(database, member, str(e)) from None
        if addr is None:
            raise PoolMemberUnavailable(database, member, "it has not published its address")
        with self._lock_clients:
            self._addresses[member] = addr
        return addr

    def client_for(self, addr: str):
        """The (cached) client of the member at `addr`, with this server's token."""
        return self._client(addr)

    def _client(self, addr: str):
        from iox_spark.server.api.client import IoxClient

        with self._lock_clients:
            c = self._clients.get(addr)
            if c is None:
                c = self._clients[addr] = IoxClient(addr, token=self._auth_token)
            return c

    def close(self) -> None:
        with self._lock_clients:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def status(self, db: Database) -> list:
        """[(kp, owner, epoch)] of `db`'s pool catalog as this server last read it (empty outside one)."""
        pc = self._lifecycle.preserved.get(db.name) if self._lifecycle else None
        if pc is None:
            return []
        return [(kp, o.owner, o.epoch) for kp, o in sorted(pc.state.owners.items())]


def _delete_identity(dp) -> tuple:
    """What makes a preserved catalog's delete predicate the delete it is, for `take_state`: all
    but the files it applies to (which change as files are compacted or removed, and are as long
    as the table's file list), as the mailbox tells two deletes apart (server/consume/recovery.py
    `add_recorded_delete`: an equal delete is applied once)."""
    return dp.table, dp.start_ns, dp.stop_ns_exclusive, dp.predicate, dp.seq
