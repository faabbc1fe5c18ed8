"""The lifecycle's moves of a partition's chunks, seen from the catalog: persist, compaction in
memory and of persisted files, unload and retention pruning.

Each move claims what it works on, does its slow work (Spark, the object store, the preserved
catalog's commit) with no lock held, then either swaps its result in or gives the claim back.
Every step below happens at one instant under the catalog's lock, so a micro-batch or a query
sees a partition before a step or after it, never in between.

Invariant: a partition held by a move (`persisting` or `compacting`) is claimed by no other move
until that move's swap or give-back releases it; chunks claimed by a move stay in the partition
(and readable) until its swap replaces them.

Who calls: the lifecycle's actions and its worker (lifecycle/), on the driver. Nothing here reads
the clock: `now` is passed in.
"""
from __future__ import annotations

from typing import Callable, Iterable

from iox_spark.catalog.catalog import COMPACTING, PERSISTING, Catalog, Database, TablePartition
from iox_spark.catalog.checkpoint import PersistCheckpointBuilder, UnpersistedOffsets
from iox_spark.catalog.chunk import Chunk

__all__ = ["claim_to_unload", "mark_unloaded", "claim_to_compact", "claim_persisted_to_compact", "claim_to_persist",
           "give_back", "swap_compacted", "persist_checkpoints", "swap_persisted", "claim_to_prune", "drop_pruned",
           "checkpoint_without", "visit_owned_partitions", "partitions_of"]

#: chunk states a compaction in memory reads
_UNPERSISTED = ("open", "closed")


def claim_to_unload(catalog: Catalog, db: Database, table: str, key: str, chunk_id: int) -> tuple | None:
    """(chunk, its in-memory form) when chunk `chunk_id` is persisted and has files to read instead,
    else None."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part = catalog.get_partition(db, table, key)
        chunk = part.chunk(chunk_id) if part else None
        if chunk is None or chunk.state != "persisted" or not chunk.parquet_keys:
            return None
        return chunk, chunk.df


def mark_unloaded(catalog: Catalog, chunk: Chunk) -> None:
    """The chunk reads its Parquet files from now on (its view was re-pointed first)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        chunk.unload()


def claim_to_compact(catalog: Catalog, db: Database, table: str, key: str, chunk_ids: tuple | None,
                     to_read_buffer: bool) -> tuple[TablePartition, list] | None:
    """(partition, chunks) held for a compaction in memory of `chunk_ids` (None: every open or
    closed chunk), or None: the partition is busy or missing, a chunk named is gone or persisted,
    there are too few chunks (one is enough only `to_read_buffer`, when named), or they are not
    contiguous (another chunk of the partition sits between the first and the last)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part = catalog.get_partition(db, table, key)
        if part is None or part.persisting or part.compacting:
            return None
        live = part.live_chunks()
        if chunk_ids is None:
            chunks = [c for c in live if c.state in _UNPERSISTED]
        else:
            wanted = set(chunk_ids)
            chunks = [c for c in live if c.id in wanted]
            if len(chunks) != len(chunk_ids) or any(c.state not in _UNPERSISTED for c in chunks):
                return None
        if len(chunks) < (1 if to_read_buffer and chunk_ids is not None else 2):
            return None
        positions = [live.index(c) for c in chunks]
        if positions != list(range(positions[0], positions[0] + len(chunks))):
            return None
        part.hold_for(COMPACTING, chunks, "compacting")
        return part, chunks


def claim_persisted_to_compact(catalog: Catalog, db: Database, table: str, key: str, chunk_ids: tuple | None,
                               stored_states: tuple) -> tuple | None:
    """(partition, stored chunks, whether one has an in-memory form, the state the merged chunk
    takes) held for a compaction of persisted files, or None: the partition is busy or missing, a
    chunk named is gone, or fewer than two chunks in `stored_states` have files."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part = catalog.get_partition(db, table, key)
        if part is None or part.persisting or part.compacting:
            return None
        stored = [c for c in part.live_chunks() if c.state in stored_states and c.parquet_keys]
        if chunk_ids is not None:
            wanted = set(chunk_ids)
            stored = [c for c in stored if c.id in wanted]
            if len(stored) != len(wanted):
                return None
        if len(stored) < 2:
            return None
        in_memory = any(c.df is not None for c in stored)
        # "unloaded" only stays "unloaded": a chunk read from Parquet since its persist is "persisted"
        state = "persisted" if any(c.state == "persisted" for c in stored) else "unloaded"
        part.hold_for(COMPACTING)
        return part, stored, in_memory, state


