"""Errors of the catalog package.

Invariant kept here: every error the catalog raises on purpose derives from
:class:`CatalogError` and has one class per cause, carrying the cause's data
as attributes (never only a message).  Shutdown is not an error.
"""

from __future__ import annotations

__all__ = [
    "CatalogError",
    "InvalidKey",
    "InvalidStoreUrl",
    "ObjectNotFound",
    "AlreadyExists",
    "NotDurable",
    "RevisionConflict",
    "PartitionsNotOwned",
    "FormatVersionMismatch",
    "CorruptCatalogFile",
    "BrokenChain",
    "RevisionGap",
    "PreviousUuidMismatch",
    "InvalidAction",
    "InvalidWallTime",
    "InvalidLateArriveWindow",
    "EmptyWriteRange",
    "InvertedTimeRange",
    "InvertedOffsetRange",
    "OffsetNotIncreasing",
    "ForeignFlushHandle",
    "FlushHandleReleased",
    "CheckpointDecodeError",
    "UndeterminedPartitionCheckpointOrder",
    "PartitionCheckpointWithoutDatabase",
    "PartitionCheckpointMaximumAfterDatabase",
    "SeqOverflow",
]


class CatalogError(Exception):
    """Root of all catalog errors."""


# --- object store and preserved catalog errors (catalog/object_store.py,
# --- catalog/preserved_catalog.py)


