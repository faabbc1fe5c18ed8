"""Persistence windows of one table partition: what is unpersisted, and what may be persisted now.

A port of IOx ``persistence_windows/src/persistence_windows.rs`` in our terms
(IOx sequencer = Kafka partition, sequence number = Kafka offset).

Writes land in an *open* window; after ``closed_window_period_s`` (= min(
``late_arrive_window_s``, 30 s)) of wall time it becomes a *closed* window;
once a closed window is ``late_arrive_window_s`` old it is folded into the
single *persistable* window.  Each window keeps its row count, min/max row
time (ns), wall time of first/last write and, per Kafka partition, the
min/max offset it holds.

Invariants kept here:

* Every unpersisted write is described by exactly one window until a
  :meth:`PersistenceWindows.flush` commits the persist that covered it, so
  :meth:`offset_ranges` never claims an unpersisted offset is persisted.
* A :class:`FlushHandle` freezes the persistable window: writes continue (to
  the open window) but nothing joins the persistable window until the handle is
  flushed or aborted; at most one handle is outstanding. A flush persists the
  rows with time <= its flush timestamp of the windows present when its handle
  was taken, never of a window that came later (whatever its rows' times).
* Offsets per Kafka partition strictly increase across ``add_range`` calls.

Wall time is never read here: every method that needs it takes ``now``
(float seconds).  Wall-time comparisons are exact on the decimal value of the
floats passed in (``30.1 - 0.1`` counts as 30 s).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Union

from iox_spark.catalog.checkpoint import PartitionCheckpoint, UnpersistedOffsets
from iox_spark.catalog.errors import (
    EmptyWriteRange,
    FlushHandleReleased,
    ForeignFlushHandle,
    InvalidLateArriveWindow,
    InvalidWallTime,
    InvertedOffsetRange,
    InvertedTimeRange,
    OffsetNotIncreasing,
)

__all__ = [
    "DEFAULT_LATE_ARRIVE_WINDOW_S",
    "DEFAULT_CLOSED_WINDOW_PERIOD_S",
    "OffsetRange",
    "WindowSummary",
    "FlushHandle",
    "PersistenceWindows",
]

#: IOx ``DEFAULT_LATE_ARRIVE_WINDOW_SECONDS``: how long writers may send late data.
DEFAULT_LATE_ARRIVE_WINDOW_S = 300.0
#: IOx ``DEFAULT_CLOSED_WINDOW_SECONDS``: upper bound of an open window's wall-time span.
DEFAULT_CLOSED_WINDOW_PERIOD_S = 30.0

_NS_PER_S = 1_000_000_000


def _wall_ns(seconds: float, what: str = "now") -> int:
    """Wall time as integer ns, exact on the float's shortest decimal representation."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        raise InvalidWallTime(what, seconds)
    return int(Decimal(repr(float(seconds))) * _NS_PER_S)


@dataclass(frozen=True)
class OffsetRange:
    """Offsets of one Kafka partition held by a window; both bounds inclusive (IOx ``MinMaxSequence``)."""

    offset_lo_inclusive: int
    offset_hi_inclusive: int

    def __post_init__(self) -> None:
        if self.offset_lo_inclusive > self.offset_hi_inclusive:
            raise InvertedOffsetRange(None, self.offset_lo_inclusive, self.offset_hi_inclusive)


OffsetsArg = Union[Mapping[int, "tuple[int, int] | OffsetRange"], None]


@dataclass(frozen=True)
class WindowSummary:
    """Read-only view of one window (IOx ``WriteSummary`` plus its offsets).

    ``row_count`` is approximate after a flush truncated the window (as in IOx).
    """

    time_of_first_write: float
    time_of_last_write: float
    row_count: int
    min_time_ns: int
    max_time_ns: int
    offsets: Mapping[int, OffsetRange]


