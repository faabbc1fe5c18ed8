"""Ownership of a database's Kafka partitions in an ingester pool.

Invariant kept here (docs/ARCHITECTURE.md invariant 8, "One committer", per partition):
in a pool, the unit of work is a (database, Kafka partition) pair, and each is
owned by exactly one ingester at a time. Ownership lives in the database's
preserved catalog itself: a :class:`ClaimPartitions` action gives Kafka
partitions to an owner, each with an epoch one higher than the partition's
last, and every later transaction names its ``writer``. A transaction is valid
only when its writer owns, at the revision it commits on top of, every Kafka
partition its actions touch (:func:`touched_partitions`, checked by
:func:`check_ownership`). Since the catalog appends revision ``N + 1`` with an
atomic put-if-absent, that check is a compare-and-swap: an old owner whose
partition was claimed by another ingester re-reads the log after losing its
revision, finds the claim, and its commit fails with :class:`PartitionFenced`.

Which Kafka partition an action touches follows from what it names: a table's
writes all go to ``partition_for(table, kafka_partitions)``
(catalog/sharding.py), so a file, a table schema and a table partition's
checkpoint belong to one Kafka partition; a database checkpoint, lost writes
and accepted poisoned messages name their Kafka partitions; a delete predicate
touches the partitions of the files it applies to. Database-wide records
(retention, the pruner's watermark) need their writer to own at least one
partition.

Pure functions and plain picklable values; no I/O, no clock.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from iox_spark.catalog.errors import InvalidAction, PartitionsNotOwned
from iox_spark.catalog.sharding import partition_for

__all__ = [
    "MEMBERS_PREFIX",
    "ClaimPartitions",
    "member_address_key",
    "member_address_record",
    "read_member_address",
    "read_member_records",
    "PartitionOwner",
    "check_ownership",
    "claim_epochs",
    "owner_name_check",
    "touched_partitions",
]

#: Action kinds that hold database-wide records: their writer must own at least one partition.
_DATABASE_WIDE_KINDS = frozenset({"retention", "pruned"})
#: Longest owner name (an ingester's advertised address, or an operator's name for it).
_MAX_OWNER_CHARS = 256
#: Object-store prefix where each pool member publishes the gRPC address the others (and the Spark
#: data source) reach it at: ``<prefix><encoded name>.json`` = {"format_version": 1, "member",
#: "address", "at_s"}. Not a database name: those have no '~'.
MEMBERS_PREFIX = "iox~pool/members/"
_MEMBER_FORMAT_VERSION = 1


def member_address_key(member: str) -> str:
    """The object key of `member`'s published address."""
    from iox_spark.catalog.object_store import encode_key_segment

    return MEMBERS_PREFIX + encode_key_segment(member) + ".json"


def member_address_record(member: str, address: str, at_s: float, host: str | None = None) -> bytes:
    """The published-address object of `member` (written by the member at its start); `host`: the
    name of the machine it runs on (a loopback address reaches no member on another one)."""
    import json

    rec = {"format_version": _MEMBER_FORMAT_VERSION, "member": member, "address": address, "at_s": at_s}
    if host is not None:
        rec["host"] = host
    return json.dumps(rec).encode()


def read_member_records(store) -> list[dict]:
    """Every member's published-address object in `store` ({member, address, at_s, host if
    recorded}); an unreadable one is left out."""
    import json

    from iox_spark.catalog.errors import ObjectNotFound

    out = []
    for meta in store.list(MEMBERS_PREFIX):
        try:
            obj = json.loads(store.get(meta.key))
        except (ObjectNotFound, ValueError):
            continue
        if isinstance(obj, dict) and obj.get("format_version") == _MEMBER_FORMAT_VERSION \
                and isinstance(obj.get("address"), str) and isinstance(obj.get("member"), str):
            out.append(obj)
    return out


def read_member_address(store, member: str) -> str | None:
    """The address `member` published in `store`, None when it published none; ValueError when the
    object is unreadable or of another format version."""
    import json

    from iox_spark.catalog.errors import ObjectNotFound

    try:
        obj = json.loads(store.get(member_address_key(member)))
    except ObjectNotFound:
        return None
    if not isinstance(obj, dict) or obj.get("format_version") != _MEMBER_FORMAT_VERSION \
            or not isinstance(obj.get("address"), str):
        raise ValueError(f"published address of pool member {member!r} is unreadable: {obj!r}")
    return obj["address"]


def owner_name_check(kind: str, owner: Any) -> str:
    """``owner`` if it is a usable owner name (non-empty text, no control characters); else InvalidAction."""
    if not isinstance(owner, str) or not owner or len(owner) > _MAX_OWNER_CHARS:
        raise InvalidAction(kind, f"owner must be a non-empty string of at most {_MAX_OWNER_CHARS} characters, "
                                  f"got {owner!r}")
    if any(ord(c) < 32 for c in owner):
        raise InvalidAction(kind, f"owner {owner!r} holds a control character")
    return owner


@dataclass(frozen=True)
class PartitionOwner:
    """Who owns one Kafka partition of a database, and since which claim (``epoch`` >= 1)."""

    owner: str
    epoch: int


