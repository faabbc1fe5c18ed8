"""The write buffer's tail: acknowledged writes Spark has not applied yet, queryable at once.

A write becomes part of the catalog when the Spark micro-batch holding it is
applied (`applied_hi_inclusive`): one micro-batch cycle or more, seconds under
load. IOx's ingester answers queries from its buffer as soon as it has read a
write; the tail does the same here. It keeps, per Kafka partition, the messages
past the applied watermark until the consumer (server/consume/ingest.py) has applied
them. The query engine (server/query/engine.py) reads a table's tail rows next to its
chunks, so a query reflects `visible_hi_inclusive`, not only what Spark has
applied.

Where the messages come from: this server's own are handed over by the write
buffer as Kafka acknowledges them (`feed`, in the request's thread: the bytes
the router produced, never read back). Everything else (another producer's
messages, ours that arrived out of order or while the partition could not take
them) is read from `next_offset` by a Kafka consumer of the tail's own thread,
only when needed: a partition with a missing offset for GAP_WAIT_S, every
partition for FOREIGN_CHECK_WINDOW_S every FOREIGN_CHECK_INTERVAL_S (other
producers' messages at the end of a partition), and a partition that starts
or restarts. Reading every message back from the broker cost Tansu as much as
the consumer's own reading and the server a decompression of each write.

Invariants:
- Per Kafka partition, `visible_hi_inclusive` >= `applied_hi_inclusive`, and
  every message at an offset in (applied, visible] is held exactly as the
  consumer will apply it: a write's rows with `_iox_seq` from its offset; a
  delete with its sequence; a transaction part once the first decision or
  marker of its transaction after it on its partition commits it, at that
  message's offset (dropped on an abort, invisible while undecided); a message
  the consumer skips (`wire_format.header_problem`, a delete value that does not
  parse) is skipped the same way; a write whose payload does not decode yields
  no rows, as the consumer skips it.
- Messages are taken in offset order only, from either source; a handed-over
  message past `next_offset` waits (`early`) until the offsets before it are
  taken, one taken already is ignored, so each offset is held once and
  `visible_hi_inclusive` never passes an offset the tail has not seen.
- The tail stops a partition before a message it cannot hold as the consumer
  will apply it: a format version this server does not know, a decision or
  marker for a part the tail does not hold (read by an earlier micro-batch, in
  the consumer's stash), or a message past `max_bytes` of held payloads. It
  reads that partition again from the next unapplied offset once the consumer
  has applied the message (so it also skips ahead whenever the consumer is
  ahead of it); after a block for `max_bytes`, only once what it dropped is
  small (RESUME_BACKLOG_SHARE).
- A Kafka partition held at a poisoned message (server/write_buffer/poison.py) is not followed
  (and shows its applied watermark only) until the message is retried or accepted.
- Held messages are dropped once applied; `cut`, called under the catalog lock,
  returns the messages past the applied watermarks read under that same lock,
  so the chunks, the deletes and the applied watermark read with it never miss
  an offset the cut leaves out (the tail trims only at watermarks read before).

When it runs: `start` launches the thread when the server starts; it holds
nothing while the server replays the write buffer after a restart
(`is_replaying`), then follows every database of the catalog. `stop` ends it
at shutdown. `feed` runs in the router's request threads. Driver side, in the
server's own process; nothing here runs on executors or is pickled.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.transactions import COMMIT, DECISION, MARKER, PART

from iox_spark.server.config import DEFAULT_TAIL_MAX_BYTES
from iox_spark.server.consume.ingest import decode_delete
from iox_spark.server.write_buffer.wire_format import SUPPORTED_FORMATS, header_problem, header_text

__all__ = ["WriteBufferTail", "TailWrite", "TailCut", "PartitionTail", "DEFAULT_TAIL_MAX_BYTES"]

log = logging.getLogger(__name__)

#: How long one poll of the tail's consumer waits for messages (the loop also trims and follows databases).
_POLL_TIMEOUT_S = 0.02
#: librdkafka's prefetch queue of the tail's consumer (kilobytes), on top of what the tail holds.
_QUEUED_MAX_KBYTES = 32 * 1024
#: Acknowledged messages of this server a partition keeps while an offset before them is missing.
MAX_EARLY = 10_000
#: How long a partition waits for a missing offset before it reads it from Kafka (another producer's
#: message, or one of ours whose acknowledgement reached its request thread late).
GAP_WAIT_S = 0.1
#: How often a partition the router keeps current is read from Kafka anyway, for other producers'
#: messages at its end (this server only learns of its own writes), and for how long.
FOREIGN_CHECK_INTERVAL_S = 1.0
FOREIGN_CHECK_WINDOW_S = 0.1
#: A partition blocked because the tail was full is read from Kafka again only once this server's
#: messages it dropped past the applied watermark are at most 1/RESUME_BACKLOG_SHARE of the budget
#: left. Reading back a backlog the size of the whole budget (256 MiB by default: Tansu serving it,
#: the server's consumer decompressing and taking it) delayed acknowledgements by tens of
#: milliseconds in one burst under the bench's ack load; the consumer is about to apply it anyway.
RESUME_BACKLOG_SHARE = 8


@dataclass(frozen=True)
class TailWrite:
    """One table's rows of one write held by the tail, as the consumer will apply them."""

    #: the offset it is applied at (a committed transaction part: its decision's or marker's)
    offset: int
    table: str
    #: the Arrow IPC stream as written (decoded only by a query that reads the table)
    payload: bytes
    #: [[name, role, type], ...] from iox-schema
    columns: tuple
    #: ((min_ns, max_ns), ...) per UTC day of its rows (iox-days)
    spans: tuple
    #: the writer knew no two rows share a tag set and a time (iox-unique)
    unique: bool


