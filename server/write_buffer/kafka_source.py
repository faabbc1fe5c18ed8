"""Spark streaming data source `iox_kafka`: the write buffer, read as micro-batches.

There is no Kafka connector jar on this platform, so this is a Python
`DataSourceStreamReader`. Offsets are {topic: {"<partition>": next_offset}}.

Where each part runs:
- `IoxKafkaStreamReader.initialOffset/latestOffset/partitions/commit` run in the
  Python worker Spark starts for the streaming source (driver side, NOT the
  server's own Python process: no shared state, only options and Kafka).
- `read` runs on executors, one task per Kafka partition; it keeps no state
  between tasks except an idle Kafka consumer per Python worker process, which
  the next task of that worker assigns anew (connecting per task dominated
  small micro-batches).

Invariants:
- A micro-batch covers, per Kafka partition, exactly the offsets [start, end):
  `read` yields every message in that range once, or fails the batch. An offset
  the broker returns no message for is a gap: consumed, no row (a transaction
  control record of a transactional producer, which librdkafka's `consume`
  hides; a record removed by compaction or retention). `read` ends only on the
  broker's word that the range is passed, never because nothing arrived (Tansu's
  watermark can be short of its last batch, and a message can be slow to come):
  a message at or beyond `end`, or the consumer's position (`consumer_positions`)
  at or beyond `end`, which control records move too. An offset with no record
  at all at the range's end (a last batch compaction emptied) gives no such
  word: the range ends once a later record arrives.
- `latestOffset` never reports an end beyond what Kafka holds and never stops
  short of the last message for longer than one trigger after a partition
  stops moving: Tansu reports the high watermark as the base offset of the
  last record batch + 1 (short of the rest of a batch of several messages: the
  router's messages of concurrent requests to one partition share batches). A partition whose watermark
  moved since the last trigger ends at the watermark; once it did not move,
  its true end is found by reading its last batch (a no-op on Apache Kafka,
  where the batch ends at the watermark). Reading the last batch costs Tansu a
  walk of the partition's stored batches (26 ms of its CPU at 5,000 batches),
  so it is not done at every trigger of a partition under load.
- A partition's end is asked at every trigger while it moves; one that did not
  move is asked again after up to `end_polls.DEFAULT_MAX_DELAY_S` (each ask
  costs Tansu a listing or walk of the partition's batches; see
  `server/write_buffer/end_polls.py`), or at once when the server marked it
  (option `acked_marks_dir`): Kafka acknowledged a write of this server to it.
  The partitions asked at a trigger are asked in one ListOffsets request per topic.
- A range of a partition that holds more record batches than Tansu's object-store engine lists
  within the reader's fetch wait (it then answers nothing) is still read: after SLOW_LIST_SWITCH_S
  of calls that brought nothing, `read` goes on with a consumer whose fetches may wait
  LIST_FETCH_WAIT_MS, for that task only. The last batch read for a partition's true end is read
  by such a consumer too, made for that one read.
- A micro-batch takes at most `max_messages_per_partition` messages of each Kafka
  partition (`getDefaultReadLimit`), so a backlog is applied in bounded steps.
- A partition held at a poisoned message (option `holds_file`, written by the
  consumer: server/write_buffer/poison.py) is not read past it (`holds_file.held_end`); the
  consumer reads it again from there once the message is retried or accepted.
- While the server is frozen (option `freeze_file` exists: server/write_buffer/freeze.py), no
  partition is read past the offset it was applied to at the freeze, and a topic or partition
  the freeze did not name is read no further than where it stands.
- New database topics (prefix `iox.`) are discovered at the next trigger when
  this server marked them, else within `end_polls.DEFAULT_MAX_DELAY_S` (the topic
  list is asked again that often), and read from their start offset (option
  `start_offsets`, else the low watermark).
- Every write (and transaction part holding one) is checked where it is read:
  `problem` names why its payload cannot be applied (not an Arrow IPC stream, no
  int64 time for every row; `wire_format.payload_problem`), NULL when it can, so
  the consumer never decodes a bad payload later. `unique` is the writer's
  iox-unique header.
"""
from __future__ import annotations

