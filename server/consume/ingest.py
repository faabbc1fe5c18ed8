"""Applies write-buffer micro-batches to the in-memory catalog (Spark foreachBatch).

When it runs: once per micro-batch of the `iox_kafka` stream, in the server's
driver process (Spark calls back into Python). It stops with the stream.

Invariant: a micro-batch is applied whole or not at all: its deletes enter the
mailbox first, new chunks are built and registered next, then table views are
swapped, and only then do the batch's transaction state and
`applied_hi_inclusive` advance, so a reader that sees an offset as applied sees
all of its rows. The lifecycle acts meanwhile, and sees the batch half applied:
from its first change to its last the batch is announced to the catalog
(`Catalog.begin_applying`), so no checkpoint built meanwhile starts replay past
its first offset, and a chunk of it merged by a persist or a compaction meets
its deletes. The driver only collects per-message metadata; a table's
messages of one UTC day become a chunk held in the write-buffer form
(chunk_store/ipc_segments.py): their Arrow IPC payloads copied into one
checkpointed segment, with no decoding (the source already checked that every
payload decodes). While a table replays after a restart its rows are decoded on
the executors instead (`payload_decode_fn`), dropping those already in Parquet. A
batch's chunks are built as concurrent Spark jobs from a small thread pool
(`_build_pool`; small jobs are latency-bound) and added to the catalog only
once every one was built.

A micro-batch that fails is not retried whole forever: it is isolated
(server/write_buffer/poison.py). Its messages are applied again in parts, per database topic
and Kafka partition, each part whole or not at all as above, until the message
that fails on its own is found; it is set aside (`Database.poisoned`, `iox
status`, /metrics) and its Kafka partition holds at the offset before it, while
everything else of the batch, and of later batches, is applied. Held messages
are dropped from every batch (`_poison_state`) until an operator retries or
accepts them.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from pyspark.accumulators import AccumulatorParam

from iox_spark.catalog import time_spans
from iox_spark.catalog.catalog import RETRYING, Catalog, Database
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN, Column, ColumnTypeConflict, TableSchema
from iox_spark.catalog.seq_layout import SEQ_ROW_BITS, max_seq_offset, seq_base

from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.transactions import (ABORT, DEFAULT_TXN_TIMEOUT_S, DECISION, MARKER, PART, TXN_KINDS, TxnRecord)
from iox_spark.chunk_store.chunk_data import (arrow_merge_relations, chunk_source, estimate_bytes, register_df_chunk, release_df,
                                  row_stats)
from iox_spark.chunk_store.chunk_checkpoint import checkpoint
from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE, SEGMENT_COLUMNS, SEGMENT_SCHEMA, register_segments_chunk, value_arrays
from iox_spark.chunk_store.local_rows import (LOCAL_BUILD_MAX_BYTES, LOCAL_CHUNK_MAX_ROWS, LOCAL_PAYLOAD_MAX_BYTES, decode_local,
                                  local_segment_df, register_local_chunk, segment_table)

from iox_spark.catalog.crash_points import CrashPoint, DelayPoint, FaultPoint, crash_point, delay_point, fault_point
from iox_spark.catalog.delete_predicate import from_json
from iox_spark.server.write_buffer.holds_file import holds_of, write_holds
from iox_spark.server.write_buffer.poison import isolate, select, set_aside, settle_retried
from iox_spark.server.errors import ServerError
from iox_spark.server.consume.recovery import keep_mask_fn
from iox_spark.chunk_store.views import quote, retained_view_sql, spark_struct_for, table_view_name, table_view_sql
from iox_spark.server.write_buffer.wire_format import (FORMAT_VERSION, SUPPORTED_FORMATS, WireFormatMismatch, encode_decision, encode_marker, header_problem)
from iox_spark.catalog.partition_keys import NS_PER_DAY, day_numbers
from iox_spark.catalog.sharding import database_of_topic, partition_for

__all__ = ["Ingestor", "decode_delete", "disjoint_unique", "check_seqs_fit", "payload_decode_fn", "executor_lost",
           "worker_crashed", "local_payloads", "table_messages_condition"]

log = logging.getLogger(__name__)

# `_iox_seq` = `seq_base(db.seq_origin, offset)` + row in its message (catalog/seq_layout.py):
# write-buffer order, also across resets of the topic (a new epoch's origin orders after every
# seq of the older ones).


def _seq_base_column(origin: int, offset, F):
    """The Spark column of `seq_base(origin, offset)` for the long column `offset`: built from the same
    constants, so it equals seq_base wherever seq_base returns; for an offset whose seqs would not
    fit (above `max_seq_offset(origin)`, where seq_base raises SeqOverflow) the job fails
    (`raise_error`) instead of computing a wrapped seq."""
    fits = offset.cast("long") <= F.lit(max_seq_offset(origin)).cast("long")
    return F.when(fits, F.lit(origin).cast("long") + F.shiftleft(offset.cast("long"), SEQ_ROW_BITS)).otherwise(
        F.raise_error(F.lit(f"_iox_seq overflow: an offset above {max_seq_offset(origin)} from seq origin "
                            f"{origin}")))


def check_seqs_fit(origin: int, offsets) -> None:
    """Raises SeqOverflow (on the driver, before a Spark job computes a seq) unless the seqs of every
    message applied at one of `offsets` fit from seq origin `origin`."""
    hi = max(offsets, default=None)
    if hi is not None:
        seq_base(origin, hi)


_META_COLUMNS = ["topic", "kp", "offset", "ts_ms", "kind", "tbl", "schema", "nrows", "days", "fmt", "txn", "txn_info",
                 "unique", "problem"]


class _ListParam(AccumulatorParam):
    """Accumulates lists (executors add [(kp, offset, reason)] of payloads they could not decode)."""

    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1


def _forget_accumulator(acc) -> None:
    """Drops a finished job's accumulator from PySpark's driver registry, which otherwise keeps
    every accumulator for the life of the process (one per chunk build would grow without end).
    Updates that arrive for it later are ignored by PySpark's update server."""
    from pyspark.accumulators import _accumulatorRegistry

    _accumulatorRegistry.pop(acc.aid, None)


