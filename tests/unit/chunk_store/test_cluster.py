"""Tests of chunk_store/cluster.py's pure rules: which masters are local, how many parts a plan uses."""
from __future__ import annotations

import pytest

from iox_spark.chunk_store.chunk_data import ARROW_MERGE_MIN_ROWS, arrow_merge_parts
from iox_spark.chunk_store.cluster import is_local_master, parts_for, slots_per_executor


@pytest.mark.parametrize("master,local", [("local", True), ("local[*]", True), ("local[2]", True),
                                          ("local[4,2]", True), (" Local[8] ", True),
                                          ("spark://host:7077", False), ("spark://a:7077,b:7077", False),
                                          ("yarn", False), ("k8s://https://api:6443", False), ("", False),
                                          ("localhost", False)])
def test_is_local_master(master, local):
    assert is_local_master(master) is local


@pytest.mark.parametrize("slots,cap,parts", [(1, None, 1), (2, None, 2), (64, None, 64), (0, None, 1),
                                             (8, 4, 3), (8, 100, 8), (8, 1, 1)])
def test_parts_follow_the_task_slots(slots, cap, parts):
    assert parts_for(slots, cap) == parts


@pytest.mark.parametrize("total,executors,configured,cores", [(2, 1, None, 2), (16, 4, None, 4), (16, 4, 8, 8),
                                                              (3, 4, None, 1), (2, 0, None, 2)])
def test_cores_per_executor(total, executors, configured, cores):
    assert slots_per_executor(total, executors, configured) == cores


class _Chunk:
    def __init__(self, rows):
        self.rows = rows


def test_arrow_merge_parts_follow_the_slots_from_the_threshold_on():
    small, big = [_Chunk(ARROW_MERGE_MIN_ROWS - 1)], [_Chunk(ARROW_MERGE_MIN_ROWS // 2)] * 2
    assert arrow_merge_parts(small, 16) == 1
    assert arrow_merge_parts(big, 2) == 2 and arrow_merge_parts(big, 16) == 16
