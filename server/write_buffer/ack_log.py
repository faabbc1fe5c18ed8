"""The acknowledged-offsets log: what this server told its clients Kafka holds.

Invariant: before a write or delete is answered as a success, the highest Kafka
offset of each partition it landed on is durable (fsynced) in
`<data-dir>/acked-offsets.jsonl`, with the topic's Kafka id and the database's
write-buffer epoch. A broker that later comes back with fewer offsets (a store
that did not fsync, an unclean leader election, a restored backup) is then
found at the next start by comparing its end offsets with this log
(server/consume/recovery.py `truncated_tail`), also when nothing was persisted
yet and the server itself was killed.

Commits are grouped: the first request that finds no flush running writes the
offsets of every request waiting, and one fsync makes them all durable. A
failed write or fsync breaks the log for good (`AckLogBroken`): a page the
kernel failed to write back may be dropped, so nothing after it may count as
durable; writes are refused until a restart.

Runs on the driver, in the producing request's thread (gRPC/HTTP workers).
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

from iox_spark.server.errors import ServerError, WriteBufferUnavailable

__all__ = ["AckLog", "AckedOffsets", "AckLogBroken", "AckLogFormatMismatch", "ACK_LOG_FILE", "ACK_LOG_VERSION"]

#: the log's file name in the data directory
ACK_LOG_FILE = "acked-offsets.jsonl"
#: the log's format version (its first line); another version is refused at start
ACK_LOG_VERSION = 1
_FORMAT = "iox-acked-offsets"
#: the log is rewritten with one line per topic once it grows past this size
COMPACT_AT_BYTES = 4 * 1024 * 1024


class AckLogBroken(WriteBufferUnavailable):
    """Writing or fsyncing the log failed: acknowledged offsets can no longer be made durable
    (the request is answered UNAVAILABLE: Kafka may hold it, the server cannot vouch for it)."""

    def __init__(self, path: str, cause: OSError):
        self.path = path
        self.errno = cause.errno
        super().__init__(f"the acknowledged-offsets log {path} could not be made durable ({cause.strerror or cause}); "
                         "writes are refused until the server restarts", retry_after_s=5.0)


class AckLogFormatMismatch(ServerError):
    """The log was written in another format or version."""

    def __init__(self, path: str, found: str):
        self.path = path
        self.found = found
        super().__init__(f"{path}: not an acknowledged-offsets log of version {ACK_LOG_VERSION} ({found}); "
                         "move it away to start without it (losses of the broker's tail are then not detected "
                         "for writes acknowledged before)")


@dataclass(frozen=True)
class AckedOffsets:
    """The highest offset acknowledged per Kafka partition of one topic incarnation and epoch."""

    topic_id: str | None
    epoch: int
    #: {kafka partition: highest offset acknowledged}
    hi_inclusive: dict = field(default_factory=dict)


def _merge(state: dict, topic: str, topic_id, epoch: int, offsets: dict) -> None:
    cur = state.get(topic)
    if cur is None or (cur.topic_id, cur.epoch) != (topic_id, epoch):
        state[topic] = AckedOffsets(topic_id, epoch, dict(offsets))
        return
    hi = dict(cur.hi_inclusive)
    for kp, off in offsets.items():
        hi[kp] = max(hi.get(kp, -1), off)
    state[topic] = AckedOffsets(topic_id, epoch, hi)


def _line(topic: str, a: AckedOffsets) -> bytes:
    return (json.dumps({"topic": topic, "topic_id": a.topic_id, "epoch": a.epoch,
                        "hi": {str(k): v for k, v in sorted(a.hi_inclusive.items())}}, separators=(",", ":"))
            + "\n").encode()


def _header() -> bytes:
    return (json.dumps({"format": _FORMAT, "version": ACK_LOG_VERSION}) + "\n").encode()


def _read(path: str) -> dict:
    """{topic: AckedOffsets} of the log at `path` ({} when missing). A last line cut short (a
    write a crash interrupted, never fsynced, so never acknowledged) is ignored."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return {}
    if lines == [b""]:
        return {}
    try:
        head = json.loads(lines[0])
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != _FORMAT or head.get("version") != ACK_LOG_VERSION:
        raise AckLogFormatMismatch(path, f"first line {lines[0][:80]!r}")
    state: dict = {}
    for raw in lines[1:]:
        if not raw:
            continue
        try:
            e = json.loads(raw)
            _merge(state, e["topic"], e["topic_id"], int(e["epoch"]), {int(k): int(v) for k, v in e["hi"].items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # cut short by a crash: never fsynced, never acknowledged
    return state


class AckLog:
    """The log of one data directory. Thread-safe; `record` blocks until its offsets are durable."""

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, ACK_LOG_FILE)
        #: {topic: AckedOffsets} as the log held it when opened (what earlier runs acknowledged)
        self.at_start: dict = _read(self.path)
        self._state: dict = dict(self.at_start)
        self._cond = threading.Condition()
        self._pending: dict = {}
        self._next_gen = 1  # the generation of the batch `_pending` accumulates
        self._durable_gen = 0
        self._flushing = False
        self._broken: AckLogBroken | None = None
        self._closed = False
        self._fd = -1
        self._rewrite()  # one line per topic, and a header a newer server could read

    def record(self, topic: str, topic_id: str | None, epoch: int, offsets: dict) -> None:
        """Makes `offsets` ({kafka partition: highest offset acknowledged}) of `topic` durable; returns
        once they are. Raises AckLogBroken when the log cannot be written."""
        with self._cond:
            if self._closed:
                raise WriteBufferUnavailable("the server is stopping")
            if self._broken is not None:
                raise self._broken
            _merge(self._pending, topic, topic_id, epoch, offsets)
            mine = self._next_gen
            while self._durable_gen < mine:
                if self._broken is not None:
                    raise self._broken
                if self._flushing:
                    self._cond.wait()
                    continue
                self._flushing = True
                batch, self._pending = self._pending, {}
                gen, self._next_gen = self._next_gen, self._next_gen + 1
                self._cond.release()
                try:
                    err = self._write(batch)
                finally:
                    self._cond.acquire()
                self._flushing = False
                if err is not None:
                    self._broken = AckLogBroken(self.path, err)
                else:
                    self._durable_gen = gen
                self._cond.notify_all()

    def _write(self, batch: dict) -> OSError | None:
        """Appends `batch` and fsyncs (one flusher at a time); compacts a long log. The error, if any."""
        try:
            for topic, a in batch.items():
                _merge(self._state, topic, a.topic_id, a.epoch, a.hi_inclusive)
            data = b"".join(_line(t, a) for t, a in batch.items())
            os.write(self._fd, data)
            os.fdatasync(self._fd)
            if os.fstat(self._fd).st_size > COMPACT_AT_BYTES:
                self._rewrite()
        except OSError as e:
            return e
        return None

    def _rewrite(self) -> None:
        """Writes the whole state as a new log (header, one line per topic) and puts it in place."""
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _header() + b"".join(_line(t, a) for t, a in sorted(self._state.items())))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        old, self._fd = self._fd, os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if old >= 0:
            os.close(old)

    def close(self) -> None:
        with self._cond:
            while self._flushing:
                self._cond.wait()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._closed = True
