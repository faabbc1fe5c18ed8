"""The router: validates a write request and produces it to the write buffer.

Invariant: a request is all-or-nothing. Every check (size, database name, each
line or Arrow column, each column type against the table schema) runs before
anything is produced; the caller gets a write token only after Kafka
acknowledged every message of the request.

Line protocol (`write_line_protocol`) and Arrow (`write_arrow`) only differ in
how a request becomes per-table batches (`{table: ([Column], pa.Table)}`, tags
as strings, fields float64/int64/uint64/string/bool, `time` int64 nanoseconds);
from there both take the one path `_produce`: the database check (a database
another server owns now is refused before anything of the request is done:
FAILED_PRECONDITION, see lifecycle/worker.py on fencing), reserved names, the
table schema check, encoding and producing.

Runs on the driver, in gRPC / HTTP worker threads.
"""
from __future__ import annotations

import logging
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.schema import RESERVED_COLUMNS, Column, ColumnLimitExceeded, ColumnTypeConflict

from iox_spark.server.errors import BadLines, DecompressedRequestTooLarge, InvalidArgument, InvalidDatabaseName, RequestTooLarge, SchemaConflict, TooManyColumns
from iox_spark.catalog.seq_layout import SEQ_ROW_BITS
from iox_spark.server.write.line_protocol import MAX_NAME_BYTES, PRECISIONS, parse_lines
from iox_spark.server.metrics import ServerMetrics
from iox_spark.server.write_buffer.wire_format import encode_write
from iox_spark.server.write_buffer.producer import WriteBuffer

log = logging.getLogger(__name__)

__all__ = ["Router", "WriteResult", "ArrowTableWrite", "validate_database_name", "unique_keys", "MAX_REPORTED_BAD_LINES",
           "MAX_DATABASE_NAME_CHARS", "MAX_ROWS_PER_TABLE", "ARROW_ROLES", "NO_SYNC_THREADS", "NO_SYNC_MAX_PENDING"]

#: At most this many bad lines are listed in an error.
MAX_REPORTED_BAD_LINES = 100
MAX_DATABASE_NAME_CHARS = 64
#: Rows of one table in one request (one write-buffer message): the row index must fit `_iox_seq`.
MAX_ROWS_PER_TABLE = 1 << SEQ_ROW_BITS
#: Column roles of an Arrow write.
ARROW_ROLES = ("tag", "field", "time")
_DB_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_TIME = "time"
_TIME_COLUMN = Column(_TIME, "time", "time")
#: write_lp's no_sync: threads producing the requests answered before Kafka acknowledged them, and
#: how many such requests may wait for Kafka before the next one waits for a place.
NO_SYNC_THREADS = 8
NO_SYNC_MAX_PENDING = 256
#: Nanoseconds per unit of an Arrow timestamp.
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def validate_database_name(name: str) -> None:
    if not name:
        raise InvalidDatabaseName(name, "must not be empty")
    if len(name) > MAX_DATABASE_NAME_CHARS:
        raise InvalidDatabaseName(name, f"longer than {MAX_DATABASE_NAME_CHARS} characters")
    if not _DB_NAME.match(name):
        raise InvalidDatabaseName(name, "only letters, digits, '_' and '-' are allowed")


@dataclass(frozen=True)
class WriteResult:
    token: dict  # {kafka partition: offset}
    points: int
    topic: str


@dataclass(frozen=True)
class ArrowTableWrite:
    """One table of an Arrow write: an Arrow IPC stream and the role of each column."""

    table: str
    arrow_ipc: bytes
    #: [(column name, "tag" | "field" | "time")], one entry per column of the stream
    roles: list = field(default_factory=list)


