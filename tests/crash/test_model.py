"""Model-based test of exactly once against real processes: a hypothesis state machine whose rules
write, delete, persist, compact (chunks and Parquet files), send several requests at once, and kill
the server (SIGKILL, SIGKILL with requests in flight, SIGKILL while a persist runs, at a named crash
point of catalog/crash_points.py) or stop it cleanly, while the lifecycle policy persists and
compacts on its own with low thresholds, also while a micro-batch is half applied (every batch
is held so for `HALF_APPLIED_S`). Requests race the policy: the model is checked only after
each restart and when the `check` rule comes up, never after every step.

The oracle (tests/crash/model.py, invariants 1-4 of docs/ARCHITECTURE.md): the database answers
the fold of its write buffer (read with a plain Kafka consumer), every acknowledged request is in
the write buffer exactly once, and a request whose answer was lost is there whole or not at all.
Points with the same table, tag set and time merge, each field taking its last value in
write-buffer order; a delete removes the matching rows written before it, never later ones.
After each restart `iox verify` must agree as well.

Continuous downsampling is checked the same way: at its first check with rows of table `m`, an example
creates a downsampler of `m` (DOWNSAMPLER: every 4 s, per host, aggregates of the request id `r`, which
a later request's write of the same key overwrites) into a database of its own, and from then on every
check also compares that table with a plain-Python aggregation of the fold (late points, deletes,
overwrites and restarts included; the crash point downsample_before_progress is among those driven).

Its CI share is a few examples of a few steps. A longer run:
``IOX_MODEL_EXAMPLES=50 IOX_MODEL_STEPS=40 .venv/bin/python -m pytest tests/crash/test_model.py -s``
(``IOX_MODEL_SEED`` picks another seed; the default is fixed so CI runs the same cases;
``IOX_MODEL_BROKER=durable`` runs the server on its durable embedded broker instead of a Tansu
broker of the module's own; it then keeps persisted messages, `--broker-persisted-retention-s inf`,
because the oracle folds the whole log: deleting persisted batches changes nothing replay reads,
tests/crash/test_broker_truncation.py recovers from a truncated store).
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

from iox_spark.catalog.crash_points import DELAY_ENV, CrashPoint, DelayPoint
from tests.crash.harness import ServerProcess, broker_record, stop_embedded_broker
from tests.crash.model import (DRIVEN_POINTS, Request, answers, bursts, check_requests, deletes, describe,
                               drive_to, fold, new_request, points, read_log, recorded, send)
from tests.downsamplers import databases, downsampler, emitted_through
from tests.timestamps import T0, S
from tests.waiting import wait_for

PARTITION_KEY = "2023-11-14"
PARTITIONS = 2
TABLES = ("m", "p")  # on Kafka partitions 0 and 1: a request of both is a transaction
#: persists and compactions run all the time in the background, besides the explicit ones
LIFECYCLE = ["--persist-row-threshold", "12", "--persist-age-threshold-s", "3", "--late-arrive-window-s", "1",
             "--persisted-compaction-cold-s", "2", "--persisted-compaction-file-threshold", "3",
             "--worker-backoff-ms", "200", "--txn-timeout-s", "20", "--partitions", str(PARTITIONS)]
#: every micro-batch stays half applied this long (its chunks in the catalog, its transaction state,
#: its deletes' effect on the new chunks and its applied offsets not yet: the delay point
#: batch_chunks_added), so the policy, which acts every 200 ms, often acts on a half-applied batch
HALF_APPLIED_S = 0.3
#: a request's answer within this, or the server is taken as hung
REQUEST_TIMEOUT_S = 60
#: how many requests (and actions after each) `crash_at` drives an armed server with toward its crash point
DRIVE_STEPS = 4

#: where the server's write buffer is: "session" (a Tansu broker of the test module, --kafka-bootstrap:
#: it outlives every server of the run) or "durable" (the server's durable embedded broker, its default)
BROKER = os.environ.get("IOX_MODEL_BROKER", "session")
EXAMPLES = int(os.environ.get("IOX_MODEL_EXAMPLES", "2"))
STEPS = int(os.environ.get("IOX_MODEL_STEPS", "14"))
SEED = int(os.environ.get("IOX_MODEL_SEED", "20261128"))
#: the downsampler each example creates: (source table, every, aggregates, group-by tags)
DOWNSAMPLER = ("m", 4, "mean(r),max(r),min(r),count(r)", "host")

class _Servers:
    """The one data directory of the whole run and the server currently running on it."""

    def __init__(self, bootstrap: str | None):
        self.data_dir = tempfile.mkdtemp(prefix="iox-model-")
        self._bootstrap = bootstrap
        self.server: ServerProcess | None = None
        #: the test killed the current server (else, when it is gone, it died at its crash point)
        self.killed = False

    @property
    def bootstrap(self) -> str:
        if self._bootstrap is not None:
            return self._bootstrap
        return f"127.0.0.1:{broker_record(self.data_dir)['port']}"

    def alive(self) -> bool:
        return self.server is not None and self.server.proc.poll() is None

    def died(self, e: grpc.RpcError) -> bool:
        """Whether a call failed because the server died (at its crash point): its connection
        closes while the process is still going away, so an UNAVAILABLE waits for the exit."""
        if self.server is None:
            return True
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            self.server.wait_exit(5)
        return not self.alive()

    def start(self, crash_at: CrashPoint | None = None) -> ServerProcess:
        """Starts a server; one armed at a crash point that fires while it starts (its replay) is
        started again unarmed (`self.fired_while_starting` says so)."""
        self.fired_while_starting = False
        extra = LIFECYCLE + (["--kafka-bootstrap", self._bootstrap] if self._bootstrap
                             else ["--broker-storage", "durable", "--broker-persisted-retention-s", "inf"])
        self.server = ServerProcess(self.data_dir, crash_at=crash_at, extra=extra,
                                    env={DELAY_ENV: f"{DelayPoint.BATCH_CHUNKS_ADDED.value}={HALF_APPLIED_S}"})
        self.killed = False
        try:
            self.server.wait_ready()
        except AssertionError:
            if crash_at is None or self.server.proc.poll() is None:
                raise
            _count(f"crash at {crash_at.value} while starting")
            self.server.kill()
            self.start(None)
            self.fired_while_starting = True
            return self.server
        return self.server

    def kill(self) -> None:
        if self.server is not None:
            self.killed = True
            self.server.kill()

    def close(self, keep: bool) -> None:
        self.kill()
        stop_embedded_broker(self.data_dir)
        if not keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)


_SERVERS: _Servers | None = None
#: what the run did, printed at its end (pytest -s shows it)
_COUNTS: dict = {}
#: the first failure of the run with the steps that led to it: hypothesis replays a failing example
#: to report it, and a failure that depends on timing may not come back in the replay
_FIRST_FAILURE: list = []


def _count(what: str, n: int = 1) -> None:
    _COUNTS[what] = _COUNTS.get(what, 0) + n


def _where() -> str:
    log = _SERVERS.server.log_path if _SERVERS.server is not None else "-"
    return f"data {_SERVERS.data_dir}, log {log}"


_recorded = recorded(_FIRST_FAILURE, _where)


class WriteBufferModel(RuleBasedStateMachine):
    """One example = one fresh database on the run's server (restarts restart it for all)."""

    def __init__(self):
        super().__init__()
        self.db = f"mb_{uuid.uuid4().hex[:10]}"
        #: every request sent to this database, in the order they were sent
        self.requests: list[Request] = []
        self.trace: list = []  # what the example did, for the failure message
        self.failed = False  # a rule failed: teardown checks nothing more
        #: the example's downsampler ("<database>.<table>") once created
        self.downsampler: str | None = None
        _count("examples")

    # -- the server ----------------------------------------------------------------------
    def _client(self):
        """The running server's client; a server that died (at its crash point) is restarted and
        the model checked."""
        if not _SERVERS.alive():
            if _SERVERS.server is not None and not _SERVERS.killed:
                self.trace.append("(the server died at its crash point)")
                _count("crash point fired")
                _SERVERS.kill()
            _SERVERS.start()
            self._check("after the restart")
        return _SERVERS.server.client

    def _settle(self, what: str) -> None:
        """A request's answer was lost while the server runs: it is killed, so the request can no
        longer reach the write buffer later, and the write buffer says whether it did."""
        if any(r.state == "unknown" for r in self.requests) and _SERVERS.alive():
            _SERVERS.kill()
            self.trace.append(f"(killed: {what} got no answer)")
            _count("killed to settle a request")

    # -- rules ---------------------------------------------------------------------------
    @rule(points=points(TABLES))
    @_recorded
    def write(self, points):
        client = self._client()  # first: a restart checks the model, before this request exists
        req = new_request(self.requests, pts=points)
        send(client, self.db, req, REQUEST_TIMEOUT_S)
        self.trace.append(describe(req))
        _count(f"requests {req.state}")
        self._settle("a write")

    @rule(delete=deletes(TABLES))
    @_recorded
    def delete(self, delete):
        client = self._client()
        req = new_request(self.requests, delete=delete)
        send(client, self.db, req, REQUEST_TIMEOUT_S)
        self.trace.append(describe(req))
        _count(f"requests {req.state}")
        self._settle("a delete")

    def _burst(self, items, kill_after_ms: int | None) -> None:
        client = self._client()
        reqs = [new_request(self.requests, pts=p) if kind == "w" else new_request(self.requests, delete=p)
                for kind, p in items]
        threads = [threading.Thread(target=send, args=(client, self.db, r, REQUEST_TIMEOUT_S), daemon=True)
                   for r in reqs]
        for t in threads:
            t.start()
        if kill_after_ms is not None:
            time.sleep(kill_after_ms / 1000)
            _SERVERS.kill()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 10)
            assert not t.is_alive(), "a request hung"
        label = "burst" if kill_after_ms is None else f"burst, SIGKILL after {kill_after_ms} ms"
        self.trace.append(f"{label}: " + "; ".join(describe(r) for r in reqs))
        for r in reqs:
            _count(f"requests {r.state}")
        self._settle("a request of a burst")

    @rule(items=bursts(TABLES))
    @_recorded
    def burst(self, items):
        """Several requests at once: their order is the write buffer's."""
        self._burst(items, None)

    @rule(items=bursts(TABLES), kill_after_ms=st.integers(0, 400))
    @_recorded
    def burst_and_kill(self, items, kill_after_ms):
        """Requests in flight when the server is killed: each is in the write buffer whole or not at all."""
        self._burst(items, kill_after_ms)
        _count("restart burst_and_kill")

    @rule()
    @_recorded
    def persist(self):
        client = self._client()
        try:
            client.persist(self.db, timeout_s=120)
            self.trace.append("persist")
        except grpc.RpcError as e:
            if not _SERVERS.died(e) and e.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: no database yet
                raise
            self.trace.append(f"persist -> {e.code().name}")

    @rule(table=st.sampled_from(TABLES), persisted=st.booleans())
    @_recorded
    def compact(self, table, persisted):
        client = self._client()
        try:
            client.compact(self.db, table, PARTITION_KEY, timeout_s=120, persisted=persisted)
            self.trace.append(f"compact {table} persisted={persisted}")
        except grpc.RpcError as e:  # the partition may hold nothing of that form right now
            if not _SERVERS.died(e) and e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            self.trace.append(f"compact {table} persisted={persisted} -> {e.code().name}")

    @precondition(lambda self: any(r.state == "acked" for r in self.requests))
    @rule()
    @_recorded
    def let_the_lifecycle_persist(self):
        """Time passes: waits until the policy persisted every partition on its own (age threshold)."""
        client = self._client()

        def all_persisted():
            if not _SERVERS.alive():
                return True  # died at its crash point: the next rule restarts it
            try:
                dbs = client.status(self.db)["databases"]
            except grpc.RpcError as e:
                if _SERVERS.died(e):
                    return True
                raise
            parts = [p for d in dbs for t in d["tables"] for p in t["partitions"]]
            return all(int(p["unpersisted_rows"]) == 0 for p in parts)

        wait_for(all_persisted, 90, "the lifecycle to persist every partition")
        self.trace.append("lifecycle persisted")

    @rule(how=st.sampled_from(["clean", "kill", "kill_while_persisting"]))
    @_recorded
    def restart(self, how):
        self._client()  # a server that died already is restarted (and checked) first
        srv = _SERVERS.server
        if how == "clean":
            rc = srv.terminate()  # an armed server may die at its crash point while it persists to stop
            assert rc == 0 or (rc == -9 and srv.crash_at is not None), srv.tail()
        elif how == "kill_while_persisting":
            t = threading.Thread(target=_persist_quietly, args=(srv.client, self.db), daemon=True)
            t.start()
            t.join(0.3)
            srv.kill()
            t.join(30)
        else:
            srv.kill()
        self.trace.append(f"restart {how}")
        _count(f"restart {how}")
        _SERVERS.start()
        self._check("after the restart")

    @rule(point=st.sampled_from(DRIVEN_POINTS), pts=points(TABLES))
    @_recorded
    def crash_at(self, point, pts):
        """SIGKILL, then a server armed at `point`, driven there (writes of `pts` and what reaches
        the point) until it dies there, restarted and checked."""
        self._client()
        _SERVERS.kill()
        self.trace.append(f"restart armed at {point.value}")
        srv = _SERVERS.start(point)
        if _SERVERS.fired_while_starting:
            self.trace.append(f"(died at {point.value} while starting)")
            self._check("after the crash")
            return
        steps = 0
        while _SERVERS.alive() and steps < DRIVE_STEPS and point is not CrashPoint.REPLAY_BATCH:
            steps += 1
            try:
                req = drive_to(point, srv.client, self.db, self.requests, pts, TABLES, PARTITION_KEY,
                               REQUEST_TIMEOUT_S)
                self.trace.append(f"  {describe(req)}")
            except TimeoutError:
                pass  # not applied in time: a later step drives on
            except grpc.RpcError as e:
                if not _SERVERS.died(e) and e.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: nothing to compact
                    raise
        if _SERVERS.alive():  # stays armed: a later step may bring it there
            self.trace.append(f"(not at {point.value} after {DRIVE_STEPS} requests)")
            _count(f"armed at {point.value}, not reached")
            self._settle("a request driving to the crash point")
            return
        _count(f"crash at {point.value}")
        self.trace.append(f"(died at {point.value})")
        _SERVERS.kill()
        _SERVERS.start()
        self._check("after the crash")

    @rule()
    @_recorded
    def check(self):
        self._client()
        self._check("now")

    # -- the oracle ----------------------------------------------------------------------
    def _check(self, when: str) -> None:
        """The database answers the fold of its write buffer (see tests/crash/model.py), and `iox
        verify` agrees; a server that dies at its crash point meanwhile is restarted (unarmed) and
        checked again."""
        for _ in range(3):
            try:
                return self._check_once(when)
            except (grpc.RpcError, TimeoutError) as e:
                if isinstance(e, grpc.RpcError):
                    _SERVERS.died(e)  # waits for a dying server to be gone
                if _SERVERS.alive():
                    raise
                self.trace.append("(the server died at its crash point while checked)")
                _count("crash point fired")
                _SERVERS.kill()
                _SERVERS.start()
        raise AssertionError("the server died three times in a row while checked")

    def _check_once(self, when: str) -> None:
        client = _SERVERS.server.client

        def decided():  # the server writes missing markers, and aborts a transaction left undecided
            ops, undecided, ends = read_log(_SERVERS.bootstrap, self.db, T0, idle_s=1.0 if BROKER == "durable" else 0)
            return (ops, ends) if not undecided else None

        ops, ends = wait_for(decided, 90, "every transaction of the write buffer decided", poll_s=0.5)
        unknown = [r for r in self.requests if r.state == "unknown"]
        check_requests(self.requests, ops)
        for r in unknown:
            _count(f"requests unknown, then {r.state}")
        if not ops:
            return
        client.wait_applied(self.db, {kp: end - 1 for kp, end in ends.items() if end > 0}, timeout_s=180)
        want = fold({}, ops)
        got = answers(client, self.db, {op.table for op in ops if op.rows is not None})
        _count("checks")
        if got != want:
            diff = sorted((k, got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k))
            raise AssertionError(f"database {self.db} {when}: (key, got, want) {diff}\nafter:\n" +
                                 "\n".join(self.trace))
        self._check_downsampler(client, want, ends, when)
        if when != "now":  # after every restart, and at the end: the server's own check agrees
            report = client.verify(self.db, timeout_s=300)
            assert report["ok"], f"iox verify of {self.db} {when}: {report}\nafter:\n" + "\n".join(self.trace)
            assert sum(p["rows_compared"] for p in report["partitions"]) == len(want), report
            _count("verified")
        self.trace.append(f"checked {when}: {len(want)} rows")

    def _check_downsampler(self, client, want: dict, ends: dict, when: str) -> None:
        """Creates the example's downsampler once table `m` has rows; then its table must equal the
        aggregation of the fold, once it emitted everything up to the write buffer's `ends`."""
        table, every_s, aggs, tags = DOWNSAMPLER
        dest = f"{self.db}_ds"
        if self.downsampler is None:
            if not any(k[0] == table for k in want):
                return
            try:
                client.create_downsampler(self.db, table, f"{every_s}s", aggs, f"{dest}.{table}_ds", group_by_tags=tags)
            except grpc.RpcError as e:  # created by an attempt whose answer a crash point cut off
                if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
            self.downsampler = f"{dest}.{table}_ds"
            self.trace.append(f"downsampler {self.downsampler} created")
            _count("downsamplers created")

        def emitted():
            assert downsampler(client, self.downsampler) is not None, f"downsampler {self.downsampler} is gone {when}"
            return emitted_through(client, self.downsampler, dest, ends)

        wait_for(emitted, 120, f"downsampler {self.downsampler} to emit up to {ends}", poll_s=0.5)
        groups: dict = {}
        for (t, host, sec), fields in want.items():
            if t == table and "r" in fields:
                groups.setdefault((host, (T0 + sec * S) - (T0 + sec * S) % (every_s * S)), []).append(fields["r"])
        expect = {k: (sum(v) / len(v), max(v), min(v), len(v)) for k, v in groups.items()}
        rows = client.query(dest, f"SELECT * FROM {table}_ds").to_pylist() if dest in databases(client) else []
        got = {(r["host"], r["time_ns"]): (r["mean_r"], r["max_r"], r["min_r"], r["count_r"]) for r in rows}
        if got != expect:
            diff = sorted((k, got.get(k), expect.get(k)) for k in set(got) | set(expect) if got.get(k) != expect.get(k))
            raise AssertionError(f"downsampler {self.downsampler} {when}: (key, got, want) {diff}\nafter:\n" +
                                 "\n".join(self.trace))
        _count("downsampler checks")

    def teardown(self):
        try:
            if not self.failed:
                self._client()
                self._check("at the end")
            if self.downsampler is not None and not self.failed and _SERVERS.alive():
                try:
                    _SERVERS.server.client.drop_downsampler(self.downsampler)
                except grpc.RpcError as e:  # the server died at its crash point: the next example starts it
                    if not _SERVERS.died(e):
                        raise
        finally:
            _count("steps", sum(1 for s in self.trace if not s.startswith(("checked", "(", "downsampler"))))


