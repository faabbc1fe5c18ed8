"""The holds file: the offset of each Kafka partition that the streaming source must not read past.

Why a file: the consumer (driver) decides which messages are held (a poisoned message, a frozen
or fenced partition: `Database.held_offsets`), and the write-buffer source reads the file at
every trigger in the process Spark plans it in (server/write_buffer/kafka_source.py), which
shares nothing else with the driver. Kept apart from server/write_buffer/poison.py so that the
source's processes import neither the catalog nor pyarrow for it.

Invariants: the file is replaced atomically (a reader sees the old holds or the new ones, never
a part); a file that is missing or cannot be read means no holds (the consumer drops held
messages anyway); a micro-batch's range never ends past a held message (`held_end`).

Who calls it: `Ingestor` writes it (`holds_of`, `write_holds`, driver); the source reads it (`read_holds`, `held_end`), in Spark's Python processes.
Pure except the file; nothing here is pickled.
"""
from __future__ import annotations

import json
import os

__all__ = ["holds_of", "write_holds", "read_holds", "held_end"]


def holds_of(databases: list) -> dict:
    """{topic: {"<kp>": offset}} of every HELD message (the streaming source's holds file).
    Each database's holds are read at one instant (`Database.held_offsets`)."""
    out: dict = {}
    for db in databases:
        held = db.held_offsets()
        if held:
            out[db.topic] = {str(kp): off for kp, off in sorted(held.items())}
    return out


def write_holds(path: str, holds: dict) -> None:
    """Replaces the holds file atomically (the streaming source reads it at every trigger)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(holds, f, sort_keys=True)
    os.replace(tmp, path)


def read_holds(path: str) -> dict:
    """{topic: {"<kp>": offset}} from the holds file; {} when there is none (or it cannot be read:
    the consumer drops held messages anyway)."""
    if not path:
        return {}
    try:
        with open(path) as f:
            holds = json.load(f)
    except (OSError, ValueError):
        return {}
    return holds if isinstance(holds, dict) else {}


def held_end(start: int, end: int, hold: int | None) -> int:
    """The end (exclusive) of a micro-batch's range [start, end) of a Kafka partition whose
    message at ``hold`` is held (None: none): never past the held message, never before ``start``."""
    return end if hold is None else max(start, min(end, hold))
