"""Checkpoints of what is persisted, and the replay plan built from them.

A port of IOx ``persistence_windows/src/checkpoint.rs`` in our terms: an IOx
*sequencer* is a Kafka partition (an ``int``) and a *sequence number* is a
Kafka offset.

Invariant kept here: for every Kafka partition a checkpoint names
``min_unpersisted_offset`` (inclusive; ``None`` = nothing unpersisted up to
the max) and ``max_seen_offset`` (inclusive), and together with a partition's
``flush_timestamp_ns`` this classifies every write-buffer record exactly once::

    offset < min_unpersisted_offset              -> PERSISTED   (skip it)
    min_unpersisted_offset <= offset <= max_seen -> PARTIALLY   (replay rows
                                                     with time > flush timestamp)
    offset > max_seen_offset                     -> UNPERSISTED (replay all)

so a replay that follows a :class:`ReplayPlan` re-ingests every acknowledged
row that is not in Parquet, and none that is.

All types are immutable and round-trip through plain JSON-able dicts
(``to_dict`` / ``from_dict``) for the preserved catalog.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from iox_spark.catalog.errors import (
    CheckpointDecodeError,
    InvertedOffsetRange,
    PartitionCheckpointMaximumAfterDatabase,
    PartitionCheckpointWithoutDatabase,
    UndeterminedPartitionCheckpointOrder,
)

__all__ = [
    "UnpersistedOffsets",
    "PartitionCheckpoint",
    "DatabaseCheckpoint",
    "PersistCheckpointBuilder",
    "OffsetSection",
    "classify_offset",
    "ReplayPlanner",
    "ReplayPlan",
]

_log = logging.getLogger(__name__)

#: Message logged (IOx wording) when a partition checkpoint claims unpersisted
#: offsets that the folded database checkpoint considers persisted.
SEQUENCE_MISSING_WARNING = (
    "Last partition checkpoint states that there is unpersisted data, but the final "
    "database state deems it fully persisted. What happened to these sequence numbers?"
)


def _cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _combine(global_outcome: int, local_outcome: int) -> int | None:
    """Fold one partial-order outcome into the running one (None = incomparable)."""
    if global_outcome == 0:
        return local_outcome
    if local_outcome == 0 or local_outcome == global_outcome:
        return global_outcome
    return None


@dataclass(frozen=True)
class UnpersistedOffsets:
    """Per Kafka partition: first unpersisted offset and last seen offset (IOx ``OptionalMinMaxSequence``).

    Both bounds are inclusive.  ``min_unpersisted_offset is None`` means every
    offset up to and including ``max_seen_offset`` is persisted.
    """

    min_unpersisted_offset: int | None
    max_seen_offset: int

    def __post_init__(self) -> None:
        if self.min_unpersisted_offset is not None and self.min_unpersisted_offset > self.max_seen_offset:
            raise InvertedOffsetRange(None, self.min_unpersisted_offset, self.max_seen_offset)

    @property
    def _effective_min(self) -> int:
        # "nothing unpersisted up to max" behaves like a minimum of max + 1
        if self.min_unpersisted_offset is None:
            return self.max_seen_offset + 1
        return self.min_unpersisted_offset

    def try_cmp(self, other: UnpersistedOffsets) -> int | None:
        """Partial order of two ranges of the same Kafka partition: -1, 0, 1 or None (incomparable)."""
        return _combine(_cmp(self._effective_min, other._effective_min), _cmp(self.max_seen_offset, other.max_seen_offset))

    def to_dict(self) -> dict[str, Any]:
        return {"min_unpersisted_offset": self.min_unpersisted_offset, "max_seen_offset": self.max_seen_offset}


def _freeze_offsets(offsets: Mapping[int, UnpersistedOffsets]) -> Mapping[int, UnpersistedOffsets]:
    return MappingProxyType(dict(sorted(offsets.items())))


def _offsets_to_list(offsets: Mapping[int, UnpersistedOffsets]) -> list[dict[str, Any]]:
    return [{"kafka_partition": kp, **r.to_dict()} for kp, r in offsets.items()]


def _require_int(value: Any, field: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointDecodeError(field, f"expected an integer, got {value!r}")
    return value


def _offsets_from_list(value: Any, field: str) -> dict[int, UnpersistedOffsets]:
    if not isinstance(value, list):
        raise CheckpointDecodeError(field, f"expected a list, got {type(value).__name__}")
    out: dict[int, UnpersistedOffsets] = {}
    for i, entry in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(entry, Mapping):
            raise CheckpointDecodeError(where, f"expected an object, got {type(entry).__name__}")
        try:
            kp = _require_int(entry["kafka_partition"], f"{where}.kafka_partition")
            lo = _require_int(entry["min_unpersisted_offset"], f"{where}.min_unpersisted_offset", optional=True)
            hi = _require_int(entry["max_seen_offset"], f"{where}.max_seen_offset")
        except KeyError as missing:
            raise CheckpointDecodeError(where, f"missing key {missing.args[0]!r}") from None
        if kp in out:
            raise CheckpointDecodeError(where, f"duplicate kafka_partition {kp}")
        try:
            out[kp] = UnpersistedOffsets(lo, hi)
        except InvertedOffsetRange as err:
            raise CheckpointDecodeError(where, str(err)) from None
    return out


@dataclass(frozen=True, eq=True)
class PartitionCheckpoint:
    """What of one table partition is persisted, as planned by a flush (IOx ``PartitionCheckpoint``).

    ``offsets`` holds, per Kafka partition, what remains unpersisted *after*
    the flush; ``flush_timestamp_ns`` is the flush timestamp: rows of the
    partition with ``time <= flush_timestamp_ns`` among offsets in
    ``[min_unpersisted_offset, max_seen_offset]`` are persisted, the others not.
    """

    table: str
    partition_key: str
    offsets: Mapping[int, UnpersistedOffsets]
    flush_timestamp_ns: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", _freeze_offsets(self.offsets))

    def __hash__(self) -> int:
        return hash((self.table, self.partition_key, tuple(self.offsets.items()), self.flush_timestamp_ns))

    def offsets_for(self, kafka_partition: int) -> UnpersistedOffsets | None:
        """Range of ``kafka_partition``; ``None`` if this partition never saw it (replay all of it)."""
        return self.offsets.get(kafka_partition)

    def kafka_partitions(self) -> list[int]:
        return list(self.offsets)

    def try_cmp(self, other: PartitionCheckpoint) -> int | None:
        """Partial order (IOx ``PartialOrd``): -1, 0, 1, or None if not comparable.

        Comparable only for the same table and partition key; Kafka partitions may
        only be added, and every shared range must move the same way.  The flush
        timestamp is NOT compared (it may go backwards during backfills).
        """
        if (self.table, self.partition_key) != (other.table, other.partition_key):
            return None
        outcome = 0
        for kp in sorted(set(self.offsets) | set(other.offsets)):
            mine, theirs = self.offsets.get(kp), other.offsets.get(kp)
            if theirs is None:
                local = 1  # Kafka partition introduced in self
            elif mine is None:
                local = -1  # Kafka partition introduced in other
            else:
                cmp = mine.try_cmp(theirs)
                if cmp is None:
                    return None
                local = cmp
            combined = _combine(outcome, local)
            if combined is None:
                return None
            outcome = combined
        return outcome

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "partition_key": self.partition_key,
            "offsets": _offsets_to_list(self.offsets),
            "flush_timestamp_ns": self.flush_timestamp_ns,
        }

    @classmethod
    def from_dict(cls, value: Any) -> PartitionCheckpoint:
        if not isinstance(value, Mapping):
            raise CheckpointDecodeError("partition_checkpoint", f"expected an object, got {type(value).__name__}")
        try:
            table, key = value["table"], value["partition_key"]
            offsets = _offsets_from_list(value["offsets"], "offsets")
            flush_ts = _require_int(value["flush_timestamp_ns"], "flush_timestamp_ns")
        except KeyError as missing:
            raise CheckpointDecodeError("partition_checkpoint", f"missing key {missing.args[0]!r}") from None
        for name, text in (("table", table), ("partition_key", key)):
            if not isinstance(text, str):
                raise CheckpointDecodeError(name, f"expected a string, got {text!r}")
        return cls(table, key, offsets, flush_ts)


@dataclass(frozen=True, eq=True)
class DatabaseCheckpoint:
    """Per Kafka partition, the unpersisted range over the whole database (IOx ``DatabaseCheckpoint``).

    ``offset < min_unpersisted_offset`` is persisted everywhere; offsets up to
    ``max_seen_offset`` may be partially persisted; later offsets are not.
    """

    offsets: Mapping[int, UnpersistedOffsets]

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", _freeze_offsets(self.offsets))

    def __hash__(self) -> int:
        return hash(tuple(self.offsets.items()))

    def offsets_for(self, kafka_partition: int) -> UnpersistedOffsets | None:
        """Range to consider for replay; ``None`` = unknown partition, start normal playback."""
        return self.offsets.get(kafka_partition)

    def kafka_partitions(self) -> list[int]:
        return list(self.offsets)

    def fold(self, other: DatabaseCheckpoint) -> DatabaseCheckpoint:
        """Combine with another checkpoint into the last known state (IOx ``DatabaseCheckpoint::fold``).

        Per Kafka partition the result takes the larger max and the larger
        (effective) min, since both only move forward over time.
        """
        merged = dict(self.offsets)
        for kp, theirs in other.offsets.items():
            mine = merged.get(kp)
            if mine is None:
                merged[kp] = theirs
                continue
            hi = max(mine.max_seen_offset, theirs.max_seen_offset)
            lo = max(mine._effective_min, theirs._effective_min)
            merged[kp] = UnpersistedOffsets(lo if lo <= hi else None, hi)
        return DatabaseCheckpoint(merged)

    def to_dict(self) -> dict[str, Any]:
        return {"offsets": _offsets_to_list(self.offsets)}

    @classmethod
    def from_dict(cls, value: Any) -> DatabaseCheckpoint:
        if not isinstance(value, Mapping):
            raise CheckpointDecodeError("database_checkpoint", f"expected an object, got {type(value).__name__}")
        if "offsets" not in value:
            raise CheckpointDecodeError("database_checkpoint", "missing key 'offsets'")
        return cls(_offsets_from_list(value["offsets"], "offsets"))


def _merge_min_max(a: UnpersistedOffsets, b: UnpersistedOffsets) -> UnpersistedOffsets:
    if a.min_unpersisted_offset is None:
        lo = b.min_unpersisted_offset
    elif b.min_unpersisted_offset is None:
        lo = a.min_unpersisted_offset
    else:
        lo = min(a.min_unpersisted_offset, b.min_unpersisted_offset)
    return UnpersistedOffsets(lo, max(a.max_seen_offset, b.max_seen_offset))


class PersistCheckpointBuilder:
    """Builds the (partition, database) checkpoint pair of one persist (IOx ``PersistCheckpointBuilder``).

    Start from the persisted partition's :meth:`FlushHandle.checkpoint`, then
    register the unpersisted offset ranges of every *other* partition of the
    database (their ``PersistenceWindows.offset_ranges()``).  The database
    checkpoint takes per Kafka partition the smallest min and the largest max.
    """

    def __init__(self, partition_checkpoint: PartitionCheckpoint) -> None:
        self._partition_checkpoint = partition_checkpoint
        self._offsets: dict[int, UnpersistedOffsets] = dict(partition_checkpoint.offsets)

    def register_other_partition(self, offsets: Mapping[int, UnpersistedOffsets]) -> None:
        for kp, theirs in offsets.items():
            mine = self._offsets.get(kp)
            self._offsets[kp] = theirs if mine is None else _merge_min_max(mine, theirs)

    def build(self) -> tuple[PartitionCheckpoint, DatabaseCheckpoint]:
        return self._partition_checkpoint, DatabaseCheckpoint(self._offsets)


class OffsetSection(enum.Enum):
    """Where a record's offset lies relative to a partition checkpoint (IOx ``SequenceNumberSection``)."""

    #: all rows of the record are persisted: skip it
    PERSISTED = "persisted"
    #: rows may be persisted: keep only rows with time > flush timestamp
    PARTIALLY_PERSISTED = "partially_persisted"
    #: the record came after the checkpoint: replay all of its rows
    UNPERSISTED = "unpersisted"