def payload_decode_fn(columns: list, day_lo_hi: tuple | None, keep_mask=None, seq_origin: int = 0,
               at_offset: dict | None = None, unreadable=None):
    """Builds the executor-side decoder: payload messages -> rows of the table's chunk schema.

    Picklable (captures only plain lists/tuples/dicts and an accumulator). `day_lo_hi` = (first, last) day
    number to keep, or None for all rows. `keep_mask(kp, offset, days, times)`
    (replay after a restart) drops rows the preserved catalog already holds. `seq_origin`: the
    database's (catalog/seq_layout.py); a seq that would not fit raises SeqOverflow.
    `at_offset`: {(kp, offset): offset}: a committed transaction part is applied at
    the offset of the marker that committed it. A payload that does not decode to a table
    with its times yields no rows and is reported to `unreadable` (a `_ListParam`
    accumulator) as (kp, offset, reason).
    """
    at_offset = at_offset or {}

    def fn(batches):
        import pyarrow as pa
        import pyarrow.compute as pc

        from iox_spark.server.write_buffer.wire_format import decode_payload, decoded_problem

        for b in batches:
            offsets = b.column("offset").to_pylist()
            kps = b.column("kp").to_pylist()
            payloads = b.column("payload")
            for i, read_at in enumerate(offsets):
                off = at_offset.get((kps[i], read_at), read_at)
                try:
                    t = decode_payload(payloads[i].as_py())
                    problem = decoded_problem(t)
                except Exception as e:  # untrusted bytes: whatever fails to decode is unreadable
                    problem = f"payload is not an Arrow IPC stream ({type(e).__name__}: {e})"
                if problem is not None:
                    if unreadable is not None:
                        unreadable.add([(kps[i], read_at, problem)])
                    continue
                n = t.num_rows
                arrays = value_arrays(t, columns, combine=True)
                names = [name for name, _typ in columns]
                time_ns = t.column("time").combine_chunks()
                arrays.append(time_ns)
                names.append(TIME_NS_COLUMN)
                seq = pc.add_checked(pa.array(range(n), pa.int64()), seq_base(seq_origin, off))
                arrays.append(seq)
                names.append(SEQ_COLUMN)
                out = pa.RecordBatch.from_arrays(arrays, names=names)
                if day_lo_hi is not None or keep_mask is not None:
                    d = day_numbers(time_ns)
                    mask = pa.array([True] * n)
                    if day_lo_hi is not None:
                        mask = pc.and_(pc.greater_equal(d, day_lo_hi[0]), pc.less_equal(d, day_lo_hi[1]))
                    if keep_mask is not None:
                        mask = pc.and_(mask, keep_mask(kps[i], off, d, time_ns))
                    out = out.filter(mask)
                if out.num_rows:
                    yield out

    return fn


class _StreamStopping(Exception):
    """A micro-batch gives up because its stream is being stopped (not an error: a stop)."""


