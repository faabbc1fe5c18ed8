"""Truncation of the durable embedded broker's store: what is persisted leaves the write buffer.

Tansu's s3:// storage keeps each record batch as one object,
`clusters/<cluster>/topics/<topic>/partitions/<partition:010>/records/<base offset:020>.batch`,
implements neither DeleteRecords nor retention, and answers every fetch and every ListOffsets
request of a partition by listing all of that partition's objects. Left alone, a partition's
listing grows with every write it ever took: the broker and its store spend CPU on each fetch in
proportion (at a few thousand batches per partition they took both cores of a 2-core host), and
the disk fills. This is the write-ahead log's truncation after a snapshot, as InfluxDB 3 deletes
its WAL files once they are persisted.

Invariant: an object is deleted only when
- every offset it holds is below the start offset of the committed database checkpoint its
  partition was last given (`advance`): replay after a restart reads nothing below it (its base
  offset and the next object's are both at or below the start; the partition's last object is
  never deleted, the end of the partition is read from it, see `kafka_source.true_ends`);
- it was written before that checkpoint was committed (a broker that lost its tail gives offsets
  out again: a message written after the checkpoint is never taken for a persisted one);
- it was written at least `retention_s` ago (`inf`: nothing is ever deleted).
Kafka's earliest offset (the low watermark) then moves up to the first object kept, at or below
the checkpoint's start, as retention moves it on a Kafka cluster.

Who uses it: `server/app.py`, for the embedded durable broker of a server that is not a member
of an ingester pool (another member may still replay a partition this server persisted). A Kafka
cluster keeps its own retention; the in-memory broker loses everything at its stop anyway.

When it runs: a thread of the server (driver), woken by each committed persist (`advance`) and
every INTERVAL_S; it stops at `close`. A failure is logged and the work is tried again at the
next wake: truncation saves CPU and disk, nothing depends on it having happened.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from iox_spark.server.runtime.broker import STORE_BUCKET, TANSU_CLUSTER_ID, store_client

__all__ = ["BrokerTruncation", "StoredBatch", "deletable", "partition_prefix", "batch_offset", "INTERVAL_S",
           "DEFAULT_RETENTION_S"]

log = logging.getLogger(__name__)

#: how often the thread looks again without being woken (retention makes objects deletable as time passes)
INTERVAL_S = 10.0
#: how long a persisted message stays in the store at least, since it was written (0: until persisted)
DEFAULT_RETENTION_S = 0.0
#: objects one DeleteObjects request names at most (S3's limit)
_DELETE_MAX_KEYS = 1000
_SUFFIX = ".batch"
#: the store's LastModified may be whole seconds: an object counts as written before a checkpoint
#: only when it was listed as written at least this long before the checkpoint's commit
_TIMESTAMP_RESOLUTION_S = 1.0


@dataclass(frozen=True)
class StoredBatch:
    """One record batch object as the store lists it."""
    key: str
    base_offset: int
    #: when it was written, seconds since the epoch
    written_at_s: float


def partition_prefix(cluster: str, topic: str, partition: int) -> str:
    """Where Tansu keeps the record batches of one topic partition (its object key layout)."""
    return f"clusters/{cluster}/topics/{topic}/partitions/{partition:0>10}/records/"


def batch_offset(key: str) -> int | None:
    """The base offset a record batch object's key names, None for any other key."""
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(_SUFFIX) or not name[:-len(_SUFFIX)].isdigit():
        return None
    return int(name[:-len(_SUFFIX)])


def deletable(batches: list[StoredBatch], start_offset: int, committed_at_s: float, now_s: float,
              retention_s: float) -> list[StoredBatch]:
    """The batches of one partition (sorted by base offset) that may be deleted (see the module's
    invariant): those whose next batch starts at or below `start_offset`, written before
    `committed_at_s` (by more than the store's timestamp resolution) and at least `retention_s`
    before `now_s`. Pure."""
    if math.isinf(retention_s):
        return []
    out = []
    for b, nxt in zip(batches, batches[1:]):
        if nxt.base_offset > start_offset:
            break
        if b.written_at_s + _TIMESTAMP_RESOLUTION_S <= committed_at_s and b.written_at_s <= now_s - retention_s:
            out.append(b)
    return out


