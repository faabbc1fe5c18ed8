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

Who calls it: the assigner process (server/assigner.py), once per round. Plain values; no clock
(``now`` is passed), no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["IngesterView", "Claim", "Decision", "decide_assignments", "DEFAULT_UNREACHABLE_AFTER_S"]

#: An ingester unreachable this long loses its units to the others.
DEFAULT_UNREACHABLE_AFTER_S = 30.0

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


@dataclass
class Decision:
    #: unit -> address after this round
    assignments: dict = field(default_factory=dict)
    #: the claims to make, one per (address, database)
    claims: list = field(default_factory=list)
    #: units moved this round: unit -> (from address, to address)
    moved: dict = field(default_factory=dict)


def decide_assignments(units, ingesters: list, assignments: dict, pins: dict, now: float,
                       unreachable_after_s: float = DEFAULT_UNREACHABLE_AFTER_S) -> Decision:
    """One round (see the module docstring). ``units``: every (database, kp) the write buffer
    holds; ``ingesters``: the pool in configured order (IngesterView); ``assignments``: unit ->
    address from the rounds before; ``pins``: unit -> address."""
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
    out.assignments = keep
    wanted: dict = {}
    for unit, addr in sorted(keep.items()):
        i = by_addr.get(addr)
        if i is not None and i.active() and unit not in i.owned:
            wanted.setdefault((addr, unit[0]), []).append(unit[1])
    out.claims = [Claim(addr, db, tuple(sorted(kps))) for (addr, db), kps in sorted(wanted.items())]
    return out
