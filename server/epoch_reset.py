"""What the server forgets of a database's old write-buffer epoch when it continues in a new one.

Invariant: once a database continues in a new epoch (its lost writes accepted, its topic replaced
or cut short: server/lost_writes_admin.py), nothing the server keeps by the old epoch's offsets
survives to be taken for the new one's: the ingestor's transaction stash and replay row filters,
the replay's targets, the cached Kafka ends, the mean message sizes, the acknowledged offsets and
the tail's rows of the topic. The catalog's own part is `Database.continue_in_epoch`.

When it runs: `forget`, from `LostWritesControl` while no micro-batch runs. Driver only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iox_spark.catalog.catalog import Database
    from iox_spark.server.consume.ingest import Ingestor
    from iox_spark.server.consume.watermarks import MessageSizes
    from iox_spark.server.query.tail import WriteBufferTail
    from iox_spark.server.replay_watch import ReplayWatch
    from iox_spark.server.write_buffer.kafka_ends import KafkaEnds
    from iox_spark.server.write_buffer.producer import WriteBuffer

__all__ = ["EpochReset"]


class EpochReset:
    """Collaborators: the `ingestor` (Ingestor), the `replay` (ReplayWatch), `kafka_ends` (KafkaEnds),
    `message_sizes` (MessageSizes), the `write_buffer` (WriteBuffer) and the `tail` (WriteBufferTail,
    or None when off)."""

    def __init__(self, ingestor: Ingestor, replay: ReplayWatch, kafka_ends: KafkaEnds, message_sizes: MessageSizes,
                 write_buffer: WriteBuffer, tail: WriteBufferTail | None):
        self._ingestor = ingestor
        self._replay = replay
        self._kafka_ends = kafka_ends
        self._message_sizes = message_sizes
        self._write_buffer = write_buffer
        self._tail = tail

    def forget(self, db: Database) -> None:
        """Forgets what is kept of `db`'s old epoch (see the module docstring)."""
        self._ingestor.forget_topic(db.topic)
        self._ingestor.poison_changed(db)
        self._ingestor.drop_row_filters(db.name)
        self._replay.forget(db.topic)
        self._kafka_ends.forget(db.topic)
        self._message_sizes.forget_topic(db.topic)
        self._write_buffer.forget_acked(db.topic)
        if self._tail is not None:
            self._tail.forget_topic(db.topic)
