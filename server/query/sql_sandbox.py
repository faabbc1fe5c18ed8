"""The Query API's sandbox: a user's SQL runs only if it is a read-only query over the tables of
the request's database.

Invariant: a statement sent to the Query API reaches Spark only when its parsed plan (Spark's own
parser, with the configuration of the session the query then runs in) is a query: SELECT, WITH,
VALUES, TABLE, set operations, EXPLAIN or DESCRIBE of a query, or SHOW TABLES / SHOW COLUMNS /
DESCRIBE of a table. Every plan node of it, in subqueries, CTE definitions and EXPLAIN's plan too,
is one of `_QUERY_PLANS`; every relation is a single-part name, either a CTE in scope or a name
the query engine then requires to be one of the database's table views (`require_tables`); every
function is a builtin one outside DENIED_FUNCTIONS and every table-valued function a builtin one
outside DENIED_TABLE_FUNCTIONS. Anything else is refused with a QueryRefused (server/errors.py)
naming what was refused: a statement that is not a query (DDL, DML, SET, ADD JAR, CACHE, ...:
NotAQuery), a path read such as text.`/etc/passwd` (PathReadRefused), another database's view, a
global or any other view or table (RelationRefused), a function reaching the JVM or the host such
as reflect (FunctionRefused), or a query construct outside the sandbox such as TRANSFORM ... USING
or a dynamic IDENTIFIER(...) (ConstructRefused). The plan that runs is the plan checked
(`checked_dataframe`), never a second parse of the text. Should a plan slip past the check anyway,
the query's session reads no path (`spark.sql.runSQLOnFiles` is off) and its function registry
lacks reflect, java_method and try_reflect.

Runs on the driver, on the query's gRPC handler thread, before the query's views are made. Cost:
the parse (which the query needs anyway) and one JSON rendering of the plan (TreeNode.toJSON) over
py4j, 1-3 ms for an ordinary query, growing with the plan (a WHERE of 300 ORs: ~0.1 s, about what
its parse takes). That rendering loses a few things (a named WINDOW's definitions, the parts of a
name holding ", "); a plan where it does is read again node by node over py4j (tens of
milliseconds), so nothing is decided on a lossy rendering.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

from iox_spark.server.errors import ConstructRefused, FunctionRefused, NotAQuery, PathReadRefused, RelationRefused

__all__ = ["CheckedQuery", "DENIED_FUNCTIONS", "DENIED_TABLE_FUNCTIONS", "check_query", "checked_dataframe",
           "require_tables", "simple_class", "nodes_in", "child_node"]

log = logging.getLogger(__name__)

#: Builtin functions a query may not call: they reach the JVM or the host.
DENIED_FUNCTIONS = frozenset({
    # call a static method of any JVM class
    "reflect", "java_method", "try_reflect",
    # read a file or URL an argument or option names (protobuf descriptor, avroSchemaUrl, XSD of rowValidationXSDPath)
    "from_protobuf", "to_protobuf", "from_avro", "to_avro", "schema_of_avro", "from_xml", "schema_of_xml",
    # the host's paths of the files rows are read from
    "input_file_name", "input_file_block_start", "input_file_block_length",
})
#: Table-valued functions a query may not call: files (read_files, where it exists) and the Python
#: workers' logs (which hold other queries' output).
DENIED_TABLE_FUNCTIONS = frozenset({"read_files", "python_worker_logs"})

#: Plan nodes a query is built of (class names, as the parser makes them; relations, functions and
#: CTEs get the checks of `_Check`).
_QUERY_PLANS = frozenset({
    "Project", "Filter", "Aggregate", "Join", "LateralJoin", "Sort", "GlobalLimit", "LocalLimit", "Limit", "LimitAll",
    "Offset", "Tail", "Distinct", "Union", "Intersect", "Except", "SubqueryAlias", "OneRowRelation", "LocalRelation",
    "UnresolvedInlineTable", "Sample", "Pivot", "Unpivot", "Generate", "WithWindowDefinition", "UnresolvedHaving",
    "UnresolvedQualify", "PipeOperator", "UnresolvedHint", "RepartitionByExpression", "Repartition",
    "UnresolvedSubqueryColumnAliases", "UnresolvedTVFAliases", "UnresolvedRelation", "UnresolvedTableValuedFunction",
    "UnresolvedWith",
})
#: Statements that are no query but only read the database's tables' names and columns, or a query's plan.
_READ_STATEMENTS = frozenset({"ExplainCommand", "DescribeQueryCommand", "ShowTables", "ShowColumns",
                              "DescribeRelation"})
#: Query constructs refused for what they do (not statements).
_CONSTRUCTS = {
    "ScriptTransformation": "TRANSFORM ... USING runs a command on the host",
    "PlanWithUnresolvedIdentifier": "IDENTIFIER(...) naming a relation by an expression",
    "ExpressionWithUnresolvedIdentifier": "IDENTIFIER(...) naming a function by an expression",
}
#: The first part of `<source>.`<path>``: a path read (any other two-part name is a relation).
_FILE_SOURCES = frozenset({"text", "csv", "json", "parquet", "orc", "avro", "binaryfile", "xml", "delta", "jdbc",
                           "libsvm", "image", "hive", "iox_kafka", "iox_parquet"})
#: (node class, field) whose JSON rendering is null but holds no plan, expression or name to check.
_OPAQUE_FIELDS = frozenset({
    ("UnresolvedRelation", "options"),  # a string map, given to a data source: a table view ignores it
    ("LocalRelation", "data"),  # the literal rows of VALUES
    ("Join", "hint"), ("GroupingSets", "groupingSetIndexes"), ("Rollup", "groupingSetIndexes"),
    ("Cube", "groupingSetIndexes"), ("UnresolvedWindowExpression", "windowSpec"),  # a named window's name
    ("Literal", "value"),  # NULL
    ("LikeAny", "patterns"), ("LikeAll", "patterns"), ("NotLikeAny", "patterns"), ("NotLikeAll", "patterns"),
})
#: Fields of any class whose JSON rendering is null but holds no plan, expression or name.
_OPAQUE_ANY = frozenset({"evalContext", "evalMode"})
#: Most py4j calls a plan is read with node by node; a larger plan is refused.
_MAX_EXACT_CALLS = 50_000
#: Session setting off in the query's session: `<source>.`<path>`` reads no file.
_RUN_SQL_ON_FILES = "spark.sql.runSQLOnFiles"

_OPAQUE = object()  # a value that holds nothing to check
_ABSENT = object()  # an empty Option


@dataclass(frozen=True)
class CheckedQuery:
    """A statement `check_query` passed, and what it reads."""

    #: the statement's text
    sql: str
    #: its parsed plan (a JVM LogicalPlan): what `checked_dataframe` runs
    plan: object = field(repr=False, compare=False)
    #: the single-part relation names it reads that are no CTE: each must be one of the database's tables
    tables: frozenset = frozenset()
    #: SHOW TABLES: its answer must only list the database's tables (the session's temp views)
    lists_tables: bool = False
    #: its plan as the tree the check read from the plan's JSON rendering ({"class", "children",
    #: "fields"}), or None when that rendering was lossy (server/query/pushdown.py reads it)
    tree: object = field(default=None, repr=False, compare=False)


def check_query(session, database: str, sql: str) -> CheckedQuery:
    """Checks `sql`, about to run in `session` (a PySpark session of its own) for `database`, and
    sets that session up so it cannot read paths nor call reflect & co. Raises a
    QueryRefused for a statement outside the sandbox, PySpark's ParseException for one Spark
    cannot parse. Driver side."""
    state = session._jsparkSession.sessionState()
    jvm = session._jvm
    _harden(session, state, jvm)
    try:
        plan = state.sqlParser().parsePlan(sql)
    except Exception as e:  # noqa: BLE001 - py4j's error: raise the PySpark exception it stands for
        raise _pyspark_error(e) from None
    names = _builtin_names(state)
    tree = None
    try:
        try:
            check = _Check(database, jvm, *names)
            tree = _from_json(plan)
            check.run(tree)
        except _Lossy as lossy:
            tree = None
            log.debug("query plan read over py4j: its JSON rendering is lossy (%s)", lossy)
            check = _Check(database, jvm, *names)
            check.run(_JvmReader(jvm).node(plan))
    except RecursionError:
        raise ConstructRefused(database, "nesting", "the query is nested too deeply to be checked") from None
    except (_Lossy, _TooLarge) as e:
        raise ConstructRefused(database, "plan", f"the query cannot be checked ({e or 'too large'})") from None
    return CheckedQuery(sql, plan, frozenset(check.relations), check.lists_tables, tree)


def checked_dataframe(session, checked: CheckedQuery):
    """The DataFrame of `checked`'s plan itself, in `session` (the one `check_query` was given):
    what runs is exactly what was checked, and the statement is not parsed twice. Where this Spark
    has no Dataset.ofRows to reach, `session.sql` of its text (the same parser, the same plan).
    Raises PySpark's exceptions for the statement's analysis errors. Driver side."""
    from py4j.protocol import Py4JError, Py4JJavaError
    from pyspark.sql import DataFrame

    global _of_rows_missing
    dataset = None if _of_rows_missing else _dataset_class(session._jvm)
    if dataset is not None:
        try:
            return DataFrame(dataset.ofRows(session._jsparkSession, checked.plan), session)
        except Py4JJavaError:
            raise
        except Py4JError:  # no such method in this Spark
            log.warning("no Dataset.ofRows(SparkSession, LogicalPlan) in this Spark: queries are parsed again to run")
            _of_rows_missing = True
    return session.sql(checked.sql)


#: Where Dataset.ofRows lives (Spark 4, Spark 3)
_DATASET_CLASSES = ("org.apache.spark.sql.classic.Dataset", "org.apache.spark.sql.Dataset")
_of_rows_missing = False
_dataset: list = []  # [the py4j class of the first of _DATASET_CLASSES the JVM has, or None], found once


def _dataset_class(jvm):
    if not _dataset:
        found = None
        for name in _DATASET_CLASSES:
            try:
                jvm.py4j.reflection.ReflectionUtil.classForName(name)
            except Exception:  # noqa: BLE001 - not in this Spark
                continue
            found = jvm
            for part in name.split("."):
                found = getattr(found, part)
            break
        _dataset[:] = [found]
    return _dataset[0]


def require_tables(database: str, tables, available) -> None:
    """Raises RelationRefused for the first of `tables` (names a checked query reads) that is not
    in `available` (the table views made in the query's session): Spark would look it up among
    other relations."""
    missing = sorted(set(tables) - set(available))
    if missing:
        raise RelationRefused(database, (missing[0],), "it is not a table of the database")


class _Lossy(Exception):
    """The plan's JSON rendering dropped something a check needs."""


def _pyspark_error(e: Exception) -> Exception:
    from pyspark.errors.exceptions.captured import convert_exception
    from py4j.protocol import Py4JJavaError

    if isinstance(e, Py4JJavaError):
        return convert_exception(e.java_exception)
    return e


# ---------------------------------------------------------------------------------------------
# The session

#: Denied functions also dropped from each query session's registry, should a plan slip past the
#: check: the ones that run arbitrary JVM code (a drop per query costs a py4j call each).
_DROPPED_FUNCTIONS = ("reflect", "java_method", "try_reflect")
_DROPS_LOCK = threading.Lock()
_drops: list | None = None  # the JVM FunctionIdentifiers of _DROPPED_FUNCTIONS, built once
_drops_broken = False


def _harden(session, state, jvm) -> None:
    """Turns path reads off in `session` and drops _DROPPED_FUNCTIONS from its function registry
    (its own copy of the builtin one: other sessions keep theirs)."""
    global _drops_broken
    session.conf.set(_RUN_SQL_ON_FILES, "false")
    if _drops_broken:
        return
    try:
        registry = state.functionRegistry()
        for fid in _function_ids(jvm, registry):
            registry.dropFunction(fid)
    except Exception:  # noqa: BLE001 - another Spark's registry API: the plan check still refuses them
        log.warning("cannot drop reflect & co. from query sessions; the plan check still refuses them", exc_info=True)
        _drops_broken = True


def _function_ids(jvm, registry) -> list:
    """The JVM identifiers of _DROPPED_FUNCTIONS in the registry's key form (newer Spark versions
    key builtin functions as system.builtin.<name>, older ones as <name>)."""
    global _drops
    with _DROPS_LOCK:
        if _drops is None:
            fi = jvm.org.apache.spark.sql.catalyst.FunctionIdentifier
            if registry.listFunction().head().database().isDefined():
                some = jvm.scala.Some
                _drops = [fi(n, some("builtin"), some("system")) for n in _DROPPED_FUNCTIONS]
            else:
                _drops = [fi.apply(n) for n in _DROPPED_FUNCTIONS]
        return _drops


_NAMES_LOCK = threading.Lock()
_names: tuple | None = None


def _builtin_names(state) -> tuple:
    """(builtin function names, builtin table-valued function names), lower case, read once from a
    query session's registries (the denied ones added back: some are dropped there, all are refused
    by name)."""
    global _names
    with _NAMES_LOCK:
        if _names is None:
            def names(registry) -> frozenset:
                out = set()
                it = registry.listFunction().iterator()
                while it.hasNext():
                    out.add(str(it.next().funcName()).lower())
                return frozenset(out)

            _names = (names(state.functionRegistry()) | DENIED_FUNCTIONS,
                      names(state.tableFunctionRegistry()) | DENIED_TABLE_FUNCTIONS)
        return _names


# ---------------------------------------------------------------------------------------------
# Plans as trees of dicts: {"class": JVM class name, "children": [node], "fields": {name: value}}.
# A value is a node, a list, a product {"product-class": name, field: value}, a string, a number,
# a bool, _OPAQUE (nothing to check) or, from JSON, an int standing for one of "children".

def _from_json(plan) -> dict:
    """The tree of the JVM `plan`'s TreeNode.toJSON rendering. Raises _Lossy where a field the
    rendering dropped (null) may hold something to check, or when there is no rendering."""
    try:
        flat = json.loads(plan.toJSON())
    except Exception as e:  # noqa: BLE001 - a node the JVM cannot render (or a stack overflow there)
        raise _Lossy(f"no JSON rendering: {type(e).__name__}") from None
    return _json_tree(flat)


def _json_tree(flat) -> dict:
    """One flat pre-order rendering (every node with its "num-children", its children after it)
    as a tree."""
    if not isinstance(flat, list) or not flat:
        raise _Lossy("not a tree")
    root = None
    open_nodes: list = []  # [node, children still to come]
    for item in flat:
        if not isinstance(item, dict) or not isinstance(item.get("class"), str):
            raise _Lossy("not a node")
        cls = item["class"]
        node = {"class": cls, "children": [],
                "fields": {k: _json_value(cls, k, v) for k, v in item.items() if k not in ("class", "num-children")}}
        if open_nodes:
            parent = open_nodes[-1]
            parent[0]["children"].append(node)
            parent[1] -= 1
            while open_nodes and open_nodes[-1][1] == 0:
                open_nodes.pop()
        elif root is None:
            root = node
        else:
            raise _Lossy("two roots")
        n = item.get("num-children", 0)
        if not isinstance(n, int) or n < 0:
            raise _Lossy("bad num-children")
        if n:
            open_nodes.append([node, n])
    if open_nodes:
        raise _Lossy("children missing")
    return root


def _json_value(owner: str, field: str, v):
    if v is None:
        if field in _OPAQUE_ANY or (_simple(owner), field) in _OPAQUE_FIELDS:
            return _OPAQUE
        raise _Lossy(f"{_simple(owner)}.{field}")
    if isinstance(v, list):
        if v and isinstance(v[0], dict) and "class" in v[0]:
            return _json_tree(v)
        return [_json_value(owner, field, x) for x in v]
    if isinstance(v, dict):
        if "product-class" in v:
            cls = v["product-class"]
            out = {k: _json_value(cls, k, x) for k, x in v.items() if k != "product-class"}
            out["product-class"] = cls
            return out
        return _OPAQUE  # {"object": name}: a Scala object
    return v


class _JvmReader:
    """Reads a plan node by node over py4j into the tree `_from_json` makes, without its losses
    (children are fields here, "children" stays empty)."""

    def __init__(self, jvm):
        find = jvm.py4j.reflection.ReflectionUtil.classForName
        self._tree_node = find("org.apache.spark.sql.catalyst.trees.TreeNode")
        self._iterable = find("scala.collection.Iterable")
        self._option = find("scala.Option")
        self._product = find("scala.Product")
        self._calls = 0

    def _count(self, n: int = 1) -> None:
        self._calls += n
        if self._calls > _MAX_EXACT_CALLS:
            raise _TooLarge()

    def node(self, obj) -> dict:
        self._count(3)
        cls = obj.getClass().getName()
        return {"class": cls, "children": [], "fields": self._fields(obj)}

    def _fields(self, obj) -> dict:
        out = {}
        for i in range(obj.productArity()):
            self._count(2)
            v = self.value(obj.productElement(i))
            if v is not _ABSENT:
                out[obj.productElementName(i)] = v
        return out

    def value(self, v):
        from py4j.java_collections import JavaArray, JavaList, JavaMap, JavaSet
        from py4j.java_gateway import JavaObject

        if v is None or isinstance(v, (str, int, float, bool, bytes)):
            return v
        if isinstance(v, JavaMap):
            self._count(len(v))
            return [[self.value(k), self.value(x)] for k, x in v.items()]
        if isinstance(v, (JavaList, JavaSet, JavaArray)):
            self._count(len(v))
            return [self.value(x) for x in v]
        if not isinstance(v, JavaObject):
            return _OPAQUE
        self._count()
        if self._tree_node.isInstance(v):
            return self.node(v)
        self._count()
        if self._option.isInstance(v):
            self._count()
            return self.value(v.get()) if v.isDefined() else _ABSENT
        self._count()
        if self._iterable.isInstance(v):
            out = []
            it = v.iterator()
            while it.hasNext():
                self._count(2)
                out.append(self.value(it.next()))
            return out
        self._count()
        if self._product.isInstance(v):
            self._count(2)
            out = self._fields(v)
            out["product-class"] = v.getClass().getName()
            return out
        return _OPAQUE  # a string holder, a literal row, a data type, ...: nothing to check


class _TooLarge(Exception):
    pass


def simple_class(cls: str) -> str:
    """A JVM class name without its package (and a Scala object's trailing $)."""
    return cls.rsplit(".", 1)[-1].rstrip("$")


def nodes_in(value):
    """The nodes in a field's value of a plan tree (`CheckedQuery.tree`), not under other nodes."""
    if isinstance(value, dict):
        if "class" in value:
            yield value
        else:
            for k, v in value.items():
                if k != "product-class":
                    yield from nodes_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from nodes_in(v)


def child_node(node: dict, field: str):
    """The node in `field` of a plan tree's node: a child's index (JSON) or the node itself (py4j)."""
    v = node["fields"].get(field)
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(node["children"]):
        return node["children"][v]
    return v if isinstance(v, dict) and "class" in v else None


_simple, _nodes_in, _child = simple_class, nodes_in, child_node


def _parts(value) -> tuple:
    """A multi-part name: a list (py4j) or its JSON rendering "[a, b]", which is exact only for
    one part without ", " in it."""
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        return tuple(value)
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        inner = value[1:-1]
        if ", " in inner:
            raise _Lossy("a name of several parts")
        return (inner,)
    raise _Lossy("a name")


_KINDS: dict = {}  # JVM class name -> "command" | "plan" | "other"
_KINDS_LOCK = threading.Lock()


def _kind(jvm, cls: str) -> str:
    """Whether the JVM class `cls` is a Command, another LogicalPlan, or neither (expressions and
    the rest); a class that cannot be loaded counts as a plan. Asked once per class."""
    kind = _KINDS.get(cls)
    if kind is None:
        find = jvm.py4j.reflection.ReflectionUtil.classForName
        try:
            c = find(cls)
            if find("org.apache.spark.sql.catalyst.plans.logical.Command").isAssignableFrom(c):
                kind = "command"
            elif find("org.apache.spark.sql.catalyst.plans.logical.LogicalPlan").isAssignableFrom(c):
                kind = "plan"
            else:
                kind = "other"
        except Exception:  # noqa: BLE001 - not a class of this JVM: checked as a plan node
            return "plan"
        with _KINDS_LOCK:
            _KINDS[cls] = kind
    return kind


class _Check:
    """The sandbox's rules over one plan tree."""

    def __init__(self, database: str, jvm, functions: frozenset, table_functions: frozenset):
        self.database = database
        self.jvm = jvm
        self.functions = functions
        self.table_functions = table_functions
        self.relations: set = set()
        self.lists_tables = False

    def run(self, root: dict) -> None:
        todo = [(root, frozenset(), True)]  # (node, CTE names in scope, whether a statement may stand there)
        while todo:
            node, ctes, top = todo.pop()
            self._node(node, ctes, top, todo)

    def _node(self, node: dict, ctes: frozenset, top: bool, todo: list) -> None:
        name = _simple(node["class"])
        f = node["fields"]
        if name in _CONSTRUCTS:
            raise ConstructRefused(self.database, name, _CONSTRUCTS[name])
        if name == "UnresolvedWith":
            self._with(node, ctes, top, todo)
            return
        kind = _kind(self.jvm, node["class"])
        inner_top = False
        if kind != "other" and name not in _QUERY_PLANS:
            if not (top and name in _READ_STATEMENTS or name in ("UnresolvedTableOrView", "CurrentNamespace")):
                if kind == "command" or top or name.endswith(("Command", "Statement")):
                    raise NotAQuery(self.database, name)
                raise ConstructRefused(self.database, name, "not part of a query")
            inner_top = name == "ExplainCommand"
        if name == "UnresolvedRelation":
            if f.get("isStreaming") is True:
                raise ConstructRefused(self.database, "STREAM", "a streaming read")
            self._relation(_parts(f.get("multipartIdentifier")), ctes)
        elif name == "UnresolvedTableOrView":
            self._relation(_parts(f.get("multipartIdentifier")), frozenset())
        elif name == "ShowTables":
            ns = _child(node, "namespace")
            if ns is None or _simple(ns["class"]) != "CurrentNamespace":
                where = _parts(ns["fields"].get("multipartIdentifier")) if ns is not None else ("?",)
                raise RelationRefused(self.database, where, "SHOW TABLES lists the database's tables only")
            self.lists_tables = True
        elif name == "ShowColumns" and f.get("namespace") not in (None, [], "[]"):
            raise RelationRefused(self.database, _parts(f["namespace"]),
                                  "SHOW COLUMNS reads the database's tables only")
        elif name == "UnresolvedFunction":
            self._function(_parts(f.get("nameParts")), internal=f.get("isInternal") is True)
        elif name == "UnresolvedGenerator":
            self._function(self._function_identifier(f.get("name")))
        elif name in ("UnresolvedTableValuedFunction", "UnresolvedTVFAliases"):
            self._function(_parts(f.get("name")), table=True)
        for child in node["children"]:
            todo.append((child, ctes, inner_top))
        for v in f.values():
            for sub in _nodes_in(v):
                todo.append((sub, ctes, inner_top))

    def _with(self, node: dict, ctes: frozenset, top: bool, todo: list) -> None:
        """WITH: each definition sees the ones before it (and itself when recursive), the query all."""
        f = node["fields"]
        recursive = f.get("allowRecursion") is True
        defs = f.get("cteRelations")
        if not isinstance(defs, list):
            raise _Lossy("UnresolvedWith.cteRelations")
        scope = ctes
        for d in defs:
            if not isinstance(d, dict) or not isinstance(d.get("_1"), str):
                raise _Lossy("a CTE definition")
            cte = d["_1"]
            inner = scope | {cte} if recursive else scope
            for k, v in d.items():
                if k not in ("_1", "product-class"):
                    for sub in _nodes_in(v):
                        todo.append((sub, inner, False))
            scope = scope | {cte}
        child = _child(node, "child")
        if child is None:
            raise _Lossy("UnresolvedWith.child")
        todo.append((child, scope, top))

    def _relation(self, parts: tuple, ctes: frozenset) -> None:
        if len(parts) == 1:
            if parts[0] not in ctes:
                self.relations.add(parts[0])
            return
        if len(parts) == 2 and (parts[0].lower() in _FILE_SOURCES or "." in parts[0]
                                or parts[1].startswith(("/", "~")) or ":" in parts[1]):
            raise PathReadRefused(self.database, parts[0], parts[1])
        raise RelationRefused(self.database, parts, "queries read only their database's tables, by name")

    @staticmethod
    def _function_identifier(v) -> tuple:
        if not isinstance(v, dict) or not isinstance(v.get("funcName"), str):
            raise _Lossy("a function identifier")
        return tuple(v[k] for k in ("catalog", "database") if isinstance(v.get(k), str)) + (v["funcName"],)

    def _function(self, parts: tuple, table: bool = False, internal: bool = False) -> None:
        low = tuple(p.lower() for p in parts)
        name = low[-1] if low else ""
        what = ".".join(parts)
        if low[:-1] not in ((), ("builtin",), ("system", "builtin")):
            raise FunctionRefused(self.database, what, "only builtin functions run")
        denied, builtin = ((DENIED_TABLE_FUNCTIONS, self.table_functions) if table
                           else (DENIED_FUNCTIONS, self.functions))
        if name in denied:
            raise FunctionRefused(self.database, what, "it reaches the JVM or the host")
        if name not in builtin and not internal:
            raise FunctionRefused(self.database, what, "not a builtin " + ("table-valued function" if table
                                                                             else "function"))
