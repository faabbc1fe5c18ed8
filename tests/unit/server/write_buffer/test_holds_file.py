"""The holds file (server/write_buffer/holds_file.py): what it holds, its round trip, and a batch's end."""
from __future__ import annotations

from iox_spark.catalog.catalog import FENCED, Database
from iox_spark.server.write_buffer.holds_file import held_end, holds_of, read_holds, write_holds
from iox_spark.server.write_buffer.poison import set_aside


def test_holds_file_round_trip_and_held_end(tmp_path):
    a, b = Database("a", "iox.a", 2), Database("b", "iox.b", 2)
    set_aside(a, 1, 7, "cpu", "write", "x", 1.0)
    holds = holds_of([a, b])
    assert holds == {"iox.a": {"1": 7}}
    path = str(tmp_path / "holds.json")
    assert read_holds(path) == {} and read_holds("") == {}
    write_holds(path, holds)
    assert read_holds(path) == holds
    (tmp_path / "holds.json").write_text("{not json")
    assert read_holds(path) == {}
    assert held_end(3, 10, None) == 10
    assert held_end(3, 10, 7) == 7  # not past the held message
    assert held_end(9, 12, 7) == 9  # read past it already (the batch that found it): no further
    assert held_end(7, 12, 7) == 7  # restarted from it: nothing


def test_fence_holds_join_the_poisoned_holds_and_reach_the_holds_file():
    """A fenced database holds every partition past what it applied (`Database.hold`, FENCED), the
    lower of that and a held poisoned message per partition, also in the streaming source's file."""
    db = Database("d", "iox.d", 3)
    assert not db.may_hold
    set_aside(db, 1, 7, "cpu", "write", "boom", 100.0)
    db.hold(FENCED, {0: 5, 1: 9, 2: 0})
    assert db.may_hold and db.held_offsets() == {0: 5, 1: 7, 2: 0}
    assert holds_of([db]) == {"iox.d": {"0": 5, "1": 7, "2": 0}}
    db.drop_poisoned(db.poisoned)
    assert db.may_hold and db.held_offsets() == {0: 5, 1: 9, 2: 0}
