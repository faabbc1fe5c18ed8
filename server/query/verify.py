"""`iox verify`: the server checks what it answers against its write buffer.

What it checks (invariants 1-4 and 7b of docs/ARCHITECTURE.md): a query of a table answers the
fold of every message of that table the write buffer holds, from the earliest offset Kafka still
retains: per tag set and time, each field takes its last value in write-buffer order; a delete
removes the matching rows written before it; a committed transaction part counts at the offset
of the decision or marker that committed it (aborted and undecided parts do not count); messages
the consumer skips (unreadable headers or payloads, poisoned messages an operator accepted) are
skipped; rows older than the retention are left out. The fold is computed here, on the driver,
from the raw messages, with none of the consume, compaction, persist or replay code: what it
checks is everything those did.

How a running server is compared (`verify_partition`): each table is queried first, and the
query reports the offsets it reflects (`visible_hi_inclusive`, V); the write buffer is read
after the query, up to its end E. A row only messages after V touch may show any state it had
between V and E (writes kept arriving while the query ran); every other row must equal the fold.

What the write buffer cannot say: when Kafka no longer holds the start of a table's history
(retention dropped old offsets, or the topic was replaced: a new write-buffer epoch), rows older
than the first retained message are unknown. A table's history is complete when every file the
catalog holds of it was written from offsets Kafka still holds (`_iox_seq` of its first row at
or above the first retained offset's). Otherwise a row is compared only where the retained
messages determine it: the fields they wrote must have their values, a row a retained delete
removed (and nothing wrote again) must be absent; any other row is left unjudged (counted).
A delete whose predicate names a field is applied to rows as they were stored (merged rows once
persisted), so the rows it may touch are left unjudged too.

Where it runs: the server's driver, in the thread of a Verify RPC; it reads the whole retained
topic partition and the whole table, so it costs about as much as a replay plus a full scan.
Nothing here changes the catalog or the write buffer.
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from iox_spark.catalog.delete_predicate import from_json
from iox_spark.catalog.retention import reader_lo_ns
from iox_spark.catalog.schema import TIME_NS_COLUMN
from iox_spark.catalog.seq_layout import seq_base
from iox_spark.catalog.sharding import topic_for
from iox_spark.catalog.transactions import COMMIT, DECISION, MARKER, PART
from iox_spark.server.errors import ServerError
from iox_spark.server.write_buffer.kafka_source import LIST_FETCH_WAIT_MS, consumer_positions, reader_consumer
from iox_spark.server.write_buffer.wire_format import (SUPPORTED_FORMATS, WireFormatMismatch, decode_payload, decoded_problem,
                                             header_problem, header_text)

__all__ = ["Difference", "PartitionReport", "VerifyReport", "VerifyFailed", "verify_partition", "merge_reports",
           "report_to_proto", "report_from_proto", "DEFAULT_MAX_DIFFERENCES", "TableFold", "compare"]

log = logging.getLogger(__name__)

#: differences a report lists (all are counted)
DEFAULT_MAX_DIFFERENCES = 20
#: offsets of the messages that decided a row, kept per row for the report
_OFFSETS_KEPT = 4
_NS_PER_DAY = 86_400 * 1_000_000_000
#: how long reading a partition's retained messages may go without a message before it fails
_READ_STALL_S = 60.0


class VerifyFailed(ServerError):
    """The write buffer could not be read to its end (the check itself could not run)."""

    def __init__(self, database: str, partition: int, reason: str):
        self.database = database
        self.partition = partition
        self.reason = reason
        super().__init__(f"database {database!r}: cannot verify Kafka partition {partition}: {reason}")


@dataclass(frozen=True)
class Difference:
    """One row where the answer and the write buffer disagree. `kind`: "missing" (the write buffer
    has it, the answer does not), "extra" (the answer has a row the write buffer does not), or
    "different" (field values differ). `want` / `got`: {field: value} (None: no row); `offsets`:
    the Kafka offsets of the messages that decided the row, latest last."""

    table: str
    kind: str
    tags: dict
    time_ns: int
    want: dict | None
    got: dict | None
    partition: int
    offsets: tuple = ()


@dataclass
class PartitionReport:
    """What was checked of one Kafka partition."""

    partition: int
    #: first offset Kafka still holds, and the end read (exclusive)
    from_offset: int = 0
    to_exclusive: int = 0
    #: the offset the answers reflect (the smallest over the partition's tables); rows touched only
    #: after it are compared with every state they had up to `to_exclusive`
    visible_hi_inclusive: int = -1
    #: whether the retained messages hold the whole history of every table checked
    complete: bool = True
    tables: list = field(default_factory=list)
    rows_compared: int = 0
    rows_unjudged: int = 0
    messages: int = 0
    messages_skipped: int = 0
    differences: list = field(default_factory=list)
    difference_count: int = 0
    #: why it was not checked ("" when it was): not owned here, its owner unreachable, ...
    not_verified: str = ""
    #: the member that checked it (in an ingester pool)
    verified_by: str = ""


@dataclass
class VerifyReport:
    database: str
    partitions: list = field(default_factory=list)

    @property
    def difference_count(self) -> int:
        return sum(p.difference_count for p in self.partitions)

    @property
    def ok(self) -> bool:
        return self.difference_count == 0 and not any(p.not_verified for p in self.partitions)


def merge_reports(database: str, reports: list) -> VerifyReport:
    """One report of several members' reports (each of the partitions it owns), by partition."""
    by_kp = {}
    for r in reports:
        for p in r.partitions:
            if p.partition not in by_kp or (by_kp[p.partition].not_verified and not p.not_verified):
                by_kp[p.partition] = p
    return VerifyReport(database, [by_kp[kp] for kp in sorted(by_kp)])


