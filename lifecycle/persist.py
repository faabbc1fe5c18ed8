"""Persist one table partition: flush handle -> split -> Parquet (executors) -> one catalog commit (driver).

When it runs: the lifecycle worker executes a `PersistChunks` action, or a user
calls `iox persist`. It stops when the commit is done (or the action failed and
was rolled back: the flush handle aborted, the chunks back to their state).

Invariants (IOx persist + persist_sink's many writers / one committer):
- Rows with time <= the flush timestamp go to Parquet, the rest stay in memory.
- The rows written are the chunks' merge: deduplicated on (tags, time), the
  deletes applied. When every chunk holds the write-buffer form, an executor
  reads those Arrow IPC streams and merges them in Arrow
  (chunk_store/arrow_merge.py), so no row passes through Spark's row format;
  otherwise the chunks' views are merged in Spark SQL. Both give the same rows.
- Parquet files are written by Spark executors (one file, or from
  PARALLEL_WRITE_MIN_ROWS rows merged in Arrow one file per core of the
  executor (chunk_store/cluster.py `cores_per_executor`) whose time
  ranges never meet); the driver alone commits ONE preserved-catalog
  transaction naming the files, the partition checkpoint, the database
  checkpoint and the table schema.
- A partition merged in Arrow is merged by one task, or, on a cluster whose
  task slots exceed one executor's cores, by up to one task per executor
  (`persist_tasks`, from PERSIST_TASK_MIN_ROWS rows per task): each task reads
  every input stream and merges and writes only the rows of its own time range
  (`persist_time_ranges`), so the files of all tasks still never meet in time.
- A file is durable before its metadata leaves the task that wrote it
  (`ObjectStore.arrow_finish_write`: fsync-ed with its directory on a local
  store), so the commit never names a file a power loss can take.
- Only after that commit are the flush handle committed and the chunks
  swapped in the catalog; before it, a crash leaves at most orphan files
  (which cleanup deletes) and the write buffer still covers every row.
- While the files are written they are registered as in-flight, so cleanup
  never deletes them.
- No persist commits while a micro-batch that failed after recording its
  offsets in the persistence windows is not applied again
  (`Database.failed_batch_hi`): those windows cover rows no chunk holds.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from iox_spark.catalog.catalog import PERSISTING, Catalog, Database
from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.object_store import ObjectStore, parquet_key
from iox_spark.catalog.partition_moves import claim_to_persist, give_back, persist_checkpoints, swap_persisted
from iox_spark.catalog.preserved_catalog import (AddDeletePredicate, AddParquet, RecordPartitionCheckpoint,
                                       SetTableSchema)
from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN

from iox_spark.catalog.crash_points import CrashPoint, crash_point

from iox_spark.chunk_store.chunk_data import (arrow_plan, indexed_segments_df, merged_df, merged_spans, register_df_chunk,
                         register_parquet_chunk, release_df, row_stats, schema_bytes, time_range_mask)
from iox_spark.chunk_store.chunk_checkpoint import checkpoint
from iox_spark.chunk_store.cluster import cores_per_executor, task_slots
from iox_spark.chunk_store.ipc_segments import LAYOUT_CHUNK, register_segments_chunk
from iox_spark.lifecycle.policy import ChunkState, select_persistable_chunks

__all__ = ["PersistOutcome", "persist_partition", "InFlightFiles", "mailbox_actions", "write_one_file",
           "add_parquet_action", "FILE_META_SCHEMA", "write_files", "persist_tasks", "persist_time_ranges",
           "PERSIST_TASK_MIN_ROWS", "segments_persist_fn", "time_pieces", "writer_fn"]

log = logging.getLogger(__name__)

#: the metadata a task yields for each Parquet file it wrote (`write_one_file`, compaction in Arrow)
FILE_META_SCHEMA = "key string, rows long, size long, min_t long, max_t long, min_seq long, max_seq long"
#: rows per Parquet row group (pyarrow's default for a whole table): Spark hands the writer
#: 10,000-row Arrow batches, and a row group each made files ~1.7x larger
ROW_GROUP_ROWS = 1 << 20
#: Parquet encoding of the time and sequence columns, which rise steadily: 10M bench rows write in
#: 1.41 s instead of 1.78 s (dictionary attempts on them), in 66 MiB instead of 98 MiB
_RISING_ENCODING = "DELTA_BINARY_PACKED"


def parquet_options(names) -> dict:
    """pyarrow Parquet writer options of every file persist and compaction write (`names`: the
    columns, chunk layout): zstd, dictionary encoding for tags and fields (pyarrow falls back to
    plain per column chunk when a dictionary grows too large), `_RISING_ENCODING` for `time_ns`
    and `_iox_seq`. Spark's and pyarrow's readers read both encodings."""
    rising = [n for n in names if n in (TIME_NS_COLUMN, SEQ_COLUMN)]
    return {"compression": "zstd", "use_dictionary": [n for n in names if n not in rising],
            "column_encoding": {n: _RISING_ENCODING for n in rising}}


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


def writer_fn(store: ObjectStore, key: str):
    """Executor side: writes every batch it gets into ONE Parquet file at `key`, in row groups of
    ROW_GROUP_ROWS rows (the last one smaller), makes it durable (`ObjectStore.arrow_finish_write`)
    and yields its metadata.

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
                    writer = pq.ParquetWriter(path, b.schema, filesystem=fs, **parquet_options(b.schema.names))
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
            store.arrow_finish_write([key])
            size = fs.get_file_info(path).size
            yield pa.RecordBatch.from_pylist([{"key": key, "rows": rows, "size": size, "min_t": min_t,
                                               "max_t": max_t, "min_seq": min_s, "max_seq": max_s}])

    return fn


