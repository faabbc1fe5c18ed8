"""The in-memory catalog: database -> table -> partition (UTC day) -> chunks.

Invariants:
- Chunks of a partition are kept in write-buffer order (`Chunk.order`).
- `applied_hi_inclusive[kp]` of a database is the highest Kafka offset whose
  message is fully applied (queryable); it only grows within a write-buffer
  epoch (a database that continues on a new topic starts it again), and every
  offset at or below it is applied (micro-batches, or the parts a failed one is
  applied in, are applied whole, in order), passed as unreadable, or accepted
  as skipped (`PoisonedMessage`).
- All mutation happens under the catalog lock; readers get snapshots.

Runs on the driver only.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from iox_spark.catalog.chunk import Chunk
from iox_spark.catalog.database_snapshot import DatabaseSnapshot, snapshot_of
from iox_spark.catalog.delete_mailbox import DeleteMailbox
from iox_spark.catalog.downsampling import Changes, Progress, changed_spans
from iox_spark.catalog.persistence_windows import DEFAULT_LATE_ARRIVE_WINDOW_S, PersistenceWindows
from iox_spark.catalog.query_pins import QueryPins
from iox_spark.catalog.preserved_catalog import AcceptedPoisonEntry, LostWritesEntry, RecordDatabaseCheckpoint
from iox_spark.catalog.schema import SchemaRegistry, TableSchema
from iox_spark.catalog.transactions import TxnLog
from iox_spark.catalog.errors import CatalogError
from iox_spark.catalog.sharding import partition_for
from iox_spark.catalog.seq_layout import seq_base

__all__ = ["Catalog", "Database", "TablePartition", "DatabaseNotFoundError", "LostWriteRange", "PoisonedMessage",
           "HELD", "RETRYING", "ACCEPTED", "FENCED", "FROZEN", "NOT_OWNED", "merge_lost_writes", "PERSISTING",
           "COMPACTING", "below_holds"]

#: the lifecycle actions that hold a table partition (`TablePartition.hold_for`): its flag of that name
PERSISTING = "persisting"
COMPACTING = "compacting"

_CHUNK_IDS = itertools.count(1)


def _locked(method):
    """Runs a `Database` operation under its catalog's lock (reentrant: callers may hold it)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


def below_holds(offsets: Mapping[int, int], held: Mapping[int, int]) -> dict:
    """`offsets` ({kp: offset}) each lowered to below its partition's hold (`held`: {kp: first offset
    held}, `Database.held_offsets`): how far a held partition can still apply. Pure."""
    return {kp: min(off, held[kp] - 1) if kp in held else off for kp, off in offsets.items()}


