"""The plain-Python oracle of the model tests (tests/crash/test_model.py, tests/crash/test_pool_model.py).

What a database must answer is a function of its write buffer: the requests Kafka holds, folded in
Kafka order with the rules of docs/ARCHITECTURE.md (invariants 3-4): per table, tag set and time,
each field takes its last value in write-buffer order; a delete removes the matching rows written
before it and never those written after it. This module reads the topic with a plain
confluent-kafka consumer and decodes its messages with pyarrow and json only (none of the server's
code), matches every message with the request the test sent, and folds them.

The requests a test sent are its record of the truth: an acknowledged request must be in the
write buffer, applied exactly once (`check_requests`); a request whose answer was lost when the
server was killed may or may not be there, and the write buffer says which. Each write request
carries a field `r` with its own number on every point, so its messages name it.

Pure but for `read_log` (Kafka). Used by tests only.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
import zlib

import pyarrow as pa
from tests.timestamps import S, T0

__all__ = ["Request", "LogOp", "read_log", "check_requests", "fold", "partition_of", "TOPIC_PREFIX", "S",
           "SECONDS", "HOSTS", "FIELDS", "points", "one_table_write", "deletes", "bursts", "lines", "describe",
           "answers", "new_request", "send", "recorded", "drive_to", "DRIVEN_POINTS"]

#: the topic of database D is TOPIC_PREFIX + D (the server's documented naming)
TOPIC_PREFIX = "iox."
_S = S
SECONDS = 12  # few timestamps: writes collide with earlier points and deleted ones
HOSTS = ("a", "b", "c")
FIELDS = ("v", "w")


# -- what the model tests send ---------------------------------------------------------------------

def _strategies(tables: tuple):
    from hypothesis import strategies as st

    fields = st.dictionaries(st.sampled_from(FIELDS), st.integers(0, 999), min_size=1)
    point = st.tuples(st.sampled_from(tables), st.sampled_from(HOSTS), st.integers(0, SECONDS - 1), fields)
    one_table = st.sampled_from(tables).flatmap(
        lambda t: st.lists(st.tuples(st.just(t), st.sampled_from(HOSTS), st.integers(0, SECONDS - 1), fields),
                           min_size=1, max_size=5))
    delete = st.tuples(st.sampled_from(tables), st.integers(0, SECONDS - 1), st.integers(1, SECONDS),
                       st.none() | st.sampled_from(HOSTS))
    burst = st.lists(st.one_of(one_table.map(lambda p: ("w", p)), delete.map(lambda d: ("d", d))),
                     min_size=2, max_size=4)
    return point, one_table, delete, burst


def points(tables: tuple):
    """A write request: 1-6 points of `tables`, (table, host, second, {field: value})."""
    from hypothesis import strategies as st

    return st.lists(_strategies(tables)[0], min_size=1, max_size=6)


def one_table_write(tables: tuple):
    return _strategies(tables)[1]


def deletes(tables: tuple):
    """A delete request: (table, first second, span in seconds, host or None)."""
    return _strategies(tables)[2]


def bursts(tables: tuple):
    """2-4 requests sent at once: ("w", points of one table) or ("d", a delete)."""
    return _strategies(tables)[3]


def lines(rid: int, pts) -> str:
    """The line protocol of request `rid`: each point with field `r` = `rid`."""
    out = []
    for table, host, sec, fields in pts:
        body = ",".join(f"{f}={v}i" for f, v in sorted(fields.items()))
        out.append(f"{table},host={host} {body},r={rid}i {T0 + sec * S}")
    return "\n".join(out)


def describe(req: "Request") -> str:
    """One request and its answer, for a failure's trace."""
    if req.points is not None:
        what = " ".join(f"{t}.{h}@{s}={dict(sorted(f.items()))}" for t, h, s, f in req.points)
        return f"w#{req.rid} {what} -> {req.state} {req.token or ''}"
    table, lo, hi, host = req.delete
    return f"d#{req.rid} {table} [{lo}, {hi}) host={host} -> {req.state} {req.token or ''}"


def new_request(requests: list, pts=None, delete=None) -> "Request":
    """A request (`pts`, or `delete` as `deletes` draws it: (table, lo, span, host)) appended to
    `requests`, numbered after them."""
    if delete is not None:
        table, lo, span, host = delete
        delete = (table, lo, min(SECONDS, lo + span), host)
    req = Request(rid=len(requests) + 1, points=pts, delete=delete)
    requests.append(req)
    return req