@dataclass(frozen=True)
class TailCut:
    """What a query adds to the chunks it read under the catalog lock, for one database."""

    #: per Kafka partition, the offset the query reflects (>= applied_hi_inclusive)
    visible_hi_inclusive: dict
    #: table -> its writes past the applied watermark, in write-buffer order
    writes: dict
    #: deletes past the applied watermark, in write-buffer order (any table; `Delete.applies_to` filters)
    deletes: list


@dataclass
class PartitionTail:
    """One Kafka partition's tail. Pure state machine: `take` one message, `trim` at the applied
    watermark; the caller locks. Offsets of `items` are the offsets their messages apply at."""

    #: the database's seq origin (catalog/seq_layout.py): deletes' seqs are computed from it
    seq_origin: int
    #: next offset to read
    next_offset: int
    #: every offset up to it is held (or applied)
    visible_hi: int
    #: [(offset applied at, TailWrite | Delete)] in offset order
    items: list = field(default_factory=list)
    #: transaction id -> [(part offset, kind "write" | "delete", TailWrite | raw delete value)] read, undecided
    pending: dict = field(default_factory=dict)
    #: offset of a message the tail cannot hold yet: nothing after it is read until it is applied
    blocked_at: int | None = None
    #: payload bytes held (items and pending parts)
    nbytes: int = 0
    #: offset -> (headers, value): this server's acknowledged messages past `next_offset`, waiting for
    #: the offsets before them (`offer`); not held yet, not counted in `nbytes`
    early: dict = field(default_factory=dict)
    #: when `early` last became non-empty (the caller's clock): a gap that old is read from Kafka
    gap_since: float | None = None
    #: blocked because the tail's byte budget was spent (not for what a message is)
    full: bool = False
    #: [(offset, bytes)] of this server's messages offered while full: what reading the partition
    #: again from Kafka would cost
    dropped: list = field(default_factory=list)

    @classmethod
    def starting_after(cls, applied_hi_inclusive: int, seq_origin: int) -> "PartitionTail":
        return cls(seq_origin=seq_origin, next_offset=applied_hi_inclusive + 1, visible_hi=applied_hi_inclusive)

    def take(self, offset: int, headers: dict, value: bytes, kp: int, room_bytes: int) -> None:
        """Applies the message at `offset` read from Kafka: holds it, skips it, or blocks at it.
        Messages must come in offset order; an earlier offset is ignored, a gap blocks (nothing is
        claimed unseen). Then takes the `early` messages that follow it. `room_bytes`: payload bytes
        the tail may still take."""
        held_before = self.nbytes
        self._take_one(offset, headers, value, kp, room_bytes)
        self._take_early(kp, room_bytes - (self.nbytes - held_before))

    def offer(self, offset: int, headers: dict, value: bytes, kp: int, room_bytes: int, now: float) -> None:
        """A message this server produced and Kafka acknowledged at `offset`, exactly as it is in
        Kafka. Taken at once when it is the next offset; kept in `early` (at most MAX_EARLY) while an
        offset before it is missing: another producer's message or one of ours whose acknowledgement
        is still on its way, read from Kafka if the gap stays (`gap_since`); ignored when the
        offset was taken already; dropped while blocked (read from Kafka after it)."""
        if self.blocked_at is not None:
            if self.full and offset >= self.blocked_at:
                self.dropped.append((offset, len(value)))
            return
        if offset < self.next_offset or offset in self.early:
            return
        if offset > self.next_offset:
            if len(self.early) < MAX_EARLY:
                if not self.early:
                    self.gap_since = now
                self.early[offset] = (headers, value)
            return
        self.take(offset, headers, value, kp, room_bytes)

    def _take_early(self, kp: int, room_bytes: int) -> None:
        if not self.early:
            return
        for o in [o for o in self.early if o < self.next_offset]:
            del self.early[o]
        while self.blocked_at is None and self.next_offset in self.early:
            headers, value = self.early.pop(self.next_offset)
            held_before = self.nbytes
            self._take_one(self.next_offset, headers, value, kp, room_bytes)
            room_bytes -= self.nbytes - held_before
        if not self.early or self.blocked_at is not None:
            self.early, self.gap_since = {}, None

    def _take_one(self, offset: int, headers: dict, value: bytes, kp: int, room_bytes: int) -> None:
        if offset < self.next_offset or self.blocked_at is not None:
            return
        if offset > self.next_offset:
            self._block(self.next_offset)
            return
        self.next_offset = offset + 1
        fmt = header_text(headers, "iox-format")
        kind = header_text(headers, "iox-kind")
        if fmt and fmt not in SUPPORTED_FORMATS:
            self._block(offset)  # the consumer stops there: a newer server's message
            return
        info_text = header_text(headers, "iox-txn-info")
        if header_problem(fmt, kind, header_text(headers, "iox-table"), header_text(headers, "iox-schema"),
                          header_text(headers, "iox-days"), header_text(headers, "iox-txn"), info_text):
            self.visible_hi = offset  # the consumer skips it
            return
        if kind in (DECISION, MARKER):
            self._decide(offset, kind, header_text(headers, "iox-txn"), json.loads(info_text), kp)
            return
        held = kind if kind != PART else json.loads(info_text)["of"]
        if held == "write" and len(value) > room_bytes:
            self._block(offset, full=True)
            self.dropped.append((offset, len(value)))
            return
        if kind == PART:  # undecided: invisible, as in the consumer's stash
            self.pending.setdefault(header_text(headers, "iox-txn"), []).append(
                (offset, held, _tail_write(offset, headers, value) if held == "write" else value))
            self.nbytes += len(value)
        elif held == "write":
            self.items.append((offset, _tail_write(offset, headers, value)))
            self.nbytes += len(value)
        else:
            try:
                self.items.append((offset, decode_delete(value, self.seq_origin, offset, kp)))
            except (ValueError, KeyError, TypeError):
                pass  # the consumer skips a delete whose value is not one
            except Exception:  # the consumer fails on it too (server/write_buffer/poison.py): not held as if applied
                self._block(offset)
                return
        self.visible_hi = offset

    def _decide(self, offset: int, kind: str, txn: str, info: dict, kp: int) -> None:
        """A decision or marker at `offset`: the fate of this partition's parts of `txn` before it."""
        parts = self.pending.pop(txn, None)
        if parts is None:
            if kind == MARKER or any(p_kp == kp for p_kp, _off in info["parts"]):
                self._block(offset)  # its part was read before the tail's start: the consumer holds it
                return
            self.visible_hi = offset  # a decision with no part on this partition
            return
        for _part_offset, held, item in parts:
            if held == "write":
                if info["decision"] == COMMIT:
                    self.items.append((offset, _at_offset(item, offset)))
                else:
                    self.nbytes -= len(item.payload)
                continue
            self.nbytes -= len(item)
            if info["decision"] == COMMIT:
                try:
                    self.items.append((offset, decode_delete(item, self.seq_origin, offset, kp)))
                except (ValueError, KeyError, TypeError):
                    pass  # the consumer skips it
                except Exception:  # the consumer fails on it too: nothing at this offset is held
                    self.nbytes -= sum(_size(it) for o, it in self.items if o == offset)
                    self.items = [(o, it) for o, it in self.items if o != offset]
                    self._block(offset)
                    return
        self.visible_hi = offset

    def _block(self, offset: int, full: bool = False) -> None:
        self.blocked_at = offset
        self.next_offset = offset
        self.early, self.gap_since = {}, None
        self.full = full

    def trim(self, applied_hi_inclusive: int, room_bytes: int | None = None) -> bool:
        """Drops what the consumer applied. True when the partition must be read again from
        `next_offset` (it was blocked at an applied message, or the consumer is ahead of it):
        it then starts afresh after the applied watermark. A partition blocked because the tail
        was full stays blocked, at the next unapplied offset, while this server's messages
        after the applied watermark (`dropped`) are more than 1/RESUME_BACKLOG_SHARE of
        `room_bytes` (the budget left with this partition's bytes freed): the consumer is still
        far behind, and reading all of it from Kafka again would cost a burst of reading (and
        fill the tail again) for what the consumer applies soon."""
        applied = applied_hi_inclusive
        if self.blocked_at is not None and applied >= self.blocked_at or applied >= self.next_offset:
            self.items, self.pending, self.nbytes = [], {}, 0
            self.visible_hi = applied
            self.early, self.gap_since = {}, None  # read again from Kafka with the rest
            self.dropped = [(o, n) for o, n in self.dropped if o > applied]
            backlog = sum(n for _o, n in self.dropped)
            if self.full and room_bytes is not None and backlog > room_bytes // RESUME_BACKLOG_SHARE:
                self.blocked_at = self.next_offset = applied + 1
                return False
            self.blocked_at, self.full, self.dropped = None, False, []
            self.next_offset = applied + 1
            return True
        if self.items and self.items[0][0] <= applied_hi_inclusive:
            keep = [(o, it) for o, it in self.items if o > applied_hi_inclusive]
            self.nbytes -= sum(_size(it) for o, it in self.items if o <= applied_hi_inclusive)
            self.items = keep
        for txn, parts in list(self.pending.items()):
            left = [p for p in parts if p[0] > applied_hi_inclusive]  # older ones: the consumer's stash
            self.nbytes -= sum(_size(p[2]) for p in parts if p[0] <= applied_hi_inclusive)
            if left:
                self.pending[txn] = left
            else:
                del self.pending[txn]
        return False