class Router:
    def __init__(self, catalog: Catalog, write_buffer: WriteBuffer, kafka_partitions: int, max_request_bytes: int,
                 metrics: ServerMetrics | None = None, *, max_columns_per_table: int = 0,
                 agree_columns: Callable[[str, dict], dict] | None = None):
        self.catalog = catalog
        #: where each request's stage seconds and acknowledged points are counted (GET /metrics)
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.write_buffer = write_buffer
        self.kafka_partitions = kafka_partitions
        self.max_request_bytes = max_request_bytes
        #: most columns (time included) a table may have; 0 = no limit (`--max-columns-per-table`)
        self.max_columns_per_table = max_columns_per_table
        #: returns a WriteBufferOverloaded to raise while backpressure is engaged, else None
        self.overload_check = lambda: None
        #: called with the database first in `_produce`; raises to refuse every write to it
        #: (DatabaseFenced: another server committed a newer revision of its preserved catalog)
        self.database_check = lambda database: None
        #: in an ingester pool: (database, {table: [Column]} new here) -> {table: [Column]} the pool
        #: agreed on (catalog/pool_schema.py); None outside a pool (this process's registry decides)
        self.agree_columns = agree_columns
        #: write_lp's no_sync: producer threads, made at the first such write; requests waiting for Kafka
        self._no_sync_pool = None
        self._no_sync_lock = threading.Lock()
        self._no_sync_slots = threading.BoundedSemaphore(NO_SYNC_MAX_PENDING)

    # -- line protocol -----------------------------------------------------------------
    def write_line_protocol(self, database: str, body: bytes, precision: str = "ns",
                            now_ns: int | None = None, precisions: tuple = PRECISIONS) -> WriteResult:
        """`precisions`: the precisions the caller's API takes (InfluxDB 1.x's /write adds m and h)."""
        validate_database_name(database)
        if len(body) > self.max_request_bytes:
            raise RequestTooLarge(len(body), self.max_request_bytes)
        precision = precision or "ns"
        if precision not in precisions:
            raise InvalidArgument(f"precision must be one of {', '.join(precisions)}, got {precision!r}")
        t0 = time.perf_counter()
        result = parse_lines(body, precision, now_ns if now_ns is not None else time.time_ns())
        parse_s = time.perf_counter() - t0
        self.metrics.observe_stage("parse", parse_s)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("parsed %d lines in %.2f ms", result.lines, parse_s * 1e3)
        if result.errors:
            errs = [(e.line_number, e.reason) for e in result.errors[:MAX_REPORTED_BAD_LINES]]
            raise BadLines(errs, len(result.errors))
        batches = {name: ([Column(c.name, c.role, c.type) for c in tb.columns], tb.data, tb.unique_keys)
                   for name, tb in result.tables.items()}
        self._check_retention(database, batches, body, precision)
        return self._produce(database, batches, result.lines)

    def write_lp_v3(self, database: str, body: bytes, precision: str | None = "auto", accept_partial: bool = True,
                    no_sync: bool = False, now_ns: int | None = None) -> tuple:
        """`POST /api/v3/write_lp` (server/write/lp_v3.py): (WriteResult, [RejectedLine] left out).
        Without `accept_partial` a line that cannot be written raises LinesRejected (nothing
        written); so does a request none of whose lines can be. `no_sync`: answered once the
        request is handed to the producer, before Kafka acknowledged it (`_produce`); its token is
        then empty."""
        from iox_spark.server.errors import LinesRejected
        from iox_spark.server.write import lp_v3

        validate_database_name(database)
        if len(body) > self.max_request_bytes:
            raise RequestTooLarge(len(body), self.max_request_bytes)
        try:
            unit = lp_v3.parse_precision(precision)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        now_ns = now_ns if now_ns is not None else time.time_ns()
        t0 = time.perf_counter()
        result = parse_lines(body, unit or "ns", now_ns)
        self.metrics.observe_stage("parse", time.perf_counter() - t0)
        conflict = None
        if not result.errors:
            try:
                return self._write_v3_batches(database, result, unit, no_sync), []
            except SchemaConflict as e:
                conflict = e
        # some line cannot be written: which ones, line by line as InfluxDB 3 decides (the table's
        # types first, then the request's earlier lines')
        rejected = self._lines_rejected(database, body, unit, now_ns)
        if not rejected:  # the conflict came and went (another writer's types): as it is
            if conflict is not None:
                raise conflict
            raise BadLines([(e.line_number, e.reason) for e in result.errors[:MAX_REPORTED_BAD_LINES]],
                           len(result.errors))
        lines = [r for r, _span in rejected]
        if not accept_partial:
            raise LinesRejected(lines[:MAX_REPORTED_BAD_LINES], len(lines), written=False)
        result = parse_lines(lp_v3.blank_lines(body, [span for _r, span in rejected]), unit or "ns", now_ns)
        if result.errors:  # lines that parse alone and agree in type parse together
            raise BadLines([(e.line_number, e.reason) for e in result.errors[:MAX_REPORTED_BAD_LINES]],
                           len(result.errors))
        if not result.tables:
            raise LinesRejected(lines[:MAX_REPORTED_BAD_LINES], len(lines), written=False)
        return self._write_v3_batches(database, result, unit, no_sync), lines

    def _write_v3_batches(self, database: str, result, unit: str | None, no_sync: bool) -> WriteResult:
        from iox_spark.server.write.lp_v3 import guess_units

        batches = {}
        for name, tb in result.tables.items():
            data, unique = tb.data, tb.unique_keys
            if unit is None:  # auto: each timestamp's unit from its magnitude
                i = data.schema.get_field_index(_TIME)
                data = data.set_column(i, _TIME, guess_units(data.column(i).combine_chunks()))
                unique = unique_keys(data, [c.name for c in tb.columns if c.role == "tag"])
            batches[name] = ([Column(c.name, c.role, c.type) for c in tb.columns], data, unique)
        self._check_retention(database, batches)
        return self._produce(database, batches, result.lines, wait=not no_sync)

    def _lines_rejected(self, database: str, body: bytes, unit: str | None, now_ns: int) -> list:
        """[(RejectedLine, span)] of the lines of `body` that cannot be written, in order: a line
        that does not parse, or one writing a column with another type than the table's (as this
        server knows it) or than an earlier line of the request that can be written."""
        from iox_spark.server.write import lp_v3
        from iox_spark.server.write.line_protocol import numbered_lines

        db = self.catalog.peek_database(database)
        seen: dict = {}  # (table, column) -> (role, type) of the first line written that has it
        out = []
        for n, start, stop in numbered_lines(body):
            one = parse_lines(body[start:stop], unit or "ns", now_ns)
            bad = one.errors[0].reason if one.errors else None
            for table, tb in one.tables.items():
                if bad:
                    break
                schema = db.schemas.get(table) if db is not None else None
                for c in tb.columns:
                    have = schema.get(c.name) if schema is not None and c.role != "time" else None
                    expected = (have.role, have.type) if have is not None else seen.get((table, c.name))
                    if c.role != "time" and expected is not None and expected != (c.role, c.type):
                        bad = lp_v3.type_conflict_message(c.name, expected, (c.role, c.type))
                        break
            if bad:
                out.append((lp_v3.RejectedLine(n, lp_v3.line_text(body, start, stop), bad), (start, stop)))
                continue
            for table, tb in one.tables.items():
                for c in tb.columns:
                    seen.setdefault((table, c.name), (c.role, c.type))
        return out

    # -- Arrow -------------------------------------------------------------------------
    def write_arrow(self, database: str, tables: list[ArrowTableWrite]) -> WriteResult:
        """Validates Arrow IPC streams per table (see proto/iox/write.proto) and produces them."""
        validate_database_name(database)
        size = sum(len(t.arrow_ipc) for t in tables)
        if size > self.max_request_bytes:
            raise RequestTooLarge(size, self.max_request_bytes)
        seen = set()
        for t in tables:
            _check_name(t.table, "table name", t.table)
            if t.table in seen:
                raise InvalidArgument(f"table {t.table!r} appears more than once in the request")
            seen.add(t.table)
        batches = {}
        decoded_bytes = 0
        t0 = time.perf_counter()
        for t in tables:
            data, size = self._decode_ipc(t, self.max_request_bytes - decoded_bytes)
            decoded_bytes += size
            cols, out = _validate_arrow_table(t.table, data, t.roles)
            if out.num_rows:
                batches[t.table] = (cols, out, unique_keys(out, [c.name for c in cols if c.role == "tag"]))
        self.metrics.observe_stage("decode", time.perf_counter() - t0)
        self._check_retention(database, batches)
        return self._produce(database, batches, sum(b[1].num_rows for b in batches.values()))

    def _decode_ipc(self, t: ArrowTableWrite, budget: int) -> tuple[pa.Table, int]:
        """The IPC stream as a table, and its size (dictionaries expanded). Before any batch is decoded its messages are read one by one
        (metadata only, no buffer built) and the stream's size after decompression counted
        (`ipc_decoded_size`); then, batch by batch, a dictionary-encoded column counts as the size
        of its values once expanded (the string cast that follows). Past the budget:
        DecompressedRequestTooLarge (RESOURCE_EXHAUSTED), nothing more is built. A stream that is not
        valid Arrow once read (strings that are not UTF-8 among them) is InvalidArgument."""
        limit = self.max_request_bytes
        try:
            if ipc_decoded_size(t.arrow_ipc, budget) > budget:
                raise DecompressedRequestTooLarge(limit, "Arrow IPC")
            reader = pa.ipc.open_stream(pa.py_buffer(t.arrow_ipc))
            batches = []
            used = 0
            for b in reader:
                # Arrow reads a stream without checking it: offsets or dictionary indices out of
                # range would crash the compute functions below (and text that is not UTF-8, in a
                # value or a dictionary, would be stored, then fail whoever reads it)
                b.validate(full=True)
                used += expanded_nbytes(b)
                if used > budget:
                    raise DecompressedRequestTooLarge(limit, "Arrow IPC")
                batches.append(b)
            return pa.Table.from_batches(batches, schema=reader.schema), used
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowIndexError,
                pa.ArrowKeyError, OSError, UnicodeDecodeError, _BadMessage) as e:  # a name that is not UTF-8
            raise InvalidArgument(f"table {t.table!r}: arrow_ipc is not a readable Arrow IPC stream: {e}") from None

    def _check_retention(self, database: str, batches: dict, body: bytes | None = None,
                         precision: str = "ns") -> None:
        """Rejects the whole request when a point is older than the database's retention allows
        (server/write/retention_check.py)."""
        db = self.catalog.peek_database(database)
        if db is not None and db.retention_period_s:
            from iox_spark.server.write.retention_check import check_retention

            check_retention(database, db.retention_period_s, batches, time.time(), body, precision)

    # -- the one path to the write buffer ----------------------------------------------
    def _produce(self, database: str, batches: dict, points: int, wait: bool = True) -> WriteResult:
        """batches: {table: ([Column], pa.Table, unique_keys)} already validated row by row;
        unique_keys: True when no two rows share a tag set and a time (None: unknown).
        `wait=False` (write_lp's no_sync): every check runs, then the produce is handed to a
        background thread and the result (an empty token) returned at once; a produce that then
        fails is logged and counted (iox_write_no_sync_failed_points_total): those points are lost."""
        t_start = time.perf_counter()
        self.database_check(database)
        overloaded = self.overload_check()
        if overloaded is not None:
            raise overloaded
        if not batches:
            raise InvalidArgument("the request holds no points")
        for name, (cols, data, _unique) in batches.items():
            for c in cols:
                if c.role != "time" and c.name in RESERVED_COLUMNS:
                    raise InvalidArgument(f"table {name!r}: column name {c.name!r} is reserved")
            if data.num_rows > MAX_ROWS_PER_TABLE:
                raise InvalidArgument(f"table {name!r}: {data.num_rows} rows in one request, "
                                      f"at most {MAX_ROWS_PER_TABLE} per table")
        topic = self.write_buffer.ensure_topic(database)
        db = self.catalog.ensure_database(database, topic, self.kafka_partitions)
        if db.topic_id is None:
            db.adopt_topic_id(self.write_buffer.topic_id(topic))
        columns = {name: cols for name, (cols, _data, _u) in batches.items()}
        try:
            if self.agree_columns is not None:  # the pool's types of the columns new here
                new = db.schemas.unknown_columns(columns)
                for table, cols in (self.agree_columns(database, new) if new else {}).items():
                    asked = {c.name: c for c in new[table]}
                    for c in cols:
                        if (c.role, c.type) != (asked[c.name].role, asked[c.name].type):
                            db.schemas.merge(table, [c])  # another member's came first: known here from now on
                            raise SchemaConflict(table, c.name, c.kind, asked[c.name].kind)
            db.schemas.check_and_reserve(columns, self.max_columns_per_table)
        except ColumnTypeConflict as e:
            raise SchemaConflict(e.table, e.column, e.existing, e.new) from None
        except ColumnLimitExceeded as e:
            raise TooManyColumns(e) from None
        t_encode = time.perf_counter()
        self.metrics.observe_stage("checks", t_encode - t_start)
        writes = [encode_write(name, cols, data, unique) for name, (cols, data, unique) in batches.items()]
        t_produce = time.perf_counter()
        self.metrics.observe_stage("encode", t_produce - t_encode)
        if not wait:
            self._produce_later(database, writes, points)
            self.metrics.acknowledged(points)
            return WriteResult(token={}, points=points, topic=topic)
        token = self.write_buffer.produce(database, writes)
        t_end = time.perf_counter()
        self.metrics.observe_stage("produce", t_end - t_produce)
        self.metrics.acknowledged(points)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("write to %s: %d points, %d message(s); checks %.2f ms, encode %.2f ms, produce %.2f ms",
                      database, points, len(writes), (t_encode - t_start) * 1e3, (t_produce - t_encode) * 1e3,
                      (t_end - t_produce) * 1e3)
        return WriteResult(token=token, points=points, topic=topic)


    def _produce_later(self, database: str, writes: list, points: int) -> None:
        """Hands `writes` to the no_sync producer threads; waits only while NO_SYNC_MAX_PENDING
        requests are already waiting for Kafka (backpressure)."""
        import concurrent.futures

        with self._no_sync_lock:
            if self._no_sync_pool is None:
                self._no_sync_pool = concurrent.futures.ThreadPoolExecutor(NO_SYNC_THREADS, "write-no-sync")
        self._no_sync_slots.acquire()

        def run():
            try:
                self.write_buffer.produce(database, writes)
            except Exception as e:  # noqa: BLE001 - acknowledged already: all that is left is to say so
                log.error("a no_sync write of %d point(s) to %s was not acknowledged by Kafka and is lost: %s",
                          points, database, e)
                self.metrics.no_sync_failed(points)
            finally:
                self._no_sync_slots.release()

        self._no_sync_pool.submit(run)

    def close(self) -> None:
        """Waits for the no_sync writes handed to the producer threads (server stop)."""
        pool, self._no_sync_pool = self._no_sync_pool, None
        if pool is not None:
            pool.shutdown(wait=True)


