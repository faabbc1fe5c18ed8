"""Frozen mode on a real server: `iox freeze` stops consuming where it is applied, persists
everything held and keeps answering queries for it; writes are still acknowledged and wait in the
write buffer; the freeze survives a restart; `iox unfreeze` applies exactly what waited; and
--freeze-at-percent freezes the server by itself."""
from __future__ import annotations

import dataclasses
import os
import uuid


from tests.conftest import make_config, start_server
from tests.waiting import wait_for
from tests.timestamps import T0, US
from tests.rows import values_and_times

#: Spark keeps microseconds: points a microsecond apart


def _rows(client, db: str) -> list:
    t = client.query(db, "SELECT host, v, time FROM cpu ORDER BY time")
    return [(host, v, time) for host, (v, time) in zip(t.column("host").to_pylist(), values_and_times(t))]


def _status(client, db: str) -> dict:
    return client.status(db)


def _unpersisted(client, db: str) -> int:
    d = _status(client, db)["databases"][0]
    return sum(p["unpersisted_rows"] for t in d["tables"] for p in t["partitions"])


def _files(client, db: str) -> int:
    d = _status(client, db)["databases"][0]
    return sum(len(p["files"]) for t in d["tables"] for p in t["partitions"])


def test_freeze_persist_restart_unfreeze_and_freeze_by_usage(own_broker, session_tmp):
    db = f"fz_{uuid.uuid4().hex[:8]}"
    # a broker of its own: on the session's, the server would first replay every database the
    # session wrote before it. Thresholds far away: only a frozen server persists here
    cfg = make_config(os.path.join(session_tmp, f"freeze-{uuid.uuid4().hex[:6]}"), own_broker.bootstrap, http_port=0,
                      lifecycle={"worker_backoff_ms": 200, "persist_row_threshold": 10_000_000,
                                 "persist_age_threshold_s": 3600.0, "late_arrive_window_s": 3600.0})
    srv, c = start_server(cfg)
    try:
        first = [f"cpu,host=a v={i} {T0 + i * US}" for i in range(3)]
        t1 = c.write(db, "\n".join(first))
        wait_for(lambda: c.applied(db).get(next(iter(t1)), -1) >= t1[next(iter(t1))], 30, "the write to be applied")
        assert _rows(c, db) == [("a", float(i), T0 + i * US) for i in range(3)]
        assert _unpersisted(c, db) == 3 and _files(c, db) == 0
        applied = c.applied(db)

        state = c.freeze("maintenance")
        assert state["frozen"] and state["reason"] == "maintenance"
        assert {int(k): v for k, v in state["offsets"][db]["hi_inclusive"].items()} == applied

        # acknowledged while frozen, not applied
        token = c.write(db, "cpu,host=b v=10 " + str(T0 + 10 * US))
        kp, off = next(iter(token.items()))
        assert off > applied[kp]
        # everything held is persisted, below every threshold
        wait_for(lambda: _unpersisted(c, db) == 0 and _files(c, db) >= 1, 60, "the frozen server to persist")
        high = wait_for(lambda: (lambda w: w if w["high_watermark"] > off else None)(
            next(w for w in _status(c, db)["databases"][0]["write_buffer"] if w["partition"] == kp)),
            30, "Kafka to report the write")
        assert high["applied_hi_inclusive"] == applied[kp]
        assert _rows(c, db) == [("a", float(i), T0 + i * US) for i in range(3)]
        assert c.status()["freeze"]["frozen"]
        # `iox persist` says what it cannot cover: every Kafka partition, frozen after what it applied
        skipped = c.persist(db)["skipped"]
        assert sorted(s["kafka_partition"] for s in skipped) == list(range(4))
        assert all(s["table"] == "" and s["reason"].startswith("frozen: its writes from offset") for s in skipped)
        assert f"from offset {applied[kp] + 1} on" in next(s["reason"] for s in skipped if s["kafka_partition"] == kp)
    finally:
        c.close()
        srv.stop()

    # a restart keeps the freeze: what was persisted is answered, the waiting write still is not
    srv, c = start_server(cfg)
    try:
        st = c.status()["freeze"]
        assert st["frozen"] and st["reason"] == "maintenance"
        c.wait_caught_up(db, 60)
        assert _rows(c, db) == [("a", float(i), T0 + i * US) for i in range(3)]
        assert c.applied(db)[kp] == applied[kp]

        assert not c.unfreeze()["frozen"]
        c.wait_visible(db, token, 60)
        assert _rows(c, db) == [("a", float(i), T0 + i * US) for i in range(3)] + [("b", 10.0, T0 + 10 * US)]
        assert not os.path.exists(os.path.join(cfg.abs_data_dir, "frozen.json"))
    finally:
        c.close()
        srv.stop()

    # any disk is fuller than 0.001 %: the server freezes by itself at its first usage sample
    usage_cfg = dataclasses.replace(cfg, freeze_at_percent=0.001)
    srv, c = start_server(usage_cfg)
    try:
        st = wait_for(lambda: (lambda f: f if f["frozen"] else None)(c.status()["freeze"]), 30,
                      "the server to freeze by usage")
        assert st["reason"].startswith(("disk ", "memory ")) and st["reason"].endswith(">= 0.001%")
        # it froze where it had applied the replay by then: held exactly there
        frozen_hi = {int(k): v for k, v in st["offsets"][db]["hi_inclusive"].items()}
        waiting = c.write(db, "cpu,host=c v=20 " + str(T0 + 20 * US))
        assert next(iter(waiting)) == kp
        wait_for(lambda: next(w for w in _status(c, db)["databases"][0]["write_buffer"]
                              if w["partition"] == kp)["high_watermark"] > waiting[kp], 30, "Kafka to report the write")
        assert c.applied(db) == frozen_hi
        expected = [("a", float(i), T0 + i * US) for i in range(3)] + ([("b", 10.0, T0 + 10 * US)] if frozen_hi[kp] >= off else [])
        assert _rows(c, db) == expected
    finally:
        c.close()
        srv.stop()
