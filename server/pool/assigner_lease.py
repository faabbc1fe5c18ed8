"""One assigner at a time: a lease in the pool's object store, in numbered terms.

Invariant: of the assigners of one pool, at most one acts (decides and asks ingesters to claim)
at any time, as long as their clocks agree within `TAKEOVER_GRACE_S` + `RENEW_MARGIN_S`. The
lease is a sequence of term objects `LEASE_PREFIX<term>.json` ({holder, expires_at_s}); a term
is taken by put-if-absent (of concurrent takers exactly one gets it) and renewed by its holder
(a plain put of its own term). The holder acts only while its last renewal, counted from before
the renewal was sent, is younger than the lease minus `RENEW_MARGIN_S`; it stops at once when
a newer term exists. Another assigner is a standby: it takes the next term only once the
newest one expired `TAKEOVER_GRACE_S` ago (or holds nothing). A holder whose own lease lapsed
(a long pause) takes a new term like any standby, never renews the old one. Old terms are
deleted by the holder that follows them.

Where it runs: the assigner process (server/pool/assigner.py), `hold` before each round and before
each claim. Reads and writes the object store; the clock is passed in.
"""
from __future__ import annotations

import json
import logging
import uuid

from iox_spark.catalog.errors import AlreadyExists, ObjectNotFound

__all__ = ["AssignerLease", "LEASE_PREFIX", "DEFAULT_LEASE_S", "TAKEOVER_GRACE_S", "RENEW_MARGIN_S"]

log = logging.getLogger(__name__)

#: the lease's term objects: LEASE_PREFIX + zero-padded term + ".json"
LEASE_PREFIX = "iox~pool/assigner-lease/"
_FORMAT_VERSION = 1
#: how long a renewal holds the lease
DEFAULT_LEASE_S = 15.0
#: a standby takes over this long after the newest term expired (clock differences between hosts)
TAKEOVER_GRACE_S = 2.0
#: the holder stops acting this long before its lease expires (a renewal that takes long, a pause)
RENEW_MARGIN_S = 3.0


def _key(term: int) -> str:
    return f"{LEASE_PREFIX}{term:020d}.json"


def _term_of(key: str) -> int | None:
    name = key[len(LEASE_PREFIX):] if key.startswith(LEASE_PREFIX) else ""
    stem = name[:-len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


class AssignerLease:
    """The lease as one assigner sees it. `holder`: this assigner's name (unique per process: a
    restarted assigner is another holder and waits for its old term to lapse)."""

    def __init__(self, store, name: str, lease_s: float = DEFAULT_LEASE_S):
        if not lease_s > RENEW_MARGIN_S:
            raise ValueError(f"the assigner lease must last more than {RENEW_MARGIN_S} s, got {lease_s}")
        self.store = store
        self.holder = f"{name}/{uuid.uuid4().hex[:12]}"
        self.lease_s = lease_s
        #: the term this assigner holds (None: none) and until when it acts on it
        self.term: int | None = None
        self._acts_until = 0.0
        #: the holder of the newest term, as last read (for the standby's log and status)
        self.seen_holder: str | None = None
        #: the last `hold` took a term (the assigner then adopts what the ingesters own)
        self.new_term = False
        self._standby_logged: str | None = None

    def hold(self, now: float) -> bool:
        """Whether this assigner may act now: renews its term, or takes the next one when the
        newest lapsed; False as a standby. Store errors propagate (the caller does not act)."""
        self.new_term = False
        newest, rec = self._newest()
        if self.term is not None and newest == self.term and now < self._acts_until:
            self.store.put(_key(newest), self._record(now))
            self._acts_until = now + self.lease_s - RENEW_MARGIN_S
            return True
        if self.term is not None:
            log.warning("assigner lease term %d lost (newest term %s held by %s): standing by", self.term, newest,
                        rec.get("holder") if rec else None)
            self.term = None
        if rec is not None and now <= float(rec.get("expires_at_s", 0)) + TAKEOVER_GRACE_S:
            self.seen_holder = rec.get("holder")
            if self._standby_logged != self.seen_holder:
                self._standby_logged = self.seen_holder
                log.info("standby: the assigner lease is held by %s", self.seen_holder)
            return False
        nxt = (newest or 0) + 1
        try:
            self.store.put_if_absent(_key(nxt), self._record(now))
        except AlreadyExists:
            return False  # another standby took it first
        self.term, self._acts_until, self.seen_holder = nxt, now + self.lease_s - RENEW_MARGIN_S, self.holder
        self._standby_logged = None
        log.warning("assigner lease term %d taken (%s)", nxt,
                    f"term {newest} of {rec.get('holder')} lapsed" if rec else "no assigner held it")
        self.new_term = True
        for old in self._terms():
            if newest is not None and old < newest:
                try:
                    self.store.delete(_key(old))
                except Exception as e:  # noqa: BLE001 - a later holder deletes it
                    log.debug("old assigner lease term %d not deleted: %s", old, e)
        return True

    def _record(self, now: float) -> bytes:
        return json.dumps({"format_version": _FORMAT_VERSION, "holder": self.holder,
                           "expires_at_s": now + self.lease_s}).encode()

    def _terms(self) -> list:
        return sorted(t for m in self.store.list(LEASE_PREFIX) if (t := _term_of(m.key)) is not None)

    def _newest(self) -> tuple:
        """(newest term or None, its record or None: unreadable counts as expired)."""
        terms = self._terms()
        if not terms:
            return None, None
        try:
            rec = json.loads(self.store.get(_key(terms[-1])))
        except (ObjectNotFound, ValueError):
            return terms[-1], None
        if not isinstance(rec, dict) or rec.get("format_version") != _FORMAT_VERSION:
            return terms[-1], None
        return terms[-1], rec
