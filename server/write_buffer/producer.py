"""The Kafka write buffer, producer side: one topic per database, one message per table write.

Invariant: `produce` returns only after Kafka acknowledged every message of the
request (idempotent producer, acks=all) and, for a request of several messages,
its commit decision; any failure or timeout raises `WriteBufferUnavailable` and
the caller answers UNAVAILABLE, never a success; a request of several messages
that was not committed is never applied in part (catalog/transactions.py).
A table always goes to the same Kafka partition (stable hash of its name), so
its writes are totally ordered by offset.

Runs on the driver, in gRPC worker threads (the producer is thread-safe).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from iox_spark.catalog.sharding import TOPIC_PREFIX, consumer_group_for, partition_for, topic_for
from iox_spark.catalog.transactions import ABORT, COMMIT, DECISION, DEFAULT_TXN_TIMEOUT_S

from iox_spark.catalog.crash_points import CrashPoint, crash_point
from iox_spark.server.errors import WriteBufferUnavailable
from iox_spark.server.write_buffer.wire_format import EncodedWrite, as_part, encode_decision, encode_marker
from iox_spark.server.errors import ServerError

__all__ = ["WriteBuffer", "PartitionCountMismatch", "txn_commit_deadline_s", "TXN_SLACK_S",
           "DEFAULT_REPLICATION_FACTOR", "replication_for", "producer_conf"]

log = logging.getLogger(__name__)

#: How long topic creation / metadata calls may take before the broker counts as unavailable.
ADMIN_TIMEOUT_S = 10.0
#: How long `partition_bounds` waits for the broker to deliver each partition's last record batch
#: (a busy broker answers a fetch late) before it answers WriteBufferUnavailable
END_CONFIRM_WAIT_S = 10.0
#: Replicas of each partition of a database topic (Kafka's usual production setting; with
#: acks=all and the cluster's min.insync.replicas, an acknowledged write survives a broker's loss).
DEFAULT_REPLICATION_FACTOR = 3
#: How far before its earliest part `first_decision` reads a transaction's coordinator partition
#: (Kafka's time lookup on Tansu goes by when batches were stored; producers' clocks differ).
DECISION_LOOKBACK_S = 60.0
#: Margin between a router giving up on a commit and a consumer aborting its transaction.
TXN_SLACK_S = 5.0


def txn_commit_deadline_s(txn_timeout_s: float, produce_timeout_ms: int) -> float:
    """How long after its parts were produced a router may still produce a commit decision:
    the commit is then acknowledged or failed (message.timeout.ms, plus slack) before a
    consumer aborts the transaction at ``txn_timeout_s`` after its parts."""
    return txn_timeout_s - 2 * produce_timeout_ms / 1000.0 - TXN_SLACK_S


class PartitionCountMismatch(ServerError):
    def __init__(self, topic: str, expected: int, actual: int):
        self.topic = topic
        self.expected = expected
        self.actual = actual
        super().__init__(f"topic {topic} has {actual} partitions, the server is configured for {expected}")


#: Delivery errors after which the producer is replaced, besides fatal ones: a message that timed
#: out (the broker was away, or came back without the producer's idempotence session)
_STUCK_PRODUCER_ERRORS = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT,
                                    KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER})


def replication_for(configured: int, brokers: int) -> int:
    """The replication factor of a new topic: the configured one, or the cluster's broker count
    when that is smaller (at least 1). Pure."""
    return max(1, min(configured, brokers))


def _fatal_error(producer: Producer):
    """The producer's fatal error, or None. A fatal idempotent producer never recovers."""
    try:
        producer.poll(0)
    except KafkaException as e:
        if e.args and e.args[0].fatal():
            return e.args[0]
    return None


