"""The identity of an ingester pool: one Kafka cluster and one object store, recorded in both.

Invariant: every member of a pool writes to the same Kafka cluster and the same object store. A
member started against another one (for example without `--kafka-bootstrap`, so that it runs an
embedded broker of its own, or with another `--object-store`) would take writes no other member
sees, claim partitions nobody else applies, and answer queries from a catalog nobody else
writes: it refuses to start instead (`PoolIdentityMismatch`, naming both sides).

The pool's id (a UUID) is recorded twice: in the object store (`IDENTITY_KEY`, created by
put-if-absent, so concurrent first members agree on one id) and as the first message of the
Kafka topic `ANCHOR_TOPIC` (the earliest message decides, so concurrent announcements agree
too). A member at its start reads both:
- neither: a new pool; the id is created in the store, then announced to Kafka;
- both, equal: the member's pool;
- the store's only: announced by a member that stopped before it reached Kafka (the record says
  so) is announced now; once announced, the Kafka cluster is not the pool's (refused);
- Kafka's only, or two different ids: the object store or the Kafka cluster is not the pool's
  (refused).
A Kafka cluster that really replaced the pool's (its data lost) is taken by deleting
`IDENTITY_KEY` from the object store while no member runs.

Where it runs: `establish_pool_identity`, once, in `IoxServer.start` of a pool member (driver),
after the broker is reachable and before Spark starts. Reads and writes the object store and Kafka.
"""
from __future__ import annotations

import json
import logging
import time
import uuid

from iox_spark.catalog.errors import AlreadyExists, ObjectNotFound

from iox_spark.server.errors import ServerError

__all__ = ["IDENTITY_KEY", "ANCHOR_TOPIC", "PoolIdentityMismatch", "PoolIdentityUnavailable",
           "establish_pool_identity", "judge"]

log = logging.getLogger(__name__)

#: the pool's identity record in the object store
IDENTITY_KEY = "iox~pool/identity.json"
#: the Kafka topic whose first message is the pool's id (not a database topic: no "iox." prefix)
ANCHOR_TOPIC = "iox-pool-identity"
_FORMAT_VERSION = 1
#: how long a start waits for Kafka's answers about the anchor topic
_KAFKA_TIMEOUT_S = 15.0


class PoolIdentityMismatch(ServerError):
    """This member's Kafka cluster or object store is not the pool's."""

    def __init__(self, which: str, store_id: str | None, kafka_id: str | None, bootstrap: str, object_store: str):
        self.which, self.store_id, self.kafka_id = which, store_id, kafka_id
        self.bootstrap, self.object_store = bootstrap, object_store
        if which == "kafka":
            what = (f"the object store {object_store} belongs to pool {store_id}, which the Kafka cluster at "
                    f"{bootstrap} never saw (was this member started without the pool's --kafka-bootstrap, on an "
                    f"embedded broker of its own?); if that cluster replaced the pool's, delete {IDENTITY_KEY} "
                    f"from the object store while no member runs")
        elif which == "object_store":
            what = (f"the Kafka cluster at {bootstrap} belongs to pool {kafka_id}, which the object store "
                    f"{object_store} has no record of (is --object-store the pool's?)")
        else:
            what = (f"the Kafka cluster at {bootstrap} belongs to pool {kafka_id} and the object store "
                    f"{object_store} to pool {store_id}: start the member with the pool's --kafka-bootstrap "
                    f"and --object-store")
        super().__init__(f"not this pool's Kafka cluster and object store: {what}")


