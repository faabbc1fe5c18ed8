"""The delete path: validate a delete and sequence it through the write buffer.

Invariant: a delete is rejected whole (INVALID_ARGUMENT with the reason) before
anything reaches Kafka, or produced to the Kafka partition of its table (every
partition for a database-wide delete) and acknowledged; it is applied by the
consumer in write-buffer order with the writes (see catalog/delete_mailbox.py).
Runs on the driver, in gRPC worker threads.
"""
from __future__ import annotations

from iox_spark.catalog.catalog import Catalog, DatabaseNotFoundError

from iox_spark.catalog.delete_predicate import InvalidDelete, parse_predicate, parse_time_range, to_json, validate_against_schema
from iox_spark.server.errors import DatabaseNotFound, InvalidArgument
from iox_spark.server.write.router import validate_database_name
from iox_spark.server.write_buffer.wire_format import encode_delete
from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["submit_delete"]


def submit_delete(catalog: Catalog, write_buffer: WriteBuffer, database: str, table: str, start: str, stop: str,
                  predicate: str) -> dict:
    """Returns the write token {kafka partition: offset} of the delete."""
    validate_database_name(database)
    try:
        db = catalog.database(database)
    except DatabaseNotFoundError:
        raise DatabaseNotFound(database) from None
    try:
        start_ns, stop_ns = parse_time_range(start, stop)
        terms = parse_predicate(predicate)
        if table:
            schema = db.schemas.get(table)
            if schema is None:
                raise InvalidDelete("table", f"table {table!r} does not exist in database {database!r}")
            validate_against_schema(terms, {c.name: (c.role, c.type) for c in schema.columns}, table)
        else:
            merged: dict = {}
            for t in db.schemas.tables():
                for c in db.schemas.get(t).columns:
                    merged.setdefault(c.name, (c.role, c.type))
            validate_against_schema(terms, merged, None)
    except InvalidDelete as e:
        raise InvalidArgument(str(e)) from None
    body = to_json(terms)
    if table:
        writes = [encode_delete(table, start_ns, stop_ns, body)]
    else:
        writes = [encode_delete(None, start_ns, stop_ns, body, partition=p) for p in range(db.kafka_partitions)]
    return write_buffer.produce(database, writes)