class InvalidKey(CatalogError):
    """An object key (or key prefix / name segment) is malformed."""

    def __init__(self, key: object, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid object key {key!r}: {reason}")


class InvalidStoreUrl(CatalogError):
    """An object store URL/config cannot be turned into a store."""

    def __init__(self, url: object, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"invalid object store url {url!r}: {reason}")


class ObjectNotFound(CatalogError):
    """``get`` of a key that holds no object."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object not found: {key!r}")


class AlreadyExists(CatalogError):
    """``put_if_absent`` of a key that already holds an object (or is being created)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object already exists: {key!r}")


class NotDurable(CatalogError):
    """The local store could not make a directory entry durable (fsync of the directory failed):
    the file written in it may not survive a power loss, so what needed it (a catalog commit, a
    persisted file) fails."""

    def __init__(self, path: str, errno_: int | None, reason: str) -> None:
        self.path = path
        self.errno = errno_
        self.reason = reason
        super().__init__(f"cannot make the directory entry of {path!r} durable: {reason}")


class RevisionConflict(CatalogError):
    """Another writer committed preserved-catalog revision ``revision`` first.

    The writer that gets this has lost the single-committer race and is
    fenced: it must stop (no further commits, no acknowledging its persist).
    """

    def __init__(self, db: str, revision: int, key: str) -> None:
        self.db = db
        self.revision = revision
        self.key = key
        super().__init__(
            f"preserved catalog of {db!r}: revision {revision} already committed by another writer ({key!r}); "
            "this writer is fenced and must stop"
        )


class PartitionsNotOwned(CatalogError):
    """A pool catalog's transaction touches Kafka partitions its writer does not own.

    ``partitions``: the partitions ``writer`` lacks; ``owners``: {partition: PartitionOwner} of
    those that another writer (or a later claim of the same writer's name) holds; ``revision``: the
    revision the check ran against (None: not known). A writer that gets this on commit has lost
    those partitions to a claim (catalog/ownership.py): it must stop writing them; the partitions
    it still owns are unaffected.
    """

    def __init__(self, db: str, partitions: tuple[int, ...], writer: str | None, owners: dict,
                 revision: int | None = None) -> None:
        self.db = db
        self.partitions = partitions
        self.writer = writer
        self.owners = owners
        self.revision = revision
        held = ", ".join(f"{p} by {o.owner!r} (epoch {o.epoch})" for p, o in sorted(owners.items()))
        if partitions:
            what = (f"writer {writer!r} does not own kafka partitions {list(partitions)}"
                    + (f" (owned: {held})" if held else "") + "; it is fenced for them and must stop writing them")
        else:
            what = f"writer {writer!r} owns no kafka partition, which a database-wide record needs"
        at = "" if revision is None else f" at revision {revision}"
        super().__init__(f"preserved catalog of {db!r}{at}: {what}")


class FormatVersionMismatch(CatalogError):
    """A catalog file was written with a format version this code does not read.

    ``expected``: the newest version this code writes; ``readable``: every version it reads."""

    def __init__(self, expected: int, actual: object, key: str, readable: tuple = ()) -> None:
        self.expected = expected
        self.actual = actual
        self.key = key
        self.readable = tuple(readable) or (expected,)
        versions = ", ".join(str(v) for v in self.readable)
        super().__init__(f"catalog file {key!r} has format version {actual!r}; this server reads format "
                         f"version{'s' if len(self.readable) > 1 else ''} {versions} (a newer server wrote it?)")


class CorruptCatalogFile(CatalogError):
    """A catalog file cannot be decoded or violates the file format."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"corrupt catalog file {key!r}: {reason}")


class BrokenChain(CatalogError):
    """Base of the errors raised when the transaction chain does not link up."""


class RevisionGap(BrokenChain):
    """Transaction ``expected_revision`` is missing; the next file found is ``found_revision``."""

    def __init__(self, db: str, expected_revision: int, found_revision: int | None, key: str | None) -> None:
        self.db = db
        self.expected_revision = expected_revision
        self.found_revision = found_revision
        self.key = key
        super().__init__(
            f"preserved catalog of {db!r}: expected revision {expected_revision}, found {found_revision} ({key!r})"
        )


class PreviousUuidMismatch(BrokenChain):
    """Transaction ``revision`` does not name the uuid of its predecessor."""

    def __init__(self, db: str, revision: int, expected_uuid: str | None, actual_uuid: str | None, key: str) -> None:
        self.db = db
        self.revision = revision
        self.expected_uuid = expected_uuid
        self.actual_uuid = actual_uuid
        self.key = key
        super().__init__(
            f"preserved catalog of {db!r}: revision {revision} ({key!r}) links to previous uuid {actual_uuid!r}, "
            f"but revision {revision - 1} has uuid {expected_uuid!r}"
        )


class InvalidAction(CatalogError):
    """A catalog action is malformed or cannot apply to the current state.

    ``revision`` is the revision being built or loaded (``None`` when the
    action is rejected while being constructed).
    """

    def __init__(self, kind: str, reason: str, revision: int | None = None) -> None:
        self.kind = kind
        self.reason = reason
        self.revision = revision
        at = f" at revision {revision}" if revision is not None else ""
        super().__init__(f"invalid {kind!r} action{at}: {reason}")


# --- persistence windows and checkpoints (catalog/persistence_windows.py,
# --- catalog/checkpoint.py)


class InvalidWallTime(CatalogError):
    """A wall time (``now`` etc.) is not a finite number of seconds."""

    def __init__(self, what: str, value: object) -> None:
        self.what = what
        self.value = value
        super().__init__(f"{what} must be a finite number of seconds, got {value!r}")


class InvalidLateArriveWindow(CatalogError):
    """``late_arrive_window_s`` is not a positive finite number of seconds."""

    def __init__(self, late_arrive_window_s: object) -> None:
        self.late_arrive_window_s = late_arrive_window_s
        super().__init__(f"late_arrive_window_s must be > 0 seconds, got {late_arrive_window_s!r}")


class EmptyWriteRange(CatalogError):
    """``PersistenceWindows.add_range`` was given fewer than one row."""

    def __init__(self, row_count: object) -> None:
        self.row_count = row_count
        super().__init__(f"add_range needs row_count >= 1, got {row_count!r}")


class InvertedTimeRange(CatalogError):
    """A row time range has ``min_time_ns > max_time_ns``."""

    def __init__(self, min_time_ns: int, max_time_ns: int) -> None:
        self.min_time_ns = min_time_ns
        self.max_time_ns = max_time_ns
        super().__init__(f"min_time_ns ({min_time_ns}) > max_time_ns ({max_time_ns})")


class InvertedOffsetRange(CatalogError):
    """An offset range has its min above its max (``kafka_partition`` None when not known)."""

    def __init__(self, kafka_partition: int | None, min_offset: int, max_offset: int) -> None:
        self.kafka_partition = kafka_partition
        self.min_offset = min_offset
        self.max_offset = max_offset
        where = f" of kafka partition {kafka_partition}" if kafka_partition is not None else ""
        super().__init__(f"offset range{where}: min ({min_offset}) is greater than max ({max_offset})")


class OffsetNotIncreasing(CatalogError):
    """A write's offsets do not come after the offsets already seen for its Kafka partition."""

    def __init__(self, kafka_partition: int, offset: int, previous_max_offset: int) -> None:
        self.kafka_partition = kafka_partition
        self.offset = offset
        self.previous_max_offset = previous_max_offset
        super().__init__(
            f"offset {offset} for kafka partition {kafka_partition} is not greater than previous {previous_max_offset}"
        )


class ForeignFlushHandle(CatalogError):
    """A flush handle was given to the persistence windows of another partition."""

    def __init__(self, handle_table: str, handle_partition_key: str, table: str, partition_key: str) -> None:
        self.handle_table = handle_table
        self.handle_partition_key = handle_partition_key
        self.table = table
        self.partition_key = partition_key
        super().__init__(
            f"flush handle of {handle_table!r}/{handle_partition_key!r} used on {table!r}/{partition_key!r}"
        )


class FlushHandleReleased(CatalogError):
    """A flush handle was already flushed or aborted (``state``)."""

    def __init__(self, table: str, partition_key: str, state: str) -> None:
        self.table = table
        self.partition_key = partition_key
        self.state = state
        super().__init__(f"flush handle of {table!r}/{partition_key!r} is no longer outstanding ({state})")


class CheckpointDecodeError(CatalogError):
    """A checkpoint dict read from the preserved catalog is malformed at ``field``."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"cannot decode checkpoint field {field!r}: {reason}")


class UndeterminedPartitionCheckpointOrder(CatalogError):
    """Two checkpoints of one partition cannot be ordered (IOx: "this is a bug")."""

    def __init__(self, table: str, partition_key: str) -> None:
        self.table = table
        self.partition_key = partition_key
        super().__init__(f"partition checkpoint order of {table!r}/{partition_key!r} is undetermined")


class PartitionCheckpointWithoutDatabase(CatalogError):
    """A partition checkpoint names a Kafka partition that no database checkpoint has."""

    def __init__(self, table: str, partition_key: str, kafka_partition: int) -> None:
        self.table = table
        self.partition_key = partition_key
        self.kafka_partition = kafka_partition
        super().__init__(
            f"partition checkpoint {table!r}/{partition_key!r} has offsets for kafka partition {kafka_partition} "
            "but no database checkpoint does"
        )


class PartitionCheckpointMaximumAfterDatabase(CatalogError):
    """A partition checkpoint saw a later offset than the database checkpoint claims."""

    def __init__(
        self, table: str, partition_key: str, kafka_partition: int, partition_max_offset: int, database_max_offset: int
    ) -> None:
        self.table = table
        self.partition_key = partition_key
        self.kafka_partition = kafka_partition
        self.partition_max_offset = partition_max_offset
        self.database_max_offset = database_max_offset
        super().__init__(
            f"max offset in partition checkpoint {table!r}/{partition_key!r} ({partition_max_offset}) is larger "
            f"than the database-wide max ({database_max_offset}) for kafka partition {kafka_partition}"
        )


# --- write-buffer order (catalog/seq_layout.py)


class SeqOverflow(CatalogError):
    """An ``_iox_seq`` would not fit a signed 64-bit integer; raised instead of wrapping.

    ``origin``: the seq origin it was computed from; ``offset``: the Kafka offset whose
    message's seqs do not fit (None: no offset fits, the origin itself has no room);
    ``limit``: the largest seq there is (``2**63 - 1``).
    """

    def __init__(self, origin: int, offset: int | None, limit: int) -> None:
        self.origin = origin
        self.offset = offset
        self.limit = limit
        what = f"the seqs of offset {offset}" if offset is not None else "the seqs of a write-buffer epoch"
        super().__init__(f"{what} from seq origin {origin} would exceed {limit}: the write-buffer order "
                         "of this database is exhausted")


# --- retention (catalog/retention.py)


class InvalidDuration(CatalogError, ValueError):
    """A retention period (or another duration) that does not parse: ``text`` as given, ``reason`` why."""

    def __init__(self, text: object, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(f"invalid duration {text!r}: {reason} (use e.g. 30d, 12h, 90m, 3600s, or 0 for none)")
