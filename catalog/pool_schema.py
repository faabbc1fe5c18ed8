"""Column types agreed across an ingester pool: the first reservation of a column in the object store.

Invariant: in an ingester pool, every member takes writes for every table, so a column's role and
type cannot be checked by one process alone. A column is the one of the first reservation of
`column_key(db, table, column)` (put-if-absent: of concurrent reservations exactly one is
stored); a member reserves each column new to it before it acknowledges a write that uses it,
and adopts the stored column when another member's reservation came first. Two members thus
never acknowledge different types for one column, and the owner never reads a value of the
losing type as NULL. A reservation whose write then fails (a refused request, a failed produce)
stays: harmless, it constrains later writes exactly as the failed one would have.

Where it runs: `reserve_columns` in the router's request threads (driver), before the request is
produced; it reads and writes the object store.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from iox_spark.catalog.errors import AlreadyExists, ObjectNotFound
from iox_spark.catalog.object_store import encode_key_segment
from iox_spark.catalog.schema import Column

__all__ = ["SCHEMA_PREFIX", "column_key", "reserve_columns", "ColumnReservationUnreadable"]

#: where the pool's column reservations live: <SCHEMA_PREFIX><db>/<table>/<column>.json
SCHEMA_PREFIX = "iox~pool/schema/"
_FORMAT_VERSION = 1
#: reservations of one request written at once (a new table's columns)
_PARALLEL = 16
#: an S3 reservation found in flight (AlreadyExists, not readable yet) is read again this often, this long apart
_ATTEMPTS = 20
_RETRY_S = 0.05


class ColumnReservationUnreadable(ValueError):
    """A reservation object that is not one this version wrote (another format version, or damaged)."""

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"column reservation {key}: {reason}")


def column_key(db: str, table: str, column: str) -> str:
    """The object key of the reservation of `column` of `db`.`table`."""
    return SCHEMA_PREFIX + "/".join(encode_key_segment(s) for s in (db, table, column)) + ".json"


def _record(c: Column, writer: str) -> bytes:
    return json.dumps({"format_version": _FORMAT_VERSION, "name": c.name, "role": c.role, "type": c.type,
                       "writer": writer}).encode()


def _parse(key: str, data: bytes) -> Column:
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise ColumnReservationUnreadable(key, f"not JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format_version") != _FORMAT_VERSION:
        raise ColumnReservationUnreadable(key, f"format version {obj.get('format_version') if isinstance(obj, dict) else None!r}, "
                                               f"this version reads {_FORMAT_VERSION}")
    if not all(isinstance(obj.get(k), str) for k in ("name", "role", "type")):
        raise ColumnReservationUnreadable(key, f"fields missing: {obj!r}")
    return Column(obj["name"], obj["role"], obj["type"])


def _reserve_one(store, db: str, table: str, c: Column, writer: str) -> Column:
    key = column_key(db, table, c.name)
    for attempt in range(_ATTEMPTS):
        try:
            store.put_if_absent(key, _record(c, writer))
            return c
        except AlreadyExists:
            try:
                return _parse(key, store.get(key))
            except ObjectNotFound:  # S3: another reservation of it still in flight
                if attempt == _ATTEMPTS - 1:
                    raise
                time.sleep(_RETRY_S)
    raise AssertionError("unreachable")


def reserve_columns(store, db: str, columns: dict, writer: str) -> dict:
    """{table: [Column]}: the pool's column for each of `columns` ({table: [Column]} new to the
    caller), reserving those nobody reserved yet with the caller's role and type. `writer`: the
    pool member's name (recorded, for operators). Raises ColumnReservationUnreadable, or the
    object store's error (nothing is acknowledged then)."""
    work = [(table, c) for table, cols in columns.items() for c in cols]
    if len(work) == 1:
        agreed = [_reserve_one(store, db, work[0][0], work[0][1], writer)]
    else:
        with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(work)), thread_name_prefix="iox-reserve") as ex:
            agreed = list(ex.map(lambda tc: _reserve_one(store, db, tc[0], tc[1], writer), work))
    out: dict = {}
    for (table, _c), got in zip(work, agreed):
        out.setdefault(table, []).append(got)
    return out
