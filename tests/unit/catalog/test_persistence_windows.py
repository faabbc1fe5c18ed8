"""Tests of catalog/persistence_windows.py.

The first group ports the tests of IOx ``persistence_windows/src/persistence_windows.rs``
one by one (names kept); wall time is driven by the test.  The rest covers our
additions (abort, flush_all_handle, exact boundaries, errors) and a
model-based property: after any sequence of writes, persists and aborts, the
last checkpoint classifies every row exactly as persisted / not persisted.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.catalog.checkpoint import (
    DatabaseCheckpoint,
    OffsetSection,
    PartitionCheckpoint,
    PersistCheckpointBuilder,
    ReplayPlan,
    UnpersistedOffsets,
    classify_offset,
)
from iox_spark.catalog.errors import (
    CatalogError,
    EmptyWriteRange,
    FlushHandleReleased,
    ForeignFlushHandle,
    InvalidLateArriveWindow,
    InvalidWallTime,
    InvertedOffsetRange,
    InvertedTimeRange,
    OffsetNotIncreasing,
)
from iox_spark.catalog.persistence_windows import (
    DEFAULT_CLOSED_WINDOW_PERIOD_S,
    OffsetRange,
    PersistenceWindows,
    WindowSummary,
)

CW = DEFAULT_CLOSED_WINDOW_PERIOD_S  # 30 s
T0 = 1_000.0  # wall time the windows are created at
S = 1_000_000_000  # ns per second (row times)
R0 = 1_600_000_000 * S  # some row time


def make_windows(late_arrive_window_s: float, now: float = T0) -> PersistenceWindows:
    return PersistenceWindows("table_name", "partition_key", late_arrive_window_s=late_arrive_window_s, now=now)


def seq(kp: int, offset: int) -> dict[int, tuple[int, int]]:
    """One record, like IOx's ``Sequence { id, number }``."""
    return {kp: (offset, offset)}


def U(lo: int | None, hi: int) -> UnpersistedOffsets:
    return UnpersistedOffsets(lo, hi)


# ------------------------------------------------------------------ IOx ports


def test_time_go_backwards() -> None:
    w = make_windows(60)
    w.add_range(seq(1, 1), 1, R0, R0, T0 + 0.5)
    w.add_range(seq(1, 2), 1, R0, R0, T0)  # earlier wall time is accepted
    assert w.time_of_last_write == T0 + 0.5
    assert w.open_window().time_of_last_write == T0 + 0.5
    assert w.open_window().row_count == 2


def test_panics_when_min_time_gt_max_time() -> None:
    w = make_windows(60)
    with pytest.raises(InvertedTimeRange) as err:
        w.add_range(seq(1, 1), 1, R0 + 1, R0, T0)
    assert (err.value.min_time_ns, err.value.max_time_ns) == (R0 + 1, R0)
    assert w.is_empty()


def test_starts_open_window() -> None:
    w = make_windows(60)
    row_t0 = R0
    row_t1 = row_t0 + 1 * S
    row_t2 = row_t1 + 3_000_000
    row_t3 = row_t2 + 3_000_000
    write_t0 = w.time_of_first_write
    write_t1, write_t2, write_t3 = write_t0 + 2, write_t0 + 4, write_t0 + 6

    # write timestamps are purposefully out of order
    w.add_range(seq(1, 2), 1, row_t0, row_t0, write_t0)
    w.add_range(seq(1, 4), 2, row_t1, row_t1, write_t2)
    w.add_range(seq(1, 10), 1, row_t2, row_t3, write_t3)
    w.add_range(seq(2, 23), 10, row_t2, row_t3, write_t1)

    assert w.closed_windows() == []
    assert w.persistable_window() is None
    open_ = w.open_window()
    assert open_.time_of_last_write == write_t3
    assert (open_.min_time_ns, open_.max_time_ns, open_.row_count) == (row_t0, row_t3, 14)
    assert open_.offsets == {1: OffsetRange(2, 10), 2: OffsetRange(23, 23)}


def test_closes_open_window() -> None:
    w = make_windows(60)
    created_at = w.time_of_first_write
    row_t0 = 39_049_493
    row_t1 = row_t0 + 3 * S
    row_t2 = row_t1 + 65_000_000

    w.add_range(seq(1, 2), 1, row_t0, row_t1, created_at)
    w.add_range(seq(1, 3), 1, row_t0, row_t1, created_at)
    after_close_threshold = created_at + CW
    w.add_range(seq(1, 6), 2, row_t1, row_t2, after_close_threshold)

    assert w.persistable_window() is None
    closed = w.closed_windows()
    assert len(closed) == 1
    assert closed[0].offsets == {1: OffsetRange(2, 3)}
    assert (closed[0].row_count, closed[0].min_time_ns, closed[0].max_time_ns) == (2, row_t0, row_t1)
    open_ = w.open_window()
    assert (open_.row_count, open_.min_time_ns, open_.max_time_ns) == (2, row_t1, row_t2)
    assert open_.offsets == {1: OffsetRange(6, 6)}