class DatabaseNotFoundError(CatalogError, KeyError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(name)


@dataclass
class TablePartition:
    """One table partition. `windows` tracks what is not persisted yet (None until the first write)."""

    table: str
    key: str
    chunks: list = field(default_factory=list)
    windows: PersistenceWindows | None = None
    #: a lifecycle action (persist / compaction) holds this partition
    persisting: bool = False
    compacting: bool = False
    #: Parquet files of this partition registered in the preserved catalog
    files: list = field(default_factory=list)
    #: the last partition checkpoint committed for it (RecordPartitionCheckpoint) or None
    checkpoint: object = None

    def live_chunks(self) -> list:
        return sorted(self.chunks, key=lambda c: c.order)

    # The operations below are the only writers of a partition's fields outside catalog/ (the
    # lifecycle's actions, the pool, recovery); the caller holds Catalog._lock.
    def hold_for(self, action: str, chunks: Iterable[Chunk] = (), chunk_state: str | None = None) -> None:
        """A lifecycle action (PERSISTING or COMPACTING) holds this partition from now on: no other
        persist or compaction of it starts; `chunks` take `chunk_state` (None: they keep theirs)."""
        self._set_action(action, True, chunks, chunk_state)

    def release_from(self, action: str, chunks: Iterable[Chunk] = (), chunk_state: str | None = None) -> None:
        """`action` no longer holds this partition; `chunks` take `chunk_state` (None: they keep theirs)."""
        self._set_action(action, False, chunks, chunk_state)

    def _set_action(self, action: str, held: bool, chunks: Iterable[Chunk], chunk_state: str | None) -> None:
        if action not in (PERSISTING, COMPACTING):
            raise ValueError(f"unknown lifecycle action {action!r} (one of {PERSISTING!r}, {COMPACTING!r})")
        setattr(self, action, held)
        if chunk_state is not None:
            for c in chunks:
                c.state = chunk_state

    def record_persist(self, files: Iterable, checkpoint) -> None:
        """A persist committed `files` with the partition checkpoint `checkpoint`, and ends."""
        self.files.extend(files)
        self.checkpoint = checkpoint
        self.persisting = False

    def replace_files(self, gone_keys: Iterable[str], added: Iterable) -> None:
        """A compaction of persisted files committed: `gone_keys` are replaced by `added`."""
        gone = set(gone_keys)
        self.files = [f for f in self.files if f.key not in gone] + list(added)

    def add_file(self, chunk: Chunk, f) -> None:
        """A persisted file of the preserved catalog, read as `chunk` (the newest of the partition)."""
        self.chunks.append(chunk)
        self.files.append(f)

    def drop_unpersisted(self, persisted_states: Iterable[str]) -> list:
        """Drops every chunk not in `persisted_states` and the persistence windows (another pool member
        owns the partition now); returns the chunks dropped."""
        keep = set(persisted_states)
        gone = [c for c in self.chunks if c.state not in keep]
        self.chunks = [c for c in self.chunks if c.state in keep]
        self.windows = None
        return gone

    def drop_chunks(self, chunks: Iterable[Chunk], file_kept) -> None:
        """Drops `chunks` (files another member's commit removed) and the files `file_kept(f)` refuses."""
        gone = {id(c) for c in chunks}
        self.chunks = [c for c in self.chunks if id(c) not in gone]
        self.files = [f for f in self.files if file_kept(f)]

    def chunk(self, chunk_id: int) -> Chunk | None:
        for c in self.chunks:
            if c.id == chunk_id:
                return c
        return None


@dataclass(frozen=True)
class LostWriteRange:
    """Offsets of one Kafka partition that held acknowledged writes the server can no longer apply
    nor find in Parquet: the write buffer lost them (a broker restarted empty, a topic deleted,
    retention). ``to_exclusive`` None: the end is unknown (everything from ``from_offset`` on).
    ``accepted``: the operator accepted the loss (--skip-lost-writes, or `iox accept-lost-writes`
    while the server runs; ``accepted_at_s``: when, None when unknown); until then the database
    refuses writes. ``epoch``: the write-buffer epoch the offsets belong to. Recorded in the
    preserved catalog (`LostWritesEntry`), so a restart keeps the record."""

    partition: int
    from_offset: int
    to_exclusive: int | None
    detected_at_s: float
    reason: str
    accepted: bool = False
    accepted_at_s: float | None = None
    epoch: int = 0

    def entry(self) -> LostWritesEntry:
        """The preserved catalog's form (an accepted range without a time takes its detection's)."""
        at = (self.accepted_at_s if self.accepted_at_s is not None else self.detected_at_s) if self.accepted else None
        return LostWritesEntry(partition=self.partition, from_offset=self.from_offset, to_exclusive=self.to_exclusive,
                               detected_at_s=self.detected_at_s, reason=self.reason, accepted_at_s=at,
                               epoch=self.epoch)

    @classmethod
    def from_entry(cls, e: LostWritesEntry) -> "LostWriteRange":
        return cls(e.partition, e.from_offset, e.to_exclusive, e.detected_at_s, e.reason,
                   accepted=e.accepted_at_s is not None, accepted_at_s=e.accepted_at_s, epoch=e.epoch)

    def as_accepted(self, now: float) -> "LostWriteRange":
        """This range accepted at ``now`` (itself when it was accepted before)."""
        return self if self.accepted else dataclasses.replace(self, accepted=True, accepted_at_s=now)


def merge_lost_writes(records: list, found: LostWriteRange, now: float) -> list:
    """`records` with the loss `found` at start (accepted): a record of the same Kafka partition,
    first offset and epoch (found while a server ran, before it persisted what it had applied)
    describes the same loss and is kept, accepted now if it was not; else `found` is added. Pure."""
    out, same = [], False
    for r in records:
        if (r.partition, r.from_offset, r.epoch) == (found.partition, found.from_offset, found.epoch):
            same = True
            r = r.as_accepted(now)
        out.append(r)
    return out if same else out + [found]


#: states of a PoisonedMessage
HELD = "held"
RETRYING = "retrying"
ACCEPTED = "accepted"

#: why a Kafka partition of a database is held (`Database.hold`): nothing from an offset on is
#: applied here. FENCED: another server owns the database (set once; gone on restart); FROZEN:
#: the server is frozen (server/write_buffer/freeze.py); NOT_OWNED: a pool member does not own
#: the partition (catalog/ownership.py), its owner applies it
FENCED = "fenced"
FROZEN = "frozen"
NOT_OWNED = "not owned"
_HOLD_REASONS = (FENCED, FROZEN, NOT_OWNED)


@dataclass
class PoisonedMessage:
    """A write-buffer message whose micro-batch failed, found by the consumer to fail on its own
    (server/write_buffer/poison.py), and set aside so that every other database and Kafka partition goes on.

    ``state``: HELD: its Kafka partition applies nothing at or after ``offset`` (its applied
    watermark stays at ``offset - 1``) until an operator retries or accepts it; RETRYING: the
    operator asked to apply it again (the record goes once it is applied; it is held again if it
    fails again, ``attempts`` counting); ACCEPTED: skipped on the operator's word at
    ``accepted_at_s`` (never applied, also not by a replay: recorded in the preserved catalog);
    its partition continues after it. ``epoch``: the write-buffer epoch of ``offset``.
    Mutated under Catalog._lock only."""

    partition: int
    offset: int
    epoch: int
    table: str
    kind: str
    error: str
    detected_at_s: float
    last_failed_at_s: float
    attempts: int = 1
    state: str = HELD
    accepted_at_s: float | None = None

    def retry(self) -> None:
        """The operator asked to apply it again."""
        self.state = RETRYING

    def accept(self, now: float) -> None:
        """Skipped on the operator's word at ``now``."""
        self.state, self.accepted_at_s = ACCEPTED, now

    def failed_again(self, error: str, now: float) -> None:
        """It failed on its own again: HELD, counting one more attempt if it was retried."""
        if self.state == RETRYING:
            self.attempts += 1
        self.state, self.error, self.last_failed_at_s = HELD, error, now

    def entry(self) -> AcceptedPoisonEntry:
        """The preserved catalog's form of an ACCEPTED message."""
        return AcceptedPoisonEntry(epoch=self.epoch, partition=self.partition, offset=self.offset, table=self.table,
                                   kind=self.kind, error=self.error, detected_at_s=self.detected_at_s,
                                   accepted_at_s=self.accepted_at_s if self.accepted_at_s is not None
                                   else self.last_failed_at_s)

    @classmethod
    def from_entry(cls, e: AcceptedPoisonEntry) -> "PoisonedMessage":
        return cls(partition=e.partition, offset=e.offset, epoch=e.epoch, table=e.table, kind=e.kind, error=e.error,
                   detected_at_s=e.detected_at_s, last_failed_at_s=e.detected_at_s, state=ACCEPTED,
                   accepted_at_s=e.accepted_at_s)


@dataclass
class Database:
    name: str
    topic: str
    kafka_partitions: int
    schemas: SchemaRegistry = field(default_factory=SchemaRegistry)
    #: table -> partition key -> TablePartition
    partitions: dict = field(default_factory=dict)
    applied_hi_inclusive: dict = field(default_factory=dict)
    #: write-buffer epoch: grows when the topic was found reset (offsets started over)
    epoch: int = 0
    #: the `_iox_seq` of row 0 of offset 0 in `epoch` (catalog/seq_layout.py): every seq of this
    #: database is `seq_base(seq_origin, offset)` + row; set by recovery, constant while the server runs
    seq_origin: int = 0
    #: deletes of this database (applied in views, materialised by compaction/persist)
    deletes: DeleteMailbox = field(default_factory=DeleteMailbox)
    #: every loss of acknowledged writes found (LostWriteRange), accepted or not (the accepted ones
    #: were skipped at start with --skip-lost-writes); while one is not accepted, writes and deletes
    #: to the database are refused
    lost_writes: list = field(default_factory=list)
    #: the topic was deleted and created again while this server ran (writes refused until a restart)
    topic_replaced: bool = False
    #: {kp: Kafka's end offset when found} of partitions whose broker lost its tail (came back with
    #: fewer offsets than this server knew were written): offsets are given out again, so writes are
    #: refused until what was applied is persisted and the database continues in a new write-buffer
    #: epoch from Kafka's end (server/lost_writes_admin.py); None while Kafka keeps every offset. Under Catalog._lock.
    tail_truncated: dict | None = None
    #: messages the consumer skipped as unreadable (server/write_buffer/wire_format.py header_problem), since this
    #: server started: {kp: (count, last offset, last reason)}
    skipped_messages: dict = field(default_factory=dict)
    #: Kafka's id of the topic incarnation this server reads (None until known); recorded in
    #: database checkpoints so a topic deleted and created again is detected at start
    topic_id: str | None = None
    #: multi-message requests: pending parts, decisions, pins (catalog/transactions.py; under Catalog._lock)
    txns: TxnLog = field(default_factory=TxnLog)
    #: table -> wall time (s) of the last query that may have read it (set by the query engine;
    #: the lifecycle moves a queried table's write-buffer chunks to the read buffer sooner)
    queried_at: dict = field(default_factory=dict)
    #: {kp: highest offset} of micro-batches that failed after recording their offsets in the
    #: persistence windows, until `applied_hi_inclusive` reaches it (their retry is applied): the
    #: windows cover rows no chunk holds meanwhile, so no persist may flush them (a persist would
    #: checkpoint those offsets as persisted, and the retried rows, which the windows do not record
    #: again, could be lost in a crash). Under Catalog._lock; see Catalog.withdraw_chunks.
    failed_batch_hi: dict = field(default_factory=dict)
    #: messages set aside because applying them failed (PoisonedMessage: held, retrying or
    #: accepted; see server/write_buffer/poison.py). Under Catalog._lock.
    poisoned: list = field(default_factory=list)
    #: retention period in seconds (catalog/retention.py), None = keep everything; recorded in the
    #: preserved catalog (RecordRetention), loaded by recovery
    retention_period_s: int | None = None
    #: the oldest time (ns) guaranteed readable, set by the lifecycle worker's retention round from
    #: the wall clock (`catalog.retention.reader_lo_ns`); None without retention. Queries hide older
    #: rows and the router refuses older points (both also compute it from the clock themselves)
    reader_lo_ns: int | None = None
    #: every row older than it was pruned (RecordPruned); None before the first prune
    pruner_hi_ns: int | None = None
    #: in an ingester pool (catalog/ownership.py): the Kafka partitions this server owns (claimed
    #: and not lost since); None outside a pool (it owns them all). Under Catalog._lock.
    owned_partitions: frozenset | None = None
    #: {reason: {kp: first offset not applied}}: the holds (`hold`, `release`), apart from the
    #: poisoned messages' (`poisoned`). Under Catalog._lock.
    _holds: dict = field(default_factory=dict, init=False, repr=False)
    #: the lock of the catalog that holds this database (Catalog.ensure_database sets it)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False, compare=False)

    # The operations below run on the driver, each under the catalog's lock (they take it; a
    # caller may hold it around several): outside catalog/, they are the only writers of this
    # database's fields, and the reads (`applied_offsets`, `held_offsets`, ...) return copies.

    # -- holds: Kafka partitions of which nothing is applied from an offset on -----------------
    @_locked
    def hold(self, reason: str, offsets: Mapping[int, int]) -> None:
        """Holds each Kafka partition of ``offsets`` ({kp: first offset not applied}) for ``reason``
        (FENCED, FROZEN or NOT_OWNED), in place of that reason's earlier hold of it."""
        if reason not in _HOLD_REASONS:
            raise ValueError(f"unknown hold reason {reason!r} (one of {_HOLD_REASONS})")
        if offsets:
            self._holds.setdefault(reason, {}).update(offsets)

    @_locked
    def release(self, reason: str, kps: Iterable[int] | None = None) -> None:
        """Ends ``reason``'s hold of the Kafka partitions ``kps`` (None: of every partition)."""
        holds = self._holds.get(reason)
        if holds is None:
            return
        if kps is None:
            holds.clear()
        for kp in kps or ():
            holds.pop(kp, None)
        if not holds:
            del self._holds[reason]

    def holds(self, reason: str) -> dict:
        """{kp: first offset not applied} that ``reason`` holds (a copy)."""
        return dict(self._holds.get(reason, {}))

    @_locked
    def hold_after_applied(self, reason: str) -> None:
        """Holds every Kafka partition for ``reason`` after what is applied of it."""
        self.hold(reason, {kp: self.applied_hi_inclusive.get(kp, -1) + 1 for kp in range(self.kafka_partitions)})

    @property
    def may_hold(self) -> bool:
        """Whether `held_offsets` may name a partition (a cheap check for every micro-batch)."""
        return bool(self.poisoned or self._holds)

    @_locked
    def held_offsets(self) -> dict:
        """{kp: offset} from which nothing is applied: the HELD messages of the current epoch, the
        fence, freeze and pool holds (the lowest of them)."""
        out: dict = {}
        for holds in self._holds.values():
            for kp, off in holds.items():
                out[kp] = min(off, out.get(kp, off))
        for r in self.poisoned:
            if r.state == HELD and r.epoch == self.epoch:
                out[r.partition] = min(r.offset, out.get(r.partition, r.offset))
        return out

    @_locked
    def hold_reasons(self) -> dict:
        """{kp: [(offset, why)]}: each hold `held_offsets` merges, with why it holds ("fenced",
        "frozen", "not owned", "poisoned message"), lowest offset first."""
        out: dict = {}
        for why, holds in self._holds.items():
            for kp, off in holds.items():
                out.setdefault(kp, []).append((off, why))
        for r in self.poisoned:
            if r.state == HELD and r.epoch == self.epoch:
                out.setdefault(r.partition, []).append((r.offset, "poisoned message"))
        return {kp: sorted(v) for kp, v in sorted(out.items())}

    # -- reads: copies taken under the lock, for callers that hold no lock -------------------------
    @_locked
    def applied_offsets(self) -> dict:
        """{kp: highest offset applied} (a copy)."""
        return dict(self.applied_hi_inclusive)

    @_locked
    def applied_and_held(self) -> tuple[dict, dict]:
        """(`applied_offsets`, `held_offsets`), read at one instant."""
        return dict(self.applied_hi_inclusive), self.held_offsets()

    @_locked
    def incarnation(self) -> tuple[str, str | None, int]:
        """(topic, topic id, write-buffer epoch): which messages this database's offsets name now."""
        return self.topic, self.topic_id, self.epoch

    @_locked
    def applied_in_epoch(self) -> tuple[dict, int, str]:
        """(`applied_offsets`, the write-buffer epoch they are of, the topic), read at one instant."""
        return dict(self.applied_hi_inclusive), self.epoch, self.topic

    @_locked
    def tail_state(self) -> tuple[str, int, dict, dict]:
        """(topic, seq origin, `applied_offsets`, `held_offsets`), read at one instant: what the write
        buffer's tail (server/query/tail.py) keeps of this database."""
        return self.topic, self.seq_origin, dict(self.applied_hi_inclusive), self.held_offsets()

    @_locked
    def partition_keys(self, table: str | None = None, partition_key: str | None = None) -> list[tuple[str, str]]:
        """The (table, partition key) of every table partition, of ``table`` and ``partition_key``
        (None or "": any), sorted."""
        return sorted((t, k) for t, parts in self.partitions.items() for k in parts
                      if (not table or t == table) and (not partition_key or k == partition_key))

    @_locked
    def has_unpersisted_rows(self) -> bool:
        """Whether a persistence window of any table partition counts rows not persisted yet."""
        return any(p.windows is not None and p.windows.unpersisted_row_count()
                   for parts in self.partitions.values() for p in parts.values())

    @_locked
    def known_tables(self) -> list[str]:
        """Every table this database holds rows of or knows the columns of, sorted."""
        return sorted(set(self.partitions) | set(self.schemas.tables()))

    @_locked
    def table_columns(self) -> dict:
        """{table: [(column, role, type)]} of every table whose columns are known, as the schemas hold them."""
        out = {}
        for table in sorted(self.schemas.tables()):
            sch = self.schemas.get(table)
            out[table] = [(c.name, c.role, c.type) for c in (sch.columns if sch else [])]
        return out

    @_locked
    def loss_state(self) -> tuple[list, bool, dict | None]:
        """(the lost-write ranges not accepted yet, whether the topic was replaced, `tail_truncated`):
        what refuses writes to this database, read at one instant (copies)."""
        truncated = None if self.tail_truncated is None else dict(self.tail_truncated)
        return [r for r in self.lost_writes if not r.accepted], self.topic_replaced, truncated

    @_locked
    def lost_write_entries(self, accepted_at_s: float | None = None) -> tuple:
        """Every lost-write range as the preserved catalog records it (LostWritesEntry); with
        ``accepted_at_s``, as it records them once accepted then (each accepted before keeps its time).
        Changes nothing."""
        ranges = self.lost_writes if accepted_at_s is None else [r.as_accepted(accepted_at_s) for r in self.lost_writes]
        return tuple(r.entry() for r in ranges)

    @_locked
    def lost_write_ranges(self) -> list:
        """Every lost-write range (LostWriteRange, immutable), accepted or not."""
        return list(self.lost_writes)

    @_locked
    def unpersisted_partitions(self, table: str | None = None, partition_key: str | None = None) -> list:
        """[(table, partition key, why a persist may not take it or None)] of every table partition
        (of ``table`` and ``partition_key``; None or "": any) holding rows not persisted yet, sorted:
        a persist or compaction of it is running, or a failed micro-batch holds the database's
        persists."""
        out = []
        for t, parts in sorted(self.partitions.items()):
            for k, p in sorted(parts.items()):
                if (table and t != table) or (partition_key and k != partition_key) or p.windows is None \
                        or p.windows.is_empty():
                    continue
                out.append((t, k, "a persist or compaction of it was running" if p.persisting or p.compacting else
                            "a micro-batch that failed is not applied again yet" if self.failed_batch_hi else None))
        return out

    @_locked
    def verify_inputs(self, tables: Iterable[str], kp: int) -> tuple:
        """What a check of ``tables`` against the write buffer's Kafka partition ``kp`` reads before
        its queries, at one instant: ({table: schema or None}, seq origin, the offsets of ``kp``
        whose losses were accepted, {table: [min seq of each of its files]}, retention period)."""
        tables = list(tables)
        files_min_seq = {t: [f.min_seq for part in self.partitions.get(t, {}).values() for f in part.files]
                         for t in tables}
        return ({t: self.schemas.get(t) for t in tables}, self.seq_origin,
                {off for p, off in self.accepted_offsets() if p == kp}, files_min_seq, self.retention_period_s)

    @_locked
    def table_deletes(self, table: str) -> list:
        """The deletes that apply to ``table``: its own, and database-wide ones via its Kafka partition."""
        return self.deletes.for_table(table, partition_for(table, self.kafka_partitions))

    @_locked
    def downsample_changes(self, table: str, progress: Progress | None) -> Changes:
        """What a downsampler of `table` must emit again since `progress` (catalog/downsampling.py),
        read at one instant: the persistence windows, Parquet files and deletes of the table at or
        after it, and the offsets applied now (a reader that sees an offset as applied sees its rows
        and deletes: server/consume/ingest.py)."""
        applied_next = {kp: hi + 1 for kp, hi in self.applied_hi_inclusive.items() if hi >= 0}
        kp = partition_for(table, self.kafka_partitions)
        parts = list(self.partitions.get(table, {}).values())
        summaries = [s for p in parts if p.windows is not None for s in p.windows.summaries()]
        files = [f for p in parts for f in p.files]
        lo = min([f.min_time_ns for f in files] + [s.min_time_ns for s in summaries], default=None)
        hi = max([f.max_time_ns for f in files] + [s.max_time_ns for s in summaries], default=None)
        deletes = [(d.seq, d.start_ns, d.stop_ns_exclusive) for d in self.deletes.for_table(table, kp)]
        if progress is None or (progress.epoch, progress.seq_origin) != (self.epoch, self.seq_origin):
            _rows, dels = changed_spans((), (), deletes, 0, 0)
            return Changes(True, (), dels, applied_next, self.epoch, self.seq_origin, lo, hi)
        since = progress.next_offsets.get(kp, 0)
        # a window without an offset of the table's partition cannot be placed: taken as changed
        rows, dels = changed_spans(
            [(s.offsets[kp].offset_hi_inclusive if kp in s.offsets else since, s.min_time_ns, s.max_time_ns)
             for s in summaries],
            [(f.max_seq, f.min_time_ns, f.max_time_ns) for f in files],
            deletes, since, seq_base(self.seq_origin, since))
        return Changes(False, rows, dels, applied_next, self.epoch, self.seq_origin, lo, hi)

    @_locked
    def snapshot(self) -> DatabaseSnapshot:
        """Everything `iox status` shows of this database, copied at one instant
        (catalog/database_snapshot.py)."""
        return snapshot_of(self)

    @_locked
    def chunks_in_memory(self) -> tuple[int, int]:
        """(how many chunks, their bytes) this database holds in memory."""
        chunks = [c for parts in self.partitions.values() for p in parts.values() for c in p.chunks if c.in_memory]
        return len(chunks), sum(c.size_bytes for c in chunks)

    def owned(self) -> set:
        """The Kafka partitions this server owns (a new set): in a pool those claimed and not lost
        since; outside one every partition."""
        owned = self.owned_partitions  # a frozenset, replaced whole: one read needs no lock
        return set(range(self.kafka_partitions)) if owned is None else set(owned)

    # -- ownership in an ingester pool (catalog/ownership.py) ---------------------------------
    @_locked
    def own_only(self, owned: Iterable[int]) -> None:
        """A pool member at start: owns ``owned`` and applies nothing of any other partition."""
        self.owned_partitions = frozenset(owned)
        self.release(NOT_OWNED)
        self.hold(NOT_OWNED, {kp: 0 for kp in range(self.kafka_partitions) if kp not in self.owned_partitions})

    @_locked
    def adopt_claim(self, starts: Mapping[int, int]) -> None:
        """A pool member claimed the partitions of ``starts`` ({kp: first offset to apply}): each is
        applied here from its offset on."""
        for kp, start in starts.items():
            self.applied_hi_inclusive[kp] = start - 1
        self.release(NOT_OWNED, starts)
        self.owned_partitions = frozenset((self.owned_partitions or frozenset()) | set(starts))

    @_locked
    def drop_stale_foreign_chunks(self, touched: Iterable[tuple[str, str]] | None, gone: Callable[[str], bool],
                                  kept: Callable[[str], bool]) -> tuple[set, list, set]:
        """A pool member took another member's commit: in the table partitions ``touched`` ((table,
        partition key); None: every one) of tables it does not own, drops each chunk holding a
        Parquet file whose key is ``gone``, and every file whose key is not ``kept``. Returns (the
        keys of the files those partitions held, the chunks dropped, the tables changed)."""
        parts = [p for by_key in self.partitions.values() for p in by_key.values()] if touched is None else [
            p for t, k in touched if (p := self.partitions.get(t, {}).get(k)) is not None]
        known, retired, changed = set(), [], set()
        for part in parts:
            if self.owns_table(part.table):
                continue
            known.update(f.key for f in part.files)
            stale = [c for c in part.chunks if c.parquet_keys and any(gone(k) for k in c.parquet_keys)]
            if stale:
                part.drop_chunks(stale, lambda f: kept(f.key))
                retired.extend(stale)
                changed.add(part.table)
        return known, retired, changed

    @_locked
    def drop_unpersisted_of(self, kps: Iterable[int], keep_states: tuple) -> tuple[list, set]:
        """Drops, in every table partition of the tables on Kafka partitions ``kps``, the chunks whose
        state is not in ``keep_states`` (`TablePartition.drop_unpersisted`); returns (the chunks
        dropped, the tables whose rows changed: a chunk dropped, or persistence windows forgotten)."""
        kps = set(kps)
        dropped, tables = [], set()
        for table, parts in self.partitions.items():
            if partition_for(table, self.kafka_partitions) not in kps:
                continue
            for part in parts.values():
                had_windows = part.windows is not None
                gone = part.drop_unpersisted(keep_states)
                if gone or had_windows:
                    dropped.extend(gone)
                    tables.add(table)
        return dropped, tables

    @_locked
    def lose_claim(self, kps: Iterable[int]) -> bool:
        """A pool member lost the partitions ``kps``: each is held after what is applied of it.
        False (and nothing changes) when it owned none of them."""
        kps = set(kps)
        owned = set(self.owned_partitions or ())
        if not owned & kps:
            return False
        self.owned_partitions = frozenset(owned - kps)
        self.hold(NOT_OWNED, {kp: self.applied_hi_inclusive.get(kp, -1) + 1 for kp in kps})
        return True

    # -- the write buffer: topic incarnation, epochs, applied offsets ---------------------------
    @_locked
    def adopt_topic_id(self, topic_id: str | None) -> str | None:
        """Records ``topic_id`` as the topic incarnation's id when none is known; returns the id
        known before (None: none was)."""
        known = self.topic_id
        if known is None:
            self.topic_id = topic_id
        return known

    @_locked
    def load_records(self, topic_id: str | None, lost_writes: list, poisoned: list,
                     retention_period_s: int | None, pruner_hi_ns: int | None) -> None:
        """Recovery: what the preserved catalog recorded of earlier runs, and the topic's id now."""
        self.topic_id = topic_id
        self.lost_writes = list(lost_writes)
        self.poisoned = list(poisoned)
        self.retention_period_s = retention_period_s or None
        self.pruner_hi_ns = pruner_hi_ns

    @_locked
    def set_epoch(self, epoch: int, seq_origin: int) -> None:
        """The write-buffer epoch the database is in and its seq origin (recovery; a pool member's
        first claim of a database)."""
        self.epoch, self.seq_origin = epoch, seq_origin

    @_locked
    def start_applying_at(self, starts: Mapping[int, int]) -> None:
        """Each Kafka partition of ``starts`` ({kp: first offset}) is applied from there on: what is
        below counts as applied (a new epoch's first offsets, which may be below the old ones)."""
        for kp, start in starts.items():
            self.applied_hi_inclusive[kp] = start - 1

    @_locked
    def new_epoch_readiness(self, first_offsets: Mapping[int, int], cut_short: bool) -> tuple[str | None, int, int, list]:
        """Whether this database may continue in a new write-buffer epoch from ``first_offsets``
        ({kp: the new epoch's first offset}; ``cut_short``: on a topic that lost its tail, whose
        offsets below them must be applied first), read at one instant: (why not, or None; the
        highest offset applied in any partition; the next epoch; every lost-write range)."""
        busy = sorted((t, k) for t, parts in self.partitions.items() for k, p in parts.items()
                      if p.windows is not None and (not p.windows.is_empty() or p.windows.has_flush_handle))
        behind = {kp: (self.applied_hi_inclusive.get(kp, -1), off) for kp, off in first_offsets.items()
                  if cut_short and self.applied_hi_inclusive.get(kp, -1) < off - 1 and
                  (self.owned_partitions is None or kp in self.owned_partitions)}
        why = (f"table partitions {busy} still hold unpersisted rows" if busy else
               "a failed micro-batch is not applied again yet" if self.failed_batch_hi else
               f"what Kafka still holds is not applied yet (partition: (applied, end) {behind})" if behind else None)
        return why, max(self.applied_hi_inclusive.values(), default=-1), self.epoch + 1, list(self.lost_writes)

    @_locked
    def continue_in_epoch(self, epoch: int, seq_origin: int, topic_id: str | None, lost_writes: list,
                          first_offsets: Mapping[int, int]) -> None:
        """The database continues in write-buffer ``epoch`` (a new topic, or one cut short) from
        ``first_offsets``, once everything of the old epoch is persisted: its transactions, failed
        batches, held or retried messages and persistence windows were of the old epoch."""
        self.epoch, self.seq_origin, self.topic_id, self.topic_replaced = epoch, seq_origin, topic_id, False
        self.tail_truncated = None
        self.lost_writes = list(lost_writes)
        self.applied_hi_inclusive = {kp: off - 1 for kp, off in first_offsets.items()}
        self.txns = TxnLog()
        self.failed_batch_hi = {}
        self.poisoned = [r for r in self.poisoned if r.state == ACCEPTED]
        for parts in self.partitions.values():
            for p in parts.values():
                p.windows = None  # the old epoch's offsets: all persisted

    @_locked
    def txns_to_stage(self, batch_hi: Mapping[int, int]) -> tuple[dict, TxnLog]:
        """What a micro-batch stages its transactions on: (the applied offsets of every partition
        once ``batch_hi`` ({kp: highest offset of the batch}) is applied, a copy of the transaction
        log). `install_txns` makes the staged copy the database's."""
        hi_after = dict(self.applied_hi_inclusive)  # every partition, not only the batch's
        for kp, off in batch_hi.items():
            hi_after[kp] = max(hi_after.get(kp, -1), off)
        return hi_after, copy.deepcopy(self.txns)

    @_locked
    def due_txn_repairs(self, now: float, txn_timeout_s: float) -> list:
        """The markers and abort decisions the transaction log asks for now (`TxnLog.due_repairs`)."""
        return self.txns.due_repairs(now, txn_timeout_s)

    @_locked
    def txns_undecided_elsewhere(self, now: float) -> list | None:
        """A pool member's transactions whose decision is on a partition it does not own
        (`TxnLog.undecided_elsewhere`); None when every partition is read here."""
        owned = self.owned_partitions
        if owned is None:
            return None
        return self.txns.undecided_elsewhere(now, owned.__contains__)  # a frozenset, replaced on a claim

    @_locked
    def learn_txn_decision(self, txn: str, decision: str, now: float) -> None:
        """The decision of ``txn`` read from the partition another member owns."""
        self.txns.learn_decision(txn, decision, now)

    @_locked
    def close_chunks_of(self, applies: Callable[[str], bool]) -> list[str]:
        """Closes every chunk of each table ``applies(table)`` is true of (a delete never lands in a
        chunk that may still grow); returns those tables."""
        tables = [t for t in self.partitions if applies(t)]
        for table in tables:
            for part in self.partitions[table].values():
                for c in part.chunks:
                    c.close()
        return tables

    @_locked
    def install_txns(self, staged: TxnLog) -> None:
        """The transaction log a micro-batch staged becomes the database's (adopting the repairs
        made to the current one meanwhile)."""
        staged.adopt_repairs_of(self.txns)
        self.txns = staged

    @_locked
    def note_skipped(self, kp: int, offset: int, reason: str) -> None:
        """The consumer passed the unreadable message at ``offset`` of ``kp``."""
        count = self.skipped_messages.get(kp, (0,))[0]
        self.skipped_messages[kp] = (count + 1, offset, reason)

    # -- losses ------------------------------------------------------------------------------
    @_locked
    def record_lost_writes(self, ranges: Iterable[LostWriteRange]) -> None:
        """Losses found while the server runs (not accepted: writes are refused)."""
        self.lost_writes.extend(ranges)

    @_locked
    def merge_lost_write(self, found: LostWriteRange, now: float) -> None:
        """A loss found at start and accepted (`merge_lost_writes`)."""
        self.lost_writes = merge_lost_writes(self.lost_writes, found, now)

    @_locked
    def accept_lost_writes(self, now: float) -> list:
        """Every loss accepted (at ``now`` when it was not before); returns them."""
        self.lost_writes = [r.as_accepted(now) for r in self.lost_writes]
        return list(self.lost_writes)

    @_locked
    def mark_topic_replaced(self) -> bool:
        """The topic was deleted and created again under this server; False when known before."""
        if self.topic_replaced:
            return False
        self.topic_replaced = True
        return True

    @_locked
    def tail_check_state(self) -> tuple[int, dict] | None:
        """(the write-buffer epoch, a copy of the applied offsets) of a database whose write buffer may
        still lose its tail unnoticed; None when a loss is known already (its tail truncated, its topic
        replaced) or its topic's Kafka id is unknown."""
        if self.tail_truncated is not None or self.topic_replaced or self.topic_id is None:
            return None
        return self.epoch, dict(self.applied_hi_inclusive)

    @_locked
    def record_topic_replaced(self, acked: Mapping[int, int], now: float, reason: str) -> list | None:
        """The topic was deleted and created again while the server ran: the acknowledged offsets
        (``acked``: {kp: highest offset acknowledged}) past what is applied are recorded lost (the
        ranges returned); None when the replacement was known before (nothing recorded)."""
        if not self.mark_topic_replaced():
            return None
        applied = self.applied_hi_inclusive
        ranges = [LostWriteRange(kp, applied.get(kp, -1) + 1, off + 1, now, reason, epoch=self.epoch)
                  for kp, off in sorted(acked.items()) if off > applied.get(kp, -1)]
        self.record_lost_writes(ranges)
        return ranges

    @_locked
    def record_tail_lost(self, epoch: int, ends: Mapping[int, int], acked: Mapping[int, int], now: float) -> list | None:
        """The broker lost the tail of the partitions of ``ends`` ({kp: Kafka's end offset}), read in
        write-buffer ``epoch``: the tail is recorded truncated, and the acknowledged offsets (``acked``)
        at or past both Kafka's end and what is applied are recorded lost (the ranges returned). None
        when the database is in another epoch now or the loss was known already (nothing recorded)."""
        if self.epoch != epoch or self.tail_truncated is not None or self.topic_replaced:
            return None
        applied = self.applied_hi_inclusive
        ranges = []
        for kp, end in sorted(ends.items()):
            first = max(end, applied.get(kp, -1) + 1)
            if acked.get(kp, -1) >= first:
                ranges.append(LostWriteRange(kp, first, acked[kp] + 1, now,
                                             f"the broker lost the tail of Kafka partition {kp}: it ended at "
                                             f"offset {end}, below offsets this server had acknowledged",
                                             epoch=self.epoch))
        self.record_tail_truncated(ends)
        self.record_lost_writes(ranges)
        return ranges

    @_locked
    def record_tail_truncated(self, ends: Mapping[int, int]) -> None:
        """The broker lost the tail of the partitions of ``ends`` ({kp: Kafka's end offset})."""
        self.tail_truncated = dict(ends)

    # -- poisoned messages (server/write_buffer/poison.py) -------------------------------------
    @_locked
    def add_poisoned(self, record: PoisonedMessage) -> None:
        self.poisoned.append(record)

    @_locked
    def drop_poisoned(self, records: Iterable[PoisonedMessage]) -> None:
        """Forgets ``records`` (the very objects)."""
        gone = {id(r) for r in records}
        self.poisoned = [r for r in self.poisoned if id(r) not in gone]

    @_locked
    def set_aside_poisoned(self, partition: int, offset: int, table: str, kind: str, error: str,
                           now: float) -> PoisonedMessage:
        """The message at (``partition``, ``offset``) of the current epoch failed on its own: a new
        HELD record, or the existing one (retried) HELD again with one more attempt and ``error``."""
        for r in self.poisoned:
            if r.epoch == self.epoch and r.partition == partition and r.offset == offset and r.state != ACCEPTED:
                r.failed_again(error, now)
                return r
        r = PoisonedMessage(partition=partition, offset=offset, epoch=self.epoch, table=table or "", kind=kind or "",
                            error=error, detected_at_s=now, last_failed_at_s=now)
        self.poisoned.append(r)
        return r

    @_locked
    def settle_retried(self) -> list:
        """Drops the RETRYING records whose offset is applied now (the retry applied them); returns them."""
        done = [r for r in self.poisoned if r.state == RETRYING and r.epoch == self.epoch
                and self.applied_hi_inclusive.get(r.partition, -1) >= r.offset]
        if done:
            self.drop_poisoned(done)
        return done

    @_locked
    def poisoned_of(self, partition: int | None = None, offset: int | None = None, states=(HELD,)) -> list:
        """The records of the current epoch in ``states``, of ``partition`` (None: any) at ``offset``
        (None: any), in (partition, offset) order (the very objects: change them through the
        operations below)."""
        return sorted((r for r in self.poisoned if r.epoch == self.epoch and r.state in states
                       and (partition is None or r.partition == partition) and (offset is None or r.offset == offset)),
                      key=lambda r: (r.partition, r.offset))

    @_locked
    def retry_poisoned(self, partition: int | None = None, offset: int | None = None) -> list:
        """`iox poison retry`: the HELD records of ``partition`` at ``offset`` become RETRYING; returns them."""
        records = self.poisoned_of(partition, offset)
        for r in records:
            r.retry()
        return records

    @_locked
    def poison_acceptance(self, partition: int | None, offset: int | None, now: float) -> tuple[list, list]:
        """`iox poison accept`, before its record is committed: (the HELD records of ``partition`` at
        ``offset``, the preserved catalog's entries of every ACCEPTED record with them accepted at
        ``now``). Changes nothing."""
        records = self.poisoned_of(partition, offset)
        entries = [r.entry() for r in self.poisoned if r.state == ACCEPTED]
        entries += [dataclasses.replace(r.entry(), accepted_at_s=now) for r in records]
        return records, entries

    @_locked
    def accept_poisoned(self, records: Iterable[PoisonedMessage], now: float) -> None:
        """`iox poison accept`, once its record is committed: ``records`` are ACCEPTED at ``now``."""
        for r in records:
            r.accept(now)

    @_locked
    def poisoned_copies(self, records: Iterable[PoisonedMessage]) -> list:
        """Copies of ``records`` as they are now (to read outside the lock)."""
        return [dataclasses.replace(r) for r in records]

    # -- retention (catalog/retention.py) ----------------------------------------------------
    @_locked
    def set_retention(self, period_s: int | None, reader_lo_ns: int | None) -> None:
        self.retention_period_s = period_s or None
        self.reader_lo_ns = reader_lo_ns

    @_locked
    def raise_reader_lo(self, reader_lo_ns: int) -> None:
        """The oldest time guaranteed readable moves up to ``reader_lo_ns`` (never down)."""
        if self.reader_lo_ns is None or reader_lo_ns > self.reader_lo_ns:
            self.reader_lo_ns = reader_lo_ns

    @_locked
    def set_pruner_hi(self, pruner_hi_ns: int) -> None:
        """Every row older than ``pruner_hi_ns`` was pruned (recorded)."""
        self.pruner_hi_ns = pruner_hi_ns

    # -- tables ------------------------------------------------------------------------------
    @_locked
    def note_queried(self, tables: Iterable[str], now: float) -> None:
        """A query that may read ``tables`` started at ``now`` (wall seconds)."""
        for table in tables:
            self.queried_at[table] = now

    @_locked
    def drop_partition(self, table: str, key: str, part: "TablePartition") -> bool:
        """Removes partition ``key`` of ``table`` if it is still ``part`` (retention pruned it)."""
        if self.partitions.get(table, {}).get(key) is not part:
            return False
        del self.partitions[table][key]
        return True

    @_locked
    def accepted_offsets(self) -> set:
        """{(kp, offset)} of the ACCEPTED messages of the current epoch: never applied."""
        return {(r.partition, r.offset) for r in self.poisoned if r.state == ACCEPTED and r.epoch == self.epoch}

    def owns_table(self, table: str) -> bool:
        """Whether this server applies and persists `table` (outside a pool: every table)."""
        return self.owned_partitions is None or partition_for(table, self.kafka_partitions) in self.owned_partitions

    def checkpoint_action(self, sequencer_numbers: dict, complete: bool = False) -> RecordDatabaseCheckpoint:
        """The database checkpoint at ``sequencer_numbers`` ({kp: (min unpersisted or None, max seen)})
        for this database's topic incarnation, write-buffer epoch and seq origin; the one place that
        builds it. A pool member records only the partitions it owns (each owner its own)."""
        if self.owned_partitions is not None:
            sequencer_numbers = {kp: v for kp, v in sequencer_numbers.items() if kp in self.owned_partitions}
        return RecordDatabaseCheckpoint(topic=self.topic, kafka_partitions=self.kafka_partitions,
                                        sequencer_numbers=sequencer_numbers, epoch=self.epoch,
                                        topic_id=self.topic_id, complete=complete, seq_origin=self.seq_origin)

    @_locked
    def table_names(self) -> list[str]:
        """The tables this database holds partitions of, sorted."""
        return sorted(self.partitions)

    @_locked
    def holds_chunks(self) -> bool:
        """Whether any partition of this database holds a chunk (in memory or persisted)."""
        return any(p.chunks for parts in self.partitions.values() for p in parts.values())


class Catalog:
    """Thread-safe registry of databases and their chunks."""

    def __init__(self, late_arrive_window_s: float = DEFAULT_LATE_ARRIVE_WINDOW_S, pool_member: bool = False):
        """`late_arrive_window_s`: the lifecycle's (`LifecycleRules`), for the persistence windows;
        `pool_member`: a member of an ingester pool, whose databases' partitions are applied only
        once claimed (`Database.owned_partitions`)."""
        self._late_arrive_window_s = late_arrive_window_s
        self._pool_member = pool_member
        self._lock = threading.RLock()
        self._dbs: dict[str, Database] = {}
        self._orders = itertools.count(1)
        self._retired: list = []
        #: running queries and the Parquet files removed while they run (catalog/query_pins.py)
        self.query_pins = QueryPins()
        #: frozen mode (server/write_buffer/freeze.py): every database holds every partition (`freeze`)
        self.frozen = False
        #: database name -> {kp: lowest offset} of the micro-batch being applied (`begin_applying`)
        self._applying: dict[str, dict[int, int]] = {}

    @property
    def late_arrive_window_s(self) -> float:
        return self._late_arrive_window_s

    @property
    def pool_member(self) -> bool:
        """A member of an ingester pool: a database's partitions are applied only once claimed."""
        return self._pool_member

    def freeze(self, last_applied: dict | None = None) -> dict:
        """Frozen mode: holds every Kafka partition of every database after its last applied offset
        (`Database.hold`, FROZEN), and every database created from now on at its start, until
        `unfreeze`. ``last_applied``: {database: {kp: offset}} to hold after instead (a freeze a
        previous run recorded; a partition it does not name is held where it is applied). Returns
        {database: {kp: last applied offset}} as held. Call while no micro-batch is applied."""
        last_applied = last_applied or {}
        out: dict = {}
        with self._lock:
            self.frozen = True
            for db in self._dbs.values():
                named = last_applied.get(db.name, {})
                hi = {kp: named.get(kp, db.applied_hi_inclusive.get(kp, -1)) for kp in range(db.kafka_partitions)}
                db.hold(FROZEN, {kp: off + 1 for kp, off in hi.items()})
                out[db.name] = hi
        return out

    def unfreeze(self) -> None:
        """Ends frozen mode: no partition is held for it any more."""
        with self._lock:
            self.frozen = False
            for db in self._dbs.values():
                db.release(FROZEN)

    def next_chunk_id(self) -> int:
        """Unique in the process (chunk views live in the Spark application, which may host several catalogs)."""
        return next(_CHUNK_IDS)

    def next_order(self) -> int:
        return next(self._orders)

    def ensure_database(self, name: str, topic: str, kafka_partitions: int) -> Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is None:
                db = Database(name, topic, kafka_partitions)
                db._lock = self._lock
                db.applied_hi_inclusive = {p: -1 for p in range(kafka_partitions)}
                if self.frozen:  # created while frozen: nothing of it is applied until unfrozen
                    db.hold(FROZEN, {p: 0 for p in range(kafka_partitions)})
                if self.pool_member:  # owns nothing until it claims
                    db.own_only(())
                self._dbs[name] = db
            return db

    def peek_database(self, name: str) -> Database | None:
        """The database, or None, without taking the lock (a dict read is atomic): for checks on
        every write request that must not wait behind the catalog's longer critical sections."""
        return self._dbs.get(name)

    def database(self, name: str) -> Database:
        with self._lock:
            db = self._dbs.get(name)
            if db is None:
                raise DatabaseNotFoundError(name)
            return db

    def has_database(self, name: str) -> bool:
        with self._lock:
            return name in self._dbs

    def databases(self) -> list[Database]:
        with self._lock:
            return [self._dbs[k] for k in sorted(self._dbs)]

    def partition(self, db: Database, table: str, key: str) -> TablePartition:
        with self._lock:
            parts = db.partitions.setdefault(table, {})
            part = parts.get(key)
            if part is None:
                part = parts[key] = TablePartition(table, key)
            return part

    def add_file(self, db: Database, f, chunk: Chunk) -> None:
        """A persisted file `f` of the preserved catalog, read as `chunk`, joins its partition."""
        with self._lock:
            self.partition(db, f.table, f.partition_key).add_file(chunk, f)

    def set_partition_checkpoint(self, db: Database, table: str, key: str, checkpoint) -> None:
        """The partition's latest persist checkpoint is `checkpoint` (the partition is created when new)."""
        with self._lock:
            self.partition(db, table, key).checkpoint = checkpoint

    def get_partition(self, db: Database, table: str, key: str) -> TablePartition | None:
        with self._lock:
            return db.partitions.get(table, {}).get(key)

    def add_chunk(self, db: Database, chunk: Chunk, now: float | None = None,
                  seen_before_ok: bool = False) -> list[Chunk]:
        """Adds a chunk as the newest of its partition; the previous open chunk becomes closed.

        With `now` (wall seconds) the chunk's rows are also recorded in the
        partition's persistence windows (what replay must cover until persisted).
        `seen_before_ok`: only the chunk's offsets above those the windows saw are recorded (a
        micro-batch retried after its first attempt recorded them); else offsets seen before
        raise OffsetNotIncreasing and nothing changes.
        Returns the chunks of the partition after the change.
        """
        with self._lock:
            part = self.partition(db, chunk.table, chunk.partition_key)
            if now is not None:
                if part.windows is None:
                    part.windows = PersistenceWindows(chunk.table, chunk.partition_key,
                                                      late_arrive_window_s=self.late_arrive_window_s, now=now)
                offsets = part.windows.unseen_ranges(dict(chunk.offsets)) if seen_before_ok else dict(chunk.offsets)
                if offsets or not chunk.offsets:
                    part.windows.add_range(offsets, chunk.rows, chunk.min_time_ns, chunk.max_time_ns, now)
            for c in part.chunks:
                if c.state == "open":
                    c.state = "closed"
            part.chunks.append(chunk)
            return part.live_chunks()

    def replace_chunks(self, db: Database, table: str, key: str, old_ids: list, new_chunks: list) -> None:
        """Atomically swaps chunks `old_ids` for `new_chunks` (which take the first old chunk's order)."""
        with self._lock:
            part = self.partition(db, table, key)
            olds = [c for c in part.chunks if c.id in set(old_ids)]
            base = min((c.order for c in olds), default=self.next_order())
            part.chunks = [c for c in part.chunks if c.id not in set(old_ids)]
            for i, c in enumerate(new_chunks):
                c.order = base + i / (len(new_chunks) + 1)
                part.chunks.append(c)

    def withdraw_chunks(self, db: Database, chunks: list) -> list:
        """Removes chunks a failed micro-batch added (the batch is retried whole and adds its rows
        again); returns the ones removed, not those a lifecycle action replaced meanwhile. The
        rows stay recorded in the persistence windows (the retry does not record them again), so
        persists of the database are held (`Database.failed_batch_hi`) until the batch's offsets
        are applied again (`advance_applied`)."""
        removed = []
        with self._lock:
            for c in chunks:
                for kp, (_lo, hi) in (c.offsets or {}).items():
                    db.failed_batch_hi[kp] = max(hi, db.failed_batch_hi.get(kp, hi))
            for c in chunks:
                part = db.partitions.get(c.table, {}).get(c.partition_key)
                if part is not None and any(x is c for x in part.chunks):
                    part.chunks = [x for x in part.chunks if x is not c]
                    removed.append(c)
        return removed

    def retire(self, chunks: list, now: float | None = None) -> None:
        """Chunks replaced by a lifecycle action: their data is released later (see take_retired),
        so a query planned before the swap still finds it."""
        import time as _time

        at = _time.time() if now is None else now
        with self._lock:
            self._retired.extend((at, c) for c in chunks)

    def take_retired(self, older_than: float) -> list:
        """Removes and returns retired chunks retired before `older_than` (wall seconds)."""
        with self._lock:
            out = [c for at, c in self._retired if at < older_than]
            self._retired = [(at, c) for at, c in self._retired if at >= older_than]
            return out

    def retired_parquet_keys(self) -> set:
        """Parquet keys that retired (not yet released) chunks read: queries may still open them."""
        with self._lock:
            return {k for _at, c in self._retired if c.view is not None for k in c.parquet_keys}

    def all_chunks(self) -> list:
        with self._lock:
            out = []
            for db in self._dbs.values():
                for parts in db.partitions.values():
                    for part in parts.values():
                        out.extend(part.chunks)
            return out

    def memory_bytes(self) -> int:
        """Bytes of chunk data held in memory (every chunk that has an in-memory copy)."""
        return sum(c.size_bytes for c in self.all_chunks() if c.in_memory)

    def begin_applying(self, lowest: dict) -> None:
        """A micro-batch starts to change the catalog: ``lowest`` = {database name: {kp: lowest
        offset of the batch}}. Until `end_applying`, its chunks and their persistence windows may
        be in the catalog before its transaction state, its deletes and its applied offsets are, so
        every checkpoint built meanwhile starts replay at or below those offsets (`replay_pins`):
        a persist then never claims the batch's messages read when the rest of them may be lost
        with the process. Called by the micro-batch thread (one batch at a time)."""
        with self._lock:
            for name, offsets in lowest.items():
                mine = self._applying.setdefault(name, {})
                for kp, off in offsets.items():
                    mine[kp] = min(off, mine.get(kp, off))

    def end_applying(self, names) -> None:
        """The micro-batch `begin_applying` announced for the databases `names` is applied (its
        applied offsets advanced) or withdrawn."""
        with self._lock:
            for name in names:
                self._applying.pop(name, None)

    def owned_table_read(self, db: Database, table: str, skip_states: tuple) -> tuple | None:
        """(schema or None, the table's chunks with a view whose state is not in ``skip_states``, the
        deletes that apply to it) at one instant, or None when another pool member owns the table."""
        with self._lock:
            if not db.owns_table(table):
                return None
            chunks = [c for c in self.table_chunks(db, table) if c.state not in skip_states and c.view is not None]
            return db.schemas.get(table), chunks, db.table_deletes(table)

    def unpersisted_at_stop(self, db: Database) -> tuple[list, dict]:
        """(what still holds unpersisted rows: table partitions, and the offsets replay must still
        read, `replay_pins`; the applied offsets), at one instant: a clean stop records a complete
        checkpoint only when the first is empty."""
        with self._lock:
            unpersisted = [(t, k) for t, parts in db.partitions.items() for k, p in parts.items()
                           if p.windows is not None and not p.windows.is_empty()]
            applied = {kp: hi for kp, hi in db.applied_hi_inclusive.items() if hi >= 0}
            pins = self.replay_pins(db, {})  # undecided transaction parts, a batch half applied
            if pins:
                unpersisted.append(("offsets replay must read", sorted(pins.items())))
            return unpersisted, applied

    def replay_pins(self, db: Database, unpersisted_lo: dict) -> dict:
        """{kp: lowest offset a replay must still read}, whatever the persistence windows say:
        transaction parts without a marker and commit decisions whose parts elsewhere have none,
        committed parts whose rows may be unpersisted (catalog/transactions.py; `unpersisted_lo`:
        {kp: lowest offset whose rows stay unpersisted}), and the micro-batch being applied
        (`begin_applying`). Every checkpoint a lifecycle action builds registers them, as
        ``(offset, max(offset, applied))``, under the lock that they hold while they build it."""
        with self._lock:
            pins = db.txns.pinned_offsets()
            for kp, off in db.txns.applied_part_pins(unpersisted_lo).items():
                pins[kp] = min(pins.get(kp, off), off)
            for kp, off in self._applying.get(db.name, {}).items():
                pins[kp] = min(pins.get(kp, off), off)
            return pins

    def advance_applied(self, db: Database, hi_inclusive: dict) -> None:
        """Records offsets up to `hi_inclusive` ({kp: offset}) as applied; a failed batch's hold
        on persists (`Database.failed_batch_hi`) ends once its offsets are applied again."""
        with self._lock:
            for kp, off in hi_inclusive.items():
                if off > db.applied_hi_inclusive.get(kp, -1):
                    db.applied_hi_inclusive[kp] = off
            for kp, hi in list(db.failed_batch_hi.items()):
                if db.applied_hi_inclusive.get(kp, -1) >= hi:
                    del db.failed_batch_hi[kp]

    def set_aside_poisoned(self, db: Database, partition: int, offset: int, table: str, kind: str, error: str,
                           now: float) -> PoisonedMessage:
        """The message at (``partition``, ``offset``) of ``db`` failed on its own: it is held
        (`Database.set_aside_poisoned`) and what failed attempts recorded from it on is forgotten
        (`forget_unapplied`), at one instant."""
        with self._lock:
            r = db.set_aside_poisoned(partition, offset, table, kind, error, now)
            self.forget_unapplied(db, partition, offset)
            return r

    def forget_unapplied(self, db: Database, kp: int, from_offset: int) -> None:
        """Kafka partition `kp` of `db` stops before `from_offset` (a message there is held,
        server/write_buffer/poison.py): what failed micro-batch attempts recorded in the persistence windows at
        and after it is forgotten (their chunks were withdrawn; the offsets are recorded again once
        applied), so no persist claims those offsets, and the hold those attempts put on persists
        (`Database.failed_batch_hi`) ends for `kp`: the caller applied every offset below
        `from_offset` that they covered."""
        with self._lock:
            for parts in db.partitions.values():
                for part in parts.values():
                    if part.windows is not None:
                        part.windows.forget_from(kp, from_offset)
            db.failed_batch_hi.pop(kp, None)

    def query_cut(self, db: Database, at_cut: Callable[[dict], object], tables: Callable[[object], Iterable[str]],
                  read: Callable[..., object]) -> tuple[dict, int | None, object, dict]:
        """One query's read of ``db`` at one instant (the lock held throughout): its applied offsets;
        ``at_cut(applied)``, what the caller reads of its own at that instant (the write buffer's tail,
        server/query/tail.py); for each table of ``tables(at_cut's result)``, ``read(table, chunks,
        deletes, schema, at_cut's result)`` of the table's live chunks (`table_chunks`), the deletes
        that apply to it (`Database.table_deletes`) and its schema. Returns (applied offsets, the
        retention period, at_cut's result, {table: what read returned}). The query engine calls it
        (driver); the callbacks run under the lock, so they must not block (no Spark job, no I/O)."""
        with self._lock:
            applied = dict(db.applied_hi_inclusive)
            extra = at_cut(applied)
            reads = {t: read(t, self.table_chunks(db, t), db.table_deletes(t), db.schemas.get(t), extra)
                     for t in tables(extra)}
            return applied, db.retention_period_s, extra, reads

    def table_chunks(self, db: Database, table: str) -> list[Chunk]:
        with self._lock:
            out = []
            for key in sorted(db.partitions.get(table, {})):
                out.extend(db.partitions[table][key].live_chunks())
            return out

    def table_schema(self, db: Database, table: str) -> TableSchema | None:
        return db.schemas.get(table)