class _Window:
    """One window; mutable, owned by its :class:`PersistenceWindows`."""

    __slots__ = ("time_of_first_write", "first_write_ns", "time_of_last_write", "last_write_ns",
                 "row_count", "min_time_ns", "max_time_ns", "offsets")

    def __init__(self, now: float, now_ns: int, offsets: dict[int, OffsetRange], row_count: int,
                 min_time_ns: int, max_time_ns: int) -> None:
        self.time_of_first_write = now
        self.first_write_ns = now_ns
        self.time_of_last_write = now
        self.last_write_ns = now_ns
        self.row_count = row_count
        self.min_time_ns = min_time_ns
        self.max_time_ns = max_time_ns
        self.offsets = dict(offsets)

    def add_range(self, offsets: dict[int, OffsetRange], row_count: int, min_time_ns: int, max_time_ns: int,
                  now: float, now_ns: int) -> None:
        assert self.first_write_ns <= now_ns and self.last_write_ns <= now_ns
        self.time_of_last_write, self.last_write_ns = now, now_ns
        self.row_count += row_count
        self.min_time_ns = min(self.min_time_ns, min_time_ns)
        self.max_time_ns = max(self.max_time_ns, max_time_ns)
        for kp, new in offsets.items():
            old = self.offsets.get(kp)
            if old is None:
                self.offsets[kp] = new
            else:
                assert new.offset_lo_inclusive > old.offset_hi_inclusive
                self.offsets[kp] = OffsetRange(old.offset_lo_inclusive, new.offset_hi_inclusive)

    def add_window(self, other: _Window) -> None:
        """Fold a younger window into this one (closed -> persistable)."""
        assert self.last_write_ns <= other.first_write_ns
        self.time_of_last_write, self.last_write_ns = other.time_of_last_write, other.last_write_ns
        self.row_count += other.row_count
        self.min_time_ns = min(self.min_time_ns, other.min_time_ns)
        self.max_time_ns = max(self.max_time_ns, other.max_time_ns)
        for kp, theirs in other.offsets.items():
            mine = self.offsets.get(kp)
            if mine is None:
                self.offsets[kp] = theirs
            else:
                assert theirs.offset_hi_inclusive > mine.offset_hi_inclusive
                self.offsets[kp] = OffsetRange(mine.offset_lo_inclusive, theirs.offset_hi_inclusive)

    def is_closeable(self, now_ns: int, closed_window_period_ns: int) -> bool:
        return now_ns - self.first_write_ns >= closed_window_period_ns

    def is_persistable(self, now_ns: int | None, late_arrive_window_ns: int) -> bool:
        # now_ns None = "the end of time": everything is persistable (flush_all_handle)
        return now_ns is None or now_ns - self.first_write_ns >= late_arrive_window_ns

    def summary(self) -> WindowSummary:
        return WindowSummary(self.time_of_first_write, self.time_of_last_write, self.row_count,
                             self.min_time_ns, self.max_time_ns, MappingProxyType(dict(sorted(self.offsets.items()))))


class FlushHandle:
    """A persist in progress on one partition's windows (IOx ``FlushHandle``).

    ``timestamp_ns`` is the flush timestamp: the persist must write every
    unpersisted row of the partition present now with ``time <= timestamp_ns``.
    :meth:`checkpoint` describes what stays unpersisted after the flush.

    Finish with :meth:`PersistenceWindows.flush` (commit) or
    :meth:`PersistenceWindows.abort`; used as a context manager it aborts on
    exit unless flushed::

        handle = windows.flush_handle(now)
        if handle is not None:
            with handle:
                write_parquet(...); commit_catalog(handle.checkpoint())
                windows.flush(handle)
    """

    __slots__ = ("_windows", "_closed_count", "_table", "_partition_key", "_timestamp_ns", "_offsets", "_state")

    def __init__(self, windows: PersistenceWindows, closed_count: int, timestamp_ns: int,
                 offsets: dict[int, UnpersistedOffsets]) -> None:
        self._windows = windows
        self._closed_count = closed_count
        self._table = windows.table
        self._partition_key = windows.partition_key
        self._timestamp_ns = timestamp_ns
        self._offsets = offsets
        self._state = "outstanding"

    @property
    def table(self) -> str:
        return self._table

    @property
    def partition_key(self) -> str:
        return self._partition_key

    @property
    def timestamp_ns(self) -> int:
        """Flush timestamp: rows with time <= it are persisted by this flush."""
        return self._timestamp_ns

    @property
    def closed_count(self) -> int:
        """Closed windows present when the handle was taken (only these are truncated on flush)."""
        return self._closed_count

    @property
    def state(self) -> str:
        """``outstanding``, ``flushed`` or ``aborted``."""
        return self._state

    @property
    def is_outstanding(self) -> bool:
        return self._state == "outstanding"

    def checkpoint(self) -> PartitionCheckpoint:
        """Checkpoint of the partition after this flush (offsets not persisted by it + flush timestamp)."""
        return PartitionCheckpoint(self._table, self._partition_key, self._offsets, self._timestamp_ns)

    def __enter__(self) -> FlushHandle:
        return self

    def __exit__(self, *exc_info: object) -> bool:
        if self.is_outstanding:
            self._windows.abort(self)
        return False

    def __repr__(self) -> str:
        return (f"FlushHandle(table={self._table!r}, partition_key={self._partition_key!r}, "
                f"timestamp_ns={self._timestamp_ns}, state={self._state!r})")


