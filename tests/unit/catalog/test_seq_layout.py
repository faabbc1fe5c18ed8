"""The `_iox_seq` layout (catalog/seq_layout.py): legacy origins order exactly as before, a new
epoch's origin orders after every seq the preserved catalog knows, the epochs past the legacy
layout's 256th keep positive, increasing seqs, and a seq that would not fit raises SeqOverflow."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iox_spark.catalog.errors import CatalogError, SeqOverflow
from iox_spark.catalog.preserved_catalog import (
    AddDeletePredicate,
    AddParquet,
    CatalogState,
    RecordDatabaseCheckpoint,
    RecordPartitionCheckpoint,
)
from iox_spark.catalog.seq_layout import (
    LEGACY_MAX_EPOCH,
    SEQ_MAX,
    SEQ_OFFSET_BITS,
    SEQ_ROW_BITS,
    SEQ_ROWS_PER_OFFSET,
    current_seq_origin,
    legacy_seq_origin,
    max_seq_offset,
    next_seq_origin,
    seq_base,
)

TOPIC = "iox.db"
SCHEMA = (("host", "tag", "string"), ("time", "time", "time"))
#: the last Kafka offset the legacy layout held (35 bits)
LEGACY_MAX_OFFSET = (1 << SEQ_OFFSET_BITS) - 1


def _old_seq(epoch: int, offset: int, row: int) -> int:
    """The layout before seq origins: epoch << 55 | offset << 20 | row."""
    return (epoch << (SEQ_OFFSET_BITS + SEQ_ROW_BITS)) | (offset << SEQ_ROW_BITS) | row


def _file(key: str, min_seq: int, max_seq: int) -> AddParquet:
    return AddParquet(key=key, table="cpu", partition_key="2024-01-01", row_count=1, size_bytes=1, min_time_ns=0,
                      max_time_ns=0, min_seq=min_seq, max_seq=max_seq, schema=SCHEMA)


def _state(epoch: int, seq_origin: int | None, seen: int | None, files=(), deletes=(),
           partition_seen: dict | None = None) -> CatalogState:
    """A catalog state whose database checkpoint is at `epoch` (`seen`: the max offset it saw)."""
    state = CatalogState(db="db", revision=1, transaction_uuid="u", timestamp_s=0.0)
    state.database_checkpoint = RecordDatabaseCheckpoint(
        topic=TOPIC, kafka_partitions=2, sequencer_numbers={} if seen is None else {0: (None, seen)}, epoch=epoch,
        complete=True, seq_origin=seq_origin)
    for i, (lo, hi) in enumerate(files):
        f = _file(f"db/data/f{i}.parquet", lo, hi)
        state.files[f.key] = f
    for seq in deletes:
        state.delete_predicates.append(AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=1, predicate=(),
                                                          seq=seq, applies_to=()))
    for (table, ck_epoch), hi in (partition_seen or {}).items():
        state.partition_checkpoints[(table, "2024-01-01")] = RecordPartitionCheckpoint(
            table=table, partition_key="2024-01-01", flush_timestamp_ns=0, sequencer_numbers={1: (None, hi)},
            epoch=ck_epoch)
    return state


def _seqs(origin: int, offsets) -> list[int]:
    """Seqs of the first, second and last row of each offset's message."""
    return [seq_base(origin, o) + r for o in offsets for r in (0, 1, SEQ_ROWS_PER_OFFSET - 1)]


def _positive_increasing(seqs: list[int]) -> bool:
    return all(0 <= s <= SEQ_MAX for s in seqs) and all(a < b for a, b in zip(seqs, seqs[1:]))


@pytest.mark.parametrize("epoch", [0, 1, 7, LEGACY_MAX_EPOCH])
def test_legacy_origin_lays_seqs_out_exactly_as_before(epoch):
    for offset in (0, 1, 12345, LEGACY_MAX_OFFSET):
        for row in (0, 1, SEQ_ROWS_PER_OFFSET - 1):
            assert seq_base(legacy_seq_origin(epoch), offset) + row == _old_seq(epoch, offset, row)


def test_epoch_255_is_the_last_legacy_epoch_and_fills_the_seqs_exactly():
    assert LEGACY_MAX_EPOCH == 255
    origin = legacy_seq_origin(255)
    seqs = _seqs(origin, [0, 1, 2**20, LEGACY_MAX_OFFSET])
    assert _positive_increasing(seqs) and seqs[-1] == SEQ_MAX
    assert max_seq_offset(origin) == LEGACY_MAX_OFFSET
    with pytest.raises(SeqOverflow):
        legacy_seq_origin(256)
    with pytest.raises(ValueError):
        legacy_seq_origin(-1)


def test_a_seq_that_would_not_fit_raises_seq_overflow_never_wraps():
    origin = legacy_seq_origin(255)
    with pytest.raises(SeqOverflow) as e:
        seq_base(origin, LEGACY_MAX_OFFSET + 1)
    assert isinstance(e.value, CatalogError)
    assert (e.value.origin, e.value.offset, e.value.limit) == (origin, LEGACY_MAX_OFFSET + 1, SEQ_MAX)
    for origin in (0, 5 << SEQ_ROW_BITS, SEQ_MAX - (SEQ_ROWS_PER_OFFSET - 1)):
        top = max_seq_offset(origin)
        assert seq_base(origin, top) + SEQ_ROWS_PER_OFFSET - 1 <= SEQ_MAX
        with pytest.raises(SeqOverflow):
            seq_base(origin, top + 1)
    assert max_seq_offset(SEQ_MAX - (SEQ_ROWS_PER_OFFSET - 1)) == 0
    assert max_seq_offset(SEQ_MAX) == max_seq_offset(SEQ_MAX + 1) == -1
    with pytest.raises(ValueError):
        seq_base(0, -1)


