"""Multi-message write requests: which prepared parts are applied, which dropped, and what pins replay.

A write request that becomes more than one write-buffer message (several tables,
or a database-wide delete) is a transaction, so that it is applied whole or not
at all even when the broker or the server fails between its messages:

1. the router produces every message as a *part* (kind ``part``; it names the
   transaction and its coordinator Kafka partition ``q``, the highest partition
   the request touches) and waits for all acknowledgements;
2. it produces the *decision* (kind ``decision``, ``commit``, listing every part
   as ``(kafka partition, offset)``) on ``q``; the request succeeds only when
   Kafka acknowledged it;
3. it produces a *marker* (kind ``marker``, same decision) on every other
   partition that holds a part.

The rule that makes this atomic, and replay-safe, is local to each partition:
**a part's fate is the first decision or marker of its transaction that follows
it on its own partition**; a committed part is applied as if it were written at
that marker's offset (so every partition is still applied in offset order).
The first decision on ``q`` decides for everyone: the router writes commit
markers only after its commit was acknowledged, and a consumer writes markers
only of the first decision it saw. A part whose transaction has no decision
after ``txn_timeout_s`` (measured from the part's Kafka timestamp: its
producer died) gets an ``abort`` decision from the consumer; the router gives
up on its own commit long before that (its produce timeout is far shorter),
which is what keeps a commit from landing behind an abort. In an ingester pool
a member reads only the partitions it owns: a part whose coordinator partition
is another member's waits for a marker that only a reader of its decision can
write, so after ``marker_repair_s`` the member reads the first decision on
``q`` from Kafka (`undecided_elsewhere`, `learn_decision`) and writes the
markers itself (also when that decision is the abort it wrote).

Replay after a crash sees the same records, so it reaches the same fates, as
long as three things are still replayed:
- a part that has no marker yet (``pinned_offsets``: its partition's
  checkpoint stays at or below it);
- a commit decision whose parts elsewhere have not yet met their marker (the
  consumer may have to write those markers again after a crash);
- a committed part whose rows may not be persisted yet (`applied_part_pins`):
  its rows sit in the persistence windows at the marker's offset, later than
  the part itself, so a checkpoint that only followed the windows could start
  replay between the part and its marker, and the marker would find no part.

`TxnLog` is the consumer's state of one database. Pure: the caller passes the
records of a micro-batch (in any order; it sorts them), the applied offsets and
``now``; it returns what to apply and drop, and `due_repairs` says which markers
or abort decisions the consumer must produce. Not thread-safe: the caller locks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TxnRecord", "TxnResolution", "TxnRepair", "TxnLog", "PART", "DECISION", "MARKER", "COMMIT",
           "ABORT", "TXN_KINDS", "DEFAULT_TXN_TIMEOUT_S", "DEFAULT_MARKER_REPAIR_S"]

PART = "part"
DECISION = "decision"
MARKER = "marker"
TXN_KINDS = (PART, DECISION, MARKER)
COMMIT = "commit"
ABORT = "abort"
#: A part with no decision this long after its Kafka timestamp is aborted by the consumer.
DEFAULT_TXN_TIMEOUT_S = 60.0
#: A commit decision seen this long ago whose parts still have no marker: the consumer writes the markers.
DEFAULT_MARKER_REPAIR_S = 5.0


@dataclass(frozen=True)
class TxnRecord:
    """One transaction message of a micro-batch (from its metadata; the payload stays in Spark)."""

    kp: int
    offset: int
    kind: str  # PART | DECISION | MARKER
    txn: str
    ts_ms: int = 0
    #: PART: the coordinator Kafka partition (where the decision goes)
    coordinator_kp: int = -1
    #: DECISION / MARKER: COMMIT | ABORT
    decision: str = ""
    #: DECISION: every part of the transaction as (kafka partition, offset)
    parts: tuple = ()


@dataclass
class TxnResolution:
    #: (kp, part offset) -> offset of the marker that committed it (the part is applied there)
    commit: dict = field(default_factory=dict)
    #: (kp, part offset) of parts dropped by an abort
    abort: set = field(default_factory=set)


@dataclass(frozen=True)
class TxnRepair:
    """A control message the consumer must produce: a MARKER on `kp`, or an abort DECISION on `kp`."""

    kind: str  # MARKER | DECISION
    kp: int
    txn: str
    decision: str


@dataclass
class _Pending:
    txn: str
    coordinator_kp: int
    ts_ms: int


@dataclass
class _Pin:
    kp: int
    offset: int
    #: parts elsewhere still without a marker: (kp, offset)
    waiting: set


class TxnLog:
    """Per database, on the driver: pending parts, decisions seen, pinned decisions."""

    def __init__(self):
        #: (kp, offset) -> _Pending: parts seen, no marker yet
        self.pending: dict = {}
        #: txn -> (decision, seen_at_s): the first decision seen this run (kept while it matters)
        self.decisions: dict = {}
        #: txn -> _Pin: a commit decision that must stay replayable
        self.pins: dict = {}
        #: (kp, part offset) -> offset it was applied at (its marker's): committed parts whose rows
        #: may not be persisted yet (see `applied_part_pins`)
        self.applied_parts: dict = {}
        #: (kind, kp, txn) -> when this run last produced that repair
        self._repaired_at: dict = {}

    # -- a micro-batch ---------------------------------------------------------------
    def apply_batch(self, records: list[TxnRecord], hi_after: dict, now_s: float) -> TxnResolution:
        """Applies a micro-batch's transaction records.

        ``hi_after``: {kp: highest offset applied once this batch is applied}, for every
        partition read so far (a partition missing counts as nothing read). Returns
        which parts (of this batch or pending from earlier ones) to apply or drop.
        """
        out = TxnResolution()
        decided = []
        for r in sorted(records, key=lambda r: (r.kp, r.offset)):
            if r.kind == PART:
                self.pending[(r.kp, r.offset)] = _Pending(r.txn, r.coordinator_kp, r.ts_ms)
                continue
            # a decision or marker is the marker of the parts before it on its own partition
            for key in [k for k, p in self.pending.items() if p.txn == r.txn and k[0] == r.kp and k[1] < r.offset]:
                del self.pending[key]
                if r.decision == COMMIT:
                    out.commit[key] = r.offset
                    self.applied_parts[key] = r.offset
                else:
                    out.abort.add(key)
                pin = self.pins.get(r.txn)
                if pin is not None:
                    pin.waiting.discard(key)
            if r.kind == DECISION and r.txn not in self.decisions:
                self.decisions[r.txn] = (r.decision, now_s)
                decided.append(r)
        for r in decided:
            if r.decision != COMMIT:
                continue
            waiting = {(kp, off) for kp, off in r.parts
                       if kp != r.kp and ((kp, off) in self.pending or off > hi_after.get(kp, -1))}
            if waiting:
                self.pins[r.txn] = _Pin(r.kp, r.offset, waiting)
        self._forget_settled()
        return out

    def _forget_settled(self) -> None:
        for txn, pin in list(self.pins.items()):
            if not pin.waiting:
                del self.pins[txn]
        busy = {p.txn for p in self.pending.values()} | set(self.pins)
        for txn in [t for t in self.decisions if t not in busy]:
            del self.decisions[txn]
        for key in [k for k in self._repaired_at if k[2] not in busy]:
            del self._repaired_at[key]

    def adopt_repairs_of(self, other: "TxnLog") -> None:
        """Keeps `other`'s record of repairs already produced, and the decisions it learned from
        Kafka (`learn_decision`) of transactions still pending here (the consumer computes a batch
        on a copy while the repair thread works on the installed log)."""
        for key, at in other._repaired_at.items():
            self._repaired_at[key] = max(at, self._repaired_at.get(key, at))
        busy = {p.txn for p in self.pending.values()}
        for txn, known in other.decisions.items():
            if txn in busy and txn not in self.decisions:
                self.decisions[txn] = known

    # -- what must stay replayable ------------------------------------------------------
    def pinned_offsets(self) -> dict[int, int]:
        """{kp: lowest offset replay must still read}: pending parts and pinned commit decisions."""
        out: dict[int, int] = {}
        for (kp, off) in self.pending:
            out[kp] = min(out.get(kp, off), off)
        for pin in self.pins.values():
            out[pin.kp] = min(out.get(pin.kp, pin.offset), pin.offset)
        return out

    def applied_part_pins(self, unpersisted_lo: dict[int, int]) -> dict[int, int]:
        """{kp: lowest part offset replay must still read} for the committed parts applied at or
        above `unpersisted_lo` ({kp: lowest offset whose rows may be unpersisted}; a partition
        missing: everything on it persisted): their rows may not be in Parquet, and replay must read
        the part again to apply them. Called by persist while it builds the checkpoint."""
        out: dict[int, int] = {}
        for (kp, off), applied_at in self.applied_parts.items():
            lo = unpersisted_lo.get(kp)
            if lo is not None and applied_at >= lo:
                out[kp] = min(out.get(kp, off), off)
        return out

    def forget_persisted_parts(self, unpersisted_lo: dict[int, int], applied_hi_inclusive: dict[int, int]) -> None:
        """Drops the committed parts `applied_part_pins(unpersisted_lo)` did not pin: their rows are
        persisted. Called once the checkpoint built with the same `unpersisted_lo` is committed;
        `applied_hi_inclusive` is what was applied when it was built (parts applied later stay)."""
        for (kp, off), applied_at in list(self.applied_parts.items()):
            lo = unpersisted_lo.get(kp)
            if applied_at <= applied_hi_inclusive.get(kp, -1) and (lo is None or applied_at < lo):
                del self.applied_parts[(kp, off)]

    def is_idle(self) -> bool:
        return not self.pending and not self.pins

    # -- repairs the consumer produces -----------------------------------------------------
    def undecided_elsewhere(self, now_s: float, reads_kp, marker_repair_s: float = DEFAULT_MARKER_REPAIR_S
                            ) -> list[tuple[str, int, int]]:
        """[(txn, coordinator kp, earliest part Kafka timestamp in ms)] of pending parts whose
        transaction has no decision seen here, whose coordinator partition this consumer does not
        read (``reads_kp(kp)`` is False: an ingester pool's other member owns it, so its decision,
        and the markers that member writes of it, never reach this consumer's TxnLog), and that are
        at least ``marker_repair_s`` old. The caller reads the first decision from Kafka and passes
        it to `learn_decision`. Each transaction at most every ``marker_repair_s``."""
        first: dict = {}
        for p in self.pending.values():
            if p.txn in self.decisions or reads_kp(p.coordinator_kp) or now_s - p.ts_ms / 1000.0 < marker_repair_s:
                continue
            q, ts = first.get(p.txn, (p.coordinator_kp, p.ts_ms))
            first[p.txn] = (q, min(ts, p.ts_ms))
        due = []
        for txn, (q, ts) in sorted(first.items()):
            key = ("lookup", q, txn)
            last = self._repaired_at.get(key)
            if last is not None and now_s - last < marker_repair_s:
                continue
            self._repaired_at[key] = now_s
            due.append((txn, q, ts))
        return due

    def learn_decision(self, txn: str, decision: str, now_s: float,
                       marker_repair_s: float = DEFAULT_MARKER_REPAIR_S) -> None:
        """The first decision of `txn` on its coordinator partition, read from Kafka because this
        consumer does not read that partition (`undecided_elsewhere`): the markers of its parts
        pending here are due at once (the first decision decides for everyone, whoever repeats
        it)."""
        if txn not in self.decisions and any(p.txn == txn for p in self.pending.values()):
            self.decisions[txn] = (decision, now_s - marker_repair_s)

    def due_repairs(self, now_s: float, txn_timeout_s: float = DEFAULT_TXN_TIMEOUT_S,
                    marker_repair_s: float = DEFAULT_MARKER_REPAIR_S) -> list[TxnRepair]:
        """Markers for parts whose decision is known but whose marker has not come (abort at
        once, commit after ``marker_repair_s``; a part not read yet is repaired once it is
        pending), and abort decisions for parts older than
        ``txn_timeout_s`` with no decision. A repair is repeated at most every ``marker_repair_s``."""
        out: dict = {}
        for (kp, _off), p in self.pending.items():
            known = self.decisions.get(p.txn)
            if known is not None:
                decision, seen_at = known
                if decision == ABORT or now_s - seen_at >= marker_repair_s:
                    out.setdefault((MARKER, kp, p.txn), TxnRepair(MARKER, kp, p.txn, decision))
            elif now_s - p.ts_ms / 1000.0 >= txn_timeout_s:
                out.setdefault((DECISION, p.coordinator_kp, p.txn), TxnRepair(DECISION, p.coordinator_kp, p.txn, ABORT))
        due = []
        for key, rep in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
            last = self._repaired_at.get(key)
            if last is not None and now_s - last < marker_repair_s:
                continue
            self._repaired_at[key] = now_s
            due.append(rep)
        return due
