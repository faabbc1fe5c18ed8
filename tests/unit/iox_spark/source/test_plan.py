"""The read plan of a catalog snapshot: the snapshot asked for, its files grouped by overlap, the
table's deletes, the retention bound."""
from __future__ import annotations

import pickle

import pytest

from iox_spark.catalog.object_store import LocalObjectStore, catalog_prefix
from iox_spark.catalog.preserved_catalog import (AddDeletePredicate, AddParquet, CatalogState, PreservedCatalog,
                                       SetTableSchema)
from iox_spark.source.errors import (CatalogUnreadable, DatabaseNotFound, InvalidOption, RevisionNotFound,
                                     TableNotFound, UnsupportedDelete)
from iox_spark.source.plan import FileRef, load_snapshot, pack_groups, plan_read

SCHEMA = (("host", "tag", "string"), ("v", "field", "float"), ("b", "field", "boolean"),
          ("time", "time", "time"), ("az", "tag", "string"))
S = 1_000_000_000


def _file(key, lo, hi, table="cpu"):
    return AddParquet(key=key, table=table, partition_key="1970-01-01", row_count=1, size_bytes=1, min_time_ns=lo,
                      max_time_ns=hi, min_seq=0, max_seq=1, schema=SCHEMA[:2])


def _state(files=(), deletes=(), **kw) -> CatalogState:
    st = CatalogState(db="db", revision=4, transaction_uuid="u", timestamp_s=0.0, **kw)
    st.files = {f.key: f for f in files}
    st.delete_predicates = list(deletes)
    st.table_schemas = {"cpu": SCHEMA, "mem": SCHEMA[:1]}
    return st


def _delete(table, pred, seq=7):
    return AddDeletePredicate(table=table, start_ns=0, stop_ns_exclusive=10, predicate=pred, seq=seq,
                              applies_to=("a",))


def test_files_of_the_table_grouped_by_time_overlap_with_the_tables_deletes():
    files = [_file("a", 0, 10), _file("b", 5, 20), _file("c", 30, 40), _file("d", 20, 25), _file("m", 0, 99, "mem")]
    deletes = [_delete("cpu", (("host", "=", "x"),)), _delete("mem", ()), _delete(None, (("v", "!=", 1.5),), 9),
               _delete("cpu", (("b", "=", True), ("v", "=", 2)), 11)]
    plan = plan_read(_state(files, deletes), "cpu", now_s=0.0)
    assert plan.groups == ((FileRef("a", 0, 10, 1), FileRef("b", 5, 20, 1), FileRef("d", 20, 25, 1)),
                           (FileRef("c", 30, 40, 1),))
    assert plan.deletes == ((0, 10, 7, (("host", "=", "x", "string"),)), (0, 10, 9, (("v", "!=", 1.5, "float"),)),
                            (0, 10, 11, (("b", "=", True, "boolean"), ("v", "=", 2, "integer"))))
    assert (plan.database, plan.table, plan.revision, plan.reader_lo_ns) == ("db", "cpu", 4, None)
    # the query layout's order: tags by name, then fields by name
    assert plan.value_columns() == [("az", "string"), ("host", "string"), ("b", "boolean"), ("v", "float")]
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_a_table_with_a_schema_and_no_file_is_an_empty_plan_and_an_unknown_table_names_the_known_ones():
    assert plan_read(_state(), "mem", 0.0).groups == ()
    with pytest.raises(TableNotFound, match=r"'nope' .* revision 4 \(persisted tables: 'cpu', 'mem'\)"):
        plan_read(_state(), "nope", 0.0)


def test_a_delete_the_reader_cannot_evaluate_fails_the_read_rather_than_being_skipped():
    with pytest.raises(UnsupportedDelete):
        plan_read(_state(deletes=[_delete("cpu", (("b", "=", "yes"),))]), "cpu", 0.0)
    # a column the table lacks never matches: such a delete removes nothing, and is fine
    assert len(plan_read(_state(deletes=[_delete("cpu", (("gone", "=", "x"),))]), "cpu", 0.0).deletes) == 1


def test_retention_hides_rows_older_than_reader_lo_and_the_pruner_watermark():
    files = [_file("old", 0, 5 * S), _file("edge", 5 * S, 6 * S), _file("new", 8 * S, 9 * S)]
    plan = plan_read(_state(files, retention_period_s=4, pruner_hi_ns=1), "cpu", now_s=10.0)
    assert plan.reader_lo_ns == 6 * S
    assert [f.key for g in plan.groups for f in g] == ["edge", "new"]
    # the pruner's watermark bounds the rows even past the retention's (a period lengthened later)
    assert plan_read(_state(files, retention_period_s=100, pruner_hi_ns=7 * S), "cpu", 10.0).reader_lo_ns == 7 * S
    assert plan_read(_state(files, pruner_hi_ns=7 * S), "cpu", 10.0).reader_lo_ns == 7 * S


def test_load_snapshot_reads_the_revision_asked_for_or_says_why_not(tmp_path):
    store = LocalObjectStore(tmp_path)
    with pytest.raises(DatabaseNotFound, match="'db' has no preserved catalog in object store file://"):
        load_snapshot(store, "db", None)
    cat, _ = PreservedCatalog.create_or_load(store, "db", 1.0)
    cat.commit([SetTableSchema(table="cpu", columns=SCHEMA)], 2.0)
    cat.commit([_file("k", 0, 1)], 3.0)
    assert load_snapshot(store, "db", None).revision == 2
    assert list(load_snapshot(store, "db", 1).files) == []
    with pytest.raises(RevisionNotFound, match="no catalog revision 3: its newest is 2"):
        load_snapshot(store, "db", 3)
    with pytest.raises(InvalidOption, match="database"):
        load_snapshot(store, "", None)
    store.put(catalog_prefix("db") + f"{3:020d}.txn", b"{not json")
    with pytest.raises(CatalogUnreadable, match="not valid JSON") as e:
        load_snapshot(store, "db", None)
    assert e.value.__cause__ is not None
    assert load_snapshot(store, "db", 2).revision == 2  # an older revision does not read the broken file


def test_small_groups_are_packed_into_partitions_and_a_large_one_stands_alone():
    def g(*sizes):
        return tuple(FileRef(f"k{s}", 0, 0, s) for s in sizes)

    groups = [g(40), g(30, 20), g(200), g(10), g(60), g(45)]
    assert pack_groups(groups, target_bytes=100) == [(g(40), g(30, 20)), (g(200),), (g(10), g(60)), (g(45),)]
    assert pack_groups([], 100) == []
    assert plan_read(_state([_file("a", 0, 1)]), "cpu", 0.0).groups[0][0].size_bytes == 1
