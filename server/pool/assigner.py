"""The assigner: a small process that gives each (database, Kafka partition) to one ingester of a pool.

It is not on the write path: writes go to any ingester, which produces them to Kafka; the
assigner only decides who applies each partition. Every round (`interval_s`) it asks each
configured ingester for its status (reachable? frozen? which partitions does it own? which
databases does it know?), decides with `assigner_policy.decide_assignments` (fewest first, pins,
handoff of a frozen, removed or long-unreachable ingester's partitions), asks the chosen
ingesters to claim what they do not own yet (the ClaimPartitions admin call, which commits the
claim to the database's preserved catalog and so fences the previous owner), and saves its
assignments. Between handoffs it spreads the load (`rebalance`, on unless `--no-rebalance`):
one partition at a time, at most one every `--rebalance-interval-s`, from the member with the
most partitions to one with two fewer (a member joined), else from the member applying the most
messages per second to the one applying the fewest (rates measured from the applied offsets the
members report, round after round).

With `--object-store`, assigners of one pool share a lease (server/pool/assigner_lease.py): one acts,
the others stand by (they poll, decide nothing) and one of them takes over once the active
one's lease lapses, starting from what the ingesters report owning.

Invariant: the saved assignments are the last round's decision; a restarted assigner loads them
and moves nothing that has no cause (an ingester unreachable at its start gets the full grace
from that start; nothing moves for load before one rebalancing interval passed). The assigner
holds no data: losing its state file only means the next round assigns from scratch (owners
keep what the catalogs say they own, reclaimed where decided).

State file (JSON, ``format_version`` 1): ``{"format_version": 1, "assignments": [[database,
kafka partition, address], ...]}``.

When it runs: `iox assigner`, from start until SIGTERM/SIGINT. Its own process; talks gRPC only.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import grpc

from iox_spark.iox import management_pb2

from iox_spark.server.api.client import IoxClient
from iox_spark.server.pool.assigner_policy import (DEFAULT_REBALANCE_INTERVAL_S, DEFAULT_UNREACHABLE_AFTER_S, Decision, IngesterView,
                                    RebalanceRules, decide_assignments)
from iox_spark.server.errors import ServerError

__all__ = ["Assigner", "AssignerStateCorrupt", "parse_pins", "STATE_FORMAT_VERSION", "DEFAULT_INTERVAL_S",
           "STATUS_TIMEOUT_S"]

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 1
#: Seconds between rounds.
DEFAULT_INTERVAL_S = 2.0
#: An ingester that does not answer its status within this counts as unreachable this round.
STATUS_TIMEOUT_S = 5.0
#: The latest partition moves `status` shows.
_MOVES_KEPT = 50
#: A claim (the ingester restarts its stream around it) may take this long.
CLAIM_TIMEOUT_S = 120.0
#: Weight of the newest measurement in a partition's applied rate (an exponential moving average
#: over rounds: with 2 s rounds, a change of rate shows mostly within ~10 s).
_RATE_WEIGHT = 0.2


class AssignerStateCorrupt(ServerError):
    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"assigner state {path}: {reason}; remove it to assign from scratch")


def parse_pins(specs, pool: list) -> dict:
    """{(database, kp): address} from ``db:partition=host:port`` specs; every address must be in ``pool``."""
    out = {}
    for spec in specs or ():
        unit, sep, addr = spec.partition("=")
        db, sep2, kp = unit.rpartition(":")
        if not sep or not sep2 or not db or not kp.isdigit() or not addr:
            raise ValueError(f"pin {spec!r} is not database:partition=host:port")
        if addr not in pool:
            raise ValueError(f"pin {spec!r} names {addr}, which is not one of --ingesters {','.join(pool)}")
        out[(db, int(kp))] = addr
    return out


def _load_state(path: str) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise AssignerStateCorrupt(path, f"not readable JSON ({e})") from e
    if not isinstance(obj, dict) or obj.get("format_version") != STATE_FORMAT_VERSION:
        raise AssignerStateCorrupt(path, f"format version {obj.get('format_version') if isinstance(obj, dict) else None!r}, "
                                         f"this assigner reads {STATE_FORMAT_VERSION}")
    out = {}
    for entry in obj.get("assignments", []):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and isinstance(entry[2], str)):
            raise AssignerStateCorrupt(path, f"assignment {entry!r} is not [database, partition, address]")
        out[(entry[0], entry[1])] = entry[2]
    return out


def _save_state(path: str, assignments: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"format_version": STATE_FORMAT_VERSION,
                   "assignments": [[db, kp, addr] for (db, kp), addr in sorted(assignments.items())]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _owned_by(views: list) -> dict:
    """{unit: address} of the units exactly one reachable ingester reports owning."""
    seen: dict = {}
    for v in views:
        if v.reachable:
            for unit in v.owned:
                seen.setdefault(unit, []).append(v.address)
    return {unit: addrs[0] for unit, addrs in seen.items() if len(addrs) == 1}


class Assigner:
    """One assigner for a pool of ingesters (their gRPC addresses, in order)."""

    def __init__(self, ingesters: list, state_path: str, pins: dict | None = None, token: str | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 unreachable_after_s: float = DEFAULT_UNREACHABLE_AFTER_S, lease=None, rebalance: bool = True,
                 rebalance_interval_s: float = DEFAULT_REBALANCE_INTERVAL_S):
        """`lease`: the pool's AssignerLease (server/pool/assigner_lease.py), or None: this assigner acts
        alone (only one may run). `rebalance`: spread the load between handoffs (module docstring),
        at most one move every `rebalance_interval_s`."""
        if not ingesters or len(set(ingesters)) != len(ingesters):
            raise ValueError(f"--ingesters must name distinct addresses, got {ingesters!r}")
        self.ingesters = list(ingesters)
        self.state_path = state_path
        self.pins = dict(pins or {})
        self.interval_s = interval_s
        self.unreachable_after_s = unreachable_after_s
        self.assignments = _load_state(state_path)
        self._clients = {a: IoxClient(a, token=token) for a in self.ingesters}
        started = time.time()
        #: an ingester not seen since this assigner started gets the grace from the start
        self._last_seen = {a: started for a in self.ingesters}
        self._stop = threading.Event()
        self.lease = lease
        #: the last round stood by: another assigner holds the lease
        self.standby = False
        self.rounds = 0
        self.last_decision: Decision | None = None
        self.rebalance = rebalance
        self.rebalance_interval_s = rebalance_interval_s
        #: a (re)started assigner moves nothing for load before one interval passed
        self._last_rebalance_s = started
        #: unit -> (owner, applied offset, wall time) of its last report; unit -> messages/s applied
        self._applied: dict = {}
        self.rates: dict = {}
        #: address -> (wall time, GetStatusResponse or the error's text) of its last poll
        self._polled: dict = {}
        #: the moves of the rounds so far, newest last (at most _MOVES_KEPT): (wall time, unit, src, dst, why)
        self._moves: list = []
        self._status_lock = threading.Lock()
        #: moves made since start, by cause ("handoff", "rebalance")
        self.moves_total: dict = {}

    def poll(self, now: float) -> tuple[list, set]:
        """([IngesterView] in configured order, {(database, kp)} every reachable ingester knows)."""
        views, units = [], set()
        for addr in self.ingesters:
            c = self._clients[addr]
            try:
                st = c.mgmt_stub.GetStatus(management_pb2.GetStatusRequest(), timeout=STATUS_TIMEOUT_S)
            except grpc.RpcError as e:
                log.warning("ingester %s does not answer (%s)", addr, e.code() if hasattr(e, "code") else e)
                views.append(IngesterView(addr, False, False, self._last_seen.get(addr)))
                with self._status_lock:
                    self._polled[addr] = (now, f"{e.code().name}: {e.details()}" if hasattr(e, "code") else str(e))
                continue
            with self._status_lock:
                self._polled[addr] = (now, st)
            self._last_seen[addr] = now
            owned = frozenset((d.name, kp) for d in st.databases for kp in d.owned_partitions)
            for d in st.databases:
                units.update((d.name, kp) for kp in range(d.kafka_partitions))
                for w in d.write_buffer:
                    if (d.name, w.partition) in owned:
                        self._observe_applied((d.name, w.partition), addr, w.applied_hi_inclusive, now)
            views.append(IngesterView(addr, True, st.freeze.frozen, now, owned))
        return views, units

    def _observe_applied(self, unit: tuple, owner: str, applied: int, now: float) -> None:
        """Updates `unit`'s applied rate from its owner's report (a new owner starts it afresh)."""
        prev = self._applied.get(unit)
        self._applied[unit] = (owner, applied, now)
        if prev is None or prev[0] != owner or now <= prev[2]:
            return
        measured = max(0, applied - prev[1]) / (now - prev[2])
        old = self.rates.get(unit)
        with self._status_lock:
            self.rates[unit] = measured if old is None else old + _RATE_WEIGHT * (measured - old)

    def run_once(self, now: float | None = None) -> Decision:
        """One round: poll, decide, claim, save. A failed claim is logged and retried next round."""
        now = time.time() if now is None else now
        started = time.monotonic()
        views, units = self.poll(now)  # also as a standby: who was seen when is known at a takeover
        if self.lease is not None:
            self.standby = not self._holds(now + time.monotonic() - started)
            if self.standby:
                self.rounds += 1
                return Decision(assignments=dict(self.assignments))
            if self.lease.new_term:  # a new holder starts from what the ingesters own: nothing flips back
                self.assignments = {**self.assignments, **_owned_by(views)}
        units |= set(self.assignments)
        rules = RebalanceRules(self.rebalance_interval_s, last_move_s=self._last_rebalance_s,
                               rates=dict(self.rates)) if self.rebalance else None
        decision = decide_assignments(units, views, self.assignments, self.pins, now, self.unreachable_after_s,
                                      rules)
        if decision.rebalanced is not None:
            self._last_rebalance_s = now
        for unit, (src, dst) in sorted(decision.moved.items()):
            why = "rebalance" if unit == decision.rebalanced else "handoff"
            log.warning("%s: %s partition %d from %s to %s", why, unit[0], unit[1], src, dst)
            with self._status_lock:
                self._moves = (self._moves + [(now, unit, src, dst, why)])[-_MOVES_KEPT:]
                self.moves_total[why] = self.moves_total.get(why, 0) + 1
        for claim in decision.claims:
            if self.lease is not None and not self._holds(now + time.monotonic() - started):
                log.warning("assigner lease lost during a round: its remaining claims are left to the holder")
                break
            try:
                self._clients[claim.address].claim_partitions(claim.database, claim.partitions,
                                                              timeout_s=CLAIM_TIMEOUT_S)
                log.info("%s claimed %s partitions %s", claim.address, claim.database, list(claim.partitions))
            except grpc.RpcError as e:
                log.warning("%s could not claim %s partitions %s (next round retries): %s", claim.address,
                            claim.database, list(claim.partitions), e.details() if hasattr(e, "details") else e)
        if decision.assignments != self.assignments:
            _save_state(self.state_path, decision.assignments)
        self.assignments = decision.assignments
        self.last_decision = decision
        self.rounds += 1
        return decision

    def status(self, now: float | None = None) -> dict:
        """The pool as this assigner saw it in its last round (`iox status --assigner`; the status
        endpoint, server/pool/assigner_status.py): {"role": "active" | "standby" | "alone", "rounds",
        "rebalance", "members": [{"address", "member", "reachable", "last_seen_s_ago", "frozen",
        "databases": [{"name", "partitions": [{"partition", "epoch", "applied_hi_inclusive",
        "high_watermark", "lag_messages", "lag_bytes"}]}]} (a member that did not answer: its
        "error")], "assignments": [{"database", "partition", "address", "applied_per_s"}], "moves":
        [{"at", "database", "partition", "from", "to", "why"}] (the latest)}. Any thread."""
        from iox_spark.server.api.client import owned_partitions_status

        now = time.time() if now is None else now
        with self._status_lock:
            polled = dict(self._polled)
            moves = list(self._moves)
            rates = dict(self.rates)
        members = []
        for addr in self.ingesters:
            seen = self._last_seen.get(addr)
            entry = {"address": addr, "last_seen_s_ago": None if seen is None else round(max(0.0, now - seen), 3)}
            at, st = polled.get(addr, (None, "not asked yet"))
            if isinstance(st, str):
                members.append({**entry, "reachable": False, "error": st})
                continue
            members.append({**entry, "member": st.pool_member, "reachable": True, "frozen": st.freeze.frozen,
                            "databases": [owned_partitions_status(d, st.pool_member) for d in st.databases
                                          if d.owned_partitions]})
        return {"role": "alone" if self.lease is None else ("standby" if self.standby else "active"),
                "rounds": self.rounds, "rebalance": self.rebalance, "members": members,
                "assignments": [{"database": db, "partition": kp, "address": addr,
                                 "applied_per_s": None if (db, kp) not in rates else round(rates[(db, kp)], 3)}
                                for (db, kp), addr in sorted(self.assignments.items())],
                "moves": [{"at": at, "database": unit[0], "partition": unit[1], "from": src, "to": dst, "why": why}
                          for at, unit, src, dst, why in moves]}

    def _holds(self, now: float) -> bool:
        try:
            return self.lease.hold(now)
        except Exception as e:  # noqa: BLE001 - the object store's errors: act on nothing until it answers
            log.warning("the assigner lease cannot be read or renewed (%s): this round acts on nothing", e)
            return False

    def run(self) -> None:
        """Rounds every `interval_s` until `stop`; a failing round is logged and the next one runs."""
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("assigner round failed")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
