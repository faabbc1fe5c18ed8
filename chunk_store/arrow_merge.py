"""Merging chunk rows in Arrow: deletes and deduplication, exactly as the table views do them in SQL.

Invariant: for rows in the chunk layout (value columns, `time_ns`, `_iox_seq`),
`apply_deletes` removes exactly the rows `chunk_store/views.py deletes_sql` removes
(a delete takes rows written before it, `_iox_seq < seq`, with start <= time <
stop, matching every term NULL-safely: a NULL never matches), and
`deduplicate` gives exactly `views._merge_sql`'s rows: one per (tags, time_ns),
each field its last non-null value in `_iox_seq` order (NULL if none),
`_iox_seq` the newest merged. Row order of the result is not specified.

Pure pyarrow, no Spark: runs on the executors (persist from the write-buffer
form) and in unit tests.
"""
from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN

__all__ = ["ArrowDelete", "as_arrow_delete", "deletes_supported", "apply_deletes", "deduplicate", "sort_by_seq"]

#: (column type, literal kind) pairs a delete term may compare (catalog/delete_predicate.py
#: validate_against_schema); others are not evaluated here
_SUPPORTED = {("string", "string"), ("float", "float"), ("float", "integer"), ("integer", "integer"),
              ("uinteger", "integer"), ("boolean", "boolean")}


class ArrowDelete(NamedTuple):
    """A delete as `apply_deletes` takes it (picklable: it travels to the executors)."""

    start_ns: int
    stop_ns_exclusive: int
    #: rows with a smaller `_iox_seq` were written before it
    seq: int
    #: ((column, op, value, kind), ...) as catalog/delete_predicate.py to_json
    terms: tuple


def as_arrow_delete(d) -> ArrowDelete:
    """A delete of the mailbox (catalog/delete_mailbox.py `Delete`) as `apply_deletes` takes it."""
    return ArrowDelete(d.start_ns, d.stop_ns_exclusive, d.seq, tuple(tuple(t[:4]) for t in d.predicate))


def deletes_supported(deletes, col_types: dict) -> bool:
    """Whether `apply_deletes` evaluates every term of `deletes` (terms on columns the table lacks
    are fine: such a delete removes nothing, as in SQL)."""
    for d in deletes:
        for col, op, _value, kind in d[3]:
            typ = col_types.get(col)
            if typ is not None and ((typ, kind) not in _SUPPORTED or op not in ("=", "!=")):
                return False
    return True


def _literal(value, kind: str, typ: str):
    if typ == "string":
        return pa.scalar(value, pa.string())
    if typ == "float":
        return pa.scalar(float(value), pa.float64())
    if typ == "integer":
        return pa.scalar(int(value), pa.int64())
    if typ == "uinteger":
        return pa.scalar(Decimal(int(value)), pa.decimal128(20, 0))
    return pa.scalar(bool(value), pa.bool_())


def apply_deletes(t: pa.Table, deletes, col_types: dict) -> pa.Table:
    """`t` without the rows `deletes` (ArrowDelete) remove; `col_types`: {column: type} of `t`'s value columns."""
    if not deletes or t.num_rows == 0:
        return t
    times = t.column(TIME_NS_COLUMN)
    seqs = t.column(SEQ_COLUMN)
    removed = None
    for start, stop, seq, terms in deletes:
        if any(col not in col_types for col, _op, _v, _k in terms):
            continue  # a column the table lacks is NULL: nothing matches
        m = pc.and_(pc.less(seqs, seq), pc.and_(pc.greater_equal(times, start), pc.less(times, stop)))
        for col, op, value, kind in terms:
            lit = _literal(value, kind, col_types[col])
            cmp = pc.equal(t.column(col), lit) if op == "=" else pc.not_equal(t.column(col), lit)
            m = pc.and_(m, pc.fill_null(cmp, False))
        removed = m if removed is None else pc.or_(removed, m)
    if removed is None:
        return t
    return t.filter(pc.invert(removed))


