"""A broker that loses the tail of a topic (here: the durable embedded broker's store directory put
back to an older copy, as a store that did not fsync or a restored backup would): every acknowledged
write it lost is reported with its exact offsets, at start and while the server runs (also writes
acknowledged but not applied yet), before and after a persist; nothing is applied twice, and the
database continues in a new write-buffer epoch.
Before the first loss, the same store survives kills whole: of the broker alone while the server
runs, and of the server, the broker and its store at once.

Real processes: `iox serve` with the durable embedded broker (Tansu on its SeaweedFS store); the
broker and its store are SIGKILLed while the server is stopped (SIGSTOP), so the copy is taken and
put back while nothing writes to it, and the server's supervisor starts them again on it.
"""
from __future__ import annotations

import os
import shutil
import signal
import uuid

import grpc

from iox_spark.catalog.sharding import partition_for
from tests.waiting import wait_for
from tests.crash.harness import ServerProcess, broker_record
from tests.timestamps import T0

#: a short run-time grace (the default is 30 s), so the loss while running is found in seconds
DURABLE = ["--broker-storage", "durable", "--tail-loss-grace-s", "10"]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # dead, not reaped yet
    except OSError:
        return True


def _kill_broker(data_dir: str) -> None:
    """SIGKILLs the embedded broker and its store; returns once both are dead."""
    rec = broker_record(data_dir)
    pids = [rec["pid"], rec["store_pid"]]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(_gone(p) for p in pids), 30, "the broker and its store to die")


class _Stopped:
    """The server stopped (SIGSTOP) with its broker and store killed, for the block's duration; the
    server's supervisor starts them again on the store directory once it continues."""

    def __init__(self, server: ServerProcess):
        self.server = server

    def __enter__(self):
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        _kill_broker(self.server.data_dir)
        return os.path.join(self.server.data_dir, "broker-store")

    def __exit__(self, *exc):
        os.kill(self.server.proc.pid, signal.SIGCONT)


def _put_back(copy: str, store: str) -> None:
    shutil.rmtree(store)
    shutil.copytree(copy, store)


class _Points:
    """One point per request to table m (one Kafka partition): what was acknowledged, and what was
    answered an error (it may have landed in Kafka, at most once, or not)."""

    def __init__(self, db: str):
        self.db = db
        self.next = 0
        self.acked: set[int] = set()
        self.unacked: set[int] = set()
        #: {value: Kafka offset} of the acknowledged ones
        self.offsets: dict[int, int] = {}

    def write(self, client, kp: int) -> dict:
        v, self.next = self.next, self.next + 1
        try:
            tok = client.write(self.db, f"m v={v}i {T0 + v}", timeout_s=30)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            self.unacked.add(v)
            return {}
        self.acked.add(v)
        self.offsets[v] = tok[kp]
        return tok

    def write_n(self, client, kp: int, n: int) -> dict:
        """`n` writes, each acknowledged; the last one's token."""
        tok = {}
        for _ in range(n):
            tok = self.write(client, kp)
            assert tok, "a write was refused"
        return tok

    def write_once_taken(self, client, kp: int) -> dict:
        """Writes one point at a time until one is acknowledged (writes are refused while the broker
        is away or the database continues in a new epoch); its token."""
        return wait_for(lambda: self.write(client, kp), 120, "writes to be taken again", poll_s=0.5)

    def forget_after(self, offset: int, since: int = 0) -> None:
        """The broker lost every offset past `offset`: what was written after it is gone for good.
        `since`: the first value written in the write-buffer epoch that lost them (earlier epochs
        gave the same offsets to other writes)."""
        lost = {v for v, off in self.offsets.items() if v >= since and off > offset}
        self.acked -= lost
        self.unacked = {v for v in self.unacked if v < min(lost | {self.next})}

    def check(self, client) -> None:
        """Every acknowledged point exactly once; nothing else but points answered an error."""
        rows = [r["v"] for r in client.query(self.db, "SELECT v FROM m").to_pylist()]
        assert len(rows) == len(set(rows)), sorted(rows)
        assert self.acked <= set(rows) <= self.acked | self.unacked, (
            f"acknowledged, missing: {sorted(self.acked - set(rows))}; read, never written or lost: "
            f"{sorted(set(rows) - self.acked - self.unacked)}; offsets {self.offsets}; unacked {sorted(self.unacked)}")


