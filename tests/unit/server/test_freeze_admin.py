"""FreezeControl.usage: the process tree's memory against the limit, with the page walk (PSS) only
when the RSS sum, its upper bound, reaches the threshold."""
from __future__ import annotations

from collections import namedtuple

from iox_spark.server.freeze_admin import FreezeControl

_Disk = namedtuple("_Disk", "total used free")


def _control(tmp_path, bound: int, pss: int, calls: list) -> FreezeControl:
    def rss(exact: bool = True) -> int:
        calls.append(exact)
        return pss if exact else bound

    return FreezeControl(None, str(tmp_path), at_percent=50.0, memory_limit_bytes=1000,
                         rss=rss, disk_usage=lambda: _Disk(100, 10, 90))


def test_below_the_threshold_the_rss_sum_stands_for_memory_used_and_no_page_walk_runs(tmp_path):
    calls: list = []
    assert _control(tmp_path, bound=499, pss=300, calls=calls).usage() == (499, 1000, 10, 100)
    assert calls == [False]


def test_at_the_threshold_each_page_is_counted_once(tmp_path):
    calls: list = []
    assert _control(tmp_path, bound=500, pss=420, calls=calls).usage() == (420, 1000, 10, 100)
    assert calls == [False, True]
