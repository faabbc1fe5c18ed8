"""catalog/pool_schema.py on a real directory object store: of members racing to reserve one new
column with different types exactly one type is stored, and every member is told that one."""
from __future__ import annotations

import threading

import pytest

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.catalog.pool_schema import ColumnReservationUnreadable, column_key, reserve_columns
from iox_spark.catalog.schema import Column


def test_racing_reservations_agree_on_the_first_type(tmp_path):
    store = LocalObjectStore(str(tmp_path))
    kinds = [("integer", "a"), ("string", "b")] * 8
    answers, start = [None] * len(kinds), threading.Barrier(len(kinds))

    def member(i, typ, name):
        start.wait()
        answers[i] = reserve_columns(store, "db", {"m": [Column("c", "field", typ)]}, name)["m"][0]

    threads = [threading.Thread(target=member, args=(i, t, n)) for i, (t, n) in enumerate(kinds)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(answers)) == 1 and answers[0].type in ("integer", "string")
    # a later reservation of the other type is told the stored one; a new column is reserved as asked
    other = "string" if answers[0].type == "integer" else "integer"
    got = reserve_columns(store, "db", {"m": [Column("c", "field", other), Column("d", "tag", "string")],
                                        "n/x": [Column("c", "field", other)]}, "a")
    assert got == {"m": [answers[0], Column("d", "tag", "string")], "n/x": [Column("c", "field", other)]}


def test_names_map_to_one_key_each_and_a_foreign_record_is_refused(tmp_path):
    assert column_key("db", "a/b", "c") != column_key("db", "a", "b/c")
    store = LocalObjectStore(str(tmp_path))
    store.put_if_absent(column_key("db", "m", "c"), b'{"format_version": 99, "name": "c"}')
    with pytest.raises(ColumnReservationUnreadable) as ei:
        reserve_columns(store, "db", {"m": [Column("c", "field", "float")]}, "a")
    assert "format version 99" in str(ei.value)
