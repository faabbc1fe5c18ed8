"""WriteBuffer pieces that need no broker."""
import pytest

from iox_spark.server.errors import WriteBufferUnavailable
from iox_spark.server.write_buffer.producer import WriteBuffer, txn_commit_deadline_s


def test_producing_nothing_returns_at_once_without_a_broker():
    # a transaction whose tables all sit on its coordinator partition has no markers to write
    wb = WriteBuffer("127.0.0.1:9", partitions=4, produce_timeout_ms=1000)
    try:
        assert wb.produce_control("iox.x", []) is None
    finally:
        wb.close()


def test_commit_deadline_leaves_room_for_two_produce_timeouts_and_the_slack():
    assert txn_commit_deadline_s(60.0, 10_000) == 35.0
    assert txn_commit_deadline_s(8.0, 1_000) == 1.0


def test_close_closes_the_producers_it_replaced_and_the_admin_client():
    wb = WriteBuffer("127.0.0.1:9", partitions=4, produce_timeout_ms=1000)
    first = wb._producer
    second = wb._recreate_producer(first)
    assert second is not first and wb._producer is second
    assert wb._recreate_producer(first) is second  # a later caller with the broken one gets the new one
    wb.close()
    for p in (first, second):
        with pytest.raises(RuntimeError, match="closed"):
            p.produce("iox.x", b"v")
    with pytest.raises(WriteBufferUnavailable, match="closed"):
        wb.list_database_topics()


def test_a_producer_whose_messages_time_out_is_replaced():
    """A broker that is away (here: nothing listens) times the message out; the producer is
    replaced so that writes recover once a broker is back, whatever the old idempotence session
    went through. Its queue is purged."""
    from iox_spark.catalog.schema import Column
    import pyarrow as pa

    from iox_spark.server.write_buffer.wire_format import encode_write

    wb = WriteBuffer("127.0.0.1:9", partitions=1, produce_timeout_ms=300)
    wb._known_topics.add("iox.x")  # no topic admin against a missing broker
    try:
        first = wb._producer
        w = encode_write("m", [Column("v", "field", "float")], pa.table({"v": [1.0], "time": pa.array([1], pa.int64())}))
        with pytest.raises(WriteBufferUnavailable, match="timed out"):
            wb._send_all("iox.x", [w])
        assert wb._producer is not first and wb._retired == [first]
        assert first.flush(1) == 0  # nothing of it is left to retry (its purge's reports served)
    finally:
        wb.close()


def test_topics_are_replicated_as_configured_or_on_every_broker_of_a_smaller_cluster():
    from iox_spark.server.write_buffer.producer import DEFAULT_REPLICATION_FACTOR, replication_for

    assert DEFAULT_REPLICATION_FACTOR == 3
    assert replication_for(3, 5) == 3
    assert replication_for(3, 2) == 2
    assert replication_for(3, 1) == 1
    assert replication_for(3, 0) == 1


def test_acknowledged_offsets_are_kept_per_topic_and_forgotten_for_a_new_incarnation():
    wb = WriteBuffer("127.0.0.1:9", partitions=2, produce_timeout_ms=1000)
    try:
        assert wb._token("iox.a", [(0, 4), (1, 2), (0, 3)]) == {0: 4, 1: 2}
        wb._token("iox.a", [(0, 1)])  # an older acknowledgement does not lower the mark
        wb._token("iox.b", [(1, 9)])
        assert wb.acked_of("iox.a") == {0: 4, 1: 2}
        assert wb.acked_all() == {("iox.a", 0): 4, ("iox.a", 1): 2, ("iox.b", 1): 9}
        wb.forget_acked("iox.a")
        assert wb.acked_of("iox.a") == {} and wb.acked_all() == {("iox.b", 1): 9}
    finally:
        wb.close()