# -- the fold ---------------------------------------------------------------------------------------


class _Row:
    """One (tags, time) of a table in the fold: its fields, whether they are all it has (`exact`:
    the table's history is complete, or a retained delete removed what came before), the offsets
    that decided it, and, once a message after the answers' watermark touched it, every state it
    had from that watermark on."""

    __slots__ = ("fields", "exact", "offsets", "states", "unjudged")

    def __init__(self, exact: bool):
        self.fields: dict = {}
        self.exact = exact
        self.offsets: list = []
        self.states: list | None = None
        self.unjudged = False

    def state(self) -> tuple:
        return dict(self.fields), self.exact


@dataclass
class _Delete:
    offset: int
    start_ns: int
    stop_ns_exclusive: int
    terms: list  # [(column, op, value)] on tags
    on_fields: bool


class TableFold:
    """The fold of one table's messages (see the module docstring)."""

    def __init__(self, table: str, tags: list, fields: list, complete: bool):
        self.table = table
        self.tags = list(tags)
        self.fields = set(fields)
        self.complete = complete
        self.rows: dict = {}  # (tag values, time_ns) -> _Row
        self.by_day: dict = defaultdict(set)  # day number -> keys
        self.deletes: list = []  # _Delete, in order
        #: once past the answers' watermark: every change is recorded as a state
        self.late = False

    def _key_tags(self, tag_values: dict) -> tuple:
        return tuple(tag_values.get(t) for t in self.tags)

    def _touch(self, key) -> _Row:
        r = self.rows.get(key)
        if r is None:  # what it had before is known: none, or whatever a retained delete left (nothing)
            r = self.rows[key] = _Row(exact=self.complete or self._removed_before(key))
            self.by_day[key[1] // _NS_PER_DAY].add(key)
        if self.late and r.states is None:
            r.states = [r.state()]
        return r

    def write(self, kp: int, offset: int, t, roles: dict) -> None:
        """The rows of a write message (decoded payload `t`, columns' roles {name: role})."""
        cols = {n: t.column(n).to_pylist() for n in t.column_names}
        for name, role in roles.items():
            if role == "tag" and name not in self.tags:
                self.tags.append(name)  # a tag that appears later: earlier keys have no value for it
                self._rekey()
            elif role == "field":
                self.fields.add(name)
        tag_cols = [n for n in t.column_names if roles.get(n) == "tag"]
        field_cols = [n for n in t.column_names if roles.get(n) == "field"]
        times = cols["time"]
        for i in range(t.num_rows):
            key = (self._key_tags({n: cols[n][i] for n in tag_cols}), times[i])
            r = self._touch(key)
            for f in field_cols:
                v = cols[f][i]
                if v is not None:
                    r.fields[f] = v
            _note(r, kp, offset)
            if self.late:
                r.states.append(r.state())

    def _rekey(self) -> None:
        n = len(self.tags)
        rows, self.rows, self.by_day = self.rows, {}, defaultdict(set)
        for (tags, ts), r in rows.items():
            key = (tuple(tags) + (None,) * (n - len(tags)), ts)
            self.rows[key] = r
            self.by_day[ts // _NS_PER_DAY].add(key)

    def delete(self, kp: int, offset: int, start_ns: int, stop_ns_exclusive: int, terms: list) -> None:
        """A delete at `offset` of the rows in [start_ns, stop_ns_exclusive) its `terms`
        [(column, op, value)] match."""
        if any(col not in self.tags and col not in self.fields for col, _op, _v in terms):
            return  # a column the table lacks is NULL: nothing matches
        d = _Delete(offset, start_ns, stop_ns_exclusive, terms, any(col in self.fields for col, _op, _v in terms))
        self.deletes.append(d)
        for key in list(self._keys_in(d.start_ns, d.stop_ns_exclusive)):
            if not _matches(d, self.tags, key[0]):
                continue
            r = self._touch(key)
            if d.on_fields:
                r.unjudged = True
                continue
            r.fields = {}
            r.exact = True
            _note(r, kp, offset)
            if self.late:
                r.states.append(r.state())

    def _keys_in(self, start_ns: int, stop_ns_exclusive: int):
        if stop_ns_exclusive <= start_ns:
            return
        for day in range(start_ns // _NS_PER_DAY, (stop_ns_exclusive - 1) // _NS_PER_DAY + 1):
            for key in self.by_day.get(day, ()):
                if start_ns <= key[1] < stop_ns_exclusive:
                    yield key

    def _removed_before(self, key) -> bool:
        """Whether a retained delete (on tags) removed `key` before now."""
        return any(not d.on_fields and d.start_ns <= key[1] < d.stop_ns_exclusive and _matches(d, self.tags, key[0])
                   for d in self.deletes)

    def removed_by_retained_delete(self, key) -> tuple[bool, bool]:
        """(a retained delete removes `key`, one after the watermark does) for a row the retained
        writes never touched (a table whose history is not complete)."""
        hit = late = False
        for d in self.deletes:
            if d.start_ns <= key[1] < d.stop_ns_exclusive and _matches(d, self.tags, key[0]):
                hit = True
                late = late or d.offset > self.watermark
        return hit, late

    watermark = -1


def _note(r: _Row, kp: int, offset: int) -> None:
    if not r.offsets or r.offsets[-1] != offset:
        r.offsets.append(offset)
        del r.offsets[:-_OFFSETS_KEPT]


def _matches(d: _Delete, tags: list, tag_values: tuple) -> bool:
    values = dict(zip(tags, tag_values))
    for col, op, value in d.terms:
        if col not in values:
            if d.on_fields:
                continue  # a field: decided where the rows were stored
            return False
        v = values[col]
        if v is None or (v == value) != (op == "="):
            return False
    return True


# -- reading the write buffer -----------------------------------------------------------------------


def _read_partition(bootstrap: str, database: str, topic: str, kp: int, start: int, end: int):
    """Yields every message of `topic`[`kp`] in [start, end), in offset order; an offset with no
    message (a control record, a record compacted away) is passed over."""
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    c = reader_consumer(bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})  # it reads whole partitions
    try:
        c.assign([TopicPartition(topic, kp, start)])
        last = time.monotonic()
        while True:
            msgs = c.consume(500, timeout=0.5)
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise VerifyFailed(database, kp, str(m.error()))
                if m.offset() >= end:
                    return
                last = time.monotonic()
                yield m
                if m.offset() >= end - 1:
                    return
            pos = consumer_positions(c, topic, [kp]).get(kp, -1)
            if pos >= end:
                return
            if time.monotonic() - last > _READ_STALL_S:
                raise VerifyFailed(database, kp, f"no message past offset {pos} for {_READ_STALL_S:.0f} s "
                                                 f"(the end read was {end})")
    finally:
        c.close()


def _headers(m) -> dict:
    return {k: v for k, v in (m.headers() or [])}


def _roles(schema_text: str) -> dict:
    return {name: role for name, role, _typ in json.loads(schema_text)}


def _delete_of(value: bytes) -> tuple:
    """(start_ns, stop_ns_exclusive, [(column, op, value)]) of a delete message's value; ValueError,
    KeyError or TypeError for one the router could not have written (the consumer skips it)."""
    body = json.loads(value)
    terms = from_json(body["predicate"])
    if body["table"] is not None and not isinstance(body["table"], str):
        raise TypeError(f"table {body['table']!r}")
    return int(body["start_ns"]), int(body["stop_ns_exclusive"]), [(t.column, t.op, t.value) for t in terms]


# -- the check --------------------------------------------------------------------------------------


def verify_partition(*, database: str, kp: int, tables: list, catalog, query, bootstrap: str, bounds,
                     max_differences: int = DEFAULT_MAX_DIFFERENCES, member: str = "",
                     every_table: bool = True) -> PartitionReport:
    """Checks `tables` (all on Kafka partition `kp` of `database`) against the write buffer; with
    `every_table`, also each other table the write buffer holds on `kp`: one the server did not
    know once the queries ran has every row it should hold missing (one it came to know while they
    ran is compared as written after the watermark).

    `query(table)` -> (iterable of Arrow record batches of ``SELECT *``, visible_hi_inclusive
    {kp: offset}) runs the user's query path; `bounds()` -> (first offset Kafka holds, end), called
    once those queries ran (see the module docstring). Without a table to query, the watermark is
    what the catalog applied. Driver side."""
    db = catalog.database(database)
    rep = PartitionReport(partition=kp, verified_by=member, tables=sorted(tables))
    schemas, origin, accepted, files_min_seq, retention_s = db.verify_inputs(tables, kp)
    lo_before = reader_lo_ns(retention_s, time.time())
    got: dict = {}
    visible = None
    for t in tables:
        batches, vis = query(t)
        v = vis.get(kp, -1)
        visible = v if visible is None else min(visible, v)
        got[t] = _answer_rows(batches, schemas[t])
    lo_after = reader_lo_ns(retention_s, time.time())
    if visible is None:
        visible = db.applied_offsets().get(kp, -1)
    known_after = set(db.known_tables())
    start, end = bounds()
    rep.from_offset, rep.to_exclusive = start, end
    rep.visible_hi_inclusive = -1 if visible is None else visible
    first_seq = seq_base(origin, start)
    folds = {}
    for t in tables:
        complete = all(s >= first_seq for s in files_min_seq[t])
        rep.complete = rep.complete and complete
        sch = schemas[t]
        folds[t] = TableFold(t, sch.tags() if sch is not None else [],
                              [c.name for c in sch.fields()] if sch is not None else [], complete)
        folds[t].watermark = rep.visible_hi_inclusive

    late = [False]  # the message being applied is after the answers' watermark

    def new_fold(table: str) -> TableFold:  # a table of the write buffer not queried
        f = TableFold(table, [], [], True)
        f.watermark = rep.visible_hi_inclusive
        # one the server knew only once the queries ran: born meanwhile, every row of it is late
        f.late = late[0] or table in known_after
        if table in known_after:
            f.watermark = -1
        got[table] = {}
        return f

    fold_for = new_fold if every_table else None

    topic = topic_for(database)
    pending: dict = defaultdict(list)  # txn -> [(offset, headers, value)] parts not decided yet
    for m in _read_partition(bootstrap, database, topic, kp, start, end):
        rep.messages += 1
        off = m.offset()
        if off > rep.visible_hi_inclusive and not late[0]:
            late[0] = True
            for f in folds.values():
                f.late = True
        h = _headers(m)
        fmt, kind = header_text(h, "iox-format"), header_text(h, "iox-kind")
        if fmt and fmt not in SUPPORTED_FORMATS:
            raise WireFormatMismatch(int(max(SUPPORTED_FORMATS)), fmt, topic, off)
        if off in accepted or header_problem(fmt, kind, header_text(h, "iox-table"), header_text(h, "iox-schema"),
                                             header_text(h, "iox-days"), header_text(h, "iox-txn"),
                                             header_text(h, "iox-txn-info")) is not None:
            rep.messages_skipped += 1
            continue
        if kind == PART:
            pending[header_text(h, "iox-txn")].append((off, h, m.value()))
            continue
        if kind in (DECISION, MARKER):
            decision = json.loads(header_text(h, "iox-txn-info")).get("decision")
            for _part_off, ph, value in pending.pop(header_text(h, "iox-txn"), []):
                if decision == COMMIT:
                    of = json.loads(header_text(ph, "iox-txn-info"))["of"]
                    rep.messages_skipped += not _apply(folds, kp, off, of, ph, value, fold_for)
            continue
        rep.messages_skipped += not _apply(folds, kp, off, kind, h, m.value(), fold_for)
    rep.tables = sorted(folds)
    for t, f in sorted(folds.items()):
        compare(rep, f, got[t], lo_before, lo_after, max_differences)
    return rep


def _apply(folds: dict, kp: int, offset: int, kind: str, headers: dict, value: bytes, new_fold) -> bool:
    """Applies one message at `offset` to the folds it concerns; False when the consumer skips it.
    A write of another table gets a fold of its own (`new_fold(table)`, unless None): the server
    does not know that table, so its rows are missing from every answer."""
    table = header_text(headers, "iox-table")
    if kind == "write":
        try:
            t = decode_payload(value)
        except Exception:  # untrusted bytes: the consumer skips what does not decode
            return False
        if decoded_problem(t) is not None:
            return False
        f = folds.get(table)
        if f is None:
            if new_fold is None:
                return True
            f = folds[table] = new_fold(table)
        f.write(kp, offset, t, _roles(header_text(headers, "iox-schema")))
        return True
    if kind == "delete":
        try:
            start, stop, terms = _delete_of(value)
        except (ValueError, KeyError, TypeError):
            return False
        for f in ([folds[table]] if table in folds else [] if table else list(folds.values())):
            f.delete(kp, offset, start, stop, terms)
        return True
    return True


def _answer_rows(batches, schema) -> dict:
    """{(tag values, time_ns): {field: value}} of a query's answer (a field NULL: absent)."""
    tags = schema.tags() if schema is not None else []
    fields = [c.name for c in schema.fields()] if schema is not None else []
    out: dict = {}
    dup: set = set()
    for b in batches:
        cols = {n: b.column(n).to_pylist() for n in b.schema.names}
        for i in range(b.num_rows):
            key = (tuple(cols[t][i] if t in cols else None for t in tags), cols[TIME_NS_COLUMN][i])
            row = {}
            for f in fields:
                v = cols[f][i] if f in cols else None
                if v is not None:
                    row[f] = int(v) if isinstance(v, Decimal) else v
            if key in out:
                dup.add(key)
            out[key] = row
    for key in dup:
        out[key] = {**out[key], "__twice__": True}
    return out


def compare(rep: PartitionReport, fold: TableFold, got: dict, lo_before, lo_after, max_differences: int) -> None:
    tags = fold.tags

    def differ(kind, key, want, have, offsets=()):
        rep.difference_count += 1
        if len(rep.differences) < max_differences:
            rep.differences.append(Difference(fold.table, kind, {t: v for t, v in zip(tags, key[0]) if v is not None},
                                              key[1], want, have, rep.partition, tuple(offsets)))

    # the answer's keys over the fold's tags (a tag the fold learned late: the answer's schema has it too)
    answer = {}
    for (tag_values, ts), row in got.items():
        answer[(tuple(tag_values) + (None,) * (len(tags) - len(tag_values)), ts)] = row
    for key in set(fold.rows) | set(answer):
        ts = key[1]
        if lo_after is not None and ts < lo_after:
            if lo_before is not None and ts < lo_before and key in answer:
                differ("extra", key, None, answer[key])  # older than the retention, answered anyway
            continue
        have = answer.get(key)
        if have is not None and have.pop("__twice__", False):
            differ("different", key, None, have)  # one key answered twice
            continue
        r = fold.rows.get(key)
        if r is None:  # only in the answer
            if fold.complete:
                differ("extra", key, None, have)
                continue
            hit, late = fold.removed_by_retained_delete(key)
            if hit and not late:
                differ("extra", key, None, have)
            else:
                rep.rows_unjudged += 1
            continue
        if r.unjudged:
            rep.rows_unjudged += 1
            continue
        states = r.states if r.states is not None else [r.state()]
        if any(_agrees(fields, exact, have) for fields, exact in states):
            rep.rows_compared += have is not None  # a row deleted and not answered is no row
            continue
        want, exact = states[-1] if r.states is None else states[0]
        kind = "missing" if have is None else ("extra" if not want and exact else "different")
        differ(kind, key, want or None, have, r.offsets)


def _agrees(fields: dict, exact: bool, have: dict | None) -> bool:
    """Whether an answered row (None: no row) is the fold's state (`fields`; `exact`: nothing else)."""
    if exact:
        return (have or {}) == fields and (have is None) == (not fields)
    if not fields:
        return True  # nothing known of it
    return have is not None and all(have.get(f) == v for f, v in fields.items())


# -- the report as a gRPC message ---------------------------------------------------------------------


def report_to_proto(report: VerifyReport):
    """The VerifyResponse of a report."""
    from iox_spark.iox import management_pb2

    resp = management_pb2.VerifyResponse(database=report.database, difference_count=report.difference_count,
                                         ok=report.ok)
    for p in report.partitions:
        vp = resp.partitions.add(partition=p.partition, from_offset=p.from_offset, to_exclusive=p.to_exclusive,
                                 visible_hi_inclusive=p.visible_hi_inclusive, complete=p.complete, tables=p.tables,
                                 rows_compared=p.rows_compared, rows_unjudged=p.rows_unjudged, messages=p.messages,
                                 messages_skipped=p.messages_skipped, difference_count=p.difference_count,
                                 not_verified=p.not_verified, verified_by=p.verified_by)
        for d in p.differences:
            vp.differences.add(table=d.table, kind=d.kind, tags={k: str(v) for k, v in d.tags.items()},
                               time_ns=d.time_ns, want_json=json.dumps(d.want), got_json=json.dumps(d.got),
                               partition=d.partition, offsets=list(d.offsets))
    return resp


def report_from_proto(resp) -> VerifyReport:
    """A report of a VerifyResponse (another pool member's)."""
    parts = []
    for vp in resp.partitions:
        p = PartitionReport(partition=vp.partition, from_offset=vp.from_offset, to_exclusive=vp.to_exclusive,
                            visible_hi_inclusive=vp.visible_hi_inclusive, complete=vp.complete,
                            tables=list(vp.tables), rows_compared=vp.rows_compared, rows_unjudged=vp.rows_unjudged,
                            messages=vp.messages, messages_skipped=vp.messages_skipped,
                            difference_count=vp.difference_count, not_verified=vp.not_verified,
                            verified_by=vp.verified_by)
        p.differences = [Difference(d.table, d.kind, dict(d.tags), d.time_ns, json.loads(d.want_json),
                                    json.loads(d.got_json), d.partition, tuple(d.offsets)) for d in vp.differences]
        parts.append(p)
    return VerifyReport(resp.database, parts)