# -- Arrow IPC sizes (pure) -------------------------------------------------------------

class _BadMessage(ValueError):
    """An IPC message whose metadata does not describe its body."""


def _fb_table(buf: bytes, pos: int) -> tuple[int, int, int]:
    """A flatbuffer table at `pos`: (pos, vtable position, vtable size)."""
    vt = pos - struct.unpack_from("<i", buf, pos)[0]
    return pos, vt, struct.unpack_from("<H", buf, vt)[0]


def _fb_field(buf: bytes, table: tuple, index: int) -> int | None:
    """The position of field `index` of `table`, None when absent."""
    pos, vt, vt_size = table
    at = 4 + 2 * index
    if at + 2 > vt_size:
        return None
    off = struct.unpack_from("<H", buf, vt + at)[0]
    return pos + off if off else None


def _fb_ref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


#: Arrow's MessageHeader union: DictionaryBatch, RecordBatch
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3


def _message_body_size(meta: bytes, body) -> int:
    """Bytes the record batch or dictionary batch of an IPC message takes once its buffers are
    decompressed, read from the message's metadata (Arrow's Message.fbs) and each compressed
    buffer's length prefix; no buffer is built. 0 for other messages (the schema)."""
    try:
        msg = _fb_table(meta, _fb_ref(meta, 0))
        kind_at = _fb_field(meta, msg, 1)
        kind = meta[kind_at] if kind_at is not None else 0
        header_at = _fb_field(meta, msg, 2)
        if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or header_at is None:
            return 0
        header = _fb_table(meta, _fb_ref(meta, header_at))
        if kind == _DICTIONARY_BATCH:
            data_at = _fb_field(meta, header, 1)
            if data_at is None:
                return 0
            header = _fb_table(meta, _fb_ref(meta, data_at))
        buffers_at = _fb_field(meta, header, 2)
        compressed = _fb_field(meta, header, 3) is not None
        if buffers_at is None:
            return 0
        vec = _fb_ref(meta, buffers_at)
        n = struct.unpack_from("<I", meta, vec)[0]
        if n > (len(meta) - vec) // 16:
            raise _BadMessage(f"{n} buffers in a message of {len(meta)} bytes")
        total = 0
        for i in range(n):
            offset, length = struct.unpack_from("<qq", meta, vec + 4 + 16 * i)
            if offset < 0 or length < 0 or offset + length > body.size:
                raise _BadMessage("a buffer lies outside the message body")
            if compressed and length >= 8:
                raw = struct.unpack_from("<q", body[offset:offset + 8].to_pybytes())[0]
                total += length - 8 if raw == -1 else raw
                if raw < -1:
                    raise _BadMessage("a negative uncompressed buffer length")
            else:
                total += length
        return total
    except (struct.error, IndexError) as e:
        raise _BadMessage(f"unreadable message metadata: {e}") from None


