"""Which record batches of the durable embedded broker's store may go (pure logic of
server/runtime/broker_truncation.py; the deletion itself: tests/crash/test_broker_truncation.py)."""
import math

from hypothesis import given, strategies as st

from iox_spark.server.runtime.broker_truncation import StoredBatch, batch_offset, deletable, partition_prefix

NOW = 1_000_000.0


def _batches(bases, written_at=NOW - 100):
    return [StoredBatch(f"k{b}", b, written_at) for b in bases]


def test_the_object_layout_is_tansus():
    assert partition_prefix("tansu_cluster", "iox.db", 3) == "clusters/tansu_cluster/topics/iox.db/partitions/0000000003/records/"
    assert batch_offset("clusters/c/topics/t/partitions/0000000003/records/00000000000000000042.batch") == 42
    assert batch_offset("clusters/c/topics/t/partitions/0000000003/watermark.json") is None
    assert batch_offset("clusters/c/topics/t/partitions/0000000003/records/x.batch") is None


def test_a_batch_goes_once_the_next_one_starts_at_or_below_the_checkpoint_start():
    bs = _batches([0, 1, 2, 5, 9])  # the batch at 2 holds 2..4, the one at 5 holds 5..8
    assert [b.base_offset for b in deletable(bs, 5, NOW, NOW, 0)] == [0, 1, 2]
    assert [b.base_offset for b in deletable(bs, 4, NOW, NOW, 0)] == [0, 1]  # 2..4 still holds offset 4
    assert [b.base_offset for b in deletable(bs, 100, NOW, NOW, 0)] == [0, 1, 2, 5]  # never the last one
    assert deletable(bs, 0, NOW, NOW, 0) == []
    assert deletable(_batches([7]), 100, NOW, NOW, 0) == []


def test_a_batch_written_after_the_checkpoint_or_within_the_retention_stays():
    bs = [StoredBatch("a", 0, NOW - 50), StoredBatch("b", 1, NOW - 10), StoredBatch("c", 2, NOW - 0.5),
          StoredBatch("d", 3, NOW)]
    # the checkpoint was committed 0.2 s ago: "c" (0.5 s before now) is within the store's timestamp resolution of it
    assert [b.key for b in deletable(bs, 4, NOW - 0.2, NOW, 0)] == ["a", "b"]
    assert [b.key for b in deletable(bs, 4, NOW - 20, NOW, 0)] == ["a"]  # "b" was written after the commit
    assert [b.key for b in deletable(bs, 4, NOW, NOW, 30)] == ["a"]  # "b" is younger than the retention
    assert deletable(bs, 4, NOW, NOW, math.inf) == []


@given(st.lists(st.integers(1, 5), min_size=1, max_size=30), st.integers(0, 120))
def test_no_offset_at_or_above_the_start_is_ever_deleted(sizes, start):
    bases, b = [], 0
    for n in sizes:
        bases.append(b)
        b += n
    bs = _batches(bases)
    gone = deletable(bs, start, NOW, NOW, 0)
    ends = {x.base_offset: x.base_offset + n - 1 for x, n in zip(bs, sizes)}
    assert all(ends[g.base_offset] < start for g in gone)
    assert bs[-1] not in gone
    # and everything else that lies wholly below the start goes
    assert {g.base_offset for g in gone} == {x.base_offset for x in bs[:-1] if ends[x.base_offset] < start}