@dataclass(frozen=True)
class ClaimPartitions:
    """Give ``claims``' Kafka partitions ({partition: epoch}) of a topic with ``kafka_partitions``
    partitions to ``owner`` (format version 4).

    Each epoch must be the partition's current epoch plus one (1 for a partition never claimed),
    so two claims computed on the same revision cannot both apply. The first claim of a database
    turns its catalog into a pool catalog: from then on every transaction names its writer and is
    checked by :func:`check_ownership`.
    """

    KIND: ClassVar[str] = "claim_partitions"
    owner: str
    kafka_partitions: int
    claims: Mapping[int, int]

    def __post_init__(self) -> None:
        k = self.KIND
        owner_name_check(k, self.owner)
        n = self.kafka_partitions
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidAction(k, f"kafka_partitions must be an int >= 1, got {n!r}")
        if not isinstance(self.claims, Mapping) or not self.claims:
            raise InvalidAction(k, "claims must be a non-empty {kafka partition: epoch} object")
        claims: dict[int, int] = {}
        for p, e in self.claims.items():
            if isinstance(p, str) and p.isdecimal():
                p_int = int(p)  # a JSON object's key
            elif isinstance(p, int) and not isinstance(p, bool):
                p_int = p
            else:
                raise InvalidAction(k, f"kafka partition {p!r} is not an integer")
            if not 0 <= p_int < n:
                raise InvalidAction(k, f"kafka partition {p_int} is outside 0..{n - 1}")
            if isinstance(e, bool) or not isinstance(e, int) or e < 1:
                raise InvalidAction(k, f"epoch of kafka partition {p_int} must be an int >= 1, got {e!r}")
            claims[p_int] = e
        object.__setattr__(self, "claims", dict(sorted(claims.items())))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "owner": self.owner, "kafka_partitions": self.kafka_partitions,
                "claims": {str(p): e for p, e in self.claims.items()}}


def touched_partitions(action: Any, files: Mapping[str, Any], kafka_partitions: int) -> frozenset[int] | None:
    """The Kafka partitions ``action`` changes the records of, in a pool of ``kafka_partitions``.

    ``files``: the registered files (key -> AddParquet) of the state the action applies to.
    Returns None for a database-wide record (see the module docstring) and an empty set for an
    action that touches no partition (a delete predicate applying to no file). A claim touches
    nothing here: any ingester may claim (the assigner decides who does).
    """
    kind = action.KIND
    if kind in ("add_parquet", "partition_checkpoint", "schema"):
        return frozenset({partition_for(action.table, kafka_partitions)})
    if kind == "remove_parquet":
        f = files.get(action.key)
        return frozenset() if f is None else frozenset({partition_for(f.table, kafka_partitions)})
    if kind == "delete_predicate":
        return frozenset(partition_for(files[k].table, kafka_partitions) for k in action.applies_to if k in files)
    if kind == "database_checkpoint":
        return frozenset(action.sequencer_numbers)
    if kind == "lost_writes":
        return frozenset(r.partition for r in action.ranges)
    if kind == "accepted_poisoned_messages":
        return frozenset(m.partition for m in action.messages)
    if kind == ClaimPartitions.KIND:
        return frozenset()
    if kind in _DATABASE_WIDE_KINDS:
        return None
    raise InvalidAction(kind, "no ownership rule for this action kind")


def check_ownership(db: str, owners: Mapping[int, PartitionOwner], kafka_partitions: int,
                    files: Mapping[str, Any], actions: Sequence[Any], writer: str | None,
                    epochs: Mapping[int, int] | None = None, revision: int | None = None) -> None:
    """Raise :class:`PartitionsNotOwned` unless ``writer`` owns every partition ``actions`` touch.

    ``owners``/``kafka_partitions``/``files``: the pool state the transaction commits on top of.
    ``epochs``: the epochs the writer claimed ({partition: epoch}); when given, ownership also
    needs the same epoch, so a process that lost a partition to a later claim under its own name
    (the same ingester restarted) is refused too. Claims in ``actions`` count as they apply: a
    transaction may claim a partition and write to it. Called on commit (against the state the
    transaction is appended to) and on load (every transaction of a pool catalog).
    """
    owned = {p: o for p, o in owners.items()}
    files = dict(files)
    needed: set[int] = set()
    wide = False
    for a in actions:
        if a.KIND == ClaimPartitions.KIND:
            for p, e in a.claims.items():
                owned[p] = PartitionOwner(a.owner, e)
            continue
        touched = touched_partitions(a, files, kafka_partitions)
        if a.KIND == "add_parquet":
            files[a.key] = a
        if touched is None:
            wide = True
        else:
            needed |= touched
    mine = {p for p, o in owned.items() if o.owner == writer and (epochs is None or epochs.get(p) == o.epoch)}
    missing = sorted(needed - mine)
    if missing or (wide and not mine):
        raise PartitionsNotOwned(db, tuple(missing), writer, {p: owned[p] for p in missing if p in owned}, revision)


def claim_epochs(owners: Mapping[int, PartitionOwner], partitions: Iterable[int]) -> dict[int, int]:
    """{partition: the epoch a claim of it on top of ``owners`` must carry} (current + 1)."""
    return {p: (owners[p].epoch + 1 if p in owners else 1) for p in sorted(set(partitions))}