class Ingestor:
    """Owns the foreachBatch callback. One per server."""

    def __init__(self, spark, catalog: Catalog, kafka_partitions: int, row_filters: dict | None = None,
                 txn_timeout_s: float = DEFAULT_TXN_TIMEOUT_S, holds_file: str = "", metrics=None):
        self.spark = spark
        #: (database, table) -> replay filter (see server/consume/recovery.py); empty once replay is done
        self._row_filters = row_filters or {}
        self.catalog = catalog
        self.kafka_partitions = kafka_partitions
        self.txn_timeout_s = txn_timeout_s
        self.batches_applied = 0
        self._applied = threading.Condition()
        #: (topic, kp, offset) -> (metadata dict, payload): transaction parts read, not yet decided
        self._stash: dict = {}
        #: (database, table) -> the SQL of its table view as last created, without retention (see
        #: table_view_sql_of): the query path reads this server's view, whatever else (a Spark
        #: Connect client, another server in the same Spark application) did to the global one
        self._table_views: dict = {}
        self._views_lock = threading.Lock()
        #: (database, table) -> lock serialising that table's view refreshes (see refresh_table_view)
        self._refresh_locks: dict = defaultdict(threading.Lock)
        #: held while a micro-batch is applied: whoever changes what the consumer reads (the
        #: consumer's `restart`) takes it once the stream is stopped, so no batch runs meanwhile
        self.batch_lock = threading.Lock()
        #: set while the stream is being stopped: a batch that fails then is not isolated
        self.quiescing = threading.Event()
        #: the generation of the streaming query whose batches apply (server/consume/consumer.py):
        #: changed under `batch_lock` before a new query starts, so a batch of an earlier query that
        #: outlived its stop (spark.sql.streaming.stopTimeout) applies nothing
        self.stream_generation = 0
        #: where the streaming source reads which partitions are held (server/write_buffer/poison.py); "" none
        self.holds_file = holds_file
        self._holds_lock = threading.Lock()
        #: ServerMetrics (poisoned messages), or None
        self.metrics = metrics
        #: (topic, kp, offset) -> isolations in a row in which the message failed on its own
        self._suspects: dict = {}
        #: micro-batches in a row that failed for their infrastructure (`_back_off`)
        self._infrastructure_failures = 0

    # foreachBatch entry point
    def apply_batch(self, df, batch_id: int, generation: int | None = None) -> None:
        """Applies one micro-batch (see the module docstring); a batch that fails is isolated
        (server/write_buffer/poison.py): every message that applies is applied, a message that fails on its
        own is set aside and its Kafka partition held, and the batch then succeeds. It fails (and
        the stream retries it from the applied offsets) only when the stream is being stopped, or
        when nothing of it applied and no message failed twice in a row (a failure of everything,
        not of a message). A batch of a query of another `generation` than `stream_generation`
        applies nothing: its offsets are the current query's to read (from the applied ones)."""
        if self._stale(generation, batch_id):
            return
        t0 = time.perf_counter()
        # read once, kept as rows (not Spark's columnar cache: building it for the large binary
        # payloads costs more than the batch's other reads of them); released in `finally`
        checkpointed = df.localCheckpoint(eager=True)
        try:
            with self.batch_lock:
                if not self._stale(generation, batch_id):
                    self._apply_read(checkpointed, batch_id, t0)
        finally:
            release_df(checkpointed)

    def _apply_read(self, raw, batch_id: int, t0: float) -> None:
        """apply_batch's work on the batch `raw` read once, with `batch_lock` held."""
        from pyspark.sql import functions as F

        # small payloads come along: a table's small messages make a local chunk (chunk_store/local_rows.py)
        meta = raw.select(*_META_COLUMNS, F.length("payload").alias("nbytes"),
                          F.when(F.length("payload") <= LOCAL_PAYLOAD_MAX_BYTES, F.col("payload"))
                          .alias("small_payload")).collect()
        log.debug("batch %s: %d messages", batch_id, len(meta))
        if not meta:
            return
        delay_point(DelayPoint.APPLY_BATCH)
        if self.catalog.pool_member:  # a database new here owns nothing yet: held from its start
            for topic in {m["topic"] for m in meta}:
                self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
        holds, accepted = self._poison_state()
        if holds:  # a held partition applies nothing at or after its held message
            kept = [m for m in meta if m["offset"] < holds.get((m["topic"], m["kp"]), m["offset"] + 1)]
            if len(kept) < len(meta):
                raw = raw.filter(~_held_condition(holds, F))
                meta = kept
            if not meta:
                return
        try:
            self._apply(raw, meta, accepted, batch_id, t0, F)
        except Exception as e:
            if self.quiescing.is_set():
                raise
            if executor_lost(e):  # the batch's own blocks went with an executor: no message is at fault
                self._back_off(batch_id, e)
                raise
            if worker_crashed(e):  # a Python worker died: the isolation blames only a message that crashes one twice
                self._back_off(batch_id, e, "a Python worker died", "applying its messages again, in parts,")
            log.error("micro-batch %s failed (%s: %s); looking for the message(s) that fail it", batch_id,
                      type(e).__name__, e, exc_info=True)
            try:
                self._isolate(raw, meta, accepted, batch_id, t0, e, F)
            except Exception as e2:
                if executor_lost(e2) and not self.quiescing.is_set():
                    self._back_off(batch_id, e2)
                raise
        self._infrastructure_failures = 0
        with self._applied:
            self.batches_applied += 1
            self._applied.notify_all()
        op = getattr(self.metrics, "operation", None)  # server/operation_metrics.py
        if op is not None:
            op.micro_batch(len(meta), sum(m["nbytes"] or 0 for m in meta), time.perf_counter() - t0)

    def _unless_quiescing(self) -> None:
        """Raises _StreamStopping when the stream is being stopped: the batch applies nothing (what it
        added is withdrawn) and its offsets are read again by the next query, so a stop does not
        wait for the Spark jobs of a large batch (a restart's or a shutdown's)."""
        if self.quiescing.is_set():
            raise _StreamStopping()

    def _stale(self, generation: int | None, batch_id: int) -> bool:
        """Whether a batch of the query of `generation` must not apply (None: no generation)."""
        if generation is None or generation == self.stream_generation:
            return False
        log.warning("micro-batch %s of a stopped write-buffer stream (generation %d, now %d) applies nothing",
                    batch_id, generation, self.stream_generation)
        return True

    def _back_off(self, batch_id: int, e: BaseException, cause: str = "an executor was lost",
                  then: str = "retrying the batch") -> None:
        """A micro-batch failed for its infrastructure (an executor lost, and with it the batch's
        blocks; a Python worker that died): waits `infrastructure_backoff_s` of the failures in a
        row before the batch is tried again. No message is blamed for it (server/write_buffer/poison.py)."""
        self._infrastructure_failures += 1
        delay = infrastructure_backoff_s(self._infrastructure_failures)
        log.error("micro-batch %s failed: %s (%s); %s in %.1f s (%d in a row)", batch_id, cause, _first_line(e),
                  then, delay, self._infrastructure_failures)
        self.quiescing.wait(delay)  # a stop does not wait it out

    def _apply(self, raw, meta: list, accepted: set, batch_id: int, t0: float, F) -> None:
        """Applies the messages `meta` (metadata rows of `raw`, which holds them and no other
        message of their Kafka partitions that must not be applied) whole, or raises with nothing
        of them applied (`_withdraw`). `accepted`: (topic, kp, offset) of messages accepted to be
        skipped: never applied, their offsets count as applied."""
        t_meta = time.perf_counter()
        #: [(db, chunk)] this attempt added to the catalog: withdrawn if it fails after all
        added: list = []
        #: (topic, kp) -> lowest offset of the batch, and the same by database as announced to the catalog
        lowest: dict = {}
        announced: dict = defaultdict(dict)
        try:
            by_table: dict = defaultdict(list)
            hi: dict = defaultdict(dict)
            txn_rows: dict = defaultdict(list)
            has_deletes = False
            skipped = []
            passed = []  # accepted messages of this batch: not read, not counted as skipped
            for m in meta:
                topic, kp, offset = m["topic"], m["kp"], m["offset"]
                if offset > hi[topic].get(kp, -1):
                    hi[topic][kp] = offset
                if offset < lowest.get((topic, kp), offset + 1):
                    lowest[(topic, kp)] = offset
                if accepted and (topic, kp, offset) in accepted:
                    passed.append((topic, kp, offset))
                    continue
                if m["fmt"] and m["fmt"] not in SUPPORTED_FORMATS:
                    raise WireFormatMismatch(FORMAT_VERSION, m["fmt"], topic, offset)
                problem = header_problem(m["fmt"], m["kind"], m["tbl"], m["schema"], m["days"], m["txn"],
                                         m["txn_info"])
                if problem is None and m["kind"] == "write":
                    problem = m["problem"]  # the source could not decode its payload
                if problem is not None:
                    skipped.append((topic, kp, offset, problem))
                    continue
                if m["kind"] == "write":
                    by_table[(m["topic"], m["tbl"])].append(m.asDict())
                elif m["kind"] == "delete":
                    has_deletes = True
                elif m["kind"] in TXN_KINDS:
                    txn_rows[m["topic"]].append(m)
            # until its applied offsets advance, every checkpoint starts replay at or below the batch
            for (topic, kp), offset in lowest.items():
                announced[database_of_topic(topic)][kp] = offset
            self.catalog.begin_applying(announced)
            # what plans and reads payloads below sees: `raw` without the skipped and accepted messages
            readable = raw.filter(~_message_in(skipped + passed, F)) if skipped or passed else raw
            #: (topic, kp, offset of the part) -> offset it is applied at
            at_offset: dict = {}
            #: (topic, table) -> [(kp, offset, payload)] of parts decided in this batch, read in an earlier one
            stashed: dict = defaultdict(list)
            committed_deletes: list = []
            #: what the batch changes in the TxnLogs and the stash, kept until the batch is applied
            staged_txns: dict = {}
            stash_changes: tuple = ({}, set())
            if txn_rows:
                staged_txns, stash_changes = self._resolve_transactions(
                    readable, txn_rows, hi, by_table, at_offset, stashed, committed_deletes, skipped, F)
            # the batch's deletes are in the mailbox before its chunks are in the catalog: a
            # persist or compaction that merges a new chunk with older ones applies them (a
            # delete removes only rows before it, so the new rows after it stay)
            deleted = self._record_deletes(readable, F, has_deletes, committed_deletes, skipped) \
                if has_deletes or committed_deletes else []
            touched = []
            builds: list[_ChunkBuild] = []
            for (topic, table), msgs in by_table.items():
                self._unless_quiescing()
                db = self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
                fault_point(FaultPoint.APPLY_TABLE, f"{db.name}/{table}")
                builds += self._plan_table(readable, db, topic, table, msgs, F, at_offset, stashed.get((topic, table), []))
                touched.append((db, table))
            skipped += self._build_and_add_chunks(builds, added)
            delay_point(DelayPoint.BATCH_CHUNKS_ADDED, gated=bool(builds))
            touched += self._close_for_deletes(deleted)
            t_chunks = time.perf_counter()
            for db, table in touched:
                self._refresh_after_batch(db, table)
            t_views = time.perf_counter()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("batch %s: %d messages, %d rows, %d table(s): read+meta %.3f s, chunks %.3f s, "
                          "views %.3f s", batch_id, len(meta), sum(m["nrows"] for m in meta), len(touched),
                          t_meta - t0, t_chunks - t_meta, t_views - t_chunks)
            crash_point(CrashPoint.CONSUME_BEFORE_APPLIED)
            if self._row_filters:
                crash_point(CrashPoint.REPLAY_BATCH)
            for db, txns in staged_txns.values():
                db.install_txns(txns)
            self._record_skipped(skipped)
            added_stash, removed = stash_changes
            for key in removed:
                self._stash.pop(key, None)
            self._stash.update(added_stash)
            for topic, parts in hi.items():
                db = self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
                self.catalog.advance_applied(db, parts)
                if db.poisoned:
                    settled = settle_retried(db)
                    for r in settled:
                        log.warning("database %s: the poisoned message %s[%d]@%d was applied on retry", db.name,
                                    topic, r.partition, r.offset)
                    if settled:
                        self.poison_changed(db)
        except Exception:
            self._withdraw(added)
            raise
        finally:
            self.catalog.end_applying(announced)

    # -- poisoned messages (server/write_buffer/poison.py) ---------------------------------------------
    def _poison_state(self) -> tuple[dict, set]:
        """({(topic, kp): held offset}, {(topic, kp, offset)} accepted) over every database."""
        holds: dict = {}
        accepted: set = set()
        dbs = self.catalog.databases()
        if not any(db.may_hold for db in dbs):  # every batch passes here
            return holds, accepted
        for db in dbs:
            for kp, off in db.held_offsets().items():
                holds[(db.topic, kp)] = off
            accepted.update((db.topic, kp, off) for kp, off in db.accepted_offsets())
        return holds, accepted

    def _isolate(self, raw, meta: list, accepted: set, batch_id: int, t0: float, first: Exception, F) -> None:
        """After the whole batch failed with `first`: applies every message that applies and sets
        aside those that fail on their own (server/write_buffer/poison.py `isolate`), holding their partitions.
        Raises `first` (the stream retries the batch from the applied offsets) when the stream is
        stopping, or when nothing applied and either several messages failed (a failure of
        everything, not of messages) or the one that failed did not fail so in the isolation
        before (or in an operator's retry)."""
        groups: dict = defaultdict(list)
        for m in sorted(meta, key=lambda m: (m["topic"], m["kp"], m["offset"])):
            groups[(m["topic"], m["kp"])].append(m)
        applied_any = False

        def attempt(msgs: list):
            nonlocal applied_any
            for again in (False, True):
                if self.quiescing.is_set():
                    raise first
                try:
                    self._apply(raw.filter(_ranges_condition(msgs, F)), msgs, accepted, batch_id, t0, F)
                except Exception as e:
                    if executor_lost(e):  # the infrastructure, not these messages: the isolation stops here
                        raise
                    if worker_crashed(e) and not again:  # a worker died: these messages fail only if they
                        log.warning("micro-batch %s: a Python worker died applying %d message(s) (%s); trying "
                                    "them again", batch_id, len(msgs), _first_line(e))  # crash one again
                        self.quiescing.wait(INFRASTRUCTURE_BACKOFF_S)
                        continue
                    log.info("micro-batch %s: %d message(s) of %s fail together (%s: %s)", batch_id, len(msgs),
                             sorted({(m["topic"], m["kp"]) for m in msgs}), type(e).__name__, e)
                    return e
                applied_any = True
                return None

        found = isolate([groups[k] for k in sorted(groups)], attempt, first)
        keys = [(m["topic"], m["kp"], m["offset"]) for m, _e in found]
        # a message an operator retried failed before: no second isolation needed
        retried = {(db.topic, r.partition, r.offset) for db in self.catalog.databases()
                   for r in select(db, states=(RETRYING,))}
        suspects = {k: max(self._suspects.get(k, 0) + 1, 2 if k in retried else 0) for k in keys}
        self._suspects = suspects
        if found and not applied_any and (len(found) > 1 or all(n < 2 for n in suspects.values())):
            # nothing applied: a failure of everything (Spark, the store) looks the same as one bad
            # message at the head of the only partition read; several such heads are taken for the
            # former (retried, never set aside), one is set aside when it fails so twice in a row
            log.error("micro-batch %s: nothing of it applies and %d message(s) fail on their own%s; retrying the "
                      "batch", batch_id, len(found), " for the first time" if len(found) == 1 else "")
            raise first
        now = time.time()
        for m, e in found:
            self._suspects.pop((m["topic"], m["kp"], m["offset"]), None)
            db = self.catalog.ensure_database(database_of_topic(m["topic"]), m["topic"], self.kafka_partitions)
            error = f"{type(e).__name__}: {e}"
            r = set_aside(db, m["kp"], m["offset"], m["tbl"], m["kind"], error, now, catalog=self.catalog)
            log.error("database %s: write-buffer message %s[%d]@%d (%s%s) fails to apply (attempt %d): %s; it is "
                      "set aside and Kafka partition %d of the database applies nothing after it until it is retried "
                      "(iox poison retry --db %s) or accepted as skipped (iox poison accept --db %s)", db.name,
                      m["topic"], m["kp"], m["offset"], m["kind"] or "?", f" of table {m['tbl']}" if m["tbl"] else "",
                      r.attempts, error, m["kp"], db.name, db.name)
            if self.metrics is not None:
                self.metrics.poisoned(db.name)
            self.poison_changed(db)

    def poison_changed(self, db: Database) -> None:
        """The database's poisoned records changed: the holds file (for the streaming source) and
        the held gauge follow."""
        # one writer at a time, so the file written last is of the newest holds; never called under the
        # catalog's lock (taken inside, after this one)
        with self._holds_lock:
            held = len(select(db))
            holds = holds_of(self.catalog.databases())
            if self.metrics is not None:
                self.metrics.poisoned_held(db.name, held)
            if self.holds_file:
                try:
                    write_holds(self.holds_file, holds)
                except OSError:
                    log.exception("writing the holds file %s (the consumer still drops held messages)",
                                  self.holds_file)

    def row_filter(self, database: str, table: str) -> dict | None:
        """{day: (flush_timestamp_ns, {kp: (lo, hi)})}: the replayed rows of `table` that persisted
        files hold, which a micro-batch drops; None when there are none."""
        return self._row_filters.get((database, table))

    def add_row_filter(self, database: str, table: str, day: int, flush_timestamp_ns: int, offsets: dict) -> None:
        """Replayed rows of `table`'s `day` that a persisted file holds (its flush timestamp and
        {kp: (lo, hi)}) are dropped, as recovery's filters are (server/consume/recovery.py). The
        pool's claim of a partition calls it, before the stream reads the claimed partition."""
        self._row_filters.setdefault((database, table), {})[day] = (flush_timestamp_ns, offsets)

    def drop_row_filters(self, database: str | None = None) -> None:
        """Drops the replay row filters of `database` (a new write-buffer epoch), or all of them
        (`None`: the replay caught up and no replayed row can be in a file any more)."""
        if database is None:
            self._row_filters = {}
            return
        for key in [k for k in self._row_filters if k[0] == database]:
            del self._row_filters[key]

    def forget_topic(self, topic: str) -> None:
        """The topic's write-buffer epoch ended (its lost writes were accepted): drops the
        transaction parts stashed from it. Called while no micro-batch runs."""
        for key in [k for k in self._stash if k[0] == topic]:
            del self._stash[key]
        self._suspects = {k: n for k, n in self._suspects.items() if k[0] != topic}

    def _refresh_after_batch(self, db: Database, table: str) -> None:
        """`refresh_table_view` once the batch's chunks are in the catalog; a failure is retried
        once with every group merged in SQL before it fails the batch (which withdraws them)."""
        try:
            self.refresh_table_view(db, table)
        except Exception:
            log.exception("refreshing the view of %s/%s; retrying with SQL merges only", db.name, table)
            self.refresh_table_view(db, table, arrow_merge=False)

    def _withdraw(self, added: list) -> None:
        """Takes the chunks a failed batch added out of the catalog (it is retried from its first
        offset, so its rows would be there twice) and refreshes their tables' views."""
        by_db: dict = {}  # database name -> (db, [chunk])
        for db, chunk in added:
            by_db.setdefault(db.name, (db, []))[1].append(chunk)
        for db, chunks in by_db.values():
            gone = self.catalog.withdraw_chunks(db, chunks)
            if len(gone) < len(chunks):
                log.error("database %s: %d chunk(s) of a failed micro-batch were already replaced by the "
                          "lifecycle; their rows may be counted twice until a restart", db.name,
                          len(chunks) - len(gone))
            self.catalog.retire(gone)
            for table in sorted({c.table for c in gone}):
                try:
                    self.refresh_table_view(db, table)
                except Exception:
                    log.exception("refreshing the view of %s/%s after a failed micro-batch", db.name, table)

    def _record_skipped(self, skipped: list) -> None:
        """Logs and counts the batch's unreadable messages (once the batch is applied: a retried
        batch counts them once). Their offsets advance `applied_hi_inclusive` like any other's."""
        for topic, kp, offset, problem in sorted(skipped):
            db = self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
            log.warning("database %s: skipped write-buffer message %s[%d]@%d: %s", db.name, topic, kp, offset,
                        problem)
            db.note_skipped(kp, offset, problem)

    # -- transactions (catalog/transactions.py) -------------------------------------------
    def _resolve_transactions(self, raw, txn_rows: dict, hi: dict, by_table: dict, at_offset: dict,
                              stashed: dict, committed_deletes: list, skipped: list, F) -> tuple[dict, tuple]:
        """Feeds the batch's parts, decisions and markers to copies of the databases' TxnLogs; a
        committed part joins `by_table` (or `committed_deletes`) at its marker's offset, an
        undecided one is stashed (its payload collected) until a later batch decides it. A committed
        part whose payload the source could not decode is skipped (added to `skipped`).

        Returns ({database name: (db, new TxnLog)}, (stash entries to add, stash keys to remove)), which
        `apply_batch` installs only once the batch is applied: a failed batch is retried
        from the same state.
        """
        now = time.time()
        staged: dict = {}
        added: dict = {}
        removed: set = set()
        for topic, rows in txn_rows.items():
            db = self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
            records = [_txn_record(m) for m in rows]
            hi_after, txns = db.txns_to_stage(hi[topic])
            res = txns.apply_batch(records, hi_after, now)
            staged[db.name] = (db, txns)
            still_pending = set(txns.pending)
            in_batch = {(m["kp"], m["offset"]): m for m in rows if m["kind"] == PART}
            for key, marker_offset in sorted(res.commit.items()):
                if key in in_batch:
                    m = in_batch[key].asDict()
                    payload = None
                else:
                    m, payload = self._stash[(topic,) + key]
                    removed.add((topic,) + key)
                if json.loads(m["txn_info"])["of"] == "delete":
                    committed_deletes.append((topic, m["kp"], marker_offset, key, payload))
                    continue
                if m.get("problem"):
                    skipped.append((topic, m["kp"], m["offset"], m["problem"]))
                    continue
                applied = dict(m, offset=marker_offset, kind="write")
                by_table[(topic, m["tbl"])].append(applied)
                if payload is None:
                    at_offset[(topic,) + key] = marker_offset
                else:
                    stashed[(topic, m["tbl"])].append((m["kp"], marker_offset, payload))
            removed.update((topic,) + key for key in res.abort)
            keep = [k for k in in_batch if k in still_pending]
            if keep:
                txn_ids = sorted({in_batch[k]["txn"] for k in keep})
                got = raw.filter((F.col("topic") == topic) & (F.col("kind") == PART) & F.col("txn").isin(txn_ids)) \
                    .select("kp", "offset", "payload").collect()
                for r in got:
                    if (r["kp"], r["offset"]) in still_pending:
                        added[(topic, r["kp"], r["offset"])] = (in_batch[(r["kp"], r["offset"])].asDict(),
                                                                bytes(r["payload"]))
        return staged, (added, removed)

    def repair_transactions(self, write_buffer, now: float) -> int:
        """Produces the markers and abort decisions the databases' TxnLogs ask for; returns how many.

        Called by the server's transaction-repair thread (driver), about once a second.
        """
        produced = 0
        for db in self.catalog.databases():
            self._learn_decisions_elsewhere(db, write_buffer, now)
            repairs = db.due_txn_repairs(now, self.txn_timeout_s)
            if not repairs:
                continue
            msgs = [encode_marker(r.txn, r.decision, r.kp) if r.kind == MARKER
                    else encode_decision(r.txn, ABORT, [], r.kp) for r in repairs]
            for r in repairs:
                log.warning("database %s: transaction %s: writing %s %s on Kafka partition %d", db.name, r.txn,
                            "an" if r.decision == ABORT else "a", f"{r.decision} {r.kind}", r.kp)
            write_buffer.produce_control(db.topic, msgs)
            produced += len(msgs)
        return produced

    def _learn_decisions_elsewhere(self, db: Database, write_buffer, now: float) -> None:
        """In an ingester pool, a part on a partition this member owns can wait for a decision on a
        partition another member owns (its router died before the markers): that decision is read
        from Kafka (`WriteBuffer.first_decision`) and its markers are then written here."""
        lookups = db.txns_undecided_elsewhere(now)
        if lookups is None:
            return  # every partition is read here: decisions arrive through the stream
        for txn, q, since_ms in lookups:
            try:
                decision = write_buffer.first_decision(db.topic, q, txn, since_ms)
            except ServerError as e:
                log.warning("database %s: transaction %s: its decision on Kafka partition %d was not read: %s",
                            db.name, txn, q, e)
                continue
            if decision is not None:
                log.info("database %s: transaction %s: read its %s decision on Kafka partition %d (another "
                         "member's)", db.name, txn, decision, q)
                db.learn_txn_decision(txn, decision, now)

    def _plan_table(self, raw, db: Database, topic: str, table: str, msgs: list, F, at_offset: dict,
                    stashed: list) -> list["_ChunkBuild"]:
        """Merges the table's schema and plans one chunk per UTC day of the batch's rows (driver, in order).

        A chunk is planned in the write-buffer form (its messages' payloads, one segment), or,
        while the table replays after a restart, as decoded rows without those already persisted.
        """
        cols: list[Column] = []
        for m in msgs:
            for name, role, typ in json.loads(m["schema"]):
                cols.append(Column(name, role, typ))
        try:
            schema = db.schemas.merge(table, _dedupe(cols))
        except ColumnTypeConflict as e:
            log.error("write buffer holds a conflicting type (%s); conflicting values read as NULL", e)
            schema = db.schemas.get(table) or TableSchema(table)
            schema.merge([c for c in _dedupe(cols) if schema.get(c.name) is None])
        value_cols = [(c.name, c.type) for c in schema.columns if c.role != "time"]
        days: dict = {}
        #: day -> [(min_ns, max_ns, unique)] of each message's rows of that day
        ranges: dict = defaultdict(list)
        for m in msgs:
            for key, (n, lo, hi) in json.loads(m["days"]).items():
                d = days.setdefault(key, [0, lo, hi, 0])
                d[0] += n
                d[1] = min(d[1], lo)
                d[2] = max(d[2], hi)
                ranges[key].append((lo, hi, bool(m.get("unique"))))
        remap = {(kp, off): at for (t, kp, off), at in at_offset.items() if t == topic}
        # a table lives on one Kafka partition, so its rows are in one partition of `raw`:
        # one task (not one per Kafka partition, mostly empty ones) reads them
        sel = raw.filter(table_messages_condition(topic, table, remap, F))
        offsets_by_kp: dict = {}
        for m in msgs:
            lo, hi = offsets_by_kp.get(m["kp"], (m["offset"], m["offset"]))
            offsets_by_kp[m["kp"]] = (min(lo, m["offset"]), max(hi, m["offset"]))
        chunk_cols = [[c.name, c.role, c.type] for c in schema.columns]
        filters = self.row_filter(db.name, table)
        keep = keep_mask_fn(filters) if filters else None
        nbytes = sum(m.get("nbytes") or 0 for m in msgs) + sum(len(p) for _kp, _off, p in stashed)
        local = local_payloads(msgs) if keep is None and not stashed and not remap else None
        check_seqs_fit(db.seq_origin, [m["offset"] for m in msgs] + list(remap.values())
                        + [at for _kp, at, _payload in stashed])
        out = []
        pruner_hi = db.pruner_hi_ns
        for key in sorted(days):
            rows, lo, hi, _ = days[key]
            day = lo // NS_PER_DAY
            if pruner_hi is not None and (day + 1) * NS_PER_DAY <= pruner_hi:
                continue  # a day retention pruned (catalog/retention.py): a replay or a late write never revives it
            bounds = None if len(days) == 1 else (day, day)
            b = _ChunkBuild(db=db, table=table, partition_key=key, rows=rows, min_time_ns=lo, max_time_ns=hi,
                            columns=chunk_cols, value_columns=len(value_cols), offsets=dict(offsets_by_kp),
                            topic=topic)
            if keep is None:
                b.segment_bytes = nbytes if bounds is None else nbytes * rows // max(1, sum(d[0] for d in days.values()))
                b.deduplicated = disjoint_unique(ranges[key])
                b.time_spans = time_spans.normalize([(r_lo, r_hi) for r_lo, r_hi, _u in ranges[key]])
                if local is not None:  # a local chunk: its segment and rows made here, on the driver
                    seg = segment_table([(LAYOUT_WIRE, seq_base(db.seq_origin, off), *(bounds or (None, None)),
                                          payload) for off, payload in local])
                    b.cdf = local_segment_df(self.spark, seg)
                    b.local_rows = decode_local(seg, chunk_cols)
                else:
                    b.segment = self._segment_plan(sel, stashed, db.seq_origin, remap, bounds, F)
            else:
                decode_sel = sel.select("kp", "offset", "payload").coalesce(1)
                if stashed:
                    decode_sel = decode_sel.unionByName(
                        self.spark.createDataFrame(stashed, "kp int, offset long, payload binary"))
                b.unreadable = self.spark.sparkContext.accumulator([], _ListParam())
                b.decoded = decode_sel.mapInArrow(
                    payload_decode_fn(value_cols, bounds, keep, db.seq_origin, remap, b.unreadable),
                    spark_struct_for(schema))
                b.count_rows = True
            out.append(b)
        return out

    def _segment_plan(self, sel, stashed: list, seq_origin: int, remap: dict, bounds, F):
        """The lazy segment (chunk_store/ipc_segments.py) of a table's messages `sel` of one batch:
        each payload as it is, its rows ordered at the offset it is applied at (`remap`: a committed
        transaction part at its marker's) from the database's `seq_origin`, plus the `stashed` parts
        [(kp, offset applied at, payload)]."""
        applied_at = F.col("offset")
        for (kp, off), at in remap.items():
            applied_at = F.when((F.col("kp") == kp) & (F.col("offset") == off), F.lit(at)).otherwise(applied_at)
        base = _seq_base_column(seq_origin, applied_at, F)
        lo, hi = bounds if bounds is not None else (None, None)
        seg = sel.select(F.lit(LAYOUT_WIRE).alias("layout"), base.alias("seq_base"),
                         F.lit(lo).cast("int").alias("day_lo"), F.lit(hi).cast("int").alias("day_hi"), "payload")
        if stashed:
            rows = [(LAYOUT_WIRE, seq_base(seq_origin, at), lo, hi, payload) for _kp, at, payload in stashed]
            seg = seg.unionByName(self.spark.createDataFrame(rows, SEGMENT_SCHEMA))
        return seg.select(*SEGMENT_COLUMNS)

    def _build_and_add_chunks(self, builds: list["_ChunkBuild"], added: list) -> list:
        """Materialises the planned chunks, several Spark jobs at once, then adds them to the catalog in plan order.

        Nothing is added unless every chunk was built (a failed batch is retried whole);
        the checkpoints already built are then released. Each chunk added is appended to `added`
        as (db, chunk). Returns the messages whose payload did not decode,
        [(topic, kp, offset, reason)] (their rows are not in any chunk).
        """
        errors = []

        def materialise(b: _ChunkBuild) -> None:
            self._unless_quiescing()  # a batch of thousands of tables stops between its jobs
            _materialise(b)

        if len(builds) > 1:
            for f in [_build_pool().submit(materialise, b) for b in builds]:
                try:
                    f.result()
                except BaseException as e:  # kept until every job finished, then re-raised
                    errors.append(e)
        else:
            for b in builds:
                try:
                    materialise(b)
                except BaseException as e:
                    errors.append(e)
        if errors:
            for b in builds:
                release_df(b.cdf)
            raise errors[0]
        for b in builds:
            if b.rows == 0:
                release_df(b.cdf)
                continue
            cid = self.catalog.next_chunk_id()
            if b.segment is not None or b.local_rows is not None:  # the write-buffer form
                local = b.local_rows
                view = (register_local_chunk(self.spark, local, b.columns, cid) if local is not None
                        else register_segments_chunk(self.spark, [b.cdf], b.columns, cid))
                chunk = Chunk(id=cid, table=b.table, partition_key=b.partition_key, order=self.catalog.next_order(),
                              state="open", rows=b.rows,
                              size_bytes=b.segment_bytes + (local.nbytes if local is not None else 0),
                              min_time_ns=b.min_time_ns, max_time_ns=b.max_time_ns, columns=b.columns,
                              view=view, offsets=b.offsets, local_rows=local,
                              created_at=time.time(), deduplicated=b.deduplicated, segments=[b.cdf],
                              segments_deduplicated=b.deduplicated, segment_bytes=b.segment_bytes,
                              time_spans=b.time_spans)
            else:
                view = register_df_chunk(self.spark, b.cdf, cid)
                chunk = Chunk(id=cid, table=b.table, partition_key=b.partition_key, order=self.catalog.next_order(),
                              state="open", rows=b.rows, size_bytes=estimate_bytes(b.rows, b.value_columns),
                              min_time_ns=b.min_time_ns, max_time_ns=b.max_time_ns, columns=b.columns, view=view,
                              offsets=b.offsets, df=b.cdf, created_at=time.time())
            # a batch retried after a failure finds its offsets recorded by its first attempt
            self.catalog.add_chunk(b.db, chunk, now=time.time(), seen_before_ok=True)
            added.append((b.db, chunk))
        # a message spanning several days is decoded by each day's build: reported once
        return sorted({(b.topic, kp, off, why) for b in builds for kp, off, why in b.unreadable_seen})

    def _record_deletes(self, raw, F, has_deletes: bool, committed: list, skipped: list) -> list:
        """Adds the batch's deletes to their databases' mailboxes; returns them as [(db, Delete)]
        for `_close_for_deletes`. Called before the batch's chunks are added.

        `committed`: delete parts of transactions committed in this batch, as
        (topic, kp, offset applied at, (kp, part offset), payload or None when in this batch).
        """
        added = []
        found = []
        payloads = {}  # delete parts of this batch, by (topic, kp, offset)
        wanted = F.col("kind") == "delete" if has_deletes else F.lit(False)
        if any(payload is None for *_rest, payload in committed):
            wanted = wanted | ((F.col("kind") == PART) & F.col("txn_info").contains('"of":"delete"'))
        for r in raw.filter(wanted).select("topic", "kp", "offset", "kind", "payload").collect():
            if r["kind"] == "delete":
                found.append((r["topic"], r["kp"], r["offset"], bytes(r["payload"])))
            else:
                payloads[(r["topic"], r["kp"], r["offset"])] = bytes(r["payload"])
        for topic, kp, at, key, payload in committed:
            found.append((topic, kp, at, payload if payload is not None else payloads[(topic,) + key]))
        for topic, kp, offset, payload in sorted(found, key=lambda f: (f[0], f[1], f[2])):
            db = self.catalog.ensure_database(database_of_topic(topic), topic, self.kafka_partitions)
            try:
                d = decode_delete(payload, db.seq_origin, offset, kp)
            except (ValueError, KeyError, TypeError) as e:
                skipped.append((topic, kp, offset, f"delete whose value is not a delete ({type(e).__name__}: {e})"))
                continue
            db.deletes.add(d)
            added.append((db, d))
        return added

    def _close_for_deletes(self, deleted: list) -> list:
        """Closes the open chunks of every table the batch's deletes `deleted` ([(db, Delete)])
        apply to, the batch's own new chunks included: a delete never lands in a chunk that may
        still grow, so compaction and persist materialise it against a fixed set of rows. Returns
        the (db, table) pairs whose view must change."""
        touched = []
        for db, d in deleted:
            tables = db.close_chunks_of(lambda table: d.applies_to(table, partition_for(table, db.kafka_partitions)))
            touched += [(db, table) for table in tables]
        return touched

    def refresh_table_view(self, db: Database, table: str, arrow_merge: bool = True) -> None:
        """Replaces the table's view with one over its current chunks (`arrow_merge`: large groups
        of overlapping write-buffer chunks read through a view of their Arrow merge, see
        chunk_store.chunk_data.arrow_merge_relations; else every group is merged in SQL).

        Called by the micro-batch thread and the lifecycle worker after they changed the
        table's chunks. One refresh of a table at a time, each reading the chunks once it holds
        the table's lock: the view created last names the chunks of the latest change, never
        ones a compaction replaced while an earlier refresh was being built. The view applies the
        database's retention (rows older than the period hide when the view is read), as every
        query path does; a change of the period refreshes the database's views."""
        with self._views_lock:
            lock = self._refresh_locks[(db.name, table)]
        with lock:
            schema = db.schemas.get(table)
            chunks = self.catalog.table_chunks(db, table)
            sources = [chunk_source(c) for c in chunks if c.view is not None]
            if not sources:
                with self._views_lock:
                    had_view = (db.name, table) in self._table_views
                if not had_view or schema is None:
                    return
                from iox_spark.chunk_store.views import empty_table_view_sql

                sql = empty_table_view_sql(schema)  # every chunk went (retention): an empty table
            else:
                deletes = db.table_deletes(table)
                sql = table_view_sql(schema, sources, deletes=deletes,
                                     merged_relation=arrow_merge_relations(self.spark, schema, chunks, deletes)
                                     if arrow_merge else None)
            # for Spark Connect: made from a DataFrame, the view holds its analysed plan, not the names
            # of the chunk views (temp views of this session, which Spark Connect sessions do not see)
            self.spark.sql(retained_view_sql(sql, db.retention_period_s)).createOrReplaceGlobalTempView(
                quote(table_view_name(db.name, table)))
            with self._views_lock:
                self._table_views[(db.name, table)] = sql

    def has_table_view(self, database: str, table: str) -> bool:
        """Whether the table's global temp view exists (created by `refresh_table_view`, never dropped)."""
        with self._views_lock:
            return (database, table) in self._table_views

    def table_view_sql_of(self, database: str, table: str) -> str | None:
        """The SQL of the table's view as `refresh_table_view` last created it, without retention (the
        query path applies the retention of its cut), or None when it has none. Any driver thread."""
        with self._views_lock:
            return self._table_views.get((database, table))

    def wait_applied(self, database: str, target: dict, timeout_s: float) -> dict | None:
        """Waits until the database's `applied_hi_inclusive` reaches `target` ({kp: offset}) on every
        partition, or `timeout_s` passed; returns the applied offsets then (None: the database is
        not in the catalog yet). Any driver thread."""
        def reached() -> bool:
            try:
                db = self.catalog.database(database)
            except KeyError:
                return False
            applied = db.applied_offsets()
            return all(applied.get(kp, -1) >= off for kp, off in target.items())

        with self._applied:
            self._applied.wait_for(reached, timeout_s)
        try:
            db = self.catalog.database(database)
        except KeyError:
            return None
        return db.applied_offsets()

    def wait_for_batches(self, n: int, timeout_s: float) -> bool:
        with self._applied:
            return self._applied.wait_for(lambda: self.batches_applied >= n, timeout_s)


