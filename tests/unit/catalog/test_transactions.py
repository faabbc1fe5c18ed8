"""TxnLog: a part's fate is the first decision or marker of its transaction after it on its own partition."""
from iox_spark.catalog.transactions import ABORT, COMMIT, DECISION, MARKER, PART, TxnLog, TxnRecord, TxnRepair


def part(kp, off, txn="t1", q=2, ts_ms=0):
    return TxnRecord(kp=kp, offset=off, kind=PART, txn=txn, ts_ms=ts_ms, coordinator_kp=q)


def decision(kp, off, parts, txn="t1", d=COMMIT):
    return TxnRecord(kp=kp, offset=off, kind=DECISION, txn=txn, decision=d, parts=tuple(parts))


def marker(kp, off, txn="t1", d=COMMIT):
    return TxnRecord(kp=kp, offset=off, kind=MARKER, txn=txn, decision=d)


def test_everything_in_one_batch_commits_each_part_at_its_marker():
    log = TxnLog()
    res = log.apply_batch([marker(0, 11), part(0, 10), part(2, 5), decision(2, 6, [(0, 10), (2, 5)])],
                          {0: 11, 2: 6}, now_s=100.0)
    assert res.commit == {(0, 10): 11, (2, 5): 6}
    assert res.abort == set()
    assert log.is_idle() and log.pinned_offsets() == {} and log.decisions == {}


def test_part_waits_for_its_marker_across_batches_and_pins_replay():
    log = TxnLog()
    res = log.apply_batch([part(0, 10), part(1, 3)], {0: 10, 1: 3}, now_s=1.0)
    assert res.commit == {} and log.pinned_offsets() == {0: 10, 1: 3}
    # the decision arrives (q = 1), the marker on 0 not yet: the decision is pinned too
    res = log.apply_batch([decision(1, 4, [(0, 10), (1, 3)], d=COMMIT)], {0: 10, 1: 4}, now_s=2.0)
    assert res.commit == {(1, 3): 4}
    assert log.pinned_offsets() == {0: 10, 1: 4}
    res = log.apply_batch([marker(0, 12)], {0: 12, 1: 4}, now_s=3.0)
    assert res.commit == {(0, 10): 12}
    assert log.is_idle() and log.pinned_offsets() == {}


def test_decision_before_the_part_is_read_pins_until_the_part_meets_its_marker():
    log = TxnLog()
    log.apply_batch([decision(2, 7, [(0, 10), (2, 6)])], {0: 9, 2: 7}, now_s=1.0)
    # (2, 6) is on the coordinator: the decision is its marker; (0, 10) is not read yet
    assert log.pins["t1"].waiting == {(0, 10)}
    assert log.pinned_offsets() == {2: 7}
    res = log.apply_batch([part(0, 10), marker(0, 11)], {0: 11, 2: 7}, now_s=2.0)
    assert res.commit == {(0, 10): 11}
    assert log.is_idle()


def test_abort_drops_parts_and_only_the_first_marker_counts():
    log = TxnLog()
    res = log.apply_batch([part(0, 1), part(3, 1, q=3), decision(3, 2, [], d=ABORT), marker(0, 2, d=ABORT),
                           marker(0, 3, d=COMMIT)], {0: 3, 3: 2}, now_s=1.0)
    assert res.commit == {} and res.abort == {(0, 1), (3, 1)}
    assert log.is_idle()


def test_a_later_decision_of_the_same_transaction_is_ignored():
    log = TxnLog()
    log.apply_batch([part(0, 1), decision(2, 5, [(0, 1)])], {0: 1, 2: 5}, now_s=1.0)
    log.apply_batch([decision(2, 6, [], d=ABORT)], {0: 1, 2: 6}, now_s=2.0)
    assert log.decisions["t1"][0] == COMMIT
    # the repair writes the first decision's marker, not the abort
    assert log.due_repairs(now_s=10.0, marker_repair_s=5.0) == [TxnRepair(MARKER, 0, "t1", COMMIT)]


def test_markers_only_resolve_parts_before_them_on_their_own_partition():
    log = TxnLog()
    res = log.apply_batch([marker(0, 5), part(0, 6), part(1, 2)], {0: 6, 1: 2}, now_s=1.0)
    assert res.commit == {} and set(log.pending) == {(0, 6), (1, 2)}


def test_repairs_abort_an_orphaned_part_after_the_timeout_then_write_its_markers():
    log = TxnLog()
    log.apply_batch([part(0, 4, q=2, ts_ms=1_000)], {0: 4}, now_s=1.0)
    assert log.due_repairs(now_s=30.0, txn_timeout_s=60.0) == []
    assert log.due_repairs(now_s=61.0, txn_timeout_s=60.0) == [TxnRepair(DECISION, 2, "t1", ABORT)]
    # not repeated before the repair interval
    assert log.due_repairs(now_s=62.0, txn_timeout_s=60.0, marker_repair_s=5.0) == []
    log.apply_batch([decision(2, 9, [], d=ABORT)], {0: 4, 2: 9}, now_s=63.0)
    assert log.due_repairs(now_s=63.5, txn_timeout_s=60.0) == [TxnRepair(MARKER, 0, "t1", ABORT)]
    res = log.apply_batch([marker(0, 5, d=ABORT)], {0: 5, 2: 9}, now_s=64.0)
    assert res.abort == {(0, 4)} and log.is_idle()
    assert log.due_repairs(now_s=200.0) == []