def classify_offset(offset: int, offsets: UnpersistedOffsets) -> OffsetSection:
    """Classify ``offset`` of one Kafka partition against that partition's checkpoint range."""
    if offset > offsets.max_seen_offset:
        return OffsetSection.UNPERSISTED
    if offsets.min_unpersisted_offset is not None and offset >= offsets.min_unpersisted_offset:
        return OffsetSection.PARTIALLY_PERSISTED
    return OffsetSection.PERSISTED


class ReplayPlanner:
    """Collects the checkpoints found in the preserved catalog (IOx ``ReplayPlanner``).

    Register checkpoint pairs in catalog order; it is enough to register the
    last partition checkpoint of every partition and the last database
    checkpoint, but registering all of them is valid.
    """

    def __init__(self) -> None:
        self._database_checkpoint = DatabaseCheckpoint({})
        self._last_partition_checkpoints: dict[tuple[str, str], PartitionCheckpoint] = {}

    def register_partition_checkpoint(self, partition_checkpoint: PartitionCheckpoint) -> None:
        """Keep the newest checkpoint per (table, partition key), by :meth:`PartitionCheckpoint.try_cmp`."""
        key = (partition_checkpoint.table, partition_checkpoint.partition_key)
        existing = self._last_partition_checkpoints.get(key)
        if existing is None:
            self._last_partition_checkpoints[key] = partition_checkpoint
            return
        order = partition_checkpoint.try_cmp(existing)
        if order is None:
            raise UndeterminedPartitionCheckpointOrder(key[0], key[1])
        if order > 0:
            self._last_partition_checkpoints[key] = partition_checkpoint

    def register_database_checkpoint(self, database_checkpoint: DatabaseCheckpoint) -> None:
        """Fold a database checkpoint into the last known database state."""
        self._database_checkpoint = self._database_checkpoint.fold(database_checkpoint)

    def register_checkpoints(
        self, partition_checkpoint: PartitionCheckpoint, database_checkpoint: DatabaseCheckpoint
    ) -> None:
        """Register the pair written by one persist (IOx ``register_checkpoints``)."""
        self.register_partition_checkpoint(partition_checkpoint)
        self.register_database_checkpoint(database_checkpoint)

    def build(self) -> ReplayPlan:
        """Check the checkpoints against each other and return the plan.

        Raises :class:`PartitionCheckpointWithoutDatabase` or
        :class:`PartitionCheckpointMaximumAfterDatabase` when the catalog is
        inconsistent; logs a warning (as IOx) when a partition claims
        unpersisted offsets the database considers persisted.
        """
        db = self._database_checkpoint
        for (table, key), ckpt in sorted(self._last_partition_checkpoints.items()):
            for kp, part_range in ckpt.offsets.items():
                db_range = db.offsets_for(kp)
                if db_range is None:
                    raise PartitionCheckpointWithoutDatabase(table, key, kp)
                part_min, db_min = part_range.min_unpersisted_offset, db_range.min_unpersisted_offset
                if part_min is not None and (db_min is None or part_min < db_min):
                    _log.warning(
                        "%s (table=%r partition_key=%r kafka_partition=%d database=%r partition=%r)",
                        SEQUENCE_MISSING_WARNING, table, key, kp, db_range, part_range,
                    )
                if part_range.max_seen_offset > db_range.max_seen_offset:
                    raise PartitionCheckpointMaximumAfterDatabase(
                        table, key, kp, part_range.max_seen_offset, db_range.max_seen_offset
                    )
        return ReplayPlan(db.offsets, dict(self._last_partition_checkpoints))


