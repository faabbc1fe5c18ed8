"""Preserved catalog: an append-only transaction log with exactly one committer.

Invariant kept here (docs/ARCHITECTURE.md invariant 8, "One committer"): revision ``N``
of a database's catalog is the object ``<db>/catalog/<%020d N>.txn``, created
with the store's atomic ``put_if_absent``.  Of any number of writers that try
to commit revision ``N + 1`` on top of revision ``N`` exactly one succeeds; the
others get :class:`RevisionConflict`, are fenced (their catalog object refuses
every further commit) and must stop.  A writer that does not commit learns it
lost the database by probing for the next transaction key
(:meth:`PreservedCatalog.newer_revision`): one existence check, no listing;
it relies on transactions never being deleted.  Every transaction names the uuid of its
predecessor, so loading verifies an unbroken chain ``0, 1, ..., N`` (or ``c+1,
..., N`` after the newest full checkpoint ``<%020d c>.ckpt``) and refuses to
start from anything else.

The state is a pure function of the log: :func:`apply_action` is the only code
that changes a :class:`CatalogState`, and loading and committing both use it,
so a freshly loaded catalog equals the one that committed.

File format (JSON, ``format_version`` in every file; a version outside
``READABLE_FORMAT_VERSIONS`` raises :class:`FormatVersionMismatch`)::

    transaction: {"format_version": 1, "type": "transaction", "db": ...,
                  "revision": N, "uuid": ..., "previous_uuid": ... | null,
                  "timestamp_s": ..., "actions": [{"kind": ..., ...}, ...]}
    checkpoint:  {"format_version": 1, "type": "checkpoint", "db": ...,
                  "revision": N, "uuid": <uuid of transaction N>,
                  "timestamp_s": ..., "state": {...}}

Versions: 1 is the base format. 2 adds the write-buffer records ``lost_writes``
and ``accepted_poisoned_messages`` (actions, and the state keys of the same
names). 3 (``FORMAT_VERSION``) adds retention: ``retention`` (the database's
retention period) and ``pruned`` (the pruner's watermark ``pruner_hi_ns``),
actions and state keys of the same names. A file is written with the lowest
version that holds it (``_KIND_VERSIONS``): a transaction with none of these
actions, or a checkpoint whose state holds none of these records, is version 1,
so a catalog that never recorded one stays readable by a server that reads
version 1 only (which refuses a newer file with its own FormatVersionMismatch;
a server reading up to 2 refuses a version-3 file the same way). A file whose
version is lower than a record it holds needs is corrupt.

A field added to an action after version 1 is optional: it is written only
when set, and a file without it reads as the field's default (``topic_id``,
``complete`` and ``seq_origin`` of ``database_checkpoint``; a missing
``seq_origin`` means the legacy ``_iox_seq`` layout, see catalog/seq_layout.py).

Action kinds (``"kind"`` field) and their dataclasses: ``add_parquet``
(:class:`AddParquet`), ``remove_parquet`` (:class:`RemoveParquet`),
``partition_checkpoint`` (:class:`RecordPartitionCheckpoint`),
``database_checkpoint`` (:class:`RecordDatabaseCheckpoint`),
``delete_predicate`` (:class:`AddDeletePredicate`), ``schema``
(:class:`SetTableSchema`); version 2: ``lost_writes``
(:class:`RecordLostWrites`: every loss of acknowledged writes the server found,
accepted or not, replacing the list recorded before) and
``accepted_poisoned_messages`` (:class:`RecordAcceptedPoison`: every
write-buffer message an operator accepted to skip because applying it failed,
replacing the list recorded before; replay skips them); version 3:
``retention`` (:class:`RecordRetention`: the retention period, replacing the one
before; 0 removes it) and ``pruned`` (:class:`RecordPruned`: the pruner's
watermark after a prune, never lower than the one before).

Everything here runs on the driver.  :class:`PreservedCatalog` is not
picklable (a committer must never be shipped to an executor); the action
dataclasses and :class:`CatalogState` are plain picklable values.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import uuid as _uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from iox_spark.catalog.errors import (
    AlreadyExists,
    CorruptCatalogFile,
    FormatVersionMismatch,
    InvalidAction,
    ObjectNotFound,
    PartitionsNotOwned,
    PreviousUuidMismatch,
    RevisionConflict,
    RevisionGap,
)
from iox_spark.catalog.object_store import ObjectStore, catalog_prefix
from iox_spark.catalog.ownership import ClaimPartitions, PartitionOwner, check_ownership, claim_epochs
from iox_spark.catalog.seq_layout import SEQ_MAX, SEQ_ROWS_PER_OFFSET

__all__ = [
    "DEFAULT_TRANSACTIONS_UNTIL_CHECKPOINT",
    "FORMAT_VERSION",
    "BASE_FORMAT_VERSION",
    "READABLE_FORMAT_VERSIONS",
    "Action",
    "AcceptedPoisonEntry",
    "LostWritesEntry",
    "RecordAcceptedPoison",
    "RecordLostWrites",
    "RecordPruned",
    "RecordRetention",
    "AddDeletePredicate",
    "AddParquet",
    "CatalogState",
    "ColumnSpec",
    "PreservedCatalog",
    "PreservedCatalogConfig",
    "RecordDatabaseCheckpoint",
    "RecordPartitionCheckpoint",
    "RemoveParquet",
    "SetTableSchema",
    "action_from_json",
    "apply_action",
    "apply_actions",
    "checkpoint_key",
    "read_state",
    "read_next_state",
    "transaction_key",
]

_log = logging.getLogger(__name__)

#: The newest format version (see the module docstring): written into a file that holds a record
#: of that version; every other file is written as BASE_FORMAT_VERSION.
FORMAT_VERSION = 4
#: The version of a file that holds only what version 1 knows.
BASE_FORMAT_VERSION = 1
#: Versions this code reads; a file with any other raises FormatVersionMismatch.
READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)
#: A full checkpoint file is written once this many revisions passed since the last one.
DEFAULT_TRANSACTIONS_UNTIL_CHECKPOINT = 100

_TXN_SUFFIX = "txn"
_CKPT_SUFFIX = "ckpt"
_FILE_RE = re.compile(r"^(\d{20})\.(txn|ckpt)$")
_TYPE_TRANSACTION = "transaction"
_TYPE_CHECKPOINT = "checkpoint"

#: One column of a schema: (name, role, type), e.g. ("host", "tag", "string").
ColumnSpec = tuple[str, str, str]


@dataclass(frozen=True)
class PreservedCatalogConfig:
    """Tuning of a :class:`PreservedCatalog`.

    ``transactions_until_checkpoint``: a full ``.ckpt`` snapshot is written
    after a commit once this many revisions passed since the newest
    checkpoint (default :data:`DEFAULT_TRANSACTIONS_UNTIL_CHECKPOINT`), so a
    load reads one checkpoint plus fewer than this many transactions.
    """

    transactions_until_checkpoint: int = DEFAULT_TRANSACTIONS_UNTIL_CHECKPOINT

    def __post_init__(self) -> None:
        if not isinstance(self.transactions_until_checkpoint, int) or self.transactions_until_checkpoint < 1:
            raise ValueError("transactions_until_checkpoint must be an int >= 1")


def transaction_key(db: str, revision: int) -> str:
    """Object key of transaction ``revision`` of ``db``."""
    return f"{catalog_prefix(db)}{revision:020d}.{_TXN_SUFFIX}"


def checkpoint_key(db: str, revision: int) -> str:
    """Object key of the full checkpoint at ``revision`` of ``db``."""
    return f"{catalog_prefix(db)}{revision:020d}.{_CKPT_SUFFIX}"


# --------------------------------------------------------------------------- validation helpers


def _int(kind: str, name: str, value: Any, *, minimum: int | None = None, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidAction(kind, f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidAction(kind, f"{name} must be >= {minimum}, got {value}")
    return value


def _str(kind: str, name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidAction(kind, f"{name} must be a non-empty string, got {value!r}")
    return value


def _columns(kind: str, name: str, value: Any) -> tuple[ColumnSpec, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidAction(kind, f"{name} must be a list of [name, role, type]")
    out: list[ColumnSpec] = []
    seen: set[str] = set()
    for col in value:
        if isinstance(col, (str, bytes)) or not isinstance(col, Sequence) or len(col) != 3:
            raise InvalidAction(kind, f"{name}: column {col!r} is not [name, role, type]")
        spec = tuple(_str(kind, f"{name} entry", part) for part in col)
        if spec[0] in seen:
            raise InvalidAction(kind, f"{name}: column {spec[0]!r} appears twice")
        seen.add(spec[0])
        out.append(spec)  # type: ignore[arg-type]
    return tuple(out)


def _sequencer_numbers(kind: str, value: Any) -> dict[int, tuple[int | None, int]]:
    """{kafka_partition: (min_unpersisted_offset | None, max_seen_offset)}; JSON keys may be strings."""
    if not isinstance(value, Mapping):
        raise InvalidAction(kind, "sequencer_numbers must be a mapping {kafka_partition: [min, max]}")
    out: dict[int, tuple[int | None, int]] = {}
    for raw_partition, rng in value.items():
        try:
            partition = int(raw_partition)
        except (TypeError, ValueError):
            raise InvalidAction(kind, f"sequencer_numbers: kafka partition {raw_partition!r} is not an int") from None
        if isinstance(raw_partition, bool) or partition < 0:
            raise InvalidAction(kind, f"sequencer_numbers: bad kafka partition {raw_partition!r}")
        if isinstance(rng, (str, bytes)) or not isinstance(rng, Sequence) or len(rng) != 2:
            raise InvalidAction(kind, f"sequencer_numbers[{partition}] must be [min_unpersisted, max_seen]")
        lo = _int(kind, f"sequencer_numbers[{partition}] min", rng[0], optional=True)
        hi = _int(kind, f"sequencer_numbers[{partition}] max", rng[1])
        out[partition] = (lo, hi)  # type: ignore[assignment]
    return dict(sorted(out.items()))


def _sequencer_json(numbers: Mapping[int, tuple[int | None, int]]) -> dict[str, list[int | None]]:
    return {str(p): [lo, hi] for p, (lo, hi) in sorted(numbers.items())}


def _float(kind: str, name: str, value: Any, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidAction(kind, f"{name} must be a finite number, got {value!r}")
    return float(value)


def _text(kind: str, name: str, value: Any) -> str:
    """A string that may be empty (a reason, an error text)."""
    if not isinstance(value, str):
        raise InvalidAction(kind, f"{name} must be a string, got {value!r}")
    return value


def _entries(kind: str, name: str, value: Any, cls: type) -> tuple:
    """A list of entries of ``cls`` (instances or their JSON dicts) as a tuple of ``cls``."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise InvalidAction(kind, f"{name} must be a list")
    out = []
    for e in value:
        if isinstance(e, cls):
            out.append(e)
            continue
        if not isinstance(e, Mapping):
            raise InvalidAction(kind, f"{name}: entry {e!r} is not an object")
        try:
            out.append(cls(**e))
        except TypeError as exc:  # missing / unexpected fields
            raise InvalidAction(kind, f"{name}: {exc}") from None
    return tuple(out)


