"""chunk_store/arrow_merge.py against a plain-Python reference of the SQL views' semantics
(chunk_store/views.py: deletes per row before the merge, then one row per (tags, time) with each
field's last non-null value by `_iox_seq`)."""
from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.chunk_store import arrow_merge
from iox_spark.chunk_store.arrow_merge import ArrowDelete, apply_deletes, deduplicate, deletes_supported, sort_by_seq

TAGS = ["host", "region"]
FIELDS = [("f", "float"), ("i", "integer"), ("u", "uinteger"), ("s", "string"), ("b", "boolean")]
COL_TYPES = dict([(t, "string") for t in TAGS] + FIELDS)
ARROW = {"string": pa.string(), "float": pa.float64(), "integer": pa.int64(), "uinteger": pa.decimal128(20, 0),
         "boolean": pa.bool_()}

_values = {
    "float": st.one_of(st.none(), st.sampled_from([0.0, 1.5, -2.25, 1e300])),
    "integer": st.one_of(st.none(), st.sampled_from([0, 1, -7, 2**63 - 1])),
    "uinteger": st.one_of(st.none(), st.sampled_from([0, 3, 2**64 - 1]).map(Decimal)),
    "string": st.one_of(st.none(), st.sampled_from(["", "x", "y\n", "é"])),
    "boolean": st.one_of(st.none(), st.booleans()),
}


@st.composite
def rows(draw):
    n = draw(st.integers(0, 30))
    seqs = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True))
    out = []
    for k in range(n):
        r = {"host": draw(st.sampled_from(["a", "b", None])), "region": draw(st.sampled_from(["eu", None]))}
        for name, typ in FIELDS:
            r[name] = draw(_values[typ])
        # mostly shared times (rows to merge), some unique ones (rows deduplicate passes through)
        r["time_ns"] = draw(st.one_of(st.sampled_from([-5, 0, 1, 2]), st.integers(-2**40, 2**40)))
        r["_iox_seq"] = seqs[k]
        out.append(r)
    return out


def _table(rs: list) -> pa.Table:
    cols = {t: pa.array([r[t] for r in rs], pa.string()) for t in TAGS}
    for name, typ in FIELDS:
        cols[name] = pa.array([r[name] for r in rs], ARROW[typ])
    cols["time_ns"] = pa.array([r["time_ns"] for r in rs], pa.int64())
    cols["_iox_seq"] = pa.array([r["_iox_seq"] for r in rs], pa.int64())
    return pa.table(cols)


def _key(r: dict):
    return tuple((k, repr(r[k])) for k in sorted(r))


def _reference_dedup(rs: list) -> list:
    groups: dict = {}
    for r in sorted(rs, key=lambda r: r["_iox_seq"]):
        groups.setdefault((r["host"], r["region"], r["time_ns"]), []).append(r)
    out = []
    for (host, region, t), members in groups.items():
        m = {"host": host, "region": region, "time_ns": t, "_iox_seq": max(x["_iox_seq"] for x in members)}
        for name, _typ in FIELDS:
            vals = [x[name] for x in members if x[name] is not None]
            m[name] = vals[-1] if vals else None
        out.append(m)
    return out


def _matches(r: dict, terms) -> bool:
    for col, op, value, _kind in terms:
        v = r[col]
        if v is None:
            return False
        eq = v == (Decimal(value) if isinstance(v, Decimal) else value)
        if eq != (op == "="):
            return False
    return True


def _reference_deletes(rs: list, deletes: list) -> list:
    return [r for r in rs if not any(r["_iox_seq"] < seq and start <= r["time_ns"] < stop and _matches(r, terms)
                                     for start, stop, seq, terms in deletes)]


@settings(max_examples=300, deadline=None)
@given(rows())
def test_deduplicate_equals_reference(rs):
    got = deduplicate(_table(rs), TAGS, [n for n, _t in FIELDS])
    assert got.schema == _table(rs).schema
    assert sorted(map(_key, got.to_pylist())) == sorted(map(_key, _reference_dedup(rs)))


