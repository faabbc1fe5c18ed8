"""Preserved catalog on a local directory: format, chain verification, checkpoints, fencing."""

from __future__ import annotations

import json
import pickle

import pytest

from iox_spark.catalog.errors import (
    BrokenChain,
    CatalogError,
    CorruptCatalogFile,
    FormatVersionMismatch,
    InvalidAction,
    InvalidKey,
    PreviousUuidMismatch,
    RevisionConflict,
    RevisionGap,
)
from iox_spark.catalog.object_store import LocalObjectStore, catalog_prefix, data_prefix, parquet_key
from iox_spark.catalog.preserved_catalog import (
    BASE_FORMAT_VERSION,
    FORMAT_VERSION,
    READABLE_FORMAT_VERSIONS,
    AcceptedPoisonEntry,
    LostWritesEntry,
    RecordAcceptedPoison,
    RecordLostWrites,
    AddDeletePredicate,
    AddParquet,
    CatalogState,
    PreservedCatalog,
    PreservedCatalogConfig,
    RecordDatabaseCheckpoint,
    RecordPartitionCheckpoint,
    RemoveParquet,
    SetTableSchema,
    action_from_json,
    checkpoint_key,
    transaction_key,
)

DB = "mydb"
NOW_S = 1_700_000_000.5
SCHEMA = [["host", "tag", "string"], ["usage", "field", "float"], ["time", "time", "time"]]


def _add(i: int, table: str = "cpu", partition: str = "2024-01-01") -> AddParquet:
    return AddParquet(
        key=parquet_key(DB, table, partition, f"00000000-0000-0000-0000-{i:012d}"),
        table=table,
        partition_key=partition,
        row_count=10 + i,
        size_bytes=1000 + i,
        min_time_ns=1_000 * i,
        max_time_ns=1_000 * i + 999,
        min_seq=100 * i,
        max_seq=100 * i + 9,
        schema=SCHEMA,
    )