def _persist_quietly(client, db: str) -> None:
    try:
        client.persist(db, timeout_s=30)
    except grpc.RpcError:
        pass  # the server was killed under it


def run_model(bootstrap: str | None) -> None:
    """Runs the state machine (EXAMPLES examples of up to STEPS steps, seed SEED) against servers on
    `bootstrap` (None: the durable embedded broker); prints what it did."""
    global _SERVERS
    _SERVERS = _Servers(bootstrap)
    ok = False
    started = time.monotonic()
    try:
        run_state_machine_as_test(seed(SEED)(WriteBufferModel), settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate], database=None))
        ok = True
    finally:
        _SERVERS.close(keep=not ok)
        _SERVERS = None
        print(f"model run (seed {SEED}, {time.monotonic() - started:.0f} s): {dict(sorted(_COUNTS.items()))}")
        _COUNTS.clear()
        if _FIRST_FAILURE:
            print("first failure of the run:", _FIRST_FAILURE[0])
            _FIRST_FAILURE.clear()


@pytest.mark.timeout(max(900, 40 * EXAMPLES * STEPS))  # a longer run gets the time it needs
def test_write_buffer_model(request):
    bootstrap = request.getfixturevalue("own_broker").bootstrap if BROKER == "session" else None
    run_model(bootstrap)
