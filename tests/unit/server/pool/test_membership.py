"""server/pool/membership.py's answer to another member (UnpersistedRows): it refuses partitions it does
not own, and answers only once it applied what was written before the query, as far as a
partition is not held. A real Catalog; the server's other parts are stand-ins that record calls (no
Spark: the member holds no unpersisted chunk)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from iox_spark.catalog.catalog import FROZEN, NOT_OWNED, Catalog
from iox_spark.catalog.ownership import PartitionOwner
from iox_spark.catalog.sharding import partition_for
from iox_spark.server.errors import NotPartitionOwner, OwnerNotCaughtUp, OwnershipMoving, WriteTokenNotVisible
from iox_spark.server.pool.membership import PoolControl
from iox_spark.server.replay_watch import ReplayWatch

#: a table on Kafka partition 0 and one on 1 of a topic with 2 partitions
T0 = next(f"t{i}" for i in range(100) if partition_for(f"t{i}", 2) == 0)
T1 = next(f"t{i}" for i in range(100) if partition_for(f"t{i}", 2) == 1)


def _pool(member: str, **parts) -> PoolControl:
    """A PoolControl of `member` whose collaborators are `parts` (None when not given)."""
    names = ("catalog", "write_buffer", "lifecycle", "consumer", "ingestor", "replay", "spark", "store",
             "parquet_cache", "query_engine", "visibility")
    return PoolControl(member, **{**dict.fromkeys(names), "partitions": 2, "auth_token": None, **parts})


def _member(owned, applied, acked=None, replay_until=None, owners=None):
    cat = Catalog()
    db = cat.ensure_database("d", "iox.d", 2)
    db.own_only(owned)
    db.start_applying_at({kp: hi + 1 for kp, hi in applied.items()})
    waits = []

    def wait_applied(database, target, timeout_s):  # nothing more gets applied here
        waits.append(dict(target))

    pc = SimpleNamespace(state=SimpleNamespace(owners=owners or {}), revision=7)
    pool = _pool("a", catalog=cat, write_buffer=SimpleNamespace(acked_of=lambda topic: dict(acked or {})),
                 replay=ReplayWatch(cat, {"iox.d": dict(replay_until or {})}, {}),
                 ingestor=SimpleNamespace(wait_applied=wait_applied), lifecycle=SimpleNamespace(preserved={"d": pc}))
    return pool, db, waits


def test_a_member_that_does_not_own_a_partition_asked_says_who_does():
    pool, _db, waits = _member({0}, {0: 4}, owners={1: PartitionOwner("b", 3)})
    with pytest.raises(NotPartitionOwner) as ei:
        list(pool.answer_rows("d", [T0, T1], {}, 1.0))
    assert ei.value.partitions == [1] and ei.value.owners == {1: ("b", 3)}
    assert "now: 1 by 'b' (epoch 3)" in str(ei.value)
    assert waits == []
    with pytest.raises(NotPartitionOwner) as ei:  # a write token's partition counts as asked
        list(pool.answer_rows("d", [], {1: 2}, 1.0))
    assert ei.value.partitions == [1]


def test_it_answers_only_once_it_applied_what_was_written_before_and_its_own_acks_and_replay():
    pool, _db, waits = _member({0, 1}, {0: 5, 1: 2}, acked={1: 3}, replay_until={0: 4})
    with pytest.raises(OwnerNotCaughtUp) as ei:
        list(pool.answer_rows("d", [T0, T1], {}, 1.0, written_before={0: 5}))
    assert ei.value.behind == {1: (2, 3)} and ei.value.member == "a"
    assert waits == [{0: 5, 1: 3}]


def test_a_write_token_not_applied_is_deadline_exceeded_not_unavailable():
    pool, _db, _waits = _member({0, 1}, {0: 5, 1: 2})
    with pytest.raises(WriteTokenNotVisible):
        list(pool.answer_rows("d", [], {1: 3}, 1.0))


def test_a_held_partition_answers_what_it_applied():
    pool, db, waits = _member({0, 1}, {0: 5, 1: 2}, acked={1: 9}, replay_until={1: 8})
    db.hold(FROZEN, {1: 3})  # frozen from offset 3 on: offsets 3.. wait in Kafka
    msgs = list(pool.answer_rows("d", [T1], {}, 1.0, written_before={1: 7}))
    assert [(m.table, m.arrow_ipc, dict(m.applied_hi_inclusive), m.catalog_revision) for m in msgs] == \
        [(T1, b"", {0: 5, 1: 2}, 7)]
    assert waits == [{1: 2}]
    msgs = list(pool.answer_rows("d", [], {}, 1.0, written_before={1: 7}))  # nothing asked: nothing waited for
    assert [(m.table, dict(m.applied_hi_inclusive)) for m in msgs] == [("", {0: 5, 1: 2})] and len(waits) == 1


def _asker(owned, applied, ends, acked=None):
    pool, db, waits = _member(owned, applied, acked=acked)
    pool._query_engine = SimpleNamespace(reads=lambda db, sql: ([T0, T1], {}), max_bytes=0)
    pool._write_buffer.high_watermarks = lambda topics, n, timeout_s: {"iox.d": dict(ends)}
    pool._visibility = SimpleNamespace(visible=lambda db: dict(db.applied_hi_inclusive))
    pc = pool._lifecycle.preserved["d"]
    pc.refreshed = 0
    pc.refresh = lambda: setattr(pc, "refreshed", pc.refreshed + 1)
    pool.take_state = lambda database, state: None
    return pool, db, waits, pc


def test_a_query_asks_again_after_not_the_owner_and_is_unavailable_past_its_deadline(monkeypatch):
    from iox_spark.server.pool.rows import OwnerMoved

    pool, _db, _waits, pc = _asker({0}, {0: 4}, ends={0: 5, 1: 9}, acked={1: 10})
    rounds = []

    def once(self, db, pc_, fresh, read, wait_applied, written_before, timeout_s, scans=None):
        rounds.append(dict(written_before))
        if len(rounds) < 3:
            raise OwnerMoved("ingester-b", [1], "not the owner")
        return "answer"

    monkeypatch.setattr(PoolControl, "_gather_once", once)
    assert pool.gather_for_query("d", "SELECT 1", {}, 5.0) == "answer"
    # Kafka's end of partition 0 (owned, applied) and of 1; what this member acknowledged of 1 (higher)
    assert rounds == [{0: 4, 1: 10}] * 3 and pc.refreshed == 2

    monkeypatch.setattr(PoolControl, "_gather_once",
                        lambda *a: (_ for _ in ()).throw(OwnerMoved("ingester-b", [1], "not the owner")))
    with pytest.raises(OwnershipMoving) as ei:
        pool.gather_for_query("d", "SELECT 1", {}, 0.5)
    assert "ingester-b: not the owner" in str(ei.value)


def test_a_query_waits_for_what_was_written_before_it_on_the_partitions_it_owns():
    pool, _db, waits, _pc = _asker({0, 1}, {0: 3, 1: 8}, ends={0: 6, 1: 9})
    with pytest.raises(OwnerNotCaughtUp) as ei:
        pool.gather_for_query("d", "SELECT 1", {}, 0.3)
    assert ei.value.behind == {0: (3, 5)} and waits and waits[0] == {0: 5}


def test_a_partition_this_member_claimed_and_has_not_taken_up_is_waited_for_not_read_empty():
    pool, _db, _waits, pc = _asker({0}, {0: 4}, ends={0: 5, 1: 9})
    pc.state.owners = {0: PartitionOwner("a", 1), 1: PartitionOwner("a", 2)}  # 1: claimed, not resumed here
    with pytest.raises(OwnershipMoving) as ei:
        pool.gather_for_query("d", "SELECT 1", {}, 0.5)
    assert "taking over Kafka partitions [1]" in str(ei.value) and pc.refreshed >= 1


def test_a_kafka_that_cannot_be_asked_leaves_this_members_acks_and_is_not_asked_again_at_once():
    pool, db, _waits, _pc = _asker({0}, {0: 4}, ends={}, acked={1: 7})
    calls = []

    def down(topics, n, timeout_s):
        calls.append(timeout_s)
        raise RuntimeError("broker away")

    pool._write_buffer.high_watermarks = down
    assert pool.written_before(db, {0, 1}) == {1: 7} and pool.written_before(db, {0, 1}) == {1: 7}
    assert calls == [2.0]  # asked once, with a short bound


# -- a member's published address reaches the others --------------------------------------------

def test_a_loopback_address_is_refused_while_a_member_runs_on_another_host():
    from iox_spark.server.errors import PoolAddressUnreachable
    from iox_spark.server.pool.membership import check_reachable

    others = [{"member": "b", "address": "10.0.0.2:50051", "host": "node-b"}]
    with pytest.raises(PoolAddressUnreachable) as e:
        check_reachable("a", "127.0.0.1:50051", "node-a", others)
    assert (e.value.other, e.value.other_host, e.value.host) == ("b", "node-b", "node-a")
    assert "--pool-address" in str(e.value)
    for loop in ("localhost:1", "[::1]:1"):
        with pytest.raises(PoolAddressUnreachable):
            check_reachable("a", loop, "node-a", others)
    check_reachable("a", "10.0.0.1:50051", "node-a", others)  # reachable: published
    check_reachable("a", "127.0.0.1:50051", "node-a",
                     [{"member": "b", "address": "127.0.0.1:2", "host": "node-a"},  # the same host
                      {"member": "c", "address": "127.0.0.1:3"}])  # host not recorded (an older member)


def test_published_records_carry_the_host_and_are_listed(tmp_path):
    from iox_spark.catalog.object_store import LocalObjectStore
    from iox_spark.catalog.ownership import member_address_key, member_address_record, read_member_address, read_member_records

    store = LocalObjectStore(str(tmp_path))
    store.put(member_address_key("a"), member_address_record("a", "10.0.0.1:1", 1.0, "node-a"))
    store.put(member_address_key("b"), member_address_record("b", "10.0.0.2:1", 2.0))
    store.put(member_address_key("c"), b"not json")
    recs = sorted(read_member_records(store), key=lambda r: r["member"])
    assert [(r["member"], r["address"], r.get("host")) for r in recs] == [("a", "10.0.0.1:1", "node-a"),
                                                                          ("b", "10.0.0.2:1", None)]
    assert read_member_address(store, "a") == "10.0.0.1:1"


# -- a database only another member took writes for ------------------------------------------------

def test_a_database_known_only_from_its_kafka_topic_is_learnt_holding_everything():
    cat = Catalog(pool_member=True)
    topics = {"iox.other": 2}
    pool = _pool("b", catalog=cat, write_buffer=SimpleNamespace(list_database_topics=lambda: dict(topics),
                                                                topic_id=lambda topic: "tid-1"))
    pool.learn_database("nowhere")  # no topic: still unknown (NOT_FOUND)
    pool.learn_database("bad name!")  # not a database name: nothing asked
    assert cat.peek_database("nowhere") is None and cat.peek_database("bad name!") is None
    pool.learn_database("other")
    db = cat.peek_database("other")
    assert db is not None and db.topic == "iox.other" and db.topic_id == "tid-1"
    assert db.owned_partitions == frozenset() and db.holds(NOT_OWNED) == {0: 0, 1: 0}  # applies nothing here


def test_kafka_away_leaves_the_database_unknown():
    def away():
        raise RuntimeError("no broker")

    cat = Catalog()
    _pool("b", catalog=cat, write_buffer=SimpleNamespace(list_database_topics=away)).learn_database("other")
    assert cat.peek_database("other") is None


def test_taking_states_as_differences_registers_exactly_the_other_owners_files():
    """`take_state` registers what a state added and drops what it removed since the state taken
    last, visiting only the table partitions concerned. Over random histories (other owners adding
    and removing files, this member persisting its own tables, losing and claiming partitions,
    states skipped between takes), after every take the files registered for each table this member
    does not own are exactly the state's, each once."""
    import itertools

    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    from iox_spark.catalog.chunk import Chunk
    from iox_spark.catalog.object_store import parquet_key
    from iox_spark.catalog.preserved_catalog import AddParquet
    from iox_spark.server.pool import membership as pool_admin

    tables = [T0, T1]  # Kafka partitions 0 and 1
    keys = ["2024-01-01", "2024-01-02"]
    step = st.one_of(
        st.tuples(st.just("add"), st.sampled_from(tables), st.sampled_from(keys), st.integers(1, 3)),
        st.tuples(st.just("remove"), st.sampled_from(tables), st.integers(0, 5)),
        st.tuples(st.just("move"), st.sampled_from([0, 1])),
        st.just(("take",)))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(step, max_size=30))
    # this member's own file of a table it then lost, removed by the new owner between two takes
    @example([("take",), ("add", T0, keys[0], 1), ("move", 0), ("remove", T0, 0), ("take",)])
    def check(steps):
        ids = itertools.count(1)
        pool, db, _ = _member({0}, {})
        cat = pool._catalog
        pool._ingestor = SimpleNamespace(refresh_table_view=lambda db, table: None)
        pool._store = pool._parquet_cache = None

        def register(spark, catalog, store, db_, f, now, cache):
            catalog.add_file(db_, f, Chunk(id=catalog.next_chunk_id(), table=f.table, partition_key=f.partition_key,
                                           order=catalog.next_order(), state="unloaded", rows=1, size_bytes=1,
                                           min_time_ns=0, max_time_ns=0, columns=[], view=None,
                                           parquet_keys=[f.key]))

        files: dict = {}
        revision = 0

        def state_now():
            return SimpleNamespace(revision=revision, files=dict(files), delete_predicates=[], table_schemas={})
        original = pool_admin.register_persisted_file
        pool_admin.register_persisted_file = register
        try:
            for s in steps:
                if s[0] == "add":
                    _, table, key, n = s
                    for _ in range(n):
                        i = next(ids)
                        f = AddParquet(key=parquet_key("d", table, key, f"00000000-0000-0000-0000-{i:012d}"),
                                       table=table, partition_key=key, row_count=1, size_bytes=1, min_time_ns=0,
                                       max_time_ns=0, min_seq=i, max_seq=i, schema=())
                        files[f.key] = f
                        if db.owns_table(table):  # this member's own persist registers its file
                            register(None, cat, None, db, f, 0.0, None)
                    revision += 1
                elif s[0] == "remove":
                    _, table, nth = s
                    mine = sorted(k for k, f in files.items() if f.table == table)
                    if mine:
                        k = mine[nth % len(mine)]
                        del files[k]
                        if db.owns_table(table):  # this member's own compaction drops its chunk
                            for part in db.partitions.get(table, {}).values():
                                part.drop_chunks([c for c in part.chunks if k in c.parquet_keys],
                                                 lambda f, k=k: f.key != k)
                        revision += 1
                elif s[0] == "move" and s[1] in db.owned_partitions:  # lost: held, then its rows dropped
                    db.lose_claim({s[1]})
                    pool._drop_unpersisted(db, {s[1]})
                elif s[0] == "move":  # claimed (a commit): as `_adopt`, rows dropped, the claimed state taken
                    revision += 1
                    pool._drop_unpersisted(db, {s[1]})
                    pool.take_state("d", state_now())
                    db.adopt_claim({s[1]: db.applied_hi_inclusive.get(s[1], -1) + 1})
                else:
                    pool.take_state("d", state_now())
                    for table in tables:
                        if db.owns_table(table):
                            continue
                        registered = sorted(k for part in db.partitions.get(table, {}).values()
                                            for c in part.chunks for k in c.parquet_keys)
                        listed = sorted(f.key for part in db.partitions.get(table, {}).values() for f in part.files)
                        expected = sorted(k for k, f in files.items() if f.table == table)
                        assert registered == listed == expected, (table, s)
        finally:
            pool_admin.register_persisted_file = original

    check()


