"""What the tests ask of a server's continuous downsampler: whether it emitted everything up to
given offsets of its source and its destination applied what it wrote. Pure Python over a client."""
from __future__ import annotations

__all__ = ["databases", "downsampler", "emitted_through"]


def databases(client) -> set:
    """The names of the databases the server knows."""
    return {db["name"] for db in client.status()["databases"]}


def downsampler(client, name: str) -> dict | None:
    """The downsampler's status as `iox downsample list` gives it, None when there is none."""
    found = [d for d in client.list_downsamplers() if d["name"] == name]
    return found[0] if found else None


def emitted_through(client, name: str, dest: str, through: dict) -> bool:
    """Whether downsampler `name` emitted every source offset below `through` ({kp: next offset})
    and its destination database `dest` applied every write it acknowledged, so a query of it
    answers them (a destination not created yet has none)."""
    d = downsampler(client, name)
    if d is None:
        return False
    progress = {p["partition"]: p["next_offset"] for p in d["progress"]}
    if any(progress.get(kp, 0) < nxt for kp, nxt in through.items()):
        return False
    if dest not in databases(client):
        return True
    return all(p["applied_hi_inclusive"] >= p["high_watermark"] - 1
               for db in client.status(dest)["databases"] for p in db["write_buffer"])
