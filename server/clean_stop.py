"""A clean stop with the embedded in-memory broker: every acknowledged write persisted before the broker goes.

Invariant: the in-memory broker's write buffer dies with it, so a clean stop (SIGTERM, SIGINT)
first waits until every acknowledged write is applied and every multi-message request read is
decided (the transaction-repair thread still runs), then persists every database it may commit
to; only a drain that got everything records a complete database checkpoint, which is what lets
the next start accept the in-memory broker's empty topic. What could not be drained (held by a
freeze or a poisoned message, past DRAIN_TIMEOUT_S) is logged as lost, never recorded as complete.

Who calls it: `IoxServer.stop`, once, in the stopping thread (driver), after gRPC and HTTP stopped
taking requests and before the lifecycle worker stops. Durable brokers and Kafka clusters keep the
write buffer: a stop then persists nothing (the next start replays).
"""
from __future__ import annotations

import logging
import time

__all__ = ["drain_and_persist", "DRAIN_TIMEOUT_S"]

#: How long a clean stop waits for acknowledged writes to be applied before persisting.
DRAIN_TIMEOUT_S = 120.0

log = logging.getLogger(__name__)


def drain_and_persist(catalog, write_buffer, lifecycle, replay) -> None:
    """Clean stop with the embedded in-memory broker: the write buffer dies with the broker,
    so wait until every acknowledged write is applied and every multi-message request read
    is decided (the repair thread still runs), then persist everything."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    drained = True
    while True:
        behind, held_back = [], []
        for (topic, kp), off in write_buffer.acked_all().items():
            db = next((d for d in catalog.databases() if d.topic == topic), None)
            applied, held = db.applied_and_held() if db is not None else ({}, {})
            if db is None or applied.get(kp, -1) < min(off, held.get(kp, off + 1) - 1):
                behind.append((topic, kp))
            elif kp in held and off >= held[kp]:
                held_back.append((topic, kp))  # acknowledged, held (frozen, poisoned): not applied here
        undecided = [d.name for d in catalog.databases() if not d.txns.is_idle()]
        if not behind and not undecided and not replay.any_replaying():
            if held_back:  # the topic holds acknowledged writes that are not in Parquet
                log.error("clean stop: acknowledged writes of %s are held (frozen or poisoned) and not "
                          "applied; they are lost with the in-memory broker", held_back)
                drained = False
            break
        if time.monotonic() > deadline:
            log.error("clean stop: %s not applied (transactions undecided in %s) within %ss; persisting "
                      "what is applied", behind, undecided, DRAIN_TIMEOUT_S)
            drained = False
            break
        time.sleep(0.1)
    for db in catalog.databases():
        if lifecycle.fenced_revision(db.name) is not None:
            log.warning("clean stop: %s is fenced (another server owns it): not persisted here", db.name)
            continue
        try:
            done = lifecycle.persist_now(db, None, None, time.time())
            log.info("clean stop: persisted %d partition(s) of %s", len(done), db.name)
            if drained:
                _record_complete_checkpoint(catalog, lifecycle, db)
        except Exception:
            log.exception("clean stop: persisting %s failed", db.name)


def _record_complete_checkpoint(catalog, lifecycle, db) -> None:
    """After a drained clean stop persisted everything: record that the topic holds nothing
    unpersisted, so the next start may accept the in-memory broker's empty topic (any other
    reset topic refuses to start: acknowledged writes past the checkpoint may be lost)."""
    unpersisted, applied = catalog.unpersisted_at_stop(db)
    if unpersisted:
        log.error("clean stop: %s still holds unpersisted rows in %s; not recording a complete checkpoint",
                  db.name, unpersisted[:5])
        return
    preserved = lifecycle.preserved_for(db.name, time.time())
    preserved.commit([db.checkpoint_action({kp: (None, hi) for kp, hi in applied.items()}, complete=True)],
                     time.time())
