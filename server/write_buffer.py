"""The Kafka write buffer, producer side: one topic per database, one message per table write.

Invariant: `produce` returns only after Kafka acknowledged every message of the
request (idempotent producer, acks=all); any failure or timeout raises
`WriteBufferUnavailable` and the caller answers UNAVAILABLE, never a success.
A table always goes to the same Kafka partition (stable hash of its name), so
its writes are totally ordered by offset.

Runs on the driver, in gRPC worker threads (the producer is thread-safe).
"""
from __future__ import annotations

import logging
import threading
import time
import zlib

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from .errors import WriteBufferUnavailable
from .wire_format import EncodedWrite

__all__ = ["WriteBuffer", "topic_for", "consumer_group_for", "database_of_topic", "partition_for", "TOPIC_PREFIX",
           "PartitionCountMismatch"]

log = logging.getLogger(__name__)

TOPIC_PREFIX = "iox."
#: How long topic creation / metadata calls may take before the broker counts as unavailable.
ADMIN_TIMEOUT_S = 10.0


class PartitionCountMismatch(Exception):
    def __init__(self, topic: str, expected: int, actual: int):
        self.topic = topic
        self.expected = expected
        self.actual = actual
        super().__init__(f"topic {topic} has {actual} partitions, the server is configured for {expected}")


def topic_for(database: str) -> str:
    return TOPIC_PREFIX + database


def consumer_group_for(database: str) -> str:
    """The Kafka consumer group whose committed offsets are the database's resumption frontier."""
    return f"iox-{database}"


def database_of_topic(topic: str) -> str:
    return topic[len(TOPIC_PREFIX):]


def partition_for(table: str, partitions: int) -> int:
    """Stable across processes and restarts (crc32, not Python's salted hash)."""
    return zlib.crc32(table.encode("utf-8")) % partitions


def _fatal_error(producer: Producer):
    """The producer's fatal error, or None. A fatal idempotent producer never recovers."""
    try:
        producer.poll(0)
    except KafkaException as e:
        if e.args and e.args[0].fatal():
            return e.args[0]
    return None


def _producer_conf(bootstrap: str, produce_timeout_ms: int) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        # One message per record batch: Tansu reports the high watermark as the base
        # offset of the last batch + 1, which is exact only for single-message batches.
        "batch.num.messages": 1,
        "message.timeout.ms": produce_timeout_ms,
        "message.max.bytes": 64 * 1024 * 1024,
        "socket.timeout.ms": min(produce_timeout_ms, 60_000),
        "reconnect.backoff.max.ms": 1000,
        # topics are created explicitly with the configured partition count, never implicitly
        "allow.auto.create.topics": False,
        "log_level": 3,
    }


