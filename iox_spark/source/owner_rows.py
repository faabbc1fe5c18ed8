"""The ingester pool's unpersisted rows of a table, for a read with ``unpersisted`` = true.

Invariant: the rows come from the owner of the table's Kafka partition (the pool catalog names
it; the address it published in the object store says where it is reached), through its
UnpersistedRows gRPC call: its in-memory rows that are not persisted, deduplicated, with its
deletes applied, plus those deletes and the catalog revision they go with. The caller then reads
the catalog snapshot at that revision or later (`iox_spark/source/data_source.py`), so a persist
between the two reads loses no row; a row both in a file and among these rows is the same row.

Runs on the driver when a read is loaded; never on executors (the rows travel in the plan).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from iox_spark.catalog.object_store import ObjectStore
from iox_spark.catalog.ownership import read_member_address
from iox_spark.catalog.preserved_catalog import CatalogState
from iox_spark.catalog.sharding import partition_for
from iox_spark.chunk_store.arrow_merge import ArrowDelete

from iox_spark.source.errors import OwnerUnavailable

__all__ = ["OwnerRows", "fetch_owner_rows", "OWNER_TIMEOUT_S"]

#: how long the owner may take to answer
OWNER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class OwnerRows:
    """A table's rows at its owner: Arrow IPC bytes of the chunk layout (b"": none), their time
    hull, the owner's columns [[name, role, type]] and deletes, and its catalog revision."""

    ipc: bytes
    min_time_ns: int | None
    max_time_ns: int | None
    columns: tuple
    deletes: tuple
    catalog_revision: int


def fetch_owner_rows(store: ObjectStore, state: CatalogState, table: str, token: str | None = None) -> OwnerRows | None:
    """The unpersisted rows of `table` at the owner of its partition in the pool catalog `state`;
    None outside a pool or when the partition has no owner. Raises OwnerUnavailable."""
    import grpc

    from iox_spark.iox import query_pb2, query_pb2_grpc

    if not state.pooled:
        return None
    n = state.pool_kafka_partitions
    owner = state.owners.get(partition_for(table, n))
    if owner is None:
        return None
    try:
        addr = read_member_address(store, owner.owner)
    except ValueError as e:
        raise OwnerUnavailable(state.db, table, owner.owner, str(e)) from None
    if addr is None:
        raise OwnerUnavailable(state.db, table, owner.owner, "it has not published its address")
    metadata = (("authorization", f"Token {token}"),) if token else None
    channel = grpc.insecure_channel(addr)
    try:
        stub = query_pb2_grpc.QueryServiceStub(channel)
        req = query_pb2.UnpersistedRowsRequest(database=state.db, tables=[table])
        msgs = list(stub.UnpersistedRows(req, timeout=OWNER_TIMEOUT_S, metadata=metadata))
    except grpc.RpcError as e:
        raise OwnerUnavailable(state.db, table, f"{owner.owner} ({addr})", f"{e.code().name}: {e.details()}") from None
    finally:
        channel.close()
    tables = [pa.ipc.open_stream(pa.py_buffer(m.arrow_ipc)).read_all() for m in msgs if m.arrow_ipc]
    rows = pa.concat_tables(tables) if tables else None
    first = msgs[0] if msgs else None
    deletes = tuple(ArrowDelete(int(d["start_ns"]), int(d["stop_ns_exclusive"]), int(d["seq"]),
                                tuple(tuple(t) for t in d["predicate"]))
                    for d in json.loads(first.deletes_json or "[]")) if first is not None else ()
    columns = tuple(tuple(c) for c in json.loads(first.columns_json or "[]")) if first is not None else ()
    revision = max((m.catalog_revision for m in msgs), default=-1)
    if rows is None or rows.num_rows == 0:
        return OwnerRows(b"", None, None, columns, deletes, revision)
    import pyarrow.compute as pc

    from iox_spark.catalog.schema import TIME_NS_COLUMN

    mm = pc.min_max(rows.column(TIME_NS_COLUMN))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as w:
        w.write_table(rows)
    return OwnerRows(sink.getvalue().to_pybytes(), mm["min"].as_py(), mm["max"].as_py(), columns, deletes, revision)