def _size(item) -> int:
    if isinstance(item, TailWrite):
        return len(item.payload)
    return len(item) if isinstance(item, (bytes, bytearray)) else 0


def _tail_write(offset: int, headers: dict, value: bytes) -> TailWrite:
    days = json.loads(header_text(headers, "iox-days"))
    return TailWrite(offset=offset, table=header_text(headers, "iox-table"), payload=value,
                     columns=tuple(tuple(c) for c in json.loads(header_text(headers, "iox-schema"))),
                     spans=tuple(sorted((lo, hi) for _n, lo, hi in days.values())),
                     unique=header_text(headers, "iox-unique") == "1")


def _at_offset(w: TailWrite, offset: int) -> TailWrite:
    return TailWrite(offset=offset, table=w.table, payload=w.payload, columns=w.columns, spans=w.spans,
                     unique=w.unique)


class WriteBufferTail:
    """The tail of every database topic (see the module docstring). One per server."""

    def __init__(self, catalog, bootstrap: str, max_bytes: int = DEFAULT_TAIL_MAX_BYTES,
                 is_replaying=lambda: False):
        self.catalog = catalog
        self.bootstrap = bootstrap
        self.max_bytes = max_bytes
        self.is_replaying = is_replaying
        self._lock = threading.Lock()
        #: (topic, kp) -> PartitionTail
        self._parts: dict = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: a partition blocked since the last assignment: stop fetching it
        self._reassign = False
        #: partitions created or restarted by `_sync`: read from Kafka at once
        self._restarted: set = set()
        #: when every partition is next read from Kafka for other producers' messages (monotonic)
        self._next_check_at = 0.0
        self.last_error: str | None = None

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(p.nbytes for p in self._parts.values())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="write-buffer-tail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def cut(self, db, applied_hi_inclusive: dict, tables=None) -> TailCut:
        """The writes of `tables` (None: of every table) and every delete held past `applied_hi_inclusive` (read at
        the same instant as the chunks the query reads), per Kafka partition up to its visible
        offset. Called by the query engine inside `Catalog.query_cut` (the catalog's lock held)."""
        tables = None if tables is None else set(tables)
        visible, writes, deletes = {}, {}, []
        with self._lock:
            held = db.held_offsets()
            for kp in range(db.kafka_partitions):
                applied = applied_hi_inclusive.get(kp, -1)
                pt = self._parts.get((db.topic, kp))
                # a topic replaced under the server: what the tail holds past the applied watermark
                # is gone from Kafka (recorded as lost), never applied: not shown as if it were kept;
                # a partition held at a poisoned message (server/write_buffer/poison.py) shows what is applied only
                if pt is None or pt.visible_hi <= applied or db.topic_replaced or kp in held:
                    visible[kp] = applied
                    continue
                visible[kp] = pt.visible_hi
                for offset, item in pt.items:
                    if offset <= applied:
                        continue
                    if isinstance(item, Delete):
                        deletes.append(item)
                    elif tables is None or item.table in tables:
                        writes.setdefault(item.table, []).append(item)
        deletes.sort(key=lambda d: d.seq)
        return TailCut(visible, writes, deletes)

    def visible(self, db) -> dict:
        """{kp: visible_hi_inclusive} of a database now (at least its applied watermark)."""
        applied, held = db.applied_and_held()
        with self._lock:
            out = {}
            for kp, a in applied.items():
                pt = self._parts.get((db.topic, kp))
                out[kp] = max(a, pt.visible_hi) if pt is not None and not db.topic_replaced and kp not in held else a
            return out

    def forget_topic(self, topic: str) -> None:
        """Drops what the tail holds of `topic` (its write-buffer epoch ended: a new one starts at
        other offsets); `_sync` follows it again from its applied watermarks."""
        with self._lock:
            for key in [k for k in self._parts if k[0] == topic]:
                del self._parts[key]
            self._reassign = True

    # -- this server's acknowledged messages ---------------------------------------------
    def feed(self, topic: str, messages: list) -> None:
        """This server's messages of `topic` that Kafka acknowledged, [(kafka partition, offset,
        headers [(name, bytes)], value)] as produced: held at once, without reading them back from
        Kafka. Called by the write buffer in the thread of the request, after the acknowledgement;
        never raises into it for a message the tail cannot hold (that one is read from Kafka)."""
        now = time.monotonic()
        with self._lock:
            room = self.max_bytes - sum(p.nbytes for p in self._parts.values())
            for kp, offset, headers, value in messages:
                pt = self._parts.get((topic, kp))
                if pt is None:  # a database the tail does not follow yet: read from Kafka once it does
                    continue
                before, was_blocked = pt.nbytes, pt.blocked_at is not None
                pt.offer(offset, dict(headers or []), value or b"", kp, room, now)
                room -= pt.nbytes - before
                if pt.blocked_at is not None and not was_blocked:
                    self._reassign = True

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        from confluent_kafka import KafkaException

        from iox_spark.server.write_buffer.kafka_source import reader_consumer

        consumer = None
        #: (topic, kp) -> when the consumer started reading it (the partitions assigned now)
        reading: dict = {}
        try:
            while not self._stop.is_set():
                if self.is_replaying():
                    self._stop.wait(0.2)
                    continue
                if consumer is None:
                    # a position Kafka no longer holds is an error, never a silent jump ahead
                    consumer = reader_consumer(self.bootstrap, **{"queued.max.messages.kbytes": _QUEUED_MAX_KBYTES,
                                                                  "fetch.wait.max.ms": 10,
                                                                  "auto.offset.reset": "error"})
                    reading = {}
                try:
                    changed = self._sync()
                    want = self._to_read(time.monotonic(), reading)
                    if changed or self._reassign or want.keys() != reading.keys():
                        self._reassign = False
                        consumer.assign(self._assignment(want))
                    reading = want
                    msgs = consumer.consume(500, timeout=_POLL_TIMEOUT_S) if reading else []
                except KafkaException as e:  # the broker away for a moment: try again
                    self.last_error = str(e)
                    self._stop.wait(0.5)
                    continue
                if msgs:
                    self._take(msgs)
                elif not reading:
                    self._stop.wait(_POLL_TIMEOUT_S)
        except Exception as e:  # the tail is an accelerator: queries fall back to the applied watermark
            self.last_error = repr(e)
            log.exception("write-buffer tail stopped; queries reflect the applied watermark only")
            with self._lock:
                self._parts.clear()
        finally:
            if consumer is not None:
                consumer.close()

    def _to_read(self, now: float, reading: dict) -> dict:
        """{(topic, kp): since} of the partitions to read from Kafka now: a partition with a gap
        older than GAP_WAIT_S, every partition for FOREIGN_CHECK_WINDOW_S every
        FOREIGN_CHECK_INTERVAL_S (and at once when it starts or restarts), and one whose read
        started less than FOREIGN_CHECK_WINDOW_S ago; never a blocked one. The rest are kept
        current by `feed`."""
        check = now >= self._next_check_at
        if check:
            self._next_check_at = now + FOREIGN_CHECK_INTERVAL_S
        out = {}
        with self._lock:
            for key, pt in self._parts.items():
                if pt.blocked_at is not None:
                    continue
                since = reading.get(key)
                if since is not None and now - since < FOREIGN_CHECK_WINDOW_S:
                    out[key] = since
                elif check or key in self._restarted or \
                        (pt.gap_since is not None and now - pt.gap_since >= GAP_WAIT_S):
                    out[key] = since if since is not None else now
            self._restarted.clear()
        return out

    def _sync(self) -> bool:
        """Follows new databases and trims at the applied watermarks; True when the consumer's
        assignment must change (a partition to read from a new position)."""
        dbs = [db.tail_state() for db in self.catalog.databases()]
        changed = False
        with self._lock:
            room = self.max_bytes - sum(p.nbytes for p in self._parts.values())
            for topic, seq_origin, applied, held in dbs:
                for kp, a in applied.items():
                    pt = self._parts.get((topic, kp))
                    if kp in held:  # held at a poisoned message: nothing after it is held here either
                        if pt is not None:
                            del self._parts[(topic, kp)]
                            changed = True
                        continue
                    if pt is None:
                        self._parts[(topic, kp)] = PartitionTail.starting_after(a, seq_origin)
                        self._restarted.add((topic, kp))
                        changed = True
                    elif pt.trim(a, room + pt.nbytes):
                        self._restarted.add((topic, kp))
                        changed = True
        return changed

    def _assignment(self, keys) -> list:
        from confluent_kafka import TopicPartition

        with self._lock:
            return [TopicPartition(topic, kp, self._parts[(topic, kp)].next_offset) for topic, kp in sorted(keys)
                    if (topic, kp) in self._parts and self._parts[(topic, kp)].blocked_at is None]

    def _take(self, msgs: list) -> None:
        with self._lock:
            room = self.max_bytes - sum(p.nbytes for p in self._parts.values())
            for m in msgs:
                if m.error() is not None:
                    continue
                pt = self._parts.get((m.topic(), m.partition()))
                if pt is None:
                    continue
                before, was_blocked = pt.nbytes, pt.blocked_at is not None
                pt.take(m.offset(), dict(m.headers() or []), m.value() or b"", m.partition(), room)
                room -= pt.nbytes - before
                if pt.blocked_at is not None and not was_blocked:
                    self._reassign = True