def decode_delete(payload: bytes, seq_origin: int, offset: int, kp: int) -> Delete:
    """A delete message's value as the Delete it applies at `offset` (a committed delete part: its
    marker's offset) of Kafka partition `kp`, its seq from the database's `seq_origin`. Raises
    ValueError, KeyError or TypeError for a value the router could not have written (the message is
    skipped), SeqOverflow for a seq that would not fit. Pure; called by the consumer and the
    write-buffer tail."""
    body = json.loads(payload)
    from_json(body["predicate"])  # raises what a term the router could not have written raises
    if body["table"] is not None and not isinstance(body["table"], str):
        raise TypeError(f"table {body['table']!r}")
    return Delete(table=body["table"] or None, start_ns=int(body["start_ns"]),
                  stop_ns_exclusive=int(body["stop_ns_exclusive"]),
                  predicate=tuple(tuple(t) for t in body["predicate"]),
                  seq=seq_base(seq_origin, offset), kafka_partition=kp)


def _txn_record(m) -> TxnRecord:
    info = json.loads(m["txn_info"] or "{}")
    if m["kind"] == PART:
        return TxnRecord(kp=m["kp"], offset=m["offset"], kind=PART, txn=m["txn"], ts_ms=m["ts_ms"] or 0,
                         coordinator_kp=int(info["q"]))
    parts = tuple((int(kp), int(off)) for kp, off in info.get("parts", [])) if m["kind"] == DECISION else ()
    return TxnRecord(kp=m["kp"], offset=m["offset"], kind=m["kind"], txn=m["txn"], ts_ms=m["ts_ms"] or 0,
                     decision=info["decision"], parts=parts)


