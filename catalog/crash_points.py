"""Fail points for crash tests: SIGKILL this process at a named moment.

`IOX_CRASH_AT=<point>[,<point>...]` (read once at import) makes `crash_point(point)`
kill the process with SIGKILL, exactly like an operator's `kill -9` at that
moment. Unset (production), `crash_point` is a no-op set lookup.

Invariant: `CrashPoint` is the one registry of points. The code names its points
by member, the crash tests arm them by member, and a name outside the registry
in `IOX_CRASH_AT` fails at import with `UnknownCrashPoint` (a typo never turns a
crash test into one that silently does not crash). tests/unit/catalog/
test_crash_points.py checks that every member is placed in the code exactly once.
Lives in `catalog`, the lowest package, because every layer places points.

Fault points, for tests of what the server does when applying a message fails:
`arm_fault(point, key)` (in the server's process) makes `fault_point(point, key)`
raise InjectedFault until `disarm_fault(point, key)`. Unarmed (production), it is one
dictionary truth test. `FaultPoint` is their registry, as `CrashPoint` is of crash points.

Delay points, to make a moment observable from outside the process (a replay that takes a while):
`IOX_DELAY_AT=<point>=<seconds>[,...]` (read once at import) makes `delay_point(point)` sleep that
long each time; unset, it is a no-op dictionary lookup. `DelayPoint` is their registry; a name or a
duration it cannot read fails at import (`UnknownCrashPoint`, `InvalidDelay`).
"""
from __future__ import annotations

import enum
import os
import signal
import time

from .errors import CatalogError

__all__ = ["CrashPoint", "crash_point", "armed_points", "UnknownCrashPoint", "ENV", "FaultPoint", "fault_point",
           "arm_fault", "disarm_fault", "InjectedFault", "DelayPoint", "delay_point", "armed_delays", "DELAY_ENV",
           "DELAY_GATE_ENV", "DELAY_GATE_MAX_S",
           "InvalidDelay"]

#: the environment variable that arms points (comma-separated names)
ENV = "IOX_CRASH_AT"


class CrashPoint(enum.StrEnum):
    """Every point, with the moment it stands for."""

    #: a micro-batch's chunks are built and added; its offsets are not yet applied
    CONSUME_BEFORE_APPLIED = "consume_before_applied"
    #: a micro-batch during replay after a restart
    REPLAY_BATCH = "replay_batch"
    #: a chunk compaction built its result; the catalog still holds the inputs
    COMPACT_BEFORE_SWAP = "compact_before_swap"
    #: a persist wrote its Parquet files; the catalog transaction is not committed
    PERSIST_AFTER_PARQUET = "persist_after_parquet"
    #: a persist committed; the flush handle and the chunks are not yet swapped
    PERSIST_AFTER_COMMIT = "persist_after_commit"
    #: a compaction of Parquet files wrote its output; the transaction is not committed
    COMPACT_PERSISTED_AFTER_PARQUET = "compact_persisted_after_parquet"
    #: a compaction of Parquet files committed; the in-memory catalog is not yet swapped
    COMPACT_PERSISTED_AFTER_COMMIT = "compact_persisted_after_commit"
    #: cleanup chose files to delete and deleted none yet
    CLEANUP_BEFORE_DELETE = "cleanup_before_delete"
    #: a multi-message request's parts are acknowledged; its commit decision is not produced
    TXN_AFTER_PARTS = "txn_after_parts"
    #: the commit decision is acknowledged; the markers are not produced
    TXN_AFTER_DECISION = "txn_after_decision"
    #: an Iceberg publication wrote its copies; the Iceberg snapshot is not committed
    ICEBERG_BEFORE_COMMIT = "iceberg_before_commit"
    #: a downsampler's round emitted its windows (Kafka acknowledged them); its progress is not recorded
    DOWNSAMPLE_BEFORE_PROGRESS = "downsample_before_progress"


