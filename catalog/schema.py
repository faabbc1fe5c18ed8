"""Table schemas: a column keeps the role and type it was first written with.

Invariant: once a column of a table has a (role, type), every later write and
every Kafka partition agrees with it; `TableSchema.merge` is the only way a
schema grows, and it refuses a conflict without changing anything.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from iox_spark.catalog.errors import CatalogError

__all__ = ["Column", "TableSchema", "SchemaRegistry", "ColumnTypeConflict", "ColumnLimitExceeded", "SPARK_TYPES",
           "TIME_NS_COLUMN", "SEQ_COLUMN", "DAY_COLUMN", "RESERVED_COLUMNS"]

#: Spark SQL type of each column type as stored in chunks.
#: uinteger is DECIMAL(20,0): Spark has no unsigned 64-bit integer, and this keeps every value exact.
SPARK_TYPES = {
    "string": "STRING",
    "float": "DOUBLE",
    "integer": "BIGINT",
    "uinteger": "DECIMAL(20,0)",
    "boolean": "BOOLEAN",
}
#: Chunks store the point time as exact nanoseconds in this column.
TIME_NS_COLUMN = "time_ns"
#: Write-buffer order of a row within its table (see server/consume/ingest.py seq_base).
SEQ_COLUMN = "_iox_seq"
#: The UTC day of a row's partition (a DATE), in the Iceberg tables only (lifecycle/iceberg_publication.py):
#: their identity partition column, held in Iceberg's metadata, not in our Parquet files.
DAY_COLUMN = "_iox_day"
#: Names a user cannot use for a tag or field.
RESERVED_COLUMNS = frozenset({TIME_NS_COLUMN, SEQ_COLUMN, DAY_COLUMN})


class ColumnTypeConflict(CatalogError):
    def __init__(self, table: str, column: str, existing: str, new: str):
        self.table = table
        self.column = column
        self.existing = existing
        self.new = new
        super().__init__(f"table {table!r} column {column!r} is {existing}, this write has {new}")


class ColumnLimitExceeded(CatalogError):
    """A write would give a table more columns (time included) than the per-table limit."""

    def __init__(self, table: str, existing: int, would_have: int, limit: int):
        self.table = table
        self.existing = existing
        self.would_have = would_have
        self.limit = limit
        super().__init__(f"table {table!r} has {existing} columns, this write would make it {would_have}: "
                         f"at most {limit} columns per table")


@dataclass(frozen=True)
class Column:
    name: str
    role: str  # tag | field | time
    type: str  # string | float | integer | uinteger | boolean | time

    @property
    def kind(self) -> str:
        """'tag', 'time', or the field type: what must agree across writes."""
        return self.role if self.role in ("tag", "time") else f"{self.type} field"


class TableSchema:
    """Columns of one table in first-seen order. Not thread-safe: guarded by SchemaRegistry."""

    def __init__(self, name: str, columns: list[Column] | None = None):
        self.name = name
        self._cols: dict[str, Column] = {}
        for c in columns or []:
            self._cols[c.name] = c

    @property
    def columns(self) -> list[Column]:
        return list(self._cols.values())

    def get(self, name: str) -> Column | None:
        return self._cols.get(name)

    def tags(self) -> list[str]:
        return sorted(c.name for c in self._cols.values() if c.role == "tag")

    def fields(self) -> list[Column]:
        return sorted((c for c in self._cols.values() if c.role == "field"), key=lambda c: c.name)

    def check(self, columns: list[Column]) -> None:
        for c in columns:
            have = self._cols.get(c.name)
            if have is not None and (have.role, have.type) != (c.role, c.type):
                raise ColumnTypeConflict(self.name, c.name, have.kind, c.kind)

    def merge(self, columns: list[Column]) -> bool:
        """Adds new columns after checking all of them; returns True when the schema grew."""
        self.check(columns)
        grew = False
        for c in columns:
            if c.name not in self._cols:
                self._cols[c.name] = c
                grew = True
        return grew

    def to_json(self) -> list:
        return [[c.name, c.role, c.type] for c in self._cols.values()]

    @classmethod
    def from_json(cls, name: str, cols: list) -> "TableSchema":
        return cls(name, [Column(*c) for c in cols])


class SchemaRegistry:
    """Per database: table name -> TableSchema, shared by the write path and the consumer."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tables: dict[str, TableSchema] = {}

    def check_and_reserve(self, batches: dict[str, list[Column]], max_columns_per_table: int = 0) -> None:
        """Checks every table of a request, then records its new columns, atomically.

        Called by the router before producing: a conflicting request changes nothing. A request
        that would take a table past `max_columns_per_table` columns (time included; 0 = no
        limit) raises ColumnLimitExceeded; a table already past it (a lower limit than when
        its columns came) still takes writes of the columns it has.
        Columns reserved by a request whose produce fails stay reserved (harmless:
        they only constrain later writes the way the failed one would have).
        """
        with self._lock:
            for table, cols in batches.items():
                sch = self._tables.get(table)
                if sch is not None:
                    sch.check(cols)
                if max_columns_per_table:
                    have = set() if sch is None else {c.name for c in sch.columns}
                    would_have = len(have | {c.name for c in cols})
                    if would_have > max(max_columns_per_table, len(have)):
                        raise ColumnLimitExceeded(table, len(have), would_have, max_columns_per_table)
            for table, cols in batches.items():
                self._tables.setdefault(table, TableSchema(table)).merge(cols)

    def unknown_columns(self, batches: dict[str, list[Column]]) -> dict[str, list[Column]]:
        """{table: [Column]} of `batches`' columns this registry does not hold yet (none checked)."""
        with self._lock:
            out: dict = {}
            for table, cols in batches.items():
                sch = self._tables.get(table)
                have = set() if sch is None else {c.name for c in sch.columns}
                new = [c for c in cols if c.name not in have]
                if new:
                    out[table] = new
            return out

    def merge(self, table: str, cols: list[Column]) -> TableSchema:
        with self._lock:
            sch = self._tables.setdefault(table, TableSchema(table))
            sch.merge(cols)
            return TableSchema(table, sch.columns)

    def get(self, table: str) -> TableSchema | None:
        with self._lock:
            sch = self._tables.get(table)
            return None if sch is None else TableSchema(table, sch.columns)

    def tables(self) -> list[str]:
        with self._lock:
            return list(self._tables)
