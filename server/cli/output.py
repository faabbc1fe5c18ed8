"""Query results as people and scripts read them: a table, CSV, or JSON lines; and `iox verify`'s report.

Invariant (`--format json`): one JSON object per row, and every number a JSON number, exact
(int64, uint64, decimals, floats); see `json_value`. Used by `iox sql` and `iox demo`.
"""
from __future__ import annotations

import base64
import csv
import json
import math
import sys
from decimal import Decimal

__all__ = ["print_table", "json_value", "format_verify_report"]


def json_value(v) -> str:
    """One value of a query result as JSON text (`iox sql --format json`).

    Every number is a JSON number: int64, uint64 (which Spark returns as decimal(20,0)) and other
    decimals exactly as they are, floats as Python's shortest round-trip form. NaN, inf and -inf
    have no JSON number: they are written as null (as a SQL NULL is). Strings are JSON strings,
    binary values base64 strings, lists and maps JSON arrays (a map an array of [key, value] pairs,
    as Arrow gives it), structs JSON objects; anything else (timestamps, dates) its str().
    """
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "null"
    if isinstance(v, Decimal):
        return format(v, "f") if v.is_finite() else "null"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return json.dumps(base64.b64encode(bytes(v)).decode("ascii"))
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {json_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(json_value(x) for x in v) + "]"
    return json.dumps(str(v))


def print_table(table, fmt: str, out=sys.stdout) -> None:
    """Writes an Arrow table to `out` as `fmt`: table (aligned, with a row count), csv or json."""
    rows = table.to_pylist()
    cols = table.column_names
    if fmt == "json":
        for r in rows:
            out.write(json_value(r) + "\n")
        return
    if fmt == "csv":
        w = csv.writer(out)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r[c] is None else r[c] for c in cols])
        return
    cells = [[("" if r[c] is None else str(r[c])) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out.write(sep + "\n| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |\n" + sep + "\n")
    for row in cells:
        out.write("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |\n")
    out.write(sep + f"\n{len(rows)} row(s)\n")


def format_verify_report(r: dict) -> str:
    """`iox verify`'s report (the client's dict of a VerifyResponse) as text: per Kafka partition what
    was read and compared, then each difference listed, then a verdict line."""
    lines = []
    for p in r["partitions"]:
        kp = p["partition"]
        if p["not_verified"]:
            lines.append(f"partition {kp}: NOT CHECKED: {p['not_verified']}")
            continue
        by = f" by {p['verified_by']}" if p["verified_by"] else ""
        hist = "" if p["complete"] else " (Kafka no longer holds the start of the history: older rows checked " \
                                         "only where later messages decide them)"
        lines.append(f"partition {kp}{by}: offsets [{p['from_offset']}, {p['to_exclusive']}), answers at "
                     f"{p['visible_hi_inclusive']}; {p['messages']} message(s) ({p['messages_skipped']} skipped as "
                     f"the consumer skips them), {len(p['tables'])} table(s), {p['rows_compared']} row(s) equal, "
                     f"{p['rows_unjudged']} not judged, {p['difference_count']} difference(s){hist}")
        for d in p["differences"]:
            tags = ",".join(f"{k}={v}" for k, v in sorted(d["tags"].items()))
            lines.append(f"  {d['kind']:9} {d['table']}{',' + tags if tags else ''} time_ns={d['time_ns']}: "
                         f"write buffer {json.dumps(d['want'])}, answer {json.dumps(d['got'])}; offsets {d['offsets']}")
        if p["difference_count"] > len(p["differences"]):
            lines.append(f"  ... and {p['difference_count'] - len(p['differences'])} more")
    verdict = "OK: the answers equal the write buffer" if r["ok"] else \
        f"FAILED: {r['difference_count']} difference(s)" + \
        (", some partitions not checked" if any(p["not_verified"] for p in r["partitions"]) else "")
    lines.append(f"{r['database']}: {verdict}")
    return "\n".join(lines)