class UnknownCrashPoint(CatalogError):
    """`IOX_CRASH_AT` names a point the registry does not have."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"{ENV} names {name!r}, which is not a crash point; known: "
                         f"{', '.join(p.value for p in CrashPoint)}")


def armed_points(text: str) -> frozenset[CrashPoint]:
    """The points a value of `IOX_CRASH_AT` arms; UnknownCrashPoint on a name outside the registry."""
    out = set()
    for name in filter(None, (p.strip() for p in text.split(","))):
        try:
            out.add(CrashPoint(name))
        except ValueError:
            raise UnknownCrashPoint(name) from None
    return frozenset(out)


_ARMED = armed_points(os.environ.get(ENV, ""))


def crash_point(point: CrashPoint) -> None:
    """SIGKILLs this process when `point` is armed; otherwise nothing (any thread, driver side)."""
    if point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)


class FaultPoint(enum.StrEnum):
    """Every fault point, with where it raises."""

    #: the consumer plans a chunk of a table's writes in a micro-batch (key "<database>/<table>")
    APPLY_TABLE = "apply_table"


class InjectedFault(CatalogError):
    """Raised by an armed fault point."""

    def __init__(self, point: FaultPoint, key: str):
        self.point = point
        self.key = key
        super().__init__(f"injected fault at {point} for {key}")


#: point -> keys armed (see the module docstring)
_FAULTS: dict = {}


def arm_fault(point: FaultPoint, key: str) -> None:
    _FAULTS.setdefault(FaultPoint(point), set()).add(key)


def disarm_fault(point: FaultPoint, key: str) -> None:
    keys = _FAULTS.get(point, set())
    keys.discard(key)
    if not keys:
        _FAULTS.pop(point, None)


def fault_point(point: FaultPoint, key: str) -> None:
    if _FAULTS and key in _FAULTS.get(point, ()):
        raise InjectedFault(point, key)


#: the environment variable that arms delay points (comma-separated `<point>=<seconds>`)
DELAY_ENV = "IOX_DELAY_AT"


class DelayPoint(enum.StrEnum):
    """Every delay point, with the moment it delays."""

    #: a micro-batch with messages is about to be applied (every one, replay or not)
    APPLY_BATCH = "apply_batch"
    #: a micro-batch's chunks are in the catalog; its transaction state, its deletes' effect on
    #: the new chunks and its applied offsets are not yet (the lifecycle may act meanwhile).
    #: Gated when the batch added chunks
    BATCH_CHUNKS_ADDED = "batch_chunks_added"


class InvalidDelay(CatalogError):
    """`IOX_DELAY_AT` gives a delay point no non-negative number of seconds."""

    def __init__(self, part: str):
        self.part = part
        super().__init__(f"{DELAY_ENV}: {part!r} is not <point>=<seconds> with seconds >= 0")


def armed_delays(text: str) -> dict:
    """{DelayPoint: seconds} of a value of `IOX_DELAY_AT`; UnknownCrashPoint / InvalidDelay on a bad part."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, seconds = part.partition("=")
        try:
            point = DelayPoint(name.strip())
        except ValueError:
            raise UnknownCrashPoint(name.strip()) from None
        try:
            s = float(seconds)
        except ValueError:
            raise InvalidDelay(part) from None
        if not eq or not s >= 0:
            raise InvalidDelay(part)
        out[point] = s
    return out


_DELAYS = armed_delays(os.environ.get(DELAY_ENV, ""))
#: the environment variable naming a gate file: an armed delay point of a `gated` call waits, after
#: its seconds, for as long as that file exists (a test holds a batch exactly until it has looked)
DELAY_GATE_ENV = "IOX_DELAY_GATE"
#: a gate holds for at most this long, so a test that never removes its file cannot hang a server
DELAY_GATE_MAX_S = 120.0
#: how often a held point looks for its gate file
_GATE_POLL_S = 0.05


def delay_point(point: DelayPoint, gated: bool = False) -> None:
    """Sleeps as long as `IOX_DELAY_AT` arms `point` for (0 arms it without a sleep); then, when
    `gated` and the file `IOX_DELAY_GATE` names exists, waits until it is removed (at most
    DELAY_GATE_MAX_S). Nothing when `point` is not armed."""
    if _DELAYS:
        s = _DELAYS.get(point)
        if s:
            time.sleep(s)
        gate = os.environ.get(DELAY_GATE_ENV, "") if s is not None and gated else ""
        if gate:
            deadline = time.monotonic() + DELAY_GATE_MAX_S
            while os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(_GATE_POLL_S)
