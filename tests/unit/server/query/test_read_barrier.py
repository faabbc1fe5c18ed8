"""The read barrier (server/query/read_barrier.py) over the real in-memory catalog, with the consumer
played by a thread that advances the applied watermark."""
from __future__ import annotations

import threading
import time

import pytest

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.errors import (DatabaseNotFound, ReplayNotCaughtUp, WriteTokenNotVisible, WriteTokenOfOtherDatabase,
                           WriteTokenOfOtherIncarnation)
from iox_spark.server.query.read_barrier import ReadBarrier, ReplayState
from iox_spark.server.write_buffer.write_token import InvalidWriteToken, WriteToken, format_token

UNTIL = {0: 9, 1: 4}


@pytest.fixture
def setup():
    catalog = Catalog()
    db = catalog.ensure_database("d", "iox_d", 2)
    db.set_epoch(2, 0)
    db.adopt_topic_id("id-a")
    applied_cv = threading.Condition()

    def wait_applied(database, target, timeout_s):
        with applied_cv:
            applied_cv.wait_for(lambda: all(db.applied_hi_inclusive.get(k, -1) >= o for k, o in target.items()),
                                timeout_s)

    def apply(offsets):
        with applied_cv:
            catalog.advance_applied(db, offsets)
            applied_cv.notify_all()

    def replay_state(d):
        replaying = any(d.applied_hi_inclusive.get(k, -1) < o for k, o in UNTIL.items())
        return ReplayState(replaying, UNTIL, sum(max(0, d.applied_hi_inclusive.get(k, -1) + 1) for k in UNTIL), 15)

    visible = {}
    barrier = ReadBarrier(catalog, wait_applied, lambda d: {k: max(a, visible.get(k, a))
                                                          for k, a in d.applied_hi_inclusive.items()}, replay_state)
    return barrier, db, apply, visible


def _token(offsets, epoch=2, topic="iox_d", topic_id="id-a"):
    return format_token(WriteToken(topic, topic_id, epoch, offsets))


def test_a_query_during_replay_waits_for_it_or_answers_unavailable_with_its_progress(setup):
    barrier, db, apply, _ = setup
    apply({0: 3, 1: -1})
    t0 = time.monotonic()
    with pytest.raises(ReplayNotCaughtUp, match="4 of 15 offsets done") as e:
        barrier.pass_through("d", "", False, 0.3)
    assert (e.value.done, e.value.todo) == (4, 15) and time.monotonic() - t0 >= 0.3
    p = barrier.pass_through("d", "", True, 0.0)  # allowed: at once, marked partial
    assert p.partial is True
    threading.Timer(0.2, apply, ({0: 9, 1: 4},)).start()
    assert barrier.pass_through("d", "", False, 10.0).partial is False  # waited for the replay, complete


def test_a_token_waits_until_visible_and_past_the_deadline_is_refused(setup):
    barrier, db, apply, visible = setup
    apply(UNTIL)
    with pytest.raises(WriteTokenNotVisible, match="0: 9 / 12"):
        barrier.pass_through("d", _token({0: 12}), False, 0.2)
    visible[0] = 12  # the write buffer's tail holds it: visible, though not applied
    assert barrier.pass_through("d", _token({0: 12}), False, 0.0).token.offsets == {0: 12}
    threading.Timer(0.2, apply, ({1: 30},)).start()
    assert barrier.pass_through("d", _token({1: 30}), False, 10.0).partial is False


def test_tokens_of_another_database_epoch_or_topic_incarnation_are_refused(setup):
    barrier, db, apply, _ = setup
    apply(UNTIL)
    with pytest.raises(WriteTokenOfOtherDatabase):
        barrier.pass_through("d", _token({0: 1}, topic="iox_e"), False, 1.0)
    with pytest.raises(WriteTokenOfOtherIncarnation, match="epoch 1"):
        barrier.pass_through("d", _token({0: 1}, epoch=1), False, 1.0)
    with pytest.raises(WriteTokenOfOtherIncarnation, match="id-b"):
        barrier.pass_through("d", _token({0: 1}, topic_id="id-b"), False, 1.0)
    with pytest.raises(InvalidWriteToken, match=r"partition\(s\) \[2\]"):
        barrier.pass_through("d", _token({2: 1}), False, 1.0)
    with pytest.raises(DatabaseNotFound):
        barrier.pass_through("nope", _token({0: 1}, topic="iox_nope"), False, 1.0)
