"""Where a database's writes go in Kafka: its topic, and a table's partition of it.

Invariant: the mapping is stable across processes, restarts and machines (crc32 of
the table name, never Python's salted hash), so every ingester, the replay and the
persisted checkpoints agree on which Kafka partition holds a table's writes.
Pure functions; used on the driver and in executors (picklable module functions).
"""
from __future__ import annotations

import zlib

__all__ = ["TOPIC_PREFIX", "topic_for", "consumer_group_for", "database_of_topic", "partition_for"]

TOPIC_PREFIX = "iox."


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
