"""Poisoned messages (server/write_buffer/poison.py): the isolation search and the records."""
from __future__ import annotations

import random

import pytest

from iox_spark.catalog.catalog import ACCEPTED, HELD, Database
from iox_spark.server.write_buffer.poison import first_failing, isolate, select, set_aside, settle_retried


class Fake:
    """An `attempt` that applies a list of (group, offset) messages whole, or fails when one of
    them is poisoned (or when a transient failure is due); records what it applied."""

    def __init__(self, poisoned=(), transient: int = 0):
        self.poisoned = set(poisoned)
        self.transient = transient  # the next this many attempts fail whatever they hold
        self.applied: list = []
        self.attempts = 0

    def __call__(self, msgs):
        self.attempts += 1
        if self.transient:
            self.transient -= 1
            return RuntimeError("transient")
        bad = [m for m in msgs if m in self.poisoned]
        if bad:
            return ValueError(f"poison {bad[0]}")
        self.applied.extend(msgs)
        return None


def _groups(sizes: dict) -> list:
    return [[(g, off) for off in range(n)] for g, n in sorted(sizes.items())]


def _applied_by_group(fake) -> dict:
    out: dict = {}
    for g, off in fake.applied:
        out.setdefault(g, []).append(off)
    return out


@pytest.mark.parametrize("at", [0, 1, 5, 9])
def test_one_poison_holds_its_group_at_it_and_everything_else_is_applied_once_in_order(at):
    groups = _groups({"a": 10, "b": 7, "c": 1})
    fake = Fake(poisoned={("b", at % 7)})
    first = fake([m for g in groups for m in g])  # the whole batch fails first
    assert first is not None
    found = isolate(groups, fake, first)
    assert [m for m, _e in found] == [("b", at % 7)]
    assert isinstance(found[0][1], ValueError)
    applied = _applied_by_group(fake)
    assert applied.get("a") == list(range(10)) and applied.get("c") == [0]
    assert applied.get("b", []) == list(range(at % 7))  # the prefix before it, nothing after it
    assert len(fake.applied) == len(set(fake.applied))  # each message applied once


def test_several_poisons_in_several_groups_stop_each_group_at_its_first():
    groups = _groups({"a": 20, "b": 20, "c": 20, "d": 3})
    fake = Fake(poisoned={("a", 3), ("a", 12), ("c", 19), ("d", 0)})
    found = isolate(groups, fake, fake([m for g in groups for m in g]))
    assert sorted(m for m, _e in found) == [("a", 3), ("c", 19), ("d", 0)]
    applied = _applied_by_group(fake)
    assert applied["a"] == [0, 1, 2] and applied["b"] == list(range(20)) and applied["c"] == list(range(19))
    assert "d" not in applied


def test_the_search_is_logarithmic_not_one_attempt_per_message():
    groups = _groups({"a": 2000})
    fake = Fake(poisoned={("a", 1234)})
    isolate(groups, fake, fake(groups[0]))
    assert fake.attempts < 60
    assert _applied_by_group(fake)["a"] == list(range(1234))


def test_a_poison_is_declared_only_after_failing_twice_on_its_own():
    calls = []

    def attempt(msgs):
        calls.append(list(msgs))
        return ValueError("x") if ("a", 0) in msgs else None

    found = isolate([[("a", 0)]], attempt, ValueError("whole batch"))
    assert [m for m, _e in found] == [("a", 0)]
    assert calls.count([("a", 0)]) == 1  # the whole batch was that message: one more alone makes two
    calls.clear()
    m, _e = first_failing([("a", 0), ("a", 1)], attempt, ValueError("both"))
    assert m == ("a", 0)
    assert calls.count([("a", 0)]) == 2


def test_a_transient_failure_ends_with_everything_applied_and_nothing_set_aside():
    groups = _groups({"a": 8, "b": 5})
    fake = Fake(transient=3)
    assert isolate(groups, fake, RuntimeError("transient")) == []
    applied = _applied_by_group(fake)
    assert applied == {"a": list(range(8)), "b": list(range(5))}


def test_random_poisons_never_apply_a_message_after_a_failing_one_of_its_group():
    rnd = random.Random(7)
    for _ in range(200):
        sizes = {g: rnd.randint(1, 40) for g in "abcde"[:rnd.randint(1, 5)]}
        groups = _groups(sizes)
        poisoned = {(g, rnd.randrange(n)) for g, n in sizes.items() if rnd.random() < 0.5}
        fake = Fake(poisoned=poisoned)
        first = fake([m for g in groups for m in g])
        found = isolate(groups, fake, first) if first is not None else []
        applied = _applied_by_group(fake)
        for g, n in sizes.items():
            bad = sorted(off for gg, off in poisoned if gg == g)
            assert applied.get(g, []) == list(range(bad[0] if bad else n))
        assert sorted(m for m, _e in found) == sorted(min((m for m in poisoned if m[0] == g)) for g in
                                                      {g for g, _o in poisoned})


def test_set_aside_select_and_settle():
    db = Database("d", "iox.d", 2)
    r = set_aside(db, 1, 7, "cpu", "write", "ValueError: boom", 100.0)
    assert (r.state, r.attempts, r.detected_at_s) == (HELD, 1, 100.0)
    assert db.held_offsets() == {1: 7} and select(db) == [r] and select(db, 0) == [] and select(db, 1, 8) == []
    assert set_aside(db, 1, 7, "cpu", "write", "again", 101.0) is r and r.attempts == 1  # still held: same record
    r.retry()
    assert db.held_offsets() == {}
    assert set_aside(db, 1, 7, "cpu", "write", "third" * 1000, 102.0) is r
    assert (r.state, r.attempts, r.last_failed_at_s, r.detected_at_s) == (HELD, 2, 102.0, 100.0)
    assert len(r.error) == 2000
    r.retry()
    db.start_applying_at({0: 0, 1: 7})  # applied: nothing of 0, up to 6 of 1
    assert settle_retried(db) == [] and db.poisoned == [r]
    db.start_applying_at({1: 8})  # applied up to 7 of 1
    assert settle_retried(db) == [r] and db.poisoned == []
    a = set_aside(db, 0, 3, "", "delete", "e", 103.0)
    a.accept(104.0)
    assert db.accepted_offsets() == {(0, 3)} and db.held_offsets() == {}
    assert set_aside(db, 0, 3, "", "delete", "e", 105.0) is not a  # an accepted record is never re-held
    db.set_epoch(1, db.seq_origin)  # another write-buffer epoch: the old records no longer apply to its offsets
    assert db.accepted_offsets() == set() and db.held_offsets() == {} and select(db, states=(HELD, ACCEPTED)) == []


def test_accepted_and_lost_records_round_trip_through_their_catalog_entries():
    from iox_spark.catalog.catalog import LostWriteRange, PoisonedMessage

    db = Database("d", "iox.d", 2)
    r = set_aside(db, 1, 7, "cpu", "write", "boom", 100.0)
    r.accept(110.0)
    back = PoisonedMessage.from_entry(r.entry())
    assert (back.partition, back.offset, back.table, back.error, back.state, back.accepted_at_s) == \
        (1, 7, "cpu", "boom", ACCEPTED, 110.0)
    lost = LostWriteRange(0, 5, None, 90.0, "gone", accepted=True, accepted_at_s=95.0, epoch=3)
    assert LostWriteRange.from_entry(lost.entry()) == lost
    open_range = LostWriteRange(0, 5, 9, 90.0, "gone")
    assert LostWriteRange.from_entry(open_range.entry()) == open_range