import json
import time

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from iox_spark.server.write_buffer.end_polls import AckMarks, EndPolls
from iox_spark.server.write_buffer.freeze import source_holds
from iox_spark.server.write_buffer.holds_file import held_end, read_holds

__all__ = ["IoxKafkaDataSource", "SOURCE_SCHEMA", "SOURCE_NAME", "true_ends", "EndNotConfirmed", "TRUE_END_WAIT_S",
           "reader_consumer",
           "consumer_positions", "FETCH_MAX_PARTITION_BYTES", "FETCH_MAX_BYTES", "IDLE_CONSUMER_MAX_S",
           "LIST_FETCH_WAIT_MS", "SLOW_LIST_SWITCH_S", "TopicPartitionRange"]

SOURCE_NAME = "iox_kafka"
SOURCE_SCHEMA = ("topic string, kp int, offset long, ts_ms long, kind string, tbl string, "
                 "schema string, nrows long, days string, payload binary, fmt string, txn string, txn_info string, "
                 "unique boolean, problem string")
#: the columns of SOURCE_SCHEMA, in order
_COLUMNS = ["topic", "kp", "offset", "ts_ms", "kind", "tbl", "schema", "nrows", "days", "payload", "fmt", "txn",
            "txn_info", "unique", "problem"]
#: Bytes one fetch asks the broker for, per partition and in all. Small: the broker builds a
#: fetch's answer in one go, and a produce that arrives meanwhile waits (Tansu answers a produce in
#: 2-6 ms idle; with 64/256 MiB fetches of a backlog, the bench's ack load had produce p99 10-15 ms
#: and ack p99 15-25 ms; with these 5 and 9-12 ms). A record batch larger than these is still
#: returned whole when it comes first, so a message of any size the write buffer takes is read.
FETCH_MAX_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 8 * 1024 * 1024
#: Messages one `consume` call of `read` takes at most, and how long it waits for one.
#: librdkafka's consume returns when it has as many messages as asked or at the timeout, whichever
#: comes first, and a transaction control record counts as none. A range holds fewer messages than
#: offsets when it has gaps, so `read` never waits for more than one: it takes what the consumer
#: holds already (up to what the range can still hold, timeout 0) and, after a call that brought
#: nothing (no message, no move of the position), waits for the next message at most
#: _CONSUME_TIMEOUT_S. Asking a range's count with a timeout held its task for the whole timeout
#: whenever fewer came (asking for 500 did so for every smaller range: 200 ms more for each
#: micro-batch's read). A control record that arrives during a wait ends it not: a range ending in
#: one that comes in a fetch of its own waits this long once.
_CONSUME_MAX_MESSAGES = 500
_CONSUME_TIMEOUT_S = 0.05
#: How often at most the end of a partition whose watermark did not move is read past what is known,
#: while it is asked (writes were acknowledged on its topic, or its poll is due): Tansu on s3://
#: storage can report a high watermark one short of its last message until the next produce
STALE_PROBE_INTERVAL_S = 0.25
#: How long `read` waits for a message that Kafka said exists before failing the batch.
READ_STALL_TIMEOUT_S = 60.0
#: fetch.wait.max.ms of a consumer that must read a partition holding many record batches. Tansu's
#: object-store engine (the durable embedded broker) answers a fetch by listing every batch the
#: partition holds, stops listing when the fetch's wait runs out, and then answers no message:
#: with the reader's 20 ms, a partition of a few thousand stored batches (about 0.1 s to list per
#: 1,000) is never read past what the first listed page reaches. A fetch that finds messages is
#: answered at once whatever its wait; only a fetch at the partition's end waits this long.
LIST_FETCH_WAIT_MS = 2000
#: How long `read` waits in all for messages that do not come before it goes on with a consumer
#: whose fetches wait LIST_FETCH_WAIT_MS (closed after the task: a fetch at the end of a partition
#: would hold up the next task's first fetch for that long)
SLOW_LIST_SWITCH_S = 1.0
_ADMIN_TIMEOUT_S = 10.0
#: bootstrap -> (a consumer no task is using, `time.monotonic()` when it became idle). Spark
#: reuses its Python workers, so the next task of this worker process reads with it instead of
#: connecting anew (connecting dominates small micro-batches). A task that fails closes its consumer.
_idle_consumers: dict = {}
#: An idle consumer unused for longer than this is closed by the next task of its worker process,
#: whatever broker that task reads. Without it, a worker that once read a broker that is gone (a
#: server stopped in the same Spark application, a broker address that changed) kept a consumer
#: reconnecting to it, and logging each refused connection, for as long as the worker lived.
IDLE_CONSUMER_MAX_S = 60.0


