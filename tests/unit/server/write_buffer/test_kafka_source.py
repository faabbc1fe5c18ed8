"""The streaming source's Kafka reads (server/write_buffer/kafka_source.py) against a recording consumer with
librdkafka's contracts. `consume(num_messages, timeout)` returns once it has `num_messages` messages
or when its timeout ends; a transaction control record is not one (it is passed, never returned).
A call asking for more messages than will come waits out its whole timeout, so the source must
never wait for more than will come: a range holds fewer messages than offsets when it has gaps
(control records, records removed by compaction), so it waits for one message at most. `position()`
is the offset after the last record (message or control record) `consume` went past in the
assignment, OFFSET_INVALID before any. The real consumer is exercised by the integration tests."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from iox_spark.server.write_buffer import kafka_source
from iox_spark.server.write_buffer.kafka_source import EndNotConfirmed, IoxKafkaStreamReader, TopicPartitionRange, true_ends
from tests.unit.server.write_buffer.fake_consumer import TOPIC, Msg, RecordingConsumer, partition_log, write_message


@pytest.fixture
def reader(monkeypatch):
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    monkeypatch.setattr(kafka_source, "_idle_consumers", {})
    return r


@pytest.mark.parametrize("end_exclusive", [1, 3, 7])
def test_read_asks_for_no_more_messages_than_its_range_holds(reader, end_exclusive):
    w = write_message("cpu", 4)
    c = RecordingConsumer({2: [Msg(2, off, w.value, w.headers) for off in range(10)]})
    kafka_source._idle_consumers["fake:9092"] = (c, time.monotonic())
    batches = list(reader.read(TopicPartitionRange(TOPIC, 2, 0, end_exclusive)))
    t = pa.Table.from_batches(batches)
    assert t.column("offset").to_pylist() == list(range(end_exclusive))
    assert t.column("nrows").to_pylist() == [4] * end_exclusive
    assert t.column("problem").to_pylist() == [None] * end_exclusive
    assert c.waited_out() == []
    assert [n for n, _t, _got in c.calls] == [end_exclusive]
    assert kafka_source._idle_consumers["fake:9092"][0] is c  # kept for the worker's next task


def test_read_of_a_range_larger_than_one_consume_call_asks_for_what_is_left(reader):
    w = write_message("cpu", 1)
    c = RecordingConsumer({0: [Msg(0, off, w.value, w.headers) for off in range(1_200)]})
    kafka_source._idle_consumers["fake:9092"] = (c, time.monotonic())
    rows = sum(b.num_rows for b in reader.read(TopicPartitionRange(TOPIC, 0, 100, 1_150)))
    assert rows == 1_050
    assert [n for n, _t, _got in c.calls] == [500, 500, 50]
    assert c.waited_out() == []


def test_a_consumer_idle_for_too_long_is_closed_by_the_next_task_whatever_broker_it_reads(reader, monkeypatch):
    # a worker once read a broker that is gone: its idle consumer must not reconnect to it forever
    w = write_message("cpu", 1)
    gone, recent, stale = RecordingConsumer({}), RecordingConsumer({}), RecordingConsumer({})
    created: list[tuple[str, RecordingConsumer]] = []

    def new_consumer(bootstrap):
        created.append((bootstrap, RecordingConsumer({0: [Msg(0, 0, w.value, w.headers)]})))
        return created[-1][1]

    monkeypatch.setattr(kafka_source, "reader_consumer", new_consumer)
    now = time.monotonic()
    kafka_source._idle_consumers.update({
        "gone:9092": (gone, now - kafka_source.IDLE_CONSUMER_MAX_S - 1),
        "recent:9092": (recent, now - kafka_source.IDLE_CONSUMER_MAX_S + 30),
        "fake:9092": (stale, now - kafka_source.IDLE_CONSUMER_MAX_S - 1)})
    assert sum(b.num_rows for b in reader.read(TopicPartitionRange(TOPIC, 0, 0, 1))) == 1
    assert gone.closed and "gone:9092" not in kafka_source._idle_consumers
    assert not recent.closed and kafka_source._idle_consumers["recent:9092"][0] is recent
    # the task's own broker's idle consumer was as old: closed too, and the task read with a new one,
    # now the idle one of its broker
    assert stale.closed and stale.calls == []
    assert [b for b, _c in created] == ["fake:9092"]
    assert kafka_source._idle_consumers["fake:9092"][0] is created[0][1] and not created[0][1].closed


def test_true_ends_reads_each_last_batch_without_waiting_out_a_timeout():
    # Tansu's watermark is the last batch's base offset + 1: partition 0's last batch holds 5-7,
    # partition 1's is one message at 3, partition 2 is empty
    c = RecordingConsumer({0: [Msg(0, off) for off in range(8)], 1: [Msg(1, off) for off in range(4)], 2: []})
    assert true_ends(c, TOPIC, {0: 6, 1: 4, 2: 0}) == {0: 8, 1: 4, 2: 0}
    assert c.waited_out() == []
    assert c.queue == []  # unassigned


# -- offsets with no message: transaction control records, compaction -----------------------------

def _read(reader, c: RecordingConsumer, partition: int, start: int, end_exclusive: int) -> pa.Table:
    kafka_source._idle_consumers["fake:9092"] = (c, time.monotonic())
    batches = list(reader.read(TopicPartitionRange(TOPIC, partition, start, end_exclusive)))
    return pa.Table.from_batches(batches) if batches else pa.table({"offset": pa.array([], pa.int64())})


@pytest.fixture
def short_stall(monkeypatch):
    """A read that waits for an offset the broker never returns fails within a second, not a minute."""
    monkeypatch.setattr(kafka_source, "READ_STALL_TIMEOUT_S", 1.0)


@pytest.mark.parametrize("fetch", [None, 2])
@pytest.mark.parametrize("gap", ["control record", "compacted"])
def test_a_range_with_a_gap_in_the_middle_is_read_whole_and_ends(reader, short_stall, gap, fetch):
    controls = [3] if gap == "control record" else []
    c = RecordingConsumer({1: partition_log(1, [0, 1, 2, 4, 5, 6], controls)}, fetch=fetch)
    t = _read(reader, c, 1, 0, 7)
    assert t.column("offset").to_pylist() == [0, 1, 2, 4, 5, 6]
    assert t.column("nrows").to_pylist() == [1] * 6
    assert c.waited_out() == []
    assert kafka_source._idle_consumers["fake:9092"][0] is c


@pytest.mark.parametrize("start, end_exclusive, fetch, expected", [
    (0, 7, None, [0, 1, 2, 3, 4]),  # a commit marker and an abort marker end the range
    (0, 7, 5, [0, 1, 2, 3, 4]),  # ... fetched after the messages, on their own
    (0, 6, None, [0, 1, 2, 3, 4]),  # the range ends at the first of them
    (5, 7, None, []),  # a range of markers only (a transaction decided after the last batch)
    (5, 6, 1, []),
])
def test_a_range_whose_last_offsets_are_control_records_ends_without_waiting(reader, short_stall, start,
                                                                             end_exclusive, fetch, expected):
    # nothing follows the markers: the range ends on the consumer's position alone
    c = RecordingConsumer({0: partition_log(0, range(5), [5, 6])}, fetch=fetch)
    t = _read(reader, c, 0, start, end_exclusive)
    assert t.column("offset").to_pylist() == expected
    assert c.waited_out() == []
    assert [t for _n, t, _got in c.calls] == [0] * len(c.calls)
    assert kafka_source._idle_consumers["fake:9092"][0] is c


def test_a_compacted_range_is_read_whole_once(reader, short_stall):
    # a compacted topic: most offsets gone, a control record here and there, the range starting at a
    # gap and larger than one consume call, the partition going on after it
    kept = [o for o in range(1, 1_300) if o % 7 == 0 or o % 11 == 0]
    controls = [o for o in range(1, 1_300) if o % 13 == 0 and o not in kept]
    c = RecordingConsumer({3: partition_log(3, kept, controls)}, fetch=64)
    t = _read(reader, c, 3, 1, 1_200)
    expected = [o for o in kept if o < 1_200]
    assert t.column("offset").to_pylist() == expected  # each once, in order, none beyond the range
    assert c.waited_out() == []


def test_a_range_ending_in_gaps_ends_once_a_later_message_arrives(reader, short_stall):
    # offsets 6-9 compacted away (no record at all: the position does not pass them); the message
    # at 12, beyond the range, proves the broker holds nothing at 6-9, and is not the range's
    c = RecordingConsumer({0: partition_log(0, [0, 1, 2, 3, 4, 5, 12, 13])}, fetch=3)
    t = _read(reader, c, 0, 2, 10)
    assert t.column("offset").to_pylist() == [2, 3, 4, 5]
    assert c.waited_out() == []


@pytest.mark.parametrize("fetch", [None, 1])
def test_a_range_is_not_ended_early_while_its_messages_are_slow_to_arrive(reader, short_stall, fetch):
    # Tansu: the range's end is real, but the messages take several calls to come; nothing before
    # them (no message, no position) may end the read
    c = RecordingConsumer({0: partition_log(0, [0, 1, 3, 4], [2, 5])}, fetch=fetch, slow=6)
    t = _read(reader, c, 0, 0, 6)
    assert t.column("offset").to_pylist() == [0, 1, 3, 4]
    # the calls that brought nothing waited for one message each, never for more
    assert [(n, got) for n, _t, got in c.calls[:6]] == [(6, 0)] + [(1, 0)] * 5
    assert all(n == 1 for n, _t, _got in c.waited_out())


def test_a_reused_consumer_with_an_earlier_assignments_position_is_replaced(reader, short_stall, monkeypatch):
    # librdkafka resets a partition's position when its earlier assignment stops; one not reset yet
    # (100, beyond this range) would end the range before a single message was read
    w = write_message("cpu", 1)
    stale = RecordingConsumer({0: partition_log(0, range(10), w=w)}, stale_position=100)
    fresh = RecordingConsumer({0: partition_log(0, range(10), w=w)})
    monkeypatch.setattr(kafka_source, "reader_consumer", lambda bootstrap: fresh)
    t = _read(reader, stale, 0, 0, 10)
    assert t.column("offset").to_pylist() == list(range(10))
    assert stale.closed and stale.calls == []
    assert kafka_source._idle_consumers["fake:9092"][0] is fresh and not fresh.closed


def test_a_last_batch_that_never_arrives_ends_at_the_watermark_for_a_reader_and_is_no_end_when_exact():
    # a busy broker answers the fetch of partition 0's last batch (5-7) after the wait: a reader may
    # take the watermark (it reads the rest later); what decides a loss must not (8 acknowledged
    # offsets are not lost because a fetch came late)
    log = {0: [Msg(0, off) for off in range(8)], 1: [Msg(1, off) for off in range(4)]}
    assert true_ends(RecordingConsumer(log, slow=10**9), TOPIC, {0: 6, 1: 4}, wait_s=0.2) == {0: 6, 1: 4}
    with pytest.raises(EndNotConfirmed) as ei:
        true_ends(RecordingConsumer(log, slow=10**9), TOPIC, {0: 6, 1: 4}, wait_s=0.2, exact=True)
    assert (ei.value.topic, ei.value.partitions, ei.value.waited_s) == (TOPIC, [0, 1], 0.2)
    # once it arrives within the wait, exact answers the true ends
    assert true_ends(RecordingConsumer(log, slow=3), TOPIC, {0: 6, 1: 4}, wait_s=5, exact=True) == {0: 8, 1: 4}


@pytest.mark.parametrize("exact", [False, True])
def test_true_ends_reads_past_a_listoffsets_watermark_short_by_several_batches(exact):
    """Tansu on s3:// storage answers ListOffsets latest with the first batch of the last second
    stored: the watermark of the fetch that read it tells the partition's end, whose batch is read
    then. Partition 0: single-message batches 0-9, ListOffsets said 4; partition 1: told right."""
    log = {0: [Msg(0, off) for off in range(10)], 1: [Msg(1, off) for off in range(3)]}
    c = RecordingConsumer(log, fetch=1, max_fetches=1)
    assert true_ends(c, TOPIC, {0: 4, 1: 3}, exact=exact) == {0: 10, 1: 3}
    assert c.positions == {}  # unassigned


def test_true_ends_asks_a_second_round_only_once():
    """The end is the one when the first fetch answered: one more round reads up to the watermark
    that fetch gave, and no further round chases a partition that keeps growing."""
    log = {0: [Msg(0, off) for off in range(6)]}
    c = RecordingConsumer(log, fetch=1, fetch_hw={0: 6}, max_fetches=1)
    assigned = []
    real_assign = c.assign
    c.assign = lambda tps: (assigned.append([(tp.partition, tp.offset) for tp in tps]), real_assign(tps))[1]
    assert true_ends(c, TOPIC, {0: 2}) == {0: 6}
    assert assigned == [[(0, 1)], [(0, 5)]]
    c.fetch_hw = {0: 9}  # a fetch now says 9: writes came meanwhile; found by the next ask, not chased
    log[0] += [Msg(0, off) for off in range(6, 9)]
    assigned.clear()
    assert true_ends(c, TOPIC, {0: 2}) == {0: 9}
    assert len(assigned) == 2


@pytest.mark.parametrize("fetch", [None, 1])
def test_true_ends_does_not_wait_for_a_last_offset_that_is_a_control_record(fetch):
    # partition 0 ends with a commit marker at 4 (its watermark 5, as on Apache Kafka and on Tansu,
    # whose last batch is the marker); partition 1 holds a marker only; partition 2's last batch is
    # messages 5-7 followed by a marker at 8 that Tansu's watermark (6) does not show
    c = RecordingConsumer({0: partition_log(0, range(4), [4]), 1: partition_log(1, [], [0]), 2: partition_log(2, range(8), [8])},
                  fetch=fetch)
    t0 = time.monotonic()
    assert true_ends(c, TOPIC, {0: 5, 1: 1, 2: 6}) == {0: 5, 1: 1, 2: 9}
    assert c.waited_out() == []
    assert time.monotonic() - t0 < 1.0  # not the 2 s the probe gives a partition it never hears from
    assert c.queue == [] and c.positions == {}  # unassigned


def test_a_watermark_one_short_of_the_last_message_does_not_hide_it_for_good(monkeypatch):
    """Tansu on s3:// storage can report a high watermark one short of its last message until the
    next produce: once the end is asked again (writes were acknowledged on the topic, or the poll is
    due), it is read past what is known, at most every STALE_PROBE_INTERVAL_S."""
    log = {0: [Msg(0, i) for i in range(3)]}
    probe = RecordingConsumer(log)
    marks = {"hw": 2}
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    r._probe, r._admin = probe, object()
    r._end_reader = lambda: probe
    r._latest_of = lambda topic, partitions: {p: marks["hw"] for p in partitions}
    clock = [100.0]

    def monotonic():  # advances a little on every look, so no wait in the code under test is endless
        clock[0] += 1e-4
        return clock[0]

    monkeypatch.setattr(kafka_source.time, "monotonic", monotonic)
    r._true_end[(TOPIC, 0)] = 2  # offsets 0 and 1 were known; the watermark stays at 2 though 2 exists
    assert r._ends_of(TOPIC, 1) == {0: 3}
    # not read past again before the interval: nothing new anyway
    log[0].append(Msg(0, 3))
    clock[0] += kafka_source.STALE_PROBE_INTERVAL_S / 2
    r._polls = kafka_source.EndPolls()  # due again
    assert r._ends_of(TOPIC, 1) == {0: 3}
    clock[0] += kafka_source.STALE_PROBE_INTERVAL_S
    assert r._ends_of(TOPIC, 1) == {0: 4}


def test_a_true_end_is_read_by_a_consumer_made_for_that_read_and_closed_after_it(monkeypatch):
    """The last batch of a partition is read by a new consumer whose fetches may wait
    LIST_FETCH_WAIT_MS (Tansu's object-store engine lists a long partition's batches within the
    fetch wait, else answers nothing), closed after the read: the fetch it leaves waiting at the
    end must not hold up the next read. The kept probe reads no batch."""
    log = {0: [Msg(0, i) for i in range(5)]}
    made = []

    def end_reader():
        made.append(RecordingConsumer(log))
        return made[-1]

    r = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    r._probe, r._admin = RecordingConsumer({}), object()
    r._end_reader = end_reader
    hw = {"hw": 3}
    r._latest_of = lambda topic, partitions: {p: hw["hw"] for p in partitions}
    clock = [100.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    assert r._ends_of(TOPIC, 1) == {0: 3}  # moved at its first answer: up to the watermark
    assert made == []
    clock[0] += 1.0
    assert r._ends_of(TOPIC, 1) == {0: 5}  # unmoved: its last batch read
    clock[0] += 1.0
    hw["hw"] = 5
    r._polls = kafka_source.EndPolls()
    assert r._ends_of(TOPIC, 1) == {0: 5}
    assert len(made) == 2 and all(c.closed for c in made)
    assert r._probe.calls == []


def test_ends_the_server_confirmed_at_start_are_read_to_at_once_without_a_probe(monkeypatch):
    """`known_ends` (the replay's ends, confirmed exactly before the query started): the first
    trigger reads up to them although the watermark stops short of a last batch of several messages,
    without reading that batch again; later writes past them are still found as usual."""
    import json

    log = {0: [Msg(0, i) for i in range(5)], 1: []}
    made = []

    def end_reader():
        made.append(RecordingConsumer(log))
        return made[-1]

    r = IoxKafkaStreamReader({"bootstrap": "fake:9092", "known_ends": json.dumps({TOPIC: {"0": 5}})})
    r._probe, r._admin = RecordingConsumer({}), object()
    r._end_reader = end_reader
    hw = {0: 3, 1: 0}
    r._latest_of = lambda topic, partitions: {p: hw[p] for p in partitions}
    clock = [100.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    assert r._ends_of(TOPIC, 2) == {0: 5, 1: 0}
    assert made == []  # no last batch read: the end is known
    # a write after the start: the watermark moves past the known end and is followed
    log[0] += [Msg(0, 5), Msg(0, 6)]
    hw[0] = 6
    clock[0] += 1.0
    r._polls = kafka_source.EndPolls()
    assert r._ends_of(TOPIC, 2)[0] == 6
    # without the option, the same first trigger stops at the watermark (the rest comes later)
    plain = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    plain._probe, plain._admin = RecordingConsumer({}), object()
    plain._latest_of = lambda topic, partitions: {p: 3 for p in partitions}
    assert plain._ends_of(TOPIC, 1) == {0: 3}


def test_the_end_reader_waits_long_enough_to_list_a_long_partition(monkeypatch):
    seen = {}
    monkeypatch.setattr(kafka_source, "reader_consumer", lambda bootstrap, **extra: seen.update(extra) or object())
    IoxKafkaStreamReader({"bootstrap": "fake:9092"})._end_reader()
    assert seen == {"fetch.wait.max.ms": kafka_source.LIST_FETCH_WAIT_MS}


def test_only_partitions_marked_moving_or_due_are_asked_and_in_one_request(tmp_path, monkeypatch):
    """end_polls: a partition this server got a write acknowledged on is asked at the next trigger;
    an idle one only once its poll is due; the partitions asked are asked together."""
    from iox_spark.server.write_buffer.end_polls import AckMarks

    marks = AckMarks(str(tmp_path / "acked"))
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092", "acked_marks_dir": marks.directory})
    r._probe, r._admin = RecordingConsumer({}), object()
    r._end_reader = lambda: RecordingConsumer({})
    hws = {0: 5, 1: 7, 2: 9}
    asked = []

    def latest_of(topic, partitions):
        if partitions:  # the real one sends no request for none
            asked.append(sorted(partitions))
        return {p: hws[p] for p in partitions}

    r._latest_of = latest_of
    r._polls = kafka_source.EndPolls(first_delay_s=0.5, max_delay_s=1.0)
    monkeypatch.setattr(kafka_source, "true_ends", lambda consumer, topic, grown, **kw: dict(grown))
    clock = [100.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    assert r._ends_of(TOPIC, 3) == hws  # never asked: all, in one request
    clock[0] += 0.125
    assert r._ends_of(TOPIC, 3) == hws  # moved at the first answer: asked again, now unmoved
    assert asked == [[0, 1, 2], [0, 1, 2]]
    clock[0] += 0.125
    assert r._ends_of(TOPIC, 3) == hws  # not due yet: none asked
    assert len(asked) == 2
    marks.touch(TOPIC, [1])  # this server's write to partition 1 was acknowledged
    hws[1] = 8
    clock[0] += 0.125
    assert r._ends_of(TOPIC, 3) == {0: 5, 1: 8, 2: 9}
    assert asked[-1] == [1]
    hws[2] = 10  # another producer's write: found once partition 2's poll is due
    clock[0] += 0.125
    r._ends_of(TOPIC, 3)
    assert asked[-1] == [1]  # partition 1 moved at its last answer; 2 is not due
    clock[0] += 1.0
    assert r._ends_of(TOPIC, 3) == {0: 5, 1: 8, 2: 10}


def test_an_empty_partition_backs_off_like_any_idle_one(monkeypatch):
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092"})
    r._probe, r._admin = RecordingConsumer({}), object()
    asked = []

    def latest_of(topic, partitions):
        if partitions:
            asked.append(sorted(partitions))
        return {p: 0 for p in partitions}

    r._latest_of = latest_of
    r._polls = kafka_source.EndPolls(first_delay_s=0.5, max_delay_s=1.0)
    clock = [100.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    for _ in range(4):
        assert r._ends_of(TOPIC, 2) == {0: 0, 1: 0}
        clock[0] += 0.125
    assert asked == [[0, 1], [0, 1]]  # the first answer counts as moved; then backed off


def test_the_topic_list_is_asked_again_when_marked_or_after_the_longest_poll_delay(tmp_path, monkeypatch):
    """A Metadata request per trigger costs Tansu a read per topic: the list is kept between triggers,
    asked again at once for a topic this server marked (its first write there), else once the
    longest poll delay passed; `initialOffset` always asks."""
    from types import SimpleNamespace

    from iox_spark.server.write_buffer.end_polls import AckMarks

    marks = AckMarks(str(tmp_path / "acked"))
    topics = {TOPIC: SimpleNamespace(error=None, partitions={0: None, 1: None}), "other": SimpleNamespace(error=None, partitions={0: None})}
    calls = []

    class _Admin:
        def list_topics(self, timeout=None):
            calls.append(1)
            return SimpleNamespace(topics=dict(topics))

    r = IoxKafkaStreamReader({"bootstrap": "fake:9092", "acked_marks_dir": marks.directory})
    r._probe, r._admin = RecordingConsumer({}), _Admin()
    clock = [100.0]
    monkeypatch.setattr(kafka_source.time, "monotonic", lambda: clock[0])
    assert r._topics() == {TOPIC: 2} and len(calls) == 1
    clock[0] += 0.5
    assert r._topics() == {TOPIC: 2} and len(calls) == 1  # kept
    topics["iox.new"] = SimpleNamespace(error=None, partitions={0: None})
    assert r._topics() == {TOPIC: 2} and len(calls) == 1  # another producer's new topic: not yet
    marks.touch(TOPIC, [0])
    assert r._topics() == {TOPIC: 2} and len(calls) == 1  # a known topic marked: no need to ask
    marks.touch("iox.mine", [0])
    topics["iox.mine"] = SimpleNamespace(error=None, partitions={0: None})
    assert r._topics() == {TOPIC: 2, "iox.new": 1, "iox.mine": 1} and len(calls) == 2  # this server's new topic: at once
    clock[0] += r._polls.max_delay_s
    r._topics()
    assert len(calls) == 3  # the longest delay passed
    r._topics(fresh=True)
    assert len(calls) == 4


def test_latest_offset_never_reads_a_held_partition_past_its_poisoned_message(tmp_path, monkeypatch):
    """The consumer's holds file (server/write_buffer/poison.py): a held partition's range ends at the held
    message (or where it already is, when a batch read past it), the others read on."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from iox_spark.server.write_buffer.holds_file import write_holds

    holds = str(tmp_path / "holds.json")
    r = IoxKafkaStreamReader({"bootstrap": "fake:9092", "holds_file": holds})
    monkeypatch.setattr(r, "_topics", lambda: {TOPIC: 3})
    monkeypatch.setattr(r, "_ends_of", lambda topic, n: {0: 50, 1: 50, 2: 50})
    start = {TOPIC: {"0": 10, "1": 10, "2": 10}}
    assert r.latestOffset(start, ReadMaxRows(100)) == {TOPIC: {"0": 50, "1": 50, "2": 50}}
    write_holds(holds, {TOPIC: {"1": 20, "2": 5}})
    assert r.latestOffset(start, ReadMaxRows(100)) == {TOPIC: {"0": 50, "1": 20, "2": 10}}
    write_holds(holds, {})
    assert r.latestOffset(start, ReadMaxRows(100)) == {TOPIC: {"0": 50, "1": 50, "2": 50}}
