"""Durations of retention periods, reader_lo, and query pins (pure)."""
from __future__ import annotations

import pytest

from iox_spark.catalog.errors import InvalidDuration
from iox_spark.catalog.query_pins import QueryPins
from iox_spark.catalog.retention import format_duration_s, parse_duration_s, reader_lo_ns


@pytest.mark.parametrize("text, seconds", [
    ("30d", 30 * 86_400), ("12h", 43_200), ("90m", 5_400), ("3600s", 3_600), ("3600", 3_600), ("0", 0),
    (" 1D12h ", 129_600), ("2w", 14 * 86_400), (7, 7), ("0d", 0),
])
def test_durations_parse(text, seconds) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "30x", "-5", "5 d", "1.5h", "h12", "30dd", True, -1, "999999d"])
def test_bad_durations_are_refused_with_the_text(text) -> None:
    with pytest.raises(InvalidDuration) as info:
        parse_duration_s(text)
    assert info.value.text == text


def test_format_round_trips() -> None:
    for s in (0, 1, 59, 60, 3_600, 86_400, 30 * 86_400, 14 * 86_400, 90_061):
        assert parse_duration_s(format_duration_s(s)) == s
    assert format_duration_s(30 * 86_400) == "30d" and format_duration_s(5_400) == "90m"


def test_reader_lo() -> None:
    assert reader_lo_ns(None, 1_000.0) is None and reader_lo_ns(0, 1_000.0) is None
    assert reader_lo_ns(60, 1_000.5) == 940_500_000_000


def test_query_pins_hold_retired_objects_until_every_older_query_ends() -> None:
    pins = QueryPins()
    early = pins.pin()
    pins.retire(["a"])
    late = pins.pin()  # planned after "a" left the catalog: never reads it
    assert pins.take_unpinned() == [] and pins.waiting_objects() == {"a"}
    pins.unpin(late)
    assert pins.take_unpinned() == []  # the early query may still read it
    pins.retire(["b"])
    pins.unpin(early)
    assert sorted(pins.take_unpinned()) == ["a", "b"] and pins.waiting() == 0
    pins.retire(["c"])  # nothing running: free at once
    assert pins.take_unpinned() == ["c"]
    pins.unpin(12345)  # unknown tickets are ignored
    assert pins.running() == 0


def test_a_pin_released_later_frees_what_it_held_at_the_next_use_of_the_pins() -> None:
    """`release_later` (an answer dropped unread, from its finalizer) takes no lock; the ticket leaves
    the running queries when the pins are next used."""
    pins = QueryPins()
    t = pins.pin()
    pins.retire(["a"])
    assert pins.take_unpinned() == []
    pins.release_later(t)
    assert pins.running() == 0 and pins.take_unpinned() == ["a"]
    pins.release_later(t)  # released twice, or unknown: ignored
    assert pins.running() == 0
