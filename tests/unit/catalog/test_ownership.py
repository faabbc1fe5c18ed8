"""Pool catalogs: one writer per Kafka partition, claims with epochs, fencing by compare-and-swap."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from iox_spark.catalog.errors import AlreadyExists, CorruptCatalogFile, InvalidAction, PartitionsNotOwned, RevisionConflict
from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.ownership import ClaimPartitions, PartitionOwner, check_ownership, touched_partitions
from iox_spark.catalog.preserved_catalog import (
    AddDeletePredicate,
    AddParquet,
    LostWritesEntry,
    PreservedCatalog,
    PreservedCatalogConfig,
    RecordDatabaseCheckpoint,
    RecordLostWrites,
    RecordPartitionCheckpoint,
    RecordRetention,
    RemoveParquet,
    SetTableSchema,
    read_state,
    transaction_key,
)
from iox_spark.catalog.sharding import partition_for

DB = "pooldb"
NOW_S = 1_700_000_000.0
PARTITIONS = 4
SCHEMA = [["host", "tag", "string"], ["v", "field", "float"], ["time", "time", "time"]]


def _table_of(kp: int) -> str:
    """A table name whose writes go to Kafka partition ``kp`` of a 4-partition topic."""
    return next(f"t{i}" for i in range(1000) if partition_for(f"t{i}", PARTITIONS) == kp)


TABLES = {kp: _table_of(kp) for kp in range(PARTITIONS)}
_counter = iter(range(1, 10**9))


def _add(kp: int) -> AddParquet:
    i = next(_counter)
    return AddParquet(key=parquet_key(DB, TABLES[kp], "p", f"00000000-0000-0000-0000-{i:012d}"), table=TABLES[kp],
                      partition_key="p", row_count=1, size_bytes=1, min_time_ns=i, max_time_ns=i, min_seq=i,
                      max_seq=i, schema=SCHEMA)


def _dbc(numbers: dict, complete: bool = False) -> RecordDatabaseCheckpoint:
    return RecordDatabaseCheckpoint(topic="iox.pooldb", kafka_partitions=PARTITIONS, sequencer_numbers=numbers,
                                    complete=complete)


@pytest.fixture
def store(tmp_path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


def _open(store) -> PreservedCatalog:
    return PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)[0]


# --------------------------------------------------------------------------- pure rules


def test_each_action_touches_the_kafka_partition_of_what_it_names() -> None:
    a0, a2 = _add(0), _add(2)
    files = {a0.key: a0, a2.key: a2}
    assert touched_partitions(a0, {}, PARTITIONS) == {0}
    assert touched_partitions(RemoveParquet(key=a2.key), files, PARTITIONS) == {2}
    assert touched_partitions(SetTableSchema(table=TABLES[3], columns=SCHEMA), {}, PARTITIONS) == {3}
    assert touched_partitions(RecordPartitionCheckpoint(table=TABLES[1], partition_key="p", flush_timestamp_ns=1),
                              {}, PARTITIONS) == {1}
    pred = AddDeletePredicate(table=None, start_ns=0, stop_ns_exclusive=9, predicate=(), seq=1,
                              applies_to=(a0.key, a2.key))
    assert touched_partitions(pred, files, PARTITIONS) == {0, 2}
    assert touched_partitions(_dbc({1: (None, 5), 3: (4, 9)}), {}, PARTITIONS) == {1, 3}
    lost = RecordLostWrites(ranges=(LostWritesEntry(partition=2, from_offset=0, to_exclusive=3, detected_at_s=1.0,
                                                    reason="r"),))
    assert touched_partitions(lost, {}, PARTITIONS) == {2}
    assert touched_partitions(RecordRetention(period_s=60, set_at_s=1.0), {}, PARTITIONS) is None


def test_ownership_needs_every_touched_partition_with_the_claimed_epoch() -> None:
    owners = {0: PartitionOwner("a", 1), 1: PartitionOwner("b", 3)}
    check_ownership(DB, owners, PARTITIONS, {}, [_add(0)], "a")
    check_ownership(DB, owners, PARTITIONS, {}, [_add(0)], "a", epochs={0: 1})
    with pytest.raises(PartitionsNotOwned) as info:
        check_ownership(DB, owners, PARTITIONS, {}, [_add(0), _add(1)], "a", revision=7)
    assert (info.value.partitions, info.value.writer, info.value.owners, info.value.revision) == (
        (1,), "a", {1: PartitionOwner("b", 3)}, 7)
    with pytest.raises(PartitionsNotOwned):  # the same name, an older claim: a process that was replaced
        check_ownership(DB, owners, PARTITIONS, {}, [_add(0)], "a", epochs={0: 0})
    with pytest.raises(PartitionsNotOwned, match="owns no kafka partition"):
        check_ownership(DB, owners, PARTITIONS, {}, [RecordRetention(period_s=1, set_at_s=1.0)], "c")
    # a claim in the same transaction counts
    claim = ClaimPartitions(owner="c", kafka_partitions=PARTITIONS, claims={2: 1})
    check_ownership(DB, owners, PARTITIONS, {}, [claim, _add(2)], "c")


@pytest.mark.parametrize("bad", [
    dict(owner="", kafka_partitions=4, claims={0: 1}),
    dict(owner="a\n", kafka_partitions=4, claims={0: 1}),
    dict(owner="a", kafka_partitions=0, claims={0: 1}),
    dict(owner="a", kafka_partitions=4, claims={}),
    dict(owner="a", kafka_partitions=4, claims={4: 1}),
    dict(owner="a", kafka_partitions=4, claims={0: 0}),
    dict(owner="a", kafka_partitions=4, claims={"x": 1}),
    dict(owner="a", kafka_partitions=4, claims={True: 1}),
])
def test_a_malformed_claim_is_refused(bad) -> None:
    with pytest.raises(InvalidAction):
        ClaimPartitions(**bad)


# --------------------------------------------------------------------------- committing


def test_two_owners_append_to_one_log_and_each_sees_the_others_files(store) -> None:
    a, b = _open(store), _open(store)
    assert a.claim([0, 1], PARTITIONS, "ingester-a", NOW_S) == {0: 1, 1: 1}
    assert b.claim([2, 3], PARTITIONS, "ingester-b", NOW_S) == {2: 1, 3: 1}  # lost revision 1: appended after
    fa, fb = _add(0), _add(3)
    ra = a.commit([fa], NOW_S + 1)
    rb = b.commit([fb], NOW_S + 2)  # on top of a's commit, read after losing the race
    assert (ra, rb) == (3, 4)
    assert set(b.state.files) == {fa.key, fb.key}
    assert a.refresh() == frozenset() and set(a.state.files) == {fa.key, fb.key}
    fresh = read_state(store, DB)
    assert fresh.files == b.state.files and fresh.owners == {0: PartitionOwner("ingester-a", 1),
                                                              1: PartitionOwner("ingester-a", 1),
                                                              2: PartitionOwner("ingester-b", 1),
                                                              3: PartitionOwner("ingester-b", 1)}
    assert a.owned_partitions == {0, 1} and b.owned_partitions == {2, 3}
    txn = json.loads(store.get(transaction_key(DB, 4)))
    assert (txn["writer"], txn["format_version"]) == ("ingester-b", 4)


def test_a_writer_cannot_touch_a_partition_it_does_not_own_and_nothing_is_written(store) -> None:
    a = _open(store)
    a.claim([0], PARTITIONS, "a", NOW_S)
    with pytest.raises(PartitionsNotOwned) as info:
        a.commit([_add(0), _add(1)], NOW_S + 1)
    assert info.value.partitions == (1,)
    assert not store.exists(transaction_key(DB, 2)) and a.revision == 1


def test_a_handoff_fences_the_old_owner_for_that_partition_only(store) -> None:
    old, new = _open(store), _open(store)
    old.claim([0, 1], PARTITIONS, "old", NOW_S)
    old.commit([_add(0), _dbc({0: (None, 10), 1: (None, 20)})], NOW_S + 1)
    new.refresh()
    assert new.claim([0], PARTITIONS, "new", NOW_S + 2) == {0: 2}
    # the new owner resumes where the old one's checkpoint ends
    assert new.state.database_checkpoint.sequencer_numbers[0] == (None, 10)
    before = store.list(f"{DB}/catalog/")
    with pytest.raises(PartitionsNotOwned) as info:
        old.commit([_add(0)], NOW_S + 3)  # loses the revision, reads the claim, refuses
    assert info.value.owners == {0: PartitionOwner("new", 2)}
    assert store.list(f"{DB}/catalog/") == before
    assert old.owned_partitions == {1} and old.refresh() == frozenset()
    old.commit([_add(1), _dbc({1: (None, 25)})], NOW_S + 4)  # its other partition goes on
    new.commit([_add(0), _dbc({0: (None, 30)})], NOW_S + 5)
    assert read_state(store, DB).database_checkpoint.sequencer_numbers == {0: (None, 30), 1: (None, 25)}


def test_the_first_claim_records_the_topic_incarnation_and_later_claims_keep_what_owners_recorded(store) -> None:
    """A pool database's topic id is in its catalog from the first claim on (not only from the first
    persist), so a topic lost before anything was persisted is found at the next start."""
    first = RecordDatabaseCheckpoint(topic="iox.pooldb", kafka_partitions=PARTITIONS, topic_id="id-1",
                                     seq_origin=0)
    a, b = _open(store), _open(store)
    a.claim([0, 1], PARTITIONS, "a", NOW_S, first_checkpoint=first)
    assert read_state(store, DB).database_checkpoint == first
    a.commit([_add(0), dataclasses.replace(first, sequencer_numbers={0: (None, 7)})], NOW_S + 1)
    b.claim([2], PARTITIONS, "b", NOW_S + 2,
            first_checkpoint=dataclasses.replace(first, topic_id="id-2"))  # not the first: not recorded
    ck = read_state(store, DB).database_checkpoint
    assert (ck.topic_id, ck.sequencer_numbers) == ("id-1", {0: (None, 7)})
    with pytest.raises(ValueError):
        b.claim([3], PARTITIONS, "b", NOW_S + 3, first_checkpoint=dataclasses.replace(
            first, sequencer_numbers={3: (None, 1)}))


def test_refresh_reports_a_partition_lost_to_a_claim(store) -> None:
    old, new = _open(store), _open(store)
    old.claim([0, 1], PARTITIONS, "old", NOW_S)
    new.claim([1], PARTITIONS, "new", NOW_S)
    assert old.refresh() == {1} and old.owned_partitions == {0}
    assert old.refresh() == frozenset()


def test_a_refresh_with_nothing_new_keeps_the_state_it_had_and_one_with_news_takes_a_new_one(store) -> None:
    """The state a reader holds is never changed under it, and a refresh that finds no transaction
    does not copy it (a pool catalog of 10,000 files is refreshed every 2 s)."""
    old, new = _open(store), _open(store)
    old.claim([0], PARTITIONS, "old", NOW_S)
    new.claim([1], PARTITIONS, "new", NOW_S)
    old.refresh()
    before = old.state
    files = dict(before.files)
    assert old.refresh() == frozenset() and old.state is before
    new.commit([_add(1)], NOW_S + 1)
    old.refresh()
    assert old.state is not before and before.files == files and old.state.revision == before.revision + 1
    assert set(old.state.files) - set(before.files) == set(new.state.files) - set(before.files)


def test_a_restarted_ingester_under_the_same_name_fences_its_previous_process(store) -> None:
    zombie = _open(store)
    zombie.claim([0], PARTITIONS, "a", NOW_S)
    restarted = _open(store)
    assert restarted.claim([0], PARTITIONS, "a", NOW_S + 1) == {0: 2}
    with pytest.raises(PartitionsNotOwned):
        zombie.commit([_add(0)], NOW_S + 2)
    restarted.commit([_add(0)], NOW_S + 3)


def test_a_reloaded_instance_must_claim_before_it_writes(store) -> None:
    a = _open(store)
    a.claim([0], PARTITIONS, "a", NOW_S)
    again = _open(store)
    with pytest.raises(PartitionsNotOwned):
        again.commit([_add(0)], NOW_S + 1)
    with pytest.raises(RuntimeError, match="pool catalog"):
        again.newer_revision()


def test_a_claim_must_match_the_topic_partition_count(store) -> None:
    a = _open(store)
    a.commit([_dbc({0: (None, 1)})], NOW_S)
    with pytest.raises(InvalidAction, match="topic has 4"):
        a.claim([0], 8, "a", NOW_S + 1)


def test_database_checkpoint_lost_writes_merge_per_partition_and_complete_needs_all(store) -> None:
    a, b = _open(store), _open(store)
    a.claim([0, 1], PARTITIONS, "a", NOW_S)
    b.claim([2, 3], PARTITIONS, "b", NOW_S)
    a.commit([_dbc({0: (None, 1), 1: (None, 2)}, complete=True)], NOW_S + 1)
    b.commit([_dbc({2: (None, 3), 3: (None, 4)}, complete=True)], NOW_S + 2)
    dbc = read_state(store, DB).database_checkpoint
    assert dbc.sequencer_numbers == {0: (None, 1), 1: (None, 2), 2: (None, 3), 3: (None, 4)}
    assert dbc.complete is False  # b's record covers only its own partitions
    entry = LostWritesEntry(partition=0, from_offset=1, to_exclusive=2, detected_at_s=1.0, reason="lost")
    a.commit([RecordLostWrites(ranges=(entry,))], NOW_S + 3)
    b.refresh()
    entry3 = LostWritesEntry(partition=3, from_offset=5, to_exclusive=6, detected_at_s=2.0, reason="lost")
    b.commit([RecordLostWrites(ranges=(entry3,))], NOW_S + 4)
    assert read_state(store, DB).lost_writes == (entry, entry3)


def test_owners_survive_a_full_checkpoint(store) -> None:
    cfg = PreservedCatalogConfig(transactions_until_checkpoint=2)
    a = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=cfg)[0]
    a.claim([0, 2], PARTITIONS, "a", NOW_S)
    a.commit([_add(0)], NOW_S + 1)
    a.commit([_add(2)], NOW_S + 2)
    assert store.exists(f"{DB}/catalog/{2:020d}.ckpt")
    state = read_state(store, DB)
    assert state.owners == {0: PartitionOwner("a", 1), 2: PartitionOwner("a", 1)}
    assert state.pool_kafka_partitions == PARTITIONS and state.files == a.state.files


def test_a_transaction_whose_writer_does_not_own_its_partitions_is_corrupt_on_load(store) -> None:
    a = _open(store)
    a.claim([0], PARTITIONS, "a", NOW_S)
    a.commit([_add(0)], NOW_S + 1)
    key = transaction_key(DB, 2)
    raw = json.loads(store.get(key))
    store.delete(key)
    store.put_if_absent(key, json.dumps({**raw, "writer": "intruder"}).encode())
    with pytest.raises(CorruptCatalogFile, match="did not own"):
        read_state(store, DB)


class _LandsThenRaises(LocalObjectStore):
    """Writes the first transaction put, then raises AlreadyExists as a retried request would."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.armed = False

    def put_if_absent(self, key: str, data: bytes) -> None:
        super().put_if_absent(key, data)
        if self.armed and key.endswith(".txn"):
            self.armed = False
            raise AlreadyExists(key)


