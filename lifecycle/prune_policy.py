"""The prune policy: from a database's retention state and ``now``, what the retention task does.

Pure (state in, actions out; no clock, no catalog, no Spark), like lifecycle/policy.py.
The worker (lifecycle/worker.py) runs :func:`decide_prune` every round for each database
with a retention period and carries the actions out, one at a time; a failing prune never
stops the others, and the pruner's watermark then stops before the failed partition.

Watermarks (catalog/retention.py):

* ``reader_lo_ns = now - period``: :class:`SetReaderLo` every round (queries hide, and
  writes refuse, anything older at once).
* The pruner runs ``prune_delay_s`` behind: it drops a day partition (and its Parquet
  files) only once the whole day lies below ``reader_lo`` as of ``now - prune_delay_s``,
  so a query planned with an older ``reader_lo`` a moment ago is never cut short by the
  pruner, and the drop happens well after the rows became invisible.

Invariants kept here:

* :class:`PrunePartition` names only a partition whose day ends (exclusive) at or before
  the prune bound, and never one that is persisting or compacting (it waits for the next round).
* :class:`AdvancePrunerHi` is emitted only when the watermark grows; its value is the prune
  bound rounded down to a day boundary, lowered to the start of any busy partition below it,
  so everything older than ``pruner_hi_ns`` is in a pruned partition (once the prunes succeeded).
* ``pruner_hi_ns <= reader_lo_ns``.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Union

from iox_spark.catalog.partition_keys import NS_PER_DAY
from iox_spark.catalog.retention import reader_lo_ns

__all__ = ["DEFAULT_PRUNE_DELAY_S", "PartitionRef", "RetentionState", "SetReaderLo", "PrunePartition", "AdvancePrunerHi", "PruneAction",
           "decide_prune", "prune_bound_ns", "day_bounds_ns"]

_EPOCH = datetime.date(1970, 1, 1)
#: How long the pruner stays behind reader_lo (seconds) unless configured (`iox serve --prune-delay-s`):
#: queries planned with an older reader_lo finish long before their rows' files go.
DEFAULT_PRUNE_DELAY_S = 3600.0


@dataclass(frozen=True)
class PartitionRef:
    """One table partition as the prune policy sees it."""

    table: str
    #: the UTC day, YYYY-MM-DD (catalog/partition_keys.py)
    partition_key: str
    #: a persist or compaction holds it
    busy: bool = False


@dataclass(frozen=True)
class RetentionState:
    """One database's retention at one instant."""

    #: retention period; 0 / None = no retention (nothing is decided)
    period_s: int | None
    #: how long the pruner stays behind reader_lo
    prune_delay_s: float
    pruner_hi_ns: int | None = None
    partitions: tuple[PartitionRef, ...] = ()


@dataclass(frozen=True)
class SetReaderLo:
    reader_lo_ns: int


@dataclass(frozen=True)
class PrunePartition:
    """Drop the partition's chunks and Parquet files (a preserved-catalog transaction)."""

    table: str
    partition_key: str


@dataclass(frozen=True)
class AdvancePrunerHi:
    """Record ``pruner_hi_ns`` once the prunes of this round are done (see the module invariants)."""

    pruner_hi_ns: int


PruneAction = Union[SetReaderLo, PrunePartition, AdvancePrunerHi]


def day_bounds_ns(partition_key: str) -> tuple[int, int] | None:
    """[start, end) in ns of a day partition key; None for a key that is not a day."""
    try:
        day = (datetime.date.fromisoformat(partition_key) - _EPOCH).days
    except ValueError:
        return None
    return day * NS_PER_DAY, (day + 1) * NS_PER_DAY


def prune_bound_ns(period_s: int, prune_delay_s: float, now_s: float) -> int:
    """The pruner's bound: reader_lo as of ``now_s - prune_delay_s``."""
    return reader_lo_ns(period_s, now_s - prune_delay_s)  # type: ignore[return-value]


def decide_prune(state: RetentionState, now_s: float) -> list[PruneAction]:
    """The retention task's actions now: SetReaderLo, then one PrunePartition per partition
    entirely below the prune bound (input order), then AdvancePrunerHi when it grows. Nothing
    without a retention period."""
    if not state.period_s:
        return []
    lo = reader_lo_ns(state.period_s, now_s)
    actions: list[PruneAction] = [SetReaderLo(lo)]
    bound = min(prune_bound_ns(state.period_s, state.prune_delay_s, now_s), lo)
    whole_days = (bound // NS_PER_DAY) * NS_PER_DAY  # whole days only
    target = whole_days
    for p in state.partitions:
        days = day_bounds_ns(p.partition_key)
        if days is None or days[1] > whole_days:
            continue
        if p.busy:
            target = min(target, days[0])
            continue
        actions.append(PrunePartition(p.table, p.partition_key))
    if state.pruner_hi_ns is None or target > state.pruner_hi_ns:
        actions.append(AdvancePrunerHi(target))
    return actions