class _RecordingStore(LocalObjectStore):
    """Local store that records the keys read with ``get``."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.gets: list[str] = []

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)


@pytest.fixture
def store(tmp_path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "objects")


def _load(store, config=None) -> tuple[PreservedCatalog, CatalogState]:
    return PreservedCatalog.create_or_load(store, DB, now_s=NOW_S + 1e6, config=config)


# --------------------------------------------------------------------------- layout


def test_layout_keys() -> None:
    assert parquet_key("mydb", "cpu", "2024-01-01", "u-1") == "mydb/data/cpu/2024-01-01/u-1.parquet"
    assert catalog_prefix("mydb") == "mydb/catalog/"
    assert data_prefix("mydb") == "mydb/data/"
    assert transaction_key("mydb", 7) == "mydb/catalog/00000000000000000007.txn"
    assert checkpoint_key("mydb", 7) == "mydb/catalog/00000000000000000007.ckpt"
    # Any name is exactly one segment, and distinct names stay distinct.
    assert parquet_key("d", "a/b", "..", "u") == "d/data/a%2Fb/%2E./u.parquet"
    assert parquet_key("d", "a b", "p", "u") != parquet_key("d", "a%20b", "p", "u")
    with pytest.raises(InvalidKey):
        catalog_prefix("")


# --------------------------------------------------------------------------- create / round trip


def test_create_writes_revision_zero_once(store) -> None:
    cat, state = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    assert (state.revision, state.timestamp_s, state.files) == (0, NOW_S, {})
    assert store.exists(transaction_key(DB, 0))
    raw = json.loads(store.get(transaction_key(DB, 0)))
    # a file holding only what version 1 knows is written as version 1 (see test_version_2_records...)
    assert raw["format_version"] == BASE_FORMAT_VERSION and raw["previous_uuid"] is None and raw["actions"] == []
    cat2, state2 = _load(store)
    assert state2 == state  # loaded, not re-created: same uuid and timestamp
    assert [m.key for m in store.list(catalog_prefix(DB))] == [transaction_key(DB, 0)]


def test_round_trip_of_every_action_type(store) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    a1, a2 = _add(1), _add(2, partition="2024-01-02")
    actions = [
        a1,
        a2.to_json(),  # plain JSON dicts are accepted as well
        SetTableSchema(table="cpu", columns=SCHEMA),
        RecordPartitionCheckpoint(
            table="cpu", partition_key="2024-01-01", flush_timestamp_ns=5_000, sequencer_numbers={0: (11, 20), 1: (None, 7)}
        ),
        {
            "kind": "database_checkpoint",
            "topic": "iox-mydb",
            "kafka_partitions": 2,
            "sequencer_numbers": {"0": [11, 20], "1": [8, 7]},
        },
        AddDeletePredicate(
            table="cpu",
            start_ns=0,
            stop_ns_exclusive=10_000,
            predicate=[["host", "=", "a"], ["region", "!=", "eu"]],
            seq=15,
            applies_to=[a1.key, a2.key],
        ),
        AddDeletePredicate(table=None, start_ns=5, stop_ns_exclusive=6, predicate=[], seq=16, applies_to=[a2.key]),
    ]
    assert cat.commit(actions, now_s=NOW_S + 1) == 1
    a3 = _add(3)
    rev = cat.commit(
        [
            RemoveParquet(key=a1.key),
            a3,
            SetTableSchema(table="cpu", columns=[["usage", "field", "float"], ["region", "tag", "string"]]),
            SetTableSchema(table="mem", columns=[["free", "field", "integer"]]),
            RecordPartitionCheckpoint(
                table="cpu", partition_key="2024-01-01", flush_timestamp_ns=9_000, sequencer_numbers={0: (30, 40)}
            ),
        ],
        now_s=NOW_S + 2,
    )
    assert rev == 2
    committed = cat.state

    _, loaded = _load(store)
    assert loaded == committed
    assert loaded.revision == 2 and loaded.timestamp_s == NOW_S + 2
    assert set(loaded.files) == {a2.key, a3.key}
    assert loaded.files[a2.key] == a2 and loaded.files[a3.key].schema == tuple(tuple(c) for c in SCHEMA)
    assert loaded.partition_checkpoints == {
        ("cpu", "2024-01-01"): RecordPartitionCheckpoint(
            table="cpu", partition_key="2024-01-01", flush_timestamp_ns=9_000, sequencer_numbers={0: (30, 40)}
        ),
    }
    dbc = loaded.database_checkpoint
    assert dbc is not None and dbc.topic == "iox-mydb" and dbc.kafka_partitions == 2
    assert dbc.sequencer_numbers == {0: (11, 20), 1: (8, 7)}
    # Removing a1 dropped it from the first predicate's applies_to; the second never named it.
    assert [p.applies_to for p in loaded.delete_predicates] == [(a2.key,), (a2.key,)]
    assert loaded.delete_predicates[0].predicate == (("host", "=", "a"), ("region", "!=", "eu"))
    assert loaded.delete_predicates[1].table is None
    assert loaded.table_schemas == {
        "cpu": (*(tuple(c) for c in SCHEMA), ("region", "tag", "string")),
        "mem": (("free", "field", "integer"),),
    }
    # Every action survives its JSON form unchanged.
    for action in actions[:1] + actions[2:4] + actions[5:]:
        assert action_from_json(json.loads(json.dumps(action.to_json()))) == action
    # The state is picklable (shipped to query planning), the committer is not.
    assert pickle.loads(pickle.dumps(loaded)) == loaded
    with pytest.raises(TypeError):
        pickle.dumps(cat)


def test_predicate_dropped_when_all_its_files_are_removed(store) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    a1 = _add(1)
    pred = AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=1, predicate=[], seq=3, applies_to=[a1.key])
    cat.commit([a1, pred], now_s=NOW_S)
    cat.commit([RemoveParquet(key=a1.key)], now_s=NOW_S)
    assert cat.state.delete_predicates == [] and cat.state.files == {}
    assert _load(store)[1] == cat.state


def test_states_handed_out_are_snapshots(store) -> None:
    cat, state0 = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    cat.commit([_add(1)], now_s=NOW_S)
    assert state0.revision == 0 and state0.files == {}
    assert cat.state.revision == 1 and len(cat.state.files) == 1


@pytest.mark.parametrize(
    "bad_actions",
    [
        [RemoveParquet(key="mydb/data/cpu/x/never.parquet")],
        [_add(1), _add(1)],
        [AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=1, predicate=[], seq=1, applies_to=["nope"])],
        [SetTableSchema(table="cpu", columns=[["host", "field", "string"]])],  # host is a tag
        [{"kind": "no_such_action"}],
        [{"kind": "remove_parquet"}],  # missing field
    ],
)
def test_invalid_action_writes_nothing(store, bad_actions) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    cat.commit([SetTableSchema(table="cpu", columns=SCHEMA)], now_s=NOW_S)
    before = cat.state
    with pytest.raises(InvalidAction) as info:
        cat.commit(bad_actions, now_s=NOW_S)
    assert info.value.revision == 2 and isinstance(info.value, CatalogError)
    assert cat.state is before and not store.exists(transaction_key(DB, 2))
    assert cat.commit([], now_s=NOW_S) == 2  # not fenced: the catalog is still usable


def test_action_validation() -> None:
    fields = {k: v for k, v in _add(1).to_json().items() if k != "kind"}
    for bad in ({"min_time_ns": 5, "max_time_ns": 4}, {"row_count": -1}, {"min_seq": True}, {"schema": [["a", "tag"]]}):
        with pytest.raises(InvalidAction):
            AddParquet(**{**fields, **bad})
    with pytest.raises(InvalidAction):
        RecordDatabaseCheckpoint(topic="t", kafka_partitions=1, sequencer_numbers={1: (0, 0)})
    with pytest.raises(InvalidAction):
        RecordPartitionCheckpoint(table="t", partition_key="p", flush_timestamp_ns=1, sequencer_numbers={"x": [1, 2]})
    with pytest.raises(InvalidAction):
        AddDeletePredicate(table="t", start_ns=2, stop_ns_exclusive=1, predicate=[], seq=0, applies_to=[])



def test_database_checkpoint_topic_id_and_complete_round_trip(store) -> None:
    """topic_id and complete survive a commit and a reload; older checkpoints without them load
    as unknown id / not complete; a non-boolean complete is rejected."""
    cat, _ = _load(store)
    plain = RecordDatabaseCheckpoint(topic="t", kafka_partitions=2, sequencer_numbers={0: (None, 4)})
    assert "topic_id" not in plain.to_json() and "complete" not in plain.to_json()
    cat.commit([plain], now_s=NOW_S)
    assert _load(store)[1].database_checkpoint == plain
    assert (plain.topic_id, plain.complete) == (None, False)
    full = RecordDatabaseCheckpoint(topic="t", kafka_partitions=2, sequencer_numbers={0: (None, 4), 1: (None, 0)},
                                    epoch=3, topic_id="AaIEvtMVcYCJieZB4rlcnA", complete=True)
    cat.commit([full.to_json()], now_s=NOW_S)
    loaded = _load(store)[1].database_checkpoint
    assert loaded == full and (loaded.topic_id, loaded.complete, loaded.epoch) == ("AaIEvtMVcYCJieZB4rlcnA", True, 3)
    with pytest.raises(InvalidAction):
        RecordDatabaseCheckpoint(topic="t", kafka_partitions=1, complete="yes")
    with pytest.raises(InvalidAction):
        RecordDatabaseCheckpoint(topic="t", kafka_partitions=1, topic_id="")


def test_database_checkpoint_seq_origin_round_trips_and_legacy_json_reads_as_the_legacy_origin(store) -> None:
    """seq_origin survives JSON, a commit, a reload and a full checkpoint file; a checkpoint
    written without it (every catalog before origins were recorded) reads as None, whose origin
    is the legacy layout's; an origin that is negative, not aligned or too large is refused."""
    from iox_spark.catalog.seq_layout import SEQ_MAX, SEQ_ROW_BITS, current_seq_origin, legacy_seq_origin

    origin = legacy_seq_origin(255) + (42 << SEQ_ROW_BITS)
    ck = RecordDatabaseCheckpoint(topic="t", kafka_partitions=2, sequencer_numbers={0: (None, 4)}, epoch=256,
                                  complete=True, seq_origin=origin)
    assert ck.to_json()["seq_origin"] == origin
    assert action_from_json(json.loads(json.dumps(ck.to_json()))) == ck
    legacy = {"kind": "database_checkpoint", "topic": "t", "kafka_partitions": 2,
              "sequencer_numbers": {"0": [None, 4]}, "epoch": 7, "complete": True}
    assert action_from_json(legacy).seq_origin is None
    assert "seq_origin" not in action_from_json(legacy).to_json()
    cat, _ = _load(store, PreservedCatalogConfig(transactions_until_checkpoint=2))
    cat.commit([legacy], now_s=NOW_S)
    state = _load(store)[1]
    assert state.database_checkpoint.seq_origin is None
    assert current_seq_origin(state) == (legacy_seq_origin(7), False)
    cat.commit([ck], now_s=NOW_S)  # revision 2: also written as a full checkpoint
    assert store.exists(checkpoint_key(DB, 2))
    state = _load(store)[1]
    assert state.database_checkpoint == ck and current_seq_origin(state) == (origin, False)
    for bad in (-(1 << SEQ_ROW_BITS), 1, (1 << SEQ_ROW_BITS) + 5, SEQ_MAX + 1, True, "0"):
        with pytest.raises(InvalidAction):
            RecordDatabaseCheckpoint(topic="t", kafka_partitions=1, seq_origin=bad)


