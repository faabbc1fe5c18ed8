"""Pure logic of the benchmark harness (bench/): no server, no Spark, no speed asserted."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy")

from bench import harness  # noqa: E402
from bench.__main__ import SCENARIOS, SIZES  # noqa: E402


def test_ratio_and_row_json_have_the_required_fields():
    r = harness.Row("x", "points/s", 200.0, "base", 100.0, target=">= 1.0x", met=True, size="1k", note="n")
    d = r.to_json()
    for k in ("name", "unit", "ours", "baseline_name", "baseline", "ratio", "target", "met"):
        assert k in d
    assert d["ratio"] == 2.0
    json.dumps(d)


def test_ratio_missing_or_zero_baseline_is_none():
    assert harness.ratio(1.0, None) is None
    assert harness.ratio(None, 1.0) is None
    assert harness.ratio(1.0, 0) is None


def test_percentile():
    assert harness.percentile([], 99) is None
    assert harness.percentile([1, 2, 3, 4, 5], 50) == 3
    assert harness.percentile(list(range(101)), 99) == pytest.approx(99)


def test_markdown_table_marks_missed_targets():
    rows = [harness.Row("a", "s", 3.0, "b", 1.0, target="<= 1.2x", met=False).to_json(),
            harness.Row("c", "s", 1.0, target="report", met=True).to_json()]
    md = harness.markdown_table(rows, {"cores": 2, "memory_gib": 1, "cpu_model": "cpu"}, "quick", "now")
    assert "| a | s |" in md and "**no**" in md
    assert md.count("\n") == 5


def test_line_protocol_generator_parses_back_exactly():
    from iox_spark.server.write.line_protocol import parse_lines

    t = harness.gen_table(1000, seed=1, t0_ns=1_700_000_000_000_000_000)
    r = parse_lines(harness.to_line_protocol("cpu", t))
    assert not r.errors
    got = r.tables["cpu"].data
    assert got.num_rows == 1000
    assert got.column("time").to_pylist() == t.column("time").to_pylist()
    assert got.column("host").to_pylist() == t.column("host").to_pylist()
    assert got.column("requests").to_pylist() == t.column("requests").to_pylist()


def test_tables_on_distinct_partitions_cover_every_partition():
    from iox_spark.catalog.sharding import partition_for

    names = harness.tables_on_distinct_partitions("t", 4)
    assert sorted(partition_for(n, 4) for n in names) == [0, 1, 2, 3]


def test_quick_sizes_are_not_larger_than_full():
    for k, v in SIZES["quick"].items():
        if isinstance(v, (int, float)) and k not in ("e2e_persist_row_threshold",
                                                     "probe_interval_s", "clients"):
            assert v <= SIZES["full"][k], k
    assert SIZES["full"]["query_points"] == 10_000_000
    assert SIZES["full"]["restart_points"] == 2_000_000
    assert SIZES["full"]["e2e_s"] >= 60
    assert set(SCENARIOS) == {"parse", "e2e", "restart", "write", "latency", "query", "overload", "pool", "pool_refresh",
                              "downsample"}
    assert SIZES["full"]["pool_refresh_files"] == 10_000 and SIZES["full"]["pool_refresh_deletes"] == 1_000


def test_distinct_cycle_makes_every_resend_new_points():
    from bench.harness import distinct_cycle
    from iox_spark.server.write.line_protocol import parse_lines

    body = b"cpu,host=a,region=x v=1 10\ncpu,host=b,region=x v=2 10\n"
    assert distinct_cycle(body, 0) == body
    keys = set()
    for c in range(3):
        t = parse_lines(distinct_cycle(body, c)).tables["cpu"].data
        keys |= set(zip(t.column("host").to_pylist(), t.column("time").to_pylist()))
    assert len(keys) == 6  # 2 points x 3 cycles, none repeated


def test_stage_percentiles_are_the_bucket_bounds_of_the_requests_between_two_scrapes():
    inf = float("inf")
    before = {"produce": {0.001: 5.0, 0.01: 5.0, 0.05: 5.0, inf: 5.0}, "parse": {0.001: 2.0, inf: 2.0}}
    # 100 new produce observations: 60 <= 1 ms, 39 in (1, 10] ms, 1 in (10, 50] ms; no new parse
    after = {"produce": {0.001: 65.0, 0.01: 104.0, 0.05: 105.0, inf: 105.0}, "parse": {0.001: 2.0, inf: 2.0}}
    assert harness.stage_percentiles_ms(before, after) == {"produce": (100, [1.0, 10.0])}
    assert harness.stage_percentiles_ms(before, after, ps=(99.5, 100)) == {"produce": (100, [50.0, 50.0])}
    assert harness.stage_percentiles_ms({}, {"encode": {0.002: 0.0, inf: 3.0}}) == {"encode": (3, [inf, inf])}


def test_memory_row_has_no_figure_when_the_rss_did_not_grow():
    from bench.scenarios.query_latency import memory_per_point_row

    grew = memory_per_point_row(4 * 2**30, 4 * 2**30 + 790_000_000, 10_000_000, 550_000_000, "10M", 12.0)
    assert grew.ours == 79.0 and grew.met and "catalog estimate 55 B/point" in grew.note
    shrank = memory_per_point_row(12 * 2**30, 12 * 2**30 - 6_737_100_800, 10_000_000, 550_000_000, "10M", 12.0)
    assert shrank.ours is None and not shrank.met
    assert shrank.note.startswith("no figure") and "-6,425 MiB" in shrank.note
    assert shrank.to_json()["ours"] is None and shrank.extra["rss_after"] < shrank.extra["rss_before"]


def test_realtime_clients_raise_this_process_while_entered_and_put_it_back():
    """The latency loads' writers: every thread of the bench's process under SCHED_RR while entered,
    threads started meanwhile included, and all back under the normal policy on exit."""
    import os
    import threading

    def policies():
        return {os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}

    assert policies() == {os.SCHED_OTHER}
    seen = []
    with harness.RealtimeClients(2) as rt:
        assert rt.raised, "this machine must allow SCHED_RR (root or CAP_SYS_NICE)"
        assert policies() == {os.SCHED_RR} and os.sched_getparam(0).sched_priority == 2
        t = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
        t.start()
        t.join()
    assert seen == [os.SCHED_RR]
    assert policies() == {os.SCHED_OTHER}


def test_cluster_server_args_declare_the_bench_directory_shared_unless_an_object_store_is_named():
    from bench.__main__ import cluster_server_args

    assert cluster_server_args("spark://h:7077", []) == ["--spark-master", "spark://h:7077", "--object-store-shared"]
    assert cluster_server_args("spark://h:7077", ["--object-store=s3://b/p"]) == ["--spark-master", "spark://h:7077"]
    assert cluster_server_args("spark://h:7077", ["--object-store", "s3://b/p"]) == ["--spark-master", "spark://h:7077"]


def test_paced_clients_send_each_batch_once_and_count_tokens_and_failures():
    sent = []

    def connect(k):
        def send(body):
            sent.append((k, body))
            if body == b"b3":
                raise harness.SendFailed("UNAVAILABLE")
            return {k: len(sent)}

        return send, lambda: None

    st = harness.run_paced(connect, [b"b0", b"b1", b"b2", b"b3"], clients=2, duration_s=30,
                           rate_points_per_s=None, points_per_batch=10, stats=harness.WriteStats(), once=True,
                           cycle_base=0)
    assert sorted(sent) == [(0, b"b0"), (0, b"b2"), (1, b"b1"), (1, b"b3")]
    assert (st.requests, st.points, st.offered_points, st.errors) == (3, 30, 40, {"UNAVAILABLE": 1})
    assert len(st.latencies_s) == 3 and set(st.token) == {0, 1}

