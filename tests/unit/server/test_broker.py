"""The embedded broker (server/broker.py): the start-time warning about the kernel's memory-map limit, and how stop() signals it."""
from server.broker import MAP_COUNT_FOR_MEMORY_STORAGE, map_count_warning


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

    from server import broker

    sent = []
    monkeypatch.setattr(broker.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(broker, "_alive", lambda pid: False)
    monkeypatch.setattr(broker, "_reap", lambda pid: None)
    broker.BrokerHandle(pid=11, port=1, storage=broker._storage_url("memory"), owned=True).stop()
    broker.BrokerHandle(pid=12, port=1, storage="sqlite://tansu.db", owned=True).stop()
    assert sent == [(11, signal.SIGKILL), (12, signal.SIGTERM)]