def sort_by_seq(t: pa.Table) -> pa.Table:
    """`t` in `_iox_seq` order (as it is when already sorted)."""
    seq = t.column(SEQ_COLUMN)
    if t.num_rows < 2:
        return t
    s = seq.combine_chunks()
    if pc.all(pc.greater_equal(s.slice(1), s.slice(0, len(s) - 1))).as_py():
        return t
    return t.take(pc.sort_indices(s))


def deduplicate(t: pa.Table, tags: list, fields: list) -> pa.Table:
    """One row per (tags, time_ns): each field its last non-null value by `_iox_seq`, `_iox_seq` the max.

    `tags`/`fields`: column names; the result has `t`'s columns in `t`'s order. Only rows whose
    `time_ns` occurs more than once can share a key: they are merged, the others pass as they
    are (10M rows with one repeated point: ~1 s instead of ~9 s for a group-by of every row),
    as zero-copy slices of `t` when the repeated rows are few. Many rows sharing times are first
    narrowed down to those sharing a hash of their whole key (`_repeated_key_among`).
    """
    import numpy as np

    if t.num_rows < 2:
        return t
    repeated = _repeated_time_mask(t)
    if repeated is None:
        return t
    if int(repeated.sum()) >= _KEY_HASH_MIN_ROWS:
        repeated = _repeated_key_among(t, tags, repeated)
        if repeated is None:
            return t
    if repeated.all():
        return _merge_rows(t, tags, fields)
    merged = _merge_rows(t.filter(pa.array(repeated)), tags, fields)
    rep_idx = np.flatnonzero(repeated)
    if len(rep_idx) > _MAX_SLICED_GAPS:
        return pa.concat_tables([t.filter(pa.array(~repeated)), merged])
    # the runs of rows between repeated ones, as slices: no value is copied
    starts = np.concatenate(([0], rep_idx + 1))
    stops = np.concatenate((rep_idx, [t.num_rows]))
    kept = [t.slice(a, b - a) for a, b in zip(starts.tolist(), stops.tolist()) if b > a]
    return pa.concat_tables(kept + [merged])


#: from this many rows that share their time with another row on, they are narrowed down to the
#: rows sharing a hash of their whole key (`_repeated_key_among`) before the exact merge: a load of
#: new series at the same times (the bench's sustained ingest, many hosts reporting on the same
#: ticks) repeats every time but no key. 22M such rows (a compaction of the bench's files): ~4 s
#: instead of ~14 s for a hash group-by of all of them, and the compaction's peak RSS ~3 GB, not ~8
_KEY_HASH_MIN_ROWS = 65_536
#: 64-bit multipliers of the key hash (Fibonacci hashing's, and xxHash's second prime)
_HASH_M1 = 0x9E3779B97F4A7C15
_HASH_M2 = 0xC2B2AE3D27D4EB4F


def _repeated_key_among(t: pa.Table, tags: list, rows_mask):
    """`rows_mask` (numpy bool: the rows that may share their key) narrowed to the rows whose 64-bit
    hash of (tags, time_ns) another of them has too, or None when no hash repeats. Rows of one key
    have one hash, so no row to merge is lost; a collision only sends rows of distinct keys to the
    exact merge, which keeps them apart. A NULL tag hashes as a value of its own (the merge groups
    NULLs together, as SQL's GROUP BY does)."""
    import numpy as np

    idx = None if rows_mask.all() else np.flatnonzero(rows_mask)

    def column(name):
        c = t.column(name)
        return (c if idx is None else c.take(pa.array(idx))).combine_chunks()

    m1, m2 = np.uint64(_HASH_M1), np.uint64(_HASH_M2)
    h = column(TIME_NS_COLUMN).to_numpy(zero_copy_only=False).astype(np.uint64) * m1
    for i, tag in enumerate(tags):
        codes = pc.fill_null(pc.dictionary_encode(column(tag)).indices, -1).to_numpy(zero_copy_only=False)
        h ^= (codes.astype(np.int64) + (2 + i)).astype(np.uint64) * m2
        h *= m1
    s = np.sort(h)
    same = s[1:] == s[:-1]
    if not same.any():
        return None
    hit = np.isin(h, np.unique(s[1:][same]))
    if idx is None:
        return hit
    mask = np.zeros(len(rows_mask), dtype=bool)
    mask[idx[hit]] = True
    return mask


