"""One assigner at a time (server/pool/assigner_lease.py) against a real local object store, the clock
passed in; and an Assigner standing by, then taking over from what the ingesters own."""
from __future__ import annotations

import pytest

from iox_spark.catalog.object_store import LocalObjectStore
from iox_spark.server.pool.assigner import Assigner
from iox_spark.server.pool.assigner_lease import LEASE_PREFIX, RENEW_MARGIN_S, TAKEOVER_GRACE_S, AssignerLease
from iox_spark.server.pool.assigner_policy import IngesterView

T = 1_700_000_000.0
L = 10.0


@pytest.fixture
def store(tmp_path):
    return LocalObjectStore(str(tmp_path / "objects"))


def test_one_holds_the_other_stands_by_until_the_lease_lapses(store):
    a, b = AssignerLease(store, "a", L), AssignerLease(store, "b", L)
    assert a.hold(T) and a.new_term and a.term == 1
    assert not b.hold(T) and b.seen_holder == a.holder
    for k in range(1, 20):  # a renews every round: b never takes over
        assert a.hold(T + 2 * k) and not a.new_term
        assert not b.hold(T + 2 * k + 1)
    last = T + 38
    assert not b.hold(last + L + TAKEOVER_GRACE_S)  # expired, not past the grace yet
    assert b.hold(last + L + TAKEOVER_GRACE_S + 0.1) and b.new_term and b.term == 2
    assert not a.hold(last + L + TAKEOVER_GRACE_S + 0.2) and a.term is None  # a newer term: a stands by


def test_the_holder_stops_acting_before_its_lease_expires_and_takes_a_new_term_after_a_pause(store):
    a = AssignerLease(store, "a", L)
    assert a.hold(T)
    # paused past its margin: it does not renew the old term, and may not act until the term lapsed
    assert not a.hold(T + L - RENEW_MARGIN_S + 0.1)
    assert not a.hold(T + L + TAKEOVER_GRACE_S)
    assert a.hold(T + L + TAKEOVER_GRACE_S + 0.1) and a.term == 2


def test_of_two_standbys_one_takes_the_lapsed_lease(store):
    a, b, c = (AssignerLease(store, n, L) for n in "abc")
    assert a.hold(T)
    later = T + L + TAKEOVER_GRACE_S + 1
    took = [x.hold(later) for x in (b, c)]
    assert took == [True, False] and b.term == 2 and c.term is None


def test_old_terms_are_deleted_by_the_holders_after_them(store):
    holders = [AssignerLease(store, f"h{i}", L) for i in range(4)]
    for i, h in enumerate(holders):
        assert h.hold(T + i * (L + TAKEOVER_GRACE_S + 1))
    assert sorted(m.key for m in store.list(LEASE_PREFIX)) == [f"{LEASE_PREFIX}{t:020d}.json" for t in (3, 4)]


def test_a_lease_shorter_than_its_margin_is_refused(store):
    with pytest.raises(ValueError):
        AssignerLease(store, "a", RENEW_MARGIN_S)


class _Client:
    def __init__(self, claims: list, address: str):
        self.claims, self.address = claims, address

    def claim_partitions(self, database, partitions, timeout_s):
        self.claims.append((self.address, database, tuple(partitions)))

    def close(self):
        pass


def _assigner(tmp_path, name: str, store, owned: dict, claims: list) -> Assigner:
    """An Assigner over ingesters x and y whose status polls report `owned` ({address: units})."""
    asg = Assigner(["x", "y"], str(tmp_path / f"{name}.json"), lease=AssignerLease(store, name, L))
    asg._clients = {addr: _Client(claims, addr) for addr in ("x", "y")}
    asg.poll = lambda now: ([IngesterView(addr, True, False, now, frozenset(owned[addr])) for addr in ("x", "y")],
                            {u for units in owned.values() for u in units})
    return asg


def test_a_standby_claims_nothing_and_takes_over_what_the_ingesters_own(tmp_path, store):
    owned = {"x": set(), "y": set()}
    claims: list = []
    one, two = _assigner(tmp_path, "one", store, owned, claims), _assigner(tmp_path, "two", store, owned, claims)
    units = {("db", 0), ("db", 1), ("db", 2)}
    one.poll = two.poll = lambda now: ([IngesterView(a, True, False, now, frozenset(owned[a])) for a in ("x", "y")],
                                       set(units))
    one.run_once(T)  # one holds the lease: fewest first, x, y, x
    assert not one.standby and sorted(claims) == [("x", "db", (0, 2)), ("y", "db", (1,))]
    claims.clear()
    # the ingesters took them in another arrangement than one's own record (say, by hand since)
    owned["x"], owned["y"] = {("db", 1)}, {("db", 0), ("db", 2)}
    two.run_once(T + 1)
    assert two.standby and claims == []  # a standby decides nothing
    # one is gone; after the lease lapsed two takes over from what the ingesters own: no claim
    two.run_once(T + L + TAKEOVER_GRACE_S + 1)
    assert not two.standby and claims == []
    assert two.assignments == {("db", 0): "y", ("db", 1): "x", ("db", 2): "y"}
