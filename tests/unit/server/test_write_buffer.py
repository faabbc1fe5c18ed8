"""WriteBuffer pieces that need no broker."""
from server.write_buffer import WriteBuffer, txn_commit_deadline_s


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
