"""catalog/partition_moves.py: a move claims a partition and its chunks, and no other move takes
them until its swap or give-back frees them; claims refuse what they cannot take."""
from __future__ import annotations

from iox_spark.catalog import partition_moves as moves
from iox_spark.catalog.catalog import COMPACTING, PERSISTING, Catalog
from iox_spark.catalog.chunk import Chunk

KEY = "2026-12-01"


def _chunk(cid: int, offsets: dict, state: str = "open") -> Chunk:
    return Chunk(id=cid, table="cpu", partition_key=KEY, order=cid, state=state, rows=3, size_bytes=10,
                 min_time_ns=0, max_time_ns=10, columns=[], view=None, offsets=offsets)


def _db_with(*chunks, now=100.0):
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    for c in chunks:
        cat.add_chunk(db, c, now=now)
    return cat, db


def test_a_compaction_claim_holds_the_partition_until_its_swap():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}), _chunk(2, {0: (2, 3)}), _chunk(3, {0: (4, 5)}))
    assert moves.claim_to_compact(cat, db, "cpu", "nope", None, False) is None  # missing partition
    assert moves.claim_to_compact(cat, db, "cpu", KEY, (1, 3), False) is None  # chunk 2 sits between
    assert moves.claim_to_compact(cat, db, "cpu", KEY, (1, 9), False) is None  # chunk 9 is gone
    assert moves.claim_to_compact(cat, db, "cpu", KEY, (2,), False) is None  # one chunk is too few
    part, chunks = moves.claim_to_compact(cat, db, "cpu", KEY, (1, 2), False)
    assert [c.id for c in chunks] == [1, 2] and {c.state for c in chunks} == {"compacting"}
    assert part.compacting and moves.partitions_of(cat, db) == [("cpu", KEY, True)]
    # held: neither another compaction nor a persist takes it
    assert moves.claim_to_compact(cat, db, "cpu", KEY, None, False) is None
    assert moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [3]) is None
    merged = _chunk(4, {0: (0, 3)}, state="closed")
    moves.swap_compacted(cat, db, "cpu", KEY, part, chunks, [merged])
    assert sorted(c.id for c in part.chunks) == [3, 4] and not part.compacting
    assert moves.partitions_of(cat, db) == [("cpu", KEY, False)]


def test_a_compaction_given_back_restores_its_chunks():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}), _chunk(2, {0: (2, 3)}))
    part, chunks = moves.claim_to_compact(cat, db, "cpu", KEY, None, False)
    moves.give_back(cat, part, COMPACTING, chunks, "closed")
    assert not part.compacting and [c.state for c in part.live_chunks()] == ["closed", "closed"]
    assert moves.claim_to_compact(cat, db, "cpu", KEY, (1,), True) is not None  # one: to the read buffer


def test_a_persist_claim_takes_the_chosen_chunks_and_gives_its_handle_back():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}), _chunk(2, {0: (2, 3)}))
    assert moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: []) is None
    assert not cat.get_partition(db, "cpu", KEY).persisting  # nothing chosen: nothing held
    part, handle, chunks = moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [1, 2])
    assert part.persisting and [c.state for c in chunks] == ["persisting", "persisting"]
    assert moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [1]) is None
    moves.give_back(cat, part, PERSISTING, chunks, "closed", handle=handle)
    assert not part.persisting and {c.state for c in chunks} == {"closed"}
    assert not part.windows.is_empty()  # the flush was aborted: the rows stay unpersisted
    db.failed_batch_hi = {0: 3}  # a failed micro-batch holds every persist
    assert moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [1]) is None


def test_a_persist_swapped_in_records_its_files_and_frees_the_partition():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}))
    cat.advance_applied(db, {0: 1})
    part, handle, chunks = moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [1])
    applied, part_ckpt, db_ckpt, lo = moves.persist_checkpoints(cat, db, part, handle)
    assert applied[0] == 1 and lo == {}  # nothing else stays unpersisted
    persisted = _chunk(2, {0: (0, 1)}, state="persisted")
    moves.swap_persisted(cat, db, "cpu", KEY, part, handle, chunks, [persisted], ["f1"], part_ckpt, lo, applied)
    assert [c.id for c in part.chunks] == [2] and part.files == ["f1"] and not part.persisting
    assert part.windows.is_empty() and db.unpersisted_partitions() == []


def test_a_persist_is_abandoned_when_a_micro_batch_failed_while_it_ran():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}))
    part, handle, _ = moves.claim_to_persist(cat, db, "cpu", KEY, 1e9, True, lambda p, ts: [1])
    db.failed_batch_hi = {0: 5}
    assert moves.persist_checkpoints(cat, db, part, handle) is None


def test_a_prune_holds_the_partition_and_drops_it_once_committed():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}))
    seen = []
    part, planned, unpersisted = moves.claim_to_prune(cat, db, "cpu", KEY, lambda p, u: seen.append(u) or "txn")
    assert (planned, unpersisted, seen) == ("txn", True, [True]) and part.persisting
    assert moves.claim_to_prune(cat, db, "cpu", KEY, lambda p, u: "again") is None  # held already
    assert [c.id for c in moves.drop_pruned(cat, db, "cpu", KEY, part, [])] == [1]
    assert moves.partitions_of(cat, db) == [] and cat.get_partition(db, "cpu", KEY) is None


def test_a_prune_of_unpersisted_rows_waits_for_a_failed_micro_batch():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}))
    db.failed_batch_hi = {0: 1}
    assert moves.claim_to_prune(cat, db, "cpu", KEY, lambda p, u: "txn") is None


def test_the_checkpoint_without_a_partition_keeps_the_others_unpersisted_offsets():
    other = Chunk(id=2, table="mem", partition_key=KEY, order=2, state="open", rows=3, size_bytes=10,
                  min_time_ns=0, max_time_ns=10, columns=[], view=None, offsets={0: (2, 3)})
    cat, db = _db_with(_chunk(1, {0: (0, 1)}), other)
    cat.advance_applied(db, {0: 3})
    dropped = cat.get_partition(db, "cpu", KEY)
    assert moves.checkpoint_without(cat, db, dropped) == {0: (2, 3)}
    assert moves.checkpoint_without(cat, db, cat.get_partition(db, "mem", KEY)) == {0: (0, 3)}


def test_visits_rotate_the_windows_and_see_every_owned_partition():
    cat, db = _db_with(_chunk(1, {0: (0, 1)}))
    assert moves.visit_owned_partitions(cat, db, 200.0, lambda t, k, p: (t, k, p.persisting)) == [("cpu", KEY, False)]
    assert moves.partitions_of(cat, db, owned_only=True) == [("cpu", KEY, False)]
