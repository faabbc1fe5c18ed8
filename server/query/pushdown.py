"""What a query reads of a table another pool member owns, so that the owner sends only that.

Invariant: a TableScan never leaves out a row or a column the query may read. Its condition
(`where_sql`) is built only of the query's own conditions on the table's key columns (its tags,
`time`, `time_ns`): every version of a row (an older one in a persisted file, a newer one among the
owner's unpersisted chunks) has the same key, so a row the condition drops before the asking member
merges the versions is a row the query drops after the merge. A condition on a field is never
pushed: a newer version's field value decides, and the older version is not at the owner. The
condition is the OR, over every place the query reads the table (a self-join, a subquery, a CTE),
of the AND of the key conditions of the WHERE right above it; a place with none reads every row,
and then so does the scan. The fields (`fields`, with `prune_fields`) are every field whose name
the query's text or plan spells anywhere, and every attribute name in its plan (a field the owner
knows and the asking member does not yet is named so), and only when every place the table is read
feeds an explicit projection or aggregation with no `*`; else every field travels. Tags and time always
travel (deduplication and deletes need them).

A condition is rendered from a small grammar (names, literals of strings, numbers, booleans, dates
and timestamps, comparisons, IN, BETWEEN, IS [NOT] NULL, AND, OR, NOT) and nothing else: no
function call travels, so nothing evaluated at the owner depends on its clock or on who runs it.
Timestamps are rendered as Spark renders them in the session time zone, UTC on every member
(server/runtime/spark.py).

Pure: works on the parsed plan tree the SQL sandbox reads (server/query/sql_sandbox.py
`plan_tree`); runs on the asking member's driver, before it gathers the owners' rows
(server/pool/membership.py). The owner applies a scan with `owner_filter_sql`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from iox_spark.catalog.schema import SEQ_COLUMN, TIME_NS_COLUMN, TableSchema
from iox_spark.chunk_store.views import quote
from iox_spark.server.query.sql_sandbox import child_node as _child
from iox_spark.server.query.sql_sandbox import nodes_in as _nodes_in
from iox_spark.server.query.sql_sandbox import simple_class as _simple

__all__ = ["TableScan", "scans", "owner_columns"]

#: The user layout's time column (a TIMESTAMP of the row's `time_ns`, chunk_store/views.py)
TIME_COLUMN = "time"

_COMPARISONS = {"EqualTo": "=", "EqualNullSafe": "<=>", "LessThan": "<", "LessThanOrEqual": "<=",
                "GreaterThan": ">", "GreaterThanOrEqual": ">="}
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,9})?")
#: plan nodes between a relation and the projection that reads it, which change neither its rows'
#: columns nor pass them on unread
_PASS = ("Filter", "SubqueryAlias")


@dataclass(frozen=True)
class TableScan:
    """What a query reads of `table`: rows where `where_sql` holds ("" = every row); the fields
    `fields` when `prune_fields`, else every field."""

    table: str
    where_sql: str = ""
    prune_fields: bool = False
    fields: tuple = ()


class _NotPushed(Exception):
    """A condition (or a name in it) that does not travel: the scan reads without it."""


def scans(tree, schemas: dict, sql: str) -> dict:
    """{table: TableScan} for the tables of `schemas` ({table name: TableSchema}) that the query
    whose parsed plan is `tree` (None: not readable) and whose text is `sql` reads. A table the
    query does not name, or names as a CTE, reads everything (not in the answer)."""
    out: dict = {}
    if tree is None:
        return out
    places: dict = {}  # table (lowercase) -> [(ancestors, relation node)]
    ctes: set = set()
    stars = [False]
    attrs: set = set()
    _walk(tree, [], places, ctes, stars, attrs)
    low_sql = sql.lower()
    for table, schema in schemas.items():
        if schema is None:
            continue
        key = table.lower()
        where = places.get(key)
        if not where or key in ctes:
            continue
        try:
            cond = " OR ".join(f"({_place_condition(anc, table, schema)})" for anc, _rel in where)
        except _NotPushed:
            cond = ""
        prune = not stars[0] and all(_projected(anc) for anc, _rel in where)
        fields = ()
        if prune:  # also names this member does not know as fields yet: the owner may
            spelled = {f.name.lower() for f in schema.fields() if _spelled(f.name.lower(), low_sql)}
            fields = tuple(sorted(attrs | spelled))
        if cond or prune:
            out[table] = TableScan(table, cond if len(where) > 1 else cond[1:-1] if cond else "", prune, fields)
    return out


def owner_columns(schema: TableSchema, scan: TableScan | None) -> list:
    """The chunk-layout columns of `schema` an owner sends for `scan`: tags, the fields it reads,
    `time_ns` and `_iox_seq`."""
    keep = None if scan is None or not scan.prune_fields else {f.lower() for f in scan.fields}
    cols = list(schema.tags())
    cols += [f.name for f in schema.fields() if keep is None or f.name.lower() in keep]
    return cols + [TIME_NS_COLUMN, SEQ_COLUMN]


# -- reading the plan ------------------------------------------------------------------------


def _walk(node, ancestors: list, places: dict, ctes: set, stars: list, attrs: set) -> None:
    """Collects, in the whole tree (children, subqueries, CTE definitions): each relation read with
    its ancestors, the CTE names, whether a `*` occurs, and every attribute name."""
    cls = _simple(node["class"])
    if "Star" in cls or "Regex" in cls:
        stars[0] = True
    fields = node["fields"]
    if cls == "UnresolvedRelation":
        name = _name(fields.get("multipartIdentifier"))
        if name is not None and len(name) == 1:
            places.setdefault(name[0].lower(), []).append((list(ancestors), node))
    elif cls == "UnresolvedAttribute":
        parts = _name(fields.get("nameParts"))
        if parts is not None:  # each part, and the whole (one name may hold ", ")
            attrs.add(", ".join(parts).lower())
            attrs.update(p.lower() for p in parts)
    elif cls == "Join":
        jt = fields.get("joinType")
        if isinstance(jt, dict) and _simple(str(jt.get("product-class", ""))) in ("NaturalJoin", "UsingJoin"):
            stars[0] = True  # columns joined by name, not spelled: read them all
    elif cls == "UnresolvedWith":
        for rel in fields.get("cteRelations") or ():
            if isinstance(rel, dict) and isinstance(rel.get("_1"), str):
                ctes.add(rel["_1"].lower())
    here = ancestors + [node]
    for child in node["children"]:
        _walk(child, here, places, ctes, stars, attrs)
    for name, value in fields.items():
        for sub in _nodes_in(value):
            if all(sub is not c for c in node["children"]):
                _walk(sub, here, places, ctes, stars, attrs)


def _name(raw) -> tuple | None:
    """A multi-part name from its JSON rendering "[a, b]" (None when it may be ambiguous)."""
    if isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        return tuple(raw)
    if isinstance(raw, str) and raw.startswith("[") and raw.endswith("]"):
        inner = raw[1:-1]
        return tuple(inner.split(", ")) if inner else None
    return None


def _projected(ancestors: list) -> bool:
    """Whether the relation's nearest ancestor past WHEREs and aliases is a projection or an
    aggregation (which name every column they pass on)."""
    for node in reversed(ancestors):
        cls = _simple(node["class"])
        if cls in _PASS:
            continue
        return cls in ("Project", "Aggregate")
    return False  # the relation is the query (TABLE t): every column is its answer


def _spelled(name: str, low_sql: str) -> bool:
    return name in low_sql and re.search(r"(?<![\w$])" + re.escape(name) + r"(?![\w$])", low_sql) is not None


# -- conditions -------------------------------------------------------------------------------


def _place_condition(ancestors: list, table: str, schema: TableSchema) -> str:
    """The AND of the key conditions of the WHEREs right above one place the table is read
    (_NotPushed: none)."""
    alias = table.lower()
    terms: list = []
    for node in reversed(ancestors):
        cls = _simple(node["class"])
        if cls == "SubqueryAlias":
            ident = node["fields"].get("identifier")
            name = ident.get("name") if isinstance(ident, dict) else None
            if not isinstance(name, str):
                break
            alias = name.lower()
        elif cls == "Filter":
            cond = _child(node, "condition")
            if cond is None:
                break
            for term in _conjuncts(cond):
                try:
                    terms.append(_render(term, alias, _key_columns(schema)))
                except _NotPushed:
                    pass
        else:
            break
    if not terms:
        raise _NotPushed("no key condition")
    return " AND ".join(terms)


def _key_columns(schema: TableSchema) -> dict:
    """{lowercase name: name} of the columns a pushed condition may name."""
    keys = {t.lower(): t for t in schema.tags()}
    if len(keys) != len(schema.tags()) or TIME_COLUMN in keys or TIME_NS_COLUMN in keys:
        return {}  # names that differ in case only: which one a name means is Spark's to say
    keys[TIME_COLUMN] = TIME_COLUMN
    keys[TIME_NS_COLUMN] = TIME_NS_COLUMN
    return keys


def _conjuncts(node: dict):
    if _simple(node["class"]) == "And":
        for side in ("left", "right"):
            child = _child(node, side)
            if child is None:
                raise _NotPushed("And")
            yield from _conjuncts(child)
    else:
        yield node


def _render(node: dict, alias: str, keys: dict) -> str:
    """`node` as Spark SQL over the owner's rows; _NotPushed outside the grammar."""
    cls = _simple(node["class"])
    f = node["fields"]
    if cls == "UnresolvedAttribute":
        parts = _name(f.get("nameParts"))
        if parts is None or any(", " in k for k in keys):  # "[a, b]" may then be one name holding ", "
            raise _NotPushed("name")
        parts = list(parts)
        if len(parts) == 2 and parts[0].lower() == alias:
            parts = parts[1:]
        if len(parts) != 1 or parts[0].lower() not in keys:
            raise _NotPushed("not a key column")
        return quote(keys[parts[0].lower()])
    if cls == "Literal":
        return _literal(f.get("value"), f.get("dataType"))
    if cls in _COMPARISONS:
        return f"({_side(node, 'left', alias, keys)} {_COMPARISONS[cls]} {_side(node, 'right', alias, keys)})"
    if cls in ("And", "Or"):
        return f"({_side(node, 'left', alias, keys)} {cls.upper()} {_side(node, 'right', alias, keys)})"
    if cls in ("Not", "IsNull", "IsNotNull"):
        inner = _side(node, "child", alias, keys)
        return f"(NOT {inner})" if cls == "Not" else f"({inner} IS {'NOT ' if cls == 'IsNotNull' else ''}NULL)"
    if cls == "In":
        value = _side(node, "value", alias, keys)
        items = f.get("list")
        if not isinstance(items, list) or not items:
            raise _NotPushed("In")
        rendered = []
        for i in items:
            if not isinstance(i, int) or not 0 <= i < len(node["children"]):
                raise _NotPushed("In")
            rendered.append(_render(node["children"][i], alias, keys))
        return f"({value} IN ({', '.join(rendered)}))"
    if cls == "UnresolvedFunction" and f.get("nameParts") == "[between]" and not f.get("isDistinct"):
        args = f.get("arguments")
        if not isinstance(args, list) or len(args) != 3 or not all(
                isinstance(i, int) and 0 <= i < len(node["children"]) for i in args):
            raise _NotPushed("between")
        a, lo, hi = (_render(node["children"][i], alias, keys) for i in args)
        return f"({a} BETWEEN {lo} AND {hi})"
    raise _NotPushed(cls)


def _side(node: dict, field: str, alias: str, keys: dict) -> str:
    child = _child(node, field)
    if child is None:
        raise _NotPushed(field)
    return _render(child, alias, keys)


def _literal(value, data_type) -> str:
    if not isinstance(value, str) or not isinstance(data_type, str):
        raise _NotPushed("literal")  # NULL, or a rendering not understood
    if data_type == "string":
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if data_type in ("integer", "long", "short", "byte") or data_type.startswith("decimal("):
        if _NUMBER.fullmatch(value) is None or "e" in value.lower():
            raise _NotPushed("number")
        return value if data_type != "long" else f"{value}L"
    if data_type == "double":
        if _NUMBER.fullmatch(value) is None:
            raise _NotPushed("double")
        return f"{value}D"
    if data_type == "boolean" and value in ("true", "false"):
        return value
    if data_type == "date" and _DATE.fullmatch(value):
        return f"DATE '{value}'"
    if data_type == "timestamp" and _TIMESTAMP.fullmatch(value):
        return f"TIMESTAMP '{value}'"
    raise _NotPushed(data_type)
