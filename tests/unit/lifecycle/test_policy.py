"""Tests of lifecycle/rules.py and lifecycle/policy.py.

Three groups: the rules; ports of the tests in IOx ``lifecycle/src/policy.rs``
(adapted where our policy deliberately differs, see each docstring); and runs
over simulated time with a small recording executor that carries out the
actions on real PersistenceWindows and records them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from iox_spark.catalog.checkpoint import DatabaseCheckpoint, ReplayPlan
from iox_spark.catalog.persistence_windows import PersistenceWindows
from iox_spark.lifecycle.errors import InvalidLifecycleRule, InvalidLifecycleState, LifecycleError
from iox_spark.lifecycle.policy import (
    CHUNK_STATES,
    FREE_JOIN_MAX_ROWS,
    Action,
    Backpressure,
    ChunkState,
    CompactChunks,
    DatabaseState,
    DropChunk,
    PartitionState,
    PersistChunks,
    UnloadChunk,
    can_compact_open_chunk,
    decide,
    persist_reason,
    select_compaction_run,
    select_persistable_chunks,
    select_read_buffer_run,
)
from iox_spark.lifecycle.rules import (
    DEFAULT_DRIVER_MEMORY_BYTES,
    LifecycleRules,
    default_buffer_sizes,
    max_active_compactions_for_cpus,
)

NO_LIMITS = {"buffer_size_soft_bytes": None, "buffer_size_hard_bytes": None}


def rules(**kw: object) -> LifecycleRules:
    return LifecycleRules(**{**NO_LIMITS, **kw})  # type: ignore[arg-type]


def chunk(chunk_id: int, last_write: float, state: str, *, rows: int = 10, order: int | None = None,
          min_ts: int = 0, size: int = 20, access: float | None = None) -> ChunkState:
    return ChunkState(chunk_id, chunk_id if order is None else order, state, rows, size, min_ts, min_ts + 1,
                      last_write, access)  # type: ignore[arg-type]


def part(chunks: list[ChunkState], key: str = "p", **kw: object) -> PartitionState:
    return PartitionState("t", key, tuple(chunks), **kw)  # type: ignore[arg-type]


def db(partitions: list[PartitionState], size: int | None = None, **kw: object) -> DatabaseState:
    if size is None:
        size = sum(c.size_bytes for p in partitions for c in p.chunks)
    return DatabaseState(size, tuple(partitions), **kw)  # type: ignore[arg-type]


# ======================================================================= rules


def test_rule_defaults_are_iox_defaults() -> None:
    r = LifecycleRules()
    assert r.persist is True
    assert r.persist_row_threshold == 1_000_000
    assert r.persist_age_threshold_s == 1800
    assert r.late_arrive_window_s == 300
    assert r.persisted_compaction_cold_s == 300  # IOx's cold partition: no write for its late-arrive window
    assert r.mub_row_threshold == 100_000
    assert r.catalog_transactions_until_checkpoint == 100
    assert r.catalog_transaction_prune_age_s == 86_400
    assert r.worker_backoff_ms == 1000 and r.worker_backoff_s == 1.0
    assert r.max_active_compactions == 1
    sizes = default_buffer_sizes(DEFAULT_DRIVER_MEMORY_BYTES)
    assert (r.buffer_size_soft_bytes, r.buffer_size_hard_bytes) == (sizes.soft_bytes, sizes.hard_bytes)


def test_default_buffer_sizes_are_30_and_45_percent() -> None:
    s = default_buffer_sizes(10_000)
    assert (s.soft_bytes, s.hard_bytes) == (3_000, 4_500)
    r = LifecycleRules.for_driver_memory(8 * 1024**3, persist_row_threshold=5)
    assert r.buffer_size_soft_bytes == int(8 * 1024**3 * 0.30)
    assert r.buffer_size_hard_bytes == int(8 * 1024**3 * 0.45)
    assert r.persist_row_threshold == 5
    with pytest.raises(InvalidLifecycleRule):
        default_buffer_sizes(0)


def test_max_active_compactions_for_cpus() -> None:
    assert max_active_compactions_for_cpus(8) == 8
    assert max_active_compactions_for_cpus(8, 0.5) == 4
    assert max_active_compactions_for_cpus(1, 0.1) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("persist_row_threshold", 0), ("mub_row_threshold", -1), ("worker_backoff_ms", 0),
        ("max_active_compactions", 0), ("catalog_transactions_until_checkpoint", 0),
        ("persist_age_threshold_s", 0), ("late_arrive_window_s", float("nan")), ("persist", 1),
        ("buffer_size_soft_bytes", 0), ("persist_row_threshold", True), ("persisted_compaction_cold_s", 0),
    ],
)
def test_rule_validation(field: str, value: object) -> None:
    with pytest.raises(InvalidLifecycleRule) as err:
        LifecycleRules().replace(**{field: value})
    assert err.value.rule == field and isinstance(err.value, LifecycleError)


def test_soft_limit_must_not_exceed_hard_limit() -> None:
    with pytest.raises(InvalidLifecycleRule):
        rules(buffer_size_soft_bytes=10, buffer_size_hard_bytes=9)
    rules(buffer_size_soft_bytes=10, buffer_size_hard_bytes=None)


def test_chunk_states_match_the_catalog() -> None:
    from iox_spark.catalog import chunk as catalog_chunk

    assert CHUNK_STATES == tuple(catalog_chunk.CHUNK_STATES)
    with pytest.raises(InvalidLifecycleState):
        chunk(0, 0, "frozen")


# ============================================================ IOx policy ports


def test_can_move() -> None:
    r = rules(late_arrive_window_s=10, mub_row_threshold=74)
    c = chunk(0, 0, "open")
    assert not can_compact_open_chunk(r, c, 9)
    assert can_compact_open_chunk(r, c, 11)
    assert can_compact_open_chunk(r, chunk(0, 0, "open", rows=73), 11)  # even if small
    assert can_compact_open_chunk(r, chunk(0, 0, "open", rows=74), 0)  # over the row threshold
    assert not can_compact_open_chunk(r, chunk(0, 0, "open", rows=73), 0)
    assert can_compact_open_chunk(r, c, 10)  # boundary is inclusive
    assert not can_compact_open_chunk(r, chunk(0, 20, "open"), 10)  # clock went backwards


def test_sort_free_candidates() -> None:
    """Unload before drop; each by last access, least recent first."""
    r = rules(persist=False, buffer_size_soft_bytes=1, buffer_size_hard_bytes=None)
    p = part([chunk(1, 0, "persisted", access=40), chunk(3, 0, "persisted", access=20),
              chunk(4, 0, "persisted", access=10)])
    # lone closed chunks (no compaction run claims them)
    q = part([chunk(5, 0, "closed", access=10)], "q")
    s = part([chunk(6, 0, "closed", access=5)], "s")
    assert decide(db([p, q, s]), r, 0) == [UnloadChunk("t", "p", 4), UnloadChunk("t", "p", 3),
                                           UnloadChunk("t", "p", 1), DropChunk("t", "s", 6), DropChunk("t", "q", 5)]


def test_default_rules() -> None:
    """The default rules do nothing to a few fresh chunks."""
    p = part([chunk(0, 1, "open"), chunk(1, 1, "open"), chunk(2, 1, "open")])
    assert decide(db([p]), rules(), 40) == []


def test_late_arrival() -> None:
    """IOx compacts chunk 2 alone at t=11; we need a run of two, so all three go at t=20."""
    r = rules(late_arrive_window_s=10)
    p = part([chunk(0, 8, "open"), chunk(1, 5, "open"), chunk(2, 0, "open")])
    assert decide(db([p]), r, 9) == []
    assert decide(db([p]), r, 11) == []
    assert decide(db([p]), r, 20) == [CompactChunks("t", "p", (0, 1, 2))]


def test_buffer_size_soft_drop_non_persisted() -> None:
    r = rules(persist=False, buffer_size_soft_bytes=5)
    assert decide(db([part([chunk(0, 0, "open")])]), r, 10) == []  # only an open chunk: nothing to free

    p = part([
        chunk(0, 0, "open"), chunk(1, 0, "open"),  # open: must not be dropped
        chunk(2, 0, "closed"),  # can be dropped (persist=False)
        chunk(3, 0, "persisting"),  # under an action: untouched
        chunk(4, 0, "persisted", access=100.0),
        chunk(5, 0, "persisted", access=99.0),  # accessed less recently: unloaded first
    ])
    assert decide(db([p]), r, 10) == [UnloadChunk("t", "p", 5), UnloadChunk("t", "p", 4), DropChunk("t", "p", 2)]


def test_buffer_size_soft_dont_drop_non_persisted() -> None:
    r = rules(persist=True, buffer_size_soft_bytes=5)
    p = part([chunk(0, 0, "open"), chunk(1, 0, "open"), chunk(2, 0, "closed"), chunk(3, 0, "persisting"),
              chunk(4, 0, "persisted")], unpersisted_row_count=30)
    # a persist is running, so no forced persist on top
    assert decide(db([p]), r, 10) == [UnloadChunk("t", "p", 4)]


def test_buffer_size_soft_no_op() -> None:
    r = rules(buffer_size_soft_bytes=40)
    assert decide(db([part([chunk(0, 0, "open")])]), r, 10) == []


def test_compact() -> None:
    """IOx test_compact with our contiguity rule (a run never skips a chunk) and runs of >= 2."""
    r = rules(late_arrive_window_s=10, persist_row_threshold=1_000, max_active_compactions=10)
    now = 20
    partitions = [
        part([chunk(0, 20, "open")], "p0"),  # still receiving writes
        part([chunk(1, 20, "open"), chunk(2, 20, "closed")], "p1"),  # IOx compacts [2] alone
        part([chunk(3, 5, "open"), chunk(4, 20, "closed"), chunk(5, 20, "closed"), chunk(6, 20, "persisted"),
              chunk(7, 20, "unloaded")], "p2"),
        part([chunk(8, 20, "closed"), chunk(9, 20, "closed"), chunk(10, 20, "persisted"),
              chunk(11, 20, "unloaded")], "p3"),
        part([chunk(12, 5, "open")], "p4"),  # cold, but alone (IOx moves it to the read buffer)
        part([chunk(13, 5, "closed")], "p5"),  # alone
        part([chunk(14, 20, "closed", rows=400), chunk(15, 20, "closed", rows=1_000),  # 15 too big: ends the run
              chunk(16, 20, "closed", rows=400), chunk(17, 20, "closed", rows=400),
              chunk(18, 20, "closed", rows=400)], "p6"),  # 18 over the remaining row budget
        part([chunk(19, 20, "closed", rows=400, order=5), chunk(20, 20, "compacting", rows=400, order=4),
              chunk(21, 20, "closed", rows=400, order=3), chunk(22, 20, "closed", rows=400, order=2),
              chunk(23, 20, "compacting", rows=400, order=1)], "p7"),  # compacting: left alone
    ]
    assert decide(db(partitions), r, now) == [
        CompactChunks("t", "p2", (3, 4, 5)),
        CompactChunks("t", "p3", (8, 9)),
        CompactChunks("t", "p6", (16, 17)),
    ]
    # chunk order, not id, decides contiguity
    p = part([chunk(19, 20, "closed", order=5), chunk(21, 20, "closed", order=3), chunk(22, 20, "closed", order=2),
              chunk(20, 20, "persisted", order=4)])
    assert select_compaction_run(p, r, now) == (22, 21)


def test_compaction_limiter() -> None:
    r = rules(max_active_compactions=2)
    now = 50
    p0 = part([chunk(0, 20, "closed"), chunk(10, 30, "closed"), chunk(12, 40, "closed")], "p0")
    p1 = part([chunk(1, 20, "closed"), chunk(2, 20, "closed")], "p1")
    p2 = part([chunk(200, 10, "closed"), chunk(201, 10, "closed")], "p2")
    assert decide(db([p0, p1, p2]), r, now) == [
        CompactChunks("t", "p0", (0, 10, 12)), CompactChunks("t", "p1", (1, 2))]
    # p0's compaction still runs: one slot left, p1 done
    p0_running = part([chunk(13, 20, "compacting")], "p0")
    assert decide(db([p0_running, p2]), r, now) == [CompactChunks("t", "p2", (200, 201))]
    # both slots busy: nothing
    p1_running = part([chunk(14, 20, "closed"), chunk(15, 20, "closed")], "p1", compacting=True)
    assert decide(db([p0_running, p1_running, p2]), r, now) == []


def _wb(c: ChunkState) -> ChunkState:
    return replace(c, storage="write_buffer")


def test_write_buffer_runs_joined_as_they_are_take_no_compaction_slot() -> None:
    """Runs of write-buffer chunks (their segments joined, no row merged) are compacted in every
    partition in one decision; a run that merges rows still takes the one slot, first come."""
    r = rules(max_active_compactions=1, read_buffer_delay_s=1_000, queried_read_buffer_delay_s=1_000)
    now = 50
    p0 = part([_wb(chunk(0, 20, "closed")), _wb(chunk(1, 20, "closed"))], "p0")
    p1 = part([chunk(2, 20, "closed"), chunk(3, 20, "closed")], "p1")  # read form: merges rows
    p2 = part([_wb(chunk(4, 20, "closed")), _wb(chunk(5, 20, "closed")), _wb(chunk(6, 20, "open"))], "p2")
    p3 = part([chunk(7, 20, "closed"), chunk(8, 20, "closed")], "p3")  # read form: no slot left
    assert decide(db([p0, p1, p2, p3]), r, now) == [
        CompactChunks("t", "p0", (0, 1)), CompactChunks("t", "p1", (2, 3)), CompactChunks("t", "p2", (4, 5))]
    # the slot busy with another partition's compaction: write-buffer runs are joined all the same
    busy = part([chunk(9, 20, "compacting")], "p4")
    assert decide(db([busy, p1, p2]), r, now) == [CompactChunks("t", "p2", (4, 5))]


def test_a_large_write_buffer_run_takes_the_slot() -> None:
    r = rules(max_active_compactions=1, read_buffer_delay_s=1_000, queried_read_buffer_delay_s=1_000)
    now = 50
    half = FREE_JOIN_MAX_ROWS // 2
    big = part([_wb(chunk(0, 20, "closed", rows=half)), _wb(chunk(1, 20, "closed", rows=half))], "big")
    big2 = part([_wb(chunk(2, 20, "closed", rows=half)), _wb(chunk(3, 20, "closed", rows=half))], "big2")
    small = part([_wb(chunk(4, 20, "closed", rows=half)), _wb(chunk(5, 20, "closed", rows=half - 1))], "small")
    assert decide(db([big, big2, small]), r, now) == [
        CompactChunks("t", "big", (0, 1)), CompactChunks("t", "small", (4, 5))]


def test_a_move_to_the_read_buffer_takes_the_slot() -> None:
    r = rules(max_active_compactions=1, read_buffer_delay_s=10)
    now = 50
    p0 = part([_wb(chunk(0, 20, "closed")), _wb(chunk(1, 20, "closed"))], "p0")  # due: moved, merges rows
    p1 = part([_wb(chunk(2, 45, "closed")), _wb(chunk(3, 45, "closed"))], "p1")  # not due: joined
    p2 = part([_wb(chunk(4, 20, "closed"))], "p2")  # due, but the slot is taken
    assert decide(db([p0, p1, p2]), r, now) == [
        CompactChunks("t", "p0", (0, 1), to_read_buffer=True), CompactChunks("t", "p1", (2, 3))]


def test_persist() -> None:
    """IOx test_persist; partitions with a running compaction are left alone (IOx may persist around it)."""
    r = rules(persist=True, persist_row_threshold=1_000, late_arrive_window_s=10, persist_age_threshold_s=10,
              max_active_compactions=10)
    now = 0.0
    ts = 20
    partitions = [
        # insufficient rows and not old enough => don't persist but can compact
        part([chunk(0, 0, "closed", min_ts=10), chunk(1, 0, "closed", min_ts=5)], "p0",
             persistable_row_count=10, time_of_first_unpersisted_write=now, flush_timestamp_ns=ts),
        # sufficient rows => persist
        part([chunk(2, 0, "closed", min_ts=10), chunk(3, 0, "closed", min_ts=5)], "p1",
             persistable_row_count=1_000, time_of_first_unpersisted_write=now, flush_timestamp_ns=ts),
        # writes too old => persist
        part([chunk(4, 20, "open", min_ts=10), chunk(5, 0, "closed", min_ts=5), chunk(6, 0, "unloaded", min_ts=5)],
             "p2", persistable_row_count=10, time_of_first_unpersisted_write=now - 10, flush_timestamp_ns=ts),
        # sufficient rows but a conflicting compaction => nothing (IOx: stall compaction)
        part([chunk(7, 0, "compacting", min_ts=10), chunk(8, 0, "closed", min_ts=10), chunk(9, 0, "closed", min_ts=5)],
             "p3", persistable_row_count=1_000, time_of_first_unpersisted_write=now, flush_timestamp_ns=ts),
        # sufficient rows and a non-conflicting compaction => IOx persists [11, 12]; we wait for the compaction
        part([chunk(10, 0, "compacting", min_ts=21), chunk(11, 0, "closed", min_ts=10),
              chunk(12, 0, "closed", min_ts=5)],
             "p4", persistable_row_count=1_000, time_of_first_unpersisted_write=now, flush_timestamp_ns=ts),
        # order-based interval, chunks listed in reverse order
        part([chunk(24, 0, "closed", min_ts=25, order=5), chunk(25, 0, "closed", min_ts=5, order=4),
              chunk(26, 0, "closed", min_ts=25, order=3), chunk(27, 0, "closed", min_ts=5, order=2),
              chunk(28, 0, "closed", min_ts=25, order=1)],
             "p6", persistable_row_count=1_000, time_of_first_unpersisted_write=now, flush_timestamp_ns=ts),
        # persistable rows but no flush handle would be granted (e.g. handle outstanding) => nothing
        part([chunk(29, 0, "closed"), chunk(30, 0, "closed")], "p7", persistable_row_count=1_000,
             time_of_first_unpersisted_write=now, flush_timestamp_ns=None),
    ]
    assert decide(db(partitions), r, now) == [
        CompactChunks("t", "p0", (0, 1)),
        PersistChunks("t", "p1", force=False, reason="row_threshold"),
        PersistChunks("t", "p2", force=False, reason="age_threshold"),
        PersistChunks("t", "p6", force=False, reason="row_threshold"),
        CompactChunks("t", "p7", (29, 30)),
    ]
    # the chunks the executor would persist (IOx select_persistable_chunks)
    by_key = {p.partition_key: p for p in partitions}
    assert select_persistable_chunks(by_key["p1"].chunks, ts).chunk_ids == (2, 3)
    assert select_persistable_chunks(by_key["p2"].chunks, ts).chunk_ids == (4, 5)
    assert select_persistable_chunks(by_key["p4"].chunks, ts).chunk_ids == (11, 12)
    assert select_persistable_chunks(by_key["p6"].chunks, ts).chunk_ids == (28, 27, 26, 25)
    blocked = select_persistable_chunks(by_key["p3"].chunks, ts)
    assert blocked.blocked and blocked.blocked_by_chunk_id == 7 and blocked.stall_compaction
    blocked = select_persistable_chunks([chunk(1, 0, "persisting", min_ts=5)], ts)
    assert blocked.blocked and not blocked.stall_compaction


def test_persist_empty() -> None:
    """Windows may think rows are unpersisted after their chunks were deleted: persist anyway."""
    r = rules(persist=True, late_arrive_window_s=10, persist_age_threshold_s=20)
    now = 1_000.0
    p = part([], persistable_row_count=10, time_of_first_unpersisted_write=now - 20, flush_timestamp_ns=20)
    assert decide(db([p]), r, now) == [PersistChunks("t", "p", reason="age_threshold")]
    assert select_persistable_chunks((), 20).chunk_ids == ()


def test_suppress_persistence_during_replay() -> None:
    """IOx new_suppress_persistence: no persist while replaying (and, here, no compaction either)."""
    r = rules(persist=True, persist_row_threshold=1_000, late_arrive_window_s=10, persist_age_threshold_s=10,
              max_active_compactions=10)
    now = 1_000.0
    p = part([chunk(2, 0, "closed", min_ts=10), chunk(3, 0, "closed", min_ts=5)],
             persistable_row_count=1_000, time_of_first_unpersisted_write=now, flush_timestamp_ns=20)
    assert decide(db([p], replaying=True), r, now) == []
    assert decide(db([p], replaying=True), r, now) == []
    assert decide(db([p], replaying=False), r, now) == [PersistChunks("t", "p", reason="row_threshold")]


def test_moves_open_and_closed_need_a_partner() -> None:
    """IOx compacts a lone cold open/closed chunk (MUB -> read buffer); we only merge runs of >= 2."""
    r = rules(late_arrive_window_s=10)
    assert decide(db([part([chunk(0, 40, "open")])]), r, 80) == []
    assert decide(db([part([chunk(0, 40, "closed")])]), r, 80) == []
    assert decide(db([part([chunk(0, 40, "closed"), chunk(1, 40, "open")])]), r, 80) == [
        CompactChunks("t", "p", (0, 1))]


# ================================================================ our rules


def test_age_threshold_boundary_is_exact() -> None:
    r = rules(persist_age_threshold_s=1800)
    p = part([], time_of_first_unpersisted_write=1_700_000_000.1, flush_timestamp_ns=1)
    assert persist_reason(p, r, 1_700_001_800.0999) is None
    assert persist_reason(p, r, 1_700_001_800.1) == "age_threshold"


def test_busy_partitions_are_left_alone_but_persisted_chunks_still_unload() -> None:
    r = rules(persist_row_threshold=10, buffer_size_soft_bytes=1)
    p = part([chunk(1, 0, "persisted"), chunk(2, 0, "closed"), chunk(3, 0, "closed")], persisting=True,
             persistable_row_count=100, time_of_first_unpersisted_write=0, flush_timestamp_ns=5,
             unpersisted_row_count=100)
    assert decide(db([p]), r, 1_000) == [UnloadChunk("t", "p", 1)]


def test_hard_limit_engages_and_releases_backpressure_once() -> None:
    r = rules(buffer_size_soft_bytes=100, buffer_size_hard_bytes=200)
    empty = part([])
    assert decide(db([empty], size=200), r, 0) == []  # at the hard limit: not above it
    assert decide(db([empty], size=201), r, 0) == [Backpressure(True)]
    assert decide(db([empty], size=201, backpressure_engaged=True), r, 0) == []
    assert decide(db([empty], size=150, backpressure_engaged=True), r, 0) == [Backpressure(False)]


def test_soft_limit_force_persists_partition_with_most_unpersisted_rows() -> None:
    r = rules(buffer_size_soft_bytes=100, buffer_size_hard_bytes=1_000)
    small = part([chunk(1, 0, "open", size=30)], "small", unpersisted_row_count=5, persistable_row_count=5)
    big = part([chunk(2, 0, "open", size=80)], "big", unpersisted_row_count=50)
    done = part([chunk(3, 0, "persisted", size=20)], "done")
    assert decide(db([small, big, done]), r, 0) == [
        UnloadChunk("t", "done", 3), PersistChunks("t", "big", force=True, reason="memory")]
    # unloading is enough: no forced persist
    done_big = part([chunk(3, 0, "persisted", size=60)], "done")
    assert decide(db([small, big, done_big], size=150), r, 0) == [UnloadChunk("t", "done", 3)]
    # a persist is already running: wait for it
    running = part([chunk(4, 0, "persisting", size=10)], "running")
    assert decide(db([small, big, running]), r, 0) == []


def test_replay_holds_back_until_the_hard_limit() -> None:
    r = rules(buffer_size_soft_bytes=100, buffer_size_hard_bytes=200, persist_row_threshold=100)
    p = part([chunk(1, 0, "closed", size=100), chunk(2, 0, "closed", size=60)], unpersisted_row_count=20,
             persistable_row_count=20, time_of_first_unpersisted_write=0, flush_timestamp_ns=5)
    # over soft only: nothing to unload, no persist and no compaction during replay
    assert decide(db([p], replaying=True), r, 1_000) == []
    # above the hard limit: backpressure, compaction, and (compaction busy) no forced persist yet
    assert decide(db([p], size=250, replaying=True), r, 1_000) == [
        Backpressure(True), CompactChunks("t", "p", (1, 2))]
    lone = part([chunk(3, 0, "closed", size=250)], unpersisted_row_count=20, persistable_row_count=20,
                time_of_first_unpersisted_write=0, flush_timestamp_ns=5)
    assert decide(db([lone], replaying=True, backpressure_engaged=True), r, 1_000) == [
        PersistChunks("t", "p", force=True, reason="memory")]


def test_drop_never_takes_chunks_of_a_compaction_run() -> None:
    r = rules(persist=False, buffer_size_soft_bytes=1)
    p = part([chunk(1, 0, "closed"), chunk(2, 0, "closed")], "a")
    q = part([chunk(3, 0, "closed")], "b")
    assert decide(db([p, q]), r, 0) == [CompactChunks("t", "a", (1, 2)), DropChunk("t", "b", 3)]


# ===================================================== simulated executor runs

ROW_BYTES = 10


@dataclass
class SimChunk:
    chunk_id: int
    order: int
    state: str
    rows: list[tuple[int, int, int]]  # (kafka partition, offset, time ns)
    time_of_last_write: float

    def view(self) -> ChunkState:
        times = [t for _, _, t in self.rows]
        size = 0 if self.state == "unloaded" else ROW_BYTES * len(self.rows)
        return ChunkState(self.chunk_id, self.order, self.state, len(self.rows), size,  # type: ignore[arg-type]
                          min(times), max(times), self.time_of_last_write)


@dataclass
class SimPartition:
    table: str
    key: str
    windows: PersistenceWindows
    chunks: list[SimChunk] = field(default_factory=list)


class RecordingExecutor:
    """Carries out policy actions instantly on simulated chunks and real PersistenceWindows; records them."""

    def __init__(self, rules: LifecycleRules, now: float) -> None:
        self.rules = rules
        self.start = now
        self.partitions: dict[tuple[str, str], SimPartition] = {}
        self.log: list[tuple[float, Action]] = []
        self.backpressure = False
        self.replaying = False
        self._ids = 0
        self._offsets = {0: 0, 1: 0}

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def write(self, table: str, key: str, kp: int, times: list[int], now: float) -> None:
        p = self.partitions.get((table, key))
        if p is None:
            w = PersistenceWindows(table, key, late_arrive_window_s=self.rules.late_arrive_window_s, now=now)
            p = self.partitions[(table, key)] = SimPartition(table, key, w)
        for sim in p.chunks:
            if sim.state == "open":
                sim.state = "closed"
        off = self._offsets[kp]
        self._offsets[kp] += 1
        cid = self._next_id()
        p.chunks.append(SimChunk(cid, cid, "open", [(kp, off, t) for t in times], now))
        p.windows.add_range({kp: (off, off)}, len(times), min(times), max(times), now)

    def buffer_size(self) -> int:
        return sum(c.view().size_bytes for p in self.partitions.values() for c in p.chunks)

    def snapshot(self, now: float) -> DatabaseState:
        parts = []
        for p in self.partitions.values():
            w = p.windows
            parts.append(PartitionState(
                p.table, p.key, tuple(c.view() for c in p.chunks),
                persistable_row_count=w.persistable_row_count(now),
                unpersisted_row_count=w.unpersisted_row_count(),
                time_of_first_unpersisted_write=w.time_of_first_unpersisted_write(),
                flush_timestamp_ns=w.peek_flush_timestamp_ns(now),
                persisting=w.has_flush_handle,
            ))
        return DatabaseState(self.buffer_size(), tuple(parts), self.replaying, self.backpressure)

    def tick(self, now: float) -> list[Action]:
        actions = decide(self.snapshot(now), self.rules, now)
        for a in actions:
            self.apply(a, now)
        return actions

    def run(self, until: float, step: float, writes: dict[float, list[tuple[str, str, int, list[int]]]]) -> None:
        t = self.start
        while t <= until:
            for table, key, kp, times in writes.get(t, []):
                self.write(table, key, kp, times, t)
            self.tick(t)
            t += step

    def apply(self, action: Action, now: float) -> None:
        self.log.append((now, action))
        if isinstance(action, Backpressure):
            self.backpressure = action.engaged
            return
        p = self.partitions[(action.table, action.partition_key)]
        by_id = {c.chunk_id: c for c in p.chunks}
        if isinstance(action, CompactChunks):
            run = [by_id[cid] for cid in action.chunk_ids]
            assert all(c.state in ("open", "closed") for c in run)
            ordered = [c.chunk_id for c in sorted(p.chunks, key=lambda c: (c.order, c.chunk_id))]
            start = ordered.index(action.chunk_ids[0])
            assert tuple(ordered[start:start + len(run)]) == action.chunk_ids  # contiguous, in order
            merged = SimChunk(self._next_id(), min(c.order for c in run), "closed",
                              [r for c in run for r in c.rows], max(c.time_of_last_write for c in run))
            p.chunks = [c for c in p.chunks if c.chunk_id not in action.chunk_ids] + [merged]
        elif isinstance(action, PersistChunks):
            self._persist(p, action, now)
        elif isinstance(action, UnloadChunk):
            assert by_id[action.chunk_id].state == "persisted"
            by_id[action.chunk_id].state = "unloaded"
        elif isinstance(action, DropChunk):
            p.chunks.remove(by_id[action.chunk_id])

    def _persist(self, p: SimPartition, action: PersistChunks, now: float) -> None:
        handle = p.windows.flush_all_handle() if action.force else p.windows.flush_handle(now)
        assert handle is not None, action
        with handle:
            ts = handle.timestamp_ns
            selection = select_persistable_chunks([c.view() for c in p.chunks], ts)
            assert not selection.blocked
            chosen = [c for c in p.chunks if c.chunk_id in selection.chunk_ids]
            rows = [r for c in chosen for r in c.rows]
            keep = [c for c in p.chunks if c.chunk_id not in selection.chunk_ids]
            done = [r for r in rows if r[2] <= ts]
            rest = [r for r in rows if r[2] > ts]
            if done:
                keep.append(SimChunk(self._next_id(), min(c.order for c in chosen), "persisted", done, now))
            if rest:
                keep.append(SimChunk(self._next_id(), max(c.order for c in chosen), "closed", rest, now))
            p.chunks = keep
            ckpt = handle.checkpoint()
            p.windows.flush(handle)
        # the checkpoint agrees with the chunks: a replay keeps exactly the in-memory unpersisted rows
        plan = ReplayPlan.from_checkpoints([(ckpt, DatabaseCheckpoint(ckpt.offsets))])
        for c in p.chunks:
            for kp, off, t in c.rows:
                assert plan.keep_row(p.table, p.key, kp, off, t) == (c.state in ("open", "closed")), (c, off, t)

    def actions(self, kind: type) -> list[tuple[float, Action]]:
        return [(t, a) for t, a in self.log if isinstance(a, kind)]


def test_sim_age_threshold_crossed_after_n_seconds() -> None:
    r = rules(persist_age_threshold_s=1800, late_arrive_window_s=300, persist_row_threshold=10**9)
    ex = RecordingExecutor(r, now=0.0)
    writes = {float(t): [("cpu", "d1", 0, [t])] for t in range(0, 5_001, 100)}
    ex.run(until=5_200.0, step=10.0, writes=writes)

    persists = ex.actions(PersistChunks)
    # the oldest unpersisted write reaches 1800 s at 1800; the flush persists writes up to
    # 1500 (late-arrival window); the next oldest is 1600 -> 3400, then 5000
    assert [t for t, _ in persists] == [1_800.0, 3_400.0, 5_000.0]
    assert all(a == PersistChunks("cpu", "d1", force=False, reason="age_threshold") for _, a in persists)
    # small chunks were compacted in between (contiguous runs, checked by the executor)
    assert ex.actions(CompactChunks)
    p = ex.partitions[("cpu", "d1")]
    persisted_rows = sorted(r[2] for c in p.chunks if c.state == "persisted" for r in c.rows)
    assert persisted_rows == list(range(0, 4_701, 100))


def test_sim_row_threshold() -> None:
    r = rules(persist_row_threshold=1_000, late_arrive_window_s=60, persist_age_threshold_s=10**6)
    ex = RecordingExecutor(r, now=0.0)
    writes = {float(t): [("cpu", "d1", 1, list(range(t, t + 100)))] for t in range(0, 300, 10)}
    ex.run(until=300.0, step=10.0, writes=writes)
    first_t, first = ex.actions(PersistChunks)[0]
    # windows start at 0, 30, 60, 90 (300 rows each); the 4th becomes persistable at 150
    assert first_t == 150.0
    assert first == PersistChunks("cpu", "d1", force=False, reason="row_threshold")


def test_sim_memory_pressure_force_persist_unload_and_backpressure() -> None:
    r = rules(buffer_size_soft_bytes=5_000, buffer_size_hard_bytes=8_000, persist_row_threshold=10**9,
              persist_age_threshold_s=10**6, late_arrive_window_s=10)
    ex = RecordingExecutor(r, now=0.0)
    ex.run(until=4.0, step=1.0, writes={1.0: [("cpu", "d1", 0, list(range(900)))]})
    assert ex.log == [
        (1.0, Backpressure(True)),
        (1.0, PersistChunks("cpu", "d1", force=True, reason="memory")),
        (2.0, UnloadChunk("cpu", "d1", 2)),
        (3.0, Backpressure(False)),
    ]
    assert ex.buffer_size() == 0
    assert [c.state for c in ex.partitions[("cpu", "d1")].chunks] == ["unloaded"]


def test_sim_replay_then_normal_operation() -> None:
    r = rules(persist_row_threshold=100, late_arrive_window_s=10, persist_age_threshold_s=10**6)
    ex = RecordingExecutor(r, now=0.0)
    ex.replaying = True
    for t in range(0, 50, 5):
        ex.write("cpu", "d1", 0, [t] * 20, float(t))
        ex.tick(float(t))
    assert ex.log == []  # replaying under the limits: nothing
    ex.replaying = False
    actions = ex.tick(50.0)
    assert actions[0] == PersistChunks("cpu", "d1", force=False, reason="row_threshold")


def test_sim_two_partitions_compaction_slots() -> None:
    r = rules(max_active_compactions=1, late_arrive_window_s=5, persist_row_threshold=10**6,
              persist_age_threshold_s=10**6)
    ex = RecordingExecutor(r, now=0.0)
    for t in range(3):
        ex.write("cpu", "d1", 0, [t], float(t))
        ex.write("mem", "d1", 1, [t], float(t))
    # instant executor: one compaction per decision (one slot), the other partition next time
    first = ex.tick(10.0)
    second = ex.tick(11.0)
    assert first == [CompactChunks("cpu", "d1", (1, 3, 5))]
    assert second == [CompactChunks("mem", "d1", (2, 4, 6))]


# ------------------------------------------------- compaction of persisted files


def test_persisted_compaction_waits_for_the_file_threshold_while_the_partition_is_written():
    from iox_spark.lifecycle.policy import CompactPersistedChunks, select_persisted_compaction

    r = rules(persisted_compaction_file_threshold=3, late_arrive_window_s=60.0)
    two = part([chunk(1, 100.0, "persisted"), chunk(2, 100.0, "unloaded"), chunk(3, 100.0, "open")])
    assert select_persisted_compaction(two, r, now=110.0) is None
    assert decide(db([two]), r, now=110.0) == []
    three = part([chunk(1, 100.0, "persisted"), chunk(2, 100.0, "unloaded"), chunk(4, 105.0, "persisted"),
                  chunk(3, 109.0, "open")])
    assert select_persisted_compaction(three, r, now=110.0) == (1, 2, 4)
    assert decide(db([three]), r, now=110.0) == [CompactPersistedChunks("t", "p", (1, 2, 4), reason="file_threshold")]


def test_a_cold_partition_gets_its_files_compacted_from_two_on():
    from iox_spark.lifecycle.policy import CompactPersistedChunks

    r = rules(persisted_compaction_file_threshold=10, persisted_compaction_cold_s=60.0)
    p = part([chunk(1, 100.0, "persisted"), chunk(2, 130.0, "unloaded")])
    assert decide(db([p]), r, now=189.9) == []  # the last write is 59.9 s old
    assert decide(db([p]), r, now=190.0) == [CompactPersistedChunks("t", "p", (1, 2), reason="cold")]
    one = part([chunk(1, 100.0, "persisted"), chunk(3, 100.0, "closed")])
    assert decide(db([one]), r, now=1000.0) == []  # one file: nothing to merge


def test_a_short_late_arrive_window_does_not_make_a_partition_under_load_cold():
    """Under load a partition is written once per micro-batch, seconds apart. With a 2 s
    late-arrive window (rows persistable sooner) it must not count as cold between two of them:
    the compaction would rewrite all its persisted rows while it is still written."""
    from iox_spark.lifecycle.policy import CompactPersistedChunks, select_persisted_compaction

    r = rules(persisted_compaction_file_threshold=10, late_arrive_window_s=2.0, persisted_compaction_cold_s=30.0,
              read_buffer_delay_s=1000.0, queried_read_buffer_delay_s=1000.0)
    # two files, and a fresh chunk last written by the micro-batch 6 s ago (the next one is coming)
    p = part([chunk(1, 90.0, "persisted"), chunk(2, 94.0, "persisted"), chunk(3, 100.0, "open")])
    assert select_persisted_compaction(p, r, now=106.0) is None
    assert decide(db([p]), r, now=106.0) == []
    # writes stopped: cold once the last one is persisted_compaction_cold_s old
    assert select_persisted_compaction(p, r, now=129.9) is None
    assert select_persisted_compaction(p, r, now=130.0) == (1, 2)
    assert decide(db([p]), r, now=130.0) == [CompactPersistedChunks("t", "p", (1, 2), reason="cold")]


def test_persisted_compaction_yields_to_persist_memory_compaction_busy_partitions_and_replay():
    from iox_spark.lifecycle.policy import CompactPersistedChunks

    r = rules(persisted_compaction_file_threshold=2, late_arrive_window_s=60.0, mub_row_threshold=5)
    files = [chunk(1, 0.0, "persisted"), chunk(2, 0.0, "persisted")]
    # in-memory compaction first (two cold closed chunks)
    p = part(files + [chunk(3, 0.0, "closed"), chunk(4, 0.0, "closed")])
    assert decide(db([p]), r, now=100.0) == [CompactChunks("t", "p", (3, 4))]
    # persist first
    p = part(files, persistable_row_count=10**7, flush_timestamp_ns=5)
    assert [type(a) for a in decide(db([p]), r, now=100.0)] == [PersistChunks]
    # busy partition, replay, the compaction budget, persistence disabled: nothing
    assert decide(db([part(files, persisting=True)]), r, now=100.0) == []
    assert decide(db([part(files)], replaying=True), r, now=100.0) == []
    busy_other = part([chunk(9, 0.0, "compacting")], key="q")
    assert decide(db([busy_other, part(files)]), r, now=100.0) == []
    assert decide(db([part(files)]), rules(persist=False, persisted_compaction_file_threshold=2), now=100.0) == []
    assert decide(db([part(files)]), r, now=100.0) == [CompactPersistedChunks("t", "p", (1, 2))]


def test_persisted_compaction_file_threshold_must_be_at_least_two():
    with pytest.raises(InvalidLifecycleRule):
        rules(persisted_compaction_file_threshold=1)


# ============================================================ write-buffer form and the read buffer


def wb(chunk_id: int, last_write: float, state: str = "closed", **kw: object) -> ChunkState:
    """A chunk held only in the write-buffer form."""
    import dataclasses

    return dataclasses.replace(chunk(chunk_id, last_write, state, **kw), storage="write_buffer")  # type: ignore[arg-type]


def test_read_buffer_delay_rule() -> None:
    assert LifecycleRules().read_buffer_delay_s == 30.0
    with pytest.raises(InvalidLifecycleRule):
        rules(read_buffer_delay_s=0)
    with pytest.raises(InvalidLifecycleState):
        ChunkState(1, 1, "closed", 1, 1, 0, 1, 0.0, storage="disk")


def test_write_buffer_chunks_merge_among_themselves_without_the_read_buffer() -> None:
    r = rules(read_buffer_delay_s=30)
    p = part([wb(1, 10), wb(2, 11), wb(3, 12, "open")])
    # the open chunk is warm (late-arrive window 300 s): the two closed ones merge, in the write-buffer form
    assert decide(db([p]), r, 20) == [CompactChunks("t", "p", (1, 2), to_read_buffer=False)]


def test_due_write_buffer_run_moves_to_the_read_buffer_even_alone() -> None:
    r = rules(read_buffer_delay_s=30)
    p = part([chunk(1, 0, "closed"), wb(2, 10), wb(3, 15), wb(4, 50)])
    # chunk 1 already has a read form; 2 and 3 are due (last write >= 30 s ago at 45), 4 is not
    assert decide(db([p]), r, 45) == [CompactChunks("t", "p", (2, 3), to_read_buffer=True)]
    alone = part([wb(7, 0, "open")])
    assert decide(db([alone]), rules(read_buffer_delay_s=30, late_arrive_window_s=10), 31) == \
        [CompactChunks("t", "p", (7,), to_read_buffer=True)]
    # an open chunk that is still warm never moves
    assert decide(db([alone]), rules(read_buffer_delay_s=30, late_arrive_window_s=100), 31) == []


def test_read_buffer_run_row_limit_lets_a_big_first_chunk_move_alone() -> None:
    r = rules(read_buffer_delay_s=1, persist_row_threshold=100)
    p = part([wb(1, 0, rows=500), wb(2, 0, rows=10), wb(3, 0, rows=10)])
    assert decide(db([p]), r, 5) == [CompactChunks("t", "p", (1,), to_read_buffer=True)]
    p = part([wb(2, 0, rows=60), wb(3, 0, rows=30), wb(4, 0, rows=30)])
    assert decide(db([p]), r, 5) == [CompactChunks("t", "p", (2, 3), to_read_buffer=True)]


def test_compaction_runs_do_not_mix_forms() -> None:
    r = rules(read_buffer_delay_s=1000)
    # a read-form chunk between write-buffer ones: no run of 2 of one form
    assert select_compaction_run(part([wb(1, 0), chunk(2, 0, "closed"), wb(3, 0)]), r, 10) is None
    # a form change ends a run and starts the next one
    assert select_compaction_run(part([chunk(1, 0, "closed"), wb(2, 0), wb(3, 0)]), r, 10) == (2, 3)
    assert select_compaction_run(part([chunk(1, 0, "closed"), chunk(2, 0, "closed"), wb(3, 0)]), r, 10) == (1, 2)


def test_memory_relief_skips_chunks_with_nothing_in_memory() -> None:
    r = rules(buffer_size_soft_bytes=10, buffer_size_hard_bytes=1000)
    gone = chunk(1, 0, "persisted", size=0)
    held = chunk(2, 0, "persisted", size=50)
    assert decide(db([part([gone, held])], size=50), r, 1) == [UnloadChunk("t", "p", 2)]


def test_a_queried_tables_write_buffer_chunks_move_to_the_read_buffer_sooner() -> None:
    r = rules(read_buffer_delay_s=30, queried_read_buffer_delay_s=2)
    assert LifecycleRules().queried_read_buffer_delay_s == 2.0
    chunks = [wb(1, 10), wb(2, 11), wb(3, 14)]
    # queried at 12: after chunks 1 and 2 were last written, before chunk 3; at 14 both are 2 s old
    assert decide(db([part(chunks, time_of_last_query=12.0)]), r, 14) == \
        [CompactChunks("t", "p", (1, 2), to_read_buffer=True)]
    # at 12.5 only chunk 1 is 2 s old: it moves alone (a small run does not wait for chunk 2);
    # never queried: nothing moves before 30 s
    assert decide(db([part(chunks, time_of_last_query=12.0)]), r, 12.5) == \
        [CompactChunks("t", "p", (1,), to_read_buffer=True)]
    assert decide(db([part(chunks)]), r, 14) == [CompactChunks("t", "p", (1, 2, 3), to_read_buffer=False)]
    # a query before the writes does not count
    assert decide(db([part(chunks, time_of_last_query=5.0)]), r, 14) == \
        [CompactChunks("t", "p", (1, 2, 3), to_read_buffer=False)]
    with pytest.raises(InvalidLifecycleRule):
        rules(queried_read_buffer_delay_s=0)


def test_a_due_read_buffer_run_waits_for_the_next_write_buffer_chunk_at_most_its_delay() -> None:
    assert LifecycleRules().read_buffer_wait_min_rows == 100_000
    r = rules(read_buffer_delay_s=30, read_buffer_wait_min_rows=30)
    chunks = [chunk(1, 0, "closed"), wb(2, 10), wb(3, 15), wb(4, 50)]
    # 2 and 3 due since 40 and 45; 4 (due at 80) would join them: moved now, the two read-buffer
    # chunks would be merged again later. The partition waits and compacts nothing meanwhile.
    assert decide(db([part(chunks)]), r, 45) == []
    assert decide(db([part(chunks)]), r, 69.9) == []
    # chunk 2 has been due for 30 s (its delay): the run moves without 4
    assert decide(db([part(chunks)]), r, 70) == [CompactChunks("t", "p", (2, 3), to_read_buffer=True)]
    # all three due: one run
    assert decide(db([part(chunks)]), r, 80) == [CompactChunks("t", "p", (2, 3, 4), to_read_buffer=True)]
    # a follower that could not join (row limit) is not waited for
    r100 = rules(read_buffer_delay_s=30, persist_row_threshold=100, read_buffer_wait_min_rows=30)
    big = [wb(2, 10, rows=20), wb(3, 15, rows=20), wb(4, 50, rows=70)]
    assert decide(db([part(big)]), r100, 45) == [CompactChunks("t", "p", (2, 3), to_read_buffer=True)]
    # nor one being persisted, or with a read form
    for follower in (wb(4, 50, "persisting"), chunk(4, 50, "closed")):
        assert select_read_buffer_run(part([wb(2, 10), wb(3, 15), follower]), r, 45) == (2, 3)
    # queried: the wait is the queried delay, counted from when the run became due (the query)
    q = rules(read_buffer_delay_s=30, queried_read_buffer_delay_s=2, read_buffer_wait_min_rows=20)
    queried = part([wb(1, 10), wb(2, 19)], time_of_last_query=20.0)
    assert select_read_buffer_run(queried, q, 20.5) is None
    assert decide(db([queried]), q, 20.5) == []
    assert decide(db([queried]), q, 21) == [CompactChunks("t", "p", (1, 2), to_read_buffer=True)]
    late = part([wb(1, 10), wb(2, 40)], time_of_last_query=50.0)  # chunk 2 is 10 s old at the query
    assert decide(db([late]), q, 50) == [CompactChunks("t", "p", (1, 2), to_read_buffer=True)]
    # a run and follower of fewer than read_buffer_wait_min_rows rows do not wait (merging again is cheap)
    small = rules(read_buffer_delay_s=30, read_buffer_wait_min_rows=31)
    assert decide(db([part(chunks)]), small, 45) == [CompactChunks("t", "p", (2, 3), to_read_buffer=True)]
    with pytest.raises(InvalidLifecycleRule):
        rules(read_buffer_wait_min_rows=0)


def test_a_chunk_whose_rows_were_all_deleted_is_persisted_with_its_neighbours() -> None:
    """A compaction whose every row a delete removed leaves an empty chunk; persist takes it along
    (its rows' windows must be flushed), whatever its time bounds say."""
    from iox_spark.lifecycle.policy import ChunkState, select_persistable_chunks

    def c(i, rows, lo, hi):
        return ChunkState(chunk_id=i, order=i, state="closed", row_count=rows, size_bytes=0, min_time_ns=lo,
                          max_time_ns=hi, time_of_last_write=0.0)

    assert select_persistable_chunks([c(1, 0, 500, 900), c(2, 5, 10, 20)], 100).chunk_ids == (1, 2)
    assert select_persistable_chunks([c(1, 0, 500, 900)], 100).chunk_ids == (1,)


def test_memory_pressure_unloads_every_persisted_chunk_and_force_persists_below_the_soft_limit() -> None:
    """The process tree near --memory-limit-bytes (the RSS, not this buffer's estimate): memory
    relief runs although the buffer is far under its soft limit."""
    r = rules(buffer_size_soft_bytes=10_000, buffer_size_hard_bytes=20_000)
    small = part([chunk(1, 0, "open", size=30)], "small", unpersisted_row_count=5, persistable_row_count=5)
    big = part([chunk(2, 0, "open", size=80)], "big", unpersisted_row_count=50)
    done = part([chunk(3, 0, "persisted", size=20), chunk(4, 0, "persisted", size=20)], "done")
    assert decide(db([small, big, done]), r, 0) == []
    assert decide(db([small, big, done], memory_pressure=True), r, 0) == [
        UnloadChunk("t", "done", 3), UnloadChunk("t", "done", 4), PersistChunks("t", "big", force=True,
                                                                                reason="memory")]


def test_a_frozen_server_force_persists_every_partition_holding_unpersisted_rows() -> None:
    """Frozen (server/write_buffer/freeze.py): nothing new arrives, so every idle partition with
    unpersisted rows is persisted whole, below every threshold; a busy or empty one is not, and a
    replaying server persists nothing (its replay is not caught up)."""
    r = rules()
    small = part([chunk(1, 0, "open", size=30)], "small", unpersisted_row_count=5, persistable_row_count=0)
    busy = part([chunk(2, 0, "persisting", size=30)], "busy", unpersisted_row_count=5, persisting=True)
    empty = part([chunk(3, 0, "persisted", size=20)], "empty")
    assert decide(db([small, busy, empty]), r, 0) == []
    assert decide(db([small, busy, empty], frozen=True), r, 0) == [
        PersistChunks("t", "small", force=True, reason="frozen")]
    assert decide(db([small], frozen=True, replaying=True), r, 0) == []
