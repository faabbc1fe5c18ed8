"""Frozen mode's record, what the source reads of it, the replay cap and the usage rule."""
from __future__ import annotations

import json
import os

import pytest

from iox_spark.server.write_buffer.freeze import (FREEZE_FORMAT_VERSION, FreezeFileCorrupt, FreezeRecord, UsageWatch,
                                        cap_replay_until, read_record, remove_record, source_holds, usage_reason,
                                        write_record)


def test_the_record_round_trips_and_is_removed(tmp_path) -> None:
    path = str(tmp_path / "frozen.json")
    assert read_record(path) is None and source_holds(path) is None
    rec = FreezeRecord(reason="admin", since_s=12.5, offsets={"db1": {0: 4, 1: -1}, "db2": {3: 10}})
    write_record(path, rec)
    assert read_record(path) == rec
    assert json.load(open(path))["format_version"] == FREEZE_FORMAT_VERSION
    # the source holds each partition past its last applied offset, by topic
    assert source_holds(path) == {"iox.db1": {0: 5, 1: 0}, "iox.db2": {3: 11}}
    assert remove_record(path) and not remove_record(path)
    assert source_holds(path) is None


@pytest.mark.parametrize("content, match", [
    ("not json", "not readable JSON"),
    ("[1]", "not a JSON object"),
    (json.dumps({"format_version": 2, "reason": "x", "since_s": 1, "offsets": {}}), "format version 2"),
    (json.dumps({"format_version": 1, "reason": 3, "since_s": 1, "offsets": {}}), "wrong type"),
    (json.dumps({"format_version": 1, "reason": "x", "since_s": 1, "offsets": {"d": {"0": "a"}}}), "not integers"),
])
def test_a_corrupt_record_is_a_specific_error_and_the_source_reads_it_as_frozen(tmp_path, content, match) -> None:
    path = str(tmp_path / "frozen.json")
    with open(path, "w") as f:
        f.write(content)
    with pytest.raises(FreezeFileCorrupt, match=match) as info:
        read_record(path)
    assert info.value.path == path
    assert source_holds(path) == {}  # frozen, every partition held where it stands


def test_replay_after_a_restart_stops_at_the_freeze() -> None:
    until = {"iox.a": {0: 9, 1: 20, 2: 5}, "iox.b": {0: 3}}
    assert cap_replay_until(until, None) == until
    rec = FreezeRecord(reason="r", since_s=1.0, offsets={"a": {0: 7, 1: 30, 2: -1}})
    # capped at the freeze, a partition with nothing applied replays nothing, an unnamed topic neither
    assert cap_replay_until(until, rec) == {"iox.a": {0: 7, 1: 20}, "iox.b": {}}


def test_usage_over_the_percent_names_its_cause() -> None:
    assert usage_reason(95, 100, 10, 100, 0) is None  # 0: never
    assert usage_reason(89, 100, 10, 100, 90) is None
    assert usage_reason(90, 100, 10, 100, 90) == "memory 90.0% >= 90%"
    assert usage_reason(10, 100, 955, 1000, 90) == "disk 95.5% >= 90%"
    assert usage_reason(10**12, 0, 0, 0, 1) is None  # unknown totals never count


def test_the_usage_watch_calls_back_only_when_over() -> None:
    calls = []
    usage = [(10, 100, 0, 100)]
    w = UsageWatch(50, lambda: usage[0], calls.append, interval_s=3600)
    assert w.check() is None and calls == []
    usage[0] = (60, 100, 0, 100)
    assert w.check() == "memory 60.0% >= 50%" and calls == ["memory 60.0% >= 50%"]


def test_a_written_record_replaces_the_old_one_atomically(tmp_path) -> None:
    path = str(tmp_path / "frozen.json")
    write_record(path, FreezeRecord(reason="a", since_s=1.0))
    write_record(path, FreezeRecord(reason="b", since_s=2.0))
    assert read_record(path).reason == "b" and not os.path.exists(path + ".tmp")
