"""Lost writes found while the server runs: a topic replaced under it, a broker that lost its tail.

Invariant: once the write buffer is found to have lost acknowledged writes, or to give offsets out
again, writes and deletes to that database are refused (`refuse_writes_after_a_loss`: the write
buffer's guard, every produce) until the loss is accepted and, where offsets would be reused,
until what was applied is persisted and the database continues in a new write-buffer epoch
(`continue_in_new_epoch`): a new topic from its start, a cut-short topic from Kafka's end. Every
loss is recorded in the database's preserved catalog, so a restart keeps the record.

When it runs: `IoxServer` builds one `LostWritesControl` once its lifecycle worker exists; the
write buffer's hooks call `on_topic` (a topic ensured), `check_tail` (an offset given out again)
and `refuse_writes_after_a_loss`; `run_tail_checks` runs in its own thread from start to stop
(every TAIL_CHECK_INTERVAL_S); `accept` answers `iox accept-lost-writes`. The background work
after a loss (recording it, persisting, continuing) runs in a thread per database and stops with
the server (`stopped`). Driver only.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import Catalog, Database, LostWriteRange
from iox_spark.iox import management_pb2
from iox_spark.server.errors import (DatabaseNotFound, NotReadyToAccept, NothingToAccept, TopicReplaced, WriteBufferTruncated,
                           WriteBufferUnavailable, WritesLost)
from iox_spark.server.write_buffer.tail_loss import TailWatch

if TYPE_CHECKING:
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.consumer import WriteBufferConsumer
    from iox_spark.server.metrics import ServerMetrics
    from iox_spark.server.write_buffer.ack_log import AckLog
    from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["LostWritesControl", "TAIL_CHECK_INTERVAL_S", "lost_status"]

#: How often the server compares Kafka's end offsets with the offsets it knows were written (a broker
#: that lost its tail: `LostWritesControl.check_tails`); one reader asks for every database's topic
TAIL_CHECK_INTERVAL_S = 5.0
#: How long a database whose broker lost its tail waits between tries to continue in a new epoch
_TAIL_RETRY_S = 1.0
#: How long accepting a loss waits for the background persist after a topic's replacement
_ACCEPT_JOIN_S = 120.0

log = logging.getLogger(__name__)


def lost_status(out, r: LostWriteRange) -> None:
    """Fills a management_pb2.LostWrites from `r`."""
    out.partition, out.from_offset, out.detected_at_s, out.reason = r.partition, r.from_offset, r.detected_at_s, r.reason
    out.accepted, out.epoch = r.accepted, r.epoch
    if r.to_exclusive is not None:
        out.to_offset_exclusive = r.to_exclusive
    if r.accepted_at_s is not None:
        out.accepted_at_s = r.accepted_at_s


class LostWritesControl:
    """Finds, records and resolves losses of the write buffer while the server runs.

    Collaborators: the `catalog`; the `write_buffer` (WriteBuffer: acknowledged offsets, Kafka's
    ends and topic ids); the `lifecycle` (LifecycleWorker: persists, commits records, pauses);
    the `consumer` (WriteBufferConsumer: restarts the stream while no micro-batch runs);
    `metrics` (counts losses); `partitions` of every topic; `tail_loss_grace_s` (how long an end
    short of acknowledged offsets may be a late read, TailWatch); `stopped` (set when the server
    stops); `replaying(db)`: whether the database's start-up replay still runs;
    `refuse_when_fenced(name)`: raises when another server owns the database; `forget_epoch(db)`:
    the server forgets what it keeps of the database's old epoch (its caches of offsets and
    messages), called while no micro-batch runs; `ack_log` (server/write_buffer/ack_log.py): where
    `confirm` records each acknowledged request, so a later start knows what was acknowledged.
    """

    def __init__(self, catalog: Catalog, write_buffer: WriteBuffer, lifecycle: LifecycleWorker,
                 consumer: WriteBufferConsumer, metrics: ServerMetrics, partitions: int,
                 tail_loss_grace_s: float, stopped: threading.Event, replaying: Callable[[Database], bool],
                 refuse_when_fenced: Callable[[str], None], forget_epoch: Callable[[Database], None],
                 ack_log: AckLog):
        self._catalog = catalog
        self._ack_log = ack_log
        self._write_buffer = write_buffer
        self._lifecycle = lifecycle
        self._consumer = consumer
        self._metrics = metrics
        self._partitions = partitions
        self._stopped = stopped
        self._replaying = replaying
        self._refuse_when_fenced = refuse_when_fenced
        self._forget_epoch = forget_epoch
        #: judges Kafka ends short of acknowledged offsets: a late read or a lost tail (`check_tails`)
        self._tail_watch = TailWatch(tail_loss_grace_s)
        #: database name -> the thread recording, persisting or continuing it after a loss
        self._after_loss: dict = {}

    # -- the write buffer's hooks ------------------------------------------------------
    def guard(self, database: str) -> dict | None:
        """The write buffer's guard (every produce of a write or a delete, gRPC/HTTP threads): refuses a
        fenced database, then one whose write buffer lost writes (`refuse_writes_after_a_loss`).
        Returns {kp: highest offset applied} of the database (None when new here): an offset Kafka
        gives this request at or below it was given out before (`confirm`)."""
        self._refuse_when_fenced(database)
        self.refuse_writes_after_a_loss(database)
        db = self._catalog.peek_database(database)
        # one copy under the GIL, no lock: every write passes here and must not wait behind a micro-batch
        return None if db is None else dict(db.applied_hi_inclusive)

    def confirm(self, database: str, topic: str, token: dict, taken: dict) -> None:
        """The write buffer's confirmation (every produce Kafka acknowledged, before it is answered;
        gRPC/HTTP threads): an offset Kafka gave out again (at or below one `taken` before the request
        was sent) means its broker lost the tail: the request fails and the loss is recorded
        (`check_tail`); else the token is made durable in the ack log."""
        db = self._catalog.peek_database(database)
        reused = {kp: off for kp, off in token.items() if off <= taken.get(kp, -1)}
        if reused and db is not None:
            log.error("database %s: Kafka acknowledged offsets %s, given out before (up to %s were): its broker "
                      "lost the tail of %s", database, reused, {kp: taken[kp] for kp in reused}, topic)
            self.check_tail(db, ends_at_most=reused)
            self.refuse_writes_after_a_loss(database)
            raise WriteBufferTruncated(database, reused)  # the check found another state: refuse this one anyway
        self._ack_log.record(topic, None if db is None else db.topic_id, 0 if db is None else db.epoch, token)

    def refuse_writes_after_a_loss(self, database: str) -> None:
        """The write buffer's guard (every produce, gRPC/HTTP threads): refuses writes and deletes
        to a database whose write buffer lost acknowledged writes not accepted yet, or whose topic
        was replaced under this server, or whose broker gives offsets out again."""
        db = self._catalog.peek_database(database)
        if db is None or (not db.lost_writes and not db.topic_replaced and db.tail_truncated is None):
            return  # every write passes here: no lock
        open_ranges, replaced, truncated = db.loss_state()
        if open_ranges:
            raise WritesLost(database, open_ranges)
        if replaced:
            raise TopicReplaced(database, db.topic)
        if truncated is not None:
            raise WriteBufferTruncated(database, truncated)

    def on_topic(self, database: str, topic: str, topic_id: str | None) -> None:
        """The write buffer ensured `topic` (first write of this process to it, or after a produce
        failed): a database new here is recorded in its preserved catalog before its first write is
        produced; a topic whose Kafka id changed under this server was deleted and created again
        (a broker that restarted empty): what it lost is recorded and writes are refused."""
        db = self._catalog.ensure_database(database, topic, self._partitions)
        known = db.adopt_topic_id(topic_id)
        if known is None:
            if topic_id is not None and not self._catalog.pool_member:
                self._lifecycle.record_database(db, time.time())  # in a pool its owners record it
            return
        if topic_id is None or topic_id == known:
            return
        self._topic_replaced(db, topic_id)
        self.refuse_writes_after_a_loss(database)

    def check_tail(self, db: Database, ends_at_most: dict | None = None) -> None:
        """`check_tails` of one database; `ends_at_most`: {kp: offset} Kafka's end was at most when the
        broker lost the tail (an offset it gave out again), when known."""
        self.check_tails([db], {db.name: ends_at_most or {}})

    # -- finding a loss ------------------------------------------------------------------
    def run_tail_checks(self) -> None:
        """Runs from start to stop: every TAIL_CHECK_INTERVAL_S, `check_tails`. A broker away is
        checked again next round; a stopping server is not an error."""
        while not self._stopped.wait(TAIL_CHECK_INTERVAL_S):
            try:
                self.check_tails(self._catalog.databases())
            except Exception as e:  # broker away, or the write buffer closing: next round
                log.debug("checking the write buffer's ends: %s", e)

    def check_tails(self, dbs: list, ends_at_most: dict | None = None) -> None:
        """Compares Kafka's end offsets of `dbs`' topics with the offsets this server knows were written
        (applied, or acknowledged to a client): an end at or below one of them means the broker lost
        its tail (`_tail_lost`); a topic whose Kafka id changed was replaced (`_topic_replaced`). What is
        known is read before Kafka's ends, so a write landing meanwhile never looks like a loss."""
        known: dict = {}
        for db in dbs:
            state = db.tail_check_state()
            if state is not None and self._lifecycle.fenced_revision(db.name) is None:
                known[db.name] = (db, *state)
        if not known:
            return
        wb = self._write_buffer
        for db, _epoch, hi in known.values():
            for kp, off in wb.acked_of(db.topic).items():
                hi[kp] = max(hi.get(kp, -1), off)
        topics = sorted({db.topic for db, _e, _h in known.values()})
        ids = wb.describe_topic_ids(topics)
        # one request for every watermark; a topic whose watermark is not past what is known (Tansu may
        # report one short of the end) is read to its true end
        marks = wb.high_watermarks(topics, self._partitions)
        behind = sorted({db.topic for n, (db, _e, hi) in known.items() if (ends_at_most or {}).get(n) or
                         any(hw <= hi.get(kp, -1) for kp, hw in marks[db.topic].items())})
        bounds = wb.partition_bounds_of(behind, self._partitions) if behind else {}
        now = time.time()
        for name, (db, epoch, hi) in known.items():
            if not marks[db.topic]:
                continue  # no such topic (a broker that came back empty): the next write finds the new one
            if ids[db.topic] is not None and ids[db.topic] != db.topic_id:
                self._topic_replaced(db, ids[db.topic])
                continue
            given_again = (ends_at_most or {}).get(name, {})
            topic_ends = {kp: end for kp, (_lo, end) in bounds.get(db.topic, {}).items()}
            ends = {}
            for kp in range(db.kafka_partitions):
                if kp in given_again:  # Kafka gave an offset out again: lost at once
                    ends[kp] = min(topic_ends.get(kp, given_again[kp]), given_again[kp])
                elif kp not in topic_ends:
                    self._tail_watch.clear((name, epoch, kp))
                elif self._tail_watch.lost((name, epoch, kp), topic_ends[kp], hi.get(kp, -1), now):
                    ends[kp] = topic_ends[kp]
            if ends:
                self._tail_lost(db, ends, epoch)

    def _topic_replaced(self, db: Database, new_topic_id: str) -> None:
        """Records the loss of the acknowledged writes this server had not applied yet (the rest are
        in memory) and persists what was applied, in the background; with nothing lost, the last
        database checkpoint is then marked complete, so the next start continues on the new topic."""
        now = time.time()
        acked = self._write_buffer.acked_of(db.topic)
        reason = f"topic {db.topic} was deleted and created again (its id is now {new_topic_id}, was {db.topic_id})"
        ranges = db.record_topic_replaced(acked, now, reason)
        if ranges is None:
            return
        if ranges:
            self._metrics.lost_writes(db.name, len(ranges))
            log.error("database %s: the write buffer LOST acknowledged writes (%s): %s; writes are refused until the "
                      "loss is accepted (iox accept-lost-writes --db %s, or a restart with --skip-lost-writes)",
                      db.name, reason, db.name,
                      ", ".join(f"partition {r.partition} [{r.from_offset}, {r.to_exclusive})" for r in ranges))
        else:
            log.error("database %s: %s while the server ran; nothing acknowledged was lost; persisting what was "
                      "applied; writes are refused until the database continues on the new topic (iox "
                      "accept-lost-writes --db %s, or a restart)", db.name, reason, db.name)
        self._in_background(db, f"persist-after-loss-{db.name}",
                            lambda: self._persist_after_replacement(db, nothing_lost=not ranges))

    def _tail_lost(self, db: Database, ends: dict, epoch: int) -> None:
        """The broker lost the tail of `db`'s topic (`ends`: {kp: Kafka's end now}) while the server ran, in
        write-buffer `epoch`: the acknowledged writes past what was applied and past Kafka's end are
        recorded lost; writes are refused (WritesLost until the loss is accepted, then
        WriteBufferTruncated) until what was applied is persisted and the database continues in a new
        epoch from Kafka's end (`continue_after_tail_lost`)."""
        now = time.time()
        acked = self._write_buffer.acked_of(db.topic)
        ranges = db.record_tail_lost(epoch, ends, acked, now)
        if ranges is None:
            return  # a new epoch since the ends were read, or found already
        if ranges:
            self._metrics.lost_writes(db.name, len(ranges))
            log.error("database %s: the write buffer LOST acknowledged writes (its broker lost the tail of %s): %s; "
                      "writes are refused until the loss is accepted (iox accept-lost-writes --db %s, or a restart "
                      "with --skip-lost-writes)", db.name, db.topic,
                      ", ".join(f"partition {r.partition} [{r.from_offset}, {r.to_exclusive})" for r in ranges), db.name)
        else:
            log.error("database %s: the broker lost the tail of %s (Kafka partition ends %s), below what this "
                      "server applied; nothing acknowledged was lost; writes are refused until what was applied is "
                      "persisted and the database continues in a new write-buffer epoch", db.name, db.topic, ends)
        self.continue_after_tail_lost(db, lost=bool(ranges))

    # -- after a loss ----------------------------------------------------------------------
    def _in_background(self, db: Database, name: str, work: Callable[[], None]) -> None:
        t = threading.Thread(target=work, daemon=True, name=name)
        self._after_loss[db.name] = t
        t.start()

    def continue_after_tail_lost(self, db: Database, lost: bool) -> None:
        """In the background: records a loss in the preserved catalog (a restart keeps the record); with
        nothing lost, or once the loss is accepted, persists what was applied and continues in a new
        write-buffer epoch from Kafka's end (`continue_in_new_epoch`), trying again until it could (a
        replay or a failed micro-batch still to apply) or the server stops. Also called at start for
        a database whose lost tail recovery found."""
        def run():
            if lost:
                try:
                    self._record_lost_writes(db, time.time())
                except Exception:
                    log.exception("database %s: recording the loss of the broker's tail", db.name)
                return  # `iox accept-lost-writes` continues
            while not self._stopped.is_set() and db.tail_truncated is not None:
                try:
                    if not self._replaying(db):
                        self.continue_in_new_epoch(db, time.time())
                        return
                except NotReadyToAccept as e:
                    log.info("database %s: not continuing in a new epoch yet: %s", db.name, e)
                except Exception:
                    log.exception("database %s: continuing in a new write-buffer epoch after the broker lost "
                                  "the tail (tried again)", db.name)
                self._stopped.wait(_TAIL_RETRY_S)

        self._in_background(db, f"after-tail-lost-{db.name}", run)

    def _persist_after_replacement(self, db: Database, nothing_lost: bool) -> None:
        """Records the loss in the preserved catalog (a restart keeps the record), then persists
        what was applied."""
        try:
            if not nothing_lost:
                self._record_lost_writes(db, time.time())
            self._lifecycle.persist_now(db, None, None, time.time())
            if nothing_lost:
                self._lifecycle.mark_checkpoint_complete(db, time.time())
        except Exception:
            log.exception("database %s: persisting after the write buffer's topic was replaced", db.name)

    def _record_lost_writes(self, db: Database, now: float) -> None:
        """Commits the database's lost-write records (all of them) to its preserved catalog."""
        from iox_spark.catalog.preserved_catalog import RecordLostWrites

        self._lifecycle.commit_records(db, [RecordLostWrites(ranges=db.lost_write_entries())], now)

    def accept(self, database: str) -> management_pb2.AcceptLostWritesResponse:
        """`iox accept-lost-writes`: accepts the database's lost writes without a restart (as
        --skip-lost-writes does at start). A database whose topic was replaced continues on the new
        topic in a new write-buffer epoch (`continue_in_new_epoch`); one whose broker lost the tail
        continues from Kafka's end once what was applied is persisted. The loss stays recorded,
        marked accepted with the time, in the preserved catalog too."""
        from iox_spark.catalog.preserved_catalog import RecordLostWrites

        db = self._catalog.peek_database(database)
        if db is None:
            raise DatabaseNotFound(database)
        self._refuse_when_fenced(database)
        open_ranges, replaced, tail_truncated = db.loss_state()
        truncated = tail_truncated is not None
        if not open_ranges and not replaced:
            raise NothingToAccept(database)  # a lost tail with nothing lost continues by itself
        persisting = self._after_loss.get(db.name)
        if persisting is not None:  # the background persist after the replacement: let it finish
            persisting.join(_ACCEPT_JOIN_S)
        now = time.time()
        if replaced:
            self.continue_in_new_epoch(db, now)
        else:
            self._lifecycle.commit_records(db, [RecordLostWrites(ranges=db.lost_write_entries(accepted_at_s=now))], now)
            db.accept_lost_writes(now)
            if truncated:  # continues in a new epoch from Kafka's end once what was applied is persisted
                self.continue_after_tail_lost(db, lost=False)
        log.warning("database %s: lost writes ACCEPTED (iox accept-lost-writes): %s; writes are taken again%s",
                    db.name, ", ".join(f"partition {r.partition} from {r.from_offset}" for r in open_ranges) or "none",
                    f" on the new topic, in write-buffer epoch {db.epoch}" if replaced else "")
        resp = management_pb2.AcceptLostWritesResponse(epoch=db.epoch, new_topic=replaced)
        opened = {(o.partition, o.from_offset, o.epoch) for o in open_ranges}
        for r in db.lost_write_ranges():
            if (r.partition, r.from_offset, r.epoch) in opened:
                lost_status(resp.accepted.add(), r)
        return resp

    def continue_in_new_epoch(self, db: Database, now: float) -> None:
        """The database's topic was replaced, or its broker lost the tail, while the server ran: once
        everything it applied is persisted, it continues in a new write-buffer epoch (its seq origin is
        above every seq it has), as recovery does at a start with --skip-lost-writes: on a new topic from
        its start (offsets start over), on a cut-short topic from Kafka's end (offsets below it are of the
        old epoch and applied; those from it on are given out again). The new epoch's database checkpoint
        and the accepted loss are committed in one transaction before anything changes in memory; the
        stream then restarts from there. Raises NotReadyToAccept (nothing changed) when something is
        still unpersisted or, on a cut-short topic, not applied; RevisionConflict when the database is
        fenced."""
        from iox_spark.catalog.preserved_catalog import RecordDatabaseCheckpoint, RecordLostWrites
        from iox_spark.catalog.seq_layout import next_seq_origin, seq_base

        lc = self._lifecycle
        lc.persist_now(db, None, None, now)
        try:
            topic_id = self._write_buffer.topic_id(db.topic)
            bounds = self._write_buffer.partition_bounds(db.topic, db.kafka_partitions)
        except Exception as e:  # KafkaException, or the write buffer closing
            raise WriteBufferUnavailable(f"cannot read topic {db.topic}: {e}") from e

        cut_short = not db.topic_replaced and db.tail_truncated is not None
        # the new epoch's first offsets: a new topic's start, or a cut-short topic's end
        first = {kp: bounds.get(kp, (0, 0))[1 if cut_short else 0] for kp in range(db.kafka_partitions)}

        def switch():  # while no micro-batch runs
            with lc.paused():
                why, applied_hi, epoch, ranges = db.new_epoch_readiness(first, cut_short)
                if why is not None:
                    raise NotReadyToAccept(db.name, why)
                lost = [r.as_accepted(now) for r in ranges]
                pc = lc.preserved_for(db.name, now)
                # above every seq of the old epoch: the catalog's, and every offset applied in memory
                origin = max(next_seq_origin(pc.state, db.seq_origin), seq_base(db.seq_origin, applied_hi + 1))
                checkpoint = RecordDatabaseCheckpoint(
                    topic=db.topic, kafka_partitions=db.kafka_partitions, epoch=epoch, topic_id=topic_id,
                    sequencer_numbers={kp: (None, off - 1) for kp, off in first.items() if off > 0} if cut_short else {},
                    seq_origin=origin)
                lc.commit_records(db, [checkpoint, RecordLostWrites(ranges=tuple(r.entry() for r in lost))], now)
                db.continue_in_epoch(epoch, origin, topic_id, lost, first)
                self._forget_epoch(db)
                log.warning("database %s: continues %s %s (id %s) in write-buffer epoch %d (seq origin %d) from "
                            "offsets %s", db.name, "on the cut-short topic" if cut_short else "on the new topic",
                            db.topic, topic_id, epoch, origin, first)

        self._consumer.restart(switch)
