"""The embedded broker (server/runtime/broker.py): the start-time warning about the kernel's memory-map limit, and how stop() signals it."""
from iox_spark.server.runtime.broker import MAP_COUNT_FOR_MEMORY_STORAGE, map_count_warning


def test_the_default_map_count_is_warned_of_with_the_command_that_raises_it():
    w = map_count_warning(65_530)
    assert w == ("vm.max_map_count is 65,530: the embedded in-memory broker keeps each message of ~128 KiB or "
                 "more in a memory map of its own and exits once it holds about 65,530 of them; raise the limit "
                 "(sysctl -w vm.max_map_count=262144) or use a Kafka cluster or s3:// storage for long runs")


def test_no_warning_from_the_recommended_count_or_when_it_cannot_be_read():
    assert map_count_warning(MAP_COUNT_FOR_MEMORY_STORAGE) is None
    assert map_count_warning(MAP_COUNT_FOR_MEMORY_STORAGE - 1) is not None
    assert map_count_warning(None) is None


def test_an_in_memory_broker_is_killed_at_once_a_durable_one_asked_to_stop(monkeypatch):
    """Tansu's graceful stop waits ~5 s for connected clients; an in-memory broker has nothing
    to flush, so stop() does not ask it. A broker on durable storage gets SIGTERM first."""
    import signal

    from iox_spark.server.runtime import broker

    sent = []
    monkeypatch.setattr(broker.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(broker, "process_alive", lambda pid: False)
    monkeypatch.setattr(broker, "_is_ours", lambda pid, start, binary=None: True)
    monkeypatch.setattr(broker, "_reap", lambda pid: None)
    broker.BrokerHandle(pid=11, port=1, storage=broker._storage_url("memory"), owned=True).stop()
    broker.BrokerHandle(pid=12, port=1, storage="sqlite://tansu.db", owned=True).stop()
    assert sent == [(11, signal.SIGKILL), (12, signal.SIGTERM)]


def test_a_durable_broker_is_asked_to_stop_before_its_store(monkeypatch):
    import signal

    from iox_spark.server.runtime import broker

    sent = []
    monkeypatch.setattr(broker.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(broker, "process_alive", lambda pid: False)
    monkeypatch.setattr(broker, "_is_ours", lambda pid, start, binary=None: True)
    monkeypatch.setattr(broker, "_reap", lambda pid: None)
    broker.BrokerHandle(pid=21, port=1, storage="s3://tansu/", owned=True, store_pid=22, store_port=2,
                        store_dir="/x").stop()
    assert sent == [(21, signal.SIGTERM), (22, signal.SIGTERM)]


def test_a_missing_store_names_the_fix(monkeypatch, tmp_path):
    import sys

    import pytest

    from iox_spark.server.runtime import broker

    monkeypatch.setenv("IOX_WEED", str(tmp_path / "nope"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(broker.BrokerStoreMissing, match="setup.sh installs it.*--broker-storage memory"):
        broker.object_server_binary()


def test_the_memory_broker_bounds_the_persist_age_and_a_durable_one_does_not():
    from iox_spark.server.runtime.broker import MEMORY_BROKER_MAX_PERSIST_AGE_S
    from iox_spark.server.config import InvalidConfig, ServerConfig

    import pytest

    assert ServerConfig(broker_storage="memory").lifecycle_rules().persist_age_threshold_s == \
        MEMORY_BROKER_MAX_PERSIST_AGE_S
    assert ServerConfig(broker_storage="memory", lifecycle={"persist_age_threshold_s": 5.0}) \
        .lifecycle_rules().persist_age_threshold_s == 5.0
    assert ServerConfig().broker_storage == "durable"  # the default: nothing to bound
    assert ServerConfig().lifecycle_rules().persist_age_threshold_s > MEMORY_BROKER_MAX_PERSIST_AGE_S
    assert ServerConfig(broker_storage="durable").lifecycle_rules().persist_age_threshold_s > \
        MEMORY_BROKER_MAX_PERSIST_AGE_S
    # an external Kafka cluster is not the embedded broker, whatever the option says
    assert ServerConfig(broker_storage="memory", kafka_bootstrap="k:9092").lifecycle_rules() \
        .persist_age_threshold_s > MEMORY_BROKER_MAX_PERSIST_AGE_S
    with pytest.raises(InvalidConfig, match="durable or memory"):
        ServerConfig(broker_storage="disk")


def test_a_recorded_pid_that_names_another_process_now_is_never_signalled(tmp_path):
    """broker.json of a run before a reboot: its pids now belong to other processes. A clean stop
    and a start on that data directory leave them alone (and the start runs a broker of its own)."""
    import json
    import subprocess
    import sys

    from iox_spark.server.runtime import broker

    other = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        # Until the child has exec'd, /proc/<pid>/cmdline names the parent (or nothing): wait for it.
        assert other.stdout.readline() == "up\n"
        start = broker.process_start(other.pid)
        assert start is not None and broker._is_ours(other.pid, start)
        assert not broker._is_ours(other.pid, start + 1)  # same pid, another process
        assert not broker._is_ours(other.pid, None, broker.broker_binary)  # an old record: not Tansu's command
        assert not broker._is_ours(other.pid, start, broker.broker_binary)  # its start, but not Tansu's command
        assert broker._is_ours(other.pid, start, lambda: sys.executable)  # both
        h = broker.BrokerHandle(pid=other.pid, port=1, storage=broker._storage_url("memory"), owned=True,
                                pid_start=start + 1, store_pid=other.pid, store_port=2, store_dir="/x",
                                store_pid_start=start + 7)
        h.stop()
        with open(tmp_path / "broker.json", "w") as f:
            json.dump({"pid": other.pid, "port": broker.free_port(), "storage": "memory://tansu/",
                       "store_pid": other.pid, "store_port": 1, "store_dir": str(tmp_path), "pid_start": start - 1,
                       "store_pid_start": None}, f)
        mine = broker.start_or_reuse(str(tmp_path), storage="memory")
        try:
            assert mine.pid != other.pid and mine.broker_is_ours() and mine.pid_start is not None
        finally:
            mine.stop()
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


def test_free_port_never_hands_one_port_out_twice(monkeypatch):
    """Callers ask for several ports before binding any; the same port may be drawn twice in a row,
    and one that is bound already is skipped."""
    import random

    from iox_spark.server.runtime import broker

    draws = iter([14001, 14001, 14002, 14001, 14999, 14003])
    bound = {14999}

    class _Sock:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            if addr[1] in bound:
                raise OSError("Address already in use")

    monkeypatch.setattr(broker, "_given_ports", set())
    monkeypatch.setattr(broker.socket, "socket", _Sock)
    monkeypatch.setattr(random, "randrange", lambda lo, hi: next(draws))
    assert [broker.free_port() for _ in range(3)] == [14001, 14002, 14003]


def test_free_ports_are_chosen_below_the_ephemeral_range():
    """A socket bound to port 0 (Spark's accumulator server, say) or a client socket's local port
    comes from the ephemeral range: a port chosen there could be taken before the server that was
    given it binds it, seconds later."""
    from iox_spark.server.runtime import broker

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports = [broker.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    if low >= 11000:  # room below it (Linux's default range starts at 32768)
        assert all(10000 <= p < low for p in ports), ports
    else:
        assert all(20000 <= p < 55000 for p in ports), ports


def test_the_stores_ports_are_chosen_below_the_ephemeral_range():
    """A client socket's local port comes from the ephemeral range: a store port chosen there could be
    taken between the check and the store's bind."""
    from iox_spark.server.runtime import broker

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    lo, hi = broker._pair_range()
    if low >= 21000:  # room below it (Linux's default range starts at 32768)
        assert (lo, hi) == (10000, low - 10000)
        p = broker._free_port_pair(set())
        assert lo <= p and p + 10000 < low
    else:
        assert (lo, hi) == (20000, 55000)


def test_a_store_that_exits_before_it_listens_starts_again_on_other_ports(monkeypatch):
    from iox_spark.server.runtime import broker

    tried = []

    def _start(store_dir, port, log_path):
        tried.append(port)
        if len(tried) < 3:
            raise broker._ProcessExited(f"the embedded broker's store (SeaweedFS) exited with code 1 ({port})")
        return "proc"

    monkeypatch.setattr(broker, "_start_store", _start)
    proc, port = broker._start_store_on_free_ports("/x", 0, None)
    assert proc == "proc" and port == tried[-1] and len(set(tried)) == 3

    tried.clear()
    monkeypatch.setattr(broker, "_STORE_START_ATTEMPTS", 2)
    import pytest

    with pytest.raises(broker._ProcessExited):
        broker._start_store_on_free_ports("/x", 0, None)
    assert len(tried) == 2
