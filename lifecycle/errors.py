"""Errors of the lifecycle package.

Invariant kept here: every error the lifecycle package raises on purpose
derives from :class:`LifecycleError` and has one class per cause, carrying the
cause's data as attributes (never only a message).
"""

from __future__ import annotations

__all__ = [
    "LifecycleError",
    "InvalidLifecycleRule",
    "InvalidLifecycleState",
    "IcebergPublicationFailed",
]


class LifecycleError(Exception):
    """Root of all lifecycle errors."""


# --- rules and policy (lifecycle/rules.py, lifecycle/policy.py)


class InvalidLifecycleRule(LifecycleError):
    """A lifecycle rule has a value outside its domain."""

    def __init__(self, rule: str, value: object, reason: str) -> None:
        self.rule = rule
        self.value = value
        self.reason = reason
        super().__init__(f"invalid lifecycle rule {rule}={value!r}: {reason}")


class InvalidLifecycleState(LifecycleError):
    """A state snapshot handed to the policy is malformed (e.g. an unknown chunk state)."""

    def __init__(self, what: str, value: object, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        super().__init__(f"invalid lifecycle state {what}={value!r}: {reason}")


# --- Iceberg publication (lifecycle/iceberg_publication.py)


class IcebergPublicationFailed(LifecycleError):
    """Publishing a revision of a database's catalog to Iceberg failed; nothing of it was committed
    for ``table`` (None: before any table), and the next round tries again."""

    def __init__(self, db: str, table: str | None, revision: int, reason: str) -> None:
        self.db = db
        self.table = table
        self.revision = revision
        self.reason = reason
        where = f"{db}.{table}" if table is not None else db
        super().__init__(f"publishing revision {revision} of {where} to Iceberg failed: {reason}")