# --------------------------------------------------------------------------- checkpoints


def test_load_uses_newest_checkpoint_plus_later_transactions(tmp_path) -> None:
    root = tmp_path / "objects"
    store = LocalObjectStore(root)
    config = PreservedCatalogConfig(transactions_until_checkpoint=3)
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    added: list[AddParquet] = []
    for i in range(1, 11):
        actions: list = [_add(i), SetTableSchema(table="cpu", columns=SCHEMA[: 1 + i % 3])]
        if i % 2 == 0:
            actions.append(RemoveParquet(key=added.pop(0).key))
        if i % 4 == 0:
            actions.append(
                AddDeletePredicate(
                    table="cpu", start_ns=0, stop_ns_exclusive=i, predicate=[["host", "=", f"h{i}"]], seq=i,
                    applies_to=[a.key for a in added],
                )
            )
        actions.append(
            RecordPartitionCheckpoint(
                table="cpu", partition_key="2024-01-01", flush_timestamp_ns=i, sequencer_numbers={0: (i, i + 1)}
            )
        )
        actions.append(RecordDatabaseCheckpoint(topic="t", kafka_partitions=1, sequencer_numbers={0: (i, i + 1)}))
        added.append(actions[0])
        assert cat.commit(actions, now_s=NOW_S + i) == i
    names = sorted(m.key.rsplit("/", 1)[1] for m in store.list(catalog_prefix(DB)))
    assert [n for n in names if n.endswith(".ckpt")] == [f"{r:020d}.ckpt" for r in (3, 6, 9)]
    assert len([n for n in names if n.endswith(".txn")]) == 11

    recording = _RecordingStore(root)
    _, via_checkpoint = PreservedCatalog.create_or_load(recording, DB, now_s=NOW_S, config=config)
    assert recording.gets == [checkpoint_key(DB, 9), transaction_key(DB, 10)]
    assert via_checkpoint == cat.state

    for r in (3, 6, 9):
        store.delete(checkpoint_key(DB, r))
    recording.gets.clear()
    _, via_replay = PreservedCatalog.create_or_load(recording, DB, now_s=NOW_S, config=config)
    assert recording.gets == [transaction_key(DB, r) for r in range(11)]
    assert via_replay == via_checkpoint