def _predicate_value(kind: str, value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise InvalidAction(kind, f"predicate value {value!r} is not a JSON scalar")


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class AddParquet:
    """Register a Parquet file: its key, partition, size and the ranges it covers.

    ``min_seq``/``max_seq`` is the range of the file's integer write-buffer
    ordering column; ``schema`` its columns as (name, role, type).
    """

    KIND: ClassVar[str] = "add_parquet"
    key: str
    table: str
    partition_key: str
    row_count: int
    size_bytes: int
    min_time_ns: int
    max_time_ns: int
    min_seq: int
    max_seq: int
    schema: tuple[ColumnSpec, ...]

    def __post_init__(self) -> None:
        k = self.KIND
        for name in ("key", "table", "partition_key"):
            _str(k, name, getattr(self, name))
        _int(k, "row_count", self.row_count, minimum=0)
        _int(k, "size_bytes", self.size_bytes, minimum=0)
        for name in ("min_time_ns", "max_time_ns", "min_seq", "max_seq"):
            _int(k, name, getattr(self, name))
        if self.min_time_ns > self.max_time_ns:
            raise InvalidAction(k, f"min_time_ns {self.min_time_ns} > max_time_ns {self.max_time_ns}")
        if self.min_seq > self.max_seq:
            raise InvalidAction(k, f"min_seq {self.min_seq} > max_seq {self.max_seq}")
        object.__setattr__(self, "schema", _columns(k, "schema", self.schema))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.KIND,
            "key": self.key,
            "table": self.table,
            "partition_key": self.partition_key,
            "row_count": self.row_count,
            "size_bytes": self.size_bytes,
            "min_time_ns": self.min_time_ns,
            "max_time_ns": self.max_time_ns,
            "min_seq": self.min_seq,
            "max_seq": self.max_seq,
            "schema": [list(c) for c in self.schema],
        }


@dataclass(frozen=True)
class RemoveParquet:
    """Unregister a Parquet file (after compaction or retention); cleanup may then delete it."""

    KIND: ClassVar[str] = "remove_parquet"
    key: str

    def __post_init__(self) -> None:
        _str(self.KIND, "key", self.key)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "key": self.key}


@dataclass(frozen=True)
class RecordPartitionCheckpoint:
    """What of one table partition is persisted: replay skips rows with offset below
    the partition's ``min_unpersisted_offset`` and time <= ``flush_timestamp_ns``.

    ``sequencer_numbers``: {kafka_partition: (min_unpersisted_offset or None
    when nothing is unpersisted, max_seen_offset)}.  Do not mutate it.
    """

    KIND: ClassVar[str] = "partition_checkpoint"
    table: str
    partition_key: str
    flush_timestamp_ns: int
    sequencer_numbers: dict[int, tuple[int | None, int]] = field(default_factory=dict)
    #: write-buffer epoch the offsets belong to (it grows when the topic was found reset)
    epoch: int = 0

    def __post_init__(self) -> None:
        k = self.KIND
        _str(k, "table", self.table)
        _str(k, "partition_key", self.partition_key)
        _int(k, "flush_timestamp_ns", self.flush_timestamp_ns)
        object.__setattr__(self, "sequencer_numbers", _sequencer_numbers(k, self.sequencer_numbers))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.KIND,
            "table": self.table,
            "partition_key": self.partition_key,
            "flush_timestamp_ns": self.flush_timestamp_ns,
            "sequencer_numbers": _sequencer_json(self.sequencer_numbers),
            "epoch": self.epoch,
        }


@dataclass(frozen=True)
class RecordDatabaseCheckpoint:
    """Write-buffer position of the whole database: {kafka_partition: (min, max)} of ``topic``.

    Do not mutate ``sequencer_numbers``.
    """

    KIND: ClassVar[str] = "database_checkpoint"
    topic: str
    kafka_partitions: int
    sequencer_numbers: dict[int, tuple[int | None, int]] = field(default_factory=dict)
    #: write-buffer epoch the offsets belong to (it grows when the topic was found reset)
    epoch: int = 0
    #: Kafka's id of the topic incarnation the offsets belong to (None: unknown, written
    #: before ids were recorded); a topic deleted and created again has a new id
    topic_id: str | None = None
    #: True only when written by a clean stop after every write the topic held was applied
    #: and persisted: the topic holds nothing past ``sequencer_numbers`` that is not in
    #: Parquet, so losing the topic (an in-memory broker stopped with the server) loses nothing
    complete: bool = False
    #: the ``_iox_seq`` of row 0 of offset 0 in ``epoch`` (catalog/seq_layout.py): a multiple of
    #: 2**SEQ_ROW_BITS; None: written before origins were recorded, the legacy layout's origin
    seq_origin: int | None = None

    def __post_init__(self) -> None:
        k = self.KIND
        _str(k, "topic", self.topic)
        if not isinstance(self.complete, bool):
            raise InvalidAction(k, f"complete must be a boolean, got {self.complete!r}")
        if _int(k, "seq_origin", self.seq_origin, minimum=0, optional=True) is not None:
            if self.seq_origin % SEQ_ROWS_PER_OFFSET or self.seq_origin > SEQ_MAX:
                raise InvalidAction(k, f"seq_origin must be a multiple of {SEQ_ROWS_PER_OFFSET} "
                                       f"up to {SEQ_MAX}, got {self.seq_origin}")
        if self.topic_id is not None:
            _str(k, "topic_id", self.topic_id)
        _int(k, "kafka_partitions", self.kafka_partitions, minimum=1)
        numbers = _sequencer_numbers(k, self.sequencer_numbers)
        bad = [p for p in numbers if p >= self.kafka_partitions]
        if bad:
            raise InvalidAction(k, f"kafka partitions {bad} >= kafka_partitions {self.kafka_partitions}")
        object.__setattr__(self, "sequencer_numbers", numbers)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.KIND,
            "topic": self.topic,
            "kafka_partitions": self.kafka_partitions,
            "sequencer_numbers": _sequencer_json(self.sequencer_numbers),
            "epoch": self.epoch,
            **({} if self.topic_id is None else {"topic_id": self.topic_id}),
            **({"complete": True} if self.complete else {}),
            **({} if self.seq_origin is None else {"seq_origin": self.seq_origin}),
        }