def test_moves_to_persistable() -> None:
    w = make_windows(120)
    write_t0 = w.time_of_first_write
    start_time = R0
    first_end = R0 + 1
    w.add_range(seq(1, 2), 2, start_time, first_end, write_t0)

    write_t1 = write_t0 + CW
    second_end = R0 + 2
    w.add_range(seq(1, 3), 3, first_end, second_end, write_t1)

    write_t2 = write_t1 + CW
    third_end = R0 + 3
    w.add_range(seq(1, 4), 4, second_end, third_end, write_t2)

    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert (c0.time_of_first_write, c0.row_count, c0.min_time_ns, c0.max_time_ns) == (write_t0, 2, start_time, first_end)
    assert (c1.time_of_first_write, c1.row_count, c1.min_time_ns, c1.max_time_ns) == (write_t1, 3, first_end, second_end)
    o = w.open_window()
    assert (o.time_of_first_write, o.row_count, o.min_time_ns, o.max_time_ns) == (write_t2, 4, second_end, third_end)

    write_t3 = write_t2 + CW * 3
    fourth_end = R0 + 4
    w.add_range(seq(1, 5), 1, fourth_end, fourth_end, write_t3)

    # persistable has first and second
    p = w.persistable_window()
    assert (p.time_of_first_write, p.row_count, p.min_time_ns, p.max_time_ns) == (write_t0, 5, start_time, second_end)
    # and the third window moved to closed
    c = w.closed_windows()[0]
    assert (c.time_of_first_write, c.row_count, c.min_time_ns, c.max_time_ns) == (write_t2, 4, second_end, third_end)

    write_t4 = write_t3 + CW * 100
    w.add_range(seq(1, 9), 2, R0, R0, write_t4)
    p = w.persistable_window()
    assert (p.time_of_first_write, p.row_count, p.min_time_ns, p.max_time_ns) == (write_t0, 10, start_time, fourth_end)


def _three_windows(w: PersistenceWindows, gap_t1: float, times: list[tuple[int, int]]) -> tuple[float, float]:
    """Writes of 2, 3 and 2 rows (offsets 2, 3, 5) at t0, t0+gap_t1, t0+gap_t1+CW."""
    write_t0 = w.time_of_first_write
    write_t1 = write_t0 + gap_t1
    write_t2 = write_t1 + CW
    w.add_range(seq(1, 2), 2, *times[0], write_t0)
    w.add_range(seq(1, 3), 3, *times[1], write_t1)
    w.add_range(seq(1, 5), 2, *times[2], write_t2)
    return write_t1, write_t2


def test_flush_persistable_keeps_open_and_closed() -> None:
    w = make_windows(120)
    start_time = R0
    first_end = start_time + S
    second_start, second_end = first_end + S, first_end + 2 * S
    third_start, third_end = second_end + S, second_end + 2 * S
    write_t1, write_t2 = _three_windows(
        w, CW * 2, [(start_time, first_end), (second_start, second_end), (third_start, third_end)]
    )
    write_t3 = write_t2 + CW

    w.rotate(write_t3)
    p = w.persistable_window()
    assert (p.time_of_first_write, p.row_count, p.min_time_ns, p.max_time_ns) == (T0, 2, start_time, first_end)
    assert w.minimum_unpersisted_offsets() == dict(p.offsets)

    handle = w.flush_handle(write_t3)
    w.flush(handle)

    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert w.minimum_unpersisted_offsets() == dict(c0.offsets)
    assert (c0.row_count, c0.min_time_ns, c0.max_time_ns, c0.time_of_first_write) == (3, second_start, second_end, write_t1)
    assert (c1.row_count, c1.min_time_ns, c1.max_time_ns, c1.time_of_first_write) == (2, third_start, third_end, write_t2)


def test_flush_persistable_overlaps_closed() -> None:
    w = make_windows(120)
    start_time = R0
    second_start = start_time + S
    first_end = second_start + S
    second_end = first_end + S
    third_start = first_end + S
    third_end = third_start + S
    write_t1, write_t2 = _three_windows(
        w, CW * 2, [(start_time, first_end), (second_start, second_end), (third_start, third_end)]
    )
    write_t3 = write_t2 + CW

    w.rotate(write_t3)
    p = w.persistable_window()
    assert (p.row_count, p.min_time_ns, p.max_time_ns) == (2, start_time, first_end)

    flush = w.flush_handle(write_t3)
    assert flush.timestamp_ns == first_end
    truncated_time = flush.timestamp_ns + 1
    w.flush(flush)
    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert w.minimum_unpersisted_offsets() == dict(c0.offsets)
    # the first closed window has its min time truncated by the flush
    assert (c0.row_count, c0.min_time_ns, c0.max_time_ns, c0.time_of_first_write) == (3, truncated_time, second_end, write_t1)
    assert (c1.row_count, c1.min_time_ns, c1.max_time_ns, c1.time_of_first_write) == (2, third_start, third_end, write_t2)