def test_checkpoint_then_more_commits_continue_the_chain(store) -> None:
    config = PreservedCatalogConfig(transactions_until_checkpoint=2)
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    for i in range(1, 4):
        cat.commit([_add(i)], now_s=NOW_S)
    cat2, state = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    assert state.revision == 3
    cat2.commit([_add(4)], now_s=NOW_S)  # links to the uuid restored from checkpoint 2 + txn 3
    _, again = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    assert again == cat2.state and len(again.files) == 4
    assert store.exists(checkpoint_key(DB, 4))


# --------------------------------------------------------------------------- broken files


def _rewrite(store, key: str, **changes) -> None:
    obj = json.loads(store.get(key))
    obj.update(changes)
    store.put(key, json.dumps(obj).encode())


def _catalog_with_revisions(store, n: int, config=None) -> PreservedCatalog:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S, config=config)
    for i in range(1, n + 1):
        cat.commit([_add(i)], now_s=NOW_S + i)
    return cat


@pytest.mark.parametrize("which", ["txn", "ckpt"])
def test_format_version_mismatch(store, which) -> None:
    # Checkpoint at 3, so a load reads checkpoint 3 and transaction 4.
    _catalog_with_revisions(store, 4, PreservedCatalogConfig(transactions_until_checkpoint=3))
    key = transaction_key(DB, 4) if which == "txn" else checkpoint_key(DB, 3)
    _rewrite(store, key, format_version=999)
    with pytest.raises(FormatVersionMismatch) as info:
        _load(store)
    assert (info.value.expected, info.value.actual, info.value.key) == (FORMAT_VERSION, 999, key)
    assert info.value.readable == READABLE_FORMAT_VERSIONS and "reads format versions 1, 2" in str(info.value)