class WriteBuffer:
    """Producer + topic admin for the database topics. Created once per server."""

    def __init__(self, bootstrap: str, partitions: int, produce_timeout_ms: int):
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.produce_timeout_ms = produce_timeout_ms
        self._admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        self._lock = threading.Lock()
        self._known_topics: set[str] = set()
        #: topic -> Kafka topic id seen when the topic was ensured
        self._topic_ids: dict[str, str | None] = {}
        #: (topic, kafka partition) -> highest offset this process got acknowledged
        self.acked_hi_inclusive: dict = {}
        self._producer = Producer(_producer_conf(bootstrap, produce_timeout_ms))
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="kafka-producer-poll", daemon=True)
        self._poller.start()

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
            fut = self._admin.create_topics([NewTopic(topic, self.partitions, 1)],
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
        self._known_topics.add(topic)
        return topic

    def topic_id(self, topic: str) -> str | None:
        """Kafka's id of the topic's current incarnation (a topic deleted and created again gets
        a new one); None when the topic does not exist or the broker has no topic ids."""
        if topic in self._topic_ids:  # ensured by this process: asked once
            return self._topic_ids[topic]
        return self._describe_topic_id(topic)

    def _describe_topic_id(self, topic: str) -> str | None:
        from confluent_kafka import TopicCollection

        try:
            desc = self._admin.describe_topics(TopicCollection([topic]),
                                               request_timeout=ADMIN_TIMEOUT_S)[topic].result(timeout=ADMIN_TIMEOUT_S + 1)
        except Exception:  # unknown topic, or a broker without DescribeTopics
            return None
        tid = desc.topic_id
        return None if tid is None else str(tid)

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
        """{kafka partition: (low watermark, true end = last offset + 1)} of a topic ({} if absent)."""
        from confluent_kafka import TopicPartition

        from .kafka_source import reader_consumer, true_end

        md = self._admin.list_topics(timeout=ADMIN_TIMEOUT_S)  # naming the topic would auto-create it
        if topic not in md.topics or md.topics[topic].error is not None:
            return {}
        c = reader_consumer(self.bootstrap)
        try:
            out = {}
            for kp in range(partitions):
                lo, hi = c.get_watermark_offsets(TopicPartition(topic, kp), timeout=ADMIN_TIMEOUT_S)
                out[kp] = (max(lo, 0), true_end(c, topic, kp, hi))
            return out
        finally:
            c.close()

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
        """Produces every message and waits for all acknowledgements.

        Returns the write token: {kafka partition: highest offset written}.
        Raises WriteBufferUnavailable when any message was not acknowledged.
        """
        topic = self.ensure_topic(database)
        done = threading.Event()
        results: list = []
        pending = [len(writes)]
        cb_lock = threading.Lock()

        def on_delivery(err, msg):
            with cb_lock:
                results.append((err, msg.partition(), msg.offset()))
                pending[0] -= 1
                if pending[0] == 0:
                    done.set()

        producer = self._producer
        if _fatal_error(producer) is not None:
            producer = self._recreate_producer(producer)
        try:
            for w in writes:
                self._produce_one(producer, topic, w, on_delivery)
        except (KafkaException, BufferError) as e:
            self._forget_topic(topic)
            if isinstance(e, KafkaException) and e.args and e.args[0].fatal():
                self._recreate_producer(producer)
            raise WriteBufferUnavailable(f"produce to {topic} failed: {e}") from e
        if not done.wait(self.produce_timeout_ms / 1000.0 + 5.0):
            self._forget_topic(topic)
            raise WriteBufferUnavailable(f"no acknowledgement from Kafka within {self.produce_timeout_ms} ms")
        token: dict[int, int] = {}
        for err, part, off in results:
            if err is not None:
                self._forget_topic(topic)
                if err.fatal():
                    self._recreate_producer(producer)
                raise WriteBufferUnavailable(f"Kafka did not acknowledge the write: {err.str()}")
            token[part] = max(token.get(part, -1), off)
        with self._lock:
            for part, off in token.items():
                k = (topic, part)
                self.acked_hi_inclusive[k] = max(self.acked_hi_inclusive.get(k, -1), off)
        return token

    def _produce_one(self, producer: Producer, topic: str, w: EncodedWrite, on_delivery) -> None:
        part = w.partition if w.partition is not None else partition_for(w.table, self.partitions)
        while True:
            try:
                producer.produce(topic, value=w.value, key=w.key, headers=w.headers, partition=part,
                                 on_delivery=on_delivery)
                return
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)

    def _forget_topic(self, topic: str) -> None:
        self._known_topics.discard(topic)

    def _recreate_producer(self, broken: Producer) -> Producer:
        """Replaces a producer that hit a fatal error (e.g. the broker lost its producer id).

        Messages the broken producer had not delivered were answered UNAVAILABLE by
        their requests; the new producer starts a fresh idempotence session.
        """
        with self._lock:
            if self._producer is broken:
                log.warning("idempotent producer hit a fatal error; creating a new one")
                self._producer = Producer(_producer_conf(self.bootstrap, self.produce_timeout_ms))
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
        self._producer.flush(5)
        self._stop.set()
        self._poller.join(2)
