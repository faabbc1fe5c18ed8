"""Deletes of a database and the mailbox of those not yet in the preserved catalog.

Invariants:
- A delete removes exactly the rows of its table(s) written before it in
  write-buffer order (`_iox_seq < seq`) with start <= time < stop matching its
  predicate; it never touches rows written after it.
- A delete stays in the mailbox until a preserved-catalog transaction records it
  (every persist flushes the whole mailbox), so after a restart it still applies
  to the Parquet files even once Kafka no longer holds it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Delete", "DeleteMailbox"]


@dataclass(frozen=True)
class Delete:
    #: None = every table (a database-wide delete: one copy per Kafka partition)
    table: str | None
    start_ns: int
    stop_ns_exclusive: int
    #: [[column, op, value, kind], ...] (catalog/delete_predicate.py to_json)
    predicate: tuple
    #: write-buffer position: rows with a smaller `_iox_seq` are before it
    seq: int
    #: the Kafka partition this copy came through (a table's rows live on one partition)
    kafka_partition: int

    def applies_to(self, table: str, table_kafka_partition: int) -> bool:
        if self.table is not None:
            return self.table == table
        return self.kafka_partition == table_kafka_partition


class DeleteMailbox:
    """All deletes of one database, and which of them the preserved catalog has recorded."""

    def __init__(self):
        self._lock = threading.Lock()
        self._all: list = []
        #: the same deletes, to find one in constant time (a pool member adds every recorded one again)
        self._seen: set = set()
        self._unrecorded: list = []

    def add(self, d: Delete, recorded: bool = False) -> None:
        with self._lock:
            if d in self._seen:
                return  # replayed from Kafka and also recorded in the catalog: apply once
            self._seen.add(d)
            self._all.append(d)
            if not recorded:
                self._unrecorded.append(d)

    def for_table(self, table: str, table_kafka_partition: int) -> list:
        with self._lock:
            return [d for d in self._all if d.applies_to(table, table_kafka_partition)]

    def unrecorded(self) -> list:
        with self._lock:
            return list(self._unrecorded)

    def mark_recorded(self, deletes) -> None:
        with self._lock:
            done = set(deletes)
            self._unrecorded = [d for d in self._unrecorded if d not in done]

    def __len__(self) -> int:
        with self._lock:
            return len(self._all)