def test_a_committed_part_without_marker_gets_one_after_the_repair_delay():
    log = TxnLog()
    log.apply_batch([part(0, 4), part(2, 1), decision(2, 2, [(0, 4), (2, 1)])], {0: 4, 2: 2}, now_s=10.0)
    assert log.due_repairs(now_s=12.0, marker_repair_s=5.0) == []
    assert log.due_repairs(now_s=15.0, marker_repair_s=5.0) == [TxnRepair(MARKER, 0, "t1", COMMIT)]
    assert log.pinned_offsets() == {0: 4, 2: 2}


def test_transactions_are_independent():
    log = TxnLog()
    res = log.apply_batch([part(0, 1, txn="a"), part(0, 2, txn="b"), marker(0, 3, txn="b"),
                           marker(0, 4, txn="a", d=ABORT)], {0: 4}, now_s=1.0)
    assert res.commit == {(0, 2): 3} and res.abort == {(0, 1)}


def test_a_part_settled_in_an_earlier_batch_does_not_pin_a_later_decision():
    log = TxnLog()
    # the marker on 0 was read before the decision on 2 (q lagged behind under a per-partition cap)
    res = log.apply_batch([part(0, 4), marker(0, 5)], {0: 5}, now_s=1.0)
    assert res.commit == {(0, 4): 5}
    log.apply_batch([part(2, 8), decision(2, 9, [(0, 4), (2, 8)])], {0: 5, 2: 9}, now_s=2.0)
    assert log.pins == {} and log.is_idle() and log.pinned_offsets() == {}


def test_a_committed_part_pins_replay_until_its_rows_are_persisted():
    """Parts at 10 and 5 are applied at their marker's offsets 11 and 6: while rows at or after
    those offsets may be unpersisted, replay must start at the parts, not at the markers."""
    log = TxnLog()
    log.apply_batch([marker(0, 11), part(0, 10), part(2, 5), decision(2, 6, [(0, 10), (2, 5)])],
                    {0: 11, 2: 6}, now_s=100.0)
    assert log.pinned_offsets() == {}
    # the windows still hold rows from offset 11 on partition 0 and from 3 on partition 2
    assert log.applied_part_pins({0: 11, 2: 3}) == {0: 10, 2: 5}
    # partition 0's rows up to 11 persisted (unpersisted from 12), partition 2's all persisted
    assert log.applied_part_pins({0: 12}) == {}
    log.forget_persisted_parts({0: 12}, {0: 11, 2: 6})
    assert log.applied_parts == {}


def test_a_part_applied_after_the_checkpoint_was_built_is_not_forgotten():
    log = TxnLog()
    log.apply_batch([part(0, 20, q=0), decision(0, 21, [(0, 20)])], {0: 21}, now_s=1.0)
    log.forget_persisted_parts({}, {0: 19})  # built when 19 was applied: the part came later
    assert log.applied_part_pins({0: 21}) == {0: 20}


def test_a_pool_member_looks_up_a_decision_on_a_partition_it_does_not_read_and_repeats_it():
    """An ingester pool: partition 2 (the coordinator) is another member's, so its decision never
    reaches this TxnLog. Parts pending here long enough are listed for a lookup in Kafka; the first
    decision found there makes their markers due at once, commit or abort alike."""
    owned = frozenset({0}).__contains__
    log = TxnLog()
    log.apply_batch([part(0, 4, ts_ms=10_000), part(0, 7, txn="t2", ts_ms=11_000)], {0: 7}, now_s=11.0)
    assert log.undecided_elsewhere(now_s=12.0, reads_kp=owned, marker_repair_s=5.0) == []  # not old enough
    assert log.undecided_elsewhere(now_s=16.0, reads_kp=owned, marker_repair_s=5.0) == [
        ("t1", 2, 10_000), ("t2", 2, 11_000)]
    assert log.undecided_elsewhere(now_s=17.0, reads_kp=owned, marker_repair_s=5.0) == []  # once per interval
    # a member that reads the coordinator partition never looks up: the decision comes through its stream
    assert log.undecided_elsewhere(now_s=30.0, reads_kp=lambda kp: True, marker_repair_s=5.0) == []
    log.learn_decision("t1", COMMIT, now_s=17.0, marker_repair_s=5.0)
    log.learn_decision("t9", COMMIT, now_s=17.0)  # nothing of it pending here: ignored
    assert "t9" not in log.decisions
    assert log.due_repairs(now_s=17.0, txn_timeout_s=60.0, marker_repair_s=5.0) == [TxnRepair(MARKER, 0, "t1", COMMIT)]
    log.learn_decision("t1", ABORT, now_s=18.0)  # the first decision stays the one learned
    assert log.decisions["t1"][0] == COMMIT
    res = log.apply_batch([marker(0, 8)], {0: 8}, now_s=18.0)
    assert res.commit == {(0, 4): 8}
    assert log.undecided_elsewhere(now_s=30.0, reads_kp=owned, marker_repair_s=5.0) == [("t2", 2, 11_000)]


def test_a_learned_decision_survives_the_batch_copy_the_consumer_installs():
    """The consumer computes a batch on a copy of the TxnLog while the repair thread learns a
    decision on the installed one; the copy adopts it (and the repairs produced) when installed."""
    import copy

    installed = TxnLog()
    installed.apply_batch([part(0, 4, ts_ms=0)], {0: 4}, now_s=1.0)
    batch_copy = copy.deepcopy(installed)
    installed.learn_decision("t1", ABORT, now_s=10.0)
    installed.due_repairs(now_s=10.0)  # the abort marker is produced
    batch_copy.apply_batch([part(1, 3, txn="t2", q=1)], {0: 4, 1: 3}, now_s=10.5)
    batch_copy.adopt_repairs_of(installed)
    assert batch_copy.decisions["t1"][0] == ABORT
    assert batch_copy.due_repairs(now_s=11.0) == []  # not produced twice within the interval