def claim_to_persist(catalog: Catalog, db: Database, table: str, key: str, now: float, force: bool,
                     select: Callable[[TablePartition, int], list]) -> tuple | None:
    """(partition, flush handle, chunks) held for a persist, or None: the partition is busy, missing
    or has no windows, a failed micro-batch holds the database's persists (`failed_batch_hi`),
    nothing is due (`force`: flush everything), or `select(partition, flush_timestamp_ns)` chose
    no chunk (the handle is then given back)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part = catalog.get_partition(db, table, key)
        if part is None or part.windows is None or part.persisting or part.compacting or db.failed_batch_hi:
            return None
        handle = part.windows.flush_all_handle() if force else part.windows.flush_handle(now)
        if handle is None:
            return None
        chunk_ids = select(part, handle.timestamp_ns)
        if not chunk_ids:
            part.windows.abort(handle)
            return None
        chunks = [part.chunk(cid) for cid in chunk_ids]
        part.hold_for(PERSISTING, chunks, "persisting")
        return part, handle, chunks


def give_back(catalog: Catalog, part: TablePartition, action: str, chunks: Iterable[Chunk] = (),
              chunk_state: str | None = None, handle=None) -> None:
    """A move that failed or was abandoned releases its claim: its flush `handle` (a persist's) is
    aborted and its `chunks` return to `chunk_state`."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        if handle is not None:
            part.windows.abort(handle)
        part.release_from(action, chunks, chunk_state)


def swap_compacted(catalog: Catalog, db: Database, table: str, key: str, part: TablePartition, old: list,
                   new: list, hand_over_segments: bool = False, replaced_files: tuple | None = None) -> None:
    """A compaction's result replaces its inputs and the partition is free again. `hand_over_segments`:
    the inputs' segments now belong to the new chunk; `replaced_files` (old keys, added files): a
    compaction of persisted files, recorded in the partition's files."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        catalog.replace_chunks(db, table, key, [c.id for c in old], new)
        if replaced_files is not None:
            part.replace_files(*replaced_files)
        part.release_from(COMPACTING)
        if hand_over_segments:
            for c in old:
                c.hand_over_segments()


def persist_checkpoints(catalog: Catalog, db: Database, part: TablePartition, handle) -> tuple | None:
    """Right before a persist's commit: (applied offsets, the partition's checkpoint, the database's
    checkpoint, {kp: lowest offset whose rows stay unpersisted}), or None when a micro-batch failed
    while the persist ran (`failed_batch_hi`: the persist is abandoned).

    The applied offsets are read before the windows; every partition's unpersisted ranges are
    taken now, and for `part` what stays unpersisted after this flush (rows that reached it while
    the persist ran must replay)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        if db.failed_batch_hi:
            return None
        applied = dict(db.applied_hi_inclusive)
        builder = PersistCheckpointBuilder(handle.checkpoint())
        unpersisted_lo: dict = {}
        for parts in db.partitions.values():
            for other in parts.values():
                if other is part:
                    ranges = part.windows.offset_ranges_after_flush()
                elif other.windows is not None:
                    ranges = other.windows.offset_ranges()
                else:
                    continue
                builder.register_other_partition(ranges)
                for kp, r in ranges.items():
                    if r.min_unpersisted_offset is not None:
                        unpersisted_lo[kp] = min(unpersisted_lo.get(kp, r.min_unpersisted_offset),
                                                 r.min_unpersisted_offset)
        builder.register_other_partition({kp: UnpersistedOffsets(None, hi) for kp, hi in applied.items() if hi >= 0})
        # transaction parts without a marker, commit decisions whose parts elsewhere have none yet,
        # committed parts whose rows (at their marker's offset) may be unpersisted, and a micro-batch
        # half applied must be read again by a replay (Catalog.replay_pins)
        pins = catalog.replay_pins(db, unpersisted_lo)
        builder.register_other_partition({kp: UnpersistedOffsets(off, max(off, applied.get(kp, off)))
                                          for kp, off in pins.items()})
        part_ckpt, db_ckpt = builder.build()
        return applied, part_ckpt, db_ckpt, unpersisted_lo