class ReplayPlan:
    """What to replay after a restart (IOx ``ReplayPlan``).

    Per Kafka partition, :meth:`replay_range` gives the inclusive offsets to
    re-read; with only a max, nothing is replayed and consumption starts at
    ``max + 1``; an unknown Kafka partition starts normal playback.
    :meth:`keep_row` filters the rows replayed from a record.
    """

    def __init__(
        self,
        replay_ranges: Mapping[int, UnpersistedOffsets],
        last_partition_checkpoints: Mapping[tuple[str, str], PartitionCheckpoint],
    ) -> None:
        self._replay_ranges = _freeze_offsets(replay_ranges)
        self._last = MappingProxyType(dict(sorted(last_partition_checkpoints.items())))

    def replay_range(self, kafka_partition: int) -> UnpersistedOffsets | None:
        return self._replay_ranges.get(kafka_partition)

    def kafka_partitions(self) -> list[int]:
        """Sorted Kafka partitions the plan knows."""
        return list(self._replay_ranges)

    def partitions(self) -> list[tuple[str, str]]:
        """Sorted (table, partition key) pairs that have a checkpoint."""
        return list(self._last)

    def last_partition_checkpoint(self, table: str, partition_key: str) -> PartitionCheckpoint | None:
        """The newest checkpoint of a partition; ``None`` = never persisted, replay all its rows."""
        return self._last.get((table, partition_key))

    def start_offset(self, kafka_partition: int) -> int | None:
        """First offset to consume (replay start, or max + 1 when nothing needs replay); None = unknown."""
        r = self._replay_ranges.get(kafka_partition)
        if r is None:
            return None
        return r.min_unpersisted_offset if r.min_unpersisted_offset is not None else r.max_seen_offset + 1

    def needs_replay(self, kafka_partition: int) -> bool:
        r = self._replay_ranges.get(kafka_partition)
        return r is not None and r.min_unpersisted_offset is not None

    def classify(self, table: str, partition_key: str, kafka_partition: int, offset: int) -> OffsetSection:
        """Where a record at ``offset`` stands for one table partition (IOx ``filter_entry``).

        No checkpoint for the partition, or the partition never saw this Kafka
        partition, means nothing of it is persisted: UNPERSISTED.
        """
        ckpt = self._last.get((table, partition_key))
        offsets = ckpt.offsets_for(kafka_partition) if ckpt is not None else None
        if offsets is None:
            return OffsetSection.UNPERSISTED
        return classify_offset(offset, offsets)

    def keep_row(self, table: str, partition_key: str, kafka_partition: int, offset: int, time_ns: int) -> bool:
        """True if a replayed row must be ingested again (it is not in Parquet)."""
        section = self.classify(table, partition_key, kafka_partition, offset)
        if section is OffsetSection.UNPERSISTED:
            return True
        if section is OffsetSection.PERSISTED:
            return False
        ckpt = self._last[(table, partition_key)]
        return time_ns > ckpt.flush_timestamp_ns

    @classmethod
    def from_checkpoints(cls, pairs: Iterable[tuple[PartitionCheckpoint, DatabaseCheckpoint]]) -> ReplayPlan:
        """Convenience: register ``pairs`` in order and build."""
        planner = ReplayPlanner()
        for part, db in pairs:
            planner.register_checkpoints(part, db)
        return planner.build()
