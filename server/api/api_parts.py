"""What the APIs' request handlers reach of the server: the parts a gRPC service, the Flight
services and the HTTP API call, each named and typed, instead of the whole server.

Invariant: a handler changes the server only through these parts; every part is built and
running before the first request is served (server/app.py builds `ApiParts` once the server's
parts run, then starts gRPC and HTTP).

Runs on the driver, in the request handlers' threads.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from iox_spark.catalog.catalog import Catalog

__all__ = ["Queries", "ApiParts"]


class Queries(Protocol):
    """The query path (server/query_service.py `QueryService`)."""

    def query(self, database: str, sql: str, after: str = "", allow_partial: bool = False,
              deadline_s: float | None = None): ...

    def table_columns(self, database: str) -> dict: ...

    def database_names(self) -> list: ...

    def unpersisted_rows(self, database: str, tables: list, wait_applied: dict, deadline_s: float | None,
                         written_before: dict | None = None, scans: dict | None = None,
                         max_bytes: int = 0) -> Iterable: ...


@dataclass(frozen=True)
class ApiParts:
    """`catalog`: the in-memory catalog (write tokens, the databases listed); `router`
    (server/write/router.py Router): writes; `write_buffer` (server/write_buffer/producer.py
    WriteBuffer): deletes; `queries`: SQL, InfluxQL's columns, the pool's UnpersistedRows; then one
    callable per management call: `status(database, pool_members)` (server/status_document.py),
    `persist(database, table, partition_key, deadline_s)` and `compact(database, table,
    partition_key, persisted, deadline_s)` (server/manual_actions.py), `retry_poisoned` and
    `accept_poisoned(database, partition, offset)` (server/poison_admin.py),
    `accept_lost_writes(database)` (server/lost_writes_admin.py), `set_retention(database,
    period_s)` (server/retention_admin.py), `freeze(reason)` and `unfreeze()`
    (server/freeze_admin.py), `claim_partitions(database, partitions)` (server/pool/membership.py) and
    `verify(database, table, max_differences, here_only)` (server/verify_admin.py); `downsamplers`
    (server/downsampling.py Downsamplers: create, list, drop)."""

    catalog: Catalog
    router: object
    write_buffer: object
    queries: Queries
    status: Callable
    persist: Callable
    compact: Callable
    retry_poisoned: Callable
    accept_poisoned: Callable
    accept_lost_writes: Callable
    set_retention: Callable
    freeze: Callable
    unfreeze: Callable
    claim_partitions: Callable
    verify: Callable
    downsamplers: object = None