def _take_consumer(bootstrap: str, now_monotonic: float):
    """An idle consumer of `bootstrap`, or a new one; first closes the consumers idle for longer
    than IDLE_CONSUMER_MAX_S. Runs on an executor, in the task's Python worker."""
    for b, (c, idle_since) in list(_idle_consumers.items()):
        if now_monotonic - idle_since > IDLE_CONSUMER_MAX_S:
            del _idle_consumers[b]
            c.close()
    kept = _idle_consumers.pop(bootstrap, None)
    return kept[0] if kept is not None else reader_consumer(bootstrap)


class TopicPartitionRange(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end_exclusive: int):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end_exclusive = end_exclusive


def reader_consumer(bootstrap: str, **extra):
    """A consumer for reading assigned offset ranges (no group membership, no commits); `extra`
    overrides its configuration.

    A position the broker no longer holds (below its log start) resumes at the earliest offset it
    holds: the offsets skipped are gone, gaps as the readers count them. librdkafka's default
    ("latest") would skip to the partition's end, past messages the broker still holds, which a
    reader that counts unreturned offsets as gaps would then never read.
    """
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "iox-reader-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "fetch.wait.max.ms": 20,
        "fetch.max.bytes": FETCH_MAX_BYTES,
        "max.partition.fetch.bytes": FETCH_MAX_PARTITION_BYTES,
        "receive.message.max.bytes": 512 * 1024 * 1024,
        "allow.auto.create.topics": False,
        "auto.offset.reset": "earliest",
        "log_level": 3,
    }
    conf.update(extra)
    return Consumer(conf)


def consumer_positions(consumer, topic: str, partitions) -> dict[int, int]:
    """{partition: position} of `consumer`'s assigned `partitions` of `topic`.

    librdkafka's position is the offset after the last record its `consume` calls went past in
    this assignment: messages returned, and transaction control records, which `consume` hides
    but passes. So every offset below it the broker returned, or holds no message at (a control
    record, a gap). Before any record it is OFFSET_INVALID (< 0): librdkafka resets it when a
    partition's earlier assignment stops, so a value read right after `assign` and before any
    `consume` is a leftover of an earlier assignment, not this one's.
    """
    from confluent_kafka import TopicPartition

    return {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in partitions])}


#: How long `true_ends` waits for a partition's last batch before it ends with its watermark
TRUE_END_WAIT_S = 2.0


class EndNotConfirmed(Exception):
    """`true_ends(exact=True)` heard neither a message nor a position past the watermark of
    `partitions` of `topic` within `waited_s`: each ends at its watermark or later, exactly where is
    not known (a busy broker answers fetches late)."""

    def __init__(self, topic: str, partitions: list, waited_s: float):
        self.topic = topic
        self.partitions = list(partitions)
        self.waited_s = waited_s
        super().__init__(f"the end of {topic} partition(s) {self.partitions} was not confirmed within {waited_s:g} s")


