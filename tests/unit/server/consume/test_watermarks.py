"""Watermarks per Kafka partition (server/consume/watermarks.py), pure parts."""
from __future__ import annotations

from iox_spark.catalog.preserved_catalog import RecordDatabaseCheckpoint
from iox_spark.server.consume.watermarks import MessageSizes, PartitionWatermarks, partition_watermarks, persisted_hi_inclusive


def _ck(numbers: dict, epoch: int = 3) -> RecordDatabaseCheckpoint:
    return RecordDatabaseCheckpoint(topic="iox_d", kafka_partitions=4, sequencer_numbers=numbers, epoch=epoch)


def test_persisted_is_the_offset_before_where_a_restart_would_read():
    applied = {0: 20, 1: 20, 2: 20, 3: 20}
    # 0: offsets from 7 on may be unpersisted; 1: all up to 12 persisted; 2: never checkpointed; 3: beyond applied
    ck = _ck({0: (7, 15), 1: (None, 12), 3: (None, 40)})
    assert persisted_hi_inclusive(ck, 3, applied) == {0: 6, 1: 12, 2: -1, 3: 20}
    assert persisted_hi_inclusive(ck, 4, applied) == {kp: -1 for kp in applied}  # another epoch's offsets
    assert persisted_hi_inclusive(None, 0, {0: 5}) == {0: -1}


def test_lag_counts_offsets_past_applied_and_estimates_their_bytes():
    sizes = MessageSizes()
    sizes.record("iox_d", [(0, 10, [("k", b"vv")], b"x" * 97), (0, 11, None, b"x" * 200), (1, 3, None, b"y")])
    assert sizes.mean_bytes("iox_d", 0) == 150.0 and sizes.mean_bytes("iox_d", 2) is None
    got = partition_watermarks({0: 9, 1: 3, 2: -1}, {0: 11}, {0: 4, 1: 3}, {0: 12, 1: 4, 2: 5},
                               lambda kp: sizes.mean_bytes("iox_d", kp))
    assert got == [PartitionWatermarks(0, 9, 11, 4, 12, 2, 300), PartitionWatermarks(1, 3, 3, 3, 4, 0, 0),
                   PartitionWatermarks(2, -1, -1, -1, 5, 5, 0)]
    # Kafka not reachable: its end and the lag are unknown
    assert partition_watermarks({0: 9}, {}, {}, None, lambda kp: 1.0) == [PartitionWatermarks(0, 9, 9, -1, -1, 0, 0)]
    sizes.forget_topic("iox_d")
    assert sizes.mean_bytes("iox_d", 0) is None
