"""Restart safety checks: Kafka lost offsets the replay plan needs (refuse, or
--skip-lost-writes), a changed partition count, and bounded input reliance (the
resumption offsets are committed to the consumer group after each persist)."""
from __future__ import annotations

import dataclasses
import os
import uuid

import pytest

from iox_spark.server.runtime.broker import free_port, start_broker
from iox_spark.server.consume.recovery import LostWrites
from iox_spark.server.write_buffer.producer import PartitionCountMismatch, WriteBuffer
from tests.conftest import make_config, start_server
from tests.timestamps import T0


def test_lost_writes_refuse_to_start_unless_skipped_and_resumption_offsets_committed(iox_server, session_tmp):
    port = free_port()
    broker = start_broker(port)
    cfg = make_config(os.path.join(session_tmp, f"lost-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=2, lifecycle={"worker_backoff_ms": 3_600_000})
    db = f"l_{uuid.uuid4().hex[:6]}"
    srv, c = start_server(cfg)
    try:
        # cpu and mem share Kafka partition 0 (crc32); only cpu is persisted, so the
        # database checkpoint says mem's write must be replayed from Kafka
        c.wait_applied(db, c.write(db, f"cpu,host=a v=1 {T0}\n"), timeout_s=90)
        tok = c.write(db, f"mem,host=a v=2 {T0 + 1}\n")
        c.wait_applied(db, tok, timeout_s=90)
        r = c.persist(db, table="cpu")
        assert [p["table"] for p in r["persisted"]] == ["cpu"]
        (kp, off), = tok.items()
        assert kp == 0
        # bounded input reliance: the group's committed offsets are the replay start (mem's write)
        wb = WriteBuffer(broker.bootstrap, 2, 5000)
        try:
            committed = wb.committed_offsets(db, 2)
        finally:
            wb.close()  # else its producer reconnects to the stopped broker's port for the rest of the session
        assert committed.get(kp) == off
    finally:
        c.close()
        srv.stop()
    broker.stop()
    broker = start_broker(port)  # the in-memory broker lost every offset
    try:
        with pytest.raises(LostWrites) as ei:
            start_server(dataclasses.replace(cfg, grpc_port=0))
        assert ei.value.partition == kp and ei.value.from_offset == off
        assert "skip-lost-writes" in str(ei.value)
        srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, skip_lost_writes=True))
        try:
            st = c.status(db)["databases"][0]
            # partition 0's unpersisted write is a known range; partition 1 got no write this server
            # acknowledged (its ack log, server/write_buffer/ack_log.py): nothing of it was lost
            assert st["lost_writes_skipped"] == [
                {"partition": kp, "from_offset": off, "to_offset_exclusive": off + 1}]
            # what was persisted is still there; the lost write is gone; new writes work
            assert c.query(db, "SELECT v FROM cpu").to_pylist() == [{"v": 1.0}]
            assert c.query(db, "SHOW TABLES").num_rows >= 1
            c.wait_applied(db, c.write(db, f"cpu,host=b v=3 {T0}\n"), timeout_s=90)
            assert c.query(db, "SELECT host, v FROM cpu ORDER BY host").to_pylist() == [
                {"host": "a", "v": 1.0}, {"host": "b", "v": 3.0}]
        finally:
            c.close()
            srv.stop()
    finally:
        broker.stop()


