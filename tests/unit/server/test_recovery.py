"""The lost-offsets decision of recovery (server/recovery.py::lost_offsets), one case per cause."""
from __future__ import annotations

import pytest

from server.recovery import LostWrites, lost_offsets


def test_kafka_holds_everything_replay_needs():
    assert lost_offsets(10, 14, low_watermark=0, end_exclusive=15, topic_gone=False,
                        checkpoint_complete=False) == (False, None)
    # nothing unpersisted, Kafka holds exactly up to where replay starts
    assert lost_offsets(15, None, low_watermark=15, end_exclusive=15, topic_gone=False,
                        checkpoint_complete=False) == (False, None)


def test_retention_dropped_offsets_replay_needs():
    # the low watermark passed the plan's start: [start, low watermark) is gone
    assert lost_offsets(10, 14, low_watermark=12, end_exclusive=20, topic_gone=False,
                        checkpoint_complete=False) == (False, (10, 12))
    # also when nothing unpersisted is known: writes after the checkpoint started at 10
    assert lost_offsets(10, None, low_watermark=11, end_exclusive=20, topic_gone=False,
                        checkpoint_complete=True) == (False, (10, 11))


def test_topic_behind_the_catalog_is_a_reset():
    # unpersisted offsets known: exactly those are lost
    assert lost_offsets(10, 14, low_watermark=0, end_exclusive=3, topic_gone=False,
                        checkpoint_complete=False) == (True, (10, 15))
    # none known, but the checkpoint is not from a drained clean stop: from 10 on, end unknown
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=False,
                        checkpoint_complete=False) == (True, (10, None))
    # a drained clean stop persisted everything: the empty topic loses nothing
    assert lost_offsets(10, None, low_watermark=0, end_exclusive=0, topic_gone=False,
                        checkpoint_complete=True) == (True, None)


def test_topic_gone_even_when_its_new_incarnation_is_longer():
    # the new topic already holds more than the old checkpoint: only the topic id tells
    assert lost_offsets(1, None, low_watermark=0, end_exclusive=4, topic_gone=True,
                        checkpoint_complete=False) == (True, (1, None))
    assert lost_offsets(1, 3, low_watermark=0, end_exclusive=40, topic_gone=True,
                        checkpoint_complete=False) == (True, (1, 4))
    assert lost_offsets(1, None, low_watermark=0, end_exclusive=40, topic_gone=True,
                        checkpoint_complete=True) == (True, None)


@pytest.mark.parametrize("to, text", [(12, "[10, 12)"), (None, "from 10 on")])
def test_lost_writes_message_names_partition_range_and_flag(to, text):
    e = LostWrites("db1", 3, 10, to, reason="topic iox.db1 no longer exists")
    assert (e.database, e.partition, e.from_offset, e.to_exclusive) == ("db1", 3, 10, to)
    assert str(e) == (f"database 'db1': Kafka partition 3 no longer holds offsets {text} that are not "
                      f"persisted yet (topic iox.db1 no longer exists); refusing to start. Start with "
                      f"--skip-lost-writes to accept losing them and read from the oldest available offset.")
