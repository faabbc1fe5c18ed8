"""Persist one table partition: flush handle -> split -> Parquet (executors) -> one catalog commit (driver).

When it runs: the lifecycle worker executes a `PersistChunks` action, or a user
calls `iox persist`. It stops when the commit is done (or the action failed and
was rolled back: the flush handle aborted, the chunks back to their state).

Invariants (IOx persist + persist_sink's many writers / one committer):
- Rows with time <= the flush timestamp go to Parquet, the rest stay in memory.
- Parquet files are written by Spark executors; the driver alone commits ONE
  preserved-catalog transaction naming the files, the partition checkpoint,
  the database checkpoint and the table schema.
- Only after that commit are the flush handle committed and the chunks
  swapped in the catalog; before it, a crash leaves at most orphan files
  (which cleanup deletes) and the write buffer still covers every row.
- While the files are written they are registered as in-flight, so cleanup
  never deletes them.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from catalog.catalog import Catalog, Database
from catalog.checkpoint import PersistCheckpointBuilder, UnpersistedOffsets
from catalog.chunk import Chunk
from catalog.object_store import ObjectStore, parquet_key
from catalog.preserved_catalog import (AddDeletePredicate, AddParquet, RecordPartitionCheckpoint,
                                       SetTableSchema)
from catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN

from server.crash_points import crash_point

from .chunk_data import merged_df, register_df_chunk, release_df, row_stats, schema_bytes, table_deletes
from .policy import ChunkState, select_persistable_chunks

__all__ = ["PersistOutcome", "persist_partition", "InFlightFiles", "mailbox_actions", "write_one_file",
           "add_parquet_action"]

log = logging.getLogger(__name__)

_META_SCHEMA = "key string, rows long, size long, min_t long, max_t long, min_seq long, max_seq long"
#: rows per Parquet row group (pyarrow's default for a whole table): Spark hands the writer
#: 10,000-row Arrow batches, and a row group each made files ~1.7x larger
ROW_GROUP_ROWS = 1 << 20


class InFlightFiles:
    """Keys written by a persist that is not committed yet (cleanup must not delete them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._keys: set = set()

    def add(self, keys) -> None:
        with self._lock:
            self._keys.update(keys)

    def discard(self, keys) -> None:
        with self._lock:
            self._keys.difference_update(keys)

    def snapshot(self) -> set:
        with self._lock:
            return set(self._keys)


@dataclass(frozen=True)
class PersistOutcome:
    table: str
    partition_key: str
    rows_persisted: int
    files: tuple
    revision: int
    flush_timestamp_ns: int
    #: the committed RecordDatabaseCheckpoint (where replay would start)
    database_checkpoint: object = None


def _writer_fn(store: ObjectStore, key: str):
    """Executor side: writes every batch it gets into ONE Parquet file at `key`, in row groups of
    ROW_GROUP_ROWS rows (the last one smaller); yields its metadata.

    Picklable (captures the store config and a key).
    """

    def fn(batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        writer = None
        rows = 0
        min_t = max_t = min_s = max_s = None
        pending, pending_rows = [], 0
        fs, path = store.arrow_prepare_write(key)
        try:
            for b in batches:
                if b.num_rows == 0:
                    continue
                if writer is None:
                    writer = pq.ParquetWriter(path, b.schema, filesystem=fs, compression="zstd")
                pending.append(b)
                pending_rows += b.num_rows
                if pending_rows >= ROW_GROUP_ROWS:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=ROW_GROUP_ROWS)
                    pending, pending_rows = [], 0
                rows += b.num_rows
                t = pc.min_max(b.column(TIME_NS_COLUMN))
                s = pc.min_max(b.column(SEQ_COLUMN))
                min_t = t["min"].as_py() if min_t is None else min(min_t, t["min"].as_py())
                max_t = t["max"].as_py() if max_t is None else max(max_t, t["max"].as_py())
                min_s = s["min"].as_py() if min_s is None else min(min_s, s["min"].as_py())
                max_s = s["max"].as_py() if max_s is None else max(max_s, s["max"].as_py())
            if pending:
                writer.write_table(pa.Table.from_batches(pending), row_group_size=ROW_GROUP_ROWS)
        finally:
            if writer is not None:
                writer.close()
        if rows:
            size = fs.get_file_info(path).size
            yield pa.RecordBatch.from_pylist([{"key": key, "rows": rows, "size": size, "min_t": min_t,
                                               "max_t": max_t, "min_seq": min_s, "max_seq": max_s}])

    return fn


def write_one_file(df, store: ObjectStore, key: str) -> list:
    """Writes `df` (chunk layout) into ONE Parquet file at `key` from an executor.

    Returns [Row(key, rows, size, min_t, max_t, min_seq, max_seq)], or [] when `df` is empty.
    """
    return df.coalesce(1).mapInArrow(_writer_fn(store, key), _META_SCHEMA).collect()


def add_parquet_action(m, table: str, partition_key: str, schema) -> AddParquet:
    """The AddParquet action naming the file `write_one_file` described in `m`."""
    return AddParquet(key=m["key"], table=table, partition_key=partition_key, row_count=m["rows"],
                      size_bytes=m["size"], min_time_ns=m["min_t"], max_time_ns=m["max_t"],
                      min_seq=m["min_seq"], max_seq=m["max_seq"], schema=tuple(tuple(c) for c in schema.to_json()))


def mailbox_actions(db, preserved, new_files: list, actions: list) -> list:
    """Flushes the delete mailbox into this persist's transaction (IOx: the whole mailbox).

    Each delete is recorded per table it applies to, naming that table's Parquet
    files (committed ones and the ones this transaction adds). Deletes of tables
    without any file stay in the mailbox. Returns the deletes recorded.
    """
    from server.write_buffer import partition_for

    files_by_table: dict = {}
    for key, f in preserved.state.files.items():
        files_by_table.setdefault(f.table, []).append(key)
    for f in new_files:
        files_by_table.setdefault(f.table, []).append(f.key)
    flushed = []
    for d in db.deletes.unrecorded():
        tables = [t for t in files_by_table if d.applies_to(t, partition_for(t, db.kafka_partitions))]
        for t in tables:
            actions.append(AddDeletePredicate(table=t, start_ns=d.start_ns, stop_ns_exclusive=d.stop_ns_exclusive,
                                              predicate=tuple((c, op, v) for c, op, v, _k in d.predicate),
                                              seq=d.seq, applies_to=tuple(files_by_table[t])))
        if tables:
            flushed.append(d)
    return flushed


def chunk_states(part) -> list:
    return [ChunkState(chunk_id=c.id, order=int(c.order * 1000), state=c.state, row_count=c.rows,
                       size_bytes=c.size_bytes if c.df is not None else 0, min_time_ns=c.min_time_ns,
                       max_time_ns=c.max_time_ns, time_of_last_write=c.created_at)
            for c in part.live_chunks()]


def _reusable(chunks: list, schema, deletes: list):
    """The checkpoint of `chunks` when it already is their merge: one in-memory, deduplicated chunk
    holding every column of `schema`, and no delete that the merge would materialise; else None."""
    if len(chunks) != 1 or deletes:
        return None
    c = chunks[0]
    if c.df is None or not c.deduplicated or [list(col) for col in c.columns] != [list(col) for col in schema.to_json()]:
        return None
    return c.df


def persist_partition(spark, catalog: Catalog, db: Database, table: str, partition_key: str, store: ObjectStore,
                      preserved, in_flight: InFlightFiles, now: float, force: bool,
                      refresh_view) -> PersistOutcome | None:
    """Persists one partition. Returns None when there is nothing to persist.

    `preserved` is the database's PreservedCatalog (the one committer);
    `refresh_view(db, table)` swaps the table view after the catalog changed.
    Raises what the commit raises (e.g. RevisionConflict: the caller must stop).
    """
    with catalog.lock:
        part = catalog.get_partition(db, table, partition_key)
        if part is None or part.windows is None or part.persisting or part.compacting:
            return None
        handle = part.windows.flush_all_handle() if force else part.windows.flush_handle(now)
        if handle is None:
            return None
        flush_ts = handle.timestamp_ns
        sel = select_persistable_chunks(chunk_states(part), flush_ts)
        if sel.blocked or not sel.chunk_ids:
            part.windows.abort(handle)
            return None
        chunks = [part.chunk(cid) for cid in sel.chunk_ids]
        for c in chunks:
            c.state = "persisting"
        part.persisting = True
    keys_written: list = []
    t0 = time.perf_counter()
    try:
        schema = db.schemas.get(table)
        deletes = table_deletes(db, table)
        # one deduplicated chunk of the whole schema with no delete to materialise (a compacted
        # partition): its rows are the merge's, so its checkpoint is reused, not copied
        reused = _reusable(chunks, schema, deletes)
        merged = reused if reused is not None else \
            merged_df(spark, schema, chunks, deletes).localCheckpoint(eager=True)
        t_merge = time.perf_counter()
        if max(c.max_time_ns for c in chunks) <= flush_ts:
            to_persist, remainder = merged, None  # every row goes to Parquet: no split to compute
        else:
            to_persist = merged.filter(f"`{TIME_NS_COLUMN}` <= {flush_ts}").localCheckpoint(eager=True)
            remainder = merged.filter(f"`{TIME_NS_COLUMN}` > {flush_ts}").localCheckpoint(eager=True)
            if reused is None:
                release_df(merged)
        key = parquet_key(db.name, table, partition_key, uuid.uuid4())
        in_flight.add([key])
        keys_written.append(key)
        t_split = time.perf_counter()
        meta = write_one_file(to_persist, store, key)
        t_write = time.perf_counter()
        rem_stats = {"n": 0} if remainder is None else row_stats(remainder)
        # one committer: the driver builds and commits the transaction
        with catalog.lock:
            applied = dict(db.applied_hi_inclusive)  # read before the windows: see module docstring
            builder = PersistCheckpointBuilder(handle.checkpoint())
            # every partition's unpersisted ranges NOW; for this one, what stays unpersisted after
            # this flush, including rows that reached it while the persist ran (they must replay)
            for parts in db.partitions.values():
                for other in parts.values():
                    if other is part:
                        builder.register_other_partition(part.windows.offset_ranges_after_flush())
                    elif other.windows is not None:
                        builder.register_other_partition(other.windows.offset_ranges())
            builder.register_other_partition({kp: UnpersistedOffsets(None, hi) for kp, hi in applied.items()
                                              if hi >= 0})
            # transaction parts without a marker, and commit decisions whose parts elsewhere have
            # none yet, must be read again by a replay (catalog/transactions.py)
            builder.register_other_partition({kp: UnpersistedOffsets(off, max(off, applied.get(kp, off)))
                                              for kp, off in db.txns.pinned_offsets().items()})
            part_ckpt, db_ckpt = builder.build()
        actions = [SetTableSchema(table, tuple(tuple(c) for c in schema.to_json()))]
        files = []
        for m in meta:
            add = add_parquet_action(m, table, partition_key, schema)
            actions.append(add)
            files.append(add)
        flushed = mailbox_actions(db, preserved, files, actions)
        actions.append(RecordPartitionCheckpoint(
            table=table, partition_key=partition_key, flush_timestamp_ns=flush_ts,
            sequencer_numbers={kp: (o.min_unpersisted_offset, o.max_seen_offset) for kp, o in part_ckpt.offsets.items()},
            epoch=db.epoch))
        actions.append(db.checkpoint_action(
            {kp: (o.min_unpersisted_offset, o.max_seen_offset) for kp, o in db_ckpt.offsets.items()}))
        crash_point("persist_after_parquet")
        revision = preserved.commit(actions, now)
        t_commit = time.perf_counter()
        crash_point("persist_after_commit")
    except BaseException:
        with catalog.lock:
            part.windows.abort(handle)
            for c in chunks:
                c.state = "closed"
            part.persisting = False
        in_flight.discard(keys_written)
        raise
    in_flight.discard(keys_written)
    db.deletes.mark_recorded(flushed)
    # committed: now the flush handle, then the in-memory swap
    with catalog.lock:
        part.windows.flush(handle)
        new_chunks = []
        rows = sum(f.row_count for f in files)
        if rows:
            cid = catalog.next_chunk_id()
            pc = Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="persisted", rows=rows,
                       size_bytes=schema_bytes(rows, schema), min_time_ns=min(f.min_time_ns for f in files),
                       max_time_ns=max(f.max_time_ns for f in files), columns=schema.to_json(),
                       view=register_df_chunk(to_persist, cid), offsets={}, df=to_persist,
                       parquet_keys=[f.key for f in files], created_at=now, deduplicated=True)
            new_chunks.append(pc)
        elif to_persist is not reused:
            release_df(to_persist)  # every row was deleted: the empty checkpoint backs no chunk
        if rem_stats["n"]:
            cid = catalog.next_chunk_id()
            rc = Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="closed", rows=rem_stats["n"],
                       size_bytes=schema_bytes(rem_stats["n"], schema), min_time_ns=rem_stats["lo"],
                       max_time_ns=rem_stats["hi"], columns=schema.to_json(), view=register_df_chunk(remainder, cid),
                       offsets={}, df=remainder, created_at=now, deduplicated=True)
            new_chunks.append(rc)
        catalog.replace_chunks(db, table, partition_key, [c.id for c in chunks], new_chunks)
        part.files.extend(files)
        part.checkpoint = actions[-2]
        part.persisting = False
    refresh_view(db, table)
    if rows and to_persist is reused:
        chunks[0].df = None  # its checkpoint now backs the persisted chunk: retiring frees its view only
    catalog.retire([c for c in chunks])
    log.info("persisted %s/%s/%s: %d rows in %d file(s), revision %d (%d chunk(s) merged %.3f s, split %.3f s, "
             "Parquet %.3f s, commit %.3f s, swap %.3f s)", db.name, table, partition_key, rows, len(files), revision,
             len(chunks), t_merge - t0, t_split - t_merge, t_write - t_split, t_commit - t_write,
             time.perf_counter() - t_commit)
    return PersistOutcome(table, partition_key, rows, tuple(f.key for f in files), revision, flush_ts, actions[-1])