@dataclass(frozen=True)
class AddDeletePredicate:
    """A delete that must be applied to persisted Parquet files ``applies_to``.

    Deletes rows of ``table`` (every table when ``None``) with
    ``start_ns <= time < stop_ns_exclusive`` matching all of ``predicate``
    ((column, op, value) triples); ``seq`` is its write-buffer position.
    Every key in ``applies_to`` must be a registered file when applied.
    """

    KIND: ClassVar[str] = "delete_predicate"
    table: str | None
    start_ns: int
    stop_ns_exclusive: int
    predicate: tuple[tuple[str, str, Any], ...]
    seq: int
    applies_to: tuple[str, ...]

    def __post_init__(self) -> None:
        k = self.KIND
        _str(k, "table", self.table, optional=True)
        _int(k, "start_ns", self.start_ns)
        _int(k, "stop_ns_exclusive", self.stop_ns_exclusive)
        _int(k, "seq", self.seq)
        if self.start_ns > self.stop_ns_exclusive:
            raise InvalidAction(k, f"start_ns {self.start_ns} > stop_ns_exclusive {self.stop_ns_exclusive}")
        if isinstance(self.predicate, (str, bytes)) or not isinstance(self.predicate, Sequence):
            raise InvalidAction(k, "predicate must be a list of [column, op, value]")
        preds = []
        for p in self.predicate:
            if isinstance(p, (str, bytes)) or not isinstance(p, Sequence) or len(p) != 3:
                raise InvalidAction(k, f"predicate entry {p!r} is not [column, op, value]")
            preds.append((_str(k, "predicate column", p[0]), _str(k, "predicate op", p[1]), _predicate_value(k, p[2])))
        object.__setattr__(self, "predicate", tuple(preds))
        if isinstance(self.applies_to, (str, bytes)) or not isinstance(self.applies_to, Sequence):
            raise InvalidAction(k, "applies_to must be a list of parquet keys")
        keys = [_str(k, "applies_to entry", key) for key in self.applies_to]
        object.__setattr__(self, "applies_to", tuple(dict.fromkeys(keys)))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.KIND,
            "table": self.table,
            "start_ns": self.start_ns,
            "stop_ns_exclusive": self.stop_ns_exclusive,
            "predicate": [list(p) for p in self.predicate],
            "seq": self.seq,
            "applies_to": list(self.applies_to),
        }


@dataclass(frozen=True)
class SetTableSchema:
    """The persisted schema of ``table``: merged into the known schema.

    Columns already known must keep their (role, type); new columns are
    appended in the given order, so a schema only grows.
    """

    KIND: ClassVar[str] = "schema"
    table: str
    columns: tuple[ColumnSpec, ...]

    def __post_init__(self) -> None:
        _str(self.KIND, "table", self.table)
        object.__setattr__(self, "columns", _columns(self.KIND, "columns", self.columns))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "table": self.table, "columns": [list(c) for c in self.columns]}


@dataclass(frozen=True)
class LostWritesEntry:
    """One range of offsets of a Kafka partition whose acknowledged writes the write buffer lost
    before they were persisted (catalog.catalog.LostWriteRange). ``to_exclusive`` None: the end is
    unknown; ``accepted_at_s`` None: not accepted yet (the server refuses the database's writes);
    ``epoch``: the write-buffer epoch the offsets belong to."""

    partition: int
    from_offset: int
    to_exclusive: int | None
    detected_at_s: float
    reason: str
    accepted_at_s: float | None = None
    epoch: int = 0

    def __post_init__(self) -> None:
        k = RecordLostWrites.KIND
        _int(k, "partition", self.partition, minimum=0)
        _int(k, "from_offset", self.from_offset, minimum=0)
        if _int(k, "to_exclusive", self.to_exclusive, optional=True) is not None and self.to_exclusive < self.from_offset:
            raise InvalidAction(k, f"to_exclusive {self.to_exclusive} < from_offset {self.from_offset}")
        object.__setattr__(self, "detected_at_s", _float(k, "detected_at_s", self.detected_at_s))
        _text(k, "reason", self.reason)
        object.__setattr__(self, "accepted_at_s", _float(k, "accepted_at_s", self.accepted_at_s, optional=True))
        _int(k, "epoch", self.epoch, minimum=0)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "from_offset": self.from_offset, "to_exclusive": self.to_exclusive,
                "detected_at_s": self.detected_at_s, "reason": self.reason, "accepted_at_s": self.accepted_at_s,
                "epoch": self.epoch}


@dataclass(frozen=True)
class RecordLostWrites:
    """Every loss of acknowledged writes found for the database, accepted or not (format version 2).

    Replaces the list recorded before: a loss is recorded when found (at start, or while the
    server runs), and again once accepted."""

    KIND: ClassVar[str] = "lost_writes"
    ranges: tuple[LostWritesEntry, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", _entries(self.KIND, "ranges", self.ranges, LostWritesEntry))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "ranges": [r.to_json() for r in self.ranges]}


@dataclass(frozen=True)
class AcceptedPoisonEntry:
    """A write-buffer message at ``offset`` of Kafka partition ``partition`` (of write-buffer
    ``epoch``) that failed to apply and that an operator accepted to skip at ``accepted_at_s``:
    it is never applied, also not by a replay."""

    epoch: int
    partition: int
    offset: int
    table: str
    kind: str
    error: str
    detected_at_s: float
    accepted_at_s: float

    def __post_init__(self) -> None:
        k = RecordAcceptedPoison.KIND
        _int(k, "epoch", self.epoch, minimum=0)
        _int(k, "partition", self.partition, minimum=0)
        _int(k, "offset", self.offset, minimum=0)
        for name in ("table", "kind", "error"):
            _text(k, name, getattr(self, name))
        object.__setattr__(self, "detected_at_s", _float(k, "detected_at_s", self.detected_at_s))
        object.__setattr__(self, "accepted_at_s", _float(k, "accepted_at_s", self.accepted_at_s))

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "partition": self.partition, "offset": self.offset, "table": self.table,
                "kind": self.kind, "error": self.error, "detected_at_s": self.detected_at_s,
                "accepted_at_s": self.accepted_at_s}


@dataclass(frozen=True)
class RecordAcceptedPoison:
    """Every write-buffer message accepted to be skipped (format version 2); replaces the list
    recorded before."""

    KIND: ClassVar[str] = "accepted_poisoned_messages"
    messages: tuple[AcceptedPoisonEntry, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", _entries(self.KIND, "messages", self.messages, AcceptedPoisonEntry))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "messages": [m.to_json() for m in self.messages]}


@dataclass(frozen=True)
class RecordRetention:
    """The database's retention period in seconds (format version 3); 0 removes it. Replaces the
    one recorded before; ``set_at_s``: when it was set (seconds since the epoch)."""

    KIND: ClassVar[str] = "retention"
    period_s: int
    set_at_s: float

    def __post_init__(self) -> None:
        _int(self.KIND, "period_s", self.period_s, minimum=0)
        object.__setattr__(self, "set_at_s", _float(self.KIND, "set_at_s", self.set_at_s))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "period_s": self.period_s, "set_at_s": self.set_at_s}


@dataclass(frozen=True)
class RecordPruned:
    """The pruner's watermark (format version 3): every row older than ``pruner_hi_ns`` (ns since
    the epoch) is dropped, its partitions' files removed in the same transaction. Never lowers
    the one recorded before (the state keeps the highest)."""

    KIND: ClassVar[str] = "pruned"
    pruner_hi_ns: int

    def __post_init__(self) -> None:
        _int(self.KIND, "pruner_hi_ns", self.pruner_hi_ns)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "pruner_hi_ns": self.pruner_hi_ns}