def _many_chunk_rows(n: int, seed: int) -> list:
    """`n` rows in rising time order but every 7th, which repeats the time of the row 3 before it,
    with that row's tag set every 14th (rows to merge) and another one otherwise."""
    import random

    rnd = random.Random(seed)
    out = []
    for k in range(n):
        host, t = rnd.choice(["a", "b"]), k * 10
        if k and k % 7 == 0:
            t = out[k - 3]["time_ns"]
            host = out[k - 3]["host"] if k % 14 == 0 else {"a": "b", "b": "a"}[out[k - 3]["host"]]
        out.append({"host": host, "region": "eu", "f": rnd.choice([None, 1.5, 2.0]),
                    "i": rnd.choice([None, 1]), "u": None, "s": rnd.choice([None, "x"]), "b": None,
                    "time_ns": t, "_iox_seq": k})
    return out


@pytest.mark.parametrize("max_sliced", [0, 1024])
def test_deduplicate_of_a_many_chunk_table_by_slices_or_one_filter(monkeypatch, max_sliced):
    monkeypatch.setattr(arrow_merge, "_MAX_SLICED_GAPS", max_sliced)
    rs = _many_chunk_rows(300, seed=max_sliced)
    t = pa.concat_tables([_table(rs[o:o + 37]) for o in range(0, len(rs), 37)])
    got = deduplicate(t, TAGS, [n for n, _t in FIELDS])
    assert got.schema == t.schema
    assert sorted(map(_key, got.to_pylist())) == sorted(map(_key, _reference_dedup(rs)))
    assert got.num_rows < len(rs)


_chunk_times = st.one_of(st.lists(st.integers(-20, 20), max_size=8),  # any order, repeats within
                         st.sets(st.integers(-200, 200), max_size=8).map(sorted))  # one rising request


@settings(max_examples=500, deadline=None)
@given(st.lists(_chunk_times, min_size=1, max_size=8))
def test_repeated_time_mask_marks_exactly_the_rows_whose_time_repeats(chunks):
    """Whatever the chunks (decoded streams) and runs: rising ones, overlapping or not, falls inside
    a chunk, empty chunks."""
    t = pa.concat_tables([pa.table({"time_ns": pa.array(c, pa.int64())}) for c in chunks])
    flat = [x for c in chunks for x in c]
    want = [flat.count(x) > 1 for x in flat]
    got = arrow_merge._repeated_time_mask(t)
    assert (None if not any(want) else want) == (None if got is None else got.tolist())


def test_repeated_time_mask_of_disjoint_requests_with_one_repeated_point():
    """Interleaved requests, each rising and apart in time, and a single point written twice: the
    two rows of that point, found from the rows of the two requests that meet."""
    reqs = [[100 * k + i for i in range(50)] for k in (3, 0, 7, 1, 5)]
    chunks = [[301]] + reqs + [[740, 741]]
    t = pa.concat_tables([pa.table({"time_ns": pa.array(c, pa.int64())}) for c in chunks])
    got = arrow_merge._repeated_time_mask(t)
    # 301: the first row and the second of request 3; 740/741: the 41st/42nd of request 7 (the
    # third request, from row 101) and the last two rows
    assert [i for i, m in enumerate(got.tolist()) if m] == [0, 2, 141, 142, 251, 252]


@pytest.mark.parametrize("times", [[1, 2, 3, 10], [3, 1, 2, 10]])
def test_deduplicate_returns_a_table_without_repeated_times_as_it_is(times):
    rs = [{"host": "a", "region": None, "f": 1.0, "i": None, "u": None, "s": None, "b": None, "time_ns": tm,
           "_iox_seq": k} for k, tm in enumerate(times)]
    t = _table(rs)
    assert deduplicate(t, TAGS, [n for n, _t in FIELDS]) is t


@pytest.mark.parametrize("m1, m2", [(arrow_merge._HASH_M1, arrow_merge._HASH_M2),  # the real hash
                                     (arrow_merge._HASH_M1, 0),  # tags ignored: rows of one time collide
                                     (0, 0)])  # every row collides
@settings(max_examples=200, deadline=None)
@given(rs=rows())
def test_deduplicate_narrowed_by_the_key_hash_equals_reference_also_when_hashes_collide(m1, m2, rs):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arrow_merge, "_KEY_HASH_MIN_ROWS", 0)
        mp.setattr(arrow_merge, "_HASH_M1", m1)
        mp.setattr(arrow_merge, "_HASH_M2", m2)
        got = deduplicate(_table(rs), TAGS, [n for n, _t in FIELDS])
    assert got.schema == _table(rs).schema
    assert sorted(map(_key, got.to_pylist())) == sorted(map(_key, _reference_dedup(rs)))


