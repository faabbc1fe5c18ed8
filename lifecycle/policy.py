"""The lifecycle policy: from a snapshot of a database and ``now``, the actions to take.

A pure port of IOx ``lifecycle/src/policy.rs`` (``check_for_work``,
``maybe_persist_chunks``, ``maybe_compact_chunks``, ``maybe_free_memory``,
``can_move``, ``select_persistable_chunks``): :func:`decide` reads no clock,
no catalog and no Spark; it maps a frozen :class:`DatabaseState` to a list of
frozen actions that an executor carries out.

Invariants kept here:

* At most one action per partition per decision, and none on a partition that
  is already persisting or compacting (chunks of it in state ``persisting`` /
  ``compacting`` count); memory relief may still unload its persisted chunks.
* A :class:`CompactChunks` names a run of unpersisted chunks that are
  contiguous in chunk order, so compaction never reorders writes: >= 2 chunks
  held in the same form (all only in the write-buffer form, or all with a read
  form), or, with ``to_read_buffer``, >= 1 write-buffer chunks whose last write is
  at least ``read_buffer_delay_s`` old (they move to the read buffer; a due run
  waits, at most that delay, for a following write-buffer chunk that would join
  it when the two hold ``read_buffer_wait_min_rows`` rows, so rows are not
  merged twice). Fresh write-buffer chunks are never merged into rows: merging
  them with each other keeps the cheap form.
* A :class:`CompactPersistedChunks` names every persisted chunk (one Parquet
  file each, or two time-disjoint ones from a large persist) of a partition,
  once there are ``persisted_compaction_file_threshold`` of them, or >= 2 and
  the partition had no write for ``persisted_compaction_cold_s``
  (it went cold); it is chosen only when no persist or in-memory compaction is due.
* At most ``max_active_compactions`` compactions run at once, not counting runs of
  fewer than ``FREE_JOIN_MAX_ROWS`` rows of write-buffer chunks joined as they are
  (no row is merged, no Spark job runs: the new chunk takes over their segments):
  every partition with such a run compacts it in the same decision. With one slot,
  the first partitions in order took it in every decision while they were written,
  and a small table after them never compacted: a queried one kept one chunk per
  micro-batch, each a Python worker round trip per query. Larger runs still take a
  slot: joining costs driver work per chunk whatever its rows, and a large table's
  queries are not dominated by its number of chunks.
* While ``replaying``, nothing is persisted or compacted unless the buffer is
  above the hard limit.
* :class:`Backpressure` is emitted only when its state changes: engaged above
  ``buffer_size_hard_bytes``, released once at or below it.

Order of the returned actions: backpressure, then per partition (input order)
a persist or a compaction (in memory, else of persisted files), then memory relief (unload/drop, oldest first, then
at most one forced persist).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, Union

from iox_spark.lifecycle.errors import InvalidLifecycleState
from iox_spark.lifecycle.rules import LifecycleRules

__all__ = [
    "CHUNK_STATES",
    "FREE_JOIN_MAX_ROWS",
    "ChunkStateName",
    "ChunkState",
    "PartitionState",
    "DatabaseState",
    "PersistReason",
    "PersistedCompactionReason",
    "CompactChunks",
    "CompactPersistedChunks",
    "PersistChunks",
    "UnloadChunk",
    "DropChunk",
    "Backpressure",
    "Action",
    "PersistSelection",
    "can_compact_open_chunk",
    "select_compaction_run",
    "select_read_buffer_run",
    "STORAGES",
    "select_persisted_compaction",
    "select_persistable_chunks",
    "persist_reason",
    "decide",
]

#: a run of write-buffer chunks of fewer rows than this, joined as they are, takes no compaction
#: slot (see the module docstring)
FREE_JOIN_MAX_ROWS = 100_000

ChunkStateName = Literal["open", "closed", "compacting", "persisting", "persisted", "unloaded"]
#: open: newest chunk, still written to; closed: older in-memory chunk; compacting/persisting:
#: a lifecycle action reads it; persisted: in memory and in Parquet; unloaded: in Parquet only.
CHUNK_STATES: tuple[str, ...] = ("open", "closed", "compacting", "persisting", "persisted", "unloaded")
_UNPERSISTED = ("open", "closed")
_WITH_ACTION = ("compacting", "persisting")
_IN_OBJECT_STORE = ("persisted", "unloaded")

PersistReason = Literal["row_threshold", "age_threshold", "memory"]
PersistedCompactionReason = Literal["file_threshold", "cold"]
#: where a chunk's rows are held (catalog/chunk.py `Chunk.storage`)
STORAGES: tuple[str, ...] = ("write_buffer", "read_buffer", "read_buffer+write_buffer", "object_store")


def _decimal(seconds: float) -> Decimal:
    return Decimal(repr(float(seconds)))


def _elapsed_at_least(now: float, since: float, threshold_s: float) -> bool:
    """``now - since >= threshold_s`` on the decimal values of the floats (no binary rounding at boundaries)."""
    return _decimal(now) - _decimal(since) >= _decimal(threshold_s)


# ----------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class ChunkState:
    """One chunk as the policy sees it."""

    chunk_id: int
    #: write-buffer order of the chunk in its partition (lower = older writes)
    order: int
    state: ChunkStateName
    row_count: int
    #: bytes the chunk holds in memory (0 once unloaded)
    size_bytes: int
    min_time_ns: int
    max_time_ns: int
    #: wall time (s) of the last write into the chunk
    time_of_last_write: float
    #: wall time (s) the chunk was last read; memory relief unloads least recently used first
    time_of_last_access: float | None = None
    #: where its rows are held (one of STORAGES)
    storage: str = "read_buffer"

    def __post_init__(self) -> None:
        if self.state not in CHUNK_STATES:
            raise InvalidLifecycleState("chunk.state", self.state, f"must be one of {CHUNK_STATES}")
        if self.storage not in STORAGES:
            raise InvalidLifecycleState("chunk.storage", self.storage, f"must be one of {STORAGES}")

    @property
    def write_buffer_only(self) -> bool:
        """Held only in the write-buffer form (no read form yet)."""
        return self.storage == "write_buffer"

    @property
    def has_action(self) -> bool:
        """A lifecycle action (compaction or persist) is reading this chunk."""
        return self.state in _WITH_ACTION

    @property
    def _lru_time(self) -> float:
        return self.time_of_last_access if self.time_of_last_access is not None else self.time_of_last_write


@dataclass(frozen=True)
class PartitionState:
    """One table partition as the policy sees it; the persistence fields come from its PersistenceWindows."""

    table: str
    partition_key: str
    #: chunks in any order; stored sorted by (order, chunk_id)
    chunks: tuple[ChunkState, ...] = ()
    #: ``PersistenceWindows.persistable_row_count(now)``
    persistable_row_count: int = 0
    #: ``PersistenceWindows.unpersisted_row_count()``
    unpersisted_row_count: int = 0
    #: ``PersistenceWindows.time_of_first_unpersisted_write()`` (IOx ``minimum_unpersisted_age``)
    time_of_first_unpersisted_write: float | None = None
    #: ``PersistenceWindows.peek_flush_timestamp_ns(now)``: None = a flush handle now would be None
    flush_timestamp_ns: int | None = None
    #: a persist (flush handle) is in progress on this partition
    persisting: bool = False
    #: a compaction is in progress on this partition
    compacting: bool = False
    #: wall time (s) of the last query that may have read the table (None: none since the start)
    time_of_last_query: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(sorted(self.chunks, key=lambda c: (c.order, c.chunk_id))))

    @property
    def is_persisting(self) -> bool:
        return self.persisting or any(c.state == "persisting" for c in self.chunks)

    @property
    def is_compacting(self) -> bool:
        return self.compacting or any(c.state == "compacting" for c in self.chunks)

    @property
    def is_busy(self) -> bool:
        return self.is_persisting or self.is_compacting


@dataclass(frozen=True)
class DatabaseState:
    """The whole database as the policy sees it at one instant."""

    #: bytes of chunk data held in memory
    buffer_size_bytes: int
    partitions: tuple[PartitionState, ...] = ()
    #: replay after a restart is running
    replaying: bool = False
    #: the executor currently applies backpressure (the last Backpressure action emitted)
    backpressure_engaged: bool = False
    #: the server's process tree is near its memory limit (its RSS, not this buffer's estimate):
    #: memory relief runs as if the buffer were over its soft limit, freeing all it can
    memory_pressure: bool = False
    #: the server is frozen (server/write_buffer/freeze.py): nothing new arrives, so everything held
    #: is persisted (a forced persist of every partition with unpersisted rows, late arrivals too)
    frozen: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple(self.partitions))


# ------------------------------------------------------------------- actions


@dataclass(frozen=True)
class CompactChunks:
    """Merge a contiguous (in chunk order) run of unpersisted chunks into one closed chunk.

    ``to_read_buffer``: the merged chunk gets the read form (deduplicated rows); otherwise
    write-buffer chunks are merged into a write-buffer chunk (no row is decoded)."""

    table: str
    partition_key: str
    chunk_ids: tuple[int, ...]
    to_read_buffer: bool = False


@dataclass(frozen=True)
class CompactPersistedChunks:
    """Merge persisted chunks of a partition (their Parquet files) into one file and one chunk.

    ``reason``: ``"file_threshold"`` (``persisted_compaction_file_threshold`` files) or ``"cold"``
    (fewer, but no write for ``persisted_compaction_cold_s``); the worker logs it.
    """

    table: str
    partition_key: str
    chunk_ids: tuple[int, ...]
    reason: PersistedCompactionReason = "file_threshold"


@dataclass(frozen=True)
class PersistChunks:
    """Persist a partition: take a flush handle (``flush_all_handle`` if ``force``), split and write Parquet.

    The executor picks the chunks with :func:`select_persistable_chunks` and the
    handle's real flush timestamp.
    """

    table: str
    partition_key: str
    force: bool = False
    reason: PersistReason = "row_threshold"


@dataclass(frozen=True)
class UnloadChunk:
    """Drop the in-memory copy of a persisted chunk; its rows stay queryable from Parquet."""

    table: str
    partition_key: str
    chunk_id: int


@dataclass(frozen=True)
class DropChunk:
    """Drop an unpersisted chunk to free memory; only with ``persist=False`` (data is lost, as IOx)."""

    table: str
    partition_key: str
    chunk_id: int


@dataclass(frozen=True)
class Backpressure:
    """Engage (slow the consumer, reject writes with RESOURCE_EXHAUSTED) or release backpressure."""

    engaged: bool


Action = Union[CompactChunks, CompactPersistedChunks, PersistChunks, UnloadChunk, DropChunk, Backpressure]


# --------------------------------------------------------------------- rules


def can_compact_open_chunk(rules: LifecycleRules, chunk: ChunkState, now: float) -> bool:
    """IOx ``can_move``: an open chunk is cold once full or unwritten for the late-arrival window."""
    if chunk.row_count >= rules.mub_row_threshold:
        return True
    return _elapsed_at_least(now, chunk.time_of_last_write, rules.late_arrive_window_s)


def _compactable(chunk: ChunkState, rules: LifecycleRules, now: float) -> bool:
    """Closed chunks, and the open chunk once cold or full."""
    return chunk.state == "closed" or (chunk.state == "open" and can_compact_open_chunk(rules, chunk, now))


def select_compaction_run(partition: PartitionState, rules: LifecycleRules, now: float) -> tuple[int, ...] | None:
    """The first run of >= 2 compactable chunks, contiguous in chunk order (IOx ``maybe_compact_chunks``).

    Compactable: closed chunks and the open chunk once cold.  A run's rows stay
    below ``persist_row_threshold`` (IOx's ``rows_left``) and its chunks are held in
    the same form (only the write-buffer form, or with a read form); any chunk that
    is not compactable (persisted, unloaded, under an action, warm, or too big) ends
    the run, and one of the other form starts a new one.
    """
    run: list[int] = []
    run_form: bool | None = None
    rows_left = rules.persist_row_threshold
    for chunk in partition.chunks:
        compactable = _compactable(chunk, rules, now)
        if compactable and chunk.row_count < rows_left and run_form in (None, chunk.write_buffer_only):
            run.append(chunk.chunk_id)
            run_form = chunk.write_buffer_only
            rows_left -= chunk.row_count
            continue
        if len(run) >= 2:
            return tuple(run)
        run, run_form, rows_left = [], None, rules.persist_row_threshold
        if compactable and chunk.row_count < rows_left:  # too big for the run, or the other form: may start the next
            run.append(chunk.chunk_id)
            run_form = chunk.write_buffer_only
            rows_left -= chunk.row_count
    return tuple(run) if len(run) >= 2 else None


def select_read_buffer_run(partition: PartitionState, rules: LifecycleRules, now: float) -> tuple[int, ...] | None:
    """The first run of write-buffer chunks due for the read buffer, contiguous in chunk order
    (None also while the run waits for the next chunk, see :func:`_read_buffer_run`)."""
    return _read_buffer_run(partition, rules, now)[0]


def _read_buffer_due(partition: PartitionState, chunk: ChunkState, rules: LifecycleRules) -> tuple[Decimal, Decimal]:
    """(when a write-buffer chunk becomes due for the read buffer, the delay that makes it due):
    ``read_buffer_delay_s`` after its last write, or ``queried_read_buffer_delay_s`` after it
    when the table was queried since that write (at the earliest at that query). Decimal
    values of the floats, as :func:`_elapsed_at_least` compares them. Pure."""
    queried = (partition.time_of_last_query is not None
               and partition.time_of_last_query >= chunk.time_of_last_write)
    if not queried:
        delay = _decimal(rules.read_buffer_delay_s)
        return _decimal(chunk.time_of_last_write) + delay, delay
    delay = _decimal(min(rules.read_buffer_delay_s, rules.queried_read_buffer_delay_s))
    return max(_decimal(chunk.time_of_last_write) + delay, _decimal(partition.time_of_last_query)), delay


def _read_buffer_run(partition: PartitionState, rules: LifecycleRules,
                     now: float) -> tuple[tuple[int, ...] | None, bool]:
    """(the run due for the read buffer or None, whether the partition waits for one).

    Due: compactable, held only in the write-buffer form, last written at least
    ``read_buffer_delay_s`` ago, or at least ``queried_read_buffer_delay_s`` ago when the
    table was queried after that last write. The run's rows stay below ``persist_row_threshold``
    except that its first chunk is always taken (a big chunk moves alone); any other
    chunk ends it.

    A run followed by a write-buffer chunk that is not due yet but would join it (open or
    closed, and within the row limit), the two of at least ``read_buffer_wait_min_rows`` rows,
    waits for it, as long as the run's first chunk has been due for less than the delay that
    made it due: moved alone, the run would be merged again with that chunk once it moved too
    (two read-buffer chunks are compacted into one), so every row would be decoded and merged
    twice. While a run waits (True), the partition's
    write-buffer chunks are not compacted with each other either: that would make the run's
    chunk younger and restart its wait.
    """
    run: list[int] = []
    run_rows, rows_left = 0, rules.persist_row_threshold
    now_d = _decimal(now)
    first_due = first_delay = Decimal(0)
    for chunk in partition.chunks:
        due_at, delay = _read_buffer_due(partition, chunk, rules)
        due = _compactable(chunk, rules, now) and chunk.write_buffer_only and now_d >= due_at
        if due and (not run or chunk.row_count < rows_left):
            if not run:
                first_due, first_delay = due_at, delay
            run.append(chunk.chunk_id)
            run_rows += chunk.row_count
            rows_left -= chunk.row_count
            continue
        if run:
            would_join = (chunk.write_buffer_only and chunk.state in ("open", "closed")
                          and chunk.row_count < rows_left
                          and run_rows + chunk.row_count >= rules.read_buffer_wait_min_rows)
            if would_join and now_d - first_due < first_delay:
                return None, True
            return tuple(run), False
    return (tuple(run) if run else None), False


def select_persisted_compaction(partition: PartitionState, rules: LifecycleRules,
                                now: float) -> tuple[int, ...] | None:
    """The persisted chunks to merge into one Parquet file, if the partition is due (see ``decide``).

    Due: at least ``persisted_compaction_file_threshold`` persisted chunks, or at
    least 2 and no chunk of the partition was written for ``persisted_compaction_cold_s`` (not the
    late-arrive window: a short one would let a partition under load look cold between two
    micro-batches, and all its persisted rows would be rewritten while it is still written).
    """
    due = _persisted_compaction(partition, rules, now)
    return due[0] if due is not None else None


def _persisted_compaction(partition: PartitionState, rules: LifecycleRules,
                          now: float) -> tuple[tuple[int, ...], PersistedCompactionReason] | None:
    """:func:`select_persisted_compaction`'s chunks, with the rule that made them due. Pure."""
    stored = [c for c in partition.chunks if c.state in _IN_OBJECT_STORE]
    if len(stored) < 2:
        return None
    ids = tuple(c.chunk_id for c in stored)
    if len(stored) >= rules.persisted_compaction_file_threshold:
        return ids, "file_threshold"
    last_write = max(c.time_of_last_write for c in partition.chunks)
    if _elapsed_at_least(now, last_write, rules.persisted_compaction_cold_s):
        return ids, "cold"
    return None


@dataclass(frozen=True)
class PersistSelection:
    """Result of :func:`select_persistable_chunks`.

    ``blocked_by_chunk_id`` is set when a chunk holding rows to persist is under
    another action; ``stall_compaction`` then says that action is a compaction.
    """

    chunk_ids: tuple[int, ...]
    blocked_by_chunk_id: int | None = None
    stall_compaction: bool = False

    @property
    def blocked(self) -> bool:
        return self.blocked_by_chunk_id is not None


def select_persistable_chunks(chunks: Iterable[ChunkState], flush_timestamp_ns: int) -> PersistSelection:
    """Chunks a persist with this flush timestamp must read (IOx ``select_persistable_chunks``).

    Every unpersisted chunk with rows at or before the flush timestamp, plus the
    chunks between them in chunk order (so the split keeps order contiguous);
    trailing chunks with only later rows are left out.
    """
    to_persist: list[int] = []
    gap: list[int] = []
    for chunk in sorted(chunks, key=lambda c: (c.order, c.chunk_id)):
        if chunk.state in _IN_OBJECT_STORE:
            continue
        if chunk.row_count and chunk.min_time_ns > flush_timestamp_ns:  # an empty chunk goes too
            # nothing to persist in it, but it may be needed to close an order gap
            if not chunk.has_action:
                gap.append(chunk.chunk_id)
            continue
        if chunk.has_action:
            return PersistSelection((), chunk.chunk_id, chunk.state == "compacting")
        to_persist.extend(gap)
        gap.clear()
        to_persist.append(chunk.chunk_id)
    return PersistSelection(tuple(to_persist))


def persist_reason(partition: PartitionState, rules: LifecycleRules, now: float) -> PersistReason | None:
    """Why the partition should be persisted now, if at all (IOx ``maybe_persist_chunks`` thresholds)."""
    if partition.persistable_row_count >= rules.persist_row_threshold:
        return "row_threshold"
    first = partition.time_of_first_unpersisted_write
    if first is not None and _elapsed_at_least(now, first, rules.persist_age_threshold_s):
        return "age_threshold"
    return None


# -------------------------------------------------------------------- decide


def _free_memory(
    state: DatabaseState, rules: LifecycleRules, soft_limit: int, claimed: set[tuple[str, str, int]]
) -> tuple[list[Action], int]:
    """IOx ``maybe_free_memory``: unload persisted (or, without persist, drop closed) chunks, LRU first."""
    candidates: list[tuple[int, float, str, str, int, int, ChunkState]] = []
    for p in state.partitions:
        for c in p.chunks:
            if c.size_bytes <= 0:
                continue  # nothing of it is in memory
            if c.state == "persisted":
                rank = 0  # unload first
            elif not rules.persist and c.state == "closed" and (p.table, p.partition_key, c.chunk_id) not in claimed:
                rank = 1  # then drop
            else:
                continue
            candidates.append((rank, c._lru_time, p.table, p.partition_key, c.order, c.chunk_id, c))
    candidates.sort(key=lambda x: x[:6])

    actions: list[Action] = []
    projected = state.buffer_size_bytes
    for rank, _, table, key, _, chunk_id, chunk in candidates:
        if projected < soft_limit:
            break
        actions.append(UnloadChunk(table, key, chunk_id) if rank == 0 else DropChunk(table, key, chunk_id))
        projected -= chunk.size_bytes
    return actions, projected


def decide(state: DatabaseState, rules: LifecycleRules, now: float) -> list[Action]:
    """The actions to take now (IOx ``LifecyclePolicy::check_for_work``, pure).

    1. Backpressure when crossing ``buffer_size_hard_bytes`` (either way).
    2. Per partition not busy: persist if ``persistable_row_count >=
       persist_row_threshold`` or the oldest unpersisted write is at least
       ``persist_age_threshold_s`` old (and a flush handle would be granted),
       or force-persist it when the server is ``frozen`` and it holds unpersisted rows;
       otherwise move the first run of write-buffer chunks due for it to the
       read buffer (:func:`select_read_buffer_run`; while that run waits for a
       younger chunk, no in-memory compaction), or else compact the first
       contiguous run of >= 2 small unpersisted chunks of one form, or else the
       partition's Parquet files when
       :func:`select_persisted_compaction` says so, while fewer than
       ``max_active_compactions`` run (a run of fewer than
       ``FREE_JOIN_MAX_ROWS`` rows of write-buffer chunks joined as they are
       takes no slot: it is compacted whatever runs).
    3. At or above ``buffer_size_soft_bytes``: unload persisted chunks, least
       recently used first, until under; if that is not enough and no persist
       is running, force-persist the idle partition with the most unpersisted
       rows (a forced persist writes them all). Under ``memory_pressure`` the
       same with a soft limit of 0: every persisted chunk is unloaded and a
       forced persist runs whenever none does.
    """
    soft, hard = rules.buffer_size_soft_bytes, rules.buffer_size_hard_bytes
    over_soft = soft is not None and state.buffer_size_bytes >= soft
    if state.memory_pressure:
        over_soft, soft = True, 0
    over_hard = hard is not None and state.buffer_size_bytes > hard
    # IOx suppresses persistence during replay; we also hold compaction unless memory demands it
    background_allowed = not state.replaying or over_hard

    actions: list[Action] = []
    if over_hard != state.backpressure_engaged:
        actions.append(Backpressure(over_hard))

    active_compactions = sum(1 for p in state.partitions if p.is_compacting)
    persist_running = any(p.is_persisting for p in state.partitions)
    acted: set[tuple[str, str]] = set()
    claimed: set[tuple[str, str, int]] = set()

    for p in state.partitions:
        if p.is_busy:
            continue
        if rules.persist and not state.replaying:
            reason = persist_reason(p, rules, now)
            if reason is not None and p.flush_timestamp_ns is not None:
                actions.append(PersistChunks(p.table, p.partition_key, force=False, reason=reason))
                acted.add((p.table, p.partition_key))
                persist_running = True
                continue
            if state.frozen and p.unpersisted_row_count > 0:
                actions.append(PersistChunks(p.table, p.partition_key, force=True, reason="frozen"))
                acted.add((p.table, p.partition_key))
                persist_running = True
                continue
        if background_allowed:
            slot_free = active_compactions < rules.max_active_compactions
            to_rb, waiting = _read_buffer_run(p, rules, now)
            run = to_rb if to_rb is not None or waiting else select_compaction_run(p, rules, now)
            # a small run of write-buffer chunks joined as they are merges no row: it takes no slot
            joins_segments = run is not None and to_rb is None and _small_write_buffer_run(p, run)
            if run is not None and (slot_free or joins_segments):
                actions.append(CompactChunks(p.table, p.partition_key, run, to_read_buffer=to_rb is not None))
                acted.add((p.table, p.partition_key))
                claimed.update((p.table, p.partition_key, cid) for cid in run)
                active_compactions += 0 if joins_segments else 1
                continue
            if not slot_free:
                continue
            due = _persisted_compaction(p, rules, now) if rules.persist else None
            if due is not None:
                stored, reason = due
                actions.append(CompactPersistedChunks(p.table, p.partition_key, stored, reason))
                acted.add((p.table, p.partition_key))
                claimed.update((p.table, p.partition_key, cid) for cid in stored)
                active_compactions += 1

    if over_soft:
        assert soft is not None
        freed, projected = _free_memory(state, rules, soft, claimed)
        actions.extend(freed)
        if projected >= soft and rules.persist and background_allowed and not persist_running:
            target = _force_persist_target(state.partitions, acted)
            if target is not None:
                actions.append(PersistChunks(target.table, target.partition_key, force=True, reason="memory"))
    return actions


def _small_write_buffer_run(partition: PartitionState, run: tuple[int, ...]) -> bool:
    """Every chunk of `run` is held only in the write-buffer form (compacting them joins their
    segments: no Spark job, no row decoded) and they hold fewer than FREE_JOIN_MAX_ROWS rows. Pure."""
    ids = set(run)
    chunks = [c for c in partition.chunks if c.chunk_id in ids]
    return all(c.write_buffer_only for c in chunks) and sum(c.row_count for c in chunks) < FREE_JOIN_MAX_ROWS


def _force_persist_target(partitions: Sequence[PartitionState], acted: set[tuple[str, str]]) -> PartitionState | None:
    best: PartitionState | None = None
    for p in partitions:
        if p.is_busy or (p.table, p.partition_key) in acted or p.unpersisted_row_count <= 0:
            continue
        if best is None or (p.unpersisted_row_count, p.persistable_row_count) > (
            best.unpersisted_row_count, best.persistable_row_count
        ):
            best = p
    return best
