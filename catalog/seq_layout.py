"""The ``_iox_seq`` layout: write-buffer order of rows and deletes, across any number of topic resets.

Invariant kept here: the ``_iox_seq`` of row ``row`` of the message a database
applies at Kafka offset ``offset`` is ``origin + (offset << SEQ_ROW_BITS) + row``
(a message holds at most ``2**SEQ_ROW_BITS`` rows of a table), where
``origin`` is the database's *seq origin* of its current write-buffer epoch:
the ``_iox_seq`` of row 0 of offset 0.  Every origin is a non-negative multiple
of ``2**SEQ_ROW_BITS``.  When the topic is found reset (offsets start over: a
new epoch), the new epoch's origin is :func:`next_seq_origin`, which orders
after every seq the preserved catalog knows, so seqs keep write-buffer order
over any number of resets: they grow by the offsets each epoch used, not by a
fixed span per epoch.  A seq that would not fit a signed 64-bit integer raises
:class:`~catalog.errors.SeqOverflow`, it never wraps.

The origin is recorded in the database checkpoint
(``RecordDatabaseCheckpoint.seq_origin``).  Checkpoints written before origins
were recorded laid seqs out as ``epoch << (SEQ_OFFSET_BITS + SEQ_ROW_BITS) |
offset << SEQ_ROW_BITS | row``: their origin is :func:`legacy_seq_origin`, so
their data keeps its order.  Only epochs up to :data:`LEGACY_MAX_EPOCH` fit
that layout; a legacy checkpoint of a later epoch (its seqs wrapped) continues
above every seq the catalog knows (:func:`current_seq_origin`).

Pure (no I/O, no Spark); used on the driver and on executors.
"""
from __future__ import annotations

from typing import Any

from iox_spark.catalog.errors import SeqOverflow

__all__ = [
    "LEGACY_MAX_EPOCH",
    "SEQ_MAX",
    "SEQ_OFFSET_BITS",
    "SEQ_ROWS_PER_OFFSET",
    "SEQ_ROW_BITS",
    "current_seq_origin",
    "legacy_seq_origin",
    "max_seq_offset",
    "next_seq_origin",
    "seq_base",
]

#: bits of the row in its message: a message holds at most 2**SEQ_ROW_BITS rows of one table
SEQ_ROW_BITS = 20
#: seqs one Kafka offset spans (its message's rows); every origin is a multiple of it
SEQ_ROWS_PER_OFFSET = 1 << SEQ_ROW_BITS
#: bits of the Kafka offset in the legacy layout (epoch above them); only legacy origins use it
SEQ_OFFSET_BITS = 35
#: the largest `_iox_seq` there is (a signed 64-bit integer: Arrow int64, Spark long)
SEQ_MAX = (1 << 63) - 1
#: the last epoch whose legacy origin leaves room for every offset of the legacy layout (255)
LEGACY_MAX_EPOCH = SEQ_MAX >> (SEQ_OFFSET_BITS + SEQ_ROW_BITS)


def legacy_seq_origin(epoch: int) -> int:
    """The seq origin of write-buffer epoch ``epoch`` in the legacy layout (``epoch << 55``).

    Raises ValueError for a negative epoch and SeqOverflow for one above LEGACY_MAX_EPOCH.
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if epoch > LEGACY_MAX_EPOCH:
        raise SeqOverflow(epoch << (SEQ_OFFSET_BITS + SEQ_ROW_BITS), None, SEQ_MAX)
    return epoch << (SEQ_OFFSET_BITS + SEQ_ROW_BITS)


def max_seq_offset(origin: int) -> int:
    """The largest Kafka offset every seq of whose message fits from ``origin`` (-1: none does)."""
    return max(-1, (SEQ_MAX - (SEQ_ROWS_PER_OFFSET - 1) - origin) >> SEQ_ROW_BITS)


def seq_base(origin: int, offset: int) -> int:
    """The ``_iox_seq`` of row 0 of the message applied at ``offset``, in the epoch of seq origin ``origin``.

    Raises SeqOverflow unless the seqs of every row the message may hold
    (``2**SEQ_ROW_BITS``) fit a signed 64-bit integer, and ValueError for a
    negative origin or offset.
    """
    if origin < 0 or offset < 0:
        raise ValueError(f"seq origin and offset must be >= 0, got {origin} and {offset}")
    base = origin + (offset << SEQ_ROW_BITS)
    if base > SEQ_MAX - (SEQ_ROWS_PER_OFFSET - 1):
        raise SeqOverflow(origin, offset, SEQ_MAX)
    return base


def current_seq_origin(state: Any) -> tuple[int, bool]:
    """The seq origin of the write-buffer epoch of ``state``'s database checkpoint, and whether it
    must be recorded before a seq is computed from it.

    ``state``: a ``CatalogState``.  Its checkpoint's ``seq_origin`` when recorded; 0 without a
    checkpoint; for a legacy checkpoint (no ``seq_origin``) :func:`legacy_seq_origin` of its
    epoch, or, past LEGACY_MAX_EPOCH (the legacy layout wrapped there), ``next_seq_origin(state,
    None)`` — which depends on the state, so it must be recorded (True) to stay the epoch's origin.
    """
    ck = state.database_checkpoint
    if ck is None:
        return 0, False
    if ck.seq_origin is not None:
        return ck.seq_origin, False
    if ck.epoch <= LEGACY_MAX_EPOCH:
        return legacy_seq_origin(ck.epoch), False
    return next_seq_origin(state, None), True


def next_seq_origin(state: Any, origin: int | None) -> int:
    """The seq origin of a new write-buffer epoch after the current one of ``state``, whose origin is
    ``origin`` (None: unknown, a legacy epoch past LEGACY_MAX_EPOCH).

    ``state``: a ``CatalogState`` in which every write of the current epoch is persisted or
    given up.  The result is the smallest non-negative multiple of 2**SEQ_ROW_BITS above every
    seq the state knows: the registered files' ``max_seq``, the recorded delete predicates'
    ``seq``, ``origin`` itself and the seqs of every offset up to the largest one the database
    checkpoint and the current epoch's partition checkpoints saw.  Raises SeqOverflow when not
    even offset 0 fits from there.
    """
    ck = state.database_checkpoint
    epoch = ck.epoch if ck is not None else 0
    above = [s.max_seq + 1 for s in state.files.values()]
    above += [d.seq + 1 for d in state.delete_predicates]
    if origin is not None:
        seen = [hi for _lo, hi in ck.sequencer_numbers.values()] if ck is not None else []
        seen += [hi for p in state.partition_checkpoints.values() if p.epoch == epoch
                 for _lo, hi in p.sequencer_numbers.values()]
        above.append(origin + 1)
        if seen:
            above.append(origin + ((max(seen) + 1) << SEQ_ROW_BITS))
    top = max(above, default=0)
    new = max(0, -(-top // SEQ_ROWS_PER_OFFSET) * SEQ_ROWS_PER_OFFSET)
    if max_seq_offset(new) < 0:
        raise SeqOverflow(new, None, SEQ_MAX)
    return new
