"""Frozen mode: an ingester that consumes no new write-buffer offsets.

Invariant kept here: while the freeze file exists, the write-buffer source reads no Kafka
partition past the offset it was applied to when the server froze (``offsets``; a topic or
partition the record does not name is read no further than where the source stands), so
nothing new is applied; everything applied before stays queryable and the lifecycle persists
all of it (lifecycle/policy.py ``DatabaseState.frozen``). The record is written once, atomically,
while no micro-batch runs (the server stops its streaming query around it), so its offsets are
exactly what was applied; it stays until unfreeze, also across restarts, where the replay reads
up to those offsets and counts as caught up there (:func:`cap_replay_until`).

A server freezes on the admin call (`iox freeze`), or by itself when its memory or its data
directory's disk passes ``--freeze-at-percent`` (:class:`UsageWatch`, a daemon thread sampling
every ``interval_s`` from the server's start to its stop; :func:`usage_reason` decides). Writes
and deletes are still accepted: they wait in the write buffer (for this server after unfreeze,
or in a pool for the partitions' next owner).

File format (JSON, ``format_version`` 1)::

    {"format_version": 1, "reason": "...", "since_s": 1700000000.0,
     "offsets": {"<database>": {"<kafka partition>": <last applied offset>}}}

Runs on the driver; :func:`source_holds` also in the streaming source's Python worker (it only
reads the file).
"""
from __future__ import annotations

import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field

from iox_spark.catalog.sharding import topic_for

from iox_spark.server.errors import ServerError

__all__ = ["FREEZE_FILE_NAME", "FREEZE_FORMAT_VERSION", "FreezeRecord", "FreezeFileCorrupt", "read_record",
           "write_record", "remove_record", "source_holds", "usage_reason", "cap_replay_until", "UsageWatch",
           "DEFAULT_USAGE_INTERVAL_S", "ADMIN_REASON"]

log = logging.getLogger(__name__)

#: The freeze record's file name in the server's data directory.
FREEZE_FILE_NAME = "frozen.json"
#: The format this code writes and reads.
FREEZE_FORMAT_VERSION = 1
#: How often --freeze-at-percent samples memory and disk.
DEFAULT_USAGE_INTERVAL_S = 2.0
#: The reason of a freeze asked for without one.
ADMIN_REASON = "admin"


class FreezeFileCorrupt(ServerError):
    """The freeze record cannot be read (not JSON, fields missing, another format version)."""

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"freeze record {path}: {reason}; remove it to unfreeze, or fix it")


@dataclass(frozen=True)
class FreezeRecord:
    """Why and when the server froze, and {database: {kp: last offset applied}} at that moment."""

    reason: str
    since_s: float
    offsets: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format_version": FREEZE_FORMAT_VERSION, "reason": self.reason, "since_s": self.since_s,
                "offsets": {db: {str(kp): hi for kp, hi in sorted(parts.items())}
                            for db, parts in sorted(self.offsets.items())}}


def write_record(path: str, record: FreezeRecord) -> None:
    """Writes the record atomically and durably (a crash leaves the old file or the new one)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record.to_json(), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_record(path: str) -> bool:
    """Removes the record; True when there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def read_record(path: str) -> FreezeRecord | None:
    """The record at ``path``, None when there is none; raises FreezeFileCorrupt."""
    try:
        with open(path) as f:
            obj = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FreezeFileCorrupt(path, f"not readable JSON ({e})") from e
    if not isinstance(obj, dict):
        raise FreezeFileCorrupt(path, "not a JSON object")
    if obj.get("format_version") != FREEZE_FORMAT_VERSION:
        raise FreezeFileCorrupt(path, f"format version {obj.get('format_version')!r}, this server reads "
                                      f"{FREEZE_FORMAT_VERSION}")
    reason, since, offsets = obj.get("reason"), obj.get("since_s"), obj.get("offsets")
    if not isinstance(reason, str) or isinstance(since, bool) or not isinstance(since, (int, float)) \
            or not isinstance(offsets, dict):
        raise FreezeFileCorrupt(path, "reason, since_s or offsets missing or of the wrong type")
    parsed: dict = {}
    for db, parts in offsets.items():
        if not isinstance(parts, dict):
            raise FreezeFileCorrupt(path, f"offsets of {db!r} are not an object")
        try:
            parsed[db] = {int(kp): int(hi) for kp, hi in parts.items()}
        except (TypeError, ValueError):
            raise FreezeFileCorrupt(path, f"offsets of {db!r} are not integers") from None
    return FreezeRecord(reason=reason, since_s=float(since), offsets=parsed)


def source_holds(path: str) -> dict | None:
    """For the write-buffer source: None when the server is not frozen, else {topic: {kp: first
    offset not to read}} (the last applied offset + 1). A freeze file that cannot be read holds
    every partition where the source stands ({}): frozen is the safe reading."""
    if not path or not os.path.exists(path):
        return None
    try:
        record = read_record(path)
    except FreezeFileCorrupt:
        return {}
    if record is None:  # removed meanwhile
        return None
    return {topic_for(db): {kp: hi + 1 for kp, hi in parts.items()} for db, parts in record.offsets.items()}


def cap_replay_until(replay_until: dict, record: FreezeRecord | None) -> dict:
    """The replay targets of a restart ({topic: {kp: last offset to replay}}) for a frozen server:
    never past what was applied at the freeze (the source reads no further), and nothing for a
    partition the record does not name. Unchanged when not frozen. Pure."""
    if record is None:
        return replay_until
    by_topic = {topic_for(db): parts for db, parts in record.offsets.items()}
    out: dict = {}
    for topic, until in replay_until.items():
        frozen = by_topic.get(topic, {})
        capped = {kp: min(hi, frozen[kp]) for kp, hi in until.items() if kp in frozen}
        out[topic] = {kp: hi for kp, hi in capped.items() if hi >= 0}
    return out


def usage_reason(memory_used: int, memory_total: int, disk_used: int, disk_total: int,
                 at_percent: float) -> str | None:
    """Why usage calls for a freeze at ``at_percent`` (0: never), or None. A total of 0 is unknown
    and never counts. Pure."""
    if not at_percent or at_percent <= 0:
        return None
    for what, used, total in (("memory", memory_used, memory_total), ("disk", disk_used, disk_total)):
        if total > 0:
            pct = 100.0 * used / total
            if pct >= at_percent:
                return f"{what} {math.floor(pct * 10) / 10:.1f}% >= {at_percent:g}%"
    return None


class UsageWatch:
    """Samples usage every ``interval_s`` and calls ``on_over(reason)`` while :func:`usage_reason`
    names one. ``sample()`` returns (memory used, memory total, disk used, disk total) in bytes.
    A failing sample or callback is logged; the watch goes on."""

    def __init__(self, at_percent: float, sample, on_over, interval_s: float = DEFAULT_USAGE_INTERVAL_S):
        self.at_percent = at_percent
        self.sample = sample
        self.on_over = on_over
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> str | None:
        """One sample; calls ``on_over`` and returns the reason when usage is over."""
        reason = usage_reason(*self.sample(), self.at_percent)
        if reason is not None:
            self.on_over(reason)
        return reason

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="freeze-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:
                log.exception("freeze usage sample failed")
