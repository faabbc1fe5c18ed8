"""Model-based test of the write path against real processes: a hypothesis state machine
whose rules write, delete, persist, compact (chunks and Parquet files) and restart the
server (cleanly, by SIGKILL, by SIGKILL while a persist runs), checked after every step
against a plain-Python model of what the acknowledged requests mean.

The oracle (invariants 1-4 of docs/ARCHITECTURE.md): every acknowledged write is
queryable exactly once; points with the same table, tag set and time merge, each field
taking the last non-null value in write order; a delete removes the matching rows written
before it and never those written after it. Requests are sequential, so write order is
the order of the acknowledgements.

Its CI share is a few examples of a few steps (about 3 minutes). A longer run:
``IOX_MODEL_EXAMPLES=50 IOX_MODEL_STEPS=40 .venv/bin/python -m pytest tests/crash/test_model.py -s``
(``IOX_MODEL_SEED`` picks another seed; the default is fixed so CI runs the same cases;
``IOX_MODEL_BROKER=durable`` runs it on the durable embedded broker).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from tests.crash.harness import ServerProcess, stop_embedded_broker
from tests.waiting import wait_for

T0 = 1_700_000_000_000_000_000  # 2023-11-14: one day partition, long past the late-arrive window
S = 1_000_000_000
PARTITION_KEY = "2023-11-14"
TABLES = ("m", "n")
HOSTS = ("a", "b", "c")
FIELDS = ("v", "w")
SECONDS = 12  # few timestamps: writes collide with earlier points and deleted ones
#: persists and compactions run all the time in the background, besides the explicit ones
LIFECYCLE = ["--persist-row-threshold", "12", "--persist-age-threshold-s", "3", "--late-arrive-window-s", "1",
             "--persisted-compaction-cold-s", "2", "--persisted-compaction-file-threshold", "3",
             "--worker-backoff-ms", "200"]

#: the embedded broker's storage of this test: memory unless IOX_MODEL_BROKER says durable (the server's
#: default, slower per restart; it keeps offsets across clean restarts)
BROKER_STORAGE = os.environ.get("IOX_MODEL_BROKER", "memory")
EXAMPLES = int(os.environ.get("IOX_MODEL_EXAMPLES", "3"))
STEPS = int(os.environ.get("IOX_MODEL_STEPS", "14"))
SEED = int(os.environ.get("IOX_MODEL_SEED", "20261127"))

_point = st.tuples(st.sampled_from(TABLES), st.sampled_from(HOSTS), st.integers(0, SECONDS - 1),
                   st.dictionaries(st.sampled_from(FIELDS), st.integers(0, 999), min_size=1))


class _Servers:
    """The one data directory of the whole run and the server currently running on it."""

    def __init__(self):
        self.data_dir = tempfile.mkdtemp(prefix="iox-model-")
        self.server: ServerProcess | None = None

    def current(self) -> ServerProcess:
        if self.server is None or self.server.proc.poll() is not None:
            self.server = ServerProcess(self.data_dir, extra=LIFECYCLE + ["--broker-storage", BROKER_STORAGE])
            # known before it is ready: close() kills it
            self.server.wait_ready()
        return self.server

    def close(self, keep: bool) -> None:
        if self.server is not None:
            self.server.kill()
        stop_embedded_broker(self.data_dir)
        if not keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)


_SERVERS: _Servers | None = None
#: what the run did, printed at its end (pytest -s shows it): examples, steps, restarts by kind
_COUNTS: dict = {}
#: the first failure of the run with the steps that led to it: hypothesis replays a failing example
#: to report it, and a failure that depends on timing may not come back in the replay
_FIRST_FAILURE: list = []


def _recorded(step):
    """Wraps a rule or invariant: its first failure in the run is kept with the example's steps."""
    import functools

    @functools.wraps(step)
    def run(self, *args, **kwargs):
        try:
            return step(self, *args, **kwargs)
        except BaseException as e:
            if not _FIRST_FAILURE:
                _FIRST_FAILURE.append(f"{step.__name__}{kwargs or ''} failed with {e!r} in database {self.db} "
                                      f"({_SERVERS.data_dir}) after:\n" + "\n".join(self.trace))
            raise

    return run