def test_flush_persistable_overlaps_open() -> None:
    w = make_windows(120)
    start_time = R0
    third_start = start_time + S
    first_end = third_start + S
    second_end = first_end + S
    third_end = second_end + S
    write_t1, write_t2 = _three_windows(
        w, CW * 3, [(start_time, first_end), (first_end, second_end), (third_start, third_end)]
    )
    write_t3 = write_t2 + 1

    w.rotate(write_t3)
    p = w.persistable_window()
    assert (p.row_count, p.min_time_ns, p.max_time_ns) == (2, start_time, first_end)

    flush = w.flush_handle(write_t3)
    assert flush.timestamp_ns == first_end
    assert w.open_window() is None
    flushed_time = flush.timestamp_ns + 1
    w.flush(flush)
    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert w.minimum_unpersisted_offsets() == dict(c0.offsets)
    assert (c0.row_count, c0.min_time_ns, c0.max_time_ns, c0.time_of_first_write) == (3, flushed_time, second_end, write_t1)
    # the open window was closed by taking the handle and then truncated by the flush
    assert (c1.row_count, c1.min_time_ns, c1.max_time_ns, c1.time_of_first_write) == (2, flushed_time, third_end, write_t2)


def test_flush_persistable_overlaps_open_and_closed() -> None:
    w = make_windows(120)
    start_time = R0
    second_start = start_time + S
    third_start = second_start + S
    first_end = third_start + S
    second_end = first_end + S
    third_end = second_end + S
    write_t1, write_t2 = _three_windows(
        w, CW * 3, [(start_time, first_end), (second_start, second_end), (third_start, third_end)]
    )
    write_t3 = write_t2 + 1

    p = w.persistable_window()
    assert (p.time_of_first_write, p.row_count, p.min_time_ns, p.max_time_ns) == (T0, 2, start_time, first_end)

    flush = w.flush_handle(write_t3)
    assert flush.timestamp_ns == first_end
    assert w.open_window() is None
    flushed_time = flush.timestamp_ns + 1
    w.flush(flush)
    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert (c0.row_count, c0.min_time_ns, c0.max_time_ns, c0.time_of_first_write) == (3, flushed_time, second_end, write_t1)
    assert (c1.row_count, c1.min_time_ns, c1.max_time_ns, c1.time_of_first_write) == (2, flushed_time, third_end, write_t2)


def test_flush_guard() -> None:
    w = make_windows(120)
    late = w.late_arrive_window_s
    write_t0 = w.time_of_first_write
    write_t1 = write_t0 + late
    write_t2 = write_t1 + late * 2
    row_t0 = R0
    row_t1 = row_t0 + 2 * S
    row_t2 = row_t1 + 2 * S

    w.add_range(seq(1, 2), 2, row_t0, row_t1, write_t0)
    w.rotate(write_t0 + late)
    assert w.persistable_window().row_count == 2
    assert w.persistable_window().max_time_ns == row_t1

    w.add_range(seq(1, 4), 5, row_t0, row_t2, write_t1)
    # should rotate into closed
    w.rotate(write_t1 + CW)
    assert len(w.closed_windows()) == 1

    guard = w.flush_handle(write_t1 + CW)
    # only one handle at once
    assert w.flush_handle(write_t0) is None
    assert w.flush_all_handle() is None

    # no rotation into persistable while the handle is outstanding
    w.rotate(write_t1 + late)
    assert w.persistable_window().row_count == 2

    flush_t = guard.timestamp_ns
    assert flush_t == row_t1
    truncated_time = flush_t + 1

    # the flush checkpoint does not include the writes being persisted
    ckpt = guard.checkpoint()
    assert ckpt.offsets_for(1) == U(4, 4)
    assert ckpt.flush_timestamp_ns == flush_t
    # the partition's offsets include everything
    assert w.offset_ranges()[1] == U(2, 4)

    w.flush(guard)
    assert w.persistable_window() is None
    # no writes between handle and flush: the partition now matches the checkpoint
    assert w.offset_ranges()[1] == ckpt.offsets_for(1)

    # this rotates into persistable
    w.rotate(write_t1 + late)
    assert w.persistable_window().row_count == 5
    assert w.persistable_window().min_time_ns == truncated_time

    guard = w.flush_handle(write_t1 + late)
    # that checkpoint has an empty minimum
    assert guard.checkpoint().offsets_for(1) == U(None, 4)

    w.add_range(seq(1, 9), 9, row_t0, row_t0 + 2 * S, write_t2)
    # rotates into closed
    w.rotate(write_t2 + CW)
    assert len(w.closed_windows()) == 1
    # not into persistable: handle outstanding
    w.rotate(write_t2 + late)
    assert w.persistable_window().row_count == 5

    w.abort(guard)  # IOx: std::mem::drop(guard)
    # this rotates into persistable
    w.rotate(write_t2 + late)
    assert w.persistable_window().row_count == 5 + 9
    assert w.persistable_window().min_time_ns == row_t0