def test_changed_partition_count_is_a_clear_error(iox_server, session_tmp):
    broker = start_broker()
    cfg = make_config(os.path.join(session_tmp, f"pc-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=2)
    try:
        srv, c = start_server(cfg)
        try:
            c.write("pcdb", f"cpu v=1 {T0}\n")
        finally:
            c.close()
            srv.stop()
        with pytest.raises(PartitionCountMismatch) as ei:
            start_server(dataclasses.replace(cfg, grpc_port=0, partitions=3))
        assert ei.value.expected == 3 and ei.value.actual == 2
    finally:
        broker.stop()


def test_topic_deleted_and_recreated_is_detected_by_topic_id(iox_server, session_tmp):
    """The database's topic is deleted and created again, and the new incarnation
    already holds more messages than the catalog's checkpoint: offsets alone look
    fine, only Kafka's topic id shows it is another topic.  The server refuses to
    start (naming the reason); with --skip-lost-writes it keeps what was persisted
    and reads the new topic from its start, without mixing in the old offsets."""
    from confluent_kafka.admin import AdminClient

    broker = start_broker()
    lifecycle = {"worker_backoff_ms": 3_600_000}
    cfg = make_config(os.path.join(session_tmp, f"rc-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=1, lifecycle=lifecycle)
    db = f"r_{uuid.uuid4().hex[:6]}"
    try:
        srv, c = start_server(cfg)
        try:
            c.wait_applied(db, c.write(db, f"cpu,host=a v=1 {T0}\n"), timeout_s=90)
            assert [p["table"] for p in c.persist(db)["persisted"]] == ["cpu"]
            tok = c.write(db, f"cpu,host=b v=2 {T0}\n")  # offset 1: only in Kafka
            c.wait_applied(db, tok, timeout_s=90)
            assert tok == {0: 1}
        finally:
            c.close()
            srv.stop()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([f"iox.{db}"])[f"iox.{db}"].result(timeout=30)
        # another server (own data dir) writes 4 points to the same database: the topic comes back
        other = make_config(os.path.join(session_tmp, f"rc2-{uuid.uuid4().hex[:6]}"), broker.bootstrap,
                            http_port=0, partitions=1, lifecycle=lifecycle)
        srv2, c2 = start_server(other)
        try:
            for i in range(4):
                c2.write(db, f"cpu,host=n{i} v={10 + i} {T0}\n")
        finally:
            c2.close()
            srv2.stop()
        with pytest.raises(LostWrites) as ei:
            start_server(dataclasses.replace(cfg, grpc_port=0))
        # the write at offset 1 came after the checkpoint; the server's ack log knows it was the last
        assert (ei.value.partition, ei.value.from_offset, ei.value.to_exclusive) == (0, 1, 2)
        assert "deleted and created again" in str(ei.value) and "[1, 2)" in str(ei.value)
        srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, skip_lost_writes=True))
        try:
            c.wait_caught_up(db, timeout_s=90)
            rows = c.query(db, "SELECT host, v FROM cpu ORDER BY host").to_pylist()
            assert rows == [{"host": "a", "v": 1.0}] + [{"host": f"n{i}", "v": 10.0 + i} for i in range(4)]
        finally:
            c.close()
            srv.stop()
    finally:
        broker.stop()


def test_a_pool_databases_topic_lost_before_its_first_persist_is_lost_writes_at_restart(iox_server, session_tmp):
    """An ingester pool's database: its first claim records the topic's id in the catalog, so a
    topic deleted before anything was persisted refuses the member's next start (LostWrites, the
    end unknown: other members may have acknowledged writes too), instead of a silent empty start;
    with --skip-lost-writes the member starts and takes writes again."""
    from confluent_kafka.admin import AdminClient

    broker = start_broker()
    cfg = make_config(os.path.join(session_tmp, f"pl-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=2, pool_member="ingester-a", lifecycle={"worker_backoff_ms": 3_600_000})
    db = f"p_{uuid.uuid4().hex[:6]}"
    try:
        srv, c = start_server(cfg)
        try:
            c.claim_partitions(db, [0, 1])
            tok = c.write(db, f"cpu,host=a v=1 {T0}\ncpu,host=b v=2 {T0 + 1}\n")
            c.wait_applied(db, tok, timeout_s=90)
            (kp, off), = tok.items()
            assert c.query(db, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 2}]
        finally:
            c.close()
            srv.stop()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics([f"iox.{db}"])[f"iox.{db}"].result(timeout=30)
        with pytest.raises(LostWrites) as ei:
            start_server(dataclasses.replace(cfg, grpc_port=0))
        assert (ei.value.partition, ei.value.from_offset, ei.value.to_exclusive) == (kp, 0, None)
        assert "no longer exists" in str(ei.value)
        srv, c = start_server(dataclasses.replace(cfg, grpc_port=0, skip_lost_writes=True))
        try:
            c.wait_applied(db, c.write(db, f"cpu,host=c v=3 {T0}\n"), timeout_s=90)
            assert c.query(db, "SELECT host, v FROM cpu").to_pylist() == [{"host": "c", "v": 3.0}]
        finally:
            c.close()
            srv.stop()
    finally:
        broker.stop()


def test_types_known_only_to_kafka_are_enforced_from_the_first_write_after_a_restart(iox_server, session_tmp):
    """A table whose rows were never persisted exists only in Kafka at restart; its column
    types are read from the replay range before the server takes writes, so a conflicting
    write is rejected at once, not only after replay applied the old rows."""
    import grpc

    broker = start_broker(free_port())
    cfg = make_config(os.path.join(session_tmp, f"types-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                      partitions=2)
    db = f"y_{uuid.uuid4().hex[:6]}"
    try:
        srv, c = start_server(cfg)
        try:
            c.wait_applied(db, c.write(db, f"only_kafka,host=a v=1.5,n=3i {T0}\nother,host=b s=\"x\" {T0}\n"),
                          timeout_s=90)
        finally:
            c.close()
            srv.stop()  # an external broker: nothing is persisted on stop
        srv, c = start_server(cfg)
        try:
            schemas = srv.catalog.database(db).schemas
            assert {(x.name, x.role, x.type) for x in schemas.get("only_kafka").columns} == \
                {("host", "tag", "string"), ("n", "field", "integer"), ("v", "field", "float"), ("time", "time", "time")}
            with pytest.raises(grpc.RpcError) as ei:
                c.write(db, f"only_kafka,host=a v=2i {T0 + 1}\n")
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "only_kafka" in ei.value.details() and "'v'" in ei.value.details(), ei.value.details()
            c.wait_caught_up(db, timeout_s=120)
            assert c.query(db, "SELECT host, v, n FROM only_kafka").to_pylist() == [{"host": "a", "v": 1.5, "n": 3}]
        finally:
            c.close()
            srv.stop()
    finally:
        broker.stop()