def producer_conf(bootstrap: str, produce_timeout_ms: int) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        # Group commit: messages of concurrent requests to one partition that wait for the same
        # produce (at most 1 ms, or behind the requests in flight) share one record batch,
        # librdkafka's default batch bounds (10,000 messages, 1 MB). The durable embedded broker
        # stores each batch as objects of its own: with 8 writers on one table the server took
        # 1.4x the points/s of one message per batch. Tansu then reports a high watermark short
        # of the rest of its last batch; whatever decides an end reads the true one
        # (kafka_source.true_ends), and each message's offset is the one its delivery reports.
        "linger.ms": 1,
        # Kafka-level LZ4, in librdkafka's own threads: payloads shrink to about half (Arrow
        # IPC of line-protocol rows), the broker stores and serves half the bytes (Tansu's
        # CPU per point fell by a third), and the consumer decompresses before iox reads them
        "compression.type": "lz4",
        "message.timeout.ms": produce_timeout_ms,
        "message.max.bytes": 64 * 1024 * 1024,
        "socket.timeout.ms": min(produce_timeout_ms, 60_000),
        "reconnect.backoff.max.ms": 1000,
        # topics are created explicitly with the configured partition count, never implicitly
        "allow.auto.create.topics": False,
        "log_level": 3,
    }


def _confirmed_bounds(consumer, topic: str, kps) -> dict[int, tuple[int, int]]:
    """{kafka partition: (low watermark, confirmed end)} of `kps` of `topic`, read with `consumer`
    (`true_ends` exact); WriteBufferUnavailable when an end is not confirmed within END_CONFIRM_WAIT_S."""
    from confluent_kafka import TopicPartition

    from iox_spark.server.write_buffer.kafka_source import EndNotConfirmed, true_ends

    marks = {kp: consumer.get_watermark_offsets(TopicPartition(topic, kp), timeout=ADMIN_TIMEOUT_S) for kp in kps}
    try:
        ends = true_ends(consumer, topic, {kp: hi for kp, (_lo, hi) in marks.items()},
                         wait_s=END_CONFIRM_WAIT_S, exact=True)
    except EndNotConfirmed as e:
        raise WriteBufferUnavailable(str(e)) from e
    return {kp: (max(lo, 0), ends[kp]) for kp, (lo, _hi) in marks.items()}


