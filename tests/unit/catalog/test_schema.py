from __future__ import annotations

import pytest

from iox_spark.catalog.schema import Column, ColumnLimitExceeded, ColumnTypeConflict, SchemaRegistry


def _fields(n: int, prefix: str = "f") -> list[Column]:
    return [Column("time", "time", "time")] + [Column(f"{prefix}{i}", "field", "float") for i in range(n)]


def test_a_table_takes_columns_up_to_the_limit_and_not_one_more():
    reg = SchemaRegistry()
    reg.check_and_reserve({"m": _fields(4)}, max_columns_per_table=5)  # time + 4 fields = 5
    with pytest.raises(ColumnLimitExceeded) as e:
        reg.check_and_reserve({"m": [Column("g", "field", "float")], "n": _fields(1)}, max_columns_per_table=5)
    assert (e.value.table, e.value.existing, e.value.would_have, e.value.limit) == ("m", 5, 6, 5)
    assert reg.get("n") is None  # the whole request changed nothing
    assert len(reg.get("m").columns) == 5
    reg.check_and_reserve({"m": _fields(2)}, max_columns_per_table=5)  # columns it has: always fine


def test_a_table_wider_than_a_lowered_limit_keeps_taking_its_own_columns():
    reg = SchemaRegistry()
    reg.check_and_reserve({"m": _fields(9)})  # no limit
    reg.check_and_reserve({"m": _fields(9)}, max_columns_per_table=3)
    with pytest.raises(ColumnLimitExceeded):
        reg.check_and_reserve({"m": _fields(1, "new")}, max_columns_per_table=3)


def test_a_type_conflict_is_reported_before_the_limit():
    reg = SchemaRegistry()
    reg.check_and_reserve({"m": _fields(2)}, max_columns_per_table=3)
    with pytest.raises(ColumnTypeConflict):
        reg.check_and_reserve({"m": [Column("f0", "tag", "string"), Column("x", "field", "float")]},
                              max_columns_per_table=3)
