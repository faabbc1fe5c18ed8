"""lifecycle/iceberg_plan.py: which files an Iceberg table references (pure logic)."""
from __future__ import annotations

from iox_spark.catalog.preserved_catalog import AddDeletePredicate, AddParquet, CatalogState, RemoveParquet, apply_actions
from iox_spark.lifecycle.iceberg_plan import changed_tables, copies_prefix, published_files

COLS = (("host", "tag", "string"), ("v", "field", "float"), ("time", "time", "time"))


def _file(key, table, pkey, lo, hi, seq):
    return AddParquet(key=key, table=table, partition_key=pkey, row_count=1, size_bytes=1, min_time_ns=lo,
                      max_time_ns=hi, min_seq=seq, max_seq=seq, schema=COLS)


def _state(*actions):
    s = CatalogState(db="db", revision=0, transaction_uuid="u", timestamp_s=0.0)
    apply_actions(s, list(actions), 1)
    return s


def test_files_that_meet_in_time_are_one_copy_and_the_others_are_referenced_where_they_are():
    s = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("b", "cpu", "d1", 10, 20, 2),  # meet at 10 (inclusive)
               _file("c", "cpu", "d1", 21, 30, 3), _file("d", "cpu", "d2", 0, 10, 4),  # another day: apart
               _file("e", "mem", "d1", 0, 10, 5))
    got = published_files(s, "cpu")
    assert {k for k, f in got.items() if not f.is_copy} == {"c", "d"}
    (copy,) = [f for f in got.values() if f.is_copy]
    assert copy.key.startswith(copies_prefix("db", "cpu") + "d1/") and [f.key for f in copy.sources] == ["a", "b"]
    assert published_files(s, "cpu") == got  # the same state, the same copy under the same key
    assert set(published_files(s, "mem")) == {"e"}


def test_a_delete_makes_a_copy_of_each_file_it_applies_to_and_a_new_delete_a_new_copy():
    s = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("b", "cpu", "d1", 20, 30, 2))
    d1 = AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=5, predicate=(("host", "=", "x"),), seq=3,
                            applies_to=("a",))
    s1 = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("b", "cpu", "d1", 20, 30, 2), d1)
    p0, p1 = published_files(s, "cpu"), published_files(s1, "cpu")
    assert set(p0) == {"a", "b"} and "b" in p1 and "a" not in p1
    (copy,) = [f for f in p1.values() if f.is_copy]
    assert copy.deletes == (("a", (d1,)),)
    d2 = AddDeletePredicate(table=None, start_ns=0, stop_ns_exclusive=5, predicate=(), seq=4, applies_to=("a",))
    s2 = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("b", "cpu", "d1", 20, 30, 2), d1, d2)
    assert set(published_files(s2, "cpu")) - {"b"} != set(p1) - {"b"}


def test_changed_tables_are_those_of_added_removed_and_deleted_files():
    before = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("e", "mem", "d1", 0, 10, 2))
    assert changed_tables(None, before) == {"cpu", "mem"}
    after = before.copy()
    apply_actions(after, [_file("f", "disk", "d1", 0, 1, 3)], 2)
    assert changed_tables(before, after) == {"disk"}
    later = after.copy()
    apply_actions(later, [RemoveParquet("e")], 3)
    assert changed_tables(after, later) == {"mem"}
    deleted = later.copy()
    apply_actions(deleted, [AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=1, predicate=(), seq=9,
                                               applies_to=("a",))], 4)
    assert changed_tables(later, deleted) == {"cpu"}
    assert changed_tables(deleted, deleted.copy()) == set()


def test_files_that_meet_in_time_but_share_no_key_are_referenced_where_they_are():
    s = _state(_file("a", "cpu", "d1", 0, 10, 1), _file("b", "cpu", "d1", 5, 20, 2), _file("c", "cpu", "d1", 15, 30, 3),
               _file("d", "cpu", "d1", 25, 40, 4))
    asked = []

    def shares(f, earlier):  # no two files hold a common key
        asked.append((f.key, sorted(g.key for g in earlier)))
        return set()

    got = published_files(s, "cpu", shares_keys=shares)
    # each file is asked about the earlier files (min_seq order) whose own time ranges meet it
    assert asked == [("b", ["a"]), ("c", ["b"]), ("d", ["c"])]
    assert set(got) == {"a", "b", "c", "d"} and not any(f.is_copy for f in got.values())
    got = published_files(s, "cpu", shares_keys=lambda f, earlier: {"a"} if f.key == "b" else set())
    (copy,) = [f for f in got.values() if f.is_copy]
    assert [f.key for f in copy.sources] == ["a", "b"] and {"c", "d"} <= set(got)
    # sharing is transitive: d shares with c, c with b
    got = published_files(s, "cpu", shares_keys=lambda f, earlier: {g.key for g in earlier if f.key in "cd"})
    (copy,) = [f for f in got.values() if f.is_copy]
    assert [f.key for f in copy.sources] == ["b", "c", "d"] and "a" in got