def test_new_series_at_the_same_times_are_kept_as_they_are_with_one_rewrite_merged(monkeypatch):
    """Many series reporting on the same ticks (every time repeats, no key does) over several
    chunks, plus one point written twice: only that point is merged."""
    monkeypatch.setattr(arrow_merge, "_KEY_HASH_MIN_ROWS", 100)
    rs = [{"host": f"h{k}", "region": None if k % 5 == 0 else "eu", "f": float(k), "i": None, "u": None, "s": None,
           "b": None, "time_ns": tick, "_iox_seq": 1000 * k + tick} for k in range(40) for tick in range(10)]
    rs.append(dict(rs[13], f=None, i=7, _iox_seq=99_999))  # host h1 at tick 3: i added, f kept
    t = pa.concat_tables([_table(rs[o:o + 50]) for o in range(0, len(rs), 50)])
    mask = arrow_merge._repeated_key_among(t, TAGS, arrow_merge._repeated_time_mask(t))
    assert [i for i, m in enumerate(mask.tolist()) if m] == [13, 400]
    got = deduplicate(t, TAGS, [n for n, _t in FIELDS])
    assert sorted(map(_key, got.to_pylist())) == sorted(map(_key, _reference_dedup(rs)))
    assert got.num_rows == 400 and {r["i"] for r in got.to_pylist() if (r["host"], r["time_ns"]) == ("h1", 3)} == {7}


_terms = st.lists(st.one_of(
    st.tuples(st.just("host"), st.sampled_from(["=", "!="]), st.sampled_from(["a", "b"]), st.just("string")),
    st.tuples(st.just("f"), st.sampled_from(["=", "!="]), st.sampled_from([1.5, 0.0]), st.just("float")),
    st.tuples(st.just("f"), st.sampled_from(["=", "!="]), st.just(0), st.just("integer")),
    st.tuples(st.just("i"), st.sampled_from(["=", "!="]), st.sampled_from([1, 2**63 - 1]), st.just("integer")),
    st.tuples(st.just("u"), st.sampled_from(["=", "!="]), st.sampled_from([3, 2**64 - 1]), st.just("integer")),
    st.tuples(st.just("s"), st.sampled_from(["=", "!="]), st.sampled_from(["x", ""]), st.just("string")),
    st.tuples(st.just("b"), st.sampled_from(["=", "!="]), st.booleans(), st.just("boolean")),
), max_size=3)


@settings(max_examples=300, deadline=None)
@given(rows(), st.lists(st.tuples(st.sampled_from([-5, 0, 1]), st.sampled_from([0, 2, 3]), st.integers(0, 10_000),
                                  _terms), max_size=3))
def test_apply_deletes_equals_reference(rs, ds):
    deletes = [ArrowDelete(*d) for d in ds]
    assert deletes_supported(deletes, COL_TYPES)
    got = apply_deletes(_table(rs), deletes, COL_TYPES)
    assert sorted(map(_key, got.to_pylist())) == sorted(map(_key, _reference_deletes(rs, deletes)))


def test_delete_on_a_column_the_table_lacks_removes_nothing():
    rs = [{"host": "a", "region": None, "f": 1.0, "i": 1, "u": None, "s": None, "b": None, "time_ns": 0,
           "_iox_seq": 1}]
    d = ArrowDelete(-10, 10, 100, [("nope", "=", "a", "string")])
    assert apply_deletes(_table(rs), [d], COL_TYPES).num_rows == 1
    assert apply_deletes(_table(rs), [ArrowDelete(-10, 10, 100, [])], COL_TYPES).num_rows == 0


def test_unsupported_terms_are_refused():
    assert not deletes_supported([ArrowDelete(0, 1, 1, [("f", "=", "x", "string")])], COL_TYPES)
    assert not deletes_supported([ArrowDelete(0, 1, 1, [("host", "<", "x", "string")])], COL_TYPES)


@pytest.mark.parametrize("seqs", [[1, 2, 3], [3, 1, 2], [5]])
def test_sort_by_seq(seqs):
    t = pa.table({"_iox_seq": pa.array(seqs, pa.int64()), "x": pa.array(range(len(seqs)))})
    assert sort_by_seq(t).column("_iox_seq").to_pylist() == sorted(seqs)