def test_taking_states_adds_each_other_owners_delete_once_whatever_files_it_applies_to(monkeypatch):
    """A delete predicate of a table another member owns reaches this member's mailbox once: again
    in a later state (also applying to other files, after a compaction) it is the same delete; a
    new one is added; one of a table this member owns is its own (from its write buffer)."""
    import iox_spark.server.pool.membership as membership
    from iox_spark.catalog.preserved_catalog import AddDeletePredicate

    pool, db, _ = _member({0}, {})
    pool._ingestor = SimpleNamespace(refresh_table_view=lambda db, table: None)
    added = []
    monkeypatch.setattr(membership, "add_recorded_delete", lambda db_, dp: added.append((dp.table, dp.seq)))

    def state(revision, deletes):
        return SimpleNamespace(revision=revision, files={}, delete_predicates=deletes, table_schemas={})

    d1 = AddDeletePredicate(T1, 0, 10, (("host", "=", "a"),), 5, ("k1", "k2"))
    own = AddDeletePredicate(T0, 0, 10, (), 6, ("k3",))
    pool.take_state("d", state(1, [d1, own]))
    assert added == [(T1, 5)]
    compacted = AddDeletePredicate(T1, 0, 10, (("host", "=", "a"),), 5, ("k9",))  # the same delete
    d2 = AddDeletePredicate(T1, 0, 20, (), 7, ("k9",))
    pool.take_state("d", state(2, [compacted, own, d2]))
    assert added == [(T1, 5), (T1, 7)]
    pool.take_state("d", state(3, [compacted, own, d2]))
    assert added == [(T1, 5), (T1, 7)]
