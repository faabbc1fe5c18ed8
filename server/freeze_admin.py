"""Frozen mode of a running server: `iox freeze` / `iox unfreeze`, --freeze-at-percent, its status.

Invariant (see server/write_buffer/freeze.py for the record and what the source does with it):
the freeze record is written while the write-buffer stream is stopped (`WriteBufferConsumer.restart`),
so the offsets it names are exactly what was applied; removing it needs no stop (the source reads
on at its next trigger). One freeze or unfreeze at a time. A frozen server keeps the reason it
froze for first: freezing it again changes nothing.

When it runs: created by `IoxServer.start` before the stream starts (it reads the record a
previous run left); its usage watch runs from start to stop when --freeze-at-percent is set.
Driver side.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from typing import TYPE_CHECKING

from iox_spark.iox import management_pb2

from iox_spark.server.runtime.memory_guard import process_tree_rss_bytes
from iox_spark.server.write_buffer.freeze import (ADMIN_REASON, FREEZE_FILE_NAME, FreezeRecord, UsageWatch, read_record,
                                        remove_record, write_record)

if TYPE_CHECKING:
    from typing import Callable, Protocol

    from iox_spark.catalog.catalog import Catalog
    from iox_spark.server.consume.consumer import WriteBufferConsumer

    class _ResidentBytes(Protocol):
        """`rss(exact=...)`: bytes of the process tree (`process_tree_rss_bytes`' contract)."""

        def __call__(self, exact: bool = True) -> int: ...

    class _DiskUsage(Protocol):
        """What `shutil.disk_usage` answers, as far as `usage` reads it."""

        @property
        def used(self) -> int: ...

        @property
        def total(self) -> int: ...

__all__ = ["FreezeControl", "host_memory_bytes"]

log = logging.getLogger(__name__)


def host_memory_bytes() -> int:
    """The host's physical memory in bytes; 0 when unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class FreezeControl:
    """Freezes and unfreezes the server: holds every partition of `catalog` (the in-memory catalog)
    where it is applied, while the write-buffer stream (`start`'s consumer) stands still. `data_dir`
    keeps the freeze record; `at_percent` of memory or disk freezes by itself (0: never);
    `rss(exact=...)` and `disk_usage()` measure them."""

    def __init__(self, catalog: Catalog, data_dir: str, at_percent: float, memory_limit_bytes: int,
                 rss: _ResidentBytes | None = None, disk_usage: Callable[[], _DiskUsage] | None = None):
        self._catalog = catalog
        #: the write-buffer stream (WriteBufferConsumer), from `start` on
        self._consumer = None
        self.path = os.path.join(data_dir, FREEZE_FILE_NAME)
        self.data_dir = data_dir
        self.at_percent = at_percent
        self.memory_limit_bytes = memory_limit_bytes
        #: rss(exact=...) -> bytes of the process tree (`process_tree_rss_bytes`'s contract)
        self._rss = rss or (lambda exact=True: process_tree_rss_bytes(exact=exact))
        self._disk_usage = disk_usage or (lambda: shutil.disk_usage(data_dir))
        self._lock = threading.Lock()
        #: the record in force (None: not frozen); read from the data directory at start
        self.record: FreezeRecord | None = read_record(self.path)
        self._watch: UsageWatch | None = None

    @property
    def frozen(self) -> bool:
        return self.record is not None

    def usage(self) -> tuple[int, int, int, int]:
        """(memory used, memory total, disk used, disk total) in bytes: the process tree's resident
        bytes against --memory-limit-bytes (the host's memory without one), the data directory's file
        system. The tree's RSS sum (an upper bound, no page walk) stands for memory used while it is
        below the threshold; at or above it each page is counted once (PSS)."""
        du = self._disk_usage()
        total = self.memory_limit_bytes or host_memory_bytes()
        used = self._rss(exact=False)
        if total > 0 and 100.0 * used / total >= self.at_percent:
            used = self._rss(exact=True)
        return used, total, du.used, du.total

    def hold_recorded(self) -> None:
        """At start, before the stream starts: a freeze a previous run recorded holds every partition
        where that run had applied it (server/write_buffer/freeze.py)."""
        if self.record is not None:
            self._catalog.freeze(self.record.offsets)

    def start(self, consumer: WriteBufferConsumer) -> None:
        """Once the write-buffer stream runs (`consumer`, WriteBufferConsumer): freezes and unfreezes
        restart it while no micro-batch runs; the usage watch starts (with `at_percent`)."""
        self._consumer = consumer
        if self.at_percent:
            self._watch = UsageWatch(self.at_percent, self.usage, self._freeze_for_usage)
            self._watch.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def _freeze_for_usage(self, reason: str) -> None:
        if self.record is None:
            self.freeze(reason)

    def freeze(self, reason: str = "") -> management_pb2.FreezeState:
        """Freezes now (see the module docstring); returns the state."""
        reason = reason or ADMIN_REASON
        with self._lock:
            if self.record is None:
                def between():
                    offsets = self._catalog.freeze()
                    record = FreezeRecord(reason=reason, since_s=time.time(), offsets=offsets)
                    try:
                        write_record(self.path, record)
                    except BaseException:
                        self._catalog.unfreeze()
                        raise
                    self.record = record

                self._consumer.restart(between)
                log.warning("frozen (%s): no new write-buffer offsets are consumed; everything held is persisted; "
                            "`iox unfreeze` resumes", reason)
            return self.state()

    def unfreeze(self) -> management_pb2.FreezeState:
        """Ends frozen mode (see the module docstring); returns the state."""
        with self._lock:
            if self.record is not None:
                # holds first: the file still stops the source, so nothing read meanwhile is dropped
                self._catalog.unfreeze()
                remove_record(self.path)
                log.warning("unfrozen (was frozen since %.0f for %s): consuming resumes", self.record.since_s,
                            self.record.reason)
                self.record = None
            return self.state()

    def state(self) -> management_pb2.FreezeState:
        out = management_pb2.FreezeState()
        r = self.record
        if r is not None:
            out.frozen, out.reason, out.since_s = True, r.reason, r.since_s
            for db, parts in r.offsets.items():
                out.offsets[db].hi_inclusive.update(parts)
        return out