def test_flush_guard_multiple_closed() -> None:
    late = CW * 3
    w = make_windows(late)
    write_t0 = w.time_of_first_write
    write_t1 = write_t0 + CW
    write_t2 = write_t1 + CW
    write_t3 = write_t2 + CW
    write_t4 = write_t3 + CW
    row_t0 = R0
    row_t1 = row_t0 + 2 * S
    row_t2 = row_t1 + 2 * S

    w.add_range(seq(1, 2), 2, row_t0, row_t1, write_t0)
    w.add_range(seq(1, 6), 5, row_t0, row_t2, write_t1)
    w.add_range(seq(1, 9), 9, row_t0, row_t1, write_t2)
    w.add_range(seq(1, 10), 17, row_t0, row_t1, write_t3)

    assert [c.row_count for c in w.closed_windows()] == [5, 9]
    assert w.open_window().row_count == 17

    flush = w.flush_handle(write_t0 + late)
    flush_t = flush.timestamp_ns
    assert w.open_window() is None
    assert flush.closed_count == 3
    assert flush_t == row_t1
    truncated_time = flush_t + 1
    assert w.persistable_window().row_count == 2

    w.add_range(seq(1, 14), 11, row_t0, row_t1, write_t4)
    w.rotate(write_t4 + CW)
    # despite time passing the persistable window is unchanged due to the flush handle
    assert w.persistable_window().row_count == 2
    assert len(w.closed_windows()) == 4

    # the checkpoint includes neither the latest write nor what is being persisted
    ckpt = flush.checkpoint()
    assert ckpt.offsets_for(1) == U(6, 10)
    assert ckpt.flush_timestamp_ns == flush_t
    # the partition's offsets include everything
    assert w.offset_ranges()[1] == U(2, 14)

    w.flush(flush)
    # after the flush they include the new write
    assert w.offset_ranges()[1] == U(6, 14)

    # windows from writes 2 and 3 were completely persisted by the flush
    assert w.persistable_window() is None
    c0, c1 = w.closed_windows()
    assert (c0.time_of_first_write, c0.time_of_last_write) == (write_t1, write_t1)
    assert (c0.min_time_ns, c0.max_time_ns, c0.row_count) == (truncated_time, row_t2, 5)
    # window created after the flush handle is left alone
    assert (c1.time_of_first_write, c1.time_of_last_write) == (write_t4, write_t4)
    assert (c1.min_time_ns, c1.max_time_ns, c1.row_count) == (row_t0, row_t1, 11)


def test_summaries() -> None:
    late = 100
    w = make_windows(late)
    start = w.time_of_first_write
    cwp = w.closed_window_period_s

    # window 1
    w.add_range(seq(1, 1), 11, 10, 11, start + 0.001)
    w.add_range(seq(1, 2), 4, 10, 340, start + 0.030)
    w.add_range(seq(1, 3), 6, 1, 5, start + 0.050)
    # more than the closed window period after the start of window 1 => window 2
    w.add_range(seq(1, 4), 3, 89, 90, start + cwp + 0.001)
    # more than the closed window period after the start of window 2 => window 3
    w.add_range(seq(1, 5), 8, 3, 4, start + cwp * 3)

    def strip(summaries: list[WindowSummary]) -> list[tuple]:
        return [(s.time_of_first_write, s.time_of_last_write, s.min_time_ns, s.max_time_ns, s.row_count) for s in summaries]

    assert strip(w.summaries()) == [
        (start + 0.001, start + 0.050, 1, 340, 21),
        (start + cwp + 0.001, start + cwp + 0.001, 89, 90, 3),
        (start + cwp * 3, start + cwp * 3, 3, 4, 8),
    ]

    # rotate first and second windows into persistable
    w.rotate(start + late + cwp * 2)
    assert strip(w.summaries()) == [
        (start + 0.001, start + cwp + 0.001, 1, 340, 24),
        (start + cwp * 3, start + cwp * 3, 3, 4, 8),
    ]


