"""Continuous downsampling: what a downsampler is, where it stands, and which windows it must emit again.

A downsampler keeps a destination table equal to an aggregation of a source table over event-time
windows of `every_ns` (aligned to the Unix epoch, as InfluxQL's GROUP BY time), per group of tags:
one output point per (group's tag values, window start), its fields `<fn>_<field>`.

Invariants kept here (the runner, server/downsampling.py, relies on them):
- A window's output is a function of the source table's rows in that window only, so emitting a
  window again (after a late point, a delete, or a replay after a crash) overwrites the earlier
  point of the same (tags, window start) under the destination's last-write-wins dedup: it can
  never duplicate or double-count.
- `Progress` names, per Kafka partition of the source database, the first offset whose effect is not
  yet emitted. Every row or delete applied at or after it lies in a persistence window, a Parquet
  file or a delete whose write-buffer position is at or after it (`changed_spans`), so the windows
  those cover are a superset of the windows that changed; a change of write-buffer epoch (seq
  origin) makes the next round emit every window again, and so does one of the destination's (its
  write buffer may have lost what was emitted: `resume_from`).
- The record of a downsampler (spec and progress) is versioned (`RECORD_FORMAT`); another version
  raises FormatVersionMismatch.

Pure functions and values; used on the driver.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from iox_spark.catalog.errors import CatalogError, FormatVersionMismatch

__all__ = ["AGGREGATE_FUNCTIONS", "RECORD_FORMAT", "KEY_PREFIX", "MAX_RANGES", "InvalidDownsampler", "Aggregate",
           "DownsamplerSpec", "Progress", "parse_aggregates", "parse_group_by", "output_columns", "window_start",
           "window_ranges", "aggregate_sql", "record_key", "encode_record", "decode_record", "changed_spans",
           "Changes", "resume_from"]

#: aggregate functions a downsampler computes; mean, min, max and sum need a numeric field
AGGREGATE_FUNCTIONS = ("mean", "min", "max", "sum", "count", "first", "last")
_NUMERIC_ONLY = frozenset({"mean", "min", "max", "sum"})
_NUMERIC_TYPES = frozenset({"float", "integer", "uinteger"})
#: version of a downsampler's stored record
RECORD_FORMAT = 1
#: where downsampler records live in the object store ('~' is not allowed in database names)
KEY_PREFIX = "iox~downsamplers/"
#: most separate time ranges one round aggregates; more are joined across their smallest gaps
MAX_RANGES = 64
_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_AGG = re.compile(r"\s*([A-Za-z_]+)\s*\(\s*([^()]+?)\s*\)\s*")
_SQL_MAX_NS = (1 << 63) - 1


class InvalidDownsampler(CatalogError):
    """A downsampler definition a user can fix: `what` names the option, `reason` says why."""

    def __init__(self, what: str, reason: str):
        self.what, self.reason = what, reason
        super().__init__(f"invalid downsampler {what}: {reason}")


@dataclass(frozen=True)
class Aggregate:
    fn: str
    field: str

    @property
    def output(self) -> str:
        """The destination field: `<fn>_<field>` (mean(usage) -> mean_usage)."""
        return f"{self.fn}_{self.field}"

    def text(self) -> str:
        return f"{self.fn}({self.field})"


@dataclass(frozen=True)
class DownsamplerSpec:
    """What a user created. `group_by` None: every tag of the source table (as it is when a window
    is emitted); `start_ns`: the first window emitted starts at or after it (aligned down)."""

    source_db: str
    table: str
    every_ns: int
    aggregates: tuple
    group_by: tuple | None
    dest_db: str
    dest_table: str
    start_ns: int = 0

    @property
    def name(self) -> str:
        """A destination table has at most one downsampler: it is named after it."""
        return f"{self.dest_db}.{self.dest_table}"

    def validate(self) -> None:
        for what, v in (("source database", self.source_db), ("destination database", self.dest_db)):
            if not _NAME.fullmatch(v or ""):
                raise InvalidDownsampler(what, f"{v!r}: only letters, digits, '_' and '-' are allowed")
        for what, v in (("table", self.table), ("destination table", self.dest_table)):
            if not v or v.startswith("_") or any(c in v for c in "\n\r\t"):
                raise InvalidDownsampler(what, f"{v!r} is not a table name")
        if (self.source_db, self.table) == (self.dest_db, self.dest_table):
            raise InvalidDownsampler("destination", "it is the source table itself")
        if self.every_ns < 1_000_000_000 or self.every_ns % 1_000_000_000:
            raise InvalidDownsampler("every", "must be a whole number of seconds, at least 1s")
        if not self.aggregates:
            raise InvalidDownsampler("aggregates", "none given")
        outs = [a.output for a in self.aggregates]
        if len(set(outs)) != len(outs):
            raise InvalidDownsampler("aggregates", f"an aggregate is named twice ({', '.join(outs)})")
        if self.group_by is not None and len(set(self.group_by)) != len(self.group_by):
            raise InvalidDownsampler("group-by-tags", "a tag is named twice")

    def to_json(self) -> dict:
        return {"source_db": self.source_db, "table": self.table, "every_ns": self.every_ns,
                "aggregates": [a.text() for a in self.aggregates],
                "group_by": None if self.group_by is None else list(self.group_by),
                "dest_db": self.dest_db, "dest_table": self.dest_table, "start_ns": self.start_ns}

    @classmethod
    def from_json(cls, d: dict) -> "DownsamplerSpec":
        return cls(d["source_db"], d["table"], int(d["every_ns"]), parse_aggregates(",".join(d["aggregates"])),
                   None if d["group_by"] is None else tuple(d["group_by"]), d["dest_db"], d["dest_table"],
                   int(d["start_ns"]))


@dataclass(frozen=True)
class Progress:
    """Where a downsampler stands in its source database: every row and delete applied below
    `next_offsets` ({kp: first offset not emitted}) of write-buffer epoch `epoch` (seq origin
    `seq_origin`) is emitted. None (no progress) = nothing emitted yet: the next round emits every
    window from the start (the backfill). `dest_epoch`: (write-buffer epoch, topic id) of the
    destination database when Kafka acknowledged the writes that emitted them (None: no destination
    yet, or a record written before it was kept); see `resume_from`."""

    epoch: int
    seq_origin: int
    next_offsets: dict = field(default_factory=dict)
    dest_epoch: tuple | None = None

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "seq_origin": self.seq_origin,
                "next_offsets": {str(k): v for k, v in sorted(self.next_offsets.items())},
                "dest_epoch": None if self.dest_epoch is None else list(self.dest_epoch)}

    @classmethod
    def from_json(cls, d: dict | None) -> "Progress | None":
        if d is None:
            return None
        dest = d.get("dest_epoch")  # absent from records of earlier versions
        return cls(int(d["epoch"]), int(d["seq_origin"]), {int(k): int(v) for k, v in d["next_offsets"].items()},
                   None if dest is None else (int(dest[0]), dest[1]))


def resume_from(progress: Progress | None, dest_epoch: tuple | None) -> Progress | None:
    """The progress a round continues from, given the destination's (write-buffer epoch, topic id)
    now: None (every window emitted again) when the destination is in another epoch than the one
    the progress was recorded in, or no longer exists (`dest_epoch` None). A database continues in a
    new epoch when its topic was found reset or its broker lost the tail (and the loss was
    accepted): the writes that emitted the windows may be among those lost. A progress that does
    not name the destination's epoch (recorded before it was kept): `progress` as it is."""
    if progress is None or progress.dest_epoch is None:
        return progress
    return progress if progress.dest_epoch == dest_epoch else None