class PersistenceWindows:
    """Tracks the unpersisted writes of one table partition (IOx ``PersistenceWindows``).

    Not thread-safe: callers serialise access (the in-memory catalog's lock).
    """

    def __init__(self, table: str, partition_key: str, *,
                 late_arrive_window_s: float = DEFAULT_LATE_ARRIVE_WINDOW_S, now: float) -> None:
        self.table = table
        self.partition_key = partition_key
        self._persistable: _Window | None = None
        self._closed: deque[_Window] = deque()
        self._open: _Window | None = None
        self._handle: FlushHandle | None = None
        self._set_late_arrive_window(late_arrive_window_s)
        now_ns = _wall_ns(now)
        self._time_of_first_write = now
        self._time_of_last_write, self._last_write_ns = now, now_ns
        #: Kafka partition -> highest offset ever passed to add_range / mark_seen_and_persisted
        self._max_offsets: dict[int, int] = {}

    # ----------------------------------------------------------------- config

    def _set_late_arrive_window(self, late_arrive_window_s: float) -> None:
        if (isinstance(late_arrive_window_s, bool) or not isinstance(late_arrive_window_s, (int, float))
                or not math.isfinite(late_arrive_window_s) or late_arrive_window_s <= 0):
            raise InvalidLateArriveWindow(late_arrive_window_s)
        self._late_arrive_window_s = float(late_arrive_window_s)
        self._closed_window_period_s = min(self._late_arrive_window_s, DEFAULT_CLOSED_WINDOW_PERIOD_S)
        self._late_ns = _wall_ns(self._late_arrive_window_s, "late_arrive_window_s")
        self._closed_period_ns = _wall_ns(self._closed_window_period_s, "closed_window_period_s")

    def set_late_arrive_window_s(self, late_arrive_window_s: float) -> None:
        """Change the late-arrival window (and with it the closed window period)."""
        self._set_late_arrive_window(late_arrive_window_s)

    @property
    def late_arrive_window_s(self) -> float:
        return self._late_arrive_window_s

    @property
    def closed_window_period_s(self) -> float:
        return self._closed_window_period_s

    @property
    def time_of_first_write(self) -> float:
        """Wall time this instance was created."""
        return self._time_of_first_write

    @property
    def time_of_last_write(self) -> float:
        """Largest wall time passed to :meth:`add_range` (or creation time)."""
        return self._time_of_last_write

    @property
    def has_flush_handle(self) -> bool:
        return self._handle is not None

    # ----------------------------------------------------------------- writes

    def mark_seen_and_persisted(self, checkpoint: PartitionCheckpoint) -> None:
        """Record offsets as seen and persisted (used after replay to stay in sync with the catalog)."""
        for kp, offsets in checkpoint.offsets.items():
            prev = self._max_offsets.get(kp)
            self._max_offsets[kp] = offsets.max_seen_offset if prev is None else max(prev, offsets.max_seen_offset)

    def add_range(self, offsets: OffsetsArg, row_count: int, min_time_ns: int, max_time_ns: int,
                  now: float) -> None:
        """Record a chunk of ``row_count`` rows that landed in this partition.

        ``offsets`` maps Kafka partition -> (min offset, max offset) (inclusive) of
        the records the rows came from (``None``/empty for unsequenced writes);
        per Kafka partition the min must exceed every offset seen before.
        ``min_time_ns``/``max_time_ns`` are the rows' min/max time; ``now`` the
        wall time of the write (a ``now`` earlier than a previous one is taken
        as that previous one, wall clocks are not monotonic).
        """
        if isinstance(row_count, bool) or not isinstance(row_count, int) or row_count < 1:
            raise EmptyWriteRange(row_count)
        if min_time_ns > max_time_ns:
            raise InvertedTimeRange(min_time_ns, max_time_ns)
        ranges = self._validate_offsets(offsets)
        now_ns = _wall_ns(now)
        if now_ns < self._last_write_ns:
            now, now_ns = self._time_of_last_write, self._last_write_ns
        self._time_of_last_write, self._last_write_ns = now, now_ns
        for kp, r in ranges.items():
            self._max_offsets[kp] = r.offset_hi_inclusive

        self._rotate(now_ns)
        if self._open is None:
            self._open = _Window(now, now_ns, ranges, row_count, min_time_ns, max_time_ns)
        else:
            self._open.add_range(ranges, row_count, min_time_ns, max_time_ns, now, now_ns)

    def forget_from(self, kp: int, offset: int) -> None:
        """Forgets the offsets at and after ``offset`` of Kafka partition ``kp``: a micro-batch
        attempt recorded them and was withdrawn, and they are not applied before a message at
        ``offset`` is resolved (server/write_buffer/poison.py); once applied they are recorded again. Each window
        keeps only its offsets below ``offset`` (the rows it counts stay counted: an
        over-estimate), the offsets seen end at ``offset - 1``, and an outstanding flush handle's
        checkpoint is cut the same way, so a persist never claims a forgotten offset is persisted."""
        for w in self._windows():
            r = w.offsets.get(kp)
            if r is None:
                continue
            if r.offset_lo_inclusive >= offset:
                del w.offsets[kp]
            elif r.offset_hi_inclusive >= offset:
                w.offsets[kp] = OffsetRange(r.offset_lo_inclusive, offset - 1)
        prev = self._max_offsets.get(kp)
        if prev is not None and prev >= offset:
            if offset > 0:
                self._max_offsets[kp] = offset - 1
            else:
                del self._max_offsets[kp]
        if self._handle is not None:
            frozen = self._handle._offsets.get(kp)
            if frozen is not None and frozen.max_seen_offset >= offset:
                if offset > 0:
                    lo = frozen.min_unpersisted_offset
                    self._handle._offsets[kp] = UnpersistedOffsets(lo if lo is not None and lo < offset else None,
                                                                   offset - 1)
                else:
                    del self._handle._offsets[kp]

    def unseen_ranges(self, offsets: OffsetsArg) -> dict[int, tuple[int, int]]:
        """The parts of ``offsets`` (as ``add_range`` takes them) above every offset seen so far,
        {Kafka partition: (lo, hi)} inclusive; a partition wholly seen is left out. Pure: for a
        micro-batch retried after a failure, whose first attempt recorded its offsets already."""
        out: dict[int, tuple[int, int]] = {}
        for kp, value in (offsets or {}).items():
            lo, hi = ((value.offset_lo_inclusive, value.offset_hi_inclusive)
                      if isinstance(value, OffsetRange) else value)
            prev = self._max_offsets.get(kp)
            if prev is None or lo > prev:
                out[kp] = (lo, hi)
            elif hi > prev:
                out[kp] = (prev + 1, hi)
        return out

    def _validate_offsets(self, offsets: OffsetsArg) -> dict[int, OffsetRange]:
        ranges: dict[int, OffsetRange] = {}
        for kp, value in (offsets or {}).items():
            lo, hi = ((value.offset_lo_inclusive, value.offset_hi_inclusive)
                      if isinstance(value, OffsetRange) else value)
            if lo > hi:
                raise InvertedOffsetRange(kp, lo, hi)
            prev = self._max_offsets.get(kp)
            if prev is not None and lo <= prev:
                raise OffsetNotIncreasing(kp, lo, prev)
            ranges[kp] = OffsetRange(lo, hi)
        return ranges

    # --------------------------------------------------------------- rotation

    def rotate(self, now: float) -> None:
        """Close the open window if old enough; fold old-enough closed windows into the persistable one.

        Closed windows are not folded while a flush handle is outstanding.
        """
        self._rotate(_wall_ns(now))

    def _rotate(self, now_ns: int | None) -> None:
        if self._open is not None and (now_ns is None or self._open.is_closeable(now_ns, self._closed_period_ns)):
            self._closed.append(self._open)
            self._open = None
        if self._handle is not None:
            return
        while self._closed and self._closed[0].is_persistable(now_ns, self._late_ns):
            w = self._closed.popleft()
            if self._persistable is None:
                self._persistable = w
            else:
                self._persistable.add_window(w)

    # ------------------------------------------------------------------ flush

    def flush_handle(self, now: float) -> FlushHandle | None:
        """Freeze what is persistable at ``now`` and return a handle for persisting it.

        Closes the open window first (as IOx).  Returns ``None`` if a handle is
        outstanding or nothing is persistable.
        """
        return self._take_handle(_wall_ns(now))

    def flush_all_handle(self) -> FlushHandle | None:
        """Like :meth:`flush_handle`, but everything unpersisted counts as persistable (``iox persist``)."""
        return self._take_handle(None)

    def _take_handle(self, now_ns: int | None) -> FlushHandle | None:
        if self._handle is not None:
            return None
        if self._open is not None:
            self._closed.append(self._open)
            self._open = None
        self._rotate(now_ns)
        if self._persistable is None:
            return None
        handle = FlushHandle(self, len(self._closed), self._persistable.max_time_ns,
                             self._offset_ranges(skip_persistable=True))
        self._handle = handle
        return handle

    def _check_handle(self, handle: FlushHandle) -> None:
        if handle._windows is not self:
            raise ForeignFlushHandle(handle.table, handle.partition_key, self.table, self.partition_key)
        if handle is not self._handle or not handle.is_outstanding:
            raise FlushHandleReleased(self.table, self.partition_key, handle.state)

    def flush(self, handle: FlushHandle) -> None:
        """Commit a persist: drop the persisted window and truncate the closed windows at the flush timestamp."""
        self._check_handle(handle)
        closed_count = handle.closed_count
        assert len(self._closed) >= closed_count, "windows dropped from closed whilst locked"
        persistable = self._persistable
        assert persistable is not None and persistable.max_time_ns == handle.timestamp_ns
        self._persistable = None
        self._handle = None
        handle._state = "flushed"

        # everything up to and including the flush timestamp has been persisted
        new_min = handle.timestamp_ns + 1
        kept: deque[_Window] = deque()
        for i, w in enumerate(self._closed):
            if i < closed_count:
                if w.min_time_ns < new_min:
                    w.min_time_ns = new_min
                if w.max_time_ns < new_min:
                    continue  # window fully persisted
            kept.append(w)
        self._closed = kept

    def abort(self, handle: FlushHandle) -> None:
        """Give up a persist: release the freeze; nothing is marked persisted (IOx: dropping the handle)."""
        self._check_handle(handle)
        self._handle = None
        handle._state = "aborted"

    # ---------------------------------------------------------------- queries

    def _windows(self) -> Iterator[_Window]:
        """Windows from oldest to youngest: persistable, closed..., open."""
        if self._persistable is not None:
            yield self._persistable
        yield from self._closed
        if self._open is not None:
            yield self._open

    def _minimum_window(self) -> _Window | None:
        return next(self._windows(), None)

    def is_empty(self) -> bool:
        return self._minimum_window() is None

    def offset_ranges(self) -> dict[int, UnpersistedOffsets]:
        """Per Kafka partition: min unpersisted offset (None if none) and max offset seen (IOx ``sequencer_numbers``)."""
        return self._offset_ranges(skip_persistable=False)

    def _offset_ranges(self, skip_persistable: bool) -> dict[int, UnpersistedOffsets]:
        windows = list(self._windows())
        flush_time: int | None = None
        #: windows (after the persistable one) a flush at `flush_time` persists when they end at or
        #: before it: those present when its handle was taken (the closed ones it counted). A
        #: window that came later holds writes no chunk of that persist reads, whatever their time
        covered = 0
        if skip_persistable and self._persistable is not None:
            windows = windows[1:]
            flush_time = self._persistable.max_time_ns
            covered = self._handle.closed_count if self._handle is not None else len(self._closed)
        out: dict[int, UnpersistedOffsets] = {}
        for kp, max_offset in sorted(self._max_offsets.items()):
            lo: int | None = None
            for i, w in enumerate(windows):
                # windows of the handle's time entirely at or before the flush timestamp are persisted by it
                if flush_time is not None and i < covered and w.max_time_ns <= flush_time:
                    continue
                r = w.offsets.get(kp)
                if r is not None:
                    assert r.offset_hi_inclusive <= max_offset
                    lo = r.offset_lo_inclusive
                    break
            out[kp] = UnpersistedOffsets(lo, max_offset)
        return out

    def offset_ranges_after_flush(self) -> dict[int, UnpersistedOffsets]:
        """While a flush handle is outstanding: what stays unpersisted once it is flushed,
        including writes added after the handle was taken (unlike ``FlushHandle.checkpoint``,
        which is frozen at handle time). Such a write stays unpersisted whatever its rows'
        times: the persist reads only the chunks present when its handle was taken. Without a
        handle: ``offset_ranges()``."""
        return self._offset_ranges(skip_persistable=self._handle is not None)

    def minimum_unpersisted_offsets(self) -> dict[int, OffsetRange] | None:
        """Offsets of the oldest window (IOx ``minimum_unpersisted_sequence``)."""
        w = self._minimum_window()
        return None if w is None else dict(w.offsets)

    def time_of_first_unpersisted_write(self) -> float | None:
        """Wall time of the first write of the oldest unpersisted window (IOx ``minimum_unpersisted_age``)."""
        w = self._minimum_window()
        return None if w is None else w.time_of_first_write

    def persistable_age_s(self, now: float) -> float | None:
        """Seconds since the oldest persistable write at ``now``; None if nothing is persistable."""
        now_ns = _wall_ns(now)
        w = self._minimum_window()
        if w is None or not w.is_persistable(now_ns, self._late_ns):
            return None
        return (now_ns - w.first_write_ns) / _NS_PER_S

    def min_unpersisted_time_ns(self) -> int | None:
        """Smallest row time of unpersisted data (IOx ``minimum_unpersisted_timestamp``)."""
        return min((w.min_time_ns for w in self._windows()), default=None)

    def max_unpersisted_time_ns(self) -> int | None:
        """Largest row time of unpersisted data (IOx ``maximum_unpersisted_timestamp``)."""
        return max((w.max_time_ns for w in self._windows()), default=None)

    def persistable_row_count(self, now: float) -> int:
        """Rows in the leading windows that are persistable at ``now`` (an estimate, as in IOx)."""
        now_ns = _wall_ns(now)
        total = 0
        for w in self._windows():
            if not w.is_persistable(now_ns, self._late_ns):
                break
            total += w.row_count
        return total

    def unpersisted_row_count(self) -> int:
        """Rows in all windows (approximate after partial flushes, as IOx summaries)."""
        return sum(w.row_count for w in self._windows())

    def peek_flush_timestamp_ns(self, now: float) -> int | None:
        """The ``timestamp_ns`` :meth:`flush_handle` would give at ``now``, without taking a handle.

        ``None`` if a handle is outstanding or nothing would be persistable.
        """
        if self._handle is not None:
            return None
        now_ns = _wall_ns(now)
        ts: int | None = None
        if self._persistable is not None:
            ts = self._persistable.max_time_ns
        tail = list(self._closed) + ([self._open] if self._open is not None else [])
        for w in tail:
            if not w.is_persistable(now_ns, self._late_ns):
                break
            ts = w.max_time_ns if ts is None else max(ts, w.max_time_ns)
        return ts

    def summaries(self) -> list[WindowSummary]:
        """All windows, oldest first."""
        return [w.summary() for w in self._windows()]

    def persistable_window(self) -> WindowSummary | None:
        return None if self._persistable is None else self._persistable.summary()

    def closed_windows(self) -> list[WindowSummary]:
        return [w.summary() for w in self._closed]

    def open_window(self) -> WindowSummary | None:
        return None if self._open is None else self._open.summary()

    def __repr__(self) -> str:
        return (f"PersistenceWindows(table={self.table!r}, partition_key={self.partition_key!r}, "
                f"persistable={self._persistable is not None}, closed={len(self._closed)}, "
                f"open={self._open is not None}, flushing={self._handle is not None})")