_LOST = LostWritesEntry(partition=1, from_offset=5, to_exclusive=7, detected_at_s=NOW_S, reason="topic replaced",
                        epoch=2)
_POISON = AcceptedPoisonEntry(epoch=2, partition=0, offset=9, table="cpu", kind="write", error="boom",
                              detected_at_s=NOW_S, accepted_at_s=NOW_S + 5)


def test_version_2_records_round_trip_and_only_their_files_are_version_2(store) -> None:
    """Lost writes and accepted poisoned messages are recorded (each action replacing the list
    before); only the files that hold them are format version 2, through transactions and
    checkpoints alike, so a catalog without them stays readable by a version-1 server."""
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S,
                                             config=PreservedCatalogConfig(transactions_until_checkpoint=3))
    assert cat.commit([_add(1)], NOW_S + 1) == 1
    assert cat.commit([RecordLostWrites(ranges=[_LOST])], NOW_S + 2) == 2
    accepted = LostWritesEntry(**{**_LOST.to_json(), "accepted_at_s": NOW_S + 3})
    assert cat.commit([RecordLostWrites(ranges=[accepted.to_json()]), RecordAcceptedPoison(messages=[_POISON])],
                      NOW_S + 3) == 3  # checkpoint 3 holds them
    assert cat.commit([_add(4)], NOW_S + 4) == 4
    versions = {rev: json.loads(store.get(transaction_key(DB, rev)))["format_version"] for rev in range(5)}
    assert versions == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1}
    assert json.loads(store.get(checkpoint_key(DB, 3)))["format_version"] == 2
    _, loaded = _load(store)
    assert loaded == cat.state
    assert loaded.lost_writes == (accepted,) and loaded.accepted_poison == (_POISON,)
    for action in (RecordLostWrites(ranges=[_LOST, accepted]), RecordAcceptedPoison(messages=[_POISON])):
        assert action_from_json(json.loads(json.dumps(action.to_json()))) == action
    # an empty list clears them, and the next checkpoint is version 1 again
    cat.commit([RecordLostWrites(), RecordAcceptedPoison()], NOW_S + 5)
    cat.commit([_add(6)], NOW_S + 6)  # checkpoint 6
    assert json.loads(store.get(checkpoint_key(DB, 6)))["format_version"] == 1
    assert _load(store)[1].lost_writes == ()


