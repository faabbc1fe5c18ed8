"""server/metrics.py: what the registry renders after known observations (no server)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from iox_spark.server.metrics import WRITE_STAGE_BUCKETS_S, WRITE_STAGES, ServerMetrics


def _samples(m: ServerMetrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples}


def test_a_new_registry_lists_every_stage_with_zero_observations():
    s = _samples(ServerMetrics())
    for stage in WRITE_STAGES:
        assert s[("iox_write_stage_seconds_count", (("stage", stage),))] == 0
    assert s[("iox_write_requests_total", ())] == 0
    assert s[("iox_write_points_total", ())] == 0


def test_observations_land_in_their_buckets_and_acknowledgements_count_points():
    m = ServerMetrics()
    for sec in (0.0001, 0.004, 0.004, 0.2, 30.0):
        m.observe_stage("produce", sec)
    m.acknowledged(5000)
    m.acknowledged(1)
    s = _samples(m)
    bucket = {le: s[("iox_write_stage_seconds_bucket", (("le", le), ("stage", "produce")))]
              for le in [repr(float(b)) for b in WRITE_STAGE_BUCKETS_S] + ["+Inf"]}
    assert bucket["0.00025"] == 1 and bucket["0.002"] == 1 and bucket["0.005"] == 3
    assert bucket["0.1"] == 3 and bucket["0.25"] == 4 and bucket["10.0"] == 4 and bucket["+Inf"] == 5
    assert s[("iox_write_stage_seconds_count", (("stage", "produce"),))] == 5
    assert abs(s[("iox_write_stage_seconds_sum", (("stage", "produce"),))] - 30.2081) < 1e-9
    assert s[("iox_write_stage_seconds_count", (("stage", "parse"),))] == 0
    assert s[("iox_write_requests_total", ())] == 2
    assert s[("iox_write_points_total", ())] == 5001


def test_two_servers_in_one_process_keep_their_own_figures():
    a, b = ServerMetrics(), ServerMetrics()
    a.acknowledged(3)
    assert _samples(a)[("iox_write_points_total", ())] == 3
    assert _samples(b)[("iox_write_points_total", ())] == 0


def test_gc_pauses_are_counted_per_generation():
    m = ServerMetrics()
    m.observe_gc_pause(2, 0.03)
    m.observe_gc_pause(0, 0.0004)
    s = _samples(m)
    assert s[("iox_gc_pause_seconds_count", (("generation", "2"),))] == 1
    assert s[("iox_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.02")))] == 0
    assert s[("iox_gc_pause_seconds_bucket", (("generation", "2"), ("le", "0.05")))] == 1
    assert s[("iox_gc_pause_seconds_bucket", (("generation", "0"), ("le", "0.0005")))] == 1


def test_poisoned_messages_are_counted_and_the_held_ones_gauged_per_database():
    m = ServerMetrics()
    m.poisoned("a")
    m.poisoned("a")
    m.poisoned_held("a", 1)
    m.poisoned_held("b", 0)
    s = _samples(m)
    assert s[("iox_poisoned_messages_total", (("database", "a"),))] == 2
    assert s[("iox_poisoned_messages_held", (("database", "a"),))] == 1
    assert s[("iox_poisoned_messages_held", (("database", "b"),))] == 0


def test_watermarks_are_read_at_each_scrape_per_database_and_partition():
    from iox_spark.server.consume.watermarks import PartitionWatermarks

    m = ServerMetrics()
    marks = [("d", PartitionWatermarks(0, 9, 11, 4, 12, 2, 300))]
    m.watch_watermarks(lambda: marks)
    s = _samples(m)
    for name, value in (("applied_hi_inclusive", 9), ("visible_hi_inclusive", 11), ("persisted_hi_inclusive", 4),
                        ("high_watermark", 12)):
        assert s[("iox_watermark_offset", (("database", "d"), ("partition", "0"), ("watermark", name)))] == value
    assert s[("iox_write_buffer_lag_messages", (("database", "d"), ("partition", "0")))] == 2
    assert s[("iox_write_buffer_lag_bytes", (("database", "d"), ("partition", "0")))] == 300
    marks[0] = ("d", PartitionWatermarks(0, 12, 12, 12, 13, 0, 0))
    assert _samples(m)[("iox_write_buffer_lag_messages", (("database", "d"), ("partition", "0")))] == 0


def test_a_failing_watermark_read_leaves_the_other_metrics_served():
    m = ServerMetrics()
    m.watch_watermarks(lambda: 1 / 0)
    assert _samples(m)[("iox_write_requests_total", ())] == 0