def send(client, database: str, req: "Request", timeout_s: float) -> None:
    """Sends one request and records its answer: acked (with its token), rejected (NOT_FOUND: a
    delete of a table the server does not know), or unknown (any other failure)."""
    import grpc

    try:
        if req.points is not None:
            token = client.write(database, lines(req.rid, req.points), timeout_s=timeout_s)
        else:
            table, lo, hi, host = req.delete
            token = client.delete(database, T0 + lo * S, T0 + hi * S, predicate=f'host="{host}"' if host else "",
                                  table=table, timeout_s=timeout_s)
        req.token = {int(k): v for k, v in token.items()}
        req.state = "acked"
    except grpc.RpcError as e:
        req.state = "rejected" if e.code() == grpc.StatusCode.NOT_FOUND and req.delete is not None else "unknown"


def recorded(first_failure: list, where):
    """A decorator of a state machine's rules: the first failure of the run is kept in
    `first_failure` with the example's steps (`self.trace`) and `where()` (its data and logs), and
    `self.failed` set; hypothesis replays a failing example to report it, and a failure that
    depends on timing may not come back in the replay."""

    def wrap(step):
        @functools.wraps(step)
        def run(self, *args, **kwargs):
            try:
                return step(self, *args, **kwargs)
            except BaseException as e:
                self.failed = True
                if not first_failure:
                    first_failure.append(f"{step.__name__}{kwargs or ''} failed with {e!r} in database {self.db} "
                                         f"({where()}) after:\n" + "\n".join(self.trace))
                raise

        return run

    return wrap


def _driven_points():
    from iox_spark.catalog.crash_points import CrashPoint

    # cleanup runs every few minutes: no test drives a server there
    return [p for p in CrashPoint if p is not CrashPoint.CLEANUP_BEFORE_DELETE]


#: the crash points `drive_to` brings a server to
DRIVEN_POINTS = _driven_points()


def drive_to(point, client, database: str, requests: list, pts: list, tables: tuple, partition_key: str,
             timeout_s: float) -> "Request":
    """One step of bringing a server armed at crash point `point` to it: a write request of `pts`
    (of every table of `tables` for a point of a multi-message request), then what reaches the
    point (a persist, a compaction of its chunks or of its files, waiting until the write is
    applied). Returns the request (its state says whether it was acknowledged); an RpcError of
    the action after it propagates (the server died, or the partition held nothing to compact)."""
    from iox_spark.catalog.crash_points import CrashPoint as P

    if point in (P.TXN_AFTER_PARTS, P.TXN_AFTER_DECISION):
        pts = list(pts) + [(t, *pts[0][1:]) for t in tables if t not in {p[0] for p in pts}]
    req = new_request(requests, pts=pts)
    send(client, database, req, timeout_s)
    if req.state != "acked":
        return req
    table = pts[0][0]
    if point in (P.PERSIST_AFTER_PARQUET, P.PERSIST_AFTER_COMMIT, P.ICEBERG_BEFORE_COMMIT):
        client.persist(database, timeout_s=timeout_s)
    elif point is P.COMPACT_BEFORE_SWAP:
        client.compact(database, table, partition_key, timeout_s=timeout_s)
    elif point in (P.COMPACT_PERSISTED_AFTER_PARQUET, P.COMPACT_PERSISTED_AFTER_COMMIT):
        client.persist(database, timeout_s=timeout_s)  # a file more each time: two make a compaction
        client.compact(database, table, partition_key, timeout_s=timeout_s, persisted=True)
    elif point in (P.CONSUME_BEFORE_APPLIED, P.REPLAY_BATCH, P.DOWNSAMPLE_BEFORE_PROGRESS):
        # downsample_before_progress: the next round of a downsampler of the database emits the write
        client.wait_applied(database, req.token, timeout_s=min(timeout_s, 15.0))
    return req


