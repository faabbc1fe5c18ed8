"""Write tokens: where a write landed in the write buffer, in a form a person can copy.

A token names a database's topic, the Kafka id of the topic incarnation, the write-buffer epoch
(catalog `Database.epoch`: it grows when the topic's offsets started over) and, per Kafka
partition, the offset of the write's last message. `iox write` prints it, gRPC Write and Delete
answer it (`token_text`), the HTTP write API in the `X-Iox-Write-Token` header; a query takes it back
(`QueryRequest.after`, `iox sql --after`, HTTP `X-Iox-After`) and runs once every offset of it is
visible (server/query/read_barrier.py).

Printable form (versioned): ``wt1.`` followed by the unpadded base64url of the compact JSON
``{"topic": str, "topic_id": str | null, "epoch": int, "offsets": {"<kp>": int}}``: one word, no
characters a shell or an HTTP header would treat specially.

Invariant: `parse_token(format_token(t)) == t`; anything else `parse_token` is given is an `InvalidWriteToken`
naming what is wrong (another version: `WriteTokenVersionMismatch`). Pure; driver or client side.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from iox_spark.server.errors import InvalidArgument

__all__ = ["WriteToken", "TOKEN_VERSION", "TOKEN_PREFIX", "format_token", "parse_token", "InvalidWriteToken",
           "WriteTokenVersionMismatch", "merge_offsets", "token_for"]

#: the version of the printable form; `parse_token` refuses any other
TOKEN_VERSION = 1
TOKEN_PREFIX = f"wt{TOKEN_VERSION}."
#: a token longer than this is refused before it is decoded (a topic of 4096 partitions fits)
_MAX_TOKEN_CHARS = 128 * 1024


class InvalidWriteToken(InvalidArgument):
    """A text that is not a write token of this format (``reason`` says what is wrong)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"invalid write token: {reason} (pass the token exactly as the write printed it)")


class WriteTokenVersionMismatch(InvalidWriteToken):
    """A token of another version of the printable form."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        super().__init__(f"its format version {prefix!r} is not the one this server reads ({TOKEN_PREFIX!r})")


@dataclass(frozen=True)
class WriteToken:
    topic: str
    topic_id: str | None
    epoch: int
    #: {kafka partition: offset of the write's last message there (inclusive)}
    offsets: dict = field(default_factory=dict)


def merge_offsets(a: dict, b: dict) -> dict:
    """Per Kafka partition the higher offset of two tokens' offsets (a later write's token covers both)."""
    out = dict(a)
    for kp, off in b.items():
        out[kp] = max(off, out.get(kp, off))
    return out


def token_for(catalog, database: str, offsets: dict) -> WriteToken | None:
    """The token of a write acknowledged at `offsets` ({kp: offset}) to `database` of the in-memory
    `catalog`, in the database's current epoch and topic incarnation; None when the catalog does not
    know the database (a write registers it before it is produced). Driver side."""
    db = catalog.peek_database(database)
    if db is None:
        return None
    topic, topic_id, epoch = db.incarnation()
    return WriteToken(topic, topic_id, epoch, {int(kp): int(off) for kp, off in offsets.items()})


def format_token(t: WriteToken) -> str:
    body = {"topic": t.topic, "topic_id": t.topic_id, "epoch": int(t.epoch),
            "offsets": {str(kp): int(off) for kp, off in sorted(t.offsets.items())}}
    raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_token(text: str) -> WriteToken:
    """The token `text` (surrounding blanks ignored); InvalidWriteToken when it is none."""
    text = (text or "").strip()
    if len(text) > _MAX_TOKEN_CHARS:
        raise InvalidWriteToken(f"longer than {_MAX_TOKEN_CHARS} characters")
    head, dot, rest = text.partition(".")
    if not dot or not head.startswith("wt"):
        raise InvalidWriteToken(f"it does not start with {TOKEN_PREFIX!r}")
    if head + "." != TOKEN_PREFIX:
        raise WriteTokenVersionMismatch(head + ".")
    try:
        body = json.loads(base64.urlsafe_b64decode(rest + "=" * (-len(rest) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidWriteToken("its body is not base64url-encoded JSON") from None
    if not isinstance(body, dict):
        raise InvalidWriteToken("its body is not a JSON object")
    topic, topic_id, epoch, offsets = (body.get(k) for k in ("topic", "topic_id", "epoch", "offsets"))
    if not isinstance(topic, str) or not topic:
        raise InvalidWriteToken("it names no topic")
    if topic_id is not None and not isinstance(topic_id, str):
        raise InvalidWriteToken("its topic_id is not a string")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise InvalidWriteToken("its epoch is not a non-negative integer")
    if not isinstance(offsets, dict):
        raise InvalidWriteToken("its offsets are not a JSON object")
    out = {}
    for kp, off in offsets.items():
        if not (isinstance(kp, str) and kp.isdigit()) or not isinstance(off, int) or isinstance(off, bool) \
                or off < 0:
            raise InvalidWriteToken(f"offset {kp!r}: {off!r} is not a Kafka partition and a non-negative offset")
        out[int(kp)] = off
    return WriteToken(topic, topic_id, epoch, out)
