"""A write to a large partition that went idle is still applied (server/end_polls.py).

The streaming source asks the broker for such a partition's end only every
`DEFAULT_MAX_DELAY_S` once it stopped moving; a write arriving then must still
reach a micro-batch, once. Real broker, real server.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from server.end_polls import DEFAULT_BACKOFF_FROM_OFFSETS, DEFAULT_MAX_DELAY_S

T0 = 1_700_000_000_000_000_000


def test_a_write_to_a_large_idle_partition_is_applied_once(client, db):
    n = DEFAULT_BACKOFF_FROM_OFFSETS + 50  # one Kafka message (offset) per request
    with ThreadPoolExecutor(8) as ex:
        tokens = list(ex.map(lambda i: client.write(db, f"cpu,host=a v={i} {T0 + i}\n"), range(n)))
    for tok in tokens:
        client.wait_applied(db, tok, timeout_s=120)
    # the idle time is what is tested: the source backs off to its longest delay meanwhile
    time.sleep(3 * DEFAULT_MAX_DELAY_S)
    for host in ("b", "c"):
        tok = client.write(db, f"cpu,host={host} v=1 {T0}\n")
        client.wait_applied(db, tok, timeout_s=60)
        time.sleep(2 * DEFAULT_MAX_DELAY_S)
    rows = client.query(db, "SELECT host, count(*) AS n, sum(v) AS s FROM cpu GROUP BY host ORDER BY host").to_pylist()
    assert rows == [{"host": "a", "n": n, "s": float(sum(range(n)))},
                    {"host": "b", "n": 1, "s": 1.0}, {"host": "c", "n": 1, "s": 1.0}]
