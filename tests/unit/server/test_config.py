"""ServerConfig validation and how `iox serve` reports a bad value."""
import pytest

from iox_spark.server.cli.main import main
from iox_spark.server.config import InvalidConfig, ServerConfig


def test_txn_timeout_must_leave_room_for_the_router_to_give_up_first():
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(txn_timeout_s=20.0, produce_timeout_ms=10_000)
    assert ei.value.field == "txn_timeout_s" and ei.value.actual == 20.0
    assert "25 s" in str(ei.value)
    assert ServerConfig(txn_timeout_s=8.0, produce_timeout_ms=1_000).txn_timeout_s == 8.0


def test_serve_rejects_a_too_short_txn_timeout_as_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--txn-timeout-s", "5"])
    assert ei.value.code == 2
    assert "--txn-timeout-s" in capsys.readouterr().err


@pytest.mark.parametrize("grace", [0, -1.0, "10"])
def test_tail_loss_grace_must_be_positive_seconds(grace, capsys):
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(tail_loss_grace_s=grace)
    assert ei.value.field == "tail_loss_grace_s"
    assert ServerConfig().tail_loss_grace_s == 30.0
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--tail-loss-grace-s", "0"])
    assert ei.value.code == 2 and "--tail-loss-grace-s" in capsys.readouterr().err


@pytest.mark.parametrize("nice", [-1, 20, True, 2.5])
def test_spark_nice_must_be_0_to_19(nice):
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(spark_nice=nice)
    assert ei.value.field == "spark_nice"
    assert ServerConfig(spark_nice=0).spark_nice == 0 and ServerConfig().spark_nice == 10


def test_lower_spark_priority_sets_every_thread_of_the_jvm_process():
    """Against a real child process standing in for the JVM (the function only needs its pid)."""
    import os
    import subprocess
    import sys
    import types

    from iox_spark.server.runtime.spark import lower_spark_priority

    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "for _ in range(3): threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
                              "print('up', flush=True); time.sleep(30)"], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        spark = types.SimpleNamespace(sparkContext=types.SimpleNamespace(
            _gateway=types.SimpleNamespace(proc=child)))
        assert lower_spark_priority(spark, 7) == 4
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) == 4
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tids} == {7}
        assert lower_spark_priority(spark, 0) == 0  # 0: off
        no_jvm = types.SimpleNamespace(sparkContext=types.SimpleNamespace(_gateway=None))
        assert lower_spark_priority(no_jvm, 7) == 0
    finally:
        child.kill()
        child.wait()


def test_spark_conf_options_reach_the_config_and_a_pair_without_equals_is_a_usage_error(capsys, monkeypatch):
    from iox_spark.server.cli.main import config_from_args, build_parser

    monkeypatch.setenv("IOX_SPARK_CONF", "spark.a=1;spark.b=x=y")
    a = build_parser().parse_args(["serve", "--spark-conf", "spark.c= 2", "--read-buffer-delay-s", "5",
                                   "--persisted-compaction-cold-s", "30"])
    cfg = config_from_args(a)
    assert cfg.extra_spark_conf == {"spark.a": "1", "spark.b": "x=y", "spark.c": " 2"}
    assert cfg.lifecycle["read_buffer_delay_s"] == 5.0
    assert cfg.lifecycle["persisted_compaction_cold_s"] == 30.0
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--spark-conf", "spark.nothing"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "--spark-conf" in err and "KEY=VALUE" in err


def test_the_query_engine_notes_every_table_a_query_names():
    from iox_spark.server.query.engine import tables_named

    tables = ["cpu", "cpu_total", "My-Table", "mem"]
    assert tables_named("SELECT * FROM cpu JOIN `my-table` USING (host)", tables) == ["cpu", "My-Table"]
    assert tables_named("select count(*) from CPU_TOTAL", tables) == ["cpu_total"]
    assert tables_named("SELECT 1", tables) == []


def test_log_levels_root_then_loggers():
    from iox_spark.server.cli.main import parse_log_levels

    assert parse_log_levels("WARNING,iox_spark.server.consume.ingest=debug, iox_spark.lifecycle = INFO") == (
        "WARNING", {"iox_spark.server.consume.ingest": "DEBUG", "iox_spark.lifecycle": "INFO"})
    assert parse_log_levels("info") == ("INFO", {})
    assert parse_log_levels("iox_spark.server.consume.ingest=DEBUG") == ("INFO", {"iox_spark.server.consume.ingest": "DEBUG"})


