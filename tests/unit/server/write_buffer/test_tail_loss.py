"""server/write_buffer/tail_loss.py: a Kafka end short of known offsets, a late read or a lost tail."""
from __future__ import annotations

from iox_spark.server.write_buffer.tail_loss import TailWatch, settled_bounds

K = ("db", 0, 0)


def test_an_end_short_of_known_offsets_is_lost_after_the_grace_unless_it_catches_up():
    w = TailWatch(grace_s=30)
    # short of 9 (applied or acknowledged): a late read for 29 s, lost at 30 s
    assert not w.lost(K, 6, 9, now=0.0)
    assert not w.lost(K, 6, 9, now=29.0)
    assert w.lost(K, 6, 9, now=30.0)
    assert not w.lost(K, 6, 9, now=31.0)  # reported: a new shortfall from here
    # under load: always short of the newest offsets, but past what it was short of before: never lost
    w = TailWatch(grace_s=30)
    for t, (end, known) in enumerate([(6, 9), (10, 14), (15, 20), (21, 25)]):
        assert not w.lost(K, end, known, now=t * 20.0)
    # an end past every known offset forgets the earlier shortfall
    w = TailWatch(grace_s=30)
    assert not w.lost(K, 6, 9, now=0.0)
    assert not w.lost(K, 10, 9, now=10.0)
    assert not w.lost(K, 6, 9, now=35.0)
    w.clear(K)
    assert not w.lost(K, 6, 9, now=100.0)  # a new shortfall from 100 s
    assert w.lost(K, 2, 9, now=130.0)  # still short of 9 (and shorter): lost
    # partitions are judged apart
    assert not w.lost(("db", 0, 1), 2, 9, now=130.0)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_settled_bounds_reads_again_until_the_end_passes_what_was_acknowledged():
    clock = _Clock()
    reads = iter([{0: (0, 7)}, {0: (0, 10)}])
    out = settled_bounds(lambda: next(reads), {0: (0, 5)}, {0: 9}, {}, clock=clock, sleep=clock.sleep)
    assert out == {0: (0, 10)} and clock.t == 1.0


def test_settled_bounds_ends_when_the_end_stops_moving_or_the_grace_passes():
    clock = _Clock()
    out = settled_bounds(lambda: {0: (0, 5)}, {0: (0, 5)}, {0: 9}, {}, stable_s=5, clock=clock, sleep=clock.sleep)
    assert out == {0: (0, 5)} and clock.t == 5.0
    clock = _Clock()
    ends = iter(range(6, 100))
    out = settled_bounds(lambda: {0: (0, next(ends))}, {0: (0, 5)}, {0: 200}, {}, grace_s=10, stable_s=5,
                         clock=clock, sleep=clock.sleep)
    assert clock.t == 10.0 and out == {0: (0, 25)}


def test_settled_bounds_does_not_wait_for_an_end_below_what_was_read_or_past_what_was_acknowledged():
    clock = _Clock()
    never = lambda: (_ for _ in ()).throw(AssertionError("read again"))  # noqa: E731
    assert settled_bounds(never, {0: (0, 3)}, {0: 9}, {0: 4}, clock=clock, sleep=clock.sleep) == {0: (0, 3)}
    assert settled_bounds(never, {0: (0, 10)}, {0: 9}, {}, clock=clock, sleep=clock.sleep) == {0: (0, 10)}
    assert clock.t == 0.0