def test_regression_2206() -> None:
    late = CW * 10
    w = make_windows(late)
    now = w.time_of_first_write
    # window 1: to be persisted
    w.add_range(seq(1, 1), 1, 10, 11, now)
    # window 2: closed but overlaps with the persistence range
    now = now + late
    w.add_range(seq(1, 4), 1, 10, 11, now)

    handle = w.flush_handle(now)
    ckpt = handle.checkpoint()
    w.flush(handle)
    # the speculated checkpoint is correct
    assert w.offset_ranges() == dict(ckpt.offsets)


def test_mark_seen_and_persisted() -> None:
    w = make_windows(100)
    w.mark_seen_and_persisted(PartitionCheckpoint("foo", "bar", {1: U(1, 2)}, R0))
    w.mark_seen_and_persisted(PartitionCheckpoint("foo", "bar", {1: U(0, 1), 2: U(None, 3)}, R0))
    assert w.offset_ranges() == {1: U(None, 2), 2: U(None, 3)}


def test_flush_min_max_timestamp() -> None:
    i64_min, i64_max = -(2**63), 2**63 - 1
    w = make_windows(30)
    t0 = T0
    t1 = t0 + 30
    t2 = t1 + 3
    w.add_range(seq(1, 2), 2, i64_min, i64_max, t0)
    w.add_range(seq(1, 3), 2, i64_min, i64_max, t1)

    handle = w.flush_handle(t2)
    assert handle.timestamp_ns == i64_max
    assert handle.checkpoint().flush_timestamp_ns == i64_max
    w.flush(handle)
    assert w.closed_windows() == []
    assert w.persistable_window() is None


# ------------------------------------------------------------ our additions


def test_rotation_at_exact_decimal_boundaries() -> None:
    # 1_700_000_030.1 - 1_700_000_000.1 is not 30.0 in binary floating point
    t0 = 1_700_000_000.1
    w = PersistenceWindows("t", "p", late_arrive_window_s=60, now=t0)
    w.add_range(seq(0, 0), 1, 1, 1, t0)
    w.rotate(1_700_000_030.0999)
    assert w.open_window() is not None
    w.rotate(1_700_000_030.1)  # exactly the closed window period
    assert w.open_window() is None and len(w.closed_windows()) == 1

    assert w.persistable_row_count(1_700_000_060.0999) == 0
    assert w.peek_flush_timestamp_ns(1_700_000_060.0999) is None
    w.rotate(1_700_000_060.0999)
    assert w.persistable_window() is None
    assert w.persistable_row_count(1_700_000_060.1) == 1  # exactly the late-arrival window
    w.rotate(1_700_000_060.1)
    assert w.persistable_window().row_count == 1
    assert w.persistable_age_s(1_700_000_060.1) == 60.0


def test_closed_window_period_is_min_of_late_window_and_30s() -> None:
    assert make_windows(10).closed_window_period_s == 10
    assert make_windows(300).closed_window_period_s == 30
    w = make_windows(300)
    w.set_late_arrive_window_s(5)
    assert (w.late_arrive_window_s, w.closed_window_period_s) == (5, 5)
    for bad in (0, -1, float("nan"), float("inf"), True, "300"):
        with pytest.raises(InvalidLateArriveWindow):
            make_windows(bad)  # type: ignore[arg-type]


def test_late_arrival_keeps_recent_windows_unpersistable() -> None:
    """Data younger than the late-arrival window is never in a normal flush, whatever its row time."""
    w = make_windows(300)
    w.add_range(seq(0, 0), 5, 100, 200, T0)
    w.add_range(seq(0, 1), 7, 50, 60, T0 + 31)  # late-arriving row times, second window
    assert w.flush_handle(T0 + 299) is None  # nothing persistable yet
    assert w.persistable_row_count(T0 + 300) == 5
    assert w.peek_flush_timestamp_ns(T0 + 300) == 200
    h = w.flush_handle(T0 + 300)
    assert h.timestamp_ns == 200
    # the late rows (time 50..60 <= 200) in the second window are persisted too: the
    # persist writes every row present now with time <= the flush timestamp
    assert h.checkpoint().offsets == {0: U(None, 1)}
    w.flush(h)
    assert w.is_empty()
    assert w.offset_ranges() == {0: U(None, 1)}