@pytest.mark.parametrize("bad", ["LOUD", "INFO,DEBUG", "=DEBUG", "INFO,x=LOUD"])
def test_log_levels_reject_bad_parts(bad):
    from iox_spark.server.cli.main import parse_log_levels

    with pytest.raises(ValueError):
        parse_log_levels(bad)


def test_tail_max_bytes_takes_sizes_and_zero_disables_it():
    from iox_spark.server.cli.main import config_from_args, build_parser

    assert config_from_args(build_parser().parse_args(["serve", "--tail-max-bytes", "64m"])).tail_max_bytes == 64 << 20
    assert config_from_args(build_parser().parse_args(["serve", "--tail-max-bytes", "0"])).tail_max_bytes == 0
    assert ServerConfig().tail_max_bytes == 256 << 20
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(tail_max_bytes=-1)
    assert ei.value.field == "tail_max_bytes"


def test_spark_threads_are_lowered_but_the_jvms_session_keeps_its_weight():
    """A child in a session of its own, standing in for the JVM: its threads get the nice value;
    its session's autogroup weight stays (a lower one let any busy process of the host starve
    Spark past the 10 s a Python worker has to connect back)."""
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    from iox_spark.server.runtime.spark import lower_spark_priority

    if not os.path.exists("/proc/self/autogroup"):
        pytest.fail("this test needs Linux autogroup scheduling (/proc/<pid>/autogroup)")
    cmd = [sys.executable, "-c", "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
                                 "print('up', flush=True); time.sleep(30)"]
    own = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert own.stdout.readline() == b"up\n"
        before = open(f"/proc/{own.pid}/autogroup").read().split()[-1]
        spark = SimpleNamespace(sparkContext=SimpleNamespace(_gateway=SimpleNamespace(proc=own)))
        assert lower_spark_priority(spark, 12) == 2
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{own.pid}/task")} == {12}
        assert open(f"/proc/{own.pid}/autogroup").read().split()[-1] == before == "0"
    finally:
        own.kill()
        own.wait()


@pytest.mark.parametrize("prio", [-1, 100, True, 1.5])
def test_write_path_rt_priority_must_be_0_to_99(prio):
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(write_path_rt_priority=prio)
    assert ei.value.field == "write_path_rt_priority"


def test_write_path_rt_priority_is_off_by_default_and_an_opt_in():
    from iox_spark.server.cli.main import config_from_args, build_parser

    assert ServerConfig().write_path_rt_priority == 0
    assert config_from_args(build_parser().parse_args(["serve"])).write_path_rt_priority == 0
    a = build_parser().parse_args(["serve", "--write-path-rt-priority", "1"])
    assert config_from_args(a).write_path_rt_priority == 1


def test_request_bounds_options():
    from iox_spark.server.cli.main import config_from_args, build_parser
    from iox_spark.server.config import (DEFAULT_GRPC_WORKERS, DEFAULT_HTTP_WORKERS, DEFAULT_MAX_CONCURRENT_RPCS,
                               DEFAULT_MAX_QUERY_BYTES, DEFAULT_MAX_QUERY_ROWS)

    c = config_from_args(build_parser().parse_args(["serve"]))
    assert (c.grpc_workers, c.max_concurrent_rpcs, c.http_workers, c.max_query_rows, c.max_query_bytes) == \
        (DEFAULT_GRPC_WORKERS, DEFAULT_MAX_CONCURRENT_RPCS, DEFAULT_HTTP_WORKERS, DEFAULT_MAX_QUERY_ROWS,
         DEFAULT_MAX_QUERY_BYTES)
    assert DEFAULT_MAX_QUERY_BYTES == 1 << 30 and DEFAULT_MAX_QUERY_ROWS == 0
    a = build_parser().parse_args(["serve", "--max-concurrent-rpcs", "3", "--http-workers", "2",
                                   "--max-query-rows", "10", "--max-query-bytes", "1m"])
    c = config_from_args(a)
    assert (c.max_concurrent_rpcs, c.http_workers, c.max_query_rows, c.max_query_bytes) == (3, 2, 10, 1 << 20)
    for bad in (dict(http_workers=0), dict(max_concurrent_rpcs=0), dict(max_query_bytes=-1)):
        with pytest.raises(InvalidConfig):
            ServerConfig(**bad)


