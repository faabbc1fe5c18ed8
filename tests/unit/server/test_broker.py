"""The embedded broker's start-time warning about the kernel's memory-map limit (server/broker.py)."""
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