def test_flush_handle_while_writes_continue_several_kafka_partitions() -> None:
    w = make_windows(60)
    w.add_range({0: (10, 12), 1: (100, 101)}, 4, 1_000, 2_000, T0)
    w.add_range({0: (13, 13)}, 1, 3_000, 3_000, T0 + 30)
    h = w.flush_handle(T0 + 60)
    assert h.timestamp_ns == 2_000
    # kafka partition 1 is fully persisted; 0 keeps offset 13 (time 3000 > 2000)
    assert h.checkpoint().offsets == {0: U(13, 13), 1: U(None, 101)}

    # writes continue while the persist runs
    w.add_range({1: (102, 103), 2: (7, 7)}, 2, 500, 500, T0 + 61)
    assert w.offset_ranges() == {0: U(10, 13), 1: U(100, 103), 2: U(7, 7)}
    assert w.flush_handle(T0 + 1_000) is None

    w.flush(h)
    # the write during the persist stays unpersisted even though 500 <= flush timestamp
    assert w.offset_ranges() == {0: U(13, 13), 1: U(102, 103), 2: U(7, 7)}
    assert w.unpersisted_row_count() == 3
    assert w.min_unpersisted_time_ns() == 500
    assert w.max_unpersisted_time_ns() == 3_000

    h2 = w.flush_handle(T0 + 1_000)
    assert h2.timestamp_ns == 3_000
    w.flush(h2)
    assert w.is_empty()
    assert w.offset_ranges() == {0: U(None, 13), 1: U(None, 103), 2: U(None, 7)}


def test_abort_leaves_data_unpersisted_and_context_manager_aborts() -> None:
    w = make_windows(60)
    w.add_range(seq(0, 1), 3, 10, 20, T0)
    before = w.offset_ranges()
    with w.flush_handle(T0 + 60) as h:
        assert w.has_flush_handle
        assert w.peek_flush_timestamp_ns(T0 + 60) is None
    assert h.state == "aborted" and not w.has_flush_handle
    assert w.offset_ranges() == before
    assert w.persistable_row_count(T0 + 60) == 3
    with pytest.raises(FlushHandleReleased) as err:
        w.flush(h)
    assert err.value.state == "aborted"

    h2 = w.flush_handle(T0 + 61)
    assert h2 is not None and h2.timestamp_ns == 20
    with h2:
        w.flush(h2)
    assert h2.state == "flushed"
    assert w.is_empty()
    with pytest.raises(FlushHandleReleased):
        w.abort(h2)


def test_context_manager_aborts_on_exception() -> None:
    w = make_windows(60)
    w.add_range(seq(0, 1), 1, 10, 10, T0)
    h = w.flush_handle(T0 + 60)
    with pytest.raises(RuntimeError):
        with h:
            raise RuntimeError("parquet write failed")
    assert h.state == "aborted"
    assert w.flush_handle(T0 + 60) is not None


def test_foreign_handle_rejected() -> None:
    a, b = make_windows(60), PersistenceWindows("other", "p", late_arrive_window_s=60, now=T0)
    a.add_range(seq(0, 1), 1, 10, 10, T0)
    h = a.flush_handle(T0 + 60)
    with pytest.raises(ForeignFlushHandle) as err:
        b.flush(h)
    assert (err.value.handle_table, err.value.table) == ("table_name", "other")


def test_flush_all_handle_persists_recent_writes() -> None:
    w = make_windows(300)
    w.add_range(seq(0, 5), 2, 100, 300, T0)
    w.add_range(seq(0, 6), 1, 50, 50, T0 + 1)
    assert w.flush_handle(T0 + 2) is None  # too young for a normal flush
    h = w.flush_all_handle()
    assert h.timestamp_ns == 300
    assert h.checkpoint().offsets == {0: U(None, 6)}
    w.flush(h)
    assert w.is_empty()
    assert w.flush_all_handle() is None  # nothing left


def test_empty_windows_have_no_handle_and_no_stats() -> None:
    w = make_windows(60)
    assert w.is_empty()
    assert w.flush_handle(T0 + 1_000) is None
    assert w.flush_all_handle() is None
    assert w.persistable_row_count(T0 + 1_000) == 0
    assert w.time_of_first_unpersisted_write() is None
    assert w.persistable_age_s(T0 + 1_000) is None
    assert w.min_unpersisted_time_ns() is None and w.max_unpersisted_time_ns() is None
    assert w.minimum_unpersisted_offsets() is None
    assert w.offset_ranges() == {}


def test_unsequenced_writes() -> None:
    w = make_windows(60)
    w.add_range(None, 2, 1, 2, T0)
    w.add_range({}, 1, 3, 3, T0 + 1)
    assert w.offset_ranges() == {}
    h = w.flush_handle(T0 + 60)
    assert h.checkpoint().offsets == {}
    w.flush(h)
    assert w.is_empty()


