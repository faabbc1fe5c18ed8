"""The status document: what `iox status` (GetStatus) answers about a running server.

Invariant: one consistent picture per database. Kafka's ends and the watermarks are read first,
outside the catalog lock (asking Kafka may take seconds); everything else of a database is read
from its snapshot (`Database.snapshot`, catalog/database_snapshot.py), taken at one instant, so a
status never shows a chunk twice or a file and the chunk it replaced.
Read only: building a status changes nothing but retiring replays that caught up
(server/replay_watch.py).

Who calls it: the management gRPC service (server/api/grpc_services.py) through `ApiParts.status`
(server/api/api_parts.py), in handler threads (driver).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from iox_spark.catalog.catalog import DatabaseNotFoundError
from iox_spark.iox import management_pb2
from iox_spark.server.errors import DatabaseNotFound
from iox_spark.server.lost_writes_admin import lost_status
from iox_spark.server.poison_admin import poisoned_status
from iox_spark.server.retention_admin import fill_retention_status

if TYPE_CHECKING:
    from typing import Callable

    from iox_spark.catalog.catalog import Catalog, Database
    from iox_spark.catalog.object_store import ObjectStore
    from iox_spark.lifecycle.iceberg_publication import IcebergPublication
    from iox_spark.lifecycle.worker import LifecycleWorker
    from iox_spark.server.consume.watermarks import PartitionWatermarks
    from iox_spark.server.freeze_admin import FreezeControl
    from iox_spark.server.replay_watch import ReplayWatch

__all__ = ["StatusDocument"]


class StatusDocument:
    """`catalog`: the in-memory catalog; `lifecycle`: the lifecycle worker (its preserved catalogs and
    fences); `freeze`: the FreezeControl; `replay`: the ReplayWatch; `watermarks(db)`: the
    PartitionWatermarks of a database (asks Kafka); `store`: the object store (the pool's member
    records); `pool_member`: this member's name, None outside a pool; `iceberg`: the Iceberg
    publication, None when off."""

    def __init__(self, catalog: Catalog, lifecycle: LifecycleWorker, freeze: FreezeControl, replay: ReplayWatch,
                 watermarks: Callable[[Database], list[PartitionWatermarks]], store: ObjectStore,
                 pool_member: str | None, iceberg: IcebergPublication | None = None,
                 downsamplers: Callable[[str], list] | None = None):
        self._catalog = catalog
        self._lifecycle = lifecycle
        self._freeze = freeze
        self._replay = replay
        self._watermarks = watermarks
        self._store = store
        self._pool_member = pool_member
        self._iceberg = iceberg
        #: DownsamplerStatus of the downsamplers (of a database, when given): server/downsampling.py
        self._downsamplers = downsamplers

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
        now = time.time()
        for db in dbs:
            self._fill(resp.databases.add(), db, db.snapshot(), marks[db.name], now)
        if self._downsamplers is not None:
            resp.downsamplers.extend(self._downsamplers(database))
        return resp

    def _fill(self, d, db, snap, marks, now: float) -> None:
        """Fills the management_pb2.DatabaseStatus `d` of `db` from its snapshot `snap`
        (catalog/database_snapshot.py) and its watermarks `marks`."""
        pc = self._lifecycle.preserved.get(db.name) if self._lifecycle else None
        d.name, d.topic, d.kafka_partitions = snap.name, snap.topic, snap.kafka_partitions
        d.catalog_revision = pc.revision if pc is not None else -1
        d.replaying = self._replay.replaying(db)
        d.epoch = snap.epoch
        d.pending_transaction_parts = snap.pending_transaction_parts
        d.pinned_transactions = snap.pinned_transactions
        for r in sorted((r for r in snap.lost_writes if r.accepted), key=lambda r: r.partition):
            d.lost_writes_skipped.add(partition=r.partition, from_offset=r.from_offset,
                                      **({} if r.to_exclusive is None else {"to_offset_exclusive": r.to_exclusive}))
        for kp, off in sorted(self._replay.targets(snap.topic).items()):
            d.replay_target.add(partition=kp, applied_hi_inclusive=off)
        d.replay_offsets_done, d.replay_offsets_todo = self._replay.progress(db)
        d.topic_replaced = snap.topic_replaced
        fill_retention_status(d, snap, now)
        if pc is not None:
            for kp, o in sorted(pc.state.owners.items()):
                d.owners.add(partition=kp, owner=o.owner, epoch=o.epoch)
        if snap.owned_partitions is not None:
            d.owned_partitions.extend(sorted(snap.owned_partitions))
        if self._iceberg is not None:
            published = self._iceberg.publisher.published_revision(db.name)
            if published is not None:
                d.iceberg_published_revision = published
            d.iceberg_error = self._iceberg.failures().get(db.name, "")
        fenced_revision = self._lifecycle.fenced_revision(db.name) if self._lifecycle else None
        if fenced_revision is not None:
            d.fenced = True
            d.fenced_revision = fenced_revision
        for r in snap.lost_writes:
            lost_status(d.lost_writes.add(), r)
        for r in sorted(snap.poisoned, key=lambda r: (r.epoch, r.partition, r.offset)):
            poisoned_status(d.poisoned.add(), snap, r)
        for kp, (count, offset, reason) in sorted(snap.skipped_messages.items()):
            d.skipped_messages.add(partition=kp, count=count, last_offset=offset, last_reason=reason)
        for w in marks:
            d.write_buffer.add(partition=w.partition, applied_hi_inclusive=w.applied_hi_inclusive,
                               visible_hi_inclusive=w.visible_hi_inclusive,
                               persisted_hi_inclusive=w.persisted_hi_inclusive,
                               high_watermark=w.high_watermark, lag_messages=w.lag_messages, lag_bytes=w.lag_bytes)
        for table in snap.tables:
            t = d.tables.add(name=table.name)
            for c in table.columns:
                t.columns.add(name=c.name, role=c.role, type=c.type)
            for part in table.partitions:
                p = t.partitions.add(key=part.key, unpersisted_rows=part.unpersisted_rows)
                for f in part.files:
                    p.files.add(key=f.key, rows=f.row_count, size_bytes=f.size_bytes,
                                min_time_ns=f.min_time_ns, max_time_ns=f.max_time_ns)
                if part.checkpoint is not None:
                    p.checkpoint.flush_timestamp_ns = part.checkpoint.flush_timestamp_ns
                    for kp, (lo, hi) in sorted(part.checkpoint.sequencer_numbers.items()):
                        p.checkpoint.offsets.add(partition=kp, min_unpersisted=-1 if lo is None else lo, max_seen=hi)
                for c in part.chunks:
                    p.chunks.add(id=c.id, state=c.state, rows=c.rows, size_bytes=c.size_bytes,
                                 min_time_ns=c.min_time_ns, max_time_ns=c.max_time_ns, storage=c.storage)
