"""The assigner's pure decisions: fewest first, pins, handoff, no move without cause."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.assigner_policy import Claim, IngesterView, decide_assignments

NOW = 1000.0


def _ing(addr, reachable=True, frozen=False, last_seen=NOW, owned=()):
    return IngesterView(addr, reachable, frozen, last_seen, frozenset(owned))


UNITS = [("db", kp) for kp in range(4)] + [("other", 0)]


def test_unassigned_units_go_to_the_active_ingester_with_the_fewest() -> None:
    d = decide_assignments(UNITS, [_ing("a"), _ing("b"), _ing("c", frozen=True)], {}, {}, NOW)
    assert d.assignments == {("db", 0): "a", ("db", 1): "b", ("db", 2): "a", ("db", 3): "b", ("other", 0): "a"}
    assert d.claims == [Claim("a", "db", (0, 2)), Claim("a", "other", (0,)), Claim("b", "db", (1, 3))]
    assert d.moved == {}


def test_nothing_moves_without_cause_and_owned_units_are_not_claimed_again() -> None:
    first = decide_assignments(UNITS, [_ing("a"), _ing("b")], {}, {}, NOW).assignments
    owned = {addr: {u for u, x in first.items() if x == addr} for addr in ("a", "b")}
    d = decide_assignments(UNITS, [_ing("a", owned=owned["a"]), _ing("b", owned=owned["b"])], first, {}, NOW)
    assert d.assignments == first and d.claims == [] and d.moved == {}
    # a restarted ingester that does not report its units yet gets them claimed again, where they are
    d = decide_assignments(UNITS, [_ing("a"), _ing("b", owned=owned["b"])], first, {}, NOW)
    assert d.assignments == first and d.claims == [Claim("a", "db", (0, 2)), Claim("a", "other", (0,))]


def test_a_frozen_ingesters_units_are_handed_off_one_by_one_to_the_fewest() -> None:
    before = {("db", 0): "a", ("db", 1): "a", ("db", 2): "b", ("db", 3): "c", ("other", 0): "a"}
    d = decide_assignments(UNITS, [_ing("a", frozen=True), _ing("b"), _ing("c")], before, {}, NOW)
    assert d.moved == {("db", 0): ("a", "b"), ("db", 1): ("a", "c"), ("other", 0): ("a", "b")}
    assert set(d.assignments.values()) == {"b", "c"}


def test_an_unreachable_ingester_keeps_its_units_until_the_grace_passed_and_is_not_piled_onto() -> None:
    before = {("db", 0): "a", ("db", 1): "b"}
    pool = [_ing("a", reachable=False, last_seen=NOW - 10), _ing("b")]
    d = decide_assignments(UNITS, pool, before, {}, NOW, unreachable_after_s=30)
    assert d.assignments[("db", 0)] == "a" and d.moved == {}
    # a's share counts: the new units go to b only until b has more than a
    assert d.assignments[("db", 2)] == "b"
    pool = [_ing("a", reachable=False, last_seen=NOW - 31), _ing("b")]
    d = decide_assignments(UNITS, pool, before, {}, NOW, unreachable_after_s=30)
    assert set(d.assignments.values()) == {"b"} and d.moved == {("db", 0): ("a", "b")}


def test_pins_are_honoured_while_their_ingester_is_active() -> None:
    pins = {("db", 3): "c"}
    d = decide_assignments(UNITS, [_ing("a"), _ing("b"), _ing("c")], {}, pins, NOW)
    assert d.assignments[("db", 3)] == "c"
    d = decide_assignments(UNITS, [_ing("a"), _ing("b"), _ing("c", frozen=True)], d.assignments, pins, NOW)
    assert d.assignments[("db", 3)] in ("a", "b") and d.moved[("db", 3)][0] == "c"
    back = decide_assignments(UNITS, [_ing("a"), _ing("b"), _ing("c")], d.assignments, pins, NOW)
    assert back.assignments[("db", 3)] == "c" and back.moved[("db", 3)][1] == "c"


def test_with_no_active_ingester_the_record_stays() -> None:
    before = {("db", 0): "a"}
    d = decide_assignments(UNITS, [_ing("a", frozen=True)], before, {}, NOW)
    assert d.assignments == before and d.claims == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 100)), min_size=1, max_size=4),
       st.dictionaries(st.integers(0, 7), st.integers(0, 3), max_size=8),
       st.dictionaries(st.integers(0, 7), st.integers(0, 3), max_size=2))
def test_every_unit_ends_on_an_active_ingester_and_a_second_round_moves_nothing(flags, before, pins) -> None:
    pool = [_ing(f"i{n}", reachable=r, frozen=f, last_seen=NOW - age) for n, (r, f, age) in enumerate(flags)]
    addrs = [i.address for i in pool]
    units = [("db", kp) for kp in range(8)]
    prev = {("db", kp): addrs[n % len(addrs)] for kp, n in before.items()}
    pin = {("db", kp): addrs[n % len(addrs)] for kp, n in pins.items()}
    d = decide_assignments(units, pool, prev, pin, NOW, unreachable_after_s=30)
    active = [i.address for i in pool if i.active()]
    if active:
        for unit in units:
            a = d.assignments[unit]
            i = next(x for x in pool if x.address == a)
            # active, or reachable-but-away within the grace (kept), never frozen
            assert not i.frozen and (i.reachable or NOW - i.last_seen_s < 30), (unit, a)
            if unit in pin and next(x for x in pool if x.address == pin[unit]).active():
                assert a == pin[unit]
    owned = {a: frozenset(u for u, x in d.assignments.items() if x == a) for a in addrs}
    pool2 = [IngesterView(i.address, i.reachable, i.frozen, i.last_seen_s, owned[i.address]) for i in pool]
    again = decide_assignments(units, pool2, d.assignments, pin, NOW, unreachable_after_s=30)
    assert again.assignments == d.assignments and again.moved == {} and again.claims == []