@pytest.mark.parametrize("which", ["txn", "ckpt"])
def test_a_version_1_file_holding_a_version_2_record_is_corrupt(store, which) -> None:
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S,
                                             config=PreservedCatalogConfig(transactions_until_checkpoint=2))
    cat.commit([_add(1)], NOW_S + 1)
    cat.commit([RecordLostWrites(ranges=[_LOST])], NOW_S + 2)  # checkpoint 2
    cat.commit([_add(3)], NOW_S + 3)
    key = transaction_key(DB, 2) if which == "txn" else checkpoint_key(DB, 2)
    if which == "txn":
        store.delete(checkpoint_key(DB, 2))  # load from the transactions
    _rewrite(store, key, format_version=1)
    with pytest.raises(CorruptCatalogFile) as info:
        _load(store)
    assert info.value.key == key and "format version" in info.value.reason


def test_version_2_record_validation() -> None:
    with pytest.raises(InvalidAction):
        LostWritesEntry(partition=0, from_offset=5, to_exclusive=4, detected_at_s=NOW_S, reason="")
    with pytest.raises(InvalidAction):
        LostWritesEntry(partition=0, from_offset=5, to_exclusive=None, detected_at_s=float("nan"), reason="")
    with pytest.raises(InvalidAction):
        action_from_json({"kind": "lost_writes", "ranges": [{"partition": 0}]})
    with pytest.raises(InvalidAction):
        action_from_json({"kind": "accepted_poisoned_messages", "messages": "x"})
    with pytest.raises(InvalidAction):
        AcceptedPoisonEntry(epoch=0, partition=0, offset=-1, table="", kind="write", error="", detected_at_s=1.0,
                            accepted_at_s=2.0)


def test_missing_transaction_is_a_revision_gap(store) -> None:
    _catalog_with_revisions(store, 4)
    store.delete(transaction_key(DB, 2))
    with pytest.raises(RevisionGap) as info:
        _load(store)
    assert (info.value.expected_revision, info.value.found_revision) == (2, 3)
    assert isinstance(info.value, BrokenChain)


def test_missing_first_transaction_is_a_revision_gap(store) -> None:
    _catalog_with_revisions(store, 2)
    store.delete(transaction_key(DB, 0))
    with pytest.raises(RevisionGap) as info:
        _load(store)
    assert (info.value.expected_revision, info.value.found_revision) == (0, 1)


def test_wrong_previous_uuid_breaks_the_chain(store) -> None:
    _catalog_with_revisions(store, 4)
    _rewrite(store, transaction_key(DB, 3), previous_uuid="not-the-uuid-of-2")
    with pytest.raises(PreviousUuidMismatch) as info:
        _load(store)
    expected_uuid = json.loads(store.get(transaction_key(DB, 2)))["uuid"]
    assert (info.value.revision, info.value.expected_uuid, info.value.actual_uuid) == (
        3,
        expected_uuid,
        "not-the-uuid-of-2",
    )


def test_transaction_copied_to_another_revision_is_detected(store) -> None:
    _catalog_with_revisions(store, 3)
    store.put(transaction_key(DB, 4), store.get(transaction_key(DB, 3)))
    with pytest.raises(CorruptCatalogFile) as info:
        _load(store)
    assert info.value.key == transaction_key(DB, 4)


def test_unparsable_and_inapplicable_files_are_corrupt(store) -> None:
    _catalog_with_revisions(store, 2)
    store.put(transaction_key(DB, 2), b"{not json")
    with pytest.raises(CorruptCatalogFile):
        _load(store)
    obj = json.loads(store.get(transaction_key(DB, 1)))
    obj.update(revision=2, previous_uuid=obj["uuid"], uuid="u2")  # re-adds the file of revision 1
    store.put(transaction_key(DB, 2), json.dumps(obj).encode())
    with pytest.raises(CorruptCatalogFile) as info:
        _load(store)
    assert isinstance(info.value.__cause__, InvalidAction)


# --------------------------------------------------------------------------- fencing


