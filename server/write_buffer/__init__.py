"""The write buffer: Kafka, on the way in and on the way out.

The producer (`producer.py`: one topic per database, idempotent, replaced when
stuck), the entry format of a Kafka message (`wire_format.py`), the Spark
streaming source that reads it back as micro-batches (`kafka_source.py`) and
when it asks the broker for a partition's end again (`end_polls.py`), Kafka's ends as status
reports them (`kafka_ends.py`); write tokens, where a write
landed (`write_token.py`); poisoned messages (`poison.py`), the holds file that keeps the source
from reading past a held message (`holds_file.py`) and frozen mode, where reading stops for the
whole server (`freeze.py`).

May import: `catalog`, `chunk_store`, `lifecycle`, `server.errors`, `server.metrics`.
"""
