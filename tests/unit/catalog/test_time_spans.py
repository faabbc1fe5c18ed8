"""Tests of catalog/time_spans.py: span sets stay sorted, disjoint covers."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.catalog import time_spans as ts


def test_normalize_sorts_and_joins_overlapping_ranges_but_keeps_adjacent_ones_apart():
    assert ts.normalize([(20, 30), (0, 10), (5, 12), (13, 13)]) == ((0, 12), (13, 13), (20, 30))
    assert ts.normalize([]) == ()
    assert ts.normalize([(0, 10), (10, 10)]) == ((0, 10),)  # inclusive: 10 is in both


def test_normalize_bridges_the_smallest_gaps_first_when_over_the_limit():
    spans = [(0, 1), (3, 4), (100, 101), (102, 103), (1000, 1001)]
    # gaps: 2, 96, 1, 897 -> bridging the two smallest (1, then 2)
    assert ts.normalize(spans, limit=3) == ((0, 4), (100, 103), (1000, 1001))
    assert ts.normalize(spans, limit=1) == ((0, 1001),)


def test_of_chunk_falls_back_to_the_hull_and_a_chunk_without_rows_has_no_span():
    class C:
        def __init__(self, lo, hi, spans=()):
            self.min_time_ns, self.max_time_ns, self.time_spans = lo, hi, spans

    assert ts.of_chunk(C(0, 9)) == ((0, 9),)
    assert ts.of_chunk(C(0, 9, ((0, 1), (8, 9)))) == ((0, 1), (8, 9))
    assert ts.of_chunk(C(None, None)) == ()


def test_disjoint_compares_spans_not_hulls():
    a = ((0, 9), (20, 29))
    b = ((10, 19), (30, 39))
    assert ts.disjoint([a, b])  # the hulls [0, 29] and [10, 39] overlap
    assert not ts.disjoint([a, ((29, 30),)])
    assert ts.disjoint([a]) and ts.disjoint([])


def test_union_and_clip():
    assert ts.union([((0, 9),), ((5, 20), (30, 31))]) == ((0, 20), (30, 31))
    assert ts.clip(((0, 9), (20, 29), (40, 49)), 5, 25) == ((5, 9), (20, 25))
    assert ts.clip(((0, 9),), 10, 20) == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50)), max_size=40), st.integers(1, 8))
def test_normalize_is_a_sorted_disjoint_cover_within_the_limit(raw, limit):
    spans = [(lo, lo + w) for lo, w in raw]
    out = ts.normalize(spans, limit=limit)
    assert len(out) <= limit
    assert all(lo <= hi for lo, hi in out)
    assert all(out[i][1] < out[i + 1][0] for i in range(len(out) - 1))
    for lo, hi in spans:  # every input time is covered
        assert any(a <= lo and hi <= b for a, b in out)
