"""Group commit on the durable embedded broker: concurrent writes to one table share record batches
(server/write_buffer/producer.py), and every acknowledged write is applied exactly once: while the
server runs, after a SIGKILL amid the writes (replay reads the shared batches again), and after a
persist whose checkpoint may start inside a shared batch (replay starts there; the store keeps
every batch that holds an offset at or above it, server/runtime/broker_truncation.py).

Real processes: `iox serve` on its durable embedded broker (Tansu on its SeaweedFS store), the store
listed with boto3 as Tansu lays it out."""
from __future__ import annotations

import threading
import uuid

from iox_spark.catalog.sharding import partition_for, topic_for
from tests.crash.harness import ServerProcess, Writer, stored_offsets
from tests.crash.test_broker_truncation import DURABLE
from tests.waiting import wait_for

WRITERS = 8
TABLE = "shared"
#: how long the writers may take to make the producer share a batch (it does within seconds)
SHARE_WAIT_S = 120.0


def _shared(offsets: list[int], end_exclusive: int) -> bool:
    """Whether a stored batch holds more than one message: base offsets `offsets` (sorted) of a
    partition whose messages end at `end_exclusive`."""
    bounds = offsets + [end_exclusive]
    return any(b - a > 1 for a, b in zip(bounds, bounds[1:]))


def _all(writers: list[Writer], db: str) -> Writer:
    """One writer holding what `writers` wrote (for `Writer.check`)."""
    w = Writer(db, TABLE)
    for x in writers:
        w.acked |= x.acked
        w.unacked |= x.unacked
        w.tokens += x.tokens
    return w


def test_concurrent_writes_share_batches_and_are_applied_exactly_once_across_a_kill_and_a_persist(data_dir):
    db = f"shared_{uuid.uuid4().hex[:6]}"
    topic = topic_for(db)
    kp = partition_for(TABLE, 2)  # the harness's servers have 2 partitions
    writers = [Writer(db, TABLE) for _ in range(WRITERS)]
    for k, w in enumerate(writers):
        w.next_id = k * 10_000_000  # ids of their own
    s1 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
    stop = threading.Event()

    def write(w: Writer) -> None:
        while not stop.is_set() and s1.proc.poll() is None:
            w.write_batch(s1.client, 20)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in writers]
    for t in threads:
        t.start()
    try:
        def shared_now() -> bool:
            end = 1 + max((tok[kp] for w in writers for tok in list(w.tokens)), default=-1)
            return end > 0 and _shared(stored_offsets(data_dir, topic, kp), end)

        wait_for(shared_now, SHARE_WAIT_S, "a record batch holding two messages (group commit)", poll_s=0.2)
        s1.kill()  # amid the writes: those in flight may or may not be there, once
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        s1.kill()
    s2 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
    try:
        every = _all(writers, db)
        assert len(every.acked) >= 40, "the writers were acknowledged before the kill"
        every.check(s2.client)
        # more writes after the replay, then a persist: the checkpoint's start may lie inside a batch
        more = Writer(db, TABLE)
        more.next_id = WRITERS * 10_000_000
        for _ in range(5):
            assert more.write_batch(s2.client, 20)
        every = _all(writers + [more], db)
        every.check(s2.client)
        s2.client.persist(db, timeout_s=180)
        for _ in range(5):
            assert more.write_batch(s2.client, 20)
        every = _all(writers + [more], db)
        every.check(s2.client)
    finally:
        s2.kill()
    s3 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
    try:
        _all(writers + [more], db).check(s3.client)
    finally:
        s3.terminate()