def test_loser_of_a_revision_gets_revision_conflict_and_is_fenced(store) -> None:
    a, _ = _load(store)
    b, _ = _load(store)
    assert a.commit([_add(1)], now_s=NOW_S) == 1
    before = b.state
    with pytest.raises(RevisionConflict) as info:
        b.commit([_add(2)], now_s=NOW_S)
    assert (info.value.db, info.value.revision, info.value.key) == (DB, 1, transaction_key(DB, 1))
    assert b.fenced and b.state is before
    with pytest.raises(RevisionConflict):  # a fenced writer never commits again
        b.commit([], now_s=NOW_S)
    assert a.commit([_add(3)], now_s=NOW_S) == 2
    _, state = _load(store)
    assert set(state.files) == {_add(1).key, _add(3).key}


class _CountingStore(LocalObjectStore):
    """Local store that counts ``exists`` and ``list`` calls."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.exists_calls: list[str] = []
        self.list_calls = 0

    def exists(self, key: str) -> bool:
        self.exists_calls.append(key)
        return super().exists(key)

    def list(self, prefix: str = ""):
        self.list_calls += 1
        return super().list(prefix)


def test_newer_revision_probes_the_next_transaction_key_only(tmp_path) -> None:
    store = _CountingStore(str(tmp_path / "objects"))
    a, _ = _load(store)
    b, _ = _load(store)
    store.exists_calls.clear()
    store.list_calls = 0
    assert a.newer_revision() is None and not a.newer_revision_exists()
    assert store.exists_calls == [transaction_key(DB, 1)] * 2 and store.list_calls == 0
    assert b.commit([_add(1)], now_s=NOW_S) == 1
    assert a.newer_revision() == 1 and a.newer_revision_exists()
    assert a.fenced and a.fenced_at == 1 and a.revision == 0
    calls = len(store.exists_calls)
    assert a.newer_revision() == 1 and len(store.exists_calls) == calls  # fenced: never asks again
    with pytest.raises(RevisionConflict) as info:  # refused without writing anything
        a.commit([_add(2)], now_s=NOW_S)
    assert info.value.revision == 1
    assert not store.exists(transaction_key(DB, 2))
    assert b.newer_revision() is None and not b.fenced  # the winner owns the database


def test_newer_revision_does_not_count_this_writers_own_commits(store) -> None:
    cat, _ = _load(store)
    for i in range(3):
        cat.commit([_add(i + 1)], now_s=NOW_S)
        assert cat.newer_revision() is None
    assert not cat.fenced and cat.fenced_at is None


def test_a_commit_that_lost_is_reported_by_newer_revision(store) -> None:
    a, _ = _load(store)
    b, _ = _load(store)
    a.commit([_add(1)], now_s=NOW_S)
    with pytest.raises(RevisionConflict):
        b.commit([_add(2)], now_s=NOW_S)
    assert b.fenced_at == 1 and b.newer_revision() == 1


def test_now_must_be_a_finite_number(store) -> None:
    cat, _ = _load(store)
    with pytest.raises(ValueError):
        cat.commit([], now_s=float("nan"))


def test_retention_records_are_version_3_and_survive_a_reload(store) -> None:
    """The retention period and the pruner's watermark are version-3 records: only the files that
    hold them are version 3 (transactions and checkpoints), the state keeps the last period and
    the highest watermark, and a reload (from transactions, then from a checkpoint) gives them back."""
    from iox_spark.catalog.preserved_catalog import RecordPruned, RecordRetention

    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S,
                                             config=PreservedCatalogConfig(transactions_until_checkpoint=4))
    assert cat.commit([RecordRetention(period_s=86_400, set_at_s=NOW_S + 1)], NOW_S + 1) == 1
    assert cat.commit([_add(2), RecordPruned(pruner_hi_ns=5_000)], NOW_S + 2) == 2
    assert cat.commit([RecordPruned(pruner_hi_ns=4_000)], NOW_S + 3) == 3  # never lowers it
    versions = {rev: json.loads(store.get(transaction_key(DB, rev)))["format_version"] for rev in range(4)}
    assert versions == {0: 1, 1: 3, 2: 3, 3: 3}
    _, loaded = _load(store)
    assert (loaded.retention_period_s, loaded.pruner_hi_ns) == (86_400, 5_000)
    assert cat.commit([_add(4)], NOW_S + 4) == 4  # checkpoint 4 holds both: version 3
    assert json.loads(store.get(checkpoint_key(DB, 4)))["format_version"] == 3
    _, loaded = _load(store)
    assert loaded == cat.state and (loaded.retention_period_s, loaded.pruner_hi_ns) == (86_400, 5_000)
    cat.commit([RecordRetention(period_s=0, set_at_s=NOW_S + 5)], NOW_S + 5)
    assert _load(store)[1].retention_period_s == 0
    for action in (RecordRetention(period_s=60, set_at_s=NOW_S), RecordPruned(pruner_hi_ns=-7)):
        assert action_from_json(json.loads(json.dumps(action.to_json()))) == action


def test_a_version_2_file_holding_a_retention_record_is_corrupt_and_a_version_5_file_mismatches(store) -> None:
    """A record needs its version: a file claiming a lower one is corrupt; a version this code does
    not read raises FormatVersionMismatch naming it (a server older than retention refuses version 3
    the same way)."""
    from iox_spark.catalog.preserved_catalog import RecordRetention

    assert 3 in READABLE_FORMAT_VERSIONS and FORMAT_VERSION == 4 and 5 not in READABLE_FORMAT_VERSIONS
    cat, _ = PreservedCatalog.create_or_load(store, DB, now_s=NOW_S)
    cat.commit([RecordRetention(period_s=60, set_at_s=NOW_S)], NOW_S + 1)
    key = transaction_key(DB, 1)
    raw = json.loads(store.get(key))
    store.delete(key)
    store.put_if_absent(key, json.dumps({**raw, "format_version": 2}).encode())
    with pytest.raises(CorruptCatalogFile, match="needs format version 3"):
        _load(store)
    store.delete(key)
    store.put_if_absent(key, json.dumps({**raw, "format_version": 5}).encode())
    with pytest.raises(FormatVersionMismatch) as info:
        _load(store)
    assert (info.value.actual, info.value.key) == (5, key)


def test_a_run_of_removals_applies_as_one_by_one_would() -> None:
    """`apply_actions` takes a run of RemoveParquet out of the delete predicates in one pass; the
    state it gives (files, predicates in order, predicates dropped when nothing is left, the error
    for a file removed twice) is the one `apply_action` applied action by action gives."""
    import copy

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from iox_spark.catalog.preserved_catalog import apply_action, apply_actions

    files = [_add(i) for i in range(8)]

    @st.composite
    def scenarios(draw):
        preds = [AddDeletePredicate(table="cpu", start_ns=0, stop_ns_exclusive=n + 1, predicate=(), seq=10_000 + n,
                                    applies_to=tuple(f.key for f in draw(st.lists(st.sampled_from(files), min_size=1,
                                                                                   max_size=5, unique=True))))
                 for n in range(draw(st.integers(0, 6)))]
        actions = draw(st.lists(st.one_of(
            st.sampled_from(files).map(lambda f: RemoveParquet(key=f.key)),
            st.integers(0, 3).map(lambda n: RecordPartitionCheckpoint(
                table="cpu", partition_key="2024-01-01", flush_timestamp_ns=n, sequencer_numbers={0: (None, n)}))),
            max_size=12))
        return preds, actions

    @settings(max_examples=300, deadline=None)
    @given(scenarios())
    def check(scenario):
        preds, actions = scenario
        base = CatalogState(db=DB, revision=1, transaction_uuid="u", timestamp_s=NOW_S,
                            files={f.key: f for f in files}, delete_predicates=list(preds))
        one, runs = copy.deepcopy(base), copy.deepcopy(base)
        err_one = err_runs = None
        try:
            for a in actions:
                apply_action(one, a, 2)
        except InvalidAction as e:
            err_one = str(e)
        try:
            apply_actions(runs, actions, 2)
        except InvalidAction as e:
            err_runs = str(e)
        assert err_one == err_runs
        if err_one is None:
            assert runs.files == one.files and runs.delete_predicates == one.delete_predicates
            assert runs.partition_checkpoints == one.partition_checkpoints

    check()
