"""server/replay_watch.py: a database replays until each Kafka partition applied its target (a
partition held at a poisoned message: up to the offset before it); progress counts offsets done
of those planned at start; the last database to catch up retires the watch once. A real Catalog."""
from __future__ import annotations

import threading

from iox_spark.catalog.catalog import Catalog
from iox_spark.server.replay_watch import ReplayWatch
from iox_spark.server.write_buffer.poison import set_aside


def _watch(until, replay_from=None):
    cat = Catalog()
    a = cat.ensure_database("a", "iox.a", 2)
    b = cat.ensure_database("b", "iox.b", 2)
    caught_up = []
    return ReplayWatch(cat, until, replay_from or {}, on_caught_up=lambda: caught_up.append(1)), cat, a, b, caught_up


def test_a_database_replays_until_every_partition_reached_its_target():
    w, cat, a, b, caught_up = _watch({"iox.a": {0: 4, 1: 2}, "iox.b": {}}, {"iox.a": {0: 0, 1: 1}})
    assert w.planned and w.targets("iox.a") == {0: 4, 1: 2} and w.targets("iox.b") == {}
    assert w.replaying(a) and not w.replaying(b)
    assert w.progress(a) == (0, 7) and w.progress(b) == (0, 0)
    cat.advance_applied(a, {0: 4})
    st = w.state(a)
    assert w.replaying(a) and st.replaying and st.until == {0: 4, 1: 2} and (st.done, st.todo) == (5, 7)
    assert w.any_replaying() and caught_up == []
    cat.advance_applied(a, {1: 9})  # past the target: progress stops at it
    assert not w.replaying(a) and not w.state(a).replaying and w.progress(a) == (7, 7)
    assert not w.any_replaying() and caught_up == [1]
    assert w.targets("iox.a") == {} and w.progress(a) == (7, 7)  # the plan stays for status
    assert not w.any_replaying() and caught_up == [1]  # retired once


def test_a_partition_held_at_a_poisoned_message_counts_as_caught_up_before_it():
    w, cat, a, _b, _ = _watch({"iox.a": {0: 9}})
    cat.advance_applied(a, {0: 5})
    set_aside(a, 0, 6, "t", "write", "boom", 1.0)
    st = w.state(a)
    assert not st.replaying and st.until == {0: 5}
    assert w.replaying(a)  # the lifecycle still holds its persists: offsets 6.. are not applied


def test_a_claim_extends_the_replay_and_a_loss_or_a_new_epoch_drops_it():
    w, cat, a, _b, caught_up = _watch({})
    assert not w.planned and not w.any_replaying() and caught_up == []  # nothing to catch up with
    w.extend("iox.a", {1: 3})
    assert w.replaying(a) and w.any_replaying()
    w.drop("iox.a", [1])
    assert not w.replaying(a) and not w.any_replaying() and caught_up == [1]
    w.extend("iox.a", {0: 2})
    w.forget("iox.a")
    assert w.targets("iox.a") == {} and not w.replaying(a)


def test_progress_is_logged_until_done(caplog):
    import logging

    w, cat, a, _b, _ = _watch({"iox.a": {0: 1}}, {"iox.a": {0: 0}})
    caplog.set_level(logging.INFO, logger="iox_spark.server.replay_watch")
    stopped = threading.Event()
    t = threading.Thread(target=w.log_progress, args=(stopped, 0.01))
    t.start()
    cat.advance_applied(a, {0: 1})
    t.join(10)
    assert not t.is_alive()
    assert any("replay of database a: done, 2 offsets" in r.getMessage() for r in caplog.records)
