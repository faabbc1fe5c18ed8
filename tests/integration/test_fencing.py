"""One committer: two servers on the same object store and database; the one that loses the
race for the next catalog revision is fenced and stops (it never overwrites the winner)."""
from __future__ import annotations

import dataclasses
import os
import uuid

import grpc
import pytest

from server.broker import start_broker
from server.client import IoxClient
from tests.conftest import make_config
from tests.waiting import wait_for

T0 = 1_700_000_000_000_000_000


def test_second_committer_is_fenced_and_stops(iox_server, session_tmp):
    from server.app import IoxServer

    broker = start_broker()
    base = make_config(os.path.join(session_tmp, f"fence-{uuid.uuid4().hex[:6]}"), broker.bootstrap, http_port=0,
                       lifecycle={"worker_backoff_ms": 3_600_000})
    db = f"f_{uuid.uuid4().hex[:6]}"
    a = IoxServer(base)
    a.start()
    ca = IoxClient(f"127.0.0.1:{a.grpc_port}")
    ca.wait_applied(db, ca.write(db, f"cpu v=1 {T0}\n"), timeout_s=90)
    # B shares the object store (and the broker): it loads the catalog at the same revision as A
    b = IoxServer(dataclasses.replace(base, grpc_port=0, data_dir=base.data_dir + "-b",
                                      object_store=base.object_store_url))
    b.start()
    cb = IoxClient(f"127.0.0.1:{b.grpc_port}")
    try:
        cb.wait_caught_up(db)
        assert ca.persist(db)["persisted"][0]["revision"] == "1"
        with pytest.raises(grpc.RpcError):
            cb.persist(db)  # revision 1 exists: B lost the race
        assert b.lifecycle.fenced
        wait_for(b._stopped.is_set, 60, "the fenced server to stop")
        # A still owns the catalog and keeps committing
        ca.wait_applied(db, ca.write(db, f"cpu v=2 {T0 + 1}\n"), timeout_s=90)
        assert ca.persist(db)["persisted"][0]["revision"] == "2"
    finally:
        ca.close()
        cb.close()
        a.stop()
        b.stop()
        broker.stop()
