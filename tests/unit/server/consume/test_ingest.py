"""The seqs the consumer (server/consume/ingest.py) gives rows and deletes, at the legacy layout's last epoch
(255) and in the epochs after it: the Spark expression of a segment's `seq_base` (evaluated by a
stand-in for pyspark.sql.functions with Spark's 64-bit long arithmetic), the executors' Arrow
decoder and the deletes all follow catalog/seq_layout.py, positive and increasing, and an offset
whose seqs would not fit fails instead of wrapping; and which messages of a batch a table's chunk
reads (a committed transaction part by its Kafka partition and offset)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from iox_spark.catalog.errors import SeqOverflow
from iox_spark.catalog.preserved_catalog import CatalogState, RecordDatabaseCheckpoint
from iox_spark.catalog.schema import Column
from iox_spark.catalog.seq_layout import (SEQ_MAX, SEQ_ROWS_PER_OFFSET, legacy_seq_origin, max_seq_offset, next_seq_origin,
                                seq_base)
from iox_spark.chunk_store.ipc_segments import LAYOUT_WIRE, SEGMENT_COLUMNS
from iox_spark.catalog.transactions import MARKER, PART
from iox_spark.server.consume.ingest import Ingestor, check_seqs_fit, payload_decode_fn, table_messages_condition, decode_delete
from iox_spark.server.write_buffer.wire_format import encode_delete, encode_write
from tests.timestamps import T0

COLUMNS = [Column("host", "tag", "string"), Column("usage", "field", "float"), Column("time", "time", "time")]
VALUE_COLUMNS = [("host", "string"), ("usage", "float")]


def _origin_after(epoch: int, origin: int, seen: int) -> int:
    """The origin recovery gives the epoch after `epoch` once it found the topic reset."""
    state = CatalogState(db="db", revision=1, transaction_uuid="u", timestamp_s=0.0)
    state.database_checkpoint = RecordDatabaseCheckpoint(topic="iox.db", kafka_partitions=1, epoch=epoch,
                                                         sequencer_numbers={0: (None, seen)}, complete=True)
    return next_seq_origin(state, origin)


#: origins of epoch 255 (legacy), 256 and 257 (after a reset each, 42 and 7 offsets used)
EPOCH_255 = legacy_seq_origin(255)
EPOCH_256 = _origin_after(255, EPOCH_255, 41)
EPOCH_257 = _origin_after(256, EPOCH_256, 6)
ORIGINS = [EPOCH_255, EPOCH_256, EPOCH_257]


# --------------------------------------------------------------------------- Spark stand-in


def _long(v):
    """A Spark long: two's complement in 64 bits (shiftleft always wraps, so does + without ANSI)."""
    return None if v is None else ((v + (1 << 63)) % (1 << 64)) - (1 << 63)


class _SparkJobFailed(Exception):
    pass


class _Col:
    def __init__(self, fn, name=None):
        self.fn, self.name = fn, name

    def alias(self, name):
        return _Col(self.fn, name)

    def cast(self, typ):
        assert typ in ("long", "int")
        return _Col(lambda r: _long(self.fn(r)), self.name)

    def __add__(self, other):
        return _Col(lambda r: _long(self.fn(r) + other.fn(r)))

    def bitwiseOR(self, other):
        return _Col(lambda r: _long(self.fn(r) | other.fn(r)))

    def __le__(self, other):
        return _Col(lambda r: self.fn(r) <= other.fn(r))

    def __eq__(self, other):
        other = _F.lit(other)
        return _Col(lambda r: self.fn(r) == other.fn(r))

    def __and__(self, other):
        return _Col(lambda r: self.fn(r) and other.fn(r))

    def __or__(self, other):
        return _Col(lambda r: self.fn(r) or other.fn(r))

    def isin(self, values):
        return _Col(lambda r: self.fn(r) in list(values))

    __hash__ = None


class _When:
    def __init__(self, branches):
        self.branches = branches

    def when(self, cond, value):
        return _When(self.branches + [(cond, _F.lit(value))])

    def otherwise(self, value):
        value = _F.lit(value)

        def fn(r):
            for cond, v in self.branches:
                if cond.fn(r):
                    return v.fn(r)
            return value.fn(r)

        return _Col(fn)


class _F:
    """The parts of pyspark.sql.functions a segment's plan uses, evaluated row by row in Python."""

    @staticmethod
    def lit(v):
        return v if isinstance(v, _Col) else _Col(lambda r: v)

    @staticmethod
    def col(name):
        return _Col(lambda r: r[name], name)

    @staticmethod
    def shiftleft(c, n):
        return _Col(lambda r: _long(c.fn(r) << n))

    @staticmethod
    def when(cond, value):
        return _When([(cond, _F.lit(value))])

    @staticmethod
    def raise_error(msg):
        def fn(r):
            raise _SparkJobFailed(msg.fn(r))

        return _Col(fn)