def answers(client, database: str, tables) -> dict:
    """{(table, host, second): {field: value}} a server answers for `tables` (fields never written
    are no column; a key answered twice fails)."""
    got: dict = {}
    for table in sorted(tables):
        for r in client.query(database, f"SELECT * FROM {table}").to_pylist():
            key = (table, r["host"], (r["time_ns"] - T0) // S)
            assert key not in got, f"{key} answered twice"
            got[key] = {f: r[f] for f in FIELDS + ("r",) if r.get(f) is not None}
    return got


def partition_of(table: str, partitions: int) -> int:
    """The Kafka partition of a table (crc32 of its name, as docs/ARCHITECTURE.md says)."""
    return zlib.crc32(table.encode()) % partitions


@dataclasses.dataclass
class Request:
    """One request the test sent. `points`: [(table, host, second, {field: value})] in line order (a
    write); `delete`: (table, lo_s, hi_s_exclusive, host or None). `state`: "acked" (with `token`),
    "rejected" (the server refused it: nothing of it may be in the write buffer), or "unknown" (its
    answer was lost: it may be in the write buffer or not)."""

    rid: int
    points: list | None = None
    delete: tuple | None = None
    state: str = "unknown"
    token: dict | None = None

    @property
    def tables(self) -> set:
        return {p[0] for p in self.points} if self.points is not None else {self.delete[0]}


@dataclasses.dataclass(frozen=True)
class LogOp:
    """One table's part of a request as the write buffer applies it: at Kafka partition `kp`,
    `offset` (a transaction part: the offset of the decision or marker that commits it)."""

    kp: int
    offset: int
    table: str
    #: write: [(host, second, {field: value})] in row order, and the request number; delete: params
    rows: tuple | None
    rid: int | None
    delete: tuple | None
    #: the offset the message itself has (a part's own offset; else `offset`)
    message_offset: int


def _headers(msg) -> dict:
    return {k: (v.decode() if v is not None else "") for k, v in (msg.headers() or [])}


def _decode_write(table: str, value: bytes, t0_ns: int) -> tuple[tuple, int]:
    t = pa.ipc.open_stream(pa.py_buffer(value)).read_all()
    cols = t.to_pydict()
    rows, rids = [], set()
    for i in range(t.num_rows):
        fields = {f: cols[f][i] for f in cols if f not in ("host", "time", "r") and cols[f][i] is not None}
        rids.add(cols["r"][i])
        fields["r"] = cols["r"][i]
        rows.append((cols["host"][i], (cols["time"][i] - t0_ns) // _S, fields))
    assert len(rids) == 1, f"a message of {table} holds rows of several requests: {sorted(rids)}"
    return tuple(rows), rids.pop()


def _decode_delete(value: bytes, t0_ns: int) -> tuple:
    body = json.loads(value)
    host = None
    for column, op, v, _kind in body["predicate"]:
        assert (column, op) == ("host", "="), f"a delete predicate no test sends: {body['predicate']}"
        host = v
    return (body["table"], (body["start_ns"] - t0_ns) // _S, (body["stop_ns_exclusive"] - t0_ns) // _S, host)


def read_log(bootstrap: str, database: str, t0_ns: int, timeout_s: float = 30.0,
             idle_s: float = 0.0) -> tuple[list, list, dict]:
    """Reads the whole topic of `database`: (ops applied, undecided transaction parts [(kp, offset)],
    {kp: end offset (next offset)}). A transaction part is applied at the first decision or marker
    of its transaction after it on its own partition, when that says commit; one that has none yet
    is undecided. `idle_s`: past the end the broker reports, read on until nothing came for that
    long (a broker whose reported end may lag, such as Tansu on a durable store after a restart)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    topic = TOPIC_PREFIX + database
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"model-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            return [], [], {}
        kps = sorted(md.topics[topic].partitions)
        ends, todo = {}, []
        for kp in kps:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, kp), timeout=10)
            ends[kp] = hi
            if hi > lo or idle_s:
                todo.append(TopicPartition(topic, kp, lo))
        msgs: dict = {kp: [] for kp in kps}
        if todo:
            c.assign(todo)
            open_kps = {tp.partition for tp in todo if ends[tp.partition] > tp.offset}
            deadline = time.monotonic() + timeout_s
            last = time.monotonic()
            while open_kps or time.monotonic() - last < idle_s:
                assert time.monotonic() < deadline, f"the topic of {database} was not read within {timeout_s} s"
                m = c.poll(0.1 if not open_kps else 0.5)
                if m is None:
                    continue
                last = time.monotonic()
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        if m.offset() >= ends[m.partition()]:
                            open_kps.discard(m.partition())
                        continue
                    raise KafkaException(m.error())
                msgs[m.partition()].append(m)
                ends[m.partition()] = max(ends[m.partition()], m.offset() + 1)
    finally:
        c.close()
    ops, undecided = [], []
    for kp, ms in msgs.items():
        pending: dict = {}  # txn -> [(part offset, table, headers, value)] not decided yet
        for m in ms:
            h = _headers(m)
            kind = h.get("iox-kind", "")
            if kind in ("decision", "marker"):
                info = json.loads(h["iox-txn-info"])
                for off, table, ph, value in pending.pop(h["iox-txn"], []):
                    if info["decision"] == "commit":
                        ops.append(_op(kp, m.offset(), off, table, ph, value, t0_ns))
                continue
            if kind == "part":
                pending.setdefault(h["iox-txn"], []).append((m.offset(), h["iox-table"], h, m.value()))
            elif kind in ("write", "delete"):
                ops.append(_op(kp, m.offset(), m.offset(), h["iox-table"], h, m.value(), t0_ns))
            else:
                raise AssertionError(f"a message of a kind no server writes at {topic}[{kp}]@{m.offset()}: {h}")
        undecided += [(kp, off) for parts in pending.values() for off, *_ in parts]
    ops.sort(key=lambda o: (o.kp, o.offset, o.message_offset))
    return ops, undecided, ends


def _op(kp: int, at: int, own: int, table: str, headers: dict, value: bytes, t0_ns: int) -> LogOp:
    of = json.loads(headers["iox-txn-info"])["of"] if headers.get("iox-kind") == "part" else headers["iox-kind"]
    if of == "delete":
        return LogOp(kp, at, table, None, None, _decode_delete(value, t0_ns), own)
    rows, rid = _decode_write(table, value, t0_ns)
    return LogOp(kp, at, table, rows, rid, None, own)


def check_requests(requests: list, ops: list) -> None:
    """Every op is the part of a request the test sent, applied once; every acknowledged request is
    in the write buffer (at its token's offsets); no rejected request is. Resolves the requests
    whose answer was lost: "landed" (a delete's token then says where) or "lost" (safe once the
    process that produced them is gone); a request that landed stays in the write buffer."""
    by_rid = {r.rid: r for r in requests if r.points is not None}
    seen: dict = {}
    for op in ops:
        if op.rid is not None:
            req = by_rid.get(op.rid)
            assert req is not None, f"{op} is a write no request of the test made"
            key = (op.rid, op.table)
            assert key not in seen, f"request {op.rid}'s rows of {op.table} applied twice: {seen[key]} and {op}"
            seen[key] = op
            want = tuple((h, s, {**f, "r": req.rid}) for t, h, s, f in req.points if t == op.table)
            assert op.rows == want, f"request {op.rid}: the write buffer holds {op.rows}, the request was {want}"
    deletes = [r for r in requests if r.delete is not None]
    for op in ops:
        if op.delete is None:
            continue
        cands = [r for r in deletes if r.delete == op.delete and r.state != "rejected" and r.rid not in seen]
        # an acknowledged (or landed) request at this offset first, else an unknown one with the same parameters
        exact = [r for r in cands if r.token and r.token.get(op.kp) == op.message_offset]
        chosen = (exact or [r for r in cands if r.state == "unknown"] or [None])[0]
        assert chosen is not None, (
            f"{op} is a delete no request of the test made (or one applied twice); requests of it: "
            f"{[(r.rid, r.state, r.token, seen.get(r.rid)) for r in deletes if r.delete == op.delete]}; "
            f"ops of it: {[o for o in ops if o.delete == op.delete]}")
        seen[chosen.rid] = op
    for r in requests:
        present = all((r.rid, t) in seen for t in r.tables) if r.points is not None else r.rid in seen
        partly = any((r.rid, t) in seen for t in r.tables) if r.points is not None else present
        assert present or not partly, f"request {r.rid} is applied only in part: {r}"
        if r.state == "acked":
            assert present, f"acknowledged request {r.rid} is not in the write buffer: {r}"
            if r.points is not None and len(r.tables) == 1:
                op = seen[(r.rid, next(iter(r.tables)))]
                assert r.token == {op.kp: op.offset}, f"request {r.rid}: token {r.token}, in the write buffer at {op}"
        elif r.state == "landed":  # found at an earlier check: the write buffer never drops it
            assert present, f"request {r.rid}, found in the write buffer before, is no longer there: {r}"
        elif r.state == "rejected":
            assert not partly, f"rejected request {r.rid} is in the write buffer: {r}"
        elif r.state == "lost":  # found missing once its producer was gone: it cannot land later
            assert not partly, f"request {r.rid}, found missing before, is in the write buffer now: {r}"
        elif r.state == "unknown":
            r.state = "landed" if present else "lost"
            if present and r.delete is not None:  # where it is: a later check finds it there again
                r.token = {seen[r.rid].kp: seen[r.rid].message_offset}


def fold(base: dict, ops: list) -> dict:
    """{(table, host, second): {field: value}} after applying `ops` (Kafka order per partition; a
    table lives on one partition) to `base`; keys left without a field are dropped."""
    rows = {k: dict(v) for k, v in base.items()}
    for op in sorted(ops, key=lambda o: (o.kp, o.offset, o.message_offset)):
        if op.rows is not None:
            for host, sec, fields in op.rows:
                rows.setdefault((op.table, host, sec), {}).update(fields)
        else:
            table, lo, hi, host = op.delete
            for key in [k for k in rows if k[0] == table and lo <= k[2] < hi and (host is None or k[1] == host)]:
                del rows[key]
    return {k: v for k, v in rows.items() if v}