def _held_condition(holds: dict, F):
    """A Spark condition true for the messages at or after a held offset ({(topic, kp): offset})."""
    cond = F.lit(False)
    for (topic, kp), off in holds.items():
        cond = cond | ((F.col("topic") == topic) & (F.col("kp") == kp) & (F.col("offset") >= off))
    return cond


def _ranges_condition(msgs: list, F):
    """A Spark condition true for the messages of `msgs` (metadata rows), given that they are,
    per (topic, kp), every message of the batch between their first and last offset."""
    bounds: dict = {}
    for m in msgs:
        key = (m["topic"], m["kp"])
        lo, hi = bounds.get(key, (m["offset"], m["offset"]))
        bounds[key] = (min(lo, m["offset"]), max(hi, m["offset"]))
    cond = F.lit(False)
    for (topic, kp), (lo, hi) in sorted(bounds.items()):
        cond = cond | ((F.col("topic") == topic) & (F.col("kp") == kp) & F.col("offset").between(lo, hi))
    return cond


def table_messages_condition(topic: str, table: str, remap: dict, F):
    """A Spark condition true for the messages of `table` in `topic` a batch applies: its plain
    writes and the transaction parts committed in the batch (`remap`: {(kp, part offset): offset
    applied at}), each named by its Kafka partition *and* offset. Another part of the table at the
    same offset of another Kafka partition (the partitions of a topic reuse every offset) is not
    one of them: it may still be undecided (stashed, applied once its marker commits it) or
    aborted. `F`: pyspark.sql.functions (or a stand-in). Pure (driver)."""
    kind = F.col("kind") == "write"
    if remap:
        kind = kind | ((F.col("kind") == PART) & _message_in([(topic, kp, off) for kp, off in sorted(remap)], F))
    return (F.col("topic") == topic) & (F.col("tbl") == table) & kind