class _Frame:
    def __init__(self, rows):
        self.rows = rows

    def select(self, *cols):
        cols = [c if isinstance(c, _Col) else _F.col(c) for c in cols]
        return _Frame([{c.name: c.fn(r) for c in cols} for r in self.rows])


def _segment_seqs(origin: int, offsets: list, remap: dict | None = None) -> list:
    sel = _Frame([{"kp": 0, "offset": o, "payload": b"p"} for o in offsets])
    seg = Ingestor._segment_plan(None, sel, [], origin, remap or {}, None, _F)
    assert [list(r) for r in seg.rows] == [SEGMENT_COLUMNS] * len(offsets)
    assert all(r["layout"] == LAYOUT_WIRE for r in seg.rows)
    return [r["seq_base"] for r in seg.rows]


def _positive_increasing(seqs: list) -> bool:
    return all(0 <= s <= SEQ_MAX for s in seqs) and all(a < b for a, b in zip(seqs, seqs[1:]))


# --------------------------------------------------------------------------- tests


def test_origins_of_the_epochs_after_255_are_above_it_and_leave_room():
    assert EPOCH_255 < EPOCH_256 < EPOCH_257
    assert EPOCH_256 == EPOCH_255 + 42 * SEQ_ROWS_PER_OFFSET
    # what the legacy epoch 255 left: its 2**35 offsets, less those epochs 255 and 256 used
    assert max_seq_offset(EPOCH_257) == 2**35 - 1 - 42 - 7


def test_the_spark_seq_expression_is_seq_base_at_epoch_255_and_after_resets():
    seqs = []
    for origin, offsets in zip(ORIGINS, ([0, 1, 41], [0, 1, 6], [0, 1, 2**34, max_seq_offset(EPOCH_257)])):
        got = _segment_seqs(origin, offsets)
        assert got == [seq_base(origin, o) for o in offsets]
        seqs += [s + r for s in got for r in (0, SEQ_ROWS_PER_OFFSET - 1)]
    assert _positive_increasing(seqs)
    # the legacy epoch 255 keeps its layout up to its last offset
    assert _segment_seqs(EPOCH_255, [2**35 - 1]) == [(255 << 55) | ((2**35 - 1) << 20)]


def test_the_spark_seq_expression_applies_a_committed_part_at_its_markers_offset():
    got = _segment_seqs(EPOCH_256, [3, 4], remap={(0, 3): 9})
    assert got == [seq_base(EPOCH_256, 9), seq_base(EPOCH_256, 4)]


def test_the_spark_seq_expression_fails_instead_of_wrapping():
    top = max_seq_offset(EPOCH_255)
    assert _segment_seqs(EPOCH_255, [top]) == [seq_base(EPOCH_255, top)]
    with pytest.raises(_SparkJobFailed, match="overflow"):
        _segment_seqs(EPOCH_255, [top + 1])
    with pytest.raises(_SparkJobFailed):
        _segment_seqs(EPOCH_257, [1 << 44])  # shiftleft alone would wrap to a small positive seq


def _messages(offsets: list) -> pa.RecordBatch:
    payloads = [encode_write("cpu", COLUMNS, pa.table({"host": ["a", "b"], "usage": [float(o), 1.0],
                                                       "time": pa.array([T0, T0 + 1], pa.int64())})).value
                for o in offsets]
    return pa.RecordBatch.from_pydict({"kp": [0] * len(offsets), "offset": offsets, "payload": payloads})


def test_the_arrow_decoder_seqs_at_epoch_255_and_after_resets():
    seqs = []
    for origin, offsets in zip(ORIGINS, ([0, 41], [0, 6], [0, 2**34])):
        out = pa.Table.from_batches(list(payload_decode_fn(VALUE_COLUMNS, None, None, origin)([_messages(offsets)])))
        got = out.column("_iox_seq").to_pylist()
        assert got == [seq_base(origin, o) + r for o in offsets for r in (0, 1)]
        seqs += got
    assert _positive_increasing(seqs)


def test_the_arrow_decoder_raises_seq_overflow_instead_of_wrapping():
    top = max_seq_offset(EPOCH_255)
    fn = payload_decode_fn(VALUE_COLUMNS, None, None, EPOCH_255)
    assert len(pa.Table.from_batches(list(fn([_messages([top])])))) == 2
    with pytest.raises(SeqOverflow):
        list(fn([_messages([top + 1])]))


