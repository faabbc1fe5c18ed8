"""server/write/router.py in an ingester pool: a column new to this member takes the pool's type
(`agree_columns`, catalog/pool_schema.py) before anything is produced. A real Router and Catalog;
the write buffer is a stand-in that records what would be produced."""
from __future__ import annotations

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.catalog.schema import Column
from iox_spark.server.errors import SchemaConflict, TooManyColumns
from iox_spark.server.write.router import Router


def _router(pool: dict, buf):
    """`pool`: {(table, column): Column} already reserved by other members."""
    asked = []

    def agree(database, columns):
        asked.append({t: [c.name for c in cols] for t, cols in columns.items()})
        return {t: [pool.get((t, c.name), c) for c in cols] for t, cols in columns.items()}

    cat = Catalog()
    r = Router(cat, buf, 2, 1 << 20)
    r.agree_columns = agree
    return r, cat, buf, asked


def test_a_type_another_member_reserved_first_refuses_the_write_whole(recording_buffer):
    r, cat, buf, asked = _router({("m", "c"): Column("c", "field", "string")}, recording_buffer)
    with pytest.raises(SchemaConflict) as ei:
        r.write_line_protocol("d", b"m,host=a c=1i,v=2 1\nn v=1 1")
    assert "'c'" in str(ei.value) and "string field" in str(ei.value) and buf.produced == []
    assert cat.database("d").schemas.get("m").get("c") == Column("c", "field", "string")
    r.write_line_protocol("d", b'm,host=a c="x",v=2 2')  # the pool's type is taken
    assert buf.produced == [["m"]]
    assert asked[-1] == {"m": ["host", "v", "time"]}  # c is known here now: not asked again


def test_the_column_limit_still_counts_the_columns_the_pool_agreed_to(recording_buffer):
    r, cat, buf, _asked = _router({}, recording_buffer)
    r.max_columns_per_table = 3
    with pytest.raises(TooManyColumns):
        r.write_line_protocol("d", b"m a=1,b=2,c=3 1")
    assert buf.produced == [] and cat.database("d").schemas.get("m") is None
    r.write_line_protocol("d", b"m a=1,b=2 1")
    assert buf.produced == [["m"]]