class PoolIdentityUnavailable(ServerError):
    """The pool's identity could not be read or recorded (the object store or Kafka cannot be asked)."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"the pool's identity cannot be checked: {where}: {reason}")


def judge(store_id: str | None, announced: bool, kafka_id: str | None) -> str:
    """What a member does with the pool id in the object store (`announced`: its record says it
    reached Kafka) and the one in Kafka: "create", "announce", "ok", or the mismatch ("kafka",
    "object_store", "both"). Pure."""
    if store_id is None:
        return "create" if kafka_id is None else "object_store"
    if kafka_id is None:
        return "kafka" if announced else "announce"
    return "ok" if kafka_id == store_id else "both"


def _record(pool_id: str, member: str, now_s: float, announced: bool) -> bytes:
    return json.dumps({"format_version": _FORMAT_VERSION, "pool_id": pool_id, "created_by": member,
                       "created_at_s": now_s, "announced": announced}).encode()


def _read_record(store) -> dict | None:
    try:
        data = store.get(IDENTITY_KEY)
    except ObjectNotFound:
        return None
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise PoolIdentityUnavailable(IDENTITY_KEY, f"not JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format_version") != _FORMAT_VERSION or \
            not isinstance(obj.get("pool_id"), str):
        raise PoolIdentityUnavailable(IDENTITY_KEY, f"not a pool identity of format version {_FORMAT_VERSION}: "
                                                    f"{str(obj)[:200]}")
    return obj


def read_anchor(bootstrap: str, timeout_s: float = _KAFKA_TIMEOUT_S) -> str | None:
    """The pool id of the Kafka cluster at `bootstrap`: the first message of ANCHOR_TOPIC, None
    when the topic is missing or empty."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"iox-pool-identity-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 3})
    try:
        md = c.list_topics(timeout=timeout_s)
        tmd = md.topics.get(ANCHOR_TOPIC)
        if tmd is None or tmd.error is not None or not tmd.partitions:
            return None
        c.assign([TopicPartition(ANCHOR_TOPIC, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return None
                raise KafkaException(m.error())
            return m.value().decode()
        raise TimeoutError(f"{ANCHOR_TOPIC} was not read within {timeout_s} s")
    finally:
        c.close()


def announce_anchor(bootstrap: str, pool_id: str, replication_factor: int,
                    timeout_s: float = _KAFKA_TIMEOUT_S) -> None:
    """Creates ANCHOR_TOPIC (one partition) when missing and appends `pool_id` to it; the first
    message of the topic is what counts (`read_anchor`)."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from iox_spark.server.write_buffer.producer import replication_for

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    md = admin.list_topics(timeout=timeout_s)
    if ANCHOR_TOPIC not in md.topics or md.topics[ANCHOR_TOPIC].error is not None:
        fut = admin.create_topics([NewTopic(ANCHOR_TOPIC, 1, replication_for(replication_factor, len(md.brokers)))],
                                  operation_timeout=timeout_s, request_timeout=timeout_s)[ANCHOR_TOPIC]
        try:
            fut.result(timeout=timeout_s + 1)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "message.timeout.ms": int(timeout_s * 1000), "allow.auto.create.topics": False, "log_level": 3})
    errors: list = []
    p.produce(ANCHOR_TOPIC, value=pool_id.encode(), partition=0,
              on_delivery=lambda err, _msg: errors.append(err) if err is not None else None)
    left = p.flush(timeout_s + 1)
    if left or errors:
        raise KafkaException(errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT))


def establish_pool_identity(store, bootstrap: str, member: str, object_store: str, replication_factor: int,
                            now_s: float, read_kafka=read_anchor, announce_kafka=announce_anchor) -> str:
    """Returns the pool's id once this member's Kafka cluster (`bootstrap`) and object store
    (`store`, named `object_store` in messages) are found to be the pool's, recording the id
    where it is missing (see the module docstring); raises PoolIdentityMismatch when one is not,
    PoolIdentityUnavailable when either cannot be asked. `read_kafka(bootstrap)` and
    `announce_kafka(bootstrap, pool_id, replication_factor)` reach Kafka."""

    def kafka_id() -> str | None:
        try:
            return read_kafka(bootstrap)
        except Exception as e:  # noqa: BLE001 - Kafka's errors: a start that cannot check does not start
            raise PoolIdentityUnavailable(f"Kafka at {bootstrap}", f"{type(e).__name__}: {e}") from e

    try:
        rec = _read_record(store)
    except ServerError:
        raise
    except Exception as e:  # noqa: BLE001 - the object store's errors
        raise PoolIdentityUnavailable(object_store, f"{type(e).__name__}: {e}") from e
    theirs = kafka_id()
    decision = judge(rec["pool_id"] if rec else None, bool(rec and rec.get("announced")), theirs)
    if decision == "ok":
        return theirs
    if decision not in ("create", "announce"):
        raise PoolIdentityMismatch(decision, rec["pool_id"] if rec else None, theirs, bootstrap, object_store)
    try:
        if rec is None:
            try:
                store.put_if_absent(IDENTITY_KEY, _record(uuid.uuid4().hex, member, now_s, False))
            except AlreadyExists:
                pass  # another first member's came first: it is the pool's
            rec = _read_record(store)
            if rec is None:
                raise PoolIdentityUnavailable(object_store, f"{IDENTITY_KEY} written, then not found")
        pool_id = rec["pool_id"]
        announce_kafka(bootstrap, pool_id, replication_factor)
    except ServerError:
        raise
    except Exception as e:  # noqa: BLE001 - the object store's or Kafka's errors
        raise PoolIdentityUnavailable(f"{object_store} / Kafka at {bootstrap}", f"{type(e).__name__}: {e}") from e
    theirs = kafka_id()
    if theirs != pool_id:  # another pool announced itself to this Kafka cluster first
        raise PoolIdentityMismatch("both", pool_id, theirs, bootstrap, object_store)
    if not rec.get("announced"):
        try:
            store.put(IDENTITY_KEY, _record(pool_id, rec.get("created_by", member), rec.get("created_at_s", now_s),
                                            True))
        except Exception as e:  # noqa: BLE001 - the next start records it
            log.warning("the pool's identity is in Kafka; recording that in the object store failed: %s", e)
    log.info("pool %s: Kafka at %s and object store %s", pool_id, bootstrap, object_store)
    return pool_id