class BrokerTruncation:
    """Deletes persisted record batches from the embedded durable broker's store (module docstring).

    `store_port()` returns the S3 port of the broker's store, None while there is none (the
    broker's supervisor may start it again on other ports); `metrics` is the server's ServerMetrics.
    """

    def __init__(self, store_port, retention_s: float = DEFAULT_RETENTION_S, metrics=None):
        self._store_port = store_port
        self._clients: dict[int, object] = {}
        self.bucket = STORE_BUCKET
        self.cluster = TANSU_CLUSTER_ID
        self.retention_s = retention_s
        self._metrics = metrics
        self._lock = threading.Lock()
        #: (topic, partition) -> (start offset, when its checkpoint was committed)
        self._starts: dict[tuple[str, int], tuple[int, float]] = {}
        #: (topic, partition) -> start offset everything below which was deleted already
        self._done: dict[tuple[str, int], int] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "BrokerTruncation":
        self._thread = threading.Thread(target=self._loop, name="broker-truncation", daemon=True)
        self._thread.start()
        return self

    def advance(self, topic: str, start_offsets: dict, committed_at_s: float) -> None:
        """A database checkpoint of `topic` was committed at `committed_at_s`: replay starts at
        `start_offsets` ({kafka partition: offset}). Called by the lifecycle's thread after each
        committed persist; returns at once."""
        with self._lock:
            for kp, start in start_offsets.items():
                self._starts[(topic, int(kp))] = (int(start), committed_at_s)
        self._wake.set()

    def close(self) -> None:
        """Stops the thread (a pass under way finishes its current request first)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run_once(self, now_s: float) -> int:
        """One pass over every partition given a start: deletes what may go; returns how many objects.
        Called by the thread (and by tests)."""
        port = self._store_port()
        if port is None:
            return 0
        client = self._clients.get(port)
        if client is None:
            self._clients = {port: (client := store_client(port))}
        with self._lock:
            todo = dict(self._starts)
        n = 0
        for (topic, kp), (start, committed_at) in sorted(todo.items()):
            if self._stop.is_set():
                break
            if self._done.get((topic, kp)) == start:
                continue  # everything below this start is gone already
            batches = self._listed(client, topic, kp, start)
            gone = deletable(batches, start, committed_at, now_s, self.retention_s)
            below = sum(1 for b in batches[1:] if b.base_offset <= start)
            failed = []
            for i in range(0, len(gone), _DELETE_MAX_KEYS):
                chunk = gone[i:i + _DELETE_MAX_KEYS]
                r = client.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": b.key} for b in chunk],
                                                                      "Quiet": True})
                failed += r.get("Errors", [])
                n += len(chunk) - len(r.get("Errors", []))
            if failed:
                log.warning("the embedded broker's store did not delete %d persisted record batch(es) of %s[%d] "
                            "(trying again later), e.g. %s", len(failed), topic, kp, failed[0])
            elif len(gone) == below:
                self._done[(topic, kp)] = start
        if n:
            if self._metrics is not None:
                self._metrics.broker_batches_truncated(n)
            log.debug("deleted %d persisted record batch(es) from the embedded broker's store", n)
        return n

    def _listed(self, client, topic: str, kp: int, start: int) -> list[StoredBatch]:
        """The partition's batches in offset order, up to and including the first one past `start`
        (that one only decides whether the batch before it holds offsets at or above `start`)."""
        out: list[StoredBatch] = []
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=partition_prefix(self.cluster, topic, kp))
        for o in (o for page in pages for o in page.get("Contents", ())):
            off = batch_offset(o["Key"])
            if off is None:
                continue
            out.append(StoredBatch(o["Key"], off, o["LastModified"].timestamp()))
            if off > start:
                break
        return sorted(out, key=lambda b: b.base_offset)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once(time.time())
            except Exception:  # noqa: BLE001 - logged; tried again at the next wake
                log.warning("truncating the embedded broker's store failed; trying again later", exc_info=True)
