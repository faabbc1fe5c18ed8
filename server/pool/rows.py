"""Scatter-gather in an ingester pool: the owners' unpersisted rows, for a query through any member.

Invariant: a query through a pool member reads a table it does not own as the files every member
persisted (registered from the pool catalog, server/pool/membership.py) plus the rows the table's
owner holds and has not persisted, with the owner's deletes applied to both. The owner reads its
unpersisted chunks first and the catalog revision after (`owner_rows`): whatever a persist moved
out of those chunks is committed by that revision, and the asking member reads the catalog up to
it before it plans the query (`gather`), so no row is missed; a row both in a file and among the
chunks is the same row (same key and `_iox_seq`) and deduplicates. A write token's offsets of a
partition the asking member does not own are waited for by that partition's owner.

Where it runs: `owner_rows` on the owner's driver (the UnpersistedRows RPC); `gather` on the
asking member's driver, before `QueryEngine.run`. The owner's address is its pool member name.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import pyarrow as pa

from iox_spark.catalog.delete_mailbox import Delete
from iox_spark.catalog.schema import TIME_NS_COLUMN
from iox_spark.catalog.sharding import partition_for

__all__ = ["OwnerRows", "owner_rows", "gather", "rows_message_parts", "deletes_to_json", "deletes_from_json",
           "NOT_OWNER_METADATA", "OwnerMoved", "scans_of", "reads_of", "scanned"]

log = logging.getLogger(__name__)

_IN_MEMORY = ("persisted", "unloaded")  # states whose rows are in Parquet
#: bytes of rows per Arrow IPC message of an answer, about (a message stays well under gRPC's
#: message limit however wide the rows are; a single row larger than this travels alone)
MESSAGE_BYTES = 8 * 1024 * 1024
#: trailing metadata key of an UnpersistedRows answer "not the owner" (FAILED_PRECONDITION): the
#: partitions, comma-separated
NOT_OWNER_METADATA = "iox-not-owner"


class OwnerMoved(Exception):
    """Raised by `gather`'s `fetch` when the member asked answered that it does not own `partitions`
    (any more): the asking member reads the owners again and asks once more (not an error to users)."""

    def __init__(self, member: str, partitions, message: str):
        self.member, self.partitions, self.message = member, tuple(partitions), message
        super().__init__(message)


@dataclass
class OwnerRows:
    """One table's unpersisted rows at its owner: its columns, rows (chunk layout, or None), deletes."""

    table: str
    columns: list = field(default_factory=list)  # [[name, role, type]]
    rows: pa.Table | None = None
    deletes: list = field(default_factory=list)  # Delete
    catalog_revision: int = -1


def deletes_to_json(deletes: list) -> str:
    return json.dumps([{"table": d.table, "start_ns": d.start_ns, "stop_ns_exclusive": d.stop_ns_exclusive,
                        "predicate": [list(t) for t in d.predicate], "seq": d.seq,
                        "kafka_partition": d.kafka_partition} for d in deletes])


def deletes_from_json(text: str) -> list:
    out = []
    for d in json.loads(text or "[]"):
        out.append(Delete(table=d["table"], start_ns=int(d["start_ns"]), stop_ns_exclusive=int(d["stop_ns_exclusive"]),
                          predicate=tuple(tuple(t) for t in d["predicate"]), seq=int(d["seq"]),
                          kafka_partition=int(d["kafka_partition"])))
    return out


def owner_rows(spark, catalog, db, table: str, catalog_revision, scan=None, reader_lo_ns: int | None = None,
               max_bytes: int = 0) -> OwnerRows | None:
    """`table`'s rows this owner holds unpersisted, in the chunk layout with its deletes applied;
    None when it does not own the table. `catalog_revision()`: the preserved catalog's revision,
    read after the chunks (see the module docstring). `scan` (server/query/pushdown.py TableScan,
    None: all): only the rows and fields the query reads; `reader_lo_ns`: no row older (retention);
    `max_bytes` (0: none): QueryResultTooLarge when the rows hold more. A scan's condition runs
    only once the SQL sandbox passed it (QueryRefused)."""
    from iox_spark.chunk_store.chunk_data import merged_df
    from iox_spark.chunk_store.chunk_views import query_session
    from iox_spark.chunk_store.views import quote

    from iox_spark.server.errors import QueryResultTooLarge
    from iox_spark.server.query.sql_sandbox import check_query

    read = catalog.owned_table_read(db, table, _IN_MEMORY)
    if read is None:
        return None
    schema, chunks, deletes = read
    out = OwnerRows(table, schema.to_json() if schema is not None else [], None, deletes)
    if chunks and schema is not None:
        if scan is not None and scan.where_sql:
            check_query(spark.newSession(), db.name, f"SELECT * FROM {quote(table)} WHERE {scan.where_sql}")
        df = scanned(merged_df(query_session(spark), schema, chunks, deletes), schema, scan, reader_lo_ns)
        out.rows = df.toArrow()
        if max_bytes and out.rows.nbytes > max_bytes:
            raise QueryResultTooLarge("bytes", max_bytes, "--max-query-bytes")
    out.catalog_revision = catalog_revision()
    return out