Action = Union[
    AddParquet, RemoveParquet, RecordPartitionCheckpoint, RecordDatabaseCheckpoint, AddDeletePredicate, SetTableSchema,
    RecordLostWrites, RecordAcceptedPoison, RecordRetention, RecordPruned, ClaimPartitions,
]
_ACTION_TYPES: dict[str, type] = {
    t.KIND: t
    for t in (AddParquet, RemoveParquet, RecordPartitionCheckpoint, RecordDatabaseCheckpoint, AddDeletePredicate,
              SetTableSchema, RecordLostWrites, RecordAcceptedPoison, RecordRetention, RecordPruned, ClaimPartitions)
}
#: the format version an action kind (and the state key of the same name) needs; absent: BASE_FORMAT_VERSION
_KIND_VERSIONS = {RecordLostWrites.KIND: 2, RecordAcceptedPoison.KIND: 2, RecordRetention.KIND: 3,
                  RecordPruned.KIND: 3, ClaimPartitions.KIND: 4}
#: the format version of a transaction that names its writer (every transaction of a pool catalog)
_WRITER_VERSION = 4
#: action kinds (and state keys) a file of BASE_FORMAT_VERSION cannot hold
_VERSION_2_KINDS = frozenset(_KIND_VERSIONS)


def _actions_version(actions: Sequence[Action]) -> int:
    """The lowest format version that holds ``actions``."""
    return max((_KIND_VERSIONS.get(a.KIND, BASE_FORMAT_VERSION) for a in actions), default=BASE_FORMAT_VERSION)


def _state_kinds(state: CatalogState) -> list[str]:
    """The versioned record kinds ``state`` holds."""
    held = [(RecordLostWrites.KIND, state.lost_writes), (RecordAcceptedPoison.KIND, state.accepted_poison),
            (RecordRetention.KIND, state.retention_period_s), (RecordPruned.KIND, state.pruner_hi_ns is not None),
            (ClaimPartitions.KIND, state.owners)]
    return [k for k, v in held if v]


def _state_version(state: CatalogState) -> int:
    """The lowest format version that holds ``state``."""
    return max((_KIND_VERSIONS[k] for k in _state_kinds(state)), default=BASE_FORMAT_VERSION)