def _message_in(keys: list, F):
    """A Spark condition true for the messages `keys` [(topic, kp, offset, ...)] name."""
    offsets: dict = defaultdict(list)
    for topic, kp, offset, *_rest in keys:
        offsets[(topic, kp)].append(offset)
    cond = F.lit(False)
    for (topic, kp), offs in offsets.items():
        cond = cond | ((F.col("topic") == topic) & (F.col("kp") == kp) & F.col("offset").isin(offs))
    return cond


def _dedupe(cols: list[Column]) -> list[Column]:
    seen: dict = {}
    for c in cols:
        seen.setdefault(c.name, c)
    return list(seen.values())


#: Spark jobs of one micro-batch that build chunks at the same time (small jobs are latency-bound)
_BUILD_THREADS = 4
_pool = None
_pool_lock = threading.Lock()


def _build_pool():
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_BUILD_THREADS, thread_name_prefix="iox-chunk-build")
        return _pool


def disjoint_unique(ranges: list) -> bool:
    """Whether rows of messages [(min_ns, max_ns, unique)] are deduplicated taken together: each
    message's keys are unique and no two messages' time ranges meet. Pure."""
    if not all(u for _lo, _hi, u in ranges):
        return False
    spans = sorted((lo, hi) for lo, hi, _u in ranges)
    return all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))