@dataclass(frozen=True)
class Changes:
    """What a downsampler must emit again, read from a source database at one instant
    (`Database.downsample_changes`). `full`: every window from the start (no progress yet, or
    progress of another write-buffer epoch); else `row_spans` and `delete_spans`, inclusive (lo, hi)
    time spans (`changed_spans`). `applied_next`: {kp: first offset not applied} at that instant,
    the progress once they are emitted. `min_time_ns`, `max_time_ns`: the table's oldest and newest
    row time (None: no rows)."""

    full: bool
    row_spans: tuple
    delete_spans: tuple
    applied_next: dict
    epoch: int
    seq_origin: int
    min_time_ns: int | None
    max_time_ns: int | None

    def progress(self) -> Progress:
        return Progress(self.epoch, self.seq_origin, dict(self.applied_next))


def parse_aggregates(text: str) -> tuple:
    """`"mean(usage),max(usage),count(usage)"` -> (Aggregate, ...); InvalidDownsampler otherwise."""
    out = []
    for part in _split_top(text or ""):
        m = _AGG.fullmatch(part)
        if m is None:
            raise InvalidDownsampler("aggregates", f"{part.strip()!r} is not fn(field)")
        fn, fld = m.group(1).lower(), m.group(2).strip().strip('"').strip("`")
        if fn not in AGGREGATE_FUNCTIONS:
            raise InvalidDownsampler("aggregates", f"{fn!r} is not one of {', '.join(AGGREGATE_FUNCTIONS)}")
        out.append(Aggregate(fn, fld))
    if not out:
        raise InvalidDownsampler("aggregates", "none given (e.g. \"mean(usage),max(usage)\")")
    return tuple(out)