def action_from_json(obj: Any) -> Action:
    """Build an action from its JSON dict (``{"kind": ..., fields...}``); raises InvalidAction."""
    if isinstance(obj, tuple(_ACTION_TYPES.values())):
        return obj  # type: ignore[return-value]
    if not isinstance(obj, Mapping):
        raise InvalidAction("?", f"action must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    cls = _ACTION_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise InvalidAction(str(kind), f"unknown action kind {kind!r}")
    fields = {k: v for k, v in obj.items() if k != "kind"}
    try:
        return cls(**fields)
    except TypeError as exc:  # missing / unexpected fields
        raise InvalidAction(kind, str(exc)) from None


# --------------------------------------------------------------------------- state


@dataclass
class CatalogState:
    """The preserved catalog of one database as of ``revision``.

    A snapshot: the catalog never mutates a state it handed out (each commit
    builds a new one), so readers may keep and share it.  Picklable.

    * ``files``: key → :class:`AddParquet` of every registered, not removed file.
    * ``partition_checkpoints``: (table, partition_key) → latest :class:`RecordPartitionCheckpoint`.
    * ``database_checkpoint``: latest :class:`RecordDatabaseCheckpoint` or None.
    * ``delete_predicates``: in commit order; ``applies_to`` lists only
      registered files (removing a file removes it there, and a predicate
      left applying to nothing is dropped).
    * ``table_schemas``: table → columns (name, role, type) in first-seen order.
    * ``lost_writes``: the last :class:`RecordLostWrites`' ranges (version 2).
    * ``accepted_poison``: the last :class:`RecordAcceptedPoison`'s messages (version 2).
    * ``retention_period_s``: the last :class:`RecordRetention`'s period (0: none; version 3).
    * ``pruner_hi_ns``: the highest :class:`RecordPruned` watermark, None before any (version 3).
    * ``owners``: Kafka partition → :class:`PartitionOwner` after the :class:`ClaimPartitions`
      so far; non-empty makes this a pool catalog (version 4, catalog/ownership.py), whose
      database checkpoint, lost writes and accepted poisoned messages merge per Kafka partition.
    * ``pool_kafka_partitions``: the partition count the claims were made for (None before any).
    """

    db: str
    revision: int
    transaction_uuid: str
    timestamp_s: float
    files: dict[str, AddParquet] = field(default_factory=dict)
    partition_checkpoints: dict[tuple[str, str], RecordPartitionCheckpoint] = field(default_factory=dict)
    database_checkpoint: RecordDatabaseCheckpoint | None = None
    delete_predicates: list[AddDeletePredicate] = field(default_factory=list)
    table_schemas: dict[str, tuple[ColumnSpec, ...]] = field(default_factory=dict)
    lost_writes: tuple[LostWritesEntry, ...] = ()
    accepted_poison: tuple[AcceptedPoisonEntry, ...] = ()
    retention_period_s: int = 0
    pruner_hi_ns: int | None = None
    owners: dict[int, PartitionOwner] = field(default_factory=dict)
    pool_kafka_partitions: int | None = None

    @property
    def pooled(self) -> bool:
        """Whether partitions of this database were ever claimed (every writer must then own what it writes)."""
        return bool(self.owners)

    def copy(self) -> CatalogState:
        """A copy whose containers can be changed without touching this state (values are immutable)."""
        return CatalogState(
            db=self.db,
            revision=self.revision,
            transaction_uuid=self.transaction_uuid,
            timestamp_s=self.timestamp_s,
            files=dict(self.files),
            partition_checkpoints=dict(self.partition_checkpoints),
            database_checkpoint=self.database_checkpoint,
            delete_predicates=list(self.delete_predicates),
            table_schemas=dict(self.table_schemas),
            lost_writes=self.lost_writes,
            accepted_poison=self.accepted_poison,
            retention_period_s=self.retention_period_s,
            pruner_hi_ns=self.pruner_hi_ns,
            owners=dict(self.owners),
            pool_kafka_partitions=self.pool_kafka_partitions,
        )


def apply_actions(state: CatalogState, actions: Sequence[Action], revision: int) -> None:
    """Apply ``actions`` in order to ``state`` in place, as :func:`apply_action` one by one would.

    A run of consecutive file removals (a compaction's, a retention prune's) updates the delete
    predicates in one pass instead of one pass per file. Raises :class:`InvalidAction` as
    :func:`apply_action` does; ``state`` may then be partially changed.
    """
    i = 0
    while i < len(actions):
        if isinstance(actions[i], RemoveParquet):
            j = i
            while j < len(actions) and isinstance(actions[j], RemoveParquet):
                j += 1
            _remove_files(state, actions[i:j], revision)
            i = j
        else:
            apply_action(state, actions[i], revision)
            i += 1


def _remove_files(state: CatalogState, removals: Sequence[RemoveParquet], revision: int) -> None:
    """Unregisters the files of ``removals`` (each must be registered when its turn comes) and
    takes them out of every delete predicate's ``applies_to``; a predicate left applying to no
    file is dropped (nothing left to apply to)."""
    removed = set()
    for action in removals:
        if action.key not in state.files:
            raise InvalidAction(action.KIND, f"file {action.key!r} is not registered", revision)
        del state.files[action.key]
        removed.add(action.key)
    kept: list[AddDeletePredicate] = []
    for pred in state.delete_predicates:
        if not removed.isdisjoint(pred.applies_to):
            rest = tuple(k for k in pred.applies_to if k not in removed)
            if not rest:
                continue
            pred = AddDeletePredicate(
                table=pred.table,
                start_ns=pred.start_ns,
                stop_ns_exclusive=pred.stop_ns_exclusive,
                predicate=pred.predicate,
                seq=pred.seq,
                applies_to=rest,
            )
        kept.append(pred)
    state.delete_predicates = kept


def apply_action(state: CatalogState, action: Action, revision: int) -> None:
    """Apply one action to ``state`` in place; the single definition of catalog semantics.

    Deterministic (no clock, no I/O).  Used by loading (replay) and by
    :meth:`PreservedCatalog.commit` (on a private copy, before writing).
    Raises :class:`InvalidAction` if the action cannot apply; ``state`` may
    then be partially changed, so callers apply to a copy.
    """
    if isinstance(action, AddParquet):
        if action.key in state.files:
            raise InvalidAction(action.KIND, f"file {action.key!r} is already registered", revision)
        state.files[action.key] = action
    elif isinstance(action, RemoveParquet):
        _remove_files(state, [action], revision)
    elif isinstance(action, RecordPartitionCheckpoint):
        state.partition_checkpoints[(action.table, action.partition_key)] = action
    elif isinstance(action, RecordDatabaseCheckpoint):
        state.database_checkpoint = _merged_database_checkpoint(state, action, revision)
    elif isinstance(action, AddDeletePredicate):
        missing = [k for k in action.applies_to if k not in state.files]
        if missing:
            raise InvalidAction(action.KIND, f"applies_to names unregistered files {missing}", revision)
        state.delete_predicates.append(action)
    elif isinstance(action, SetTableSchema):
        known = {c[0]: c for c in state.table_schemas.get(action.table, ())}
        for col in action.columns:
            have = known.get(col[0])
            if have is not None and have != col:
                raise InvalidAction(
                    action.KIND,
                    f"table {action.table!r} column {col[0]!r} is ({have[1]}, {have[2]}), not ({col[1]}, {col[2]})",
                    revision,
                )
        merged = list(state.table_schemas.get(action.table, ()))
        merged.extend(c for c in action.columns if c[0] not in known)
        state.table_schemas[action.table] = tuple(merged)
    elif isinstance(action, RecordLostWrites):
        state.lost_writes = _merged_per_partition(state, state.lost_writes, action.ranges)
    elif isinstance(action, RecordAcceptedPoison):
        state.accepted_poison = _merged_per_partition(state, state.accepted_poison, action.messages)
    elif isinstance(action, RecordRetention):
        state.retention_period_s = action.period_s
    elif isinstance(action, RecordPruned):
        if state.pruner_hi_ns is None or action.pruner_hi_ns > state.pruner_hi_ns:
            state.pruner_hi_ns = action.pruner_hi_ns
    elif isinstance(action, ClaimPartitions):
        _apply_claim(state, action, revision)
    else:
        raise InvalidAction(type(action).__name__, "not a catalog action", revision)


def _apply_claim(state: CatalogState, action: ClaimPartitions, revision: int) -> None:
    n = action.kafka_partitions
    known = state.pool_kafka_partitions or (state.database_checkpoint.kafka_partitions
                                            if state.database_checkpoint is not None else None)
    if known is not None and known != n:
        raise InvalidAction(action.KIND, f"claims partitions of a topic with {n} partitions; the database's "
                                         f"topic has {known}", revision)
    expected = claim_epochs(state.owners, action.claims)
    wrong = {p: e for p, e in action.claims.items() if expected[p] != e}
    if wrong:
        raise InvalidAction(action.KIND, f"claim epochs {wrong} are not the next ones {expected}: another claim "
                                         "came first", revision)
    state.pool_kafka_partitions = n
    for p, e in action.claims.items():
        state.owners[p] = PartitionOwner(action.owner, e)


def _merged_database_checkpoint(state: CatalogState, action: RecordDatabaseCheckpoint,
                                revision: int) -> RecordDatabaseCheckpoint:
    """``action`` itself in a single-committer catalog; in a pool catalog, the checkpoint with the
    action's Kafka partitions replaced and every other partition's position kept (each owner
    records only its own). ``complete`` holds only when the action covers every partition."""
    old = state.database_checkpoint
    if not state.pooled or old is None:
        return action
    if old.topic != action.topic or old.kafka_partitions != action.kafka_partitions:
        raise InvalidAction(action.KIND, f"checkpoint of {action.topic!r} ({action.kafka_partitions} partitions) "
                                         f"in a pool catalog of {old.topic!r} ({old.kafka_partitions})", revision)
    numbers = {**old.sequencer_numbers, **action.sequencer_numbers}
    complete = action.complete and set(numbers) <= set(action.sequencer_numbers)
    return RecordDatabaseCheckpoint(topic=action.topic, kafka_partitions=action.kafka_partitions,
                                    sequencer_numbers=dict(sorted(numbers.items())), epoch=action.epoch,
                                    topic_id=action.topic_id, complete=complete, seq_origin=action.seq_origin)


def _merged_per_partition(state: CatalogState, old: tuple, new: tuple) -> tuple:
    """``new`` in a single-committer catalog; in a pool catalog, ``old`` entries of the Kafka
    partitions ``new`` names replaced by ``new``'s, the others kept (each owner records its own)."""
    if not state.pooled:
        return new
    replaced = {e.partition for e in new}
    return tuple(e for e in old if e.partition not in replaced) + tuple(new)


def _state_to_json(state: CatalogState) -> dict[str, Any]:
    return {
        "files": [state.files[k].to_json() for k in sorted(state.files)],
        "partition_checkpoints": [state.partition_checkpoints[k].to_json() for k in sorted(state.partition_checkpoints)],
        "database_checkpoint": None if state.database_checkpoint is None else state.database_checkpoint.to_json(),
        "delete_predicates": [p.to_json() for p in state.delete_predicates],
        "table_schemas": [
            SetTableSchema(table=t, columns=state.table_schemas[t]).to_json() for t in sorted(state.table_schemas)
        ],
        # version 2 (written only when set: a state without them is a version-1 checkpoint)
        **({RecordLostWrites.KIND: [r.to_json() for r in state.lost_writes]} if state.lost_writes else {}),
        **({RecordAcceptedPoison.KIND: [m.to_json() for m in state.accepted_poison]}
           if state.accepted_poison else {}),
        # version 3 (written only when set)
        **({RecordRetention.KIND: state.retention_period_s} if state.retention_period_s else {}),
        **({RecordPruned.KIND: state.pruner_hi_ns} if state.pruner_hi_ns is not None else {}),
        # version 4 (written only in a pool catalog)
        **({ClaimPartitions.KIND: {"kafka_partitions": state.pool_kafka_partitions,
                                   "owners": {str(p): [o.owner, o.epoch] for p, o in sorted(state.owners.items())}}}
           if state.owners else {}),
    }


def _state_from_json(obj: Any, db: str, revision: int, txn_uuid: str, timestamp_s: float, key: str,
                     version: int = FORMAT_VERSION) -> CatalogState:
    if not isinstance(obj, Mapping):
        raise CorruptCatalogFile(key, "state is not a JSON object")
    newer = sorted(k for k in _VERSION_2_KINDS if k in obj and _KIND_VERSIONS[k] > version)
    if newer:
        raise CorruptCatalogFile(key, f"state holds {newer}, which format version {version} does not have")
    try:
        lost = RecordLostWrites(ranges=obj.get(RecordLostWrites.KIND, ()))
        accepted = RecordAcceptedPoison(messages=obj.get(RecordAcceptedPoison.KIND, ()))
        retention = _int(RecordRetention.KIND, "period_s", obj.get(RecordRetention.KIND, 0), minimum=0)
        pruner_hi = _int(RecordPruned.KIND, "pruner_hi_ns", obj.get(RecordPruned.KIND), optional=True)
        pool_n, owners = _owners_from_json(obj.get(ClaimPartitions.KIND))
        files = [action_from_json(a) for a in obj["files"]]
        parts = [action_from_json(a) for a in obj["partition_checkpoints"]]
        dbc = obj["database_checkpoint"]
        dbc_action = None if dbc is None else action_from_json(dbc)
        preds = [action_from_json(a) for a in obj["delete_predicates"]]
        schemas = [action_from_json(a) for a in obj["table_schemas"]]
    except KeyError as exc:
        raise CorruptCatalogFile(key, f"state lacks {exc.args[0]!r}") from None
    except (InvalidAction, TypeError) as exc:
        raise CorruptCatalogFile(key, f"bad state entry: {exc}") from exc
    expected_kinds = [
        (files, AddParquet),
        (parts, RecordPartitionCheckpoint),
        (preds, AddDeletePredicate),
        (schemas, SetTableSchema),
        ([] if dbc_action is None else [dbc_action], RecordDatabaseCheckpoint),
    ]
    for items, cls in expected_kinds:
        if any(not isinstance(a, cls) for a in items):
            raise CorruptCatalogFile(key, f"state entry of wrong kind where {cls.KIND} expected")
    state = CatalogState(db=db, revision=revision, transaction_uuid=txn_uuid, timestamp_s=timestamp_s)
    state.files = {a.key: a for a in files}  # type: ignore[union-attr]
    state.partition_checkpoints = {(a.table, a.partition_key): a for a in parts}  # type: ignore[union-attr]
    state.database_checkpoint = dbc_action  # type: ignore[assignment]
    state.delete_predicates = list(preds)  # type: ignore[arg-type]
    state.table_schemas = {a.table: a.columns for a in schemas}  # type: ignore[union-attr]
    state.lost_writes = lost.ranges
    state.accepted_poison = accepted.messages
    state.retention_period_s = retention
    state.pruner_hi_ns = pruner_hi
    state.pool_kafka_partitions = pool_n
    state.owners = owners
    return state


def _owners_from_json(obj: Any) -> tuple[int | None, dict[int, PartitionOwner]]:
    """A checkpoint's ``claim_partitions`` record: (partition count, owners); (None, {}) when absent."""
    if obj is None:
        return None, {}
    if not isinstance(obj, Mapping) or not isinstance(obj.get("owners"), Mapping):
        raise InvalidAction(ClaimPartitions.KIND, "the state's owners record is not an object")
    n = obj.get("kafka_partitions")
    claims: dict[Any, int] = {}
    names: dict[Any, str] = {}
    for p, entry in obj["owners"].items():
        if not isinstance(entry, list) or len(entry) != 2:
            raise InvalidAction(ClaimPartitions.KIND, f"owner entry {entry!r} is not [owner, epoch]")
        names[p], claims[p] = entry
    owners: dict[int, PartitionOwner] = {}
    for p in claims:  # each entry validated as a claim of its own
        claim = ClaimPartitions(owner=names[p], kafka_partitions=n, claims={p: claims[p]})
        (q, e), = claim.claims.items()
        owners[q] = PartitionOwner(claim.owner, e)
    return n, owners


# --------------------------------------------------------------------------- file codec


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _decode(data: bytes, key: str, expected_type: str, db: str, revision: int) -> dict[str, Any]:
    """Parse and check the envelope of a catalog file (version first, then the rest)."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCatalogFile(key, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CorruptCatalogFile(key, "not a JSON object")
    version = obj.get("format_version")
    if isinstance(version, bool) or version not in READABLE_FORMAT_VERSIONS:
        raise FormatVersionMismatch(expected=FORMAT_VERSION, actual=version, key=key,
                                    readable=READABLE_FORMAT_VERSIONS)
    if obj.get("type") != expected_type:
        raise CorruptCatalogFile(key, f"type is {obj.get('type')!r}, expected {expected_type!r}")
    if obj.get("db") != db:
        raise CorruptCatalogFile(key, f"belongs to database {obj.get('db')!r}, expected {db!r}")
    if obj.get("revision") != revision or isinstance(obj.get("revision"), bool):
        raise CorruptCatalogFile(key, f"holds revision {obj.get('revision')!r}, its name says {revision}")
    if not isinstance(obj.get("uuid"), str) or not obj["uuid"]:
        raise CorruptCatalogFile(key, "uuid missing")
    ts = obj.get("timestamp_s")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise CorruptCatalogFile(key, "timestamp_s missing")
    return obj


def _check_now(now_s: Any) -> float:
    if isinstance(now_s, bool) or not isinstance(now_s, (int, float)) or not math.isfinite(now_s):
        raise ValueError(f"now_s must be a finite number of seconds, got {now_s!r}")
    return float(now_s)


# --------------------------------------------------------------------------- catalog


class PreservedCatalog:
    """The committer of one database's preserved catalog.

    Created on the driver by :meth:`create_or_load`; one instance per
    process and database.  ``commit`` is thread-safe (serialized).  Once a
    commit lost the race for its revision, or :meth:`newer_revision` found
    the next revision committed by another writer, the instance is fenced:
    it raises :class:`RevisionConflict` on every further commit, and the
    caller must stop ingesting (another ingester owns the database now).

    A pool catalog (catalog/ownership.py) has one writer per Kafka partition instead: an instance
    becomes a writer by :meth:`claim`; its commits may only touch the partitions it claimed and
    still owns; losing a revision to another writer is not fencing there: :meth:`commit` reads the
    newer transactions, checks ownership again and appends after them, or raises
    :class:`PartitionsNotOwned` when a claim took a partition it touches. :meth:`refresh` reads
    the other writers' transactions without committing.
    Not picklable.
    """

    def __init__(
        self,
        store: ObjectStore,
        db: str,
        state: CatalogState,
        last_checkpoint_revision: int,
        config: PreservedCatalogConfig,
    ) -> None:
        """Use :meth:`create_or_load`; this constructor trusts its arguments."""
        self._store = store
        self._db = db
        self._state = state
        self._last_checkpoint_revision = last_checkpoint_revision
        self._config = config
        self._lock = threading.Lock()
        self._fenced_at: int | None = None
        #: pool catalogs: the name this instance writes under, and the epochs it claimed
        self._writer: str | None = None
        self._epochs: dict[int, int] = {}

    def __reduce__(self) -> Any:
        raise TypeError("PreservedCatalog is driver-only and must not be pickled")

    # -- loading ---------------------------------------------------------------

    @classmethod
    def create_or_load(
        cls,
        store: ObjectStore,
        db: str,
        now_s: float,
        config: PreservedCatalogConfig | None = None,
    ) -> tuple[PreservedCatalog, CatalogState]:
        """Load the catalog of ``db``, creating revision 0 (no actions) if there is none.

        ``now_s`` (seconds since the epoch, from the caller's clock) becomes
        the timestamp of revision 0 when it is created.  If another process
        creates revision 0 concurrently, its catalog is loaded instead.
        Raises :class:`FormatVersionMismatch`, :class:`RevisionGap`,
        :class:`PreviousUuidMismatch`, :class:`CorruptCatalogFile`.
        """
        config = config or PreservedCatalogConfig()
        now_s = _check_now(now_s)
        catalog_prefix(db)  # validates the name
        loaded = _load(store, db)
        if loaded is None:
            txn_uuid = str(_uuid.uuid4())
            txn = {
                "format_version": BASE_FORMAT_VERSION,
                "type": _TYPE_TRANSACTION,
                "db": db,
                "revision": 0,
                "uuid": txn_uuid,
                "previous_uuid": None,
                "timestamp_s": now_s,
                "actions": [],
            }
            try:
                store.put_if_absent(transaction_key(db, 0), _encode(txn))
                state = CatalogState(db=db, revision=0, transaction_uuid=txn_uuid, timestamp_s=now_s)
                loaded = (state, 0)
            except AlreadyExists:
                loaded = _load(store, db)
                if loaded is None:
                    raise RevisionGap(db, 0, None, transaction_key(db, 0)) from None
        state, last_ckpt = loaded
        return cls(store, db, state, last_ckpt, config), state

    # -- accessors -------------------------------------------------------------

    @property
    def db(self) -> str:
        return self._db

    @property
    def store(self) -> ObjectStore:
        return self._store

    @property
    def config(self) -> PreservedCatalogConfig:
        return self._config

    @property
    def state(self) -> CatalogState:
        """The state after the last successful commit (a snapshot; never mutated)."""
        return self._state

    @property
    def revision(self) -> int:
        return self._state.revision

    @property
    def fenced(self) -> bool:
        """True once a commit lost its revision to another writer; all later commits fail."""
        return self._fenced_at is not None

    @property
    def fenced_at(self) -> int | None:
        """The revision another writer committed in this instance's place (None while not fenced)."""
        return self._fenced_at

    @property
    def writer(self) -> str | None:
        """The owner name this instance commits under in a pool catalog (None before :meth:`claim`)."""
        return self._writer

    @property
    def owned_partitions(self) -> frozenset[int]:
        """The Kafka partitions this instance claimed and still owns, as of its newest state."""
        owners = self._state.owners
        return frozenset(p for p, e in self._epochs.items()
                         if p in owners and owners[p] == PartitionOwner(self._writer, e))

    def claim(self, partitions: Sequence[int], kafka_partitions: int, owner: str, now_s: float,
              first_checkpoint: RecordDatabaseCheckpoint | None = None) -> dict[int, int]:
        """Claim ``partitions`` of the database's topic (``kafka_partitions`` partitions) for ``owner``;
        returns {partition: epoch} claimed.

        Called on the driver of the ingester that takes the partitions (the assigner decides which).
        The first claim makes the catalog a pool catalog and this instance a writer under ``owner``
        (an instance writes under one name). Each claim carries the partition's next epoch, so
        the previous owner's next commit touching it fails with :class:`PartitionsNotOwned`. The
        new owner resumes from the database checkpoint of the state this returns on
        (:attr:`state`): the old owner can commit nothing after it for these partitions.
        ``first_checkpoint`` (no Kafka partitions in it) is recorded in the same transaction when
        the catalog has no database checkpoint yet: the topic incarnation (its id) the pool's
        offsets belong to is known from the first claim on, so a topic lost before the first
        persist is found at the next start.
        """
        if self._writer is not None and owner != self._writer:
            raise ValueError(f"this catalog instance writes as {self._writer!r}, not {owner!r}")
        now_s = _check_now(now_s)
        parts = sorted(set(partitions))

        if first_checkpoint is not None and first_checkpoint.sequencer_numbers:
            raise ValueError("a first claim's database checkpoint names no Kafka partition's offsets")

        def build(state: CatalogState) -> list[Action]:
            actions: list[Action] = [ClaimPartitions(owner=owner, kafka_partitions=kafka_partitions,
                                                     claims=claim_epochs(state.owners, parts))]
            if first_checkpoint is not None and state.database_checkpoint is None:
                actions.append(first_checkpoint)
            return actions

        with self._lock:
            self._writer = owner
            self._pooled_commit(build, now_s, epochs_check=False)
            self._fenced_at = None  # a pool writer now, whatever a single committer did before
            claimed = {p: self._state.owners[p].epoch for p in parts}
            self._epochs.update(claimed)
            return claimed

    def refresh(self) -> frozenset[int]:
        """Read every transaction other writers appended after this instance's newest; return the
        partitions this instance claimed and has lost since (to a later claim).

        For pool catalogs: an ingester calls it to find it was fenced for a partition before it
        commits, and to see the files the other owners persisted. Store errors propagate with the
        state unchanged. In a single-committer catalog the newer transactions are read only when
        they made it a pool catalog; another single committer's transaction fences the instance
        (as :meth:`newer_revision` does) with the state unchanged.
        """
        with self._lock:
            if not self._state.pooled:
                if self._fenced_at is not None:
                    return frozenset()
                mine = self._state
                self._catch_up_locked()
                if not self._state.pooled and self._state.revision > mine.revision:
                    self._fenced_at = mine.revision + 1
                    self._state = mine
                return frozenset()
            before = self._owned_locked()
            self._catch_up_locked()
            return frozenset(before - self._owned_locked())

    def _owned_locked(self) -> set[int]:
        owners = self._state.owners
        return {p for p, e in self._epochs.items() if p in owners and owners[p] == PartitionOwner(self._writer, e)}

    def _catch_up_locked(self, pending_uuid: str | None = None) -> int | None:
        """Apply the transactions after this instance's newest (another writer's, in a pool catalog)
        to a copy of the state and keep it; return the revision of the one whose uuid is
        ``pending_uuid`` (this instance's own commit, landed although its put raised), or None."""
        state = self._state
        copied = False  # the state is copied once there is a transaction to apply, not before
        found = None
        while True:
            revision = state.revision + 1
            key = transaction_key(self._db, revision)
            try:
                data = self._store.get(key)
            except ObjectNotFound:
                break
            if not copied:
                state, copied = state.copy(), True
            state = _read_and_apply_transaction(self._store, self._db, state, revision, key, data)
            if pending_uuid is not None and state.transaction_uuid == pending_uuid:
                found = revision
        self._state = state
        return found

    def _pooled_commit(self, build: Any, now_s: float, epochs_check: bool = True) -> int:
        """Append ``build(state)``'s actions to a pool catalog (or the claim that makes one) on top of
        the newest revision, reading other writers' transactions and checking ownership again
        after each lost race. Holds the lock."""
        writer = self._writer
        pending_uuid: str | None = None
        while True:
            if pending_uuid is not None:
                landed = self._catch_up_locked(pending_uuid)
                if landed is not None:  # an earlier attempt was written although its put raised
                    return landed
            state = self._state
            revision = state.revision + 1
            parsed = build(state)
            _check_writer(state, parsed, writer, self._epochs if epochs_check else None, revision)
            new_state = state.copy()
            apply_actions(new_state, parsed, revision)
            txn_uuid, txn = self._transaction(revision, parsed, state.transaction_uuid, now_s, writer)
            pending_uuid = txn_uuid
            try:
                self._store.put_if_absent(transaction_key(self._db, revision), _encode(txn))
            except AlreadyExists:
                continue  # another writer appended first: read it, check again, append after it
            return self._committed(new_state, revision, txn_uuid, now_s)

    def _transaction(self, revision: int, parsed: list, previous_uuid: str, now_s: float,
                     writer: str | None = None) -> tuple[str, dict]:
        """(uuid, JSON object) of transaction `revision` holding `parsed` (a pool catalog's names its writer)."""
        txn_uuid = str(_uuid.uuid4())
        txn = {
            "format_version": _actions_version(parsed) if writer is None else max(_actions_version(parsed),
                                                                                     _WRITER_VERSION),
            "type": _TYPE_TRANSACTION,
            "db": self._db,
            "revision": revision,
            "uuid": txn_uuid,
            "previous_uuid": previous_uuid,
            "timestamp_s": now_s,
            **({} if writer is None else {"writer": writer}),
            "actions": [a.to_json() for a in parsed],
        }
        return txn_uuid, txn

    def _committed(self, new_state: CatalogState, revision: int, txn_uuid: str, now_s: float) -> int:
        """Makes `new_state` (with transaction `revision` applied) this instance's state once it is written."""
        new_state.revision = revision
        new_state.transaction_uuid = txn_uuid
        new_state.timestamp_s = now_s
        self._state = new_state
        self._maybe_write_checkpoint(new_state)
        return revision

    def newer_revision(self) -> int | None:
        """The revision another writer committed after this instance's newest, or None.

        Probes the store for the transaction key of ``revision + 1`` (one
        ``exists`` call, nothing listed).  Taken under the commit lock, so a
        commit of this instance in progress is never mistaken for another
        writer's: every revision up to :attr:`revision` is this instance's,
        the next one exists only if someone else wrote it.  Once one is found
        the instance is fenced (as if its commit had lost that revision) and
        no store call is made again.  Store errors propagate. Single-committer catalogs only: in
        a pool catalog other writers' revisions are normal (use :meth:`refresh`).
        """
        if self._state.pooled:
            raise RuntimeError(f"preserved catalog of {self._db!r} is a pool catalog: use refresh()")
        with self._lock:
            if self._fenced_at is None:
                revision = self._state.revision + 1
                if self._store.exists(transaction_key(self._db, revision)):
                    self._fenced_at = revision
            return self._fenced_at

    def newer_revision_exists(self) -> bool:
        """Whether another writer committed after this instance (see :meth:`newer_revision`)."""
        return self.newer_revision() is not None

    # -- committing ------------------------------------------------------------

    def commit(self, actions: Sequence[Action | Mapping[str, Any]], now_s: float) -> int:
        """Append one transaction with ``actions`` as revision ``revision + 1``; return it.

        Called by the single committer on the driver (the persist's
        ``append_batches`` step) after the Parquet files it registers are
        written.  ``actions`` are action dataclasses or their JSON dicts;
        they are applied in order to a copy of the state first, so an action
        that cannot apply raises :class:`InvalidAction` and writes nothing.
        ``now_s`` is the caller's clock (stored, never read here).

        On a lost race raises :class:`RevisionConflict`: the state is
        unchanged, the instance is fenced, and the caller must stop.  Other
        store errors propagate with the state unchanged; the transaction may
        or may not have been written.  Retrying ``commit`` is then safe: it
        either commits (the first attempt did not land) or raises
        :class:`RevisionConflict` (it did, or another writer won), after
        which the caller stops and a restart reloads whatever was written.

        In a pool catalog a lost race is not fencing: the newer transactions are read, ownership
        is checked again and the transaction is appended after them; it raises
        :class:`PartitionsNotOwned` (nothing written) when this instance does not own, with the
        epoch it claimed, every Kafka partition the actions touch. A put that raised after it
        landed is recognised by its uuid when the retry finds the revision taken.
        """
        now_s = _check_now(now_s)
        with self._lock:
            if self._state.pooled:
                return self._pooled_commit(lambda _state: _parse_actions(actions, self._state.revision + 1), now_s)
            if self._fenced_at is not None:
                raise RevisionConflict(self._db, self._fenced_at, transaction_key(self._db, self._fenced_at))
            revision = self._state.revision + 1
            parsed = _parse_actions(actions, revision)
            new_state = self._state.copy()
            apply_actions(new_state, parsed, revision)
            txn_uuid, txn = self._transaction(revision, parsed, self._state.transaction_uuid, now_s)
            key = transaction_key(self._db, revision)
            try:
                self._store.put_if_absent(key, _encode(txn))
            except AlreadyExists:
                self._fenced_at = revision
                raise RevisionConflict(self._db, revision, key) from None
            return self._committed(new_state, revision, txn_uuid, now_s)

    def _maybe_write_checkpoint(self, state: CatalogState) -> None:
        """Write ``<revision>.ckpt`` when due; a failure only delays it to the next commit."""
        if state.revision - self._last_checkpoint_revision < self._config.transactions_until_checkpoint:
            return
        ckpt = {
            "format_version": _state_version(state),
            "type": _TYPE_CHECKPOINT,
            "db": self._db,
            "revision": state.revision,
            "uuid": state.transaction_uuid,
            "timestamp_s": state.timestamp_s,
            "state": _state_to_json(state),
        }
        try:
            # Only the winner of transaction N writes checkpoint N, so a plain put is safe.
            self._store.put(checkpoint_key(self._db, state.revision), _encode(ckpt))
        except Exception:  # noqa: BLE001 - the transaction is committed; the checkpoint is an optimisation
            _log.warning(
                "preserved catalog %r: writing checkpoint at revision %d failed; retrying on next commit",
                self._db,
                state.revision,
                exc_info=True,
            )
            return
        self._last_checkpoint_revision = state.revision


def _parse_actions(actions: Sequence[Action | Mapping[str, Any]], revision: int) -> list[Action]:
    parsed: list[Action] = []
    for a in actions:
        try:
            parsed.append(action_from_json(a))
        except InvalidAction as exc:
            raise InvalidAction(exc.kind, exc.reason, revision) from None
    return parsed


def read_state(store: ObjectStore, db: str, revision: int | None = None) -> CatalogState | None:
    """The state of ``db``'s preserved catalog as of ``revision`` (None: the newest), for a
    reader that never commits (the Spark data source, iox_spark/source/); None if there is no
    catalog. When the catalog's newest revision is below ``revision`` the newest state is
    returned: the caller compares ``state.revision``. Loads like :meth:`PreservedCatalog.create_or_load`
    (newest checkpoint at or below ``revision``, then the transactions after it, chain verified)
    and raises the same errors. Driver side; writes nothing.
    """
    catalog_prefix(db)  # validates the name
    if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int) or revision < 0):
        raise ValueError(f"revision must be an int >= 0, got {revision!r}")
    loaded = _load(store, db, revision)
    return None if loaded is None else loaded[0]