def test_add_range_validation_is_atomic() -> None:
    w = make_windows(60)
    w.add_range({0: (5, 9)}, 1, 1, 1, T0)
    with pytest.raises(OffsetNotIncreasing) as err:
        w.add_range({1: (0, 0), 0: (9, 10)}, 1, 1, 1, T0 + 1)
    assert (err.value.kafka_partition, err.value.offset, err.value.previous_max_offset) == (0, 9, 9)
    with pytest.raises(InvertedOffsetRange) as err2:
        w.add_range({1: (3, 2)}, 1, 1, 1, T0 + 1)
    assert err2.value.kafka_partition == 1
    for bad_rows in (0, -1):
        with pytest.raises(EmptyWriteRange):
            w.add_range({0: (10, 10)}, bad_rows, 1, 1, T0 + 1)
    with pytest.raises(InvalidWallTime):
        w.add_range({0: (10, 10)}, 1, 1, 1, float("nan"))
    # nothing of the failed calls was recorded
    assert w.offset_ranges() == {0: U(5, 9)}
    assert w.time_of_last_write == T0
    assert w.unpersisted_row_count() == 1
    assert all(issubclass(e, CatalogError) for e in (OffsetNotIncreasing, InvertedOffsetRange, EmptyWriteRange))


# -------------------------------------------------------------- property test

_op = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 1), st.lists(st.integers(0, 40), min_size=1, max_size=3),
              st.integers(0, 40)),
    st.tuples(st.just("flush"), st.integers(0, 120), st.booleans(),
              st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40)), max_size=2)),
    st.tuples(st.just("flush_all"), st.booleans()),
)


@settings(max_examples=int(os.environ.get("IOX_WINDOWS_EXAMPLES", "300")), deadline=None)
@given(late=st.sampled_from([10, 30, 60, 90]), ops=st.lists(_op, max_size=40))
def test_checkpoint_classifies_every_row_exactly_once(late: int, ops: list) -> None:
    """Model: a persist writes exactly the rows present at handle time with time <= flush timestamp.

    After every committed flush, the replay plan of a single-partition database made of the
    flush's checkpoint and the database checkpoint a persist commits with it (the flush's
    checkpoint and `offset_ranges_after_flush` when it commits: writes keep landing meanwhile,
    also with times at or before the flush timestamp) must replay exactly the rows that are not
    persisted: from its start offset, those its partition checkpoint keeps.
    """
    now = T0
    w = make_windows(late)
    next_offset = {0: 0, 1: 0}
    rows: list[tuple[int, int, int]] = []  # (kafka partition, offset, time)
    persisted: set[int] = set()  # indexes into rows

    def write(kp: int, times: list[int]) -> None:
        off = next_offset[kp]
        next_offset[kp] += 1
        rows.extend((kp, off, t) for t in times)
        w.add_range({kp: (off, off)}, len(times), min(times), max(times), now)

    def check(ckpt: PartitionCheckpoint, db_ckpt: DatabaseCheckpoint) -> None:
        plan = ReplayPlan.from_checkpoints([(ckpt, db_ckpt)])
        for i, (kp, off, t) in enumerate(rows):
            start = plan.start_offset(kp)
            replayed = (start is None or off >= start) and plan.keep_row("table_name", "partition_key", kp, off, t)
            assert replayed == (i not in persisted), (i, rows[i], ckpt, db_ckpt)
        # never claims an unpersisted offset is persisted
        for kp, r in w.offset_ranges().items():
            unpersisted = [off for i, (k, off, _) in enumerate(rows) if k == kp and i not in persisted]
            if unpersisted and r.min_unpersisted_offset is not None:
                assert r.min_unpersisted_offset <= min(unpersisted)
            if unpersisted:
                assert r.min_unpersisted_offset is not None

    for op in ops:
        if op[0] == "write":
            _, kp, times, dt = op
            now += dt
            write(kp, times)
            continue
        if op[0] == "flush":
            _, dt, commit, during = op
            now += dt
            peek = w.peek_flush_timestamp_ns(now)
            h = w.flush_handle(now)
            assert (h.timestamp_ns if h else None) == peek
        else:
            _, commit = op
            during = []
            h = w.flush_all_handle()
        if h is None:
            continue
        to_persist = {i for i, (_, _, t) in enumerate(rows) if t <= h.timestamp_ns and i not in persisted}
        for kp, dt in during:
            now += dt
            write(kp, [dt])  # writes keep landing while the persist runs
        if not commit:
            w.abort(h)
            continue
        persisted |= to_persist
        ckpt = h.checkpoint()
        builder = PersistCheckpointBuilder(ckpt)  # as lifecycle/persist.py builds the pair it commits
        builder.register_other_partition(w.offset_ranges_after_flush())
        _, db_ckpt = builder.build()
        w.flush(h)
        check(ckpt, db_ckpt)
        if not during:
            assert w.offset_ranges() == dict(ckpt.offsets)  # regression 2206, generalised

    assert w.unpersisted_row_count() >= len(rows) - len(persisted) or w.is_empty()