@dataclass
class _ChunkBuild:
    """One chunk of a micro-batch: planned on the driver, materialised by `_materialise`.

    Exactly one of `segment` (the write-buffer form), `local_rows` (a local chunk's rows, with `cdf`
    its segment: chunk_store/local_rows.py) and `decoded` (rows, while replaying) is set."""
    db: Database
    table: str
    partition_key: str
    rows: int
    min_time_ns: int
    max_time_ns: int
    columns: list
    value_columns: int
    offsets: dict
    topic: str = ""
    segment: object = None  # the lazy DataFrame of the chunk's segment (SEGMENT_SCHEMA)
    segment_bytes: int = 0
    deduplicated: bool = False  # the segment's rows are known to be deduplicated
    time_spans: tuple = ()  # its messages' time spans (catalog/time_spans.py)
    decoded: object = None  # the lazy DataFrame of the chunk's decoded rows
    count_rows: bool = False  # replay dropped rows on the executors: rows/min/max are counted after the build
    unreadable: object = None  # the decoder's accumulator of undecodable payloads
    cdf: object = None  # the locally checkpointed DataFrame (segment or rows), once built
    unreadable_seen: tuple = ()  # what `unreadable` held once the chunk was built
    local_rows: object = None  # a local chunk's decoded rows (chunk_store/local_rows.py); `cdf` is then set at once