def _load(store: ObjectStore, db: str, up_to_revision: int | None = None) -> tuple[CatalogState, int] | None:
    """Load ``db`` from the newest checkpoint plus later transactions; None if no catalog.

    ``up_to_revision``: load the state as of that revision (files after it are ignored).
    Returns the state and the revision of the checkpoint used (0 if none).
    Verifies revisions are contiguous and every transaction links to its
    predecessor's uuid.
    """
    prefix = catalog_prefix(db)
    txns: dict[int, str] = {}
    ckpts: dict[int, str] = {}
    for meta in store.list(prefix):
        m = _FILE_RE.match(meta.key[len(prefix) :])
        if m is None:
            continue  # not a catalog file (nothing else is written under the prefix)
        if up_to_revision is not None and int(m.group(1)) > up_to_revision:
            continue
        (txns if m.group(2) == _TXN_SUFFIX else ckpts)[int(m.group(1))] = meta.key
    if not txns and not ckpts:
        return None

    state: CatalogState | None = None
    last_ckpt = 0
    if ckpts:
        last_ckpt = max(ckpts)
        state = _read_checkpoint(store, db, last_ckpt, ckpts[last_ckpt])
    expected = last_ckpt + 1 if ckpts else 0
    for revision in sorted(r for r in txns if r >= expected):
        if revision != expected:
            raise RevisionGap(db, expected, revision, txns[revision])
        state = _read_and_apply_transaction(store, db, state, revision, txns[revision])
        expected += 1
    if state is None:  # only possible if transaction 0 is missing and nothing else exists
        first = min(txns)
        raise RevisionGap(db, 0, first, txns[first])
    return state, last_ckpt


