"""server/consume/txn_repair.py: the task asks the ingestor for the due repairs through the write buffer
each round, a failing round (the broker away) does not end it, and it ends when the server stops."""
from __future__ import annotations

import threading

from iox_spark.server.consume.txn_repair import TransactionRepair


def test_rounds_go_on_after_a_failure_and_stop_with_the_server():
    stopped = threading.Event()
    rounds = []
    third = threading.Event()
    wb = object()

    class _Ingestor:
        def repair_transactions(self, write_buffer, now):
            rounds.append((write_buffer, now))
            if len(rounds) == 1:
                raise RuntimeError("broker away")
            if len(rounds) == 3:
                third.set()
            return 0

    task = TransactionRepair(_Ingestor(), wb, stopped, interval_s=0.01)
    thread = threading.Thread(target=task.run)
    thread.start()
    assert third.wait(10)
    stopped.set()
    thread.join(10)
    assert not thread.is_alive()
    assert len(rounds) >= 3 and all(w is wb and now > 0 for w, now in rounds)