#: what Spark says when a job needed blocks of a lost executor, or lost the executor running it
_EXECUTOR_LOST_MARKERS = ("CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND", "ExecutorLostFailure")
#: what Spark says when a task's Python worker died (killed, out of memory, or crashed by its input)
_WORKER_CRASHED_MARKERS = ("Python worker exited unexpectedly",)


#: the first wait before a micro-batch that failed for its infrastructure is retried; it doubles with
#: each failure in a row, up to INFRASTRUCTURE_BACKOFF_MAX_S
INFRASTRUCTURE_BACKOFF_S = 0.5
INFRASTRUCTURE_BACKOFF_MAX_S = 30.0


def infrastructure_backoff_s(failures_in_a_row: int) -> float:
    """How long to wait before retrying a micro-batch after its `failures_in_a_row`-th infrastructure
    failure in a row: 0.5 s, 1 s, 2 s, ... at most 30 s. Pure."""
    return min(INFRASTRUCTURE_BACKOFF_MAX_S, INFRASTRUCTURE_BACKOFF_S * 2 ** max(0, failures_in_a_row - 1))


def executor_lost(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) says an executor was lost: a failure of the
    batch's infrastructure, retried whole, never blamed on a message (server/write_buffer/poison.py). Pure."""
    return _says(e, _EXECUTOR_LOST_MARKERS)


def worker_crashed(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) says a Python worker died. The batch is
    retried after a wait, and a message is blamed (set aside) only when, applied on its own, it
    fails so twice in a row: a worker killed from outside is not the message's fault, a message
    that crashes every worker it reaches is. Pure."""
    return _says(e, _WORKER_CRASHED_MARKERS)


def _says(e: BaseException, markers: tuple) -> bool:
    seen: set = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(marker in str(e) for marker in markers):
            return True
        e = e.__cause__ or e.__context__
    return False


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def local_payloads(msgs: list) -> list | None:
    """[(offset, payload)] in offset order when a table's messages of a batch make a local chunk
    (chunk_store/local_rows.py: plain writes whose payloads all came with the metadata, within
    LOCAL_BUILD_MAX_BYTES and LOCAL_CHUNK_MAX_ROWS together), else None."""
    if any(m.get("small_payload") is None or m["kind"] != "write" for m in msgs):
        return None
    if sum(len(m["small_payload"]) for m in msgs) > LOCAL_BUILD_MAX_BYTES \
            or sum(m.get("nrows") or 0 for m in msgs) > LOCAL_CHUNK_MAX_ROWS:
        return None
    return sorted((m["offset"], bytes(m["small_payload"])) for m in msgs)


def _materialise(b: _ChunkBuild) -> None:
    """Runs the chunk's Spark job (driver thread of `_build_pool`, or the batch's own thread);
    a local chunk has none (its segment was made on the driver)."""
    if b.local_rows is not None:
        return
    if b.segment is not None:
        b.cdf = checkpoint(b.segment.coalesce(1))
        return
    try:
        b.cdf = checkpoint(b.decoded)
        b.unreadable_seen = tuple(b.unreadable.value) if b.unreadable is not None else ()
    finally:
        if b.unreadable is not None:
            _forget_accumulator(b.unreadable)
    if b.count_rows or b.unreadable_seen:  # rows were dropped: the headers' counts do not hold
        st = row_stats(b.cdf)
        b.rows = st["n"]
        if b.rows:
            b.min_time_ns, b.max_time_ns = st["lo"], st["hi"]