def _check_writer(state: CatalogState, actions: Sequence[Action], writer: str | None,
                  epochs: Mapping[int, int] | None, revision: int) -> None:
    """Raise PartitionsNotOwned unless ``writer`` may append ``actions`` to ``state`` (a pool
    catalog, or a transaction that claims partitions); nothing to check in a single-committer one."""
    claims = [a for a in actions if isinstance(a, ClaimPartitions)]
    if not state.pooled and not claims:
        return
    n = state.pool_kafka_partitions or claims[0].kafka_partitions
    check_ownership(state.db, state.owners, n, state.files, actions, writer, epochs, revision)


def _get(store: ObjectStore, db: str, revision: int, key: str) -> bytes:
    try:
        return store.get(key)
    except ObjectNotFound:  # listed but deleted since: the chain is broken under us
        raise RevisionGap(db, revision, None, key) from None


def _read_checkpoint(store: ObjectStore, db: str, revision: int, key: str) -> CatalogState:
    obj = _decode(_get(store, db, revision, key), key, _TYPE_CHECKPOINT, db, revision)
    return _state_from_json(obj.get("state"), db, revision, obj["uuid"], float(obj["timestamp_s"]), key,
                            obj["format_version"])


def read_next_state(store: ObjectStore, db: str, state: CatalogState) -> CatalogState | None:
    """The state one revision after ``state``: transaction ``state.revision + 1`` applied to a copy
    of ``state`` (which is not changed); None when that transaction does not exist yet. For a reader
    that follows the log revision by revision (lifecycle/iceberg_publication.py). Verifies the
    transaction links to ``state`` and raises as loading does. Driver side; writes nothing.
    """
    revision = state.revision + 1
    key = transaction_key(db, revision)
    if not store.exists(key):
        return None
    return _read_and_apply_transaction(store, db, state.copy(), revision, key)


