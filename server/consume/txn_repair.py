"""The transaction-repair task: the markers and abort decisions the databases' transaction logs ask for.

Invariant: a transaction's part left undecided (its producer died before the decision) gets an
abort decision, and a decision whose markers are missing gets them, always through the write
buffer, so that every server and every replay applies each part or skips it alike
(catalog/transactions.py; `Ingestor.repair_transactions` produces what is due).

When it runs: a daemon thread from `start` (the server's start) until the server's `stopped`
event is set, about once every `TXN_REPAIR_INTERVAL_S`. A failed round (the broker away) is
logged and retried on the next one; a stopping server is not an error. Driver only.
"""
from __future__ import annotations

import logging
import threading
import time

__all__ = ["TransactionRepair", "TXN_REPAIR_INTERVAL_S"]

#: How often the task looks for markers and aborts to write.
TXN_REPAIR_INTERVAL_S = 1.0

log = logging.getLogger(__name__)


class TransactionRepair:
    """Collaborators: the `ingestor` (Ingestor: `repair_transactions`), the `write_buffer` it produces
    through, and the server's `stopped` event."""

    def __init__(self, ingestor, write_buffer, stopped: threading.Event,
                 interval_s: float = TXN_REPAIR_INTERVAL_S):
        self._ingestor = ingestor
        self._write_buffer = write_buffer
        self._stopped = stopped
        self._interval_s = interval_s

    def start(self) -> "TransactionRepair":
        threading.Thread(target=self.run, name="txn-repair", daemon=True).start()
        return self

    def run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._ingestor.repair_transactions(self._write_buffer, time.time())
            except Exception as e:  # broker away: next round
                log.warning("transaction repair: %s", e)
