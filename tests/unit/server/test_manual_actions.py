"""server/manual_actions.py's wait before `iox persist` / `iox compact`, and server/deadlines.py:
the target is Kafka's end as of the call (a held partition: up to its hold), a database nobody
knows is DatabaseNotFound, a wait that does not get there is CatchUpTimedOut within the request's
deadline. A real Catalog; Kafka and the ingestor are stand-ins that record what is asked."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from iox_spark.catalog.catalog import FROZEN, Catalog
from iox_spark.server.deadlines import ANSWER_MARGIN_S, wait_budget_s
from iox_spark.server.errors import CatchUpTimedOut, DatabaseNotFound, WriteBufferUnavailable
from iox_spark.server.manual_actions import CATCH_UP_TIMEOUT_S, ManualActions


def _actions(bounds, applied_after):
    cat = Catalog()
    waits = []

    def wait_applied(database, target, timeout_s):
        waits.append((database, dict(target), timeout_s))
        return dict(applied_after)

    def partition_bounds(topic, partitions):
        if bounds is None:
            raise RuntimeError("broker away")
        return dict(bounds)

    wb = SimpleNamespace(partition_bounds=partition_bounds)
    return ManualActions(cat, wb, wait_applied, lifecycle=None, partitions=2), cat, waits


def test_the_wait_targets_kafkas_end_below_any_hold():
    actions, cat, waits = _actions({0: (0, 10), 1: (0, 4)}, {0: 5, 1: 3})
    db = cat.ensure_database("d", "iox.d", 2)
    db.hold(FROZEN, {0: 6})  # nothing of partition 0 is applied from offset 6 on
    assert actions.caught_up("d", deadline_s=5.0) is db
    assert waits == [("d", {0: 5, 1: 3}, 5.0 - ANSWER_MARGIN_S)]


def test_a_wait_that_falls_short_says_how_far_it_got():
    actions, cat, waits = _actions({0: (0, 10)}, {0: 7})
    cat.ensure_database("d", "iox.d", 2)
    with pytest.raises(CatchUpTimedOut) as ei:
        actions.caught_up("d")
    assert ei.value.target == {0: 9} and ei.value.applied == {0: 7} and ei.value.timeout_s == CATCH_UP_TIMEOUT_S
    assert waits[0][2] == CATCH_UP_TIMEOUT_S


def test_a_database_neither_kafka_nor_the_catalog_knows_is_not_found_and_kafka_away_is_unavailable():
    actions, _cat, waits = _actions({}, {})
    with pytest.raises(DatabaseNotFound):
        actions.caught_up("nope")
    assert waits == []
    actions, _cat, _ = _actions(None, {})
    with pytest.raises(WriteBufferUnavailable):
        actions.caught_up("d")


def test_a_wait_budget_ends_a_margin_before_the_deadline():
    assert wait_budget_s(None, 120.0) == 120.0
    assert wait_budget_s(10.0, 120.0) == 10.0 - ANSWER_MARGIN_S
    assert wait_budget_s(500.0, 120.0) == 120.0
    assert wait_budget_s(0.1, 120.0) == 0.0