def write_one_file(df, store: ObjectStore, key: str) -> list:
    """Writes `df` (chunk layout) into ONE Parquet file at `key` from an executor.

    Returns [Row(key, rows, size, min_t, max_t, min_seq, max_seq)], or [] when `df` is empty.
    """
    return df.coalesce(1).mapInArrow(writer_fn(store, key), FILE_META_SCHEMA).collect()


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
    from iox_spark.catalog.sharding import partition_for

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
                       size_bytes=c.size_bytes if c.in_memory else 0, min_time_ns=c.min_time_ns,
                       max_time_ns=c.max_time_ns, time_of_last_write=c.created_at, storage=c.storage)
            for c in part.live_chunks()]


def layout_columns(schema) -> list:
    """[(name, type)] of a table's value columns in the merged layout: tags, then fields, by name."""
    return [(t, "string") for t in schema.tags()] + [(f.name, f.type) for f in schema.fields()]


_SEGMENTS_OUT = ("kind string, key string, rows long, size long, min_t long, max_t long, min_seq long, "
                 "max_seq long, payload binary, recv_s double, merge_s double, write_s double")
#: rows per IPC stream of the rows a persist keeps in memory
REMAINDER_ROWS_PER_STREAM = 1 << 16
#: a persist from the write-buffer form of at least this many rows writes one file per core of
#: the executor running it (`cores_per_executor`), split by time, in as many threads of its task
#: (pyarrow encodes a file on one core): 10M bench rows in ~0.9 s instead of ~1.35 s on two
#: cores. The files' time ranges do not meet, so queries never deduplicate across them, also
#: when a restart reads each file as a chunk of its own.
PARALLEL_WRITE_MIN_ROWS = 2 * ROW_GROUP_ROWS
#: rows sampled to find the time that splits a parallel write in halves
_SPLIT_SAMPLE_ROWS = 10_001
#: a persist merged in Arrow runs as several tasks (one per executor, `persist_tasks`) only with at
#: least this many rows per task: below it the task's own threads (PARALLEL_WRITE_MIN_ROWS) do
PERSIST_TASK_MIN_ROWS = 2 * PARALLEL_WRITE_MIN_ROWS


