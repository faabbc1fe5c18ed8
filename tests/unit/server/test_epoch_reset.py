"""server/epoch_reset.py: a database continuing in a new write-buffer epoch leaves nothing of its old
epoch's offsets behind in the ingestor, the replay, Kafka's ends, the message sizes, the acknowledged
offsets and the tail; other databases keep theirs."""
from __future__ import annotations

from types import SimpleNamespace

from iox_spark.server.epoch_reset import EpochReset


class _Recorder:
    def __init__(self, log: list, who: str):
        self._log, self._who = log, who

    def __getattr__(self, name):
        return lambda *args: self._log.append((self._who, name, *args))


def test_every_part_forgets_the_old_epoch_of_that_database_only():
    log: list = []
    ingestor = _Recorder(log, "ingestor")
    parts = [_Recorder(log, n) for n in ("replay", "ends", "sizes", "write_buffer", "tail")]
    db = SimpleNamespace(name="d", topic="iox.d")
    EpochReset(ingestor, *parts).forget(db)
    assert log == [("ingestor", "forget_topic", "iox.d"), ("ingestor", "poison_changed", db),
                   ("ingestor", "drop_row_filters", "d"),
                   ("replay", "forget", "iox.d"), ("ends", "forget", "iox.d"), ("sizes", "forget_topic", "iox.d"),
                   ("write_buffer", "forget_acked", "iox.d"), ("tail", "forget_topic", "iox.d")]
    log.clear()
    EpochReset(ingestor, *parts[:4], None).forget(db)  # no tail: nothing asked of it
    assert [who for who, *_ in log] == ["ingestor", "ingestor", "ingestor", "replay", "ends", "sizes", "write_buffer"]
