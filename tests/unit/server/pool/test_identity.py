"""The pool's identity (server/pool/identity.py): the decision table, and `establish_pool_identity`
against a real local object store with Kafka's side as a list of anchor messages."""
from __future__ import annotations

import json

import pytest

from iox_spark.catalog.errors import ObjectNotFound
from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.server.pool.identity import (IDENTITY_KEY, PoolIdentityMismatch, PoolIdentityUnavailable,
                                  establish_pool_identity, judge)


@pytest.mark.parametrize("store_id, announced, kafka_id, want", [
    (None, False, None, "create"),
    ("u", False, None, "announce"),
    ("u", True, None, "kafka"),
    ("u", True, "u", "ok"),
    ("u", False, "u", "ok"),
    (None, False, "u", "object_store"),
    ("u", True, "v", "both"),
])
def test_judge(store_id, announced, kafka_id, want):
    assert judge(store_id, announced, kafka_id) == want


class _Kafka:
    """One cluster's anchor topic: its messages in order (the first one counts)."""

    def __init__(self):
        self.messages: list = []

    def read(self, _bootstrap):
        return self.messages[0] if self.messages else None

    def announce(self, _bootstrap, pool_id, _rf):
        self.messages.append(pool_id)


def _establish(store, kafka: _Kafka, member="a", bootstrap="k1:9092"):
    return establish_pool_identity(store, bootstrap, member, "store-1", 1, 1_700_000_000.0,
                                   read_kafka=kafka.read, announce_kafka=kafka.announce)


def test_the_first_member_records_the_pool_in_both_and_the_next_one_joins(tmp_path):
    store, kafka = LocalObjectStore(str(tmp_path / "s")), _Kafka()
    pool_id = _establish(store, kafka)
    assert kafka.messages == [pool_id]
    rec = json.loads(store.get(IDENTITY_KEY))
    assert (rec["pool_id"], rec["announced"], rec["created_by"]) == (pool_id, True, "a")
    assert _establish(store, kafka, member="b") == pool_id
    assert kafka.messages == [pool_id]  # nothing announced again


def test_a_member_on_a_kafka_cluster_of_its_own_is_refused(tmp_path):
    store = LocalObjectStore(str(tmp_path / "s"))
    pool_id = _establish(store, _Kafka())
    with pytest.raises(PoolIdentityMismatch) as e:
        _establish(store, _Kafka(), member="b", bootstrap="127.0.0.1:9093")
    assert e.value.which == "kafka" and e.value.store_id == pool_id
    assert "127.0.0.1:9093" in str(e.value) and "store-1" in str(e.value) and "--kafka-bootstrap" in str(e.value)


def test_a_member_on_an_object_store_of_its_own_is_refused(tmp_path):
    kafka = _Kafka()
    pool_id = _establish(LocalObjectStore(str(tmp_path / "s")), kafka)
    other = LocalObjectStore(str(tmp_path / "other"))
    with pytest.raises(PoolIdentityMismatch) as e:
        _establish(other, kafka, member="b")
    assert e.value.which == "object_store" and e.value.kafka_id == pool_id
    with pytest.raises(ObjectNotFound):  # nothing recorded in the wrong store
        other.get(IDENTITY_KEY)


def test_a_member_of_another_pool_is_refused(tmp_path):
    k1, k2 = _Kafka(), _Kafka()
    s1, s2 = LocalObjectStore(str(tmp_path / "s1")), LocalObjectStore(str(tmp_path / "s2"))
    _establish(s1, k1)
    _establish(s2, k2)
    with pytest.raises(PoolIdentityMismatch) as e:
        _establish(s1, k2, member="b")
    assert e.value.which == "both"


def test_an_announcement_a_member_did_not_finish_is_finished_by_the_next_start(tmp_path):
    store, kafka = LocalObjectStore(str(tmp_path / "s")), _Kafka()

    def dies(_bootstrap, _pool_id, _rf):
        raise ConnectionError("killed before Kafka acknowledged")

    with pytest.raises(PoolIdentityUnavailable):
        establish_pool_identity(store, "k1:9092", "a", "store-1", 1, 1.0, read_kafka=kafka.read, announce_kafka=dies)
    pool_id = json.loads(store.get(IDENTITY_KEY))["pool_id"]
    assert _establish(store, kafka, member="b") == pool_id and kafka.messages == [pool_id]
    assert json.loads(store.get(IDENTITY_KEY))["announced"] is True


def test_another_pool_announced_first_on_a_new_cluster(tmp_path):
    kafka = _Kafka()
    kafka.messages.append("someone-elses")  # announced between this member's read and its announcement
    reads = iter([None, "someone-elses"])
    with pytest.raises(PoolIdentityMismatch) as e:
        establish_pool_identity(LocalObjectStore(str(tmp_path / "s")), "k1:9092", "a", "store-1", 1, 1.0,
                                read_kafka=lambda _b: next(reads), announce_kafka=kafka.announce)
    assert e.value.which == "both" and e.value.kafka_id == "someone-elses"


def test_kafka_that_cannot_be_asked_stops_the_start(tmp_path):
    def away(_bootstrap):
        raise TimeoutError("no broker")

    with pytest.raises(PoolIdentityUnavailable, match="no broker"):
        establish_pool_identity(LocalObjectStore(str(tmp_path / "s")), "k1:9092", "a", "store-1", 1, 1.0,
                                read_kafka=away, announce_kafka=_Kafka().announce)


def test_an_unreadable_record_is_named(tmp_path):
    store = LocalObjectStore(str(tmp_path / "s"))
    store.put(IDENTITY_KEY, b'{"format_version": 9}')
    with pytest.raises(PoolIdentityUnavailable, match="format version 1"):
        _establish(store, _Kafka())