def test_a_put_that_landed_but_raised_is_recognised_by_its_uuid(tmp_path) -> None:
    store = _LandsThenRaises(tmp_path / "o")
    a = _open(store)
    a.claim([0], PARTITIONS, "a", NOW_S)
    store.armed = True
    f = _add(0)
    assert a.commit([f], NOW_S + 1) == 2
    assert not store.exists(transaction_key(DB, 3)) and set(read_state(store, DB).files) == {f.key}


def test_concurrent_owners_lose_no_commit(store) -> None:
    writers = [_open(store) for _ in range(PARTITIONS)]
    for kp, w in enumerate(writers):
        w.claim([kp], PARTITIONS, f"w{kp}", NOW_S)
    added: dict[int, list[str]] = {kp: [] for kp in range(PARTITIONS)}
    errors: list[BaseException] = []

    def run(kp: int) -> None:
        try:
            for i in range(15):
                f = _add(kp)
                writers[kp].commit([f, _dbc({kp: (None, i)})], NOW_S + i)
                added[kp].append(f.key)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(kp,)) for kp in range(PARTITIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    state = read_state(store, DB)
    assert set(state.files) == {k for keys in added.values() for k in keys}
    assert state.revision == PARTITIONS + PARTITIONS * 15
    assert state.database_checkpoint.sequencer_numbers == {kp: (None, 14) for kp in range(PARTITIONS)}


# --------------------------------------------------------------------------- model


class PoolCatalogModel(RuleBasedStateMachine):
    """Ingesters named a, b, c claim partitions, commit files, refresh and restart, interleaved; a
    restart leaves the previous process running (a zombie that may still commit). The oracle is
    which process made each partition's latest claim. Every commit succeeds exactly when its
    process made the latest claim of the partition it touches; the log always loads to exactly
    the files of the commits that succeeded."""

    NAMES = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        self._dir = tempfile.TemporaryDirectory()
        self.store = LocalObjectStore(self._dir.name)
        self.procs = {(n, 0): _open(self.store) for n in self.NAMES}  # (name, generation) -> process
        self.gen = {n: 0 for n in self.NAMES}  # the newest generation per name
        self.owner: dict[int, tuple[str, int]] = {}  # kp -> (name, generation) of the latest claim
        self.files: set[str] = set()
        self.now = NOW_S

    def teardown(self) -> None:
        self._dir.cleanup()

    @rule(name=st.sampled_from(NAMES), parts=st.sets(st.integers(0, PARTITIONS - 1), min_size=1, max_size=2))
    def claim(self, name, parts) -> None:
        self.now += 1
        self.procs[(name, self.gen[name])].claim(sorted(parts), PARTITIONS, name, self.now)
        for p in parts:
            self.owner[p] = (name, self.gen[name])

    @precondition(lambda self: self.owner)  # a pool catalog (before any claim, one committer writes)
    @rule(data=st.data(), kp=st.integers(0, PARTITIONS - 1))
    def commit(self, data, kp) -> None:
        who = data.draw(st.sampled_from(sorted(self.procs)), label="process")
        proc = self.procs[who]
        self.now += 1
        f = _add(kp)
        expected_ok = self.owner.get(kp) == who
        try:
            proc.commit([f], self.now)
        except PartitionsNotOwned as exc:
            assert not expected_ok, exc
            assert exc.partitions == (kp,)
            return
        except RevisionConflict:
            # a process that never claimed commits as a single committer until it reads the claims:
            # the catalog has become a pool catalog under it, so it is fenced
            assert proc.writer is None and not expected_ok
            return
        assert expected_ok
        self.files.add(f.key)

    @rule(data=st.data())
    def refresh(self, data) -> None:
        who = data.draw(st.sampled_from(sorted(self.procs)), label="process")
        proc = self.procs[who]
        before = set(proc.owned_partitions)
        lost = proc.refresh()
        now_owned = {kp for kp, o in self.owner.items() if o == who}
        assert proc.owned_partitions == now_owned and lost == before - now_owned

    @rule(name=st.sampled_from(NAMES))
    def restart(self, name) -> None:
        """A new process under the same name: it owns nothing until it claims again."""
        self.gen[name] += 1
        self.procs[(name, self.gen[name])] = _open(self.store)

    @invariant()
    def the_log_loads_to_exactly_the_committed_files(self) -> None:
        state = read_state(self.store, DB)
        assert set(state.files) == self.files
        assert {kp: o.owner for kp, o in state.owners.items()} == {kp: n for kp, (n, _g) in self.owner.items()}


TestPoolCatalogModel = PoolCatalogModel.TestCase
TestPoolCatalogModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
