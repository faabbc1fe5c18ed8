"""Model-based test of exactly once in an ingester pool: a hypothesis state machine over two pool
members (`iox serve --pool-member`, real processes on one broker and one object store) and an
assigner, whose rules write and delete through either member (one at a time and several at once),
persist, freeze and unfreeze a member (its partitions are handed over), SIGKILL a member (with
requests in flight, at a named crash point, or left down until the assigner hands its
partitions over) while the lifecycle persists and compacts on its own.

The oracle is the one of tests/crash/test_model.py (tests/crash/model.py): once every partition
has a live owner again, each member answers exactly the fold of the write buffer (the owner's
unpersisted rows gathered by the other member), and `iox verify` through each member agrees,
every partition checked by its owner.

Its CI share is one short example. A longer run:
``IOX_POOL_MODEL_EXAMPLES=20 IOX_POOL_MODEL_STEPS=30 .venv/bin/python -m pytest tests/crash/test_pool_model.py -s``
(``IOX_POOL_MODEL_SEED`` picks another seed).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from iox_spark.catalog.crash_points import CrashPoint
from iox_spark.server.pool.assigner import Assigner
from iox_spark.server.runtime.broker import free_port
from tests.crash.harness import ServerProcess
from tests.crash.model import (DRIVEN_POINTS, Request, answers, bursts, check_requests, deletes, describe,
                               drive_to, fold, new_request, partition_of, points, read_log, recorded, send)
from tests.timestamps import T0
from tests.waiting import wait_for

PARTITIONS = 2
TABLES = ("m", "p")  # on Kafka partitions 0 and 1
MEMBERS = ("a", "b")
LIFECYCLE = ["--persist-row-threshold", "12", "--persist-age-threshold-s", "3", "--late-arrive-window-s", "1",
             "--persisted-compaction-cold-s", "2", "--persisted-compaction-file-threshold", "3",
             "--worker-backoff-ms", "200", "--txn-timeout-s", "20", "--partitions", str(PARTITIONS)]
REQUEST_TIMEOUT_S = 60
#: a member that does not answer this long loses its partitions to the other (the assigner's grace)
UNREACHABLE_AFTER_S = 2.0
#: how many requests (and actions after each) `crash_at` drives an armed member with toward its crash point
DRIVE_STEPS = 4
PARTITION_KEY = "2023-11-14"

EXAMPLES = int(os.environ.get("IOX_POOL_MODEL_EXAMPLES", "1"))
STEPS = int(os.environ.get("IOX_POOL_MODEL_STEPS", "10"))
SEED = int(os.environ.get("IOX_POOL_MODEL_SEED", "20261128"))

_COUNTS: dict = {}
_FIRST_FAILURE: list = []
_POOL: "_Pool | None" = None


def _count(what: str, n: int = 1) -> None:
    _COUNTS[what] = _COUNTS.get(what, 0) + n


class _Pool:
    """The two members (each on a gRPC port of its own for the whole run, so the assigner knows it
    by one address across restarts), their shared object store and the assigner."""

    def __init__(self, bootstrap: str):
        self.root = tempfile.mkdtemp(prefix="iox-pool-model-")
        self.bootstrap = bootstrap
        self.ports = {m: free_port() for m in MEMBERS}
        self.servers: dict = {}
        #: the members the test killed (else a member that is gone died at its crash point)
        self.killed: set = set()
        self.assigner = Assigner([self.addr(m) for m in MEMBERS], os.path.join(self.root, "assigner.json"),
                                 interval_s=0.5, unreachable_after_s=UNREACHABLE_AFTER_S, rebalance=False)

    def addr(self, m: str) -> str:
        return f"127.0.0.1:{self.ports[m]}"

    def alive(self, m: str) -> bool:
        s = self.servers.get(m)
        return s is not None and s.proc.poll() is None

    def start(self, m: str, crash_at: CrashPoint | None = None) -> ServerProcess:
        extra = LIFECYCLE + ["--kafka-bootstrap", self.bootstrap, "--object-store", os.path.join(self.root, "objects"),
                             "--pool-member", m, "--pool-address", self.addr(m)]
        s = self.servers[m] = ServerProcess(os.path.join(self.root, m), crash_at=crash_at, extra=extra,
                                            port=self.ports[m])
        self.killed.discard(m)
        try:
            s.wait_ready()
        except AssertionError:
            if crash_at is None or s.proc.poll() is None:
                raise
            _count(f"crash at {crash_at.value} while starting")
            s.kill()
            return self.start(m)  # unarmed: its `crash_at` is None
        return s

    def died(self, m: str, e: grpc.RpcError) -> bool:
        """Whether a call to `m` failed because it died (at its crash point): its connection closes
        while the process is still going away, so an UNAVAILABLE waits for the exit."""
        s = self.servers.get(m)
        if s is not None and e.code() == grpc.StatusCode.UNAVAILABLE:
            s.wait_exit(5)
        return not self.alive(m)

    def kill(self, m: str) -> None:
        s = self.servers.get(m)
        if s is not None:
            self.killed.add(m)
            s.kill()

    def close(self, keep: bool) -> None:
        self.assigner.close()
        for m in MEMBERS:
            self.kill(m)
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


_recorded = recorded(_FIRST_FAILURE, lambda: _POOL.root)


class PoolModel(RuleBasedStateMachine):
    """One example = one fresh database on the run's pool."""

    def __init__(self):
        super().__init__()
        self.db = f"pm_{uuid.uuid4().hex[:10]}"
        self.requests: list[Request] = []
        self.trace: list = []
        self.failed = False
        #: members frozen by the test (a frozen member stays frozen across restarts)
        self.frozen: set = set()
        _count("examples")

    # -- the members -----------------------------------------------------------------------
    def _client(self, m: str):
        """Member `m`'s client; a member that died at its crash point is restarted."""
        if not _POOL.alive(m):
            if m in _POOL.servers and m not in _POOL.killed:
                self.trace.append(f"({m} died at its crash point)")
                _count("crash point fired")
            _POOL.start(m)
        return _POOL.servers[m].client

    def _send(self, req: Request, m: str, client) -> None:
        send(client, self.db, req, REQUEST_TIMEOUT_S)
        if req.state == "unknown":
            req.via = m

    def _settle(self) -> None:
        """A member that lost a request's answer while it runs is killed: the request can no longer
        reach the write buffer later, and the write buffer says whether it did."""
        for r in self.requests:
            m = getattr(r, "via", None)
            if r.state == "unknown" and m is not None and _POOL.alive(m):
                _POOL.kill(m)
                self.trace.append(f"(killed {m}: a request through it got no answer)")
                _count("killed to settle a request")

    # -- rules -------------------------------------------------------------------------------
    @rule(pts=points(TABLES), via=st.sampled_from(MEMBERS))
    @_recorded
    def write(self, pts, via):
        client = self._client(via)
        req = new_request(self.requests, pts=pts)
        self._send(req, via, client)
        self.trace.append(f"via {via}: {describe(req)}")
        _count(f"requests {req.state}")
        self._settle()

    @rule(delete=deletes(TABLES), via=st.sampled_from(MEMBERS))
    @_recorded
    def delete(self, delete, via):
        client = self._client(via)
        req = new_request(self.requests, delete=delete)
        self._send(req, via, client)
        self.trace.append(f"via {via}: {describe(req)}")
        _count(f"requests {req.state}")
        self._settle()

    def _burst(self, items, vias, victim, kill_after_ms) -> None:
        clients = {m: self._client(m) for m in MEMBERS}
        reqs = [(new_request(self.requests, pts=p) if kind == "w" else new_request(self.requests, delete=p), via)
                for (kind, p), via in zip(items, vias)]
        threads = [threading.Thread(target=self._send, args=(r, via, clients[via]), daemon=True) for r, via in reqs]
        for t in threads:
            t.start()
        if victim is not None:
            time.sleep(kill_after_ms / 1000)
            _POOL.kill(victim)
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 10)
            assert not t.is_alive(), "a request hung"
        label = "burst" if victim is None else f"burst, SIGKILL {victim} after {kill_after_ms} ms"
        self.trace.append(f"{label}: " + "; ".join(f"via {via}: {describe(r)}" for r, via in reqs))
        for r, _via in reqs:
            _count(f"requests {r.state}")
        self._settle()

    @rule(items=bursts(TABLES), vias=st.lists(st.sampled_from(MEMBERS), min_size=4, max_size=4))
    @_recorded
    def burst(self, items, vias):
        self._burst(items, vias, None, 0)

    @rule(items=bursts(TABLES), vias=st.lists(st.sampled_from(MEMBERS), min_size=4, max_size=4),
          victim=st.sampled_from(MEMBERS), kill_after_ms=st.integers(0, 400))
    @_recorded
    def burst_and_kill(self, items, vias, victim, kill_after_ms):
        self._burst(items, vias, victim, kill_after_ms)
        _count("kill with requests in flight")

    @rule(via=st.sampled_from(MEMBERS))
    @_recorded
    def persist(self, via):
        try:
            self._client(via).persist(self.db, timeout_s=120)
            self.trace.append(f"persist via {via}")
        except grpc.RpcError as e:
            if not _POOL.died(via, e) and e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            self.trace.append(f"persist via {via} -> {e.code().name}")

    @precondition(lambda self: not self.frozen)
    @rule(m=st.sampled_from(MEMBERS))
    @_recorded
    def freeze(self, m):
        """`m` stops consuming; the assigner hands its partitions to the other member."""
        self._client(m).freeze("model", timeout_s=120)
        self.frozen.add(m)
        self.trace.append(f"freeze {m}")
        _count("freezes")

    @precondition(lambda self: self.frozen)
    @rule()
    @_recorded
    def unfreeze(self):
        m = sorted(self.frozen)[0]
        self._client(m).unfreeze()
        self.frozen.discard(m)
        self.trace.append(f"unfreeze {m}")

    @rule()
    @_recorded
    def assign(self):
        """One round of the assigner: handoffs of a frozen member's partitions, or a gone one's."""
        d = _POOL.assigner.run_once()
        self.trace.append(f"assigner round: {sorted(d.moved.items()) or 'nothing moved'}")
        _count("handoffs", len(d.moved))

    @rule(m=st.sampled_from(MEMBERS), how=st.sampled_from(["restart", "down"]))
    @_recorded
    def kill(self, m, how):
        """SIGKILL `m`: restarted at once, or left down until the assigner handed its partitions
        over (then restarted)."""
        self._client(m)
        _POOL.kill(m)
        if how == "down":
            other = next(x for x in MEMBERS if x != m)
            if other in self.frozen:  # nobody to hand over to: the frozen one takes them once unfrozen
                self._client(other).unfreeze()
                self.frozen.discard(other)
            self._client(other)
            deadline = time.monotonic() + UNREACHABLE_AFTER_S + 60

            def handed_over():
                _POOL.assigner.run_once()
                # a database that got no write yet is known to no member: nothing to hand over
                return not _database_known(self._client(other), self.db) or \
                    set(_owned(self._client(other), self.db)) == set(range(PARTITIONS))

            wait_for(handed_over, max(1.0, deadline - time.monotonic()), f"{m}'s partitions handed over", poll_s=0.5)
        _POOL.start(m)
        self.trace.append(f"kill {m} ({how})")
        _count(f"kill {how}")
        self._check("after the kill")

    @rule(m=st.sampled_from(MEMBERS), point=st.sampled_from(DRIVEN_POINTS), pts=points(TABLES))
    @_recorded
    def crash_at(self, m, point, pts):
        """SIGKILL `m`, restart it armed at `point` and drive it there (writes of `pts` through it
        and what reaches the point) until it dies there; then checked."""
        self._client(m)
        _POOL.kill(m)
        self.trace.append(f"restart {m} armed at {point.value}")
        srv = _POOL.start(m, point)
        if _POOL.alive(m) and _database_known(srv.client, self.db):  # its writes to the tables it owns
            mine = [t for t in TABLES if partition_of(t, PARTITIONS) in _owned(srv.client, self.db)]
            if mine and not any(p[0] in mine for p in pts):
                pts = [(mine[0], *p[1:]) for p in pts]
        steps = 0
        while _POOL.alive(m) and srv.crash_at is not None and steps < DRIVE_STEPS \
                and point is not CrashPoint.REPLAY_BATCH:
            steps += 1
            try:
                req = drive_to(point, srv.client, self.db, self.requests, pts, TABLES, PARTITION_KEY,
                               REQUEST_TIMEOUT_S)
                if req.state == "unknown":
                    req.via = m
                self.trace.append(f"  via {m}: {describe(req)}")
            except TimeoutError:
                pass  # not applied here in time (a member applies only the partitions it owns)
            except grpc.RpcError as e:
                # NOT_FOUND: nothing to compact; FAILED_PRECONDITION: it does not own the table
                if not _POOL.died(m, e) and e.code() not in (grpc.StatusCode.NOT_FOUND,
                                                              grpc.StatusCode.FAILED_PRECONDITION):
                    raise
        if _POOL.alive(m):
            self.trace.append(f"({m} not at {point.value})")
            _count(f"armed at {point.value}, not reached")
            self._settle()
        else:
            self.trace.append(f"({m} died at {point.value})")
            _count(f"crash at {point.value}")
        self._check("after the crash")

    @rule()
    @_recorded
    def check(self):
        self._check("now")

    # -- the oracle ----------------------------------------------------------------------------
    def _owners(self) -> dict:
        """{kp: member} once every partition is owned by exactly one live, unfrozen member (assigner
        rounds until then); {} while the database is not known to the pool yet."""
        owners: dict = {}

        def settled():
            owners.clear()
            for m in MEMBERS:
                self._client(m)
            _POOL.assigner.run_once()
            for m in MEMBERS:
                if not _database_known(self._client(m), self.db):
                    continue
                for kp in _owned(self._client(m), self.db):
                    if kp in owners or m in self.frozen:
                        return False
                    owners[kp] = m
            return set(owners) == set(range(PARTITIONS)) or not any(
                _database_known(self._client(m), self.db) for m in MEMBERS)

        wait_for(settled, 120, "every partition owned by one live, unfrozen member", poll_s=0.5)
        return dict(owners)

    def _check(self, when: str) -> None:
        for _ in range(3):
            try:
                return self._check_once(when)
            except (grpc.RpcError, TimeoutError, AssertionError) as e:
                # a member armed at a crash point may die while checked (also inside a verify one
                # member asks the other for): checked again once it is back
                for m in MEMBERS:
                    s = _POOL.servers.get(m)
                    if s is not None:
                        s.wait_exit(2 if isinstance(e, grpc.RpcError) else 0.5)
                dead = [m for m in MEMBERS if not _POOL.alive(m) and m not in _POOL.killed]
                if not dead:
                    raise
                self.trace.append(f"({', '.join(dead)} died while checked)")  # restarted by `_client`
        raise AssertionError("members died three times in a row while checked")

    def _check_once(self, when: str) -> None:
        def decided():
            ops, undecided, ends = read_log(_POOL.bootstrap, self.db, T0)
            return (ops, ends) if not undecided else None

        owners = self._owners()
        ops, ends = wait_for(decided, 90, "every transaction of the write buffer decided", poll_s=0.5)
        check_requests(self.requests, ops)
        if not ops:
            return
        owners = self._owners()
        for kp, end in ends.items():
            if end > 0:
                self._client(owners[kp]).wait_applied(self.db, {kp: end - 1}, timeout_s=180)
        want = fold({}, ops)
        tables = {op.table for op in ops if op.rows is not None}
        for m in MEMBERS:
            got = answers(self._client(m), self.db, tables)
            if got != want:
                diff = sorted((k, got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k))
                raise AssertionError(f"database {self.db} {when}, through {m} (owners {owners}): (key, got, want) "
                                     f"{diff}\nafter:\n" + "\n".join(self.trace))
            report = self._client(m).verify(self.db, timeout_s=300)
            assert report["ok"], f"iox verify through {m} {when}: {report}\nafter:\n" + "\n".join(self.trace)
            assert {p["partition"]: p["verified_by"] for p in report["partitions"]} == owners, report
            assert sum(p["rows_compared"] for p in report["partitions"]) == len(want), report
        _count("checks")
        self.trace.append(f"checked {when} (owners {owners}): {len(want)} rows")

    def teardown(self):
        try:
            if not self.failed:
                for m in sorted(self.frozen):
                    self._client(m).unfreeze()
                self.frozen.clear()
                self._check("at the end")
        finally:
            _count("steps", sum(1 for s in self.trace if not s.startswith(("checked", "("))))


def _database_known(client, db: str) -> bool:
    try:
        return bool(client.status(db)["databases"])
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise


def _owned(client, db: str) -> list:
    dbs = client.status(db)["databases"]
    return dbs[0]["owned_partitions"] if dbs else []


@pytest.mark.timeout(max(1200, 60 * EXAMPLES * STEPS))
def test_pool_model(own_broker):
    global _POOL
    _POOL = _Pool(own_broker.bootstrap)
    ok = False
    started = time.monotonic()
    try:
        for m in MEMBERS:
            _POOL.start(m)
        run_state_machine_as_test(seed(SEED)(PoolModel), settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate], database=None))
        ok = True
    finally:
        _POOL.close(keep=not ok)
        _POOL = None
        print(f"pool model run (seed {SEED}, {time.monotonic() - started:.0f} s): {dict(sorted(_COUNTS.items()))}")
        _COUNTS.clear()
        if _FIRST_FAILURE:
            print("first failure of the run:", _FIRST_FAILURE[0])
            _FIRST_FAILURE.clear()