def _split_top(text: str) -> list:
    parts, depth, cur = [], 0, []
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def parse_group_by(text: str) -> tuple | None:
    """`"all"` (or empty) -> None (every tag); `"host,region"` -> ("host", "region")."""
    t = (text or "").strip()
    if t in ("", "all", "*"):
        return None
    return tuple(x.strip() for x in t.split(",") if x.strip())


def output_columns(spec: DownsamplerSpec, source: dict) -> list:
    """[(name, role, type)] the destination table gets, checked against `source` ({column: (role,
    type)} of the source table now): each aggregate's field must be a field (numeric for mean, min,
    max, sum), each group-by tag a tag. The group's tags, then one field per aggregate."""
    out = []
    tags = [c for c, (role, _t) in source.items() if role == "tag"] if spec.group_by is None else list(spec.group_by)
    for t in tags:
        role = source.get(t, (None, None))[0]
        if role != "tag":
            raise InvalidDownsampler("group-by-tags", f"{t!r} is not a tag of table {spec.table!r}")
        out.append((t, "tag", "string"))
    for a in spec.aggregates:
        role, typ = source.get(a.field, (None, None))
        if role != "field":
            raise InvalidDownsampler("aggregates", f"{a.field!r} is not a field of table {spec.table!r}")
        if a.fn in _NUMERIC_ONLY and typ not in _NUMERIC_TYPES:
            raise InvalidDownsampler("aggregates", f"{a.text()}: {a.fn} needs a numeric field, {a.field!r} is {typ}")
        out.append((a.output, "field", _output_type(a.fn, typ)))
    return out


def _output_type(fn: str, typ: str) -> str:
    if fn == "count":
        return "integer"
    if fn == "mean":
        return "float"
    return typ


def window_start(t_ns: int, every_ns: int) -> int:
    """The start of the window holding `t_ns` (floor, also before 1970)."""
    return t_ns - t_ns % every_ns