def true_ends(consumer, topic: str, high_watermarks: dict[int, int], wait_s: float = TRUE_END_WAIT_S,
              exact: bool = False) -> dict[int, int]:
    """{partition: last offset + 1} of a topic's partitions whose broker reported `high_watermarks`.

    Tansu reports the base offset of the last record batch + 1: read that batch
    and take its last offset. On Apache Kafka the batch ends at the watermark.
    A last batch that is a transaction control record delivers no message: the
    consumer's position (`consumer_positions`) passing the watermark ends that
    partition's wait instead, and the position counts toward its end (the end
    includes the control record, as a watermark does). Every partition is
    probed at once (one fetch round trip, not one per partition); a partition
    heard from neither way ends with its watermark after `wait_s` (at most its
    true end: right for a reader, which reads the rest later), or, when `exact`,
    raises EndNotConfirmed (what decides a loss or a read barrier must not take a
    watermark for the end). Uses (and then unassigns) `consumer`.

    The watermark asked with ListOffsets can be short of the end by more than its
    last batch: Tansu on s3:// storage answers with the batch stored last by the
    store's modification times, which count whole seconds, so every batch stored
    in the same second as an earlier one is left out. The high watermark of the
    fetch that read the last batch is the partition's own (Tansu keeps it with
    each produce): where it is beyond the end found, the batch before it is read
    too (a second round, once), so the end is the partition's end when the first
    fetch answered.
    """
    deadline = time.monotonic() + wait_s
    out = {p: max(0, hw) for p, hw in high_watermarks.items()}
    ends, fetched, waiting = _read_last_batches(consumer, topic, high_watermarks, deadline)
    for p, end in ends.items():
        out[p] = max(out[p], end)
    further = {p: hw for p, hw in fetched.items() if hw > out[p]}
    if further:
        ends, _fetched, still = _read_last_batches(consumer, topic, further, deadline)
        for p, end in ends.items():
            out[p] = max(out[p], end)
        waiting |= still
    if exact and waiting:
        raise EndNotConfirmed(topic, sorted(waiting), wait_s)
    return out


def _read_last_batches(consumer, topic: str, high_watermarks: dict[int, int], deadline: float):
    """(ends, fetched, waiting): {partition: end found} by reading each partition's batch at its
    watermark - 1 until `deadline` (see `true_ends`); {partition: the high watermark of the fetch
    that answered it} for the partitions heard from; the partitions not heard from."""
    from confluent_kafka import TopicPartition

    out = {p: max(0, hw) for p, hw in high_watermarks.items()}
    todo = {p for p, hw in high_watermarks.items() if hw > 0}
    if not todo:
        return out, {}, set()
    consumer.assign([TopicPartition(topic, p, high_watermarks[p] - 1) for p in sorted(todo)])
    # a position read before any consume is an earlier assignment's (see consumer_positions): such a
    # partition's position proves nothing, it ends by a message or the deadline
    fresh = {p for p, pos in consumer_positions(consumer, topic, sorted(todo)).items() if pos < 0}
    waiting = set(todo)  # partitions whose last batch has not arrived yet
    wait = False  # the last call brought nothing while partitions are waiting
    fetched: dict[int, int] = {}
    try:
        while time.monotonic() < deadline:
            # a fetch delivers a record batch whole: once a partition's first record came, the
            # rest of its batch is already queued, so waiting is only for partitions not heard from,
            # and only until the next message arrives (a larger count would wait out the timeout);
            # a control record ends no wait, so the positions are read before waiting again
            msgs = consumer.consume(1, timeout=0.1) if wait else consumer.consume(1000, timeout=0)
            heard = len(waiting)
            for m in msgs:
                if m.error() is None and m.topic() == topic and m.partition() in todo:
                    out[m.partition()] = max(out[m.partition()], m.offset() + 1)
                    waiting.discard(m.partition())
            if waiting & fresh:
                for p, pos in consumer_positions(consumer, topic, sorted(waiting & fresh)).items():
                    if pos >= high_watermarks[p]:  # past the last offset: a control record
                        out[p] = max(out[p], pos)
                        waiting.discard(p)
            if not waiting and not msgs:
                break
            wait = not msgs and len(waiting) == heard
        for p, pos in consumer_positions(consumer, topic, sorted(fresh)).items():
            out[p] = max(out[p], pos)  # control records after the last message count too
            if pos >= high_watermarks[p]:
                waiting.discard(p)
        for p in sorted(todo - waiting):
            _lo, hw = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            if hw >= 0:
                fetched[p] = hw
    finally:
        consumer.unassign()
    return out, fetched, waiting


class IoxKafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict):
        self.bootstrap = options["bootstrap"]
        self.prefix = options.get("topic_prefix", "iox.")
        self.start_offsets = json.loads(options.get("start_offsets", "{}"))
        self.max_per_partition = int(options.get("max_messages_per_partition", "2000"))
        self.pause_file = options.get("pause_file", "")
        #: under memory pressure, holds the lower per-partition read limit (server/runtime/memory_guard.py)
        self.throttle_file = options.get("throttle_file", "")
        self.holds_file = options.get("holds_file", "")
        #: while it exists the server is frozen (server/write_buffer/freeze.py): read nothing new
        self.freeze_file = options.get("freeze_file", "")
        self._probe = None
        self._admin = None
        self._true_end: dict[tuple[str, int], int] = {}
        #: (topic, partition) -> when its end was last read past an unmoved watermark (monotonic)
        self._stale_probed_at: dict[tuple[str, int], float] = {}
        self._polls = EndPolls()
        marks_dir = options.get("acked_marks_dir", "")
        self._marks = AckMarks(marks_dir) if marks_dir else None
        self._topic_list: dict[str, int] | None = None  # the last answer of `_topics`
        self._topics_asked_at = 0.0
        self._seen_marks: dict[tuple[str, int], int | None] = {}  # (topic, partition) -> its ack mark at the last trigger
        # ends confirmed exactly by the server before this query (option `known_ends`): true ends
        # already, so neither read again past the watermark nor probed for a stale one at once
        started = time.monotonic()
        for topic, parts in json.loads(options.get("known_ends", "{}")).items():
            for p, end in parts.items():
                self._true_end[(topic, int(p))] = int(end)
                self._stale_probed_at[(topic, int(p))] = started

    # -- driver-side (streaming source worker) ---------------------------------
    def _clients(self):
        if self._probe is None:
            from confluent_kafka.admin import AdminClient

            self._probe = reader_consumer(self.bootstrap)
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        return self._probe, self._admin

    def _topics(self, fresh: bool = False) -> dict[str, int]:
        """{database topic: partitions}. Asked of the broker (a Metadata request: Tansu reads each
        topic's metadata object) when `fresh`, when this server marked a topic not known yet, or
        once `end_polls.DEFAULT_MAX_DELAY_S` passed since it was last asked; else the last answer."""
        now = time.monotonic()
        known = self._topic_list
        if (not fresh and known is not None and now - self._topics_asked_at < self._polls.max_delay_s
                and (self._marks is None or self._marks.topics() <= known.keys())):
            return known
        _, admin = self._clients()
        md = admin.list_topics(timeout=_ADMIN_TIMEOUT_S)
        self._topic_list = {t: len(m.partitions) for t, m in md.topics.items()
                            if t.startswith(self.prefix) and m.error is None and m.partitions}
        self._topics_asked_at = now
        return self._topic_list

    def _start_of(self, topic: str, partition: int) -> int:
        planned = self.start_offsets.get(topic, {}).get(str(partition))
        if planned is not None:
            return int(planned)
        from confluent_kafka import TopicPartition

        probe, _ = self._clients()
        lo, _hi = probe.get_watermark_offsets(TopicPartition(topic, partition), timeout=_ADMIN_TIMEOUT_S)
        return max(0, lo)

    def _latest_of(self, topic: str, partitions: list) -> dict[int, int]:
        """{partition: high watermark} of `partitions` of `topic`: one ListOffsets request (latest
        only: `get_watermark_offsets` asks the earliest too, a second request, which Tansu on s3://
        storage answers with a second listing of the partition's batches)."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}
        _, admin = self._clients()
        futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                     request_timeout=_ADMIN_TIMEOUT_S)
        return {tp.partition: f.result().offset for tp, f in futures.items()}

    def _ends_of(self, topic: str, partitions: int) -> dict[int, int]:
        """{partition: true end (last offset + 1)} of a topic's partitions; see the module invariant."""
        out: dict[int, int] = {}
        grown: dict[int, int] = {}
        now = time.monotonic()
        asked = []
        for p in range(partitions):
            # read before asking: a write acknowledged after this read changes the mark for the next trigger
            mark = self._marks.read(topic, p) if self._marks is not None else None
            marked = mark != self._seen_marks.get((topic, p))
            self._seen_marks[(topic, p)] = mark
            if (topic, p) not in self._true_end or marked or self._polls.due((topic, p), now):
                asked.append(p)
            else:
                out[p] = self._true_end[(topic, p)]  # idle, asked again later
        for p, hi in self._latest_of(topic, asked).items():
            moved = self._polls.answered((topic, p), now, hi)
            known = self._true_end.get((topic, p), 0)
            if hi <= known:
                out[p] = known
                self._true_end[(topic, p)] = known  # an empty partition too: asked as its poll says
                if known > 0 and now - self._stale_probed_at.get((topic, p), -1e9) >= STALE_PROBE_INTERVAL_S:
                    # Tansu on s3:// storage can report a watermark one short of its last message
                    # for good (until the next produce): look past what is known, now and then
                    self._stale_probed_at[(topic, p)] = now
                    grown[p] = known
            elif moved:
                # still growing: up to the watermark now; the rest of a last batch of several
                # messages at the next trigger, or once the partition stops moving (read below then)
                out[p] = hi
            else:
                grown[p] = hi
        if grown:
            reader = self._end_reader()
            try:
                ends = true_ends(reader, topic, grown)
            finally:
                reader.close()
            for p, end in ends.items():
                self._true_end[(topic, p)] = end
                out[p] = end
        return out

    def _end_reader(self):
        """A new consumer for one `true_ends` call, closed after it (driver side). Its fetches may
        wait LIST_FETCH_WAIT_MS: the last batch of a partition longer than Tansu's object-store
        engine lists within a shorter wait would never be read (the partition's last messages then
        stayed unapplied until its next write). Not kept: the fetch it leaves waiting at the
        partition's end would hold up its next first fetch for that long."""
        return reader_consumer(self.bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})

    def initialOffset(self) -> dict:
        out: dict = {}
        for topic, n in self._topics(fresh=True).items():
            out[topic] = {str(p): self._start_of(topic, p) for p in range(n)}
        return out

    def getDefaultReadLimit(self):
        """The micro-batch read limit: `max_messages_per_partition` messages per Kafka partition.

        Spark asks for it once and passes it to every `latestOffset` (without it Spark passes
        ReadAllAvailable and a micro-batch takes the whole backlog). The limit counts messages
        per Kafka partition, not rows of the whole batch: a table lives on one partition, so
        every table's backlog advances in every micro-batch.
        """
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.max_per_partition)

    def latestOffset(self, start: dict, limit=None) -> dict:
        import os

        from pyspark.sql.streaming.datasource import ReadMaxRows

        if self.pause_file and os.path.exists(self.pause_file):
            return start  # backpressure: the server is over its hard memory limit
        # ReadAllAvailable (e.g. Trigger.AvailableNow) reads every partition to its end
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        throttled = _read_throttle(self.throttle_file)
        if throttled is not None:  # memory pressure: read less per micro-batch
            cap = throttled if cap is None else min(cap, throttled)
        holds = read_holds(self.holds_file)
        frozen = source_holds(self.freeze_file)  # None: not frozen
        out: dict = {}
        for topic, n in self._topics().items():
            prev = start.get(topic, {})
            held = holds.get(topic, {})
            frozen_at = frozen.get(topic, {}) if frozen is not None else None
            parts = {}
            ends = self._ends_of(topic, n)
            for p in range(n):
                s = int(prev[str(p)]) if str(p) in prev else self._start_of(topic, p)
                e = max(s, ends[p])
                if cap is not None:
                    e = min(e, s + cap)
                hold = held.get(str(p))
                if frozen_at is not None:  # frozen: nothing past the freeze, nothing of what it did not name
                    f = frozen_at.get(p, s)
                    hold = f if hold is None else min(hold, f)
                parts[str(p)] = held_end(s, e, hold)
            out[topic] = parts
        for topic, parts in start.items():  # never drop a topic once seen
            out.setdefault(topic, parts)
        return out

    def partitions(self, start: dict, end: dict):
        out = []
        for topic, parts in end.items():
            prev = start.get(topic, {})
            for p, e in parts.items():
                s = int(prev.get(p, self._start_of(topic, int(p))))
                if int(e) > s:
                    out.append(TopicPartitionRange(topic, int(p), s, int(e)))
        return out

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None
        # the admin client (a producer handle in librdkafka) has no close: dropping it destroys it
        self._admin = None

    # -- executor side -------------------------------------------------------
    def read(self, partition: TopicPartitionRange):
        """Yields the messages of [start, end_exclusive) of one Kafka partition as Arrow batches of
        SOURCE_SCHEMA, in offset order, each once; an offset with no message is a gap (see the
        module invariant). Ends once the broker went past `end_exclusive - 1` (a message at or
        beyond it, or the consumer's position); raises when that takes more than
        READ_STALL_TIMEOUT_S without progress."""
        import pyarrow as pa
        from confluent_kafka import TopicPartition

        from iox_spark.server.write_buffer.wire_format import header_text, holds_write, payload_problem

        topic, kp, end = partition.topic, partition.partition, partition.end_exclusive
        c = _take_consumer(self.bootstrap, time.monotonic())
        ok = False
        slow_list = False  # reading with a consumer of LIST_FETCH_WAIT_MS, not kept for the next task
        try:
            c.assign([TopicPartition(topic, kp, partition.start)])
            if consumer_positions(c, topic, [kp])[kp] >= 0:
                # a reused consumer whose earlier assignment's position was not reset yet: it would
                # claim offsets this range has not read; a new consumer starts with none
                stale, c = c, None
                stale.close()
                c = reader_consumer(self.bootstrap)
                c.assign([TopicPartition(topic, kp, partition.start)])
            next_offset = partition.start  # every offset below it is read, or a gap
            cols = {k: [] for k in _COLUMNS}
            last_progress = time.monotonic()
            wait = False  # the last call brought nothing: wait for the next message
            waited_s = 0.0  # time spent in calls that brought nothing
            while next_offset < end:
                if waited_s > SLOW_LIST_SWITCH_S and not slow_list:
                    # a partition too long to list within the reader's fetch wait (LIST_FETCH_WAIT_MS)
                    c.close()
                    c = None
                    c = reader_consumer(self.bootstrap, **{"fetch.wait.max.ms": LIST_FETCH_WAIT_MS})
                    c.assign([TopicPartition(topic, kp, next_offset)])
                    slow_list = True
                # what the consumer holds, no more than the range can still hold, without waiting;
                # after a call that brought nothing, one message (see _CONSUME_TIMEOUT_S)
                t_call = time.monotonic()
                msgs = (c.consume(1, timeout=_CONSUME_TIMEOUT_S) if wait
                        else c.consume(min(_CONSUME_MAX_MESSAGES, end - next_offset), timeout=0))
                before = next_offset
                for m in msgs:
                    if m.error() is not None or m.partition() != kp or m.topic() != topic:
                        continue
                    off = m.offset()
                    if off < next_offset:
                        continue  # read already
                    if off >= end:
                        next_offset = end  # the broker is past the range: what it did not return are gaps
                        continue
                    next_offset = off + 1  # offsets skipped on the way are gaps
                    h = dict(m.headers() or [])
                    cols["topic"].append(topic)
                    cols["kp"].append(kp)
                    cols["offset"].append(off)
                    cols["ts_ms"].append(m.timestamp()[1])
                    cols["kind"].append(header_text(h, "iox-kind"))
                    cols["tbl"].append(header_text(h, "iox-table"))
                    cols["schema"].append(header_text(h, "iox-schema"))
                    rows = header_text(h, "iox-rows")
                    cols["nrows"].append(int(rows) if rows.isascii() and rows.isdigit() else -1)
                    cols["days"].append(header_text(h, "iox-days"))
                    value = m.value() or b""
                    cols["payload"].append(value)
                    cols["fmt"].append(header_text(h, "iox-format"))
                    cols["txn"].append(header_text(h, "iox-txn"))
                    info = header_text(h, "iox-txn-info")
                    cols["txn_info"].append(info)
                    cols["unique"].append(header_text(h, "iox-unique") == "1")
                    cols["problem"].append(payload_problem(value) if holds_write(cols["kind"][-1], info) else None)
                # every message below the position was returned by the calls above (and taken), so
                # what lies between is control records or gaps
                passed = consumer_positions(c, topic, [kp])[kp]
                if passed > next_offset:
                    next_offset = min(passed, end)
                wait = next_offset == before
                if not wait:
                    last_progress = time.monotonic()
                else:
                    waited_s += time.monotonic() - t_call
                    if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                        raise RuntimeError(
                            f"{topic}[{kp}]: offset {next_offset} not readable "
                            f"within {READ_STALL_TIMEOUT_S}s (expected up to {end - 1})")
                if len(cols["offset"]) >= 256:
                    yield _batch(pa, cols)
                    cols = {k: [] for k in cols}
            if cols["offset"]:
                yield _batch(pa, cols)
            ok = True
        finally:
            if c is None:
                pass
            elif ok and not slow_list and self.bootstrap not in _idle_consumers:
                c.unassign()
                _idle_consumers[self.bootstrap] = (c, time.monotonic())
            else:
                c.close()