class WriteBuffer:
    """Producer + topic admin for the database topics. Created once per server."""

    def __init__(self, bootstrap: str, partitions: int, produce_timeout_ms: int,
                 txn_timeout_s: float = DEFAULT_TXN_TIMEOUT_S, replication_factor: int = DEFAULT_REPLICATION_FACTOR):
        self.bootstrap = bootstrap
        self.partitions = partitions
        #: replicas of each partition of a topic this server creates (fewer when the cluster has fewer brokers)
        self.replication_factor = replication_factor
        self._rf_warned = False
        self.produce_timeout_ms = produce_timeout_ms
        #: a transaction's decision is produced only this soon after its parts, so it is acknowledged
        #: (or given up: message.timeout.ms) well before a consumer could abort it (txn_timeout_s)
        self.txn_commit_deadline_s = txn_commit_deadline_s(txn_timeout_s, produce_timeout_ms)
        #: None once closed: librdkafka's admin client is a producer handle of its own (its log
        #: name is producer-N) that reconnects to the broker until it is destroyed, and it has
        #: no close; dropping the only reference destroys it
        self._admin_client: AdminClient | None = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self._lock = threading.Lock()
        self._known_topics: set[str] = set()
        #: topic -> Kafka topic id seen when the topic was ensured
        self._topic_ids: dict[str, str | None] = {}
        #: (topic, kafka partition) -> highest offset this process got acknowledged
        self._acked_hi_inclusive: dict = {}
        #: called with the database at the start of every produce (the server refuses writes to a
        #: database whose write buffer lost acknowledged writes: it raises); returns {kafka partition:
        #: highest offset the server applied} of the database (None: nothing known)
        self.guard = None
        #: called with (database, topic, write token, {kafka partition: highest offset known taken
        #: before this request was produced}) once Kafka acknowledged a request, before it is answered:
        #: the server refuses an offset Kafka gave out again (its broker lost its tail) and makes the
        #: token durable (server/write_buffer/ack_log.py); it raises to answer the request an error
        self.confirm = None
        #: called with (database, topic, Kafka topic id) each time this process ensures a topic,
        #: before anything is produced to it (the server records a new database's topic in its
        #: preserved catalog and detects a topic replaced under it: it raises to refuse the write)
        self.on_topic = None
        #: called with (topic, [(kafka partition, offset, headers, value)]) of every message Kafka
        #: acknowledged, in the producing thread (the server marks the topic for the streaming
        #: source, end_polls.py, and the write buffer's tail holds them, server/query/tail.py)
        self.on_acked = None
        self._producer = Producer(producer_conf(bootstrap, produce_timeout_ms))
        #: producers replaced after a fatal error: requests that took one before it was replaced
        #: may still produce through it (their messages fail), so they are closed only by close()
        self._retired: list[Producer] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="kafka-producer-poll", daemon=True)
        self._poller.start()

    @property
    def _admin(self) -> AdminClient:
        admin = self._admin_client
        if admin is None:
            raise WriteBufferUnavailable("the write buffer is closed (the server is stopping)")
        return admin

    # -- topics -----------------------------------------------------------------
    def ensure_topic(self, database: str) -> str:
        """Creates the database's topic when missing; checks its partition count."""
        topic = topic_for(database)
        if topic in self._known_topics:
            return topic
        try:
            md = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)  # naming the topic would auto-create it
        except KafkaException as e:
            raise WriteBufferUnavailable(f"cannot reach Kafka at {self.bootstrap}: {e}") from e
        tmd = md.topics.get(topic)
        if tmd is None or tmd.error is not None:
            rf = replication_for(self.replication_factor, len(md.brokers))
            if rf < self.replication_factor and not self._rf_warned:
                self._rf_warned = True
                log.warning("the Kafka cluster at %s has %d broker(s): topics are created with replication factor %d, "
                            "not the configured %d; a broker's loss can lose acknowledged writes",
                            self.bootstrap, len(md.brokers), rf, self.replication_factor)
            fut = self._admin.create_topics([NewTopic(topic, self.partitions, rf)],
                                            operation_timeout=ADMIN_TIMEOUT_S,
                                            request_timeout=ADMIN_TIMEOUT_S)[topic]
            try:
                fut.result(timeout=ADMIN_TIMEOUT_S + 1)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise WriteBufferUnavailable(f"cannot create topic {topic}: {e}") from e
            except Exception as e:  # concurrent.futures.TimeoutError
                raise WriteBufferUnavailable(f"cannot create topic {topic}: {e!r}") from e
            actual = self._wait_partitions(topic)
        else:
            actual = len(tmd.partitions)
        if actual != self.partitions:
            raise PartitionCountMismatch(topic, self.partitions, actual)
        self._topic_ids[topic] = self._describe_topic_id(topic)
        if self.on_topic is not None:
            self.on_topic(database, topic, self._topic_ids[topic])
        self._known_topics.add(topic)
        return topic

    def topic_id(self, topic: str) -> str | None:
        """Kafka's id of the topic's current incarnation (a topic deleted and created again gets
        a new one); None when the topic does not exist or the broker has no topic ids."""
        if topic in self._topic_ids:  # ensured by this process: asked once
            return self._topic_ids[topic]
        return self._describe_topic_id(topic)

    def _describe_topic_id(self, topic: str) -> str | None:
        return self.describe_topic_ids([topic])[topic]

    def describe_topic_ids(self, topics: list[str]) -> dict[str, str | None]:
        """{topic: Kafka's id of its current incarnation, asked now} (None: no such topic, or a broker
        without topic ids)."""
        from confluent_kafka import TopicCollection

        if not topics:
            return {}
        try:
            futures = self._admin.describe_topics(TopicCollection(list(topics)), request_timeout=ADMIN_TIMEOUT_S)
        except Exception:  # a broker without DescribeTopics
            return {t: None for t in topics}
        out: dict[str, str | None] = {}
        for t in topics:
            try:
                tid = futures[t].result(timeout=ADMIN_TIMEOUT_S + 1).topic_id
            except Exception:  # unknown topic
                tid = None
            out[t] = None if tid is None else str(tid)
        return out

    def _wait_partitions(self, topic: str) -> int:
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while True:
            md = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)  # naming the topic would auto-create it
            tmd = md.topics.get(topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                return len(tmd.partitions)
            if time.monotonic() > deadline:
                raise WriteBufferUnavailable(f"topic {topic} did not appear after creation")
            time.sleep(0.05)

    def partition_bounds(self, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
        """{kafka partition: (low watermark, true end = last offset + 1)} of a topic ({} if absent).
        Each end is confirmed (`true_ends` exact): what decides a loss, a read barrier or a new epoch's
        start never takes a watermark for the end. WriteBufferUnavailable when Kafka cannot be asked or
        an end is not confirmed within END_CONFIRM_WAIT_S."""
        return self.partition_bounds_of([topic], partitions)[topic]

    def partition_bounds_of(self, topics: list[str], partitions: int) -> dict[str, dict[int, tuple[int, int]]]:
        """`partition_bounds` of several topics, with one reader ({} for a topic that is absent)."""
        from iox_spark.server.write_buffer.kafka_source import LIST_FETCH_WAIT_MS, reader_consumer

        md = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)  # naming the topic would auto-create it
        out: dict[str, dict[int, tuple[int, int]]] = {t: {} for t in topics}
        present = [t for t in topics if t in md.topics and md.topics[t].error is None]
        if not present:
            return out
        c = reader_consumer(self.bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})  # a long partition's end
        try:
            for topic in present:
                out[topic] = _confirmed_bounds(c, topic, range(partitions))
            return out
        finally:
            c.close()

    def high_watermarks(self, topics: list[str], partitions: int,
                        timeout_s: float = ADMIN_TIMEOUT_S) -> dict[str, dict[int, int]]:
        """{topic: {kafka partition: high watermark}} of `topics`, in one request per broker ({} for a
        topic that is absent). A watermark is at most the true end (`partition_bounds`): Tansu may
        report one short of it. Each of its two requests waits at most `timeout_s`."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        md = self._admin.list_topics(timeout=timeout_s)  # naming the topic would auto-create it
        out: dict[str, dict[int, int]] = {t: {} for t in topics}
        tps = [TopicPartition(t, kp) for t in topics if t in md.topics and md.topics[t].error is None
               for kp in range(partitions)]
        if not tps:
            return out
        futures = self._admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=timeout_s)
        for tp, fut in futures.items():
            out[tp.topic][tp.partition] = fut.result(timeout=timeout_s + 1).offset
        return out

    def commit_resumption_offsets(self, database: str, offsets: dict[int, int]) -> None:
        """Bounded input reliance: records, for the database's consumer group, where replay
        would start ({kp: offset}), so the write buffer may drop what lies below."""
        from confluent_kafka import Consumer, TopicPartition

        if not offsets:
            return
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": consumer_group_for(database),
                      "enable.auto.commit": False, "allow.auto.create.topics": False, "log_level": 3})
        try:
            c.commit(offsets=[TopicPartition(topic_for(database), kp, off) for kp, off in sorted(offsets.items())],
                     asynchronous=False)
        finally:
            c.close()

    def committed_offsets(self, database: str, partitions: int) -> dict[int, int]:
        """The consumer group's committed resumption offsets ({kp: offset}; absent = none)."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": consumer_group_for(database),
                      "enable.auto.commit": False, "allow.auto.create.topics": False, "log_level": 3})
        try:
            tps = c.committed([TopicPartition(topic_for(database), kp) for kp in range(partitions)],
                              timeout=ADMIN_TIMEOUT_S)
            return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
        finally:
            c.close()

    def list_database_topics(self) -> dict[str, int]:
        """{topic: partitions} of every database topic on the broker."""
        md = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)
        return {t: len(m.partitions) for t, m in md.topics.items()
                if t.startswith(TOPIC_PREFIX) and m.error is None}

    # -- produce ----------------------------------------------------------------
    def produce(self, database: str, writes: list[EncodedWrite]) -> dict[int, int]:
        """Produces a request's messages and waits for Kafka's acknowledgement.

        One message is produced as it is; more than one is a transaction (parts, a
        commit decision, markers: catalog/transactions.py), so the request is applied
        whole or not at all. Returns the write token: {kafka partition: highest offset
        written}. Raises WriteBufferUnavailable when the request was not committed.
        """
        applied = self.guard(database) if self.guard is not None else None
        topic = self.ensure_topic(database)
        # offsets taken before this request was sent: a healthy broker never gives one out again
        taken = self.acked_of(topic)
        for kp, off in (applied or {}).items():
            taken[kp] = max(taken.get(kp, -1), off)
        if len(writes) == 1:
            token = self._token(topic, self._send_all(topic, writes))
        else:
            token = self._produce_transaction(topic, writes)
        if self.confirm is not None:
            self.confirm(database, topic, token, taken)
        return token

    def acked_of(self, topic: str) -> dict[int, int]:
        """{kafka partition: highest offset this process got acknowledged} of `topic` (a copy)."""
        with self._lock:
            return {kp: off for (t, kp), off in self._acked_hi_inclusive.items() if t == topic}

    def acked_all(self) -> dict[tuple[str, int], int]:
        """{(topic, kafka partition): highest offset this process got acknowledged} (a copy)."""
        with self._lock:
            return dict(self._acked_hi_inclusive)

    def forget_acked(self, topic: str) -> None:
        """Forgets the offsets acknowledged on `topic` (its database continues on a new incarnation)."""
        with self._lock:
            for key in [k for k in self._acked_hi_inclusive if k[0] == topic]:
                del self._acked_hi_inclusive[key]

    def _partition_of(self, w: EncodedWrite) -> int:
        return w.partition if w.partition is not None else partition_for(w.table, self.partitions)

    def _produce_transaction(self, topic: str, writes: list[EncodedWrite]) -> dict[int, int]:
        started = time.monotonic()
        txn = uuid.uuid4().hex
        kps = [self._partition_of(w) for w in writes]
        q = max(kps)
        parts = [as_part(EncodedWrite(w.table, w.key, w.value, w.headers, kp), txn, q) for w, kp in zip(writes, kps)]
        try:
            acked = self._send_all(topic, parts)
            crash_point(CrashPoint.TXN_AFTER_PARTS)
            if time.monotonic() - started > self.txn_commit_deadline_s:
                raise WriteBufferUnavailable(f"the parts of the request took longer than "
                                             f"{self.txn_commit_deadline_s:.0f} s to be acknowledged")
            decision = self._send_all(topic, [encode_decision(txn, COMMIT, acked, q)])
        except WriteBufferUnavailable:
            self._abort_quietly(topic, txn, q)
            raise
        crash_point(CrashPoint.TXN_AFTER_DECISION)
        token = self._token(topic, acked + decision)
        try:  # the decision is durable: markers only make the parts visible sooner
            markers = self._send_all(topic, [encode_marker(txn, COMMIT, kp) for kp in sorted(set(kps) - {q})])
            token = self._token(topic, acked + decision + markers)
        except WriteBufferUnavailable as e:
            log.warning("transaction %s committed, markers not written (the consumer writes them): %s", txn, e)
        return token

    def _abort_quietly(self, topic: str, txn: str, q: int) -> None:
        """Best effort: an abort decision releases the parts before the consumer's timeout would."""
        try:
            self._send_all(topic, [encode_decision(txn, ABORT, [], q)])
        except WriteBufferUnavailable as e:
            log.warning("transaction %s: abort not written (the consumer aborts it after its timeout): %s", txn, e)

    def produce_control(self, topic: str, writes: list[EncodedWrite]) -> None:
        """Produces the consumer's transaction repairs (markers, abort decisions); raises
        WriteBufferUnavailable when any was not acknowledged."""
        self._send_all(topic, writes)

    def first_decision(self, topic: str, kp: int, txn: str, since_ms: int) -> str | None:
        """The decision (COMMIT or ABORT) of the first decision message of transaction `txn` on Kafka
        partition `kp` of `topic`, or None when it has none yet: the one that decides the
        transaction for every partition (catalog/transactions.py).

        Reads `kp` from DECISION_LOOKBACK_S before `since_ms` (the Kafka timestamp of the
        transaction's earliest part; its decision follows it, and another producer's clock may lag)
        to its end. Called by the transaction-repair thread for a pool member whose part waits on a
        decision of a partition another member owns (rare: a router died between the parts and the
        markers). Raises WriteBufferUnavailable when Kafka cannot be read to the end."""
        from confluent_kafka import TopicPartition

        from iox_spark.server.write_buffer.kafka_source import LIST_FETCH_WAIT_MS, consumer_positions, reader_consumer
        from iox_spark.server.write_buffer.wire_format import header_text

        c = reader_consumer(self.bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})
        try:
            start, end = _confirmed_bounds(c, topic, [kp])[kp]
            at = c.offsets_for_times([TopicPartition(topic, kp, max(0, since_ms - int(DECISION_LOOKBACK_S * 1000)))],
                                     timeout=ADMIN_TIMEOUT_S)[0].offset
            if at >= 0:
                start = max(start, at)
            elif at == -1:  # OFFSET_END: nothing was written since then
                return None
            if start >= end:
                return None
            c.assign([TopicPartition(topic, kp, start)])
            pos, progress = start, time.monotonic()
            while pos < end:
                msgs = c.consume(500, timeout=0.2)
                for m in msgs:
                    if m.error() is not None:
                        continue
                    pos = max(pos, m.offset() + 1)
                    h = dict(m.headers() or [])
                    if header_text(h, "iox-kind") == DECISION and header_text(h, "iox-txn") == txn:
                        return json.loads(header_text(h, "iox-txn-info"))["decision"]
                passed = consumer_positions(c, topic, [kp])[kp]
                if msgs or passed > pos:
                    pos, progress = max(pos, passed), time.monotonic()
                elif time.monotonic() - progress > END_CONFIRM_WAIT_S:
                    raise WriteBufferUnavailable(f"{topic}[{kp}] was not readable from offset {pos} to {end}")
            return None
        except KafkaException as e:
            raise WriteBufferUnavailable(f"cannot read {topic}[{kp}]: {e}") from e
        finally:
            c.close()

    def _token(self, topic: str, acked: list[tuple[int, int]]) -> dict[int, int]:
        token: dict[int, int] = {}
        for part, off in acked:
            token[part] = max(token.get(part, -1), off)
        with self._lock:
            for part, off in token.items():
                k = (topic, part)
                self._acked_hi_inclusive[k] = max(self._acked_hi_inclusive.get(k, -1), off)
        return token

    def _send_all(self, topic: str, writes: list[EncodedWrite]) -> list[tuple[int, int]]:
        """Produces every message, waits for all acknowledgements; [(partition, offset)] in order.

        Raises WriteBufferUnavailable when any message was not acknowledged.
        """
        if not writes:
            return []
        done = threading.Event()
        results: list = [None] * len(writes)
        pending = [len(writes)]
        cb_lock = threading.Lock()

        def on_delivery_of(i):
            def on_delivery(err, msg):
                with cb_lock:
                    results[i] = (err, msg.partition(), msg.offset())
                    pending[0] -= 1
                    if pending[0] == 0:
                        done.set()
            return on_delivery

        producer = self._producer
        if _fatal_error(producer) is not None:
            producer = self._recreate_producer(producer)
        try:
            for i, w in enumerate(writes):
                self._produce_one(producer, topic, w, on_delivery_of(i))
        except (KafkaException, BufferError) as e:
            self._forget_topic(topic)
            if isinstance(e, KafkaException) and e.args and e.args[0].fatal():
                self._recreate_producer(producer)
            raise WriteBufferUnavailable(f"produce to {topic} failed: {e}") from e
        if not done.wait(self.produce_timeout_ms / 1000.0 + 5.0):
            self._forget_topic(topic)
            self._recreate_producer(producer, "no acknowledgement within the produce timeout")
            raise WriteBufferUnavailable(f"no acknowledgement from Kafka within {self.produce_timeout_ms} ms")
        out = []
        for err, part, off in results:
            if err is not None:
                self._forget_topic(topic)
                if err.fatal() or err.code() in _STUCK_PRODUCER_ERRORS:
                    self._recreate_producer(producer, err.str())
                raise WriteBufferUnavailable(f"Kafka did not acknowledge the write: {err.str()}")
            out.append((part, off))
        on_acked = self.on_acked
        if on_acked is not None:
            try:
                on_acked(topic, [(part, off, w.headers, w.value) for (part, off), w in zip(out, writes)])
            except Exception:  # an accelerator's failure never fails an acknowledged write
                log.exception("handing acknowledged messages on (write-buffer tail, ack marks)")
        return out

    def _produce_one(self, producer: Producer, topic: str, w: EncodedWrite, on_delivery) -> None:
        part = self._partition_of(w)
        while True:
            try:
                producer.produce(topic, value=w.value, key=w.key, headers=w.headers, partition=part,
                                 on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)

    def _forget_topic(self, topic: str) -> None:
        self._known_topics.discard(topic)

    def _recreate_producer(self, broken: Producer, reason: str = "a fatal error") -> Producer:
        """Replaces a producer that hit a fatal error (e.g. the broker lost its producer id) or
        whose messages time out (`_STUCK_PRODUCER_ERRORS`: an idempotence session a broker that
        came back empty no longer knows can stay stuck retrying), so writes recover once the
        broker is back, without a restart of the server.

        Messages the broken producer had not delivered were answered UNAVAILABLE by their
        requests; what it still queues or retries is purged, so none of them lands after a
        later write that the new producer (a fresh idempotence session) gets acknowledged.
        """
        with self._lock:
            if self._producer is broken:
                log.warning("idempotent producer replaced (%s)", reason)
                try:
                    broken.purge(in_queue=True, in_flight=True, blocking=False)
                except KafkaException:
                    pass
                self._retired.append(broken)
                self._producer = Producer(producer_conf(self.bootstrap, self.produce_timeout_ms))
            return self._producer

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            p = self._producer
            try:
                p.poll(0.05)
            except KafkaException as e:
                if e.args and e.args[0].fatal():
                    self._recreate_producer(p)
                else:
                    log.warning("producer poll: %s", e)

    def close(self) -> None:
        """Flushes (at most 5 s), stops the poll thread and closes the producer, the producers it
        replaced and the admin client. Called by the server's stop, after its gRPC and HTTP servers
        stopped. What the flush did not deliver is purged (its requests are answered UNAVAILABLE): a
        closed client no longer reconnects to the broker, whose port, once it stops, another process
        may have taken (the test suite's Spark took one)."""
        self._producer.flush(5)
        self._stop.set()
        self._poller.join(2)
        with self._lock:
            producers, self._retired = [*self._retired, self._producer], []
            self._admin_client = None
        for p in producers:
            p.purge()
            p.close()