def window_ranges(spans, every_ns: int, start_ns: int, limit: int = MAX_RANGES) -> list:
    """[(lo, hi_exclusive)]: the whole windows that meet any inclusive (lo, hi) span of `spans`, from
    the window of `start_ns` on, sorted and joined where they touch; more than `limit` are joined
    across their smallest gaps (emitting a window more is always correct)."""
    first = window_start(start_ns, every_ns)
    rs = []
    for lo, hi in spans:
        hi = min(hi, _SQL_MAX_NS - every_ns)
        if hi < first:
            continue
        lo = max(window_start(lo, every_ns), first)
        rs.append((lo, window_start(hi, every_ns) + every_ns))
    rs.sort()
    out: list = []
    for lo, hi in rs:
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    while len(out) > limit:
        i = min(range(len(out) - 1), key=lambda j: out[j + 1][0] - out[j][1])
        out[i:i + 2] = [(out[i][0], out[i + 1][1])]
    return out


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def aggregate_sql(spec: DownsamplerSpec, tags: list, ranges: list) -> str:
    """The SQL (the server's dialect, over the source database) of the windows in `ranges` ([(lo,
    hi_exclusive)]): one row per (tags, window) with `_window_ns` and one column per aggregate,
    named as its destination field."""
    w = f"({_q('time_ns')} - pmod({_q('time_ns')}, {spec.every_ns}))"
    sel = [_q(t) for t in tags] + [f"{w} AS `_window_ns`"]
    for a in spec.aggregates:
        f = _q(a.field)
        expr = {"mean": f"avg({f})", "min": f"min({f})", "max": f"max({f})", "sum": f"sum({f})",
                "count": f"count({f})",
                "first": f"min_by({f}, CASE WHEN {f} IS NOT NULL THEN {_q('time_ns')} END)",
                "last": f"max_by({f}, CASE WHEN {f} IS NOT NULL THEN {_q('time_ns')} END)"}[a.fn]
        sel.append(f"{expr} AS {_q(a.output)}")
    t = _q("time_ns")
    where = " OR ".join(f"({t} >= {lo} AND {t} < {hi})" for lo, hi in ranges)
    group = ", ".join([_q(x) for x in tags] + [w])
    return f"SELECT {', '.join(sel)} FROM {_q(spec.table)} WHERE {where} GROUP BY {group}"


def record_key(name: str) -> str:
    return f"{KEY_PREFIX}{name}.json"


def encode_record(spec: DownsamplerSpec, progress: Progress | None) -> bytes:
    return json.dumps({"format": RECORD_FORMAT, "spec": spec.to_json(),
                       "progress": None if progress is None else progress.to_json()}, sort_keys=True).encode()


def decode_record(data: bytes, key: str) -> tuple:
    """(DownsamplerSpec, Progress | None) of a stored record; FormatVersionMismatch for another version."""
    d = json.loads(data)
    if d.get("format") != RECORD_FORMAT:
        raise FormatVersionMismatch(RECORD_FORMAT, d.get("format"), key)
    return DownsamplerSpec.from_json(d["spec"]), Progress.from_json(d["progress"])


def changed_spans(windows, files, deletes, since_offset: int, since_seq: int) -> tuple:
    """(inclusive time spans of rows that may have changed, of deletes) at or after a downsampler's
    progress, in one table of a database (its rows live on one Kafka partition).

    Every row of the table is either unpersisted, described by a persistence window, or in a Parquet
    file (catalog/persistence_windows.py; a persist moves rows from one to the other under the
    catalog lock). `windows`: [(max offset, min time, max time)] of its persistence windows;
    `files`: [(max seq, min time, max time)] of its Parquet files; `deletes`: [(seq, start_ns,
    stop_ns_exclusive)]. A window whose newest offset is at or after `since_offset`, a file whose
    newest `_iox_seq` is at or after `since_seq`, may hold a changed row; a delete at or after
    `since_seq` changed the rows it covers."""
    rows = [(lo, hi) for max_offset, lo, hi in windows if max_offset >= since_offset]
    rows += [(lo, hi) for max_seq, lo, hi in files if max_seq >= since_seq]
    dels = [(lo, hi_exclusive - 1) for seq, lo, hi_exclusive in deletes if seq >= since_seq and hi_exclusive > lo]
    return tuple(rows), tuple(dels)