#: at most this many repeated rows are cut out of a table by slicing (each a zero-copy slice of
#: every column); more are removed by one filter (a copy of every row)
_MAX_SLICED_GAPS = 1024


def _repeated_time_mask(t: pa.Table):
    """numpy bool mask of the rows whose `time_ns` another row has too, or None when no time
    repeats. The times are cut into runs that rise and lie in one Arrow chunk of the column (a
    decoded IPC stream: one write request, whose times usually rise and lie close together): two
    rows can only share a time when their runs' [first, last] ranges overlap, so only the rows of
    runs that overlap another run are sorted (`_repeated_among`). 10M rows of 2,000 interleaved
    requests with one repeated point: the rows of two runs (~0.02 s) instead of one stable sort
    of all 10M (0.17-0.7 s)."""
    import numpy as np

    col = t.column(TIME_NS_COLUMN)
    times = col.combine_chunks().to_numpy(zero_copy_only=False)
    n = len(times)
    falls = np.flatnonzero(times[1:] <= times[:-1]) + 1
    if not len(falls):
        return None
    chunk_starts = np.cumsum([len(c) for c in col.chunks])[:-1]
    falls = np.union1d(falls, chunk_starts[(chunk_starts > 0) & (chunk_starts < n)])
    starts = np.concatenate(([0], falls))
    stops = np.concatenate((falls, [n]))
    lo, hi = times[starts], times[stops - 1]
    by_lo = np.argsort(lo, kind="stable")
    # runs in `lo` order chain into clusters; a run starts a new one when it begins after every
    # earlier run ended: rows of different clusters never share a time
    reach = np.maximum.accumulate(hi[by_lo])
    cluster = np.cumsum(np.concatenate(([True], lo[by_lo][1:] > reach[:-1]))) - 1
    shared = np.bincount(cluster)[cluster] > 1  # in `lo` order: the run's cluster has another run
    if not shared.any():
        return None
    run_shared = np.empty(len(starts), dtype=bool)
    run_shared[by_lo] = shared
    rows = None if run_shared.all() else np.flatnonzero(np.repeat(run_shared, stops - starts))
    return _repeated_among(times, rows)


def _repeated_among(times, rows):
    """`_repeated_time_mask` by one stable sort of the times of `rows` (numpy indices; None: all);
    a row outside `rows` must not share its time with any other row. None when no time repeats."""
    import numpy as np

    sub = times if rows is None else times[rows]
    order = np.argsort(sub, kind="stable")
    st = sub[order]
    same_as_next = st[1:] == st[:-1]
    if not same_as_next.any():
        return None
    rep_sorted = np.zeros(len(st), dtype=bool)
    rep_sorted[1:] |= same_as_next
    rep_sorted[:-1] |= same_as_next
    hit = order[rep_sorted]
    mask = np.zeros(len(times), dtype=bool)
    mask[hit if rows is None else rows[hit]] = True
    return mask


def _merge_rows(t: pa.Table, tags: list, fields: list) -> pa.Table:
    """`deduplicate` of `t` (at least two rows) by one hash group-by of all its rows."""
    t = sort_by_seq(t)
    schema = t.schema
    # Arrow's hash_last has no decimal kernel: unsigned fields (decimal(20, 0) in the chunk layout,
    # values in [0, 2^64 - 1]) are aggregated as uint64, exactly
    for f in fields:
        if pa.types.is_decimal(schema.field(f).type):
            t = t.set_column(t.schema.get_field_index(f), f, pc.cast(t.column(f), pa.uint64()))
    keys = list(tags) + [TIME_NS_COLUMN]
    aggs = [(f, "last", pc.ScalarAggregateOptions(skip_nulls=True)) for f in fields] + [(SEQ_COLUMN, "max")]
    g = t.group_by(keys, use_threads=False).aggregate(aggs)
    renamed = {f"{f}_last": f for f in fields}
    renamed[f"{SEQ_COLUMN}_max"] = SEQ_COLUMN
    g = g.rename_columns([renamed.get(n, n) for n in g.column_names])
    return g.select(schema.names).cast(schema)
