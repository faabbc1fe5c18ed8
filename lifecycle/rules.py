"""Lifecycle rules of a database: when to compact, persist, unload and push back on writers.

Invariant kept here: a :class:`LifecycleRules` value is immutable and valid by
construction (positive thresholds, ``buffer_size_soft_bytes <=
buffer_size_hard_bytes``).  Defaults are IOx's (``data_types/src/database_rules.rs``,
``DEFAULT_*`` constants) except:

* ``persist`` defaults to ``True`` (IOx: ``false``): this server always has an
  object store;
* ``buffer_size_soft_bytes`` / ``buffer_size_hard_bytes`` default to
  :func:`default_buffer_sizes` of Spark's default driver memory (IOx: no limit);
* ``max_active_compactions`` defaults to 1 (IOx: one per CPU): a compaction
  here is a Spark job that already uses every executor core; use
  :func:`max_active_compactions_for_cpus` for IOx's rule.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from iox_spark.catalog.persistence_windows import DEFAULT_LATE_ARRIVE_WINDOW_S

from iox_spark.lifecycle.errors import InvalidLifecycleRule

__all__ = [
    "DEFAULT_PERSIST",
    "DEFAULT_PERSIST_ROW_THRESHOLD",
    "DEFAULT_PERSIST_AGE_THRESHOLD_S",
    "DEFAULT_LATE_ARRIVE_WINDOW_S",
    "DEFAULT_MUB_ROW_THRESHOLD",
    "DEFAULT_READ_BUFFER_DELAY_S",
    "DEFAULT_QUERIED_READ_BUFFER_DELAY_S",
    "DEFAULT_READ_BUFFER_WAIT_MIN_ROWS",
    "DEFAULT_WORKER_BACKOFF_MS",
    "DEFAULT_MAX_ACTIVE_COMPACTIONS",
    "DEFAULT_PERSISTED_COMPACTION_FILE_THRESHOLD",
    "DEFAULT_PERSISTED_COMPACTION_COLD_S",
    "DEFAULT_CATALOG_TRANSACTIONS_UNTIL_CHECKPOINT",
    "DEFAULT_CATALOG_TRANSACTION_PRUNE_AGE_S",
    "DEFAULT_DRIVER_MEMORY_BYTES",
    "BUFFER_SIZE_SOFT_FRACTION",
    "BUFFER_SIZE_HARD_FRACTION",
    "BufferSizes",
    "default_buffer_sizes",
    "max_active_compactions_for_cpus",
    "LifecycleRules",
]

#: Persist chunks to the object store (IOx default ``false``, see module docstring).
DEFAULT_PERSIST = True
#: IOx ``DEFAULT_PERSIST_ROW_THRESHOLD``: persist a partition once this many rows are persistable.
DEFAULT_PERSIST_ROW_THRESHOLD = 1_000_000
#: IOx ``DEFAULT_PERSIST_AGE_THRESHOLD_SECONDS``: persist once the oldest unpersisted write is this old.
DEFAULT_PERSIST_AGE_THRESHOLD_S = 30 * 60.0
#: IOx ``DEFAULT_MUB_ROW_THRESHOLD``: an open chunk with this many rows may be compacted at once.
DEFAULT_MUB_ROW_THRESHOLD = 100_000
#: A chunk still in the write-buffer form (Arrow IPC, cheap to build and to persist, slower to
#: query) whose last write is this old moves to the read buffer (rows in Spark, fast to query,
#: as costly to build as decoding every row). Younger chunks are usually persisted first (by
#: row threshold) and never pay for it. Not an IOx rule: IOx's read buffer costs little to build.
DEFAULT_READ_BUFFER_DELAY_S = 30.0
#: A write-buffer chunk of a table queried since its last write moves to the read buffer once
#: its last write is this old: a table that is read is likely read again (dashboards), and each
#: query of the write-buffer form decodes every row again.
DEFAULT_QUERIED_READ_BUFFER_DELAY_S = 2.0
#: A run of write-buffer chunks due for the read buffer waits (at most its delay) for a younger
#: chunk that would join it only when the two hold at least this many rows: moved apart, the two
#: read-buffer chunks are merged again (every row decoded twice), which matters for millions of
#: rows; a smaller run moves at once (merging it again is cheap, and queries read the read form
#: sooner). The size from which queries merge overlapping write-buffer chunks in Arrow too.
DEFAULT_READ_BUFFER_WAIT_MIN_ROWS = 100_000
#: IOx ``DEFAULT_WORKER_BACKOFF_MILLIS``: the policy loop runs again after this long.
DEFAULT_WORKER_BACKOFF_MS = 1_000
#: Compact a partition's Parquet files into one once it has this many, even while it is written
#: to (a partition with no write for ``persisted_compaction_cold_s`` is compacted from 2 files on).
#: Each such compaction rewrites the partition's persisted rows, so a partition written for a
#: long time is rewritten about every this-many persists.
DEFAULT_PERSISTED_COMPACTION_FILE_THRESHOLD = 10
#: A partition with no write for this long (seconds) is cold: its Parquet files are compacted into
#: one from 2 files on. Such a compaction rewrites every persisted row of the partition, so the
#: window must outlast the gaps between the micro-batches that write to a partition still
#: written to (several seconds apart under load): a partition that looks cold between two of them
#: is rewritten and written again at once. IOx used its late-arrive window (300 s by default) for
#: this; here it is a rule of its own, with that value, so that a short late-arrive window (which
#: makes rows persistable sooner) does not make partitions under load look cold.
DEFAULT_PERSISTED_COMPACTION_COLD_S = 300.0
#: Concurrent compactions (IOx: number of CPUs, see module docstring).
DEFAULT_MAX_ACTIVE_COMPACTIONS = 1
#: IOx ``DEFAULT_CATALOG_TRANSACTIONS_UNTIL_CHECKPOINT``: full preserved-catalog checkpoint every N transactions.
DEFAULT_CATALOG_TRANSACTIONS_UNTIL_CHECKPOINT = 100
#: IOx ``DEFAULT_CATALOG_TRANSACTION_PRUNE_AGE``: preserved-catalog transactions older than this may be pruned.
DEFAULT_CATALOG_TRANSACTION_PRUNE_AGE_S = 24 * 60 * 60.0
#: Spark's default ``spark.driver.memory`` (1g).
DEFAULT_DRIVER_MEMORY_BYTES = 1024**3
#: Soft buffer limit as a fraction of driver memory: Spark's unified memory is
#: ``spark.memory.fraction`` (0.6) of the heap and half of it
#: (``spark.memory.storageFraction`` 0.5) is storage that execution cannot evict,
#: i.e. 30 %: cached chunks below it stay put.
BUFFER_SIZE_SOFT_FRACTION = 0.30
#: Hard buffer limit: 75 % of the unified region (0.6 * 0.75 = 45 %), leaving a
#: quarter of it to the execution memory that compaction and persist need.
BUFFER_SIZE_HARD_FRACTION = 0.45


@dataclass(frozen=True)
class BufferSizes:
    """A soft and a hard in-memory buffer limit, in bytes."""

    soft_bytes: int
    hard_bytes: int


def default_buffer_sizes(driver_memory_bytes: int) -> BufferSizes:
    """Soft = 30 %, hard = 45 % of the Spark driver's memory (see the fractions above).

    Above the soft limit the policy unloads persisted chunks (and force-persists
    if nothing is unloadable); above the hard limit writers get backpressure.
    """
    if isinstance(driver_memory_bytes, bool) or not isinstance(driver_memory_bytes, int) or driver_memory_bytes <= 0:
        raise InvalidLifecycleRule("driver_memory_bytes", driver_memory_bytes, "must be a positive integer")
    return BufferSizes(
        soft_bytes=max(1, int(driver_memory_bytes * BUFFER_SIZE_SOFT_FRACTION)),
        hard_bytes=max(1, int(driver_memory_bytes * BUFFER_SIZE_HARD_FRACTION)),
    )


def max_active_compactions_for_cpus(cpu_count: int, fraction: float = 1.0) -> int:
    """IOx ``MaxActiveCompactions::new(fraction)``: ``cpu_count * fraction`` rounded down, at least 1."""
    if cpu_count < 1 or not math.isfinite(fraction) or fraction <= 0:
        raise InvalidLifecycleRule("max_active_compactions", (cpu_count, fraction), "needs cpu_count >= 1, fraction > 0")
    return max(1, int(cpu_count * fraction))


_DEFAULT_BUFFER_SIZES = default_buffer_sizes(DEFAULT_DRIVER_MEMORY_BYTES)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidLifecycleRule(name, value, "must be a positive integer")


def _positive_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidLifecycleRule(name, value, "must be a positive finite number of seconds")


@dataclass(frozen=True)
class LifecycleRules:
    """How data flows through a database (IOx ``LifecycleRules``)."""

    #: Persist chunks to the object store; when False, memory is freed by dropping unpersisted chunks.
    persist: bool = DEFAULT_PERSIST
    #: Persist a partition once its persistable windows hold at least this many rows.
    persist_row_threshold: int = DEFAULT_PERSIST_ROW_THRESHOLD
    #: Persist a partition once its oldest unpersisted write is at least this old (seconds).
    persist_age_threshold_s: float = DEFAULT_PERSIST_AGE_THRESHOLD_S
    #: Writers may send rows this late (seconds); younger writes are not persisted and the
    #: open chunk counts as cold once it had no write for this long.
    late_arrive_window_s: float = DEFAULT_LATE_ARRIVE_WINDOW_S
    #: An open chunk with at least this many rows may be compacted even if still written to.
    mub_row_threshold: int = DEFAULT_MUB_ROW_THRESHOLD
    #: A write-buffer chunk whose last write is this old (seconds) moves to the read buffer.
    read_buffer_delay_s: float = DEFAULT_READ_BUFFER_DELAY_S
    #: ... or this old when its table was queried since (see the constant).
    queried_read_buffer_delay_s: float = DEFAULT_QUERIED_READ_BUFFER_DELAY_S
    #: A due run waits for a younger chunk that would join it from this many rows (see the constant).
    read_buffer_wait_min_rows: int = DEFAULT_READ_BUFFER_WAIT_MIN_ROWS
    #: At or above this buffer size, unload/drop chunks (None: no limit).
    buffer_size_soft_bytes: int | None = _DEFAULT_BUFFER_SIZES.soft_bytes
    #: Above this buffer size, push back on writers (None: no limit).
    buffer_size_hard_bytes: int | None = _DEFAULT_BUFFER_SIZES.hard_bytes
    #: The policy loop runs again after this many milliseconds.
    worker_backoff_ms: int = DEFAULT_WORKER_BACKOFF_MS
    #: At most this many compactions run at once.
    max_active_compactions: int = DEFAULT_MAX_ACTIVE_COMPACTIONS
    #: A partition with this many Parquet files gets them compacted into one (see the constant).
    persisted_compaction_file_threshold: int = DEFAULT_PERSISTED_COMPACTION_FILE_THRESHOLD
    #: A partition with no write for this long (seconds) gets its files compacted from 2 on (see the constant).
    persisted_compaction_cold_s: float = DEFAULT_PERSISTED_COMPACTION_COLD_S
    #: Write a full preserved-catalog checkpoint every this many transactions.
    catalog_transactions_until_checkpoint: int = DEFAULT_CATALOG_TRANSACTIONS_UNTIL_CHECKPOINT
    #: Preserved-catalog transactions older than this (seconds) may be pruned.
    catalog_transaction_prune_age_s: float = DEFAULT_CATALOG_TRANSACTION_PRUNE_AGE_S

    def __post_init__(self) -> None:
        if not isinstance(self.persist, bool):
            raise InvalidLifecycleRule("persist", self.persist, "must be a bool")
        for name in ("persist_row_threshold", "mub_row_threshold", "worker_backoff_ms", "max_active_compactions",
                     "catalog_transactions_until_checkpoint", "persisted_compaction_file_threshold",
                     "read_buffer_wait_min_rows"):
            _positive_int(name, getattr(self, name))
        if self.persisted_compaction_file_threshold < 2:
            raise InvalidLifecycleRule("persisted_compaction_file_threshold", self.persisted_compaction_file_threshold,
                                       "must be at least 2 (compacting one file into one changes nothing)")
        for name in ("persist_age_threshold_s", "late_arrive_window_s", "catalog_transaction_prune_age_s",
                     "read_buffer_delay_s", "queried_read_buffer_delay_s", "persisted_compaction_cold_s"):
            _positive_seconds(name, getattr(self, name))
        for name in ("buffer_size_soft_bytes", "buffer_size_hard_bytes"):
            value = getattr(self, name)
            if value is not None:
                _positive_int(name, value)
        soft, hard = self.buffer_size_soft_bytes, self.buffer_size_hard_bytes
        if soft is not None and hard is not None and soft > hard:
            raise InvalidLifecycleRule("buffer_size_soft_bytes", soft, f"must not exceed buffer_size_hard_bytes ({hard})")

    @classmethod
    def for_driver_memory(cls, driver_memory_bytes: int, **overrides: Any) -> LifecycleRules:
        """Rules whose buffer limits come from :func:`default_buffer_sizes` of ``driver_memory_bytes``."""
        sizes = default_buffer_sizes(driver_memory_bytes)
        fields: dict[str, Any] = {"buffer_size_soft_bytes": sizes.soft_bytes, "buffer_size_hard_bytes": sizes.hard_bytes}
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes: Any) -> LifecycleRules:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    @property
    def worker_backoff_s(self) -> float:
        return self.worker_backoff_ms / 1000.0