def persist_tasks(slots: int, executor_cores: int, rows: int, min_rows_per_task: int = PERSIST_TASK_MIN_ROWS) -> int:
    """How many tasks merge and write a partition of `rows` rows from the write-buffer form: one per
    executor the application's `slots` task slots make (`slots` // `executor_cores`), at most one per
    `min_rows_per_task` rows, at least one. A local master (its one executor has every slot) gets
    one. Pure (driver)."""
    executors = max(1, slots // max(1, executor_cores))
    return max(1, min(executors, rows // max(1, min_rows_per_task)))


def persist_time_ranges(lo_ns: int, hi_ns: int, tasks: int) -> list:
    """`tasks` time ranges (after_exclusive, upto_inclusive) (None: unbounded) of equal width over
    [lo_ns, hi_ns] that together cover every time, in time order: the first has no lower bound, the
    last no upper one. Fewer when the span is too short to cut. Pure (driver)."""
    cuts = sorted({lo_ns + (hi_ns - lo_ns) * i // tasks for i in range(1, tasks)} - {hi_ns}) if hi_ns > lo_ns else []
    bounds = [None, *cuts, None]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _out_schema():
    import pyarrow as pa

    return pa.schema([("kind", pa.string()), ("key", pa.string()), ("rows", pa.int64()), ("size", pa.int64()),
                      ("min_t", pa.int64()), ("max_t", pa.int64()), ("min_seq", pa.int64()),
                      ("max_seq", pa.int64()), ("payload", pa.binary()), ("recv_s", pa.float64()),
                      ("merge_s", pa.float64()), ("write_s", pa.float64())])


def _out_row(kind: str, key, rows: int, size: int, stats: tuple, payload, timing: tuple = (None, None, None)):
    import pyarrow as pa

    return pa.RecordBatch.from_pylist([dict(zip(("kind", "key", "rows", "size", "min_t", "max_t", "min_seq", "max_seq",
                                                 "payload", "recv_s", "merge_s", "write_s"),
                                                (kind, key, rows, size, *stats, payload, *timing)))],
                                      schema=_out_schema())


def _stats(t) -> tuple:
    """(min time, max time, min seq, max seq) of a non-empty chunk-layout table (executor side)."""
    import pyarrow.compute as pc

    tt = pc.min_max(t.column(TIME_NS_COLUMN))
    ss = pc.min_max(t.column(SEQ_COLUMN))
    return tt["min"].as_py(), tt["max"].as_py(), ss["min"].as_py(), ss["max"].as_py()


def _time_split(t, parts: int) -> list:
    """Times cutting `t` (chunk layout) into up to `parts` pieces of about equal rows by time:
    piece i holds the rows with cuts[i-1] < time <= cuts[i] (the last one: all later rows); from
    a sample, so no full sort. Fewer cuts when times repeat (each piece must hold rows). Pure."""
    import numpy as np

    times = t.column(TIME_NS_COLUMN).to_numpy()
    sample = np.sort(times[::max(1, len(times) // _SPLIT_SAMPLE_ROWS)])
    cuts = sorted({int(sample[len(sample) * i // parts]) for i in range(1, parts)})
    return [c for c in cuts if c < int(times.max())]


def time_pieces(t, cuts: list) -> list:
    """`t` (chunk layout) cut at `cuts` (`_time_split`): piece i holds the rows with
    cuts[i-1] < time <= cuts[i], in `t`'s order. A record batch whose times all lie in one piece
    goes to it whole (no copy: a decoded write request usually spans a short time); only batches
    across a cut are filtered. Executor side."""
    import bisect

    import pyarrow as pa
    import pyarrow.compute as pc

    pieces: list = [[] for _ in range(len(cuts) + 1)]
    for b in t.to_batches():
        if not b.num_rows:
            continue
        times = b.column(TIME_NS_COLUMN)
        mm = pc.min_max(times)
        first, last = (bisect.bisect_left(cuts, mm["min"].as_py()), bisect.bisect_left(cuts, mm["max"].as_py()))
        if first == last:
            pieces[first].append(b)
            continue
        bounds = [None, *cuts, None]
        for i in range(first, last + 1):
            pieces[i].append(b.filter(time_range_mask(times, bounds[i], bounds[i + 1])))
    return [pa.Table.from_batches(p, schema=t.schema) for p in pieces]


def write_files(store: ObjectStore, keys: list, t, parallel_min_rows: int) -> list:
    """Writes `t` (chunk layout, rows) as Parquet: one file at keys[0], or, from
    `parallel_min_rows` rows on, up to len(keys) files split by time (`time_pieces`), each by a
    thread of its own, and makes them durable (`ObjectStore.arrow_finish_write`). Returns
    [(key, rows, size, stats)] of the files written. Executor side."""
    import pyarrow.parquet as pq

    cuts = _time_split(t, len(keys)) if t.num_rows >= parallel_min_rows and len(keys) > 1 else []
    pieces = time_pieces(t, cuts) if cuts else [t]

    def write(i: int):
        piece = pieces[i]
        fs, path = store.arrow_prepare_write(keys[i])
        # the writer cuts row groups of ROW_GROUP_ROWS across the table's chunks (no copy)
        pq.write_table(piece, path, filesystem=fs, row_group_size=ROW_GROUP_ROWS, **parquet_options(piece.schema.names))
        return keys[i], piece.num_rows, fs.get_file_info(path).size, _stats(piece)

    if not cuts:
        written = [write(0)]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(cuts) + 1) as pool:  # pyarrow releases the GIL while it writes
            written = list(pool.map(write, range(len(cuts) + 1)))
    store.arrow_finish_write([w[0] for w in written])
    return written


def segments_persist_fn(store: ObjectStore, keys: list, tags: list, fields: list, flush_ts: int, deletes: list,
                         dedup: bool, parallel_min_rows: int = PARALLEL_WRITE_MIN_ROWS, tasks: list | None = None):
    """Executor side of a persist from the write-buffer form (one task): decodes the chunks' IPC
    streams in chunk order (column `ci`), applies `deletes` (ArrowDelete), deduplicates when
    `dedup`, writes the rows with time <= `flush_ts` as Parquet (`write_files`: one file at
    keys[0], or from `parallel_min_rows` rows one per key, split by time) and yields each
    file's metadata ("file", with the seconds spent waiting for input, merging and writing),
    then the later rows as IPC streams in the chunk layout ("rem", one row each, with their
    stats). `tags`: names; `fields`: [(name, type)].

    `tasks`: [(time range, keys)] when the persist runs as several tasks (`persist_tasks`): the
    batches then carry a column `task`, the index of this task's entry, and the task merges,
    writes and keeps only the rows of its time range (`persist_time_ranges`), with its keys
    (`keys` is not used).

    Picklable (captures the store config and plain data).
    """

    def fn(batches):
        import itertools
        import time as _time

        import pyarrow as pa
        import pyarrow.compute as pc

        from iox_spark.chunk_store.chunk_data import merge_segment_rows
        from iox_spark.chunk_store.ipc_segments import encode_ipc

        waited = [0.0]

        def timed(it):  # the seconds spent waiting for Spark's input batches
            while True:
                w0 = _time.perf_counter()
                b = next(it, None)
                waited[0] += _time.perf_counter() - w0
                if b is None:
                    return
                yield b

        t0 = _time.perf_counter()
        batches, task_keys, time_range = iter(batches), keys, None
        if tasks is not None:
            first = next(batches, None)
            if first is None:
                return
            time_range, task_keys = tasks[first.column("task")[0].as_py()]
            batches = itertools.chain([first], batches)
        t = merge_segment_rows(timed(batches), tags, fields, deletes, dedup, time_range=time_range)
        if t is None:
            return
        # a filter copies every value: skipped when all rows are on one side (a persist of everything)
        later = pc.greater(t.column(TIME_NS_COLUMN), flush_ts)
        n_later = pc.sum(later.cast(pa.int64())).as_py() or 0
        to_write = t if n_later == 0 else t.slice(0, 0) if n_later == t.num_rows else t.filter(pc.invert(later))
        rest = t.slice(0, 0) if n_later == 0 else t if n_later == t.num_rows else t.filter(later)
        t1 = _time.perf_counter()
        if to_write.num_rows:
            written = write_files(store, task_keys, to_write, parallel_min_rows)
            t2 = _time.perf_counter()
            for key, rows, size, stats in written:
                yield _out_row("file", key, rows, size, stats, None, (waited[0], t1 - t0 - waited[0], t2 - t1))
        rest = rest.combine_chunks()
        for off in range(0, rest.num_rows, REMAINDER_ROWS_PER_STREAM):
            piece = rest.slice(off, REMAINDER_ROWS_PER_STREAM)
            payload = encode_ipc(piece)
            yield _out_row("rem", None, piece.num_rows, len(payload), _stats(piece), payload)
        # the Python worker lives on (reused): hand the merge's memory back to the OS, not to the pool
        del t, to_write, rest
        pa.default_memory_pool().release_unused()

    return fn


def _reusable(chunks: list, schema, deletes: list):
    """The checkpoint of `chunks` when it already is their merge: one in-memory, deduplicated chunk
    holding every column of `schema`, and no delete that the merge would materialise; else None."""
    if len(chunks) != 1 or deletes:
        return None
    c = chunks[0]
    if c.df is None or not c.deduplicated or [list(col) for col in c.columns] != [list(col) for col in schema.to_json()]:
        return None
    return c.df


@dataclass
class _Written:
    """What a writer produced: the Parquet file's metadata and what stays in memory."""
    #: [row with key, rows, size, min_t, max_t, min_seq, max_seq] of the file written (or [])
    meta: list
    #: how the rows were merged ("arrow" from the write-buffer form, "sql" from the views)
    via: str
    #: SQL path: the persisted rows, kept as the persisted chunk's read form (may be a chunk's own)
    persisted_df: object = None
    reused: bool = False
    #: SQL path: the rows after the flush timestamp (read form) and their stats
    remainder_df: object = None
    remainder_stats: dict | None = None
    #: Arrow path: the rows after the flush timestamp as one segment (write-buffer form), their stats
    remainder_segment: object = None
    remainder_rows: int = 0
    remainder_bytes: int = 0
    remainder_min_t: int | None = None
    remainder_max_t: int | None = None
    t_merge: float = 0.0
    t_split: float = 0.0
    #: Arrow path: the task's seconds waiting for its input
    t_recv: float = 0.0

    def timing(self, total_s: float) -> str:
        if self.via == "arrow":  # one task merges, splits and writes
            task = (f" (in the task: input {self.t_recv:.3f} s, merge {self.t_merge:.3f} s, "
                    f"Parquet {self.t_split:.3f} s)" if self.meta else "")
            return f"written in {total_s:.3f} s{task}"
        return (f"merge {self.t_merge:.3f} s, split {self.t_split:.3f} s, "
                f"Parquet {total_s - self.t_merge - self.t_split:.3f} s")

    def release(self) -> None:
        """Frees what was built (a failed persist)."""
        if not self.reused:
            release_df(self.persisted_df)
        release_df(self.remainder_df)
        release_df(self.remainder_segment)


def _write_from_segments(spark, store: ObjectStore, keys: list, chunks: list, schema, plan,
                         flush_ts: int, tasks: int = 1) -> _Written:
    """`tasks` executor tasks (`persist_tasks`) read the chunks' write-buffer form, merge in Arrow and
    write the file(s): one task with every key of `keys`, or each task the rows of its time range
    (`persist_time_ranges`) with its share of `keys` (len(keys) // tasks)."""
    from functools import reduce

    from pyspark.sql import functions as F

    arrow_deletes, dedup = plan
    inputs = indexed_segments_df(chunks).coalesce(1)
    ranges = persist_time_ranges(min(c.min_time_ns for c in chunks),
                                 min(max(c.max_time_ns for c in chunks), flush_ts), tasks) if tasks > 1 else []
    per = len(keys) // tasks  # each task's keys (one per thread of its executor)
    task_list = None
    if len(ranges) > 1:  # every task reads every stream: one partition of the same input each
        task_list = [(r, keys[i * per:(i + 1) * per]) for i, r in enumerate(ranges)]
        inputs = reduce(lambda a, b: a.union(b), [inputs.withColumn("task", F.lit(i)) for i in range(len(ranges))])
    fn = segments_persist_fn(store, keys[:per], schema.tags(), [(f.name, f.type) for f in schema.fields()], flush_ts,
                              arrow_deletes, dedup, PARALLEL_WRITE_MIN_ROWS, task_list)
    out = checkpoint(inputs.mapInArrow(fn, _SEGMENTS_OUT))
    rows = out.drop("payload").collect()
    w = _Written(meta=[r for r in rows if r["kind"] == "file"], via="arrow")
    if w.meta:  # the (slowest) task's own timing (in the "t_split" slot: its Parquet writes)
        w.t_recv, w.t_merge, w.t_split = (max(m[k] for m in w.meta) for k in ("recv_s", "merge_s", "write_s"))
    rems = [r for r in rows if r["kind"] == "rem"]
    if rems:
        # its blocks are `out`'s: released with the remainder chunk (release_df finds the checkpoint)
        w.remainder_segment = out.filter(F.col("kind") == "rem").select(
            F.lit(LAYOUT_CHUNK).alias("layout"), F.lit(0).cast("long").alias("seq_base"),
            F.lit(None).cast("int").alias("day_lo"), F.lit(None).cast("int").alias("day_hi"), "payload")
        w.remainder_rows = sum(r["rows"] for r in rems)
        w.remainder_bytes = sum(r["size"] for r in rems)
        w.remainder_min_t = min(r["min_t"] for r in rems)
        w.remainder_max_t = max(r["max_t"] for r in rems)
    else:
        release_df(out)
    return w


def _write_from_views(spark, store: ObjectStore, key: str, chunks: list, schema, deletes: list,
                      flush_ts: int) -> _Written:
    """Merges the chunks' views in Spark SQL, splits at the flush timestamp, writes the file."""
    t0 = time.perf_counter()
    # one deduplicated chunk of the whole schema with no delete to materialise (a compacted
    # partition): its rows are the merge's, so its checkpoint is reused, not copied
    reused = _reusable(chunks, schema, deletes)
    merged = reused if reused is not None else \
        checkpoint(merged_df(spark, schema, chunks, deletes))
    t_merge = time.perf_counter()
    w = _Written(meta=[], via="sql", reused=reused is not None)
    if max(c.max_time_ns for c in chunks) <= flush_ts:
        w.persisted_df = merged  # every row goes to Parquet: no split to compute
    else:
        w.persisted_df = checkpoint(merged.filter(f"`{TIME_NS_COLUMN}` <= {flush_ts}"))
        w.remainder_df = checkpoint(merged.filter(f"`{TIME_NS_COLUMN}` > {flush_ts}"))
        w.reused = False
        if reused is None:
            release_df(merged)
    w.t_merge, w.t_split = t_merge - t0, time.perf_counter() - t_merge
    w.meta = write_one_file(w.persisted_df, store, key)
    w.remainder_stats = {"n": 0} if w.remainder_df is None else row_stats(w.remainder_df)
    return w


class _Held(Exception):
    """Internal: a persist found `Database.failed_batch_hi` set before its commit (it returns None)."""

    def __init__(self, failed_batch_hi: dict):
        self.failed_batch_hi = failed_batch_hi
        super().__init__(f"a failed micro-batch holds persists (up to offsets {failed_batch_hi})")


def _persistable(part, flush_ts: int) -> list:
    """The chunk ids a persist flushing to `flush_ts` takes from `part` (none while it is blocked)."""
    sel = select_persistable_chunks(chunk_states(part), flush_ts)
    return [] if sel.blocked else list(sel.chunk_ids)


def persist_partition(spark, catalog: Catalog, db: Database, table: str, partition_key: str, store: ObjectStore,
                      preserved, in_flight: InFlightFiles, now: float, force: bool,
                      refresh_view, cache=None) -> PersistOutcome | None:
    """Persists one partition. Returns None when there is nothing to persist, or while a failed
    micro-batch holds the database's persists (`Database.failed_batch_hi`; also checked right
    before the commit, and the persist is then abandoned).

    `preserved` is the database's PreservedCatalog (the one committer);
    `refresh_view(db, table)` swaps the table view after the catalog changed; `cache`: local
    copies of S3 files a chunk without an in-memory form reads (see chunk_data.register_parquet_chunk).
    Raises what the commit raises (e.g. RevisionConflict: the caller must stop).
    """
    claimed = claim_to_persist(catalog, db, table, partition_key, now, force, _persistable)
    if claimed is None:
        if db.failed_batch_hi:
            log.info("persist of %s/%s/%s held: a failed micro-batch (up to offsets %s) is not applied again yet",
                     db.name, table, partition_key, db.failed_batch_hi)
        return None
    part, handle, chunks = claimed
    flush_ts = handle.timestamp_ns
    keys_written: list = []
    t0 = time.perf_counter()
    w = None
    try:
        schema = db.schemas.get(table)
        deletes = db.table_deletes(table)
        plan = arrow_plan(chunks, schema, deletes)
        per_task = cores_per_executor(spark) if plan is not None else 1
        tasks = (persist_tasks(task_slots(spark), per_task, sum(c.rows for c in chunks), PERSIST_TASK_MIN_ROWS)
                 if plan is not None else 1)
        keys = [parquet_key(db.name, table, partition_key, uuid.uuid4()) for _ in range(tasks * per_task)]
        in_flight.add(keys)
        keys_written.extend(keys)
        if plan is not None:
            w = _write_from_segments(spark, store, keys, chunks, schema, plan, flush_ts, tasks)
        else:
            w = _write_from_views(spark, store, keys[0], chunks, schema, deletes, flush_ts)
        t_write = time.perf_counter()
        # one committer: the driver builds and commits the transaction
        checkpoints = persist_checkpoints(catalog, db, part, handle)
        if checkpoints is None:  # a micro-batch failed while this persist ran: see Database.failed_batch_hi
            raise _Held(dict(db.failed_batch_hi))
        applied, part_ckpt, db_ckpt, unpersisted_lo = checkpoints
        actions = [SetTableSchema(table, tuple(tuple(c) for c in schema.to_json()))]
        files = []
        for m in w.meta:
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
        crash_point(CrashPoint.PERSIST_AFTER_PARQUET)
        revision = preserved.commit(actions, now)
        t_commit = time.perf_counter()
        crash_point(CrashPoint.PERSIST_AFTER_COMMIT)
    except BaseException as e:
        give_back(catalog, part, PERSISTING, chunks, "closed", handle=handle)
        in_flight.discard(keys_written)
        if w is not None:
            w.release()
        if isinstance(e, _Held):  # its files are orphans: cleanup deletes them
            log.info("persist of %s/%s/%s abandoned before its commit: a micro-batch failed meanwhile (up to "
                     "offsets %s) and is not applied again yet", db.name, table, partition_key, e.failed_batch_hi)
            return None
        raise
    in_flight.discard(keys_written)
    db.deletes.mark_recorded(flushed)
    rows = sum(f.row_count for f in files)
    pid = catalog.next_chunk_id() if rows else None
    # the persisted chunk reads its file, unless the SQL path kept its rows in memory
    parquet_view = register_parquet_chunk(spark, store, [f.key for f in files], schema.to_json(), pid, cache,
                                          [f.size_bytes for f in files]) \
        if rows and w.persisted_df is None else None
    t_view = time.perf_counter()
    # committed: now the flush handle, then the in-memory swap
    new_chunks = []
    if rows:
        view = register_df_chunk(spark, w.persisted_df, pid) if w.persisted_df is not None else parquet_view
        new_chunks.append(Chunk(id=pid, table=table, partition_key=partition_key, order=0, state="persisted",
                                rows=rows, size_bytes=schema_bytes(rows, schema),
                                min_time_ns=min(f.min_time_ns for f in files),
                                max_time_ns=max(f.max_time_ns for f in files), columns=schema.to_json(),
                                view=view, offsets={}, df=w.persisted_df, parquet_keys=[f.key for f in files],
                                created_at=now, deduplicated=True))
    elif not w.reused:
        release_df(w.persisted_df)  # every row was deleted: the empty checkpoint backs no chunk
    if w.remainder_stats and w.remainder_stats["n"]:
        st = w.remainder_stats
        cid = catalog.next_chunk_id()
        new_chunks.append(Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="closed",
                                rows=st["n"], size_bytes=schema_bytes(st["n"], schema), min_time_ns=st["lo"],
                                max_time_ns=st["hi"], columns=schema.to_json(),
                                view=register_df_chunk(spark, w.remainder_df, cid), offsets={}, df=w.remainder_df,
                                created_at=now, deduplicated=True,
                                time_spans=merged_spans(chunks, st["lo"], st["hi"])))
    if w.remainder_segment is not None:
        cid = catalog.next_chunk_id()
        new_chunks.append(Chunk(id=cid, table=table, partition_key=partition_key, order=0, state="closed",
                                rows=w.remainder_rows, size_bytes=w.remainder_bytes, min_time_ns=w.remainder_min_t,
                                max_time_ns=w.remainder_max_t, columns=schema.to_json(),
                                view=register_segments_chunk(spark, [w.remainder_segment], schema.to_json(), cid),
                                offsets={}, created_at=max(c.created_at for c in chunks), deduplicated=True,
                                segments=[w.remainder_segment], segments_deduplicated=True,
                                segment_bytes=w.remainder_bytes,
                                time_spans=merged_spans(chunks, w.remainder_min_t, w.remainder_max_t)))
    swap_persisted(catalog, db, table, partition_key, part, handle, chunks, new_chunks, files, actions[-2],
                   unpersisted_lo, applied)
    t_swapped = time.perf_counter()
    refresh_view(db, table)
    t_refreshed = time.perf_counter()
    if rows and w.reused:
        chunks[0].hand_over_df()  # its checkpoint now backs the persisted chunk: retiring frees its view only
    catalog.retire([c for c in chunks])
    t_end = time.perf_counter()
    log.info("persisted %s/%s/%s: %d rows in %d file(s), revision %d, %d chunk(s) merged via %s (%s, "
             "commit %.3f s, swap %.3f s: file view %.3f s, table view %.3f s, release %.3f s)", db.name, table,
             partition_key, rows, len(files), revision, len(chunks), w.via, w.timing(t_write - t0), t_commit - t_write,
             t_end - t_commit, t_view - t_commit, t_refreshed - t_swapped, t_end - t_refreshed)
    return PersistOutcome(table, partition_key, rows, tuple(f.key for f in files), revision, flush_ts, actions[-1])
