"""The assigner's pure decisions: fewest first, pins, handoff, no move without cause."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.server.pool.assigner_policy import Claim, IngesterView, RebalanceRules, decide_assignments

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


# -- rebalancing ---------------------------------------------------------------------------------

DB4 = [("db", kp) for kp in range(4)]


def _owning(assignments: dict, addrs, **kw):
    """Ingesters that each own what `assignments` gives them."""
    return [_ing(a, owned={u for u, x in assignments.items() if x == a}, **kw) for a in addrs]


def test_a_member_that_joins_gets_partitions_one_at_a_time_no_faster_than_the_interval() -> None:
    at = {u: "a" for u in DB4}
    rules = RebalanceRules(min_interval_s=60.0, last_move_s=None)
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW, rebalance=rules)
    assert d.rebalanced == ("db", 0) and d.moved == {("db", 0): ("a", "b")} and d.claims == [Claim("b", "db", (0,))]
    at = d.assignments
    # the claim has not reached b yet: nothing more moves
    pool = [_ing("a", owned={u for u, x in at.items() if x == "a"}), _ing("b")]
    d = decide_assignments(DB4, pool, at, {}, NOW + 100, rebalance=RebalanceRules(last_move_s=NOW))
    assert d.rebalanced is None and d.moved == {}
    # owned where assigned, but within the interval of the last move: nothing
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW + 59, rebalance=RebalanceRules(last_move_s=NOW))
    assert d.rebalanced is None and d.moved == {}
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW + 60, rebalance=RebalanceRules(last_move_s=NOW))
    assert d.moved == {("db", 1): ("a", "b")}
    at = d.assignments
    # 2 and 2: balanced
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW + 500, rebalance=RebalanceRules(last_move_s=NOW))
    assert d.rebalanced is None and d.moved == {} and d.assignments == at


def test_without_rebalance_rules_nothing_moves_for_load() -> None:
    at = {u: "a" for u in DB4}
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW)
    assert d.moved == {} and d.assignments == at


def test_the_busiest_member_gives_a_partition_to_the_idlest_when_the_counts_allow() -> None:
    at = {("db", 0): "a", ("db", 1): "a", ("db", 2): "b"}
    rates = {("db", 0): 100.0, ("db", 1): 300.0, ("db", 2): 10.0}
    d = decide_assignments(list(at), _owning(at, ["a", "b"]), at, {}, NOW, rebalance=RebalanceRules(rates=rates))
    # moving db/0 leaves max(300, 110) = 300 <= 0.9 x 400; db/1 would leave max(100, 310) = 310
    assert d.moved == {("db", 0): ("a", "b")} and d.rebalanced == ("db", 0)
    # under the skew: nothing
    rates = {("db", 0): 100.0, ("db", 1): 100.0, ("db", 2): 150.0}
    d = decide_assignments(list(at), _owning(at, ["a", "b"]), at, {}, NOW, rebalance=RebalanceRules(rates=rates))
    assert d.moved == {}


def test_a_rate_move_never_spreads_the_counts_by_two() -> None:
    at = {("db", 0): "a", ("db", 1): "a", ("db", 2): "b", ("db", 3): "b"}
    rates = {("db", 0): 500.0, ("db", 1): 500.0, ("db", 2): 1.0, ("db", 3): 1.0}
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, {}, NOW, rebalance=RebalanceRules(rates=rates))
    assert d.moved == {}  # 1 and 3 partitions would be moved back by the count rule


def test_pinned_partitions_stay_and_a_handoff_round_moves_nothing_for_load() -> None:
    at = {u: "a" for u in DB4}
    pins = {("db", 0): "a", ("db", 1): "a", ("db", 2): "a"}
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, pins, NOW, rebalance=RebalanceRules())
    assert d.moved == {("db", 3): ("a", "b")}
    at = d.assignments
    d = decide_assignments(DB4, _owning(at, ["a", "b"]), at, pins, NOW + 100,
                           rebalance=RebalanceRules(last_move_s=NOW))
    assert d.moved == {}  # 3 and 1, but every partition a holds is pinned there
    before = {("db", 0): "a", ("db", 1): "c", ("db", 2): "c", ("db", 3): "c"}
    pool = _owning(before, ["a", "b"]) + [_ing("c", frozen=True, owned={u for u in DB4 if before[u] == "c"})]
    d = decide_assignments(DB4, pool, before, {}, NOW, rebalance=RebalanceRules())
    assert d.rebalanced is None and set(d.moved) == {("db", 1), ("db", 2), ("db", 3)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), min_size=1, max_size=12),
       st.integers(min_value=2, max_value=4), st.lists(st.integers(min_value=0, max_value=3), min_size=12, max_size=12))
def test_with_steady_rates_rebalancing_settles(rate_list, members, start) -> None:
    """Rounds with every claim settled and the interval passed: the moves stop, the counts end
    within one of each other, and no partition goes back to where it was just moved from."""
    addrs = ["m%d" % i for i in range(members)]
    units = [("db", kp) for kp in range(len(rate_list))]
    rates = dict(zip(units, rate_list))
    at = {u: addrs[start[i] % members] for i, u in enumerate(units)}
    moves, t = [], NOW
    for _ in range(60):
        t += 60
        d = decide_assignments(units, _owning(at, addrs), at, {}, t,
                               rebalance=RebalanceRules(last_move_s=t - 60, rates=rates))
        if d.rebalanced is None:
            break
        moves.append((d.rebalanced, *d.moved[d.rebalanced]))
        at = d.assignments
    else:
        raise AssertionError(f"still moving after 60 rounds: {moves[-6:]}")
    counts = [sum(1 for x in at.values() if x == a) for a in addrs]
    assert max(counts) - min(counts) <= 1
    for (u1, src1, dst1), (u2, src2, dst2) in zip(moves, moves[1:]):
        assert not (u1 == u2 and src2 == dst1 and dst2 == src1), moves
