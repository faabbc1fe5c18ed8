"""The prune policy (pure): reader_lo, which day partitions go, and pruner_hi."""
from __future__ import annotations

from iox_spark.catalog.partition_keys import NS_PER_DAY, partition_key_of_day
from iox_spark.lifecycle.prune_policy import (AdvancePrunerHi, PartitionRef, PrunePartition, RetentionState, SetReaderLo,
                                    decide_prune)

DAY_S = 86_400
#: noon of day 100
NOW_S = 100 * DAY_S + DAY_S / 2


def _parts(*days, busy=()):
    return tuple(PartitionRef("cpu", partition_key_of_day(d), busy=d in busy) for d in days)


def test_no_retention_decides_nothing() -> None:
    assert decide_prune(RetentionState(None, 0, None, _parts(1, 2)), NOW_S) == []
    assert decide_prune(RetentionState(0, 0, None, _parts(1, 2)), NOW_S) == []


def test_whole_days_below_the_delayed_reader_lo_are_pruned() -> None:
    # retention 2 days: reader_lo = day 98 noon; without delay whole days 97 and before go
    state = RetentionState(2 * DAY_S, 0, None, _parts(96, 97, 98, 99, 100))
    assert decide_prune(state, NOW_S) == [
        SetReaderLo(int((NOW_S - 2 * DAY_S) * 1e9)),
        PrunePartition("cpu", partition_key_of_day(96)), PrunePartition("cpu", partition_key_of_day(97)),
        AdvancePrunerHi(98 * NS_PER_DAY)]


def test_the_delay_keeps_the_pruner_behind() -> None:
    # a delay of a day: the bound is reader_lo a day ago = day 97 noon: only day 96 goes
    state = RetentionState(2 * DAY_S, DAY_S, None, _parts(96, 97, 98))
    actions = decide_prune(state, NOW_S)
    assert [a for a in actions if isinstance(a, PrunePartition)] == [PrunePartition("cpu", partition_key_of_day(96))]
    assert actions[-1] == AdvancePrunerHi(97 * NS_PER_DAY)
    assert actions[0].reader_lo_ns > actions[-1].pruner_hi_ns


def test_a_busy_partition_waits_and_holds_pruner_hi_before_it() -> None:
    state = RetentionState(2 * DAY_S, 0, None, _parts(95, 96, 97, busy=(96,)))
    actions = decide_prune(state, NOW_S)
    assert [a.partition_key for a in actions if isinstance(a, PrunePartition)] == \
        [partition_key_of_day(95), partition_key_of_day(97)]
    assert actions[-1] == AdvancePrunerHi(96 * NS_PER_DAY)


def test_pruner_hi_only_grows_and_odd_keys_are_left_alone() -> None:
    parts = (PartitionRef("cpu", "not-a-day"),)
    assert decide_prune(RetentionState(2 * DAY_S, 0, 98 * NS_PER_DAY, parts), NOW_S) == \
        [SetReaderLo(int((NOW_S - 2 * DAY_S) * 1e9))]
    assert decide_prune(RetentionState(2 * DAY_S, 0, 97 * NS_PER_DAY, parts), NOW_S)[-1] == \
        AdvancePrunerHi(98 * NS_PER_DAY)


def test_times_before_1970_are_days_too() -> None:
    state = RetentionState(DAY_S, 0, None, _parts(-3, -1))
    actions = decide_prune(state, 0.0)  # reader_lo = day -1 start
    assert [a.partition_key for a in actions if isinstance(a, PrunePartition)] == [partition_key_of_day(-3)]
    assert actions[-1] == AdvancePrunerHi(-1 * NS_PER_DAY)
