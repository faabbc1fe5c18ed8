"""Continuous downsampling on the server: the downsamplers' records, the rounds that emit their
windows, and the calls that create, list and drop them (catalog/downsampling.py says what a
downsampler is and which windows a change touches).

When it runs: `start` loads every record from the object store (`iox~downsamplers/<name>.json`)
and starts one thread, which runs a round of every downsampler each ROUND_INTERVAL_S until `stop`.

Invariant (exactly once by design): a round reads, at one instant, what changed in the source table
since the downsampler's progress (`Database.downsample_changes`), emits every window it touches again
(the source's current rows in them, aggregated by the query engine over memory and Parquet), and
only once Kafka acknowledged those writes records the new progress. A crash before that record
emits the same windows again at the next round; each output point is keyed by (tags, window
start), so the destination's last-write-wins dedup overwrites, never duplicates. A window a delete
touched is first deleted in the destination (a delete removes only rows before it in the
destination's write buffer, so the window's new point, written after it, stays). A round waits for
the source's replay to catch up: a window emitted from half-replayed rows could otherwise stay.
The progress names the destination's write-buffer epoch its writes were acknowledged in: a
destination found in another one (or gone) may have lost them, and the next round emits every window
again (`resume_from`). A round emits no window that starts before what the destination's retention
keeps (the write path would refuse its point, and every round after it would fail the same way).
One failing downsampler never stops the others (its error is in `iox status`; the next round tries again).

Runs on the driver. Not available on an ingester pool member (its tables' rows are spread over members).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from typing import TYPE_CHECKING

from iox_spark.catalog.crash_points import CrashPoint, crash_point
from iox_spark.catalog.delete_predicate import InvalidDelete, parse_time
from iox_spark.catalog.downsampling import (KEY_PREFIX, DownsamplerSpec, InvalidDownsampler, Progress, aggregate_sql,
                                            decode_record, encode_record, output_columns, parse_aggregates,
                                            parse_group_by, record_key, resume_from, window_ranges,
                                            window_start)
from iox_spark.catalog.errors import AlreadyExists, ObjectNotFound
from iox_spark.catalog.retention import InvalidDuration, format_duration_s, parse_duration_s, reader_lo_ns
from iox_spark.catalog.schema import Column, ColumnTypeConflict
from iox_spark.iox import management_pb2
from iox_spark.server.errors import (DatabaseNotFound, DownsamplerExists, DownsamplerNotFound, InvalidArgument,
                                     NotServed, ReplayNotCaughtUp)

if TYPE_CHECKING:
    from iox_spark.catalog.catalog import Catalog
    from iox_spark.catalog.object_store import ObjectStore

__all__ = ["Downsamplers", "ROUND_INTERVAL_S", "WINDOWS_PER_QUERY", "output_lines", "query_slices", "spec_of_request"]

log = logging.getLogger(__name__)

#: how often every downsampler runs a round
ROUND_INTERVAL_S = 1.0
#: most windows one aggregation query covers (a longer range, such as a backfill, is cut in slices)
WINDOWS_PER_QUERY = 1000
#: most bytes of line protocol one write of a round's output carries
_WRITE_MAX_BYTES = 4 << 20
#: how long a round waits for its source's replay before it tries again at the next one
_REPLAY_WAIT_S = 0.5
#: a round emits no window that starts before what the destination's retention keeps this much later
#: (such a point is hidden there, and the write path refuses a write holding one whole)
_RETENTION_MARGIN_S = 60.0


class _Running:
    """One downsampler as this server runs it; its fields change under `Downsamplers._lock`."""

    def __init__(self, spec: DownsamplerSpec, progress: Progress | None):
        self.spec = spec
        self.progress = progress
        self.dropped = False
        self.state = "backfilling" if progress is None else "running"
        self.last_error = ""
        self.last_round_at: float | None = None
        self.lag_messages = 0
        self.watermark_ns: int | None = None
        self.windows_emitted = 0


class Downsamplers:
    """`catalog`: the in-memory catalog; `store`: the object store; `queries`: the query service
    (server/query_service.py); `read_barrier`: ReadBarrier (the source's replay); `router`: writes;
    `write_buffer`: deletes; `late_arrive_window_s`: the watermark's lag; `pool_member`: this server
    is an ingester pool member (downsampling refused)."""

    def __init__(self, catalog: Catalog, store: ObjectStore, queries, read_barrier, router, write_buffer,
                 late_arrive_window_s: float, pool_member: bool = False, interval_s: float = ROUND_INTERVAL_S):
        self._catalog = catalog
        self._store = store
        self._queries = queries
        self._barrier = read_barrier
        self._router = router
        self._write_buffer = write_buffer
        self._late_ns = int(late_arrive_window_s * 1e9)
        self._pool_member = pool_member
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Loads every downsampler's record and starts the rounds. A record this server cannot read
        is logged and skipped (its downsampler does not run here)."""
        for meta in self._store.list(KEY_PREFIX):
            try:
                spec, progress = decode_record(self._store.get(meta.key), meta.key)
            except Exception:
                log.exception("downsampler record %s cannot be read; it does not run", meta.key)
                continue
            self._running[spec.name] = _Running(spec, progress)
        if self._running:
            log.info("%d downsampler(s): %s", len(self._running), ", ".join(sorted(self._running)))
        self._thread = threading.Thread(target=self._loop, name="downsamplers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    # -- the calls of the API ----------------------------------------------------------------
    def create(self, database: str, table: str, every: str, aggregates: str, group_by_tags: str, into: str,
               start: str, now_ns: int | None = None) -> management_pb2.DownsamplerStatus:
        """Creates a downsampler (CreateDownsampler); its first round emits every window from `start`."""
        if self._pool_member:
            raise NotServed("continuous downsampling on an ingester pool member",
                            "create the downsampler on a server outside a pool")
        now_ns = time.time_ns() if now_ns is None else now_ns
        spec = spec_of_request(database, table, every, aggregates, group_by_tags, into, start, now_ns)
        db = self._catalog.peek_database(spec.source_db)
        if db is None:
            raise DatabaseNotFound(spec.source_db)
        schema = db.schemas.get(spec.table)
        if schema is None:
            raise InvalidArgument(f"table {spec.table!r} does not exist in database {spec.source_db!r}")
        try:
            wanted = output_columns(spec, {c.name: (c.role, c.type) for c in schema.columns})
        except InvalidDownsampler as e:
            raise InvalidArgument(str(e)) from None
        _check_destination(self._catalog, spec, wanted)
        key = record_key(spec.name)
        with self._lock:
            if spec.name in self._running:
                raise DownsamplerExists(spec.name)
            try:
                self._store.put_if_absent(key, encode_record(spec, None))
            except AlreadyExists:
                raise DownsamplerExists(spec.name) from None
            run = self._running[spec.name] = _Running(spec, None)
            log.info("downsampler %s created: %s", spec.name, spec.to_json())
            return self._status_of(run, time.time())

    def list(self, database: str = "") -> list:
        """DownsamplerStatus of every downsampler (whose source or destination is `database`, when given)."""
        now = time.time()
        with self._lock:
            runs = sorted(self._running.values(), key=lambda r: r.spec.name)
            return [self._status_of(r, now) for r in runs
                    if not database or database in (r.spec.source_db, r.spec.dest_db)]

    def drop(self, name: str) -> management_pb2.DownsamplerStatus:
        """Drops downsampler `name`: no round of it records progress any more, its record goes."""
        with self._lock:
            run = self._running.pop(name, None)
            if run is None:
                raise DownsamplerNotFound(name)
            run.dropped = True
            try:
                self._store.delete(record_key(name))
            except ObjectNotFound:
                pass
            log.info("downsampler %s dropped", name)
            return self._status_of(run, time.time())

    # -- rounds ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.run_round()

    def run_round(self) -> None:
        """One round of every downsampler (the thread's; also callable directly)."""
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            if self._stop.is_set():
                return
            try:
                if self._round(run):
                    run.last_round_at = time.time()
                run.last_error = ""
            except Exception as e:  # one failing downsampler never stops the others
                msg = f"{type(e).__name__}: {e}"
                if msg != run.last_error:
                    log.warning("downsampler %s: round failed (%s); tried again next round", run.spec.name, msg,
                                exc_info=not isinstance(e, (InvalidArgument, ReplayNotCaughtUp)))
                run.last_error = msg

    def _round(self, run: _Running) -> bool:
        """One round of `run`; False when it waited (no source database yet, its replay running)."""
        spec = run.spec
        db = self._catalog.peek_database(spec.source_db)
        if db is None:
            run.state = "waiting for its source database"
            return False
        try:
            self._barrier.pass_through(spec.source_db, "", False, _REPLAY_WAIT_S)
        except ReplayNotCaughtUp:
            run.state = "waiting for the source's replay to catch up"
            return False
        dest = self._catalog.peek_database(spec.dest_db)
        dest_epoch = _epoch_of(dest)
        since = resume_from(run.progress, dest_epoch)
        if since is None and run.progress is not None:
            log.warning("downsampler %s: its destination %s continues in a new write-buffer epoch (%s, was %s): "
                        "every window is emitted again", spec.name, spec.dest_db, dest_epoch,
                        run.progress.dest_epoch)
        ch = db.downsample_changes(spec.table, since)
        run.state = "backfilling" if since is None else "running"
        if ch.max_time_ns is not None:
            run.watermark_ns = window_start(ch.max_time_ns - self._late_ns, spec.every_ns)
        if ch.full and ch.max_time_ns is not None:
            row_spans = ((ch.min_time_ns, ch.max_time_ns),) + ch.delete_spans
        else:
            row_spans = ch.row_spans + ch.delete_spans
        schema = db.schemas.get(spec.table)
        if schema is not None and row_spans:
            columns = output_columns(spec, {c.name: (c.role, c.type) for c in schema.columns})
            for lo, hi in window_ranges(ch.delete_spans, spec.every_ns, spec.start_ns):
                self._delete_outputs(spec, lo, hi)
            ranges = window_ranges(row_spans, spec.every_ns, _first_kept_window_ns(spec, dest))
            for piece in query_slices(ranges, spec.every_ns * WINDOWS_PER_QUERY):
                run.windows_emitted += self._emit(spec, columns, piece)
            crash_point(CrashPoint.DOWNSAMPLE_BEFORE_PROGRESS)
        if dest_epoch is None:  # this round's writes may have created the destination
            dest_epoch = _epoch_of(self._catalog.peek_database(spec.dest_db))
        done = dataclasses.replace(ch.progress(), dest_epoch=dest_epoch)
        with self._lock:
            if run.dropped:
                return False
            if done != run.progress:
                self._store.put(record_key(spec.name), encode_record(spec, done))
                run.progress = done
            run.state = "running"
            applied = db.applied_offsets()
            run.lag_messages = sum(max(0, hi + 1 - done.next_offsets.get(kp, 0)) for kp, hi in applied.items())
        return True

    def _delete_outputs(self, spec: DownsamplerSpec, lo: int, hi_exclusive: int) -> None:
        """Deletes the destination's points of windows [lo, hi_exclusive) (before they are emitted again)."""
        from iox_spark.server.write.deletes import submit_delete

        dest = self._catalog.peek_database(spec.dest_db)
        if dest is None or dest.schemas.get(spec.dest_table) is None:
            return  # nothing emitted there yet
        submit_delete(self._catalog, self._write_buffer, spec.dest_db, spec.dest_table, str(lo), str(hi_exclusive), "")

    def _emit(self, spec: DownsamplerSpec, columns: list, ranges: list) -> int:
        """Aggregates `ranges` of the source and writes their points; returns how many."""
        tags = [c for c, role, _t in columns if role == "tag"]
        result = self._queries.query(spec.source_db, aggregate_sql(spec, tags, ranges))
        try:
            rows = result.table
        finally:
            result.close()
        lines = output_lines(spec, columns, rows)
        body, n = [], 0
        for line in lines:
            if body and n + len(line) + 1 > _WRITE_MAX_BYTES:
                self._router.write_line_protocol(spec.dest_db, b"\n".join(body), "ns")
                body, n = [], 0
            body.append(line)
            n += len(line) + 1
        if body:
            self._router.write_line_protocol(spec.dest_db, b"\n".join(body), "ns")
        return len(lines)

    # -- status ------------------------------------------------------------------------------
    def _status_of(self, run: _Running, now: float) -> management_pb2.DownsamplerStatus:
        s = run.spec
        st = management_pb2.DownsamplerStatus(
            name=s.name, source_database=s.source_db, source_table=s.table, destination_database=s.dest_db,
            destination_table=s.dest_table, every_ns=s.every_ns, aggregates=[a.text() for a in s.aggregates],
            group_by_tags=list(s.group_by or ()), all_tags=s.group_by is None, start_ns=s.start_ns,
            state=run.state if not run.last_error else f"failing ({run.state})", lag_messages=run.lag_messages,
            last_error=run.last_error, windows_emitted=run.windows_emitted)
        if run.progress is not None:
            for kp, off in sorted(run.progress.next_offsets.items()):
                st.progress.add(partition=kp, next_offset=off)
        if run.watermark_ns is not None:
            st.watermark_ns = run.watermark_ns
        if run.last_round_at is not None:
            st.last_round_age_s = max(0.0, now - run.last_round_at)
        return st


def query_slices(ranges: list, max_span_ns: int) -> list:
    """`ranges` ([(lo, hi_exclusive)] of whole windows) cut into lists of ranges of at most
    `max_span_ns` in all (one aggregation query each)."""
    out, cur, used = [], [], 0
    for lo, hi in ranges:
        while lo < hi:
            take = min(hi - lo, max_span_ns - used)
            cur.append((lo, lo + take))
            used += take
            lo += take
            if used >= max_span_ns:
                out.append(cur)
                cur, used = [], 0
    if cur:
        out.append(cur)
    return out


def spec_of_request(database: str, table: str, every: str, aggregates: str, group_by_tags: str, into: str, start: str,
             now_ns: int) -> DownsamplerSpec:
    """The spec of a CreateDownsampler request; InvalidArgument naming what is wrong."""
    try:
        every_s = parse_duration_s(every)
    except InvalidDuration as e:
        raise InvalidArgument(f"invalid downsampler every: {e}") from None
    if every_s < 1:
        raise InvalidArgument("invalid downsampler every: at least 1s")
    into = (into or "").strip()
    if not into:
        raise InvalidArgument("invalid downsampler destination: give --into DST or DST.TABLE")
    dest_db, _, dest_table = into.partition(".")
    dest_table = dest_table or f"{table}_{format_duration_s(every_s)}"
    start_ns = 0
    if (start or "").strip():
        try:
            start_ns = now_ns - parse_duration_s(start) * 1_000_000_000
        except InvalidDuration:
            try:
                start_ns = parse_time(start, "start")
            except InvalidDelete:
                raise InvalidArgument(f"invalid downsampler start {start!r}: an RFC3339 time, integer "
                                      "nanoseconds, or a duration before now (30d)") from None
    try:
        spec = DownsamplerSpec(database, table, every_s * 1_000_000_000, parse_aggregates(aggregates),
                               parse_group_by(group_by_tags), dest_db, dest_table, start_ns)
        spec.validate()
    except InvalidDownsampler as e:
        raise InvalidArgument(str(e)) from None
    return spec


def _first_kept_window_ns(spec: DownsamplerSpec, dest) -> int:
    """Where a round's windows start: at `spec.start_ns`, or at the first window that starts within
    what the destination's retention keeps `_RETENTION_MARGIN_S` from now, when that is later
    (`dest`: the destination database, None before it exists). An older window's point would be
    hidden in the destination, and the write path refuses a write that holds one whole: emitting it
    would fail every round."""
    lo = None if dest is None else reader_lo_ns(dest.retention_period_s, time.time() + _RETENTION_MARGIN_S)
    if lo is None:
        return spec.start_ns
    return max(spec.start_ns, window_start(lo - 1, spec.every_ns) + spec.every_ns)


def _epoch_of(db) -> tuple | None:
    """(write-buffer epoch, topic id) of database `db` (None: no database)."""
    if db is None:
        return None
    _topic, topic_id, epoch = db.incarnation()
    return epoch, topic_id


def _check_destination(catalog: Catalog, spec: DownsamplerSpec, wanted: list) -> None:
    """InvalidArgument when the destination table exists with a column of another role or type."""
    dest = catalog.peek_database(spec.dest_db)
    schema = None if dest is None else dest.schemas.get(spec.dest_table)
    if schema is None:
        return
    try:
        schema.check([Column(name, role, typ) for name, role, typ in wanted])
    except ColumnTypeConflict as e:
        raise InvalidArgument(f"the downsampler cannot write its destination: {e}") from None


def _escape(text: str, chars: str) -> str:
    out = text.replace("\\", "\\\\")
    for c in chars:
        out = out.replace(c, "\\" + c)
    return out


def _field_value(value, typ: str) -> str | None:
    if value is None:
        return None
    if typ == "float":
        v = float(value)
        return repr(v) if math.isfinite(v) else None
    if typ == "integer":
        return f"{int(value)}i"
    if typ == "uinteger":
        return f"{int(value)}u"
    if typ == "boolean":
        return "true" if value else "false"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_lines(spec: DownsamplerSpec, columns: list, rows) -> list:
    """The line protocol (bytes, one per point) of an aggregation's rows (a pyarrow Table from
    `aggregate_sql`): the destination table, the group's tags (a NULL tag is left out), one field
    per aggregate (a NULL or non-finite value is left out), the window start as the time. A row
    with no field left is no point."""
    measurement = _escape(spec.dest_table, ", ")
    tags = [(c, _escape(c, ",= ")) for c, role, _t in columns if role == "tag"]
    fields = [(c, _escape(c, ",= "), t) for c, role, t in columns if role == "field"]
    out = []
    for r in rows.to_pylist():
        tag_text = "".join(f",{k}={_escape(str(r[c]), ',= ')}" for c, k in sorted(tags, key=lambda x: x[0])
                           if r.get(c) is not None and r[c] != "")
        vals = [(k, _field_value(r.get(c), t)) for c, k, t in fields]
        body = ",".join(f"{k}={v}" for k, v in vals if v is not None)
        if body:
            out.append(f"{measurement}{tag_text} {body} {r['_window_ns']}".encode())
    return out
