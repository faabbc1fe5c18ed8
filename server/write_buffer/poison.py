"""Poisoned messages: a write-buffer message that fails its micro-batch on its own is set aside.

When it runs: `Ingestor.apply_batch` (server/consume/ingest.py) calls `isolate` when a
micro-batch failed, in the micro-batch's thread; the server's admin RPCs
(`iox poison retry|accept`) call `select` and the record helpers from gRPC threads
while no micro-batch runs (server/consume/consumer.py `restart`). Pure. The holds file
that keeps the streaming source from reading past a held message is
server/write_buffer/holds_file.py.

Why: a micro-batch is applied whole or not at all, and a failed one used to be
retried from its first offset, forever: one message that always fails (a payload
that passes the header checks but makes chunk building or a delete raise, a
format a newer server wrote) stopped ingestion for every database.

Invariants:
- `isolate` applies, per (database topic, Kafka partition), the longest prefix of
  the batch's messages that applies, and never a message after one that fails: a
  failing message is found by bisection (an attempt applies its messages for real
  or not at all), and is declared poisoned only after it failed twice on its own.
  Every other group of the batch is applied (a transient failure of a whole batch
  therefore ends with everything applied, nothing set aside).
- A HELD message's partition stops: its applied watermark stays at the offset
  before it, so nothing after it is applied out of order and persist checkpoints
  stay correct; the streaming source does not read that partition past it (the
  holds file, `holds_file.held_end`) and the consumer drops whatever of it a batch still
  brings. Every other partition and database goes on.
- Never silent: a set-aside message is logged, counted in /metrics and listed in
  `iox status` (topic, partition, offset, table, error, when) until it is retried
  (and applied) or accepted; an accepted one stays listed, marked accepted, and is
  recorded in the preserved catalog so a replay skips it too.

Not to be confused with the messages skipped as unreadable (`Database.skipped_messages`:
headers or payloads the server could never apply): those are skipped at once and counted.
"""
from __future__ import annotations

from iox_spark.catalog.catalog import HELD, Database, PoisonedMessage

__all__ = ["isolate", "first_failing", "set_aside", "select", "settle_retried", "MAX_ERROR_CHARS"]

#: error texts kept in a record (and in the preserved catalog) are cut to this many characters
MAX_ERROR_CHARS = 2000


def isolate(groups: list, attempt, failed: BaseException | None = None) -> list:
    """Finds the messages that fail on their own, applying everything else it can.

    ``groups``: one list per (topic, Kafka partition) of the batch's messages, in offset order;
    ``attempt(messages)`` applies ``messages`` (whole, in order) and returns None, or applies
    nothing and returns the exception; ``failed``: the exception of an attempt of every group
    together already made (None: it is made first). Groups are halved until a failing group is
    alone, then `first_failing` finds its message. Returns [(message, exception)]: at most one
    per group, every message before it applied, none after it.
    """
    found: list = []

    def solve(gs: list, err) -> None:
        if err is None:
            err = attempt([m for g in gs for m in g])
            if err is None:
                return
        if len(gs) > 1:
            mid = len(gs) // 2
            solve(gs[:mid], None)
            solve(gs[mid:], None)
            return
        hit = first_failing(gs[0], attempt, err, failed_alone=len(gs[0]) == 1)  # `err`: an attempt of just gs[0]
        if hit is not None:
            found.append(hit)

    groups = [list(g) for g in groups if g]
    if groups:
        solve(groups, failed)
    return found


def first_failing(messages: list, attempt, failed: BaseException | None, failed_alone: bool = False):
    """Applies the longest prefix of ``messages`` (offset order, one Kafka partition) that applies;
    returns (the first message that failed twice on its own, its exception), or None when all were
    applied. ``failed``: the exception of an attempt of all of them (None: not made yet);
    ``failed_alone``: that attempt was of the single message ``messages[0]``."""
    pending = list(messages)
    err = failed
    alone = failed_alone
    while pending:
        if err is None:
            err = attempt(pending)
            if err is None:
                return None
            alone = len(pending) == 1
        lo = pending
        while len(lo) > 1:  # bisect: `lo` fails; a first half that applies is kept
            half = lo[:len(lo) // 2]
            e = attempt(half)
            if e is None:
                pending = pending[len(half):]
                alone = False
                break  # the rest failed with it: `err` stays as its evidence
            lo, err, alone = half, e, len(half) == 1
        else:
            # `lo` is one message that failed, on its own (`alone`) or with messages after it
            failures = 1 if alone else 0
            while failures < 2:
                e = attempt(lo)
                if e is None:
                    break
                err, failures = e, failures + 1
            if failures >= 2:
                return lo[0], err
            pending = pending[1:]  # it applied after all (a transient failure)
            err, alone = None, False
    return None


def set_aside(db: Database, partition: int, offset: int, table: str, kind: str, error: str,
              now: float, catalog=None) -> PoisonedMessage:
    """Records that the message at (``partition``, ``offset``) of the database's current epoch
    failed on its own: a new HELD record, or the existing one (retried) HELD again with one more
    attempt and the latest error (cut to MAX_ERROR_CHARS; `Database.set_aside_poisoned`). With the
    database's ``catalog``, what failed attempts recorded from the offset on is forgotten at the
    same instant (`Catalog.set_aside_poisoned`)."""
    error = error[:MAX_ERROR_CHARS]
    if catalog is not None:
        return catalog.set_aside_poisoned(db, partition, offset, table, kind, error, now)
    return db.set_aside_poisoned(partition, offset, table, kind, error, now)


def select(db: Database, partition: int | None = None, offset: int | None = None, states=(HELD,)) -> list:
    """The database's records of the current epoch in ``states``, of ``partition`` (None: any) at
    ``offset`` (None: any), in (partition, offset) order (`Database.poisoned_of`)."""
    return db.poisoned_of(partition, offset, states)


def settle_retried(db: Database) -> list:
    """Drops the RETRYING records whose offset is applied now (the retry applied them); returns
    them (`Database.settle_retried`)."""
    return db.settle_retried()
