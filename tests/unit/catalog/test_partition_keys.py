"""Partition keys (catalog/partition_keys.py): a row's day, its key, and back."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from iox_spark.catalog.partition_keys import NS_PER_DAY, day_number_of_key, day_numbers, day_partitions, partition_key_of_day


@given(st.integers(-(2**63), 2**63 - 1))
def test_a_time_s_day_number_is_its_floor_and_its_key_reads_back(t):
    (day,) = day_numbers(pa.array([t], pa.int64())).to_pylist()
    assert day == t // NS_PER_DAY
    key = partition_key_of_day(day)
    assert day_number_of_key(key) == day
    assert list(day_partitions(pa.array([t], pa.int64()))) == [key]


def test_keys_are_iso_dates():
    assert partition_key_of_day(0) == "1970-01-01" and day_number_of_key("1970-01-01") == 0
    assert partition_key_of_day(-1) == "1969-12-31" and day_number_of_key("2026-12-07") == 20794
