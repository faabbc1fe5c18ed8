"""server/wire_format.py: the per-day partition summary of a write's time column."""
import pyarrow as pa

from server.wire_format import NS_PER_DAY, day_partitions


def _t(values):
    return pa.array(values, pa.int64())


def test_one_day_is_summarised_without_grouping():
    assert day_partitions(_t([5, 1, 3])) == {"1970-01-01": [3, 1, 5]}
    # negative times floor to the day before the epoch, also on its last nanosecond
    assert day_partitions(_t([-5, -1])) == {"1969-12-31": [2, -5, -1]}
    assert day_partitions(_t([NS_PER_DAY, 2 * NS_PER_DAY - 1])) == {"1970-01-02": [2, NS_PER_DAY, 2 * NS_PER_DAY - 1]}


def test_rows_over_several_days_are_counted_per_day():
    got = day_partitions(_t([-1, 0, NS_PER_DAY, NS_PER_DAY - 1, -NS_PER_DAY]))
    assert got == {"1969-12-31": [2, -NS_PER_DAY, -1], "1970-01-01": [2, 0, NS_PER_DAY - 1],
                   "1970-01-02": [1, NS_PER_DAY, NS_PER_DAY]}
    assert list(got) == sorted(got)


def test_no_rows_no_days():
    assert day_partitions(_t([])) == {}
