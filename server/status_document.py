"""The status document: what `iox status` (GetStatus) answers about a running server.

Invariant: one consistent picture per database. Kafka's ends and the watermarks are read first,
outside the catalog lock (asking Kafka may take seconds); everything else of the databases is read
under it at one instant, so a status never shows a chunk twice or a file and the chunk it replaced.
Read only: building a status changes nothing but retiring replays that caught up
(server/replay_watch.py).

Who calls it: the management gRPC service (server/api/grpc_services.py) through `IoxServer.status`,
in handler threads (driver).
"""
from __future__ import annotations

import time

from iox_spark.catalog.catalog import DatabaseNotFoundError
from iox_spark.iox import management_pb2
from iox_spark.server.errors import DatabaseNotFound
from iox_spark.server.lost_writes_admin import lost_status
from iox_spark.server.poison_admin import poisoned_status
from iox_spark.server.retention_admin import fill_retention_status

__all__ = ["StatusDocument"]


class StatusDocument:
    """`catalog`: the in-memory catalog; `lifecycle`: the lifecycle worker (its preserved catalogs and
    fences); `freeze`: the FreezeControl; `replay`: the ReplayWatch; `watermarks(db)`: the
    PartitionWatermarks of a database (asks Kafka); `store`: the object store (the pool's member
    records); `pool_member`: this member's name, None outside a pool."""

    def __init__(self, catalog, lifecycle, freeze, replay, watermarks, store, pool_member: str | None):
        self._catalog = catalog
        self._lifecycle = lifecycle
        self._freeze = freeze
        self._replay = replay
        self._watermarks = watermarks
        self._store = store
        self._pool_member = pool_member

    def build(self, database: str = "", pool_members: bool = False) -> management_pb2.GetStatusResponse:
        """`iox status`: the databases (`database` only when given); with `pool_members` on a pool
        member, also every member's published address (read from the object store)."""
        if database:
            try:
                dbs = [self._catalog.database(database)]
            except DatabaseNotFoundError:
                raise DatabaseNotFound(database) from None
        else:
            dbs = self._catalog.databases()
        resp = management_pb2.GetStatusResponse()
        resp.freeze.CopyFrom(self._freeze.state())
        resp.pool_member = self._pool_member or ""
        if pool_members and self._pool_member is not None:
            from iox_spark.catalog.ownership import read_member_records

            for r in sorted(read_member_records(self._store), key=lambda r: r["member"]):
                resp.pool_members.add(member=r["member"], address=r["address"], host=r.get("host") or "",
                                      published_at_s=float(r.get("at_s") or 0.0))
        self._replay.any_replaying()  # retires finished replays
        marks = {db.name: self._watermarks(db) for db in dbs}  # asks Kafka: outside the catalog lock
        with self._catalog.lock:
            for db in dbs:
                pc = self._lifecycle.preserved.get(db.name) if self._lifecycle else None
                d = resp.databases.add(name=db.name, topic=db.topic, kafka_partitions=db.kafka_partitions,
                                       catalog_revision=pc.revision if pc is not None else -1,
                                       replaying=self._replay.replaying(db))
                d.epoch = db.epoch
                d.pending_transaction_parts = len(db.txns.pending)
                d.pinned_transactions = len(db.txns.pins)
                for r in sorted((r for r in db.lost_writes if r.accepted), key=lambda r: r.partition):
                    d.lost_writes_skipped.add(partition=r.partition, from_offset=r.from_offset,
                                              **({} if r.to_exclusive is None else
                                                 {"to_offset_exclusive": r.to_exclusive}))
                for kp, off in sorted(self._replay.targets(db.topic).items()):
                    d.replay_target.add(partition=kp, applied_hi_inclusive=off)
                d.replay_offsets_done, d.replay_offsets_todo = self._replay.progress(db)
                d.topic_replaced = db.topic_replaced
                fill_retention_status(d, db, time.time())
                if pc is not None:
                    for kp, o in sorted(pc.state.owners.items()):
                        d.owners.add(partition=kp, owner=o.owner, epoch=o.epoch)
                if db.owned_partitions is not None:
                    d.owned_partitions.extend(sorted(db.owned_partitions))
                fenced_revision = self._lifecycle.fenced_revision(db.name) if self._lifecycle else None
                if fenced_revision is not None:
                    d.fenced = True
                    d.fenced_revision = fenced_revision
                for r in db.lost_writes:
                    lost_status(d.lost_writes.add(), r)
                for r in sorted(db.poisoned, key=lambda r: (r.epoch, r.partition, r.offset)):
                    poisoned_status(d.poisoned.add(), db, r)
                for kp, (count, offset, reason) in sorted(db.skipped_messages.items()):
                    d.skipped_messages.add(partition=kp, count=count, last_offset=offset, last_reason=reason)
                for w in marks[db.name]:
                    d.write_buffer.add(partition=w.partition, applied_hi_inclusive=w.applied_hi_inclusive,
                                       visible_hi_inclusive=w.visible_hi_inclusive,
                                       persisted_hi_inclusive=w.persisted_hi_inclusive,
                                       high_watermark=w.high_watermark, lag_messages=w.lag_messages,
                                       lag_bytes=w.lag_bytes)
                for table in sorted(set(db.schemas.tables()) | set(db.partitions)):
                    t = d.tables.add(name=table)
                    sch = db.schemas.get(table)
                    for c in (sch.columns if sch else []):
                        t.columns.add(name=c.name, role=c.role, type=c.type)
                    for key in sorted(db.partitions.get(table, {})):
                        part = db.partitions[table][key]
                        p = t.partitions.add(key=key, unpersisted_rows=part.windows.unpersisted_row_count()
                                             if part.windows else 0)
                        for f in part.files:
                            p.files.add(key=f.key, rows=f.row_count, size_bytes=f.size_bytes,
                                        min_time_ns=f.min_time_ns, max_time_ns=f.max_time_ns)
                        if part.checkpoint is not None:
                            p.checkpoint.flush_timestamp_ns = part.checkpoint.flush_timestamp_ns
                            for kp, (lo, hi) in sorted(part.checkpoint.sequencer_numbers.items()):
                                p.checkpoint.offsets.add(partition=kp, min_unpersisted=-1 if lo is None else lo,
                                                         max_seen=hi)
                        for c in part.live_chunks():
                            p.chunks.add(id=c.id, state=c.state, rows=c.rows, size_bytes=c.size_bytes,
                                         min_time_ns=c.min_time_ns, max_time_ns=c.max_time_ns, storage=c.storage)
        return resp