@pytest.mark.parametrize("master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://k8s:443"])
def test_a_directory_object_store_with_a_cluster_master_is_refused_unless_shared(master, tmp_path):
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(spark_master=master, data_dir=str(tmp_path))
    assert ei.value.field == "object_store" and ei.value.actual == str(tmp_path / "objects")
    assert "--object-store-shared" in str(ei.value) and "s3://" in str(ei.value)
    assert ServerConfig(spark_master=master, data_dir=str(tmp_path), object_store_shared=True).object_store_shared
    assert ServerConfig(spark_master=master, object_store="s3://bucket/prefix").spark_master == master


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "LOCAL[4,3]"])
def test_a_directory_object_store_with_a_local_master_is_accepted(master, tmp_path):
    assert ServerConfig(spark_master=master, data_dir=str(tmp_path)).spark_master == master


def test_serve_reports_the_refused_directory_store_as_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--spark-master", "spark://127.0.0.1:7077", "--data-dir", str(tmp_path)])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "--object-store:" in err and "--object-store-shared" in err


@pytest.mark.parametrize("field, value", [("memory_limit_bytes", -1), ("memory_soft_fraction", 0),
                                          ("memory_soft_fraction", 1.5), ("memory_sample_interval_ms", 1),
                                          ("prune_delay_s", -1.0), ("prune_delay_s", float("inf"))])
def test_memory_and_retention_options_are_checked(field, value):
    with pytest.raises(InvalidConfig) as e:
        ServerConfig(**{field: value})
    assert e.value.field == field


def test_memory_and_retention_options_reach_the_config():
    from iox_spark.server.cli.main import config_from_args, build_parser

    a = build_parser().parse_args(["serve", "--memory-limit-bytes", "6g", "--memory-soft-fraction", "0.7",
                                   "--prune-delay-s", "60"])
    cfg = config_from_args(a)
    assert (cfg.memory_limit_bytes, cfg.memory_soft_fraction, cfg.prune_delay_s) == (6 << 30, 0.7, 60.0)
    assert ServerConfig().memory_limit_bytes == 0  # off by default


def test_a_role_other_than_all_needs_a_pool_member():
    from iox_spark.server.config import InvalidConfig, ServerConfig

    assert ServerConfig().role == "all"
    assert ServerConfig(pool_member="m", role="querier").role == "querier"
    with pytest.raises(InvalidConfig, match="set --pool-member"):
        ServerConfig(role="ingester")
    with pytest.raises(InvalidConfig, match="must be one of all, ingester, querier"):
        ServerConfig(pool_member="m", role="router")


def test_a_pool_on_s3_names_its_one_iceberg_catalog(tmp_path):
    """The default catalog is a SQLite file: a pool's members share it through a local object-store
    directory (lifecycle/iceberg_publication.py), not through S3, where each member would publish
    to a file of its own; there the start is refused, naming the option."""
    from iox_spark.catalog.object_store import LocalObjectStore
    from iox_spark.lifecycle.iceberg_publication import catalog_properties

    with pytest.raises(InvalidConfig, match="publish to one Iceberg catalog") as ei:
        ServerConfig(pool_member="m", object_store="s3://bucket/prefix")
    assert ei.value.field == "iceberg_catalog"
    for ok in ("off", "postgresql://db/iceberg", "https://catalog.example/api"):
        assert ServerConfig(pool_member="m", object_store="s3://bucket/prefix", iceberg_catalog=ok)
    assert ServerConfig(object_store="s3://bucket/prefix").iceberg_catalog == "sqlite"  # one server: its own
    # on a local object store, every member's default catalog is the one file in that directory
    store = LocalObjectStore(str(tmp_path / "objects"))
    a = catalog_properties("sqlite", str(tmp_path / "a"), store, pool=True)
    b = catalog_properties("sqlite", str(tmp_path / "b"), store, pool=True)
    assert a == b and a["uri"] == f"sqlite:///{tmp_path}/objects/iox~iceberg/iceberg-catalog.db"
    assert catalog_properties("sqlite", str(tmp_path / "a"), store)["uri"] == \
        f"sqlite:///{tmp_path}/a/iceberg-catalog.db"


@pytest.mark.parametrize("retention", [-1.0, float("nan")])
def test_the_broker_keeps_persisted_messages_zero_or_more_seconds(retention, capsys):
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(broker_persisted_retention_s=retention)
    assert ei.value.field == "broker_persisted_retention_s"
    assert ServerConfig().broker_persisted_retention_s == 0.0
    assert ServerConfig(broker_persisted_retention_s=float("inf")).broker_persisted_retention_s == float("inf")
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--broker-persisted-retention-s", "-5"])
    assert ei.value.code == 2 and "--broker-persisted-retention-s" in capsys.readouterr().err
