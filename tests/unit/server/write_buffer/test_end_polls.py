"""EndPolls: which partitions' ends the streaming source asks the broker for at a trigger.

Times are multiples of 1/8 s (exact in binary floating point): the trigger is 0.125 s."""
from iox_spark.server.write_buffer.end_polls import EndPolls

K = ("iox.db", 0)


def _polls():
    return EndPolls(first_delay_s=0.25, max_delay_s=1.0)


def test_a_partition_never_asked_is_due():
    assert _polls().due(K, 0.0)


def test_an_idle_partition_is_asked_after_a_doubling_delay_up_to_the_max():
    e = _polls()
    asked = []
    now = 0.0
    while now < 5.0:
        if e.due(K, now):
            asked.append(now)
            e.answered(K, now, 5_000)
        now += 0.125
    # the first answer counts as moved (never seen before), then delays 0.25, 0.5, 1.0, 1.0, ...
    assert asked == [0.0, 0.125, 0.375, 0.875, 1.875, 2.875, 3.875, 4.875]


def test_a_partition_that_moves_is_asked_at_the_next_trigger_again():
    e = _polls()
    e.answered(K, 0.0, 5_000)
    e.answered(K, 0.125, 5_000)
    e.answered(K, 0.375, 5_000)
    assert not e.due(K, 0.75)
    assert e.due(K, 0.875)
    e.answered(K, 0.875, 5_001)  # a new write
    assert e.due(K, 1.0)
    e.answered(K, 1.0, 5_001)
    assert not e.due(K, 1.125) and e.due(K, 1.25)  # backing off from the start again


def test_a_small_idle_partition_backs_off_too():
    e = _polls()
    for now in (0.0, 0.125):
        assert e.due(K, now)
        e.answered(K, now, 3)
    assert not e.due(K, 0.25) and e.due(K, 0.375)


def test_partitions_back_off_independently():
    e = _polls()
    other = ("iox.db", 1)
    for now in (0.0, 0.125):
        e.answered(K, now, 5_000)
        e.answered(other, now, 5_000 + int(now * 8))
    assert not e.due(K, 0.25)
    assert e.due(other, 0.25)


def test_answered_says_whether_the_high_watermark_moved():
    e = _polls()
    assert e.answered(K, 0.0, 10)  # the first answer: moved
    assert not e.answered(K, 0.125, 10)
    assert e.answered(K, 0.25, 11)
    assert e.answered(K, 0.375, 0)  # a re-created topic starts over: moved too


def test_ack_marks_change_with_every_touch_per_partition_and_survive_pickling(tmp_path):
    import pickle

    from iox_spark.server.write_buffer.end_polls import AckMarks

    marks = AckMarks(str(tmp_path / "acked"))  # the directory is made on the first touch
    assert marks.read("iox.db", 0) is None and marks.topics() == set()
    marks.touch("iox.db", [0, 2, 0])
    assert marks.topics() == {"iox.db"}
    first = marks.read("iox.db", 0)
    assert first is not None and marks.read("iox.db", 2) == first
    assert marks.read("iox.db", 1) is None
    seen = {first}
    for _ in range(100):  # back to back: each mark differs (set in ns, not the coarse file clock)
        marks.touch("iox.db", iter([0]))
        seen.add(marks.read("iox.db", 0))
    assert len(seen) == 101
    assert marks.read("iox.db", 2) == first  # partition 2 was not written again
    assert marks.read("iox.other", 0) is None
    assert marks.read("iox.db.0", 0) is None  # a topic whose name extends another's is its own
    assert pickle.loads(pickle.dumps(marks)).read("iox.db", 0) == marks.read("iox.db", 0)