def swap_persisted(catalog: Catalog, db: Database, table: str, key: str, part: TablePartition, handle, old: list,
                   new: list, files: list, checkpoint, unpersisted_lo: dict, applied: dict) -> None:
    """A committed persist: its flush handle is applied to the windows, the transaction parts it
    persisted are forgotten, its chunks replace the persisted ones, and the partition records its
    files and checkpoint (which frees it)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part.windows.flush(handle)
        db.txns.forget_persisted_parts(unpersisted_lo, applied)
        catalog.replace_chunks(db, table, key, [c.id for c in old], new)
        part.record_persist(files, checkpoint)


def claim_to_prune(catalog: Catalog, db: Database, table: str, key: str,
                   plan: Callable[[TablePartition, bool], object]) -> tuple | None:
    """(partition, what `plan(partition, unpersisted)` returned, whether it held unpersisted rows)
    with the partition held from persists and compactions while retention drops it, or None: it is
    missing or busy, or it holds unpersisted rows while a failed micro-batch holds persists. `plan`
    builds the drop's transaction at the same instant."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        part = db.partitions.get(table, {}).get(key)
        if part is None or part.persisting or part.compacting:
            return None
        unpersisted = part.windows is not None and not part.windows.is_empty()
        if unpersisted and db.failed_batch_hi:
            return None
        planned = plan(part, unpersisted)
        part.hold_for(PERSISTING)  # no persist or compaction of it while it is committed
        return part, planned, unpersisted


def drop_pruned(catalog: Catalog, db: Database, table: str, key: str, part: TablePartition,
                recorded_deletes: list) -> list:
    """A committed prune: the deletes its transaction recorded leave the mailbox and the partition
    leaves the database; returns its chunks (to retire)."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        db.deletes.mark_recorded(recorded_deletes)
        chunks = list(part.chunks)
        db.drop_partition(table, key, part)
        return chunks


def checkpoint_without(catalog: Catalog, db: Database, part: TablePartition) -> dict:
    """The database checkpoint's sequencer numbers ({kp: (min unpersisted or None, max seen)}) once
    `part` is dropped: the lowest unpersisted offset of every other partition, and the offsets
    replay must still read (`Catalog.replay_pins`), as a persist computes them."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        applied = {kp: hi for kp, hi in db.applied_hi_inclusive.items() if hi >= 0}
        lo: dict = {}
        for parts in db.partitions.values():
            for other in parts.values():
                if other is part or other.windows is None:
                    continue
                for kp, r in other.windows.offset_ranges().items():
                    if r.min_unpersisted_offset is not None:
                        lo[kp] = min(lo.get(kp, r.min_unpersisted_offset), r.min_unpersisted_offset)
        for kp, off in catalog.replay_pins(db, dict(lo)).items():
            lo[kp] = min(lo.get(kp, off), off)
        return {kp: (lo.get(kp), max(hi, lo.get(kp, hi))) for kp, hi in applied.items()}


def visit_owned_partitions(catalog: Catalog, db: Database, now: float | None,
                           visit: Callable[[str, str, TablePartition], object]) -> list:
    """[visit(table, key, partition)] for every partition of a table this server owns, all at one
    instant. `now` given: each partition's persistence windows rotate to it first."""
    out = []
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        for table, by_key in db.partitions.items():
            if not db.owns_table(table):
                continue  # another pool member's table: its owner persists and compacts it
            for key, part in by_key.items():
                if now is not None and part.windows is not None:
                    part.windows.rotate(now)
                out.append(visit(table, key, part))
    return out


def partitions_of(catalog: Catalog, db: Database, owned_only: bool = False) -> list:
    """[(table, key, busy)] of the database's partitions (`owned_only`: of the tables this server
    owns), sorted; busy: a persist or compaction holds it."""
    with catalog._lock:  # noqa: SLF001 - the catalog package's own lock
        return [(t, k, p.persisting or p.compacting) for t, by_key in sorted(db.partitions.items())
                if not owned_only or db.owns_table(t) for k, p in sorted(by_key.items())]