def _read_throttle(path: str) -> int | None:
    """The per-partition message cap the memory guard wrote, or None (no file, or unreadable)."""
    if not path:
        return None
    try:
        with open(path) as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return None


def _batch(pa, cols: dict):
    return pa.RecordBatch.from_arrays(
        [pa.array(cols["topic"], pa.string()), pa.array(cols["kp"], pa.int32()),
         pa.array(cols["offset"], pa.int64()), pa.array(cols["ts_ms"], pa.int64()),
         pa.array(cols["kind"], pa.string()), pa.array(cols["tbl"], pa.string()),
         pa.array(cols["schema"], pa.string()), pa.array(cols["nrows"], pa.int64()),
         pa.array(cols["days"], pa.string()), pa.array(cols["payload"], pa.binary()),
         pa.array(cols["fmt"], pa.string()), pa.array(cols["txn"], pa.string()),
         pa.array(cols["txn_info"], pa.string()), pa.array(cols["unique"], pa.bool_()),
         pa.array(cols["problem"], pa.string())],
        names=_COLUMNS)


class IoxKafkaDataSource(DataSource):
    """Options: bootstrap (required), topic_prefix, start_offsets (JSON), known_ends (JSON: {topic:
    {partition: true end}} the server confirmed exactly before the query started), max_messages_per_partition, pause_file,
    acked_marks_dir, holds_file, freeze_file."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def streamReader(self, schema):
        return IoxKafkaStreamReader(self.options)
