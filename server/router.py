"""The router: validates a write request and produces it to the write buffer.

Invariant: a request is all-or-nothing. Every check (size, database name, each
line, each column type against the table schema) runs before anything is
produced; the caller gets a write token only after Kafka acknowledged every
message of the request.

Runs on the driver, in gRPC / HTTP worker threads.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

from catalog.catalog import Catalog
from catalog.schema import RESERVED_COLUMNS, Column, ColumnTypeConflict

from .errors import BadLines, InvalidArgument, InvalidDatabaseName, RequestTooLarge, SchemaConflict
from .line_protocol import PRECISIONS, parse_lines
from .wire_format import encode_write
from .write_buffer import WriteBuffer

__all__ = ["Router", "WriteResult", "validate_database_name", "MAX_REPORTED_BAD_LINES", "MAX_DATABASE_NAME_CHARS"]

#: At most this many bad lines are listed in an error.
MAX_REPORTED_BAD_LINES = 100
MAX_DATABASE_NAME_CHARS = 64
_DB_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def validate_database_name(name: str) -> None:
    if not name:
        raise InvalidDatabaseName(name, "must not be empty")
    if len(name) > MAX_DATABASE_NAME_CHARS:
        raise InvalidDatabaseName(name, f"longer than {MAX_DATABASE_NAME_CHARS} characters")
    if not _DB_NAME.match(name):
        raise InvalidDatabaseName(name, "only letters, digits, '_' and '-' are allowed")


@dataclass(frozen=True)
class WriteResult:
    token: dict  # {kafka partition: offset}
    points: int
    topic: str


class Router:
    def __init__(self, catalog: Catalog, write_buffer: WriteBuffer, kafka_partitions: int, max_request_bytes: int):
        self.catalog = catalog
        self.write_buffer = write_buffer
        self.kafka_partitions = kafka_partitions
        self.max_request_bytes = max_request_bytes

    def write_line_protocol(self, database: str, body: bytes, precision: str = "ns",
                            now_ns: int | None = None) -> WriteResult:
        validate_database_name(database)
        if len(body) > self.max_request_bytes:
            raise RequestTooLarge(len(body), self.max_request_bytes)
        precision = precision or "ns"
        if precision not in PRECISIONS:
            raise InvalidArgument(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        result = parse_lines(body, precision, now_ns if now_ns is not None else time.time_ns())
        if result.errors:
            errs = [(e.line_number, e.reason) for e in result.errors[:MAX_REPORTED_BAD_LINES]]
            raise BadLines(errs, len(result.errors))
        if not result.tables:
            raise InvalidArgument("the request holds no points")
        batches = {}
        for name, tb in result.tables.items():
            cols = [Column(c.name, c.role, c.type) for c in tb.columns]
            for c in cols:
                if c.role != "time" and c.name in RESERVED_COLUMNS:
                    raise InvalidArgument(f"table {name!r}: column name {c.name!r} is reserved")
            batches[name] = cols
        topic = self.write_buffer.ensure_topic(database)
        db = self.catalog.ensure_database(database, topic, self.kafka_partitions)
        try:
            db.schemas.check_and_reserve(batches)
        except ColumnTypeConflict as e:
            raise SchemaConflict(e.table, e.column, e.existing, e.new) from None
        writes = [encode_write(name, tb.columns, tb.data) for name, tb in result.tables.items()]
        token = self.write_buffer.produce(database, writes)
        return WriteResult(token=token, points=result.lines, topic=topic)
