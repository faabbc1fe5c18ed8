"""EndPolls: which partitions' ends the streaming source asks the broker for at a trigger.

Times are multiples of 1/8 s (exact in binary floating point): the trigger is 0.125 s."""
from server.write_buffer.end_polls import EndPolls

K = ("iox.db", 0)


def _polls():
    return EndPolls(backoff_from_offsets=1_000, first_delay_s=0.25, max_delay_s=1.0)


def test_a_partition_never_asked_is_due():
    assert _polls().due(K, 0.0)


def test_a_small_partition_is_asked_at_every_trigger_also_when_idle():
    e = _polls()
    for i in range(10):
        now = i * 0.125
        assert e.due(K, now)
        e.answered(K, now, 0, 999)  # unmoved after the first answer, but under 1,000 offsets


def test_a_large_idle_partition_is_asked_after_a_doubling_delay_up_to_the_max():
    e = _polls()
    asked = []
    now = 0.0
    while now < 5.0:
        if e.due(K, now):
            asked.append(now)
            e.answered(K, now, 0, 5_000)
        now += 0.125
    # the first answer counts as moved (never seen before), then delays 0.25, 0.5, 1.0, 1.0, ...
    assert asked == [0.0, 0.125, 0.375, 0.875, 1.875, 2.875, 3.875, 4.875]


def test_a_partition_that_moves_is_asked_at_the_next_trigger_again():
    e = _polls()
    e.answered(K, 0.0, 0, 5_000)
    e.answered(K, 0.125, 0, 5_000)
    e.answered(K, 0.375, 0, 5_000)
    assert not e.due(K, 0.75)
    assert e.due(K, 0.875)
    e.answered(K, 0.875, 0, 5_001)  # a new write
    assert e.due(K, 1.0)
    e.answered(K, 1.0, 0, 5_001)
    assert not e.due(K, 1.125) and e.due(K, 1.25)  # backing off from the start again


def test_the_size_counts_offsets_above_the_low_watermark():
    e = _polls()
    e.answered(K, 0.0, 4_500, 5_000)  # retention kept 500 offsets: cheap to ask
    e.answered(K, 0.125, 4_500, 5_000)
    assert e.due(K, 0.125)
    e.answered(K, 0.25, -1, 5_000)  # no low watermark known: counted from 0
    assert not e.due(K, 0.375) and e.due(K, 0.5)


def test_partitions_back_off_independently():
    e = _polls()
    other = ("iox.db", 1)
    for now in (0.0, 0.125):
        e.answered(K, now, 0, 5_000)
        e.answered(other, now, 0, 5_000 + int(now * 8))
    assert not e.due(K, 0.25)
    assert e.due(other, 0.25)


def test_answered_says_whether_the_high_watermark_moved():
    e = _polls()
    assert e.answered(K, 0.0, 0, 10)  # the first answer: moved
    assert not e.answered(K, 0.125, 0, 10)
    assert e.answered(K, 0.25, 0, 11)
    assert e.answered(K, 0.375, 0, 0)  # a re-created topic starts over: moved too


def test_an_answer_explained_by_own_writes_backs_off_whatever_the_size():
    """The server's own acknowledged writes give their end without asking: a small partition that
    only they moved is asked after a doubling delay too, and at the next trigger again as soon as an
    answer shows more than they explain (another producer's write)."""
    e = _polls()
    asked = []
    now = 0.0
    hw = 0
    while now < 3.0:
        hw += 3  # own writes at every trigger
        if e.due(K, now):
            asked.append(now)
            e.answered(K, now, 0, hw - 1, explained=True)  # Tansu's watermark: short of the last batch
        now += 0.125
    assert asked == [0.0, 0.25, 0.75, 1.75, 2.75]
    e.answered(K, 3.0, 0, 10_000, explained=False)  # beyond the own writes: someone else wrote
    assert e.due(K, 3.125)


def test_ack_marks_hold_the_acknowledged_ends_and_only_move_up(tmp_path):
    import pickle

    from server.write_buffer.end_polls import AckMarks

    marks = AckMarks(str(tmp_path / "acked"))  # the directory is made on the first touch
    assert marks.read("iox.db") == {}
    marks.touch("iox.db", {0: 5})
    marks.touch("iox.db", {1: 3, 0: 4})  # an earlier acknowledgement reported late: 0 stays at 5
    assert marks.read("iox.db") == {0: 5, 1: 3}
    reader = pickle.loads(pickle.dumps(marks))  # the source's copy: the directory only
    assert reader.read("iox.db") == {0: 5, 1: 3}
    assert reader.read("iox.other") == {}
    marks.touch("iox.other", {2: 1})
    marks.forget("iox.db")  # a new epoch of the topic: its offsets start over
    assert reader.read("iox.db") == {}
    marks.touch("iox.db", {0: 1})
    assert reader.read("iox.db") == {0: 1}
    (tmp_path / "acked" / "iox.bad").write_text("{not json")
    assert reader.read("iox.bad") == {}  # unreadable: no ends (the source asks the broker)
    AckMarks(str(tmp_path / "acked")).clear()  # a server's start: an earlier run's offsets go
    assert reader.read("iox.db") == {} and reader.read("iox.other") == {}
    AckMarks(str(tmp_path / "never")).clear()  # no directory yet: nothing to clear
