"""Tests of catalog/checkpoint.py.

Ports the tests of IOx ``persistence_windows/src/checkpoint.rs`` and
``min_max_sequence.rs`` (names kept), then checks serialisation and an
end-to-end replay over two partitions built from real PersistenceWindows.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iox_spark.catalog.checkpoint import (
    SEQUENCE_MISSING_WARNING,
    DatabaseCheckpoint,
    OffsetSection,
    PartitionCheckpoint,
    PersistCheckpointBuilder,
    ReplayPlan,
    ReplayPlanner,
    UnpersistedOffsets,
)
from iox_spark.catalog.errors import (
    CatalogError,
    CheckpointDecodeError,
    InvertedOffsetRange,
    PartitionCheckpointMaximumAfterDatabase,
    PartitionCheckpointWithoutDatabase,
    UndeterminedPartitionCheckpointOrder,
)
from iox_spark.catalog.persistence_windows import PersistenceWindows

U = UnpersistedOffsets
U64_MAX = 2**64 - 1


def offsets(spec: dict[int, tuple[int | None, int]]) -> dict[int, UnpersistedOffsets]:
    return {kp: U(lo, hi) for kp, (lo, hi) in spec.items()}


def part_ckpt(table: str, key: str, spec: dict[int, tuple[int | None, int]], flush_ts: int = 0) -> PartitionCheckpoint:
    return PartitionCheckpoint(table, key, offsets(spec), flush_ts)


def db_ckpt(spec: dict[int, tuple[int | None, int]]) -> DatabaseCheckpoint:
    return DatabaseCheckpoint(offsets(spec))


# ------------------------------------------------------ min_max_sequence.rs


def test_opt_min_max_getters_and_equal_values() -> None:
    r = U(10, 20)
    assert (r.min_unpersisted_offset, r.max_seen_offset) == (10, 20)
    assert U(None, 20).min_unpersisted_offset is None
    U(10, 10)


def test_opt_min_max_checks_values() -> None:
    with pytest.raises(InvertedOffsetRange, match=r"min \(11\) is greater than max \(10\)"):
        U(11, 10)


def test_opt_min_max_try_cmp() -> None:
    assert U(10, 10).try_cmp(U(10, 10)) == 0
    assert U(None, 10).try_cmp(U(10, 10)) == 1
    assert U(10, 10).try_cmp(U(None, 10)) == -1
    assert U(None, 10).try_cmp(U(11, 11)) == -1
    assert U(10, 10).try_cmp(U(9, 11)) is None
    assert U(None, 10).try_cmp(U(9, 11)) is None
    assert U(U64_MAX, U64_MAX).try_cmp(U(U64_MAX, U64_MAX)) == 0
    assert U(None, U64_MAX).try_cmp(U(None, U64_MAX)) == 0
    assert U(None, U64_MAX).try_cmp(U(U64_MAX, U64_MAX)) == 1
    assert U(U64_MAX, U64_MAX).try_cmp(U(None, U64_MAX)) == -1


# ------------------------------------------------------------ checkpoint.rs


def test_partition_checkpoint() -> None:
    p = part_ckpt("table_1", "partition_1", {1: (10, 20), 2: (None, 15)})
    assert (p.table, p.partition_key) == ("table_1", "partition_1")
    assert p.offsets_for(1) == U(10, 20)
    assert p.offsets_for(2) == U(None, 15)
    assert p.offsets_for(3) is None
    assert p.kafka_partitions() == [1, 2]
    assert p == part_ckpt("table_1", "partition_1", {2: (None, 15), 1: (10, 20)})
    assert hash(p) == hash(part_ckpt("table_1", "partition_1", {2: (None, 15), 1: (10, 20)}))


def test_partition_checkpoint_partial_cmp() -> None:
    pc = part_ckpt
    assert pc("table_1", "partition_1", {}).try_cmp(pc("table_1", "partition_1", {})) == 0
    # cannot compare if table / partition differs
    assert pc("table_1", "partition_1", {}).try_cmp(pc("table_2", "partition_1", {})) is None
    assert pc("table_1", "partition_1", {}).try_cmp(pc("table_1", "partition_2", {})) is None
    # add kafka partition (last entry)
    assert pc("table_1", "partition_1", {1: (None, 0)}).try_cmp(pc("table_1", "partition_1", {})) == 1
    assert pc("table_1", "partition_1", {}).try_cmp(pc("table_1", "partition_1", {1: (None, 0)})) == -1
    # add kafka partition (middle entry)
    assert pc("table_1", "partition_1", {1: (None, 0), 2: (None, 1)}).try_cmp(
        pc("table_1", "partition_1", {2: (None, 1)})) == 1
    assert pc("table_1", "partition_1", {2: (None, 1)}).try_cmp(
        pc("table_1", "partition_1", {1: (None, 0), 2: (None, 1)})) == -1
    # cannot compare if both add kafka partitions
    assert pc("table_1", "partition_1", {1: (None, 0)}).try_cmp(pc("table_1", "partition_1", {2: (None, 1)})) is None
    # compare based on offsets
    assert pc("table_1", "partition_1", {1: (None, 0)}).try_cmp(pc("table_1", "partition_1", {1: (None, 1)})) == -1
    assert pc("table_1", "partition_1", {1: (1, 1)}).try_cmp(pc("table_1", "partition_1", {1: (0, 2)})) is None
    # cannot compare when the one with the earlier offsets adds a new kafka partition
    assert pc("table_1", "partition_1", {1: (None, 0), 2: (None, 0)}).try_cmp(
        pc("table_1", "partition_1", {1: (None, 1)})) is None
    # compare by both new kafka partition and higher offsets
    assert pc("table_1", "partition_1", {1: (None, 0)}).try_cmp(
        pc("table_1", "partition_1", {1: (None, 1), 2: (None, 0)})) == -1
    # the flush timestamp is not compared (backfills move it backwards)
    assert pc("t", "p", {1: (None, 1)}, flush_ts=5).try_cmp(pc("t", "p", {1: (None, 0)}, flush_ts=9)) == 1


def test_database_checkpoint() -> None:
    d = db_ckpt({1: (10, 20), 2: (None, 15)})
    assert d.offsets_for(1) == U(10, 20)
    assert d.offsets_for(2) == U(None, 15)
    assert d.offsets_for(3) is None
    assert d.kafka_partitions() == [1, 2]
    assert d == db_ckpt({1: (10, 20), 2: (None, 15)})


def test_database_checkpoint_fold() -> None:
    d = db_ckpt({
        1: (10, 20), 2: (None, 15), 3: (None, U64_MAX), 7: (10, 20), 8: (11, 21), 9: (10, 21), 10: (None, 20),
        11: (10, 20), 12: (10, 30), 13: (10, 10), 14: (10, 20), 15: (12, 22), 16: (10, 22),
    })
    folded = d.fold(db_ckpt({
        4: (10, 20), 5: (None, 15), 6: (None, U64_MAX), 7: (11, 21), 8: (10, 20), 9: (11, 20), 10: (10, 20),
        11: (None, 20), 12: (None, 20), 13: (10, 10), 14: (12, 22), 15: (10, 20), 16: (12, 20),
    }))
    assert folded == db_ckpt({
        1: (10, 20), 2: (None, 15), 3: (None, U64_MAX), 4: (10, 20), 5: (None, 15), 6: (None, U64_MAX),
        7: (11, 21), 8: (11, 21), 9: (11, 21), 10: (None, 20), 11: (None, 20), 12: (21, 30), 13: (10, 10),
        14: (12, 22), 15: (12, 22), 16: (12, 22),
    })
    assert d == db_ckpt({  # fold returns a new checkpoint
        1: (10, 20), 2: (None, 15), 3: (None, U64_MAX), 7: (10, 20), 8: (11, 21), 9: (10, 21), 10: (None, 20),
        11: (10, 20), 12: (10, 30), 13: (10, 10), 14: (10, 20), 15: (12, 22), 16: (10, 22),
    })


def test_persist_checkpoint_builder_no_other() -> None:
    orig = part_ckpt("table_1", "partition_1", {1: (10, 20), 2: (None, 15)})
    p, d = PersistCheckpointBuilder(orig).build()
    assert p == orig
    assert d == db_ckpt({1: (10, 20), 2: (None, 15)})


def test_persist_checkpoint_builder_others() -> None:
    orig = part_ckpt("table_1", "partition_1",
                     {1: (10, 20), 2: (5, 15), 3: (15, 26), 5: (None, 10), 7: (None, 11), 8: (5, 10)})
    b = PersistCheckpointBuilder(orig)
    b.register_other_partition(offsets({2: (2, 16), 3: (20, 25), 4: (13, 14), 6: (None, 10), 7: (5, 10), 8: (None, 11)}))
    p, d = b.build()
    assert p == orig
    assert d == db_ckpt({1: (10, 20), 2: (2, 16), 3: (15, 26), 4: (13, 14), 5: (None, 10), 6: (None, 10),
                         7: (5, 11), 8: (5, 11)})


def test_replay_planner_empty() -> None:
    plan = ReplayPlanner().build()
    assert plan.kafka_partitions() == []
    assert plan.replay_range(1) is None
    assert plan.partitions() == []
    assert plan.last_partition_checkpoint("table_1", "partition_1") is None


def test_replay_planner_normal() -> None:
    planner = ReplayPlanner()
    p1 = part_ckpt("table_1", "partition_1", {1: (15, 19), 2: (21, 27), 5: (None, 50), 7: (None, 70), 8: (None, 80),
                                              9: (None, 90), 10: (None, 100), 11: (None, 109)})
    planner.register_checkpoints(p1, db_ckpt({1: (10, 19), 2: (20, 28), 5: (None, 51), 6: (None, 60), 7: (69, 70),
                                              8: (79, 80), 9: (88, 90), 10: (None, 100), 11: (None, 109)}))
    p2 = part_ckpt("table_1", "partition_2", {2: (22, 26), 3: (35, 39), 8: (None, 80), 9: (89, 90), 10: (None, 101),
                                              11: (110, 111)})
    planner.register_checkpoints(p2, db_ckpt({1: (11, 20), 3: (30, 40), 4: (40, 50), 8: (None, 80), 9: (89, 90),
                                              10: (None, 101), 11: (110, 111)}))
    # an older checkpoint of partition_1 (registered out of order) is ignored
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (0, 1)}), db_ckpt({1: (0, 1)}))

    plan = planner.build()
    assert plan.kafka_partitions() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    expected = {1: U(11, 20), 2: U(20, 28), 3: U(30, 40), 4: U(40, 50), 5: U(None, 51), 6: U(None, 60),
                7: U(69, 70), 8: U(None, 80), 9: U(89, 90), 10: U(None, 101), 11: U(110, 111)}
    for kp, r in expected.items():
        assert plan.replay_range(kp) == r, kp
    assert plan.replay_range(12) is None
    assert plan.partitions() == [("table_1", "partition_1"), ("table_1", "partition_2")]
    assert plan.last_partition_checkpoint("table_1", "partition_1") == p1
    assert plan.last_partition_checkpoint("table_1", "partition_2") == p2
    assert plan.last_partition_checkpoint("table_1", "partition_3") is None


def test_replay_planner_fail_undetermined_order() -> None:
    planner = ReplayPlanner()
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (11, 12)}), db_ckpt({1: (11, 22)}))
    with pytest.raises(UndeterminedPartitionCheckpointOrder) as err:
        planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (9, 13)}), db_ckpt({1: (9, 22)}))
    assert (err.value.table, err.value.partition_key) == ("table_1", "partition_1")


def test_replay_planner_fail_missing_database_checkpoint() -> None:
    planner = ReplayPlanner()
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (11, 12), 2: (21, 22)}),
                                 db_ckpt({1: (10, 20), 3: (30, 40)}))
    with pytest.raises(PartitionCheckpointWithoutDatabase) as err:
        planner.build()
    assert err.value.kafka_partition == 2


def test_replay_planner_warns_empty_range_out_of_sync(caplog: pytest.LogCaptureFixture) -> None:
    planner = ReplayPlanner()
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (10, 12)}), db_ckpt({1: (None, 20)}))
    with caplog.at_level(logging.WARNING, logger="iox_spark.catalog.checkpoint"):
        planner.build()
    assert "What happened to these sequence numbers?" in caplog.text


def test_replay_planner_warns_minima_out_of_sync(caplog: pytest.LogCaptureFixture) -> None:
    planner = ReplayPlanner()
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (10, 12)}), db_ckpt({1: (11, 20)}))
    with caplog.at_level(logging.WARNING, logger="iox_spark.catalog.checkpoint"):
        planner.build()
    assert SEQUENCE_MISSING_WARNING in caplog.text


def test_replay_planner_fail_maximum_out_of_sync() -> None:
    planner = ReplayPlanner()
    planner.register_checkpoints(part_ckpt("table_1", "partition_1", {1: (11, 20)}), db_ckpt({1: (10, 12)}))
    with pytest.raises(PartitionCheckpointMaximumAfterDatabase) as err:
        planner.build()
    assert (err.value.partition_max_offset, err.value.database_max_offset) == (20, 12)
    assert isinstance(err.value, CatalogError)


def test_register_partition_and_database_checkpoints_separately() -> None:
    planner = ReplayPlanner()
    planner.register_database_checkpoint(db_ckpt({0: (5, 9)}))
    planner.register_partition_checkpoint(part_ckpt("t", "p", {0: (7, 9)}))
    planner.register_partition_checkpoint(part_ckpt("t", "p", {0: (7, 9)}))  # identical: no-op
    plan = planner.build()
    assert plan.replay_range(0) == U(5, 9)
    assert plan.last_partition_checkpoint("t", "p") == part_ckpt("t", "p", {0: (7, 9)})


# ------------------------------------------------------------- replay filter


def test_replay_plan_start_offsets_and_row_filter() -> None:
    p = part_ckpt("cpu", "2024-01-01", {0: (10, 20), 1: (None, 7)}, flush_ts=1_000)
    plan = ReplayPlan.from_checkpoints([(p, db_ckpt({0: (8, 25), 1: (None, 9)}))])
    assert plan.start_offset(0) == 8 and plan.needs_replay(0)
    assert plan.start_offset(1) == 10 and not plan.needs_replay(1)
    assert plan.start_offset(2) is None and not plan.needs_replay(2)

    keep = plan.keep_row
    assert keep("cpu", "2024-01-01", 0, 9, 5) is False  # below min: persisted
    assert plan.classify("cpu", "2024-01-01", 0, 9) is OffsetSection.PERSISTED
    assert keep("cpu", "2024-01-01", 0, 10, 1_000) is False  # within: time <= flush ts persisted
    assert keep("cpu", "2024-01-01", 0, 20, 1_001) is True  # within: time > flush ts not persisted
    assert keep("cpu", "2024-01-01", 0, 21, 5) is True  # above max: replay everything
    assert keep("cpu", "2024-01-01", 1, 7, 5) is False
    assert keep("cpu", "2024-01-01", 1, 8, 5) is True
    assert keep("cpu", "2024-01-01", 3, 0, 5) is True  # kafka partition unknown to the partition
    assert keep("cpu", "2024-01-02", 0, 0, 5) is True  # partition never persisted


def test_end_to_end_two_partitions_replay_exactly_the_unpersisted_rows() -> None:
    t0 = 1_000.0
    a = PersistenceWindows("cpu", "day1", late_arrive_window_s=60, now=t0)
    b = PersistenceWindows("mem", "day1", late_arrive_window_s=60, now=t0)
    rows: list[tuple[str, int, int, int]] = []  # (table, kafka partition, offset, time)
    log = {0: 0, 1: 0}

    def write(w: PersistenceWindows, kp: int, times: list[int], now: float) -> None:
        off = log[kp]
        log[kp] += 1
        rows.extend((w.table, kp, off, t) for t in times)
        w.add_range({kp: (off, off)}, len(times), min(times), max(times), now)

    write(a, 0, [10, 20], t0)
    write(b, 0, [15], t0 + 1)
    write(a, 1, [30], t0 + 2)
    write(b, 1, [5, 40], t0 + 31)
    write(a, 0, [25, 50], t0 + 45)

    h = a.flush_handle(t0 + 62)
    assert h.timestamp_ns == 30
    persisted = {(r[0], r[1], r[2], r[3]) for r in rows if r[0] == "cpu" and r[3] <= 30}
    write(a, 1, [1], t0 + 63)  # lands while persisting
    builder = PersistCheckpointBuilder(h.checkpoint())
    builder.register_other_partition(b.offset_ranges())
    part, db = builder.build()
    a.flush(h)

    # the checkpoints go through JSON like a catalog transaction
    part = PartitionCheckpoint.from_dict(json.loads(json.dumps(part.to_dict())))
    db = DatabaseCheckpoint.from_dict(json.loads(json.dumps(db.to_dict())))
    plan = ReplayPlan.from_checkpoints([(part, db)])

    def replays(r: tuple[str, int, int, int]) -> bool:
        start = plan.start_offset(r[1])  # consumption starts here (None: unknown, from the beginning)
        read = start is None or r[2] >= start
        return read and plan.keep_row(r[0], "day1", r[1], r[2], r[3])

    assert {r for r in rows if replays(r)} == set(rows) - persisted
    # replay starts at the oldest offset still unpersisted anywhere: mem's writes
    assert (plan.start_offset(0), plan.start_offset(1)) == (1, 1)
    assert plan.last_partition_checkpoint("mem", "day1") is None


# ------------------------------------------------------------ serialisation

_range = st.one_of(
    st.tuples(st.none(), st.integers(0, 2**63)),
    st.integers(0, 2**63).flatmap(lambda hi: st.tuples(st.integers(0, hi), st.just(hi))),
)
_offsets = st.dictionaries(st.integers(0, 1024), _range, max_size=6)


@given(table=st.text(max_size=8), key=st.text(max_size=8), spec=_offsets, ts=st.integers(-(2**63), 2**63 - 1))
def test_partition_checkpoint_json_round_trip(table: str, key: str, spec: dict, ts: int) -> None:
    p = part_ckpt(table, key, spec, ts)
    assert PartitionCheckpoint.from_dict(json.loads(json.dumps(p.to_dict()))) == p


@given(spec=_offsets)
def test_database_checkpoint_json_round_trip(spec: dict) -> None:
    d = db_ckpt(spec)
    assert DatabaseCheckpoint.from_dict(json.loads(json.dumps(d.to_dict()))) == d


def test_to_dict_shape() -> None:
    p = part_ckpt("cpu", "2024-01-01", {1: (None, 4), 0: (3, 9)}, flush_ts=77)
    assert p.to_dict() == {
        "table": "cpu",
        "partition_key": "2024-01-01",
        "offsets": [
            {"kafka_partition": 0, "min_unpersisted_offset": 3, "max_seen_offset": 9},
            {"kafka_partition": 1, "min_unpersisted_offset": None, "max_seen_offset": 4},
        ],
        "flush_timestamp_ns": 77,
    }


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ([], "partition_checkpoint"),
        ({"table": "t", "partition_key": "p", "offsets": []}, "partition_checkpoint"),
        ({"table": 1, "partition_key": "p", "offsets": [], "flush_timestamp_ns": 0}, "table"),
        ({"table": "t", "partition_key": "p", "offsets": {}, "flush_timestamp_ns": 0}, "offsets"),
        ({"table": "t", "partition_key": "p", "offsets": [], "flush_timestamp_ns": "0"}, "flush_timestamp_ns"),
        ({"table": "t", "partition_key": "p", "offsets": [{"kafka_partition": 0, "max_seen_offset": 1}],
          "flush_timestamp_ns": 0}, "offsets[0]"),
        ({"table": "t", "partition_key": "p", "offsets": [
            {"kafka_partition": 0, "min_unpersisted_offset": 5, "max_seen_offset": 1}], "flush_timestamp_ns": 0},
         "offsets[0]"),
        ({"table": "t", "partition_key": "p", "offsets": [
            {"kafka_partition": 0, "min_unpersisted_offset": None, "max_seen_offset": 1},
            {"kafka_partition": 0, "min_unpersisted_offset": None, "max_seen_offset": 2}], "flush_timestamp_ns": 0},
         "offsets[1]"),
        ({"table": "t", "partition_key": "p", "offsets": [
            {"kafka_partition": True, "min_unpersisted_offset": None, "max_seen_offset": 1}], "flush_timestamp_ns": 0},
         "offsets[0].kafka_partition"),
    ],
)
def test_partition_checkpoint_decode_errors(value: object, field: str) -> None:
    with pytest.raises(CheckpointDecodeError) as err:
        PartitionCheckpoint.from_dict(value)
    assert err.value.field == field


def test_database_checkpoint_decode_errors() -> None:
    with pytest.raises(CheckpointDecodeError):
        DatabaseCheckpoint.from_dict({})
    with pytest.raises(CheckpointDecodeError):
        DatabaseCheckpoint.from_dict("x")