def _read_and_apply_transaction(
    store: ObjectStore, db: str, state: CatalogState | None, revision: int, key: str, data: bytes | None = None,
) -> CatalogState:
    """Verify transaction ``revision`` links to ``state`` and apply it (in place). ``data``: the
    transaction's bytes when the caller read them already.

    In a pool catalog (and for the transaction that first claims partitions) the transaction's
    ``writer`` must own every Kafka partition it touches (catalog/ownership.py); one that does not
    is corrupt: no committer writes it (the check runs before the put-if-absent that appends it)."""
    raw = _get(store, db, revision, key) if data is None else data
    obj = _decode(raw, key, _TYPE_TRANSACTION, db, revision)
    expected_previous = None if state is None else state.transaction_uuid
    if obj.get("previous_uuid") != expected_previous:
        raise PreviousUuidMismatch(db, revision, expected_previous, obj.get("previous_uuid"), key)
    raw_actions = obj.get("actions")
    if not isinstance(raw_actions, list):
        raise CorruptCatalogFile(key, "actions is not a list")
    if state is None:
        state = CatalogState(db=db, revision=revision, transaction_uuid=obj["uuid"], timestamp_s=0.0)
    writer = obj.get("writer")
    if writer is not None and (not isinstance(writer, str) or obj["format_version"] < _WRITER_VERSION):
        raise CorruptCatalogFile(key, f"writer {writer!r} is not a name, or the file's format version "
                                      f"{obj['format_version']} has no writers")
    # ``state`` is private to the load in progress, so it is changed in place.
    try:
        actions = [action_from_json(raw) for raw in raw_actions]
        for action in actions:
            needs = _KIND_VERSIONS.get(action.KIND, BASE_FORMAT_VERSION)
            if needs > obj["format_version"]:
                raise CorruptCatalogFile(key, f"action {action.KIND!r} needs format version {needs}, "
                                              f"the file has {obj['format_version']}")
        _check_writer(state, actions, writer, None, revision)
        apply_actions(state, actions, revision)
    except PartitionsNotOwned as exc:
        raise CorruptCatalogFile(key, f"written by a writer that did not own what it wrote: {exc}") from exc
    except InvalidAction as exc:
        raise CorruptCatalogFile(key, f"action does not apply: {exc}") from exc
    state.revision = revision
    state.transaction_uuid = obj["uuid"]
    state.timestamp_s = float(obj["timestamp_s"])
    return state