def test_the_driver_checks_a_batchs_offsets_before_any_job():
    check_seqs_fit(EPOCH_255, [])
    check_seqs_fit(EPOCH_255, [0, max_seq_offset(EPOCH_255)])
    with pytest.raises(SeqOverflow) as e:
        check_seqs_fit(EPOCH_255, [5, max_seq_offset(EPOCH_255) + 1, 7])
    assert e.value.offset == max_seq_offset(EPOCH_255) + 1


def test_deletes_take_their_seq_from_the_origin_and_overflow_is_not_a_skipped_message():
    value = encode_delete("cpu", 0, 10, [["host", "=", "a", "string"]]).value
    assert [decode_delete(value, o, 6, 0).seq for o in ORIGINS] == [seq_base(o, 6) for o in ORIGINS]
    assert decode_delete(value, EPOCH_256, 6, 0).seq > seq_base(EPOCH_255, 41) + SEQ_ROWS_PER_OFFSET - 1
    with pytest.raises(SeqOverflow) as e:
        decode_delete(value, EPOCH_255, max_seq_offset(EPOCH_255) + 1, 0)
    assert not isinstance(e.value, (ValueError, KeyError, TypeError))  # the consumer skips only those


def test_a_tables_chunk_reads_only_the_parts_committed_in_its_own_kafka_partition():
    """Two tables on two Kafka partitions written by the same requests: each partition holds a part
    at offset 2 and its marker at 3. A batch that ends between net's part and its marker, with
    cpu's part and marker in it, commits cpu's part only: net's part at the same offset 2 is
    undecided (stashed until its marker). Selecting parts by offset alone applied it at once, at
    its own offset, and again at its marker's in the next batch: each of its rows twice."""
    raw = [{"topic": "iox.db", "kp": 0, "offset": 2, "kind": PART, "tbl": "cpu"},
           {"topic": "iox.db", "kp": 0, "offset": 3, "kind": MARKER, "tbl": None},
           {"topic": "iox.db", "kp": 1, "offset": 2, "kind": PART, "tbl": "net"},
           {"topic": "iox.db", "kp": 1, "offset": 4, "kind": "write", "tbl": "net"},
           {"topic": "iox.other", "kp": 1, "offset": 5, "kind": "write", "tbl": "net"}]
    remap = {(0, 2): 3}  # the batch's committed parts: (kp, part offset) -> offset applied at

    def selected(table):
        cond = table_messages_condition("iox.db", table, remap, _F)
        return [(r["kp"], r["offset"]) for r in raw if cond.fn(r)]

    assert selected("cpu") == [(0, 2)]
    assert selected("net") == [(1, 4)]
    assert table_messages_condition("iox.db", "net", {}, _F).fn(raw[2]) is False


def test_a_stop_ends_a_batch_between_its_chunk_builds_with_nothing_added(monkeypatch):
    """A stream being stopped (restart, shutdown) does not wait for the rest of a large batch's Spark
    jobs: the builds not started yet are not run, nothing is added, every build's data is released."""
    from types import SimpleNamespace

    from iox_spark.catalog.catalog import Catalog
    from iox_spark.server.consume import ingest

    ingestor = Ingestor(spark=None, catalog=Catalog(), kafka_partitions=1)
    built, released = [], []

    def materialise(b):
        built.append(b.cdf)
        if len(built) == 2:
            ingestor.quiescing.set()

    monkeypatch.setattr(ingest, "_materialise", materialise)
    monkeypatch.setattr(ingest, "release_df", released.append)
    added: list = []
    with pytest.raises(ingest._StreamStopping):
        ingestor._build_and_add_chunks([SimpleNamespace(cdf=i) for i in range(40)], added)
    assert added == []
    assert 2 <= len(built) <= 2 + ingest._BUILD_THREADS
    assert sorted(released) == list(range(40))


def test_a_new_epoch_drops_the_replay_row_filters_of_its_database_only_and_a_caught_up_replay_all():
    from iox_spark.catalog.catalog import Catalog

    ingestor = Ingestor(spark=None, catalog=Catalog(), kafka_partitions=2,
                        row_filters={("d", "cpu"): {19675: (5, {0: (0, 9)})}})
    ingestor.add_row_filter("d", "cpu", 19676, 7, {1: (3, 4)})
    ingestor.add_row_filter("other", "cpu", 19675, 6, {0: (0, 2)})
    assert ingestor.row_filter("d", "cpu") == {19675: (5, {0: (0, 9)}), 19676: (7, {1: (3, 4)})}
    ingestor.drop_row_filters("d")
    assert ingestor.row_filter("d", "cpu") is None
    assert ingestor.row_filter("other", "cpu") == {19675: (6, {0: (0, 2)})}
    ingestor.drop_row_filters()
    assert ingestor.row_filter("other", "cpu") is None
