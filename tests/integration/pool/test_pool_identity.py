"""An ingester pool's identity against a real broker (server/pool/identity.py): a member started on
another Kafka cluster (its own embedded broker) or with another object store is refused at once."""
from __future__ import annotations

import os
import time

import pytest

from iox_spark.catalog.object_store import object_store_from_url
from iox_spark.server.pool.identity import PoolIdentityMismatch, establish_pool_identity, read_anchor
from tests.crash.harness import ServerProcess, stop_embedded_broker


def test_a_member_on_another_kafka_cluster_or_object_store_is_refused(own_broker, tmp_path):
    store_dir = str(tmp_path / "objects")
    store = object_store_from_url(store_dir)
    # the pool's first member records the pool in the object store and in Kafka
    pool_id = establish_pool_identity(store, own_broker.bootstrap, "a", store_dir, 1, time.time())
    assert read_anchor(own_broker.bootstrap) == pool_id
    # a second member on the pool's broker and store joins it; nothing is announced again
    assert establish_pool_identity(store, own_broker.bootstrap, "b", store_dir, 1, time.time()) == pool_id
    # a member given another object store is refused, and nothing is recorded there
    other_dir = str(tmp_path / "other-objects")
    with pytest.raises(PoolIdentityMismatch) as e:
        establish_pool_identity(object_store_from_url(other_dir), own_broker.bootstrap, "c", other_dir, 1,
                                time.time())
    assert e.value.which == "object_store" and e.value.kafka_id == pool_id
    assert not os.path.exists(os.path.join(other_dir, "iox~pool"))

    # `iox serve --pool-member` without --kafka-bootstrap: an embedded broker of its own
    data_dir = str(tmp_path / "member-d")
    srv = ServerProcess(data_dir, extra=["--object-store", store_dir, "--pool-member", "d"])
    try:
        rc = srv.proc.wait(90)
        out = srv.tail(200_000)
    finally:
        srv.kill()
        stop_embedded_broker(data_dir)
    assert rc == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    assert pool_id in errors[0] and store_dir in errors[0] and "--kafka-bootstrap" in errors[0], errors[0]
    assert "Traceback" not in out and "SparkContext" not in out, out  # refused before Spark started