def test_a_broker_that_lost_its_tail_is_found_at_start_and_while_running(data_dir):
    db = f"lt_{uuid.uuid4().hex[:8]}"
    kp = partition_for("m", 2)
    pts = _Points(db)
    store_copy = os.path.join(data_dir, "store-copy")
    servers = []
    try:
        # 1. nothing persisted, the server killed: found at the next start from the acknowledged offsets
        # (after a start on the intact store that finds them all)
        s1 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
        servers.append(s1)
        rec = broker_record(data_dir)
        assert rec["storage"].startswith("s3://") and rec["store_pid"]
        s1.client.wait_applied(db, pts.write_n(s1.client, kp, 5), timeout_s=60)  # offsets 0..4
        with _Stopped(s1) as store:
            shutil.copytree(store, store_copy)  # holds offsets 0..4
        pts.write_once_taken(s1.client, kp)  # the server started the broker again
        # the broker alone SIGKILLed while the server runs: the server starts it again, writes go on
        os.kill(broker_record(data_dir)["pid"], signal.SIGKILL)
        pts.write_once_taken(s1.client, kp)
        s1.client.wait_applied(db, pts.write_n(s1.client, kp, 3), timeout_s=120)  # the last of them all
        pts.check(s1.client)
        assert s1.client.status(db)["databases"][0]["tables"][0]["partitions"][0]["files"] == []
        s1.kill()
        _kill_broker(data_dir)
        # the server, the broker and its store SIGKILLed at once, the store intact: the next server
        # finds every acknowledged write there, exactly once
        s1b = ServerProcess(data_dir, extra=DURABLE).wait_ready()
        servers.append(s1b)
        s1b.client.wait_caught_up(db, 120)
        pts.check(s1b.client)
        last = pts.write_n(s1b.client, kp, 1)[kp]
        s1b.client.wait_applied(db, {kp: last}, timeout_s=60)
        pts.check(s1b.client)
        s1b.kill()
        _kill_broker(data_dir)
        # then the store put back to the copy: offsets 5..last are gone
        _put_back(store_copy, os.path.join(data_dir, "broker-store"))
        s2 = ServerProcess(data_dir, extra=DURABLE)
        servers.append(s2)
        assert s2.wait_exit(180) not in (None, 0), s2.tail()
        log = s2.tail(50_000)
        assert f"Kafka partition {kp} no longer holds offsets [5, {last + 1}) that are not persisted yet" in log, log
        assert "the broker lost the tail" in log and "--skip-lost-writes" in log
        # accepted: what the broker still holds is replayed in the old epoch and persisted, then the
        # database continues in a new epoch from Kafka's end (offset 5 is given out again)
        s3 = ServerProcess(data_dir, extra=DURABLE + ["--skip-lost-writes"]).wait_ready()
        servers.append(s3)
        c = s3.client
        st = c.status(db)["databases"][0]
        assert [(r["partition"], r["from_offset"], r["to_offset_exclusive"], r["accepted"])
                for r in st["lost_writes"]] == [(kp, 5, last + 1, True)], st
        pts.forget_after(4)
        assert pts.acked == set(range(5))
        tok = pts.write_once_taken(c, kp)
        assert tok[kp] == 5, tok  # the new epoch starts at Kafka's end
        c.wait_applied(db, tok, timeout_s=60)
        pts.check(c)
        assert c.status(db)["databases"][0]["epoch"] == 1

        # 2. after a persist, while running: the broker loses what came after the copy; every
        # acknowledged write was applied, so nothing is lost and the database continues by itself
        c.wait_applied(db, pts.write_n(c, kp, 3), timeout_s=60)
        c.persist(db)
        shutil.rmtree(store_copy)
        with _Stopped(s3) as store:
            shutil.copytree(store, store_copy)
        first_after_copy = pts.write_once_taken(c, kp)[kp]
        last = pts.write_n(c, kp, 3)[kp]
        c.wait_applied(db, {kp: last}, timeout_s=60)  # applied, not persisted
        with _Stopped(s3) as store:
            _put_back(store_copy, store)
        tok = pts.write_once_taken(c, kp)  # refused until what was applied is persisted, then taken
        assert first_after_copy <= tok[kp] <= last, (tok, first_after_copy, last)  # offsets given out again
        c.wait_applied(db, tok, timeout_s=60)
        st = c.status(db)["databases"][0]
        assert st["epoch"] == 2 and [r["from_offset"] for r in st["lost_writes"]] == [5], st
        pts.check(c)

        # 3. everything persisted, the broker loses its tail while the server is down: the next start
        # continues in a new epoch at once, and refuses nothing
        last = pts.write_n(c, kp, 2)[kp]
        c.wait_applied(db, {kp: last}, timeout_s=60)
        c.persist(db)
        s3.kill()
        _kill_broker(data_dir)
        _put_back(store_copy, os.path.join(data_dir, "broker-store"))
        s4 = ServerProcess(data_dir, extra=DURABLE).wait_ready()
        servers.append(s4)
        c = s4.client
        c.wait_caught_up(db, 120)
        pts.check(c)
        tok = pts.write_n(c, kp, 1)
        assert first_after_copy <= tok[kp] <= last, (tok, first_after_copy, last)
        c.wait_applied(db, tok, timeout_s=60)
        st = c.status(db)["databases"][0]
        assert st["epoch"] == 3 and [r["from_offset"] for r in st["lost_writes"]] == [5], st
        pts.check(c)

        # 4. while running, acknowledged writes not applied yet (the server frozen: it reads no new
        # offsets) go with the broker's tail: found with their exact offsets, writes refused until
        # the loss is accepted, then the database continues in a new epoch
        epoch_start = pts.next
        c.wait_applied(db, pts.write_n(c, kp, 2), timeout_s=60)
        shutil.rmtree(store_copy)
        with _Stopped(s4) as store:
            shutil.copytree(store, store_copy)
        c.freeze("lost tail test")
        first_lost = pts.write_once_taken(c, kp)[kp]
        last = pts.write_n(c, kp, 2)[kp]  # acknowledged, not applied
        assert c.applied(db)[kp] == first_lost - 1
        with _Stopped(s4) as store:
            _put_back(store_copy, store)

        def lost_now():
            return [(r["partition"], r["from_offset"], r["to_offset_exclusive"], r["accepted"])
                    for r in c.status(db)["databases"][0]["lost_writes"] if r["from_offset"] == first_lost]

        assert wait_for(lost_now, 120, "the loss to be found") == [(kp, first_lost, last + 1, False)]
        try:
            c.write(db, f"m v=-1i {T0}", timeout_s=30)
            raise AssertionError("a write was taken while the loss is not accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "lost acknowledged writes" in e.details(), e
        pts.forget_after(first_lost - 1, since=epoch_start)
        c.unfreeze()
        c.accept_lost_writes(db)
        assert lost_now() == [(kp, first_lost, last + 1, True)]
        tok = pts.write_once_taken(c, kp)
        assert tok[kp] == first_lost, tok  # the new epoch starts at Kafka's end
        c.wait_applied(db, tok, timeout_s=60)
        assert c.status(db)["databases"][0]["epoch"] == 4
        pts.check(c)
        report = c.verify(db, table="m", timeout_s=120)
        assert report["ok"], report
    finally:
        for s in servers:
            if s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
            s.kill()
