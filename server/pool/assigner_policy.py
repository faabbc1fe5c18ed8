"""The assigner's decisions: which ingester of the pool owns each (database, Kafka partition).

Invariants (the IPNI assigner service, on our write buffer; pure: state in, decisions out):

- Every unit (a database's Kafka partition) the write buffer holds is assigned to exactly one
  ingester of the configured pool, once one is active (reachable and not frozen).
- A pinned unit goes to its pinned ingester whenever that one is active, and nowhere else.
- An unassigned unit goes to the active ingester with the fewest units (assignments to every
  ingester of the pool count, also to one unreachable for now, so its share is not piled onto
  the others while it is briefly away); ties go to the first in the configured order.
- Handoff: the units of a frozen ingester, of one not in the pool any more, and of one
  unreachable for at least ``unreachable_after_s`` move to active ingesters, one at a time by the
  same rule. A unit stays where it is otherwise: a restarted assigner moves nothing.
- A unit whose assigned ingester does not report owning it (it restarted, or the claim has not
  reached it yet) is claimed for it again; the claim is idempotent in effect (the ingester
  resumes at the catalog's checkpoint).
- Rebalancing (``rebalance`` given): in a round that hands nothing off, while every unit is owned
  where it is assigned and at least ``RebalanceRules.min_interval_s`` after the last rebalancing
  move, one unpinned unit moves between active ingesters: from the one with the most units to
  the one with the fewest when they differ by two or more (a member joined), else from the one
  applying the most messages per second to the one applying the fewest, when the first applies at
  least ``rate_skew`` times as many (and at least ``_MIN_RATE_PER_S``), the move lowers the higher
  of the two by at least ``_MIN_RATE_GAIN`` and leaves the active ingesters' unit counts within
  one of each other. Each
  move lowers the busiest load or the count spread, so with steady rates no unit moves back and
  forth.

Who calls it: the assigner process (server/pool/assigner.py), once per round. Plain values; no clock
(``now`` is passed), no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["IngesterView", "Claim", "Decision", "RebalanceRules", "decide_assignments", "DEFAULT_UNREACHABLE_AFTER_S",
           "DEFAULT_REBALANCE_INTERVAL_S", "DEFAULT_REBALANCE_RATE_SKEW"]

#: An ingester unreachable this long loses its units to the others.
DEFAULT_UNREACHABLE_AFTER_S = 30.0
#: The least time between two rebalancing moves (a handed-over partition replays from its last
#: persist on its new owner: moves are paced so that each settles first).
DEFAULT_REBALANCE_INTERVAL_S = 60.0
#: A rate move needs the busiest active ingester to apply at least this times the least busy one's
#: messages per second.
DEFAULT_REBALANCE_RATE_SKEW = 1.5
#: ... and must lower the higher load of the two by at least this fraction ...
_MIN_RATE_GAIN = 0.1
#: ... and the busiest must apply at least this many messages per second (below, nothing is gained).
_MIN_RATE_PER_S = 1.0

Unit = tuple  # (database, kafka partition)


@dataclass(frozen=True)
class IngesterView:
    """What the assigner knows of one ingester of the pool (by its address)."""

    address: str
    #: answered the last status poll
    reachable: bool
    #: reported frozen (server/write_buffer/freeze.py)
    frozen: bool = False
    #: wall time (s) of its last answer; None: never answered
    last_seen_s: float | None = None
    #: the units it reports owning (from its status)
    owned: frozenset = frozenset()

    def active(self) -> bool:
        return self.reachable and not self.frozen


@dataclass(frozen=True)
class Claim:
    """Ask ``address`` to claim ``partitions`` of ``database``."""

    address: str
    database: str
    partitions: tuple


@dataclass(frozen=True)
class RebalanceRules:
    """When the assigner moves a unit only to spread the load (see the module docstring)."""

    #: the least seconds between two rebalancing moves
    min_interval_s: float = DEFAULT_REBALANCE_INTERVAL_S
    #: the busiest ingester's rate over the least busy one's that a rate move needs
    rate_skew: float = DEFAULT_REBALANCE_RATE_SKEW
    #: wall time (s) of the last rebalancing move; None: none yet
    last_move_s: float | None = None
    #: unit -> messages per second its owner applies (units not named count 0)
    rates: dict = field(default_factory=dict)


@dataclass
class Decision:
    #: unit -> address after this round
    assignments: dict = field(default_factory=dict)
    #: the claims to make, one per (address, database)
    claims: list = field(default_factory=list)
    #: units moved this round: unit -> (from address, to address)
    moved: dict = field(default_factory=dict)
    #: the unit this round moved to spread the load (also in `moved`), or None
    rebalanced: tuple | None = None


def decide_assignments(units, ingesters: list, assignments: dict, pins: dict, now: float,
                       unreachable_after_s: float = DEFAULT_UNREACHABLE_AFTER_S,
                       rebalance: RebalanceRules | None = None) -> Decision:
    """One round (see the module docstring). ``units``: every (database, kp) the write buffer
    holds; ``ingesters``: the pool in configured order (IngesterView); ``assignments``: unit ->
    address from the rounds before; ``pins``: unit -> address; ``rebalance``: None moves units
    only to hand them off."""
    by_addr = {i.address: i for i in ingesters}
    order = {i.address: n for n, i in enumerate(ingesters)}
    out = Decision()
    count = {i.address: 0 for i in ingesters}
    keep: dict = {}
    todo: list = []

    def gone(addr: str) -> bool:
        i = by_addr.get(addr)
        if i is None or i.frozen:
            return True
        if i.reachable:
            return False
        return i.last_seen_s is None or now - i.last_seen_s >= unreachable_after_s

    for unit in sorted(set(units)):
        pinned = pins.get(unit)
        current = assignments.get(unit)
        if pinned is not None and pinned in by_addr:
            if by_addr[pinned].active() or (current == pinned and not gone(pinned)):
                keep[unit] = pinned
                count[pinned] += 1
                if current is not None and current != pinned:
                    out.moved[unit] = (current, pinned)
            elif current is not None and current in by_addr and not gone(current):
                keep[unit] = current  # its pin is away: where it is until the pin is back
                count[current] += 1
            else:
                todo.append(unit)
            continue
        if current is not None and current in by_addr and not gone(current):
            keep[unit] = current
            count[current] += 1
        else:
            todo.append(unit)
    active = [i.address for i in ingesters if i.active()]
    for unit in todo:
        if not active:
            if unit in assignments:
                keep[unit] = assignments[unit]  # nowhere to go: the record stays
            continue
        target = min(active, key=lambda a: (count[a], order[a]))
        keep[unit] = target
        count[target] += 1
        if assignments.get(unit) is not None and assignments[unit] != target:
            out.moved[unit] = (assignments[unit], target)
    if rebalance is not None and not out.moved:
        move = _rebalancing_move(keep, by_addr, [i.address for i in ingesters if i.active()], order, pins, now,
                                 rebalance)
        if move is not None:
            unit, src, dst = move
            keep[unit] = dst
            out.moved[unit] = (src, dst)
            out.rebalanced = unit
    out.assignments = keep
    wanted: dict = {}
    for unit, addr in sorted(keep.items()):
        i = by_addr.get(addr)
        if i is not None and i.active() and unit not in i.owned:
            wanted.setdefault((addr, unit[0]), []).append(unit[1])
    out.claims = [Claim(addr, db, tuple(sorted(kps))) for (addr, db), kps in sorted(wanted.items())]
    return out


def _rebalancing_move(keep: dict, by_addr: dict, active: list, order: dict, pins: dict, now: float,
                      rules: RebalanceRules) -> tuple | None:
    """(unit, from, to) of the round's rebalancing move (see the module docstring), or None."""
    if len(active) < 2 or (rules.last_move_s is not None and now - rules.last_move_s < rules.min_interval_s):
        return None
    if any(unit not in by_addr[addr].owned for unit, addr in keep.items() if addr in by_addr):
        return None  # a claim or a handoff has not settled yet
    units_of: dict = {a: [] for a in active}
    for unit, addr in keep.items():
        if addr in units_of:
            units_of[addr].append(unit)
    movable = {a: sorted(u for u in us if pins.get(u) is None) for a, us in units_of.items()}
    rate = rules.rates.get

    def cheapest_first(a: str) -> list:
        return sorted(movable[a], key=lambda u: (rate(u, 0.0), u))

    count = {a: len(us) for a, us in units_of.items()}
    src = max(active, key=lambda a: (count[a], -order[a]))
    dst = min(active, key=lambda a: (count[a], order[a]))
    if count[src] - count[dst] >= 2 and movable[src]:
        return cheapest_first(src)[0], src, dst
    load = {a: sum(rate(u, 0.0) for u in us) for a, us in units_of.items()}
    src = max(active, key=lambda a: (load[a], -order[a]))
    dst = min(active, key=lambda a: (load[a], order[a]))
    if load[src] < _MIN_RATE_PER_S or load[src] < rules.rate_skew * load[dst]:
        return None
    spread_after = {**count, src: count[src] - 1, dst: count[dst] + 1}
    if max(spread_after.values()) - min(spread_after.values()) > 1:
        return None  # the count rule would move a unit back
    best = None
    for unit in cheapest_first(src):
        higher = max(load[src] - rate(unit, 0.0), load[dst] + rate(unit, 0.0))
        if higher < load[src] and higher <= (1 - _MIN_RATE_GAIN) * load[src] and (best is None or higher < best[0]):
            best = (higher, unit)
    return None if best is None else (best[1], src, dst)