def ipc_decoded_size(data: bytes, budget: int) -> int:
    """The bytes an Arrow IPC stream's batches take once decompressed, counted message by message
    from their metadata; stops counting (returns what it has) as soon as it passes `budget`."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
    total = 0
    while total <= budget:
        try:
            m = reader.read_next_message()
        except StopIteration:
            break
        total += _message_body_size(m.metadata.to_pybytes(), m.body) if m.body is not None else 0
    return total


def expanded_nbytes(batch: pa.RecordBatch) -> int:
    """The bytes of `batch` with each dictionary-encoded column counted as its values expanded
    (the dictionary's values taken once per index, as a cast to the value type builds them)."""
    total = 0
    for col in batch.columns:
        if pa.types.is_dictionary(col.type):
            total += col.indices.nbytes
            if len(col) and (pa.types.is_string(col.type.value_type) or pa.types.is_binary(col.type.value_type)
                             or pa.types.is_large_string(col.type.value_type)):
                lengths = pc.binary_length(col.dictionary)
                per_row = pc.take(lengths, col.indices)
                total += (pc.sum(per_row).as_py() or 0) + 4 * len(col)
            else:
                total += col.dictionary.nbytes // max(1, len(col.dictionary)) * len(col)
        else:
            total += col.nbytes
    return total


# -- Arrow validation (pure) -----------------------------------------------------------

def unique_keys(data: pa.Table, tags: list) -> bool:
    """Whether no two rows of `data` (write-buffer layout) share their tag values and `time`."""
    if data.num_rows < 2:
        return True
    t = data.column(_TIME)
    if pc.all(pc.greater(t.slice(1), t.slice(0, len(t) - 1))).as_py():
        return True  # strictly increasing times: no key can repeat
    groups = data.group_by(list(tags) + [_TIME], use_threads=False).aggregate([])
    return groups.num_rows == data.num_rows


def _check_name(name: str, what: str, table: str) -> None:
    where = "" if what == "table name" else f"table {table!r}: "
    if not name:
        raise InvalidArgument(f"{where}{what} must not be empty")
    if "\x00" in name:
        raise InvalidArgument(f"{where}{what} {name!r} contains a NUL character")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidArgument(f"{where}{what} {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes")


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _as_text(table: str, col: str, a: pa.ChunkedArray, what: str) -> pa.ChunkedArray | None:
    """A string-like column as pa.string(); None when it is not string-like."""
    t = a.type
    if pa.types.is_dictionary(t) and _is_text(t.value_type):
        a = a.cast(t.value_type)
        t = a.type
    if not _is_text(t):
        return None
    if t != pa.string():
        try:
            a = a.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidArgument(f"table {table!r} {what} {col!r}: {e}") from None
    return a


def _first_true(mask) -> int:
    return pc.index(mask, pa.scalar(True)).as_py()


def _check_text_values(table: str, col: str, a: pa.ChunkedArray, what: str) -> None:
    if len(a) and a.null_count < len(a):
        longest = pc.max(pc.binary_length(a)).as_py()
        if longest is not None and longest > MAX_NAME_BYTES:
            raise InvalidArgument(f"table {table!r} {what} {col!r}: a value is longer than {MAX_NAME_BYTES} bytes")


_FIELD_TYPES = {pa.float64(): "float", pa.int64(): "integer", pa.uint64(): "uinteger", pa.bool_(): "boolean"}


def _time_ns(table: str, col: str, a: pa.ChunkedArray) -> pa.ChunkedArray:
    t = a.type
    if t == pa.int64():
        ns = a
    elif pa.types.is_timestamp(t):
        raw = a.cast(pa.int64())
        factor = _NS_PER_UNIT[t.unit]
        if factor == 1:
            ns = raw
        else:
            try:
                ns = pc.multiply_checked(raw, pa.scalar(factor, pa.int64()))
            except pa.ArrowInvalid:
                raise InvalidArgument(f"table {table!r} time column {col!r}: a timestamp[{t.unit}] value does "
                                      f"not fit int64 nanoseconds") from None
    else:
        raise InvalidArgument(f"table {table!r} time column {col!r} has Arrow type {t}; expected int64 "
                              f"nanoseconds or a timestamp")
    if ns.null_count:
        raise InvalidArgument(f"table {table!r} time column {col!r}: row {_first_true(pc.is_null(ns))} is null; "
                              f"every row needs a time")
    return ns


def _validate_arrow_table(table: str, data: pa.Table, roles: list) -> tuple[list[Column], pa.Table]:
    """Checks one table of an Arrow write; returns (columns, rows in the write-buffer layout)."""
    names = data.column_names
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InvalidArgument(f"table {table!r}: duplicate column name(s) {dup}")
    role_of: dict = {}
    for name, role in roles:
        if name in role_of:
            raise InvalidArgument(f"table {table!r}: column {name!r} has more than one role")
        if role not in ARROW_ROLES:
            raise InvalidArgument(f"table {table!r} column {name!r}: role must be one of tag, field, time, "
                                  f"got {role!r}")
        if name not in names:
            raise InvalidArgument(f"table {table!r}: a role is given for column {name!r}, "
                                  f"which the Arrow data does not have")
        role_of[name] = role
    missing = [n for n in names if n not in role_of]
    if missing:
        raise InvalidArgument(f"table {table!r}: column(s) {missing} have no role (tag, field or time)")
    time_cols = [n for n in names if role_of[n] == "time"]
    if len(time_cols) != 1:
        raise InvalidArgument(f"table {table!r}: exactly one time column is required, got {len(time_cols)}"
                              + (f" ({time_cols})" if time_cols else ""))
    cols: list[Column] = []
    arrays: list = []
    out_names: list = []
    field_arrays: list = []
    for name in names:
        role = role_of[name]
        if role == "time":
            continue
        _check_name(name, f"{role} name", table)
        if name == _TIME:
            raise InvalidArgument(f"table {table!r}: a {role} must not be called 'time' "
                                  f"(the time column is given by its role)")
        if name in RESERVED_COLUMNS:
            raise InvalidArgument(f"table {table!r}: column name {name!r} is reserved")
        a = data.column(name)
        if role == "tag":
            s = _as_text(table, name, a, "tag")
            if s is None:
                raise InvalidArgument(f"table {table!r} tag {name!r} has Arrow type {a.type}; tags must be strings")
            if len(s) and pc.any(pc.equal(s, "")).as_py():
                raise InvalidArgument(f"table {table!r} tag {name!r}: row {_first_true(pc.equal(s, ''))} is an "
                                      f"empty string (a missing tag is null)")
            _check_text_values(table, name, s, "tag")
            cols.append(Column(name, "tag", "string"))
            arrays.append(s)
        else:
            typ = _FIELD_TYPES.get(a.type)
            if typ is None:
                s = _as_text(table, name, a, "field")
                if s is None:
                    raise InvalidArgument(f"table {table!r} field {name!r} has Arrow type {a.type}; fields must "
                                          f"be float64, int64, uint64, string or bool")
                _check_text_values(table, name, s, "field")
                a, typ = s, "string"
            elif typ == "float" and len(a) and pc.any(pc.is_nan(a)).as_py():
                raise InvalidArgument(f"table {table!r} field {name!r}: row {_first_true(pc.is_nan(a))} is NaN")
            cols.append(Column(name, "field", typ))
            arrays.append(a)
            field_arrays.append(a)
        out_names.append(name)
    if not field_arrays:
        raise InvalidArgument(f"table {table!r}: at least one field column is required")
    if data.num_rows and any(a.null_count for a in field_arrays):
        no_fields = pc.is_null(field_arrays[0])
        for a in field_arrays[1:]:
            no_fields = pc.and_(no_fields, pc.is_null(a))
        if pc.any(no_fields).as_py():
            raise InvalidArgument(f"table {table!r}: row {_first_true(no_fields)} has no field values")
    arrays.append(_time_ns(table, time_cols[0], data.column(time_cols[0])))
    out_names.append(_TIME)
    cols.append(_TIME_COLUMN)
    return cols, pa.Table.from_arrays(arrays, names=out_names)