def test_classify_offset_sections() -> None:
    r = U(10, 20)
    assert classify_offset(9, r) is OffsetSection.PERSISTED
    assert classify_offset(10, r) is OffsetSection.PARTIALLY_PERSISTED
    assert classify_offset(20, r) is OffsetSection.PARTIALLY_PERSISTED
    assert classify_offset(21, r) is OffsetSection.UNPERSISTED
    assert classify_offset(20, U(None, 20)) is OffsetSection.PERSISTED
    assert classify_offset(21, U(None, 20)) is OffsetSection.UNPERSISTED


def test_offset_ranges_after_flush_include_writes_added_during_the_flush():
    """What stays unpersisted after a flush: the flushed window is out, later writes are in."""
    w = PersistenceWindows("t", "p", late_arrive_window_s=1.0, now=0.0)
    w.add_range({0: (0, 4)}, 5, 10, 20, now=0.0)
    handle = w.flush_handle(now=100.0)
    assert handle is not None
    assert w.offset_ranges_after_flush()[0].min_unpersisted_offset is None
    w.add_range({0: (5, 6)}, 2, 30, 40, now=101.0)  # arrives while the persist runs
    after = w.offset_ranges_after_flush()[0]
    assert (after.min_unpersisted_offset, after.max_seen_offset) == (5, 6)
    assert handle.checkpoint().offsets_for(0).max_seen_offset == 4  # frozen at handle time
    w.flush(handle)
    assert w.offset_ranges_after_flush()[0].min_unpersisted_offset == 5


def test_offset_ranges_after_flush_keep_writes_at_or_before_the_flush_timestamp_added_during_the_flush():
    """A write that lands while a persist runs is not in that persist's files, whatever its time:
    it stays unpersisted after the flush even when all its rows are at or before the flush
    timestamp (a write after a restart with old timestamps once vanished at the next restart:
    the database checkpoint claimed it persisted)."""
    w = PersistenceWindows("t", "p", late_arrive_window_s=1.0, now=100.0)
    w.add_range({0: (2, 7)}, 6, 13, 30, now=100.0)
    w.add_range({0: (8, 8)}, 1, 9, 9, now=100.5)
    handle = w.flush_handle(now=110.0)
    assert handle.timestamp_ns == 30
    assert handle.checkpoint().offsets_for(0) == U(None, 8)
    w.add_range({0: (10, 10)}, 3, 3, 24, now=110.2)  # times 3..24 <= the flush timestamp 30
    assert w.offset_ranges_after_flush() == {0: U(10, 10)}
    w.add_range({0: (11, 11)}, 1, 40, 40, now=140.0)  # the open window closes and a new one opens
    w.rotate(now=141.0)
    assert w.offset_ranges_after_flush() == {0: U(10, 11)}
    w.flush(handle)
    assert w.offset_ranges() == {0: U(10, 11)}


def test_forget_from_cuts_every_window_the_seen_offsets_and_an_outstanding_handle():
    """Offsets at and after a held message are forgotten everywhere a persist reads them: the
    windows, the offsets seen, and the checkpoint of a flush handle taken before."""
    w = PersistenceWindows("cpu", "2024-01-01", late_arrive_window_s=1.0, now=0.0)
    w.add_range({0: (0, 3), 1: (0, 1)}, 4, 10, 20, 0.0)
    w.add_range({0: (4, 9)}, 6, 30, 40, 0.5)  # one window: 0..9 of partition 0
    handle = w.flush_all_handle()
    w.add_range({0: (10, 12)}, 3, 50, 60, 5.0)  # after the handle: not flushed by it
    w.forget_from(0, 6)
    ranges = w.offset_ranges()
    assert (ranges[0].min_unpersisted_offset, ranges[0].max_seen_offset) == (0, 5)
    assert (ranges[1].min_unpersisted_offset, ranges[1].max_seen_offset) == (0, 1)
    frozen = handle.checkpoint().offsets
    assert frozen[0] == UnpersistedOffsets(None, 5) and frozen[1] == UnpersistedOffsets(None, 1)
    w.flush(handle)
    assert w.offset_ranges()[0] == UnpersistedOffsets(None, 5)  # the window after the handle held 10..12 only
    w.add_range({0: (6, 8)}, 3, 70, 80, 6.0)  # applied again once resolved: recorded again
    assert w.offset_ranges()[0] == UnpersistedOffsets(6, 8)
    w.forget_from(1, 0)
    assert 1 not in w.offset_ranges()