class WriteBufferModel(RuleBasedStateMachine):
    """One example = one fresh database on the run's server (restarts restart it for all)."""

    def __init__(self):
        super().__init__()
        self.db = f"mb_{uuid.uuid4().hex[:10]}"
        #: (table, host, second) -> {field: value}: what the database must answer
        self.rows: dict = {}
        #: {kafka partition: offset} of the acknowledged requests (since the broker last started empty)
        self.token: dict = {}
        self.trace: list = []  # what the example did, for the failure message
        _COUNTS["examples"] = _COUNTS.get("examples", 0) + 1

    @property
    def client(self):
        return _SERVERS.current().client

    # -- rules ---------------------------------------------------------------------------
    @rule(points=st.lists(_point, min_size=1, max_size=6))
    @_recorded
    def write(self, points):
        lines = []
        for table, host, sec, fields in points:
            body = ",".join(f"{f}={v}i" for f, v in sorted(fields.items()))
            lines.append(f"{table},host={host} {body} {T0 + sec * S}")
        tok = self.client.write(self.db, "\n".join(lines), timeout_s=30)
        self._acked(tok)
        for table, host, sec, fields in points:  # in request order: a later line wins
            self.rows.setdefault((table, host, sec), {}).update(fields)
        self.trace.append(f"write {lines}")

    @rule(table=st.sampled_from(TABLES), lo=st.integers(0, SECONDS - 1), span=st.integers(1, SECONDS),
          host=st.none() | st.sampled_from(HOSTS))
    @_recorded
    def delete(self, table, lo, span, host):
        hi = min(SECONDS, lo + span)
        if table not in self._known_tables():
            return  # the table does not exist yet: a delete of it is NOT_FOUND
        pred = f'host="{host}"' if host else ""
        tok = self.client.delete(self.db, T0 + lo * S, T0 + hi * S, predicate=pred, table=table, timeout_s=30)
        self._acked(tok)
        for key in [k for k in self.rows if k[0] == table and lo <= k[2] < hi and (host is None or k[1] == host)]:
            del self.rows[key]
        self.trace.append(f"delete {table} [{lo}, {hi}) {pred}")

    @precondition(lambda self: self.rows)
    @rule()
    @_recorded
    def persist(self):
        self.client.persist(self.db, timeout_s=120)
        self.trace.append("persist")

    @precondition(lambda self: self.rows)
    @rule(table=st.sampled_from(TABLES), persisted=st.booleans())
    @_recorded
    def compact(self, table, persisted):
        if table not in self._known_tables():
            return
        try:
            self.client.compact(self.db, table, PARTITION_KEY, timeout_s=120, persisted=persisted)
        except grpc.RpcError as e:  # the partition may hold nothing of that form right now
            assert e.code() == grpc.StatusCode.NOT_FOUND, e
        self.trace.append(f"compact {table} persisted={persisted}")

    @precondition(lambda self: self.rows)
    @rule()
    @_recorded
    def let_the_lifecycle_persist(self):
        """Time passes: waits until the policy persisted every partition on its own (age threshold)."""
        def all_persisted():
            dbs = self.client.status(self.db)["databases"]
            parts = [p for d in dbs for t in d["tables"] for p in t["partitions"]]
            return parts and all(int(p["unpersisted_rows"]) == 0 for p in parts)

        if self.token:
            self.client.wait_applied(self.db, self.token, timeout_s=120)
        wait_for(all_persisted, 60, "the lifecycle to persist every partition")
        self.trace.append("lifecycle persisted")

    @rule(how=st.sampled_from(["kill", "kill_while_persisting", "clean"]))
    @_recorded
    def restart(self, how):
        srv = _SERVERS.current()
        if how == "clean":
            assert srv.terminate() == 0, srv.tail()
            if BROKER_STORAGE == "memory":  # the broker stopped with it: offsets start over, a new epoch
                self.token = {}
        elif how == "kill":
            srv.kill()
        else:
            t = threading.Thread(target=_persist_quietly, args=(srv.client, self.db), daemon=True)
            t.start()
            t.join(0.3)
            srv.kill()
            t.join(30)
        self.trace.append(f"restart {how}")
        _SERVERS.current()

    # -- the oracle ----------------------------------------------------------------------
    @invariant()
    @_recorded
    def answers_equal_the_model(self):
        if not self.trace:
            return
        c = self.client
        if self.token:
            c.wait_applied(self.db, self.token, timeout_s=120)
        known = self._known_tables()
        got = {}
        for table in sorted(known):
            for r in c.query(self.db, f"SELECT * FROM {table}").to_pylist():  # a field never written is no column
                key = (table, r["host"], (r["time_ns"] - T0) // S)
                assert key not in got, f"{key} twice\nafter:\n" + "\n".join(self.trace)
                got[key] = {f: r[f] for f in FIELDS if r.get(f) is not None}
        want = {k: v for k, v in self.rows.items() if v}
        if got != want:
            diff = sorted((k, got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k))
            raise AssertionError(f"database {self.db}: (key, got, want) {diff}\nafter:\n" + "\n".join(self.trace))

    def _known_tables(self) -> set:
        dbs = self.client.status(self.db)["databases"] if self._db_known() else []
        return {t["name"] for d in dbs for t in d["tables"] if t["name"] in TABLES}

    def _db_known(self) -> bool:
        try:
            self.client.status(self.db)
            return True
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e
            return False

    def teardown(self):
        _COUNTS["steps"] = _COUNTS.get("steps", 0) + len(self.trace)
        for step in self.trace:
            if step.startswith("restart"):
                _COUNTS[step] = _COUNTS.get(step, 0) + 1

    def _acked(self, tok: dict) -> None:
        for kp, off in tok.items():
            self.token[int(kp)] = max(self.token.get(int(kp), -1), off)


def _persist_quietly(client, db: str) -> None:
    try:
        client.persist(db, timeout_s=30)
    except grpc.RpcError:
        pass  # the server was killed under it


@pytest.mark.timeout(max(600, 20 * EXAMPLES * STEPS))  # a longer run gets the time it needs
def test_write_buffer_model():
    global _SERVERS
    _SERVERS = _Servers()
    ok = False
    try:
        run_state_machine_as_test(seed(SEED)(WriteBufferModel), settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate], database=None))
        ok = True
    finally:
        _SERVERS.close(keep=not ok)
        _SERVERS = None
        print(f"model run (seed {SEED}): {_COUNTS}")
        _COUNTS.clear()
        if _FIRST_FAILURE:
            print("first failure of the run:", _FIRST_FAILURE[0])
            _FIRST_FAILURE.clear()
