"""server/fence_admin.py: a fenced database's writes are refused naming the other server's revision,
and once the lifecycle reports the fence every Kafka partition of it is held past what is applied
(its streaming source told); other databases are untouched. A real Catalog; the lifecycle and the
ingestor are stand-ins that record what is asked."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from iox_spark.catalog.catalog import FENCED, Catalog
from iox_spark.server.errors import DatabaseFenced
from iox_spark.server.fence_admin import FenceControl


def _fence(fenced: dict):
    cat = Catalog()
    told = []
    lifecycle = SimpleNamespace(fenced_revision=fenced.get)
    ingestor = SimpleNamespace(poison_changed=lambda db: told.append(db.name))
    return FenceControl(cat, lifecycle, ingestor), cat, told


def test_writes_to_a_fenced_database_are_refused_naming_the_revision():
    fence, _cat, _told = _fence({"a": 7})
    with pytest.raises(DatabaseFenced) as e:
        fence.refuse_when_fenced("a")
    assert e.value.database == "a" and e.value.revision == 7
    fence.refuse_when_fenced("b")  # not fenced: no error


def test_the_fence_holds_every_partition_after_what_is_applied():
    fence, cat, told = _fence({})
    a = cat.ensure_database("a", "iox.a", 3)
    b = cat.ensure_database("b", "iox.b", 3)
    cat.advance_applied(a, {0: 4, 2: 9})
    fence.on_fenced(SimpleNamespace(db="a", revision=12))
    assert a.hold_reasons() == {0: [(5, FENCED)], 1: [(0, FENCED)], 2: [(10, FENCED)]}
    assert b.held_offsets() == {} and told == ["a"]
    fence.on_fenced(SimpleNamespace(db="gone", revision=3))  # a database this server never knew: nothing
    assert told == ["a"]