def test_a_reset_at_epoch_255_continues_above_every_persisted_seq_and_recorded_delete():
    origin = legacy_seq_origin(255)
    persisted = _seqs(origin, [0, 41])
    state = _state(255, None, seen=41, files=[(persisted[0], persisted[-1])], deletes=[seq_base(origin, 40)])
    assert current_seq_origin(state) == (origin, False)
    new = next_seq_origin(state, origin)
    assert new == origin + (42 << SEQ_ROW_BITS) and new % SEQ_ROWS_PER_OFFSET == 0
    # epoch 256: positive, increasing, after everything of epoch 255
    after = _seqs(new, [0, 1, 1_000_000, max_seq_offset(new)])
    assert _positive_increasing(persisted + after)


@settings(max_examples=200, deadline=None)
@given(origin=st.integers(0, (SEQ_MAX >> SEQ_ROW_BITS) // 2).map(lambda o: o << SEQ_ROW_BITS),
       seen=st.one_of(st.none(), st.integers(0, 2**30)),
       file_offsets=st.lists(st.tuples(st.integers(0, 2**30), st.integers(0, SEQ_ROWS_PER_OFFSET - 1)), max_size=4),
       delete_offsets=st.lists(st.integers(0, 2**30), max_size=3),
       partition_seen=st.dictionaries(st.sampled_from(["cpu", "mem"]), st.integers(0, 2**31), max_size=2),
       partition_older=st.booleans())
def test_a_new_origin_orders_after_every_seq_the_catalog_knows(origin, seen, file_offsets, delete_offsets,
                                                               partition_seen, partition_older):
    epoch = 300
    files = [(origin, seq_base(origin, o) + r) for o, r in file_offsets]
    deletes = [seq_base(origin, o) for o in delete_offsets]
    ck_epoch = epoch - 1 if partition_older else epoch
    state = _state(epoch, origin, seen, files, deletes, {(t, ck_epoch): hi for t, hi in partition_seen.items()})
    assert current_seq_origin(state) == (origin, False)
    new = next_seq_origin(state, origin)
    assert new % SEQ_ROWS_PER_OFFSET == 0 and new > origin
    assert all(new > hi for _lo, hi in files) and all(new > d for d in deletes)
    offsets = ([] if seen is None else [seen]) + ([] if partition_older else list(partition_seen.values()))
    assert all(new > seq_base(origin, o) + SEQ_ROWS_PER_OFFSET - 1 for o in offsets)
    # the smallest such origin: one offset slot less would not order after all of it
    below = new - SEQ_ROWS_PER_OFFSET
    known = [origin] + [hi for _lo, hi in files] + deletes + \
        [seq_base(origin, o) + SEQ_ROWS_PER_OFFSET - 1 for o in offsets]
    assert below <= max(known)


def test_seqs_stay_positive_and_increasing_over_thousands_of_resets():
    """Every reset of a topic after a clean stop with the in-memory broker: the epoch grows by one,
    seqs by the offsets the epoch used. From legacy epoch 250 on, past epoch 256 and far beyond."""
    epoch, recorded = 250, None  # a legacy catalog: no origin recorded
    all_seqs = []
    for i in range(5000):
        origin, record = current_seq_origin(_state(epoch, recorded, seen=None))  # as the last start left it
        assert not record and origin == (legacy_seq_origin(250) if recorded is None else recorded)
        used = [0, 1 + (i * 7919) % 100_000]  # offsets written in this epoch, then persisted
        seqs = _seqs(origin, used)
        all_seqs += seqs
        persisted = _state(epoch, recorded, seen=max(used), files=[(seqs[0], seqs[-1])],
                           deletes=[seq_base(origin, max(used))])
        recorded, epoch = next_seq_origin(persisted, origin), epoch + 1  # the topic found reset
    assert epoch == 5250
    assert _positive_increasing(all_seqs)
    assert recorded < legacy_seq_origin(251)  # resets use up offsets, not epochs of 2**55 seqs


def test_a_legacy_checkpoint_past_epoch_255_continues_above_every_known_seq_and_is_recorded():
    """A catalog the legacy layout kept using past epoch 255 (its seqs wrapped to negative numbers)."""
    wrapped = _old_seq(256, 3, 0) - (1 << 64)
    state = _state(256, None, seen=9, files=[(wrapped, wrapped + 5), (0, legacy_seq_origin(255) + 99)],
                   deletes=[wrapped + 7])
    origin, record = current_seq_origin(state)
    assert record and origin == legacy_seq_origin(255) + SEQ_ROWS_PER_OFFSET
    assert origin == next_seq_origin(state, None)
    assert _positive_increasing([legacy_seq_origin(255) + 99] + _seqs(origin, [0, 9, 10]))


def test_without_a_checkpoint_the_origin_is_zero():
    state = CatalogState(db="db", revision=0, transaction_uuid="u", timestamp_s=0.0)
    assert current_seq_origin(state) == (0, False)
    assert next_seq_origin(state, 0) == SEQ_ROWS_PER_OFFSET


def test_an_origin_without_room_for_offset_0_raises_seq_overflow():
    last = SEQ_MAX - (SEQ_ROWS_PER_OFFSET - 1)  # the last origin with room for one offset
    assert next_seq_origin(_state(9, last - SEQ_ROWS_PER_OFFSET, seen=None), last - SEQ_ROWS_PER_OFFSET) == last
    with pytest.raises(SeqOverflow) as e:
        next_seq_origin(_state(9, last, seen=None), last)
    assert e.value.offset is None
    with pytest.raises(SeqOverflow):
        next_seq_origin(_state(9, 0, seen=None, files=[(0, SEQ_MAX - 3)]), 0)