def scanned(df, schema, scan=None, reader_lo_ns: int | None = None):
    """`df` (a table's rows in the chunk layout) as far as `scan` (server/query/pushdown.py
    TableScan, None: all) reads it, without the rows older than `reader_lo_ns` (None: all)."""
    from iox_spark.chunk_store.views import quote

    from iox_spark.server.query.pushdown import TIME_COLUMN, owner_columns

    if reader_lo_ns is not None:
        df = df.where(f"{quote(TIME_NS_COLUMN)} >= {int(reader_lo_ns)}")
    if scan is not None and scan.where_sql:
        t = quote(TIME_NS_COLUMN)  # the user layout's time, as chunk_store/views.py makes it
        df = (df.selectExpr("*", f"timestamp_micros(({t} - pmod({t}, 1000)) DIV 1000) AS {quote(TIME_COLUMN)}")
              .where(scan.where_sql).drop(TIME_COLUMN))
    if scan is not None and scan.prune_fields:
        df = df.select(*[quote(c) for c in owner_columns(schema, scan)])
    return df


def reads_of(scans: dict) -> list:
    """{table: TableScan} (server/query/pushdown.py) as UnpersistedRowsRequest.reads."""
    from iox_spark.iox import query_pb2

    return [query_pb2.TableRead(table=s.table, where_sql=s.where_sql, prune_fields=s.prune_fields,
                                fields=list(s.fields)) for s in scans.values()]


def scans_of(reads) -> dict:
    """UnpersistedRowsRequest.reads as {table: TableScan}."""
    from iox_spark.server.query.pushdown import TableScan

    return {r.table: TableScan(r.table, r.where_sql, r.prune_fields, tuple(r.fields)) for r in reads}


def rows_message_parts(rows: pa.Table | None, message_bytes: int = MESSAGE_BYTES) -> list:
    """The Arrow IPC streams of an answer: `rows` in slices of about `message_bytes` (by the
    table's mean row size; one empty stream for none)."""
    if rows is None or rows.num_rows == 0:
        return [b""]
    per = max(1, int(message_bytes * rows.num_rows // max(1, rows.nbytes)))
    parts = []
    for off in range(0, rows.num_rows, per):
        sink = pa.BufferOutputStream()
        piece = rows.slice(off, per)
        with pa.ipc.new_stream(sink, piece.schema) as w:
            w.write_table(piece)
        parts.append(sink.getvalue().to_pybytes())
    return parts


def gather(db, tables: list, owners: dict, wait_applied: dict, fetch, timeout_s: float,
           max_bytes: int = 0) -> tuple[dict, dict, int]:
    """Asks the owners of `tables` (tables of `db` this member does not own) for their unpersisted
    rows. `owners`: {kafka partition: owner address}; `wait_applied`: a write token's offsets;
    `fetch(address, database, tables, wait_applied, timeout_s)` -> iterable of UnpersistedRowsResponse.
    Returns ({table: OwnerRows}, {kp: applied offset at its owner}, the highest catalog revision the
    answers go with). A table whose partition has no owner yet has nothing unpersisted anywhere.
    QueryResultTooLarge once the answers' rows hold more than `max_bytes` (0: no limit)."""
    from iox_spark.server.errors import QueryResultTooLarge

    by_owner: dict = {}
    for t in tables:
        addr = owners.get(partition_for(t, db.kafka_partitions))
        if addr is not None:
            by_owner.setdefault(addr, []).append(t)
    for kp in wait_applied:  # a token's partition waits at its owner, also when no table of it is read
        if owners.get(kp) is not None:
            by_owner.setdefault(owners[kp], [])
    out: dict = {}
    applied: dict = {}
    revision = -1
    received = 0
    deadline = time.monotonic() + timeout_s
    for addr, ts in sorted(by_owner.items()):
        kps = {kp for kp, a in owners.items() if a == addr}
        wait = {kp: off for kp, off in wait_applied.items() if kp in kps}
        for msg in fetch(addr, db.name, ts, wait, max(0.1, deadline - time.monotonic())):
            revision = max(revision, msg.catalog_revision)
            for kp, off in msg.applied_hi_inclusive.items():
                if kp in kps:
                    applied[kp] = max(applied.get(kp, -1), off)
            if not msg.table:
                continue
            r = out.get(msg.table)
            if r is None:
                r = out[msg.table] = OwnerRows(msg.table, json.loads(msg.columns_json or "[]"), None,
                                               deletes_from_json(msg.deletes_json), msg.catalog_revision)
            if msg.arrow_ipc:
                received += len(msg.arrow_ipc)
                if max_bytes and received > max_bytes:
                    raise QueryResultTooLarge("bytes", max_bytes, "--max-query-bytes")
                t = pa.ipc.open_stream(pa.py_buffer(msg.arrow_ipc)).read_all()
                r.rows = t if r.rows is None else pa.concat_tables([r.rows, t])
    return out, applied, revision

