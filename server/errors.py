"""Errors of the server package: one root, one class per cause, structured fields.

Each maps to one gRPC status in grpc_services.py. Shutdown is not an error.
"""
from __future__ import annotations

__all__ = [
    "ServerError",
    "NotServed",
    "InvalidDatabaseName",
    "DatabaseNotFound",
    "QueryTimedOut",
    "BadLines",
    "RequestTooLarge",
    "DecompressedRequestTooLarge",
    "QueryResultTooLarge",
    "WriteBufferUnavailable",
    "WriteBufferTruncated",
    "WriteBufferOverloaded",
    "MemoryLimitReached",
    "OlderThanRetention",
    "SchemaConflict",
    "TooManyColumns",
    "InvalidArgument",
    "NotAPoolMember",
    "RoleRefuses",
    "PoolMemberUnavailable",
    "NotPartitionOwner",
    "PoolAddressUnreachable",
    "OwnerNotCaughtUp",
    "ColumnAgreementUnavailable",
    "OwnershipMoving",
    "StreamRestartTimedOut",
    "CatchUpTimedOut",
    "WritesLost",
    "TopicReplaced",
    "DatabaseFenced",
    "PoisonedMessageNotFound",
    "NothingToAccept",
    "NotReadyToAccept",
    "QueryRefused",
    "NotAQuery",
    "PathReadRefused",
    "RelationRefused",
    "FunctionRefused",
    "ConstructRefused",
    "ReplayNotCaughtUp",
    "WriteTokenNotVisible",
    "WriteTokenOfOtherDatabase",
    "WriteTokenOfOtherIncarnation",
    "DownsamplerNotFound",
    "DownsamplerExists",
]


class ServerError(Exception):
    """Root of the server package's errors: those reported to a client and those that stop a start."""


class InvalidArgument(ServerError):
    """A request argument a user can fix."""


class NotServed(ServerError):
    """A request of a protocol this server speaks that asks what it does not serve (UNIMPLEMENTED):
    `what`, and `instead` what to send instead."""

    def __init__(self, what: str, instead: str):
        self.what, self.instead = what, instead
        super().__init__(f"{what} is not served: {instead}")


class InvalidDatabaseName(InvalidArgument):
    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"invalid database name {name!r}: {reason}")


class DatabaseNotFound(ServerError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"database {name!r} not found")


class BadLines(InvalidArgument):
    """Line protocol with bad lines: the whole request is rejected."""

    def __init__(self, errors: list, total_bad: int):
        self.errors = errors  # list of (line_number, reason), at most MAX_REPORTED
        self.total_bad = total_bad
        first = "; ".join(f"line {n}: {r}" for n, r in errors[:3])
        more = f" (and {total_bad - 3} more)" if total_bad > 3 else ""
        super().__init__(f"{total_bad} bad line(s), nothing written: {first}{more}")


class LinesRejected(InvalidArgument):
    """`POST /api/v3/write_lp`: lines that could not be written (server/write/lp_v3.py RejectedLine),
    at most MAX_REPORTED of them in `rejected`. `written`: the request's other lines were written
    (accept_partial); else nothing of it was."""

    def __init__(self, rejected: list, total: int, written: bool):
        self.rejected = rejected
        self.total = total
        self.written = written
        first = "; ".join(f"line {r.line_number}: {r.error_message}" for r in rejected[:3])
        more = f" (and {total - 3} more)" if total > 3 else ""
        what = "the other lines were written" if written else "nothing written"
        super().__init__(f"{total} line(s) rejected, {what}: {first}{more}")


class SchemaConflict(InvalidArgument):
    def __init__(self, table: str, column: str, existing: str, new: str):
        self.table = table
        self.column = column
        self.existing = existing
        self.new = new
        super().__init__(
            f"table {table!r} column {column!r} is {existing}, this write has {new}; nothing written"
        )


class TooManyColumns(InvalidArgument):
    """A write would widen a table past --max-columns-per-table (catalog.schema.ColumnLimitExceeded)."""

    def __init__(self, cause):
        self.table, self.existing, self.would_have, self.limit = cause.table, cause.existing, cause.would_have, cause.limit
        super().__init__(f"{cause} (--max-columns-per-table); nothing written")


class RequestTooLarge(ServerError):
    def __init__(self, size_bytes: int, limit_bytes: int):
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(f"request of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes")


class QueryResultTooLarge(RequestTooLarge):
    """A query result past --max-query-rows or --max-query-bytes (RESOURCE_EXHAUSTED)."""

    def __init__(self, what: str, limit: int, flag: str):
        ServerError.__init__(self, f"query result exceeds the limit of {limit} {what} ({flag}); "
                                   f"narrow the query (WHERE, LIMIT, aggregates)")
        self.size_bytes = limit + 1
        self.limit_bytes = limit


class QueryTimedOut(ServerError):
    """A query's Spark job ran past --query-timeout-s: it was cancelled (DEADLINE_EXCEEDED / HTTP 504)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        super().__init__(f"the query ran longer than {timeout_s:g} s (--query-timeout-s) and was cancelled; "
                         f"narrow it (WHERE on time, fewer columns, aggregates)")


class DecompressedRequestTooLarge(RequestTooLarge):
    """A compressed body that decompresses past the limit (decompression stopped there)."""

    def __init__(self, limit_bytes: int, encoding: str = "gzip"):
        self.encoding = encoding
        ServerError.__init__(self, f"{encoding} request body exceeds the limit of {limit_bytes} bytes "
                                   f"after decompression")
        self.size_bytes = limit_bytes + 1  # at least; decompression stopped at the limit
        self.limit_bytes = limit_bytes


class WriteBufferOverloaded(ServerError):
    """The in-memory buffer is over its hard limit: writes wait until persistence catches up."""

    def __init__(self, buffer_bytes: int, hard_limit_bytes: int, retry_after_s: float = 1.0):
        self.buffer_bytes = buffer_bytes
        self.hard_limit_bytes = hard_limit_bytes
        self.retry_after_s = retry_after_s
        super().__init__(f"the server's in-memory buffer ({buffer_bytes} bytes) is over its hard limit "
                         f"({hard_limit_bytes} bytes); retry after {retry_after_s:g}s")


class WriteBufferUnavailable(ServerError):
    def __init__(self, reason: str, retry_after_s: float = 1.0):
        self.reason = reason
        self.retry_after_s = retry_after_s
        super().__init__(f"write buffer unavailable: {reason}")


class CatchUpTimedOut(ServerError):
    """`iox persist` / `iox compact` waited past their deadline for the writes acknowledged before
    them to be applied (``target`` and ``applied``: {kafka partition: offset}, inclusive)."""

    def __init__(self, database: str, target: dict, applied: dict, timeout_s: float):
        self.database = database
        self.target = dict(target)
        self.applied = dict(applied)
        self.timeout_s = timeout_s
        behind = {kp: (applied.get(kp, -1), off) for kp, off in sorted(target.items()) if applied.get(kp, -1) < off}
        super().__init__(
            f"database {database!r}: the writes acknowledged before this request were not all applied within "
            f"{timeout_s:g} s (Kafka partition: applied / needed offset: "
            + ", ".join(f"{kp}: {a} / {t}" for kp, (a, t) in behind.items()) + "); nothing was done")


class WritesLost(ServerError):
    """The database's write buffer lost acknowledged writes (``ranges``: catalog LostWriteRange):
    writes and deletes are refused until the loss is accepted."""

    def __init__(self, database: str, ranges: list):
        self.database = database
        self.ranges = list(ranges)
        parts = "; ".join(f"Kafka partition {r.partition} offsets "
                          + (f"[{r.from_offset}, {r.to_exclusive})" if r.to_exclusive is not None
                             else f"from {r.from_offset} on")
                          + f" ({r.reason})" for r in self.ranges)
        super().__init__(
            f"database {database!r}: the write buffer lost acknowledged writes that are not persisted: {parts}. "
            f"Writes are refused until the loss is accepted: `iox accept-lost-writes --db {database}`, or a restart "
            "of the server with --skip-lost-writes (the loss stays recorded in `iox status`)")


class TopicReplaced(ServerError):
    """The database's write-buffer topic was deleted and created again while the server ran, and
    no acknowledged write was lost: the server must restart to read the new topic."""

    def __init__(self, database: str, topic: str):
        self.database = database
        self.topic = topic
        super().__init__(
            f"database {database!r}: the write buffer's topic {topic} was deleted and created again while the "
            "server ran; no acknowledged write was lost (what was applied is persisted), but writes are refused "
            f"until the database continues on the new topic: `iox accept-lost-writes --db {database}`, or a restart "
            "of the server")


class WriteBufferTruncated(WriteBufferUnavailable):
    """The database's broker lost the tail of its topic, and no acknowledged write was lost with it
    (those are WritesLost): writes are refused, UNAVAILABLE, until what was applied is persisted and
    the database continues in a new write-buffer epoch, which the server does by itself."""

    def __init__(self, database: str, ends: dict):
        self.database = database
        self.ends = dict(ends)
        super().__init__(
            f"database {database!r}: the broker lost the tail of the write buffer (Kafka partition end offsets now "
            + ", ".join(f"{kp}: {end}" for kp, end in sorted(self.ends.items()))
            + "); nothing acknowledged was lost; writes are taken again once what was applied is persisted",
            retry_after_s=5.0)


class DatabaseFenced(ServerError):
    """Another server committed ``revision`` of the database's preserved catalog (docs/ARCHITECTURE.md invariant 8,
    "One committer"): this server no longer owns the database, so its writes and deletes are refused
    (and it never commits to or cleans up the database again) until the server restarts."""

    def __init__(self, database: str, revision: int):
        self.database = database
        self.revision = revision
        super().__init__(
            f"database {database!r}: another server committed revision {revision} of its preserved catalog, so "
            "this server no longer owns the database: writes and deletes are refused here (write to the server "
            "that owns it, or restart this one to load the catalog again)")


class PoolMemberUnavailable(ServerError):
    """A query through an ingester pool member needs the unpersisted rows of another member that
    owns some of the tables it reads, and that member does not answer (UNAVAILABLE: retry; once the
    assigner hands its partitions over, their new owner answers)."""

    def __init__(self, database: str, address: str, reason: str, retry_after_s: float = 2.0):
        self.database, self.address, self.reason, self.retry_after_s = database, address, reason, retry_after_s
        super().__init__(f"database {database!r}: pool member {address} owns partitions this query reads and "
                         f"does not answer ({reason}); nothing was queried")


class PoolAddressUnreachable(ServerError):
    """A pool member would publish a loopback address while another member runs on another host,
    which could never reach it: its start is refused."""

    def __init__(self, member: str, address: str, other: str, other_host: str, host: str):
        self.member, self.address, self.other, self.other_host, self.host = member, address, other, other_host, host
        super().__init__(f"pool member {member!r} would publish the loopback address {address}, which pool member "
                         f"{other!r} on host {other_host!r} (this is {host!r}) cannot reach: set --pool-address "
                         f"to an address the other hosts reach, or bind to one (--bind-host)")


class NotPartitionOwner(ServerError):
    """An ingester pool member was asked for the unpersisted rows of Kafka partitions it does not own
    (any more): the asking member's view of the owners is stale. FAILED_PRECONDITION; the asking
    member reads the owners again and asks the new one. ``owners``: {partition: (member, epoch)}
    as this member knows them (absent: no owner known here)."""

    def __init__(self, database: str, member: str, partitions, owners: dict):
        self.database, self.member, self.partitions = database, member, sorted(partitions)
        self.owners = dict(owners)
        now = ", ".join(f"{kp} by {o[0]!r} (epoch {o[1]})" for kp, o in sorted(self.owners.items())) or "unknown"
        super().__init__(f"database {database!r}: pool member {member!r} does not own Kafka partitions "
                         f"{self.partitions} (now: {now}); ask their owner")


class OwnerNotCaughtUp(ServerError):
    """An ingester pool member asked for its unpersisted rows has not applied, within the call's
    deadline, every offset written before the query started (or its replay after a claim or a
    restart): UNAVAILABLE, never an answer without those writes. ``behind``: {partition: (applied,
    needed)}, inclusive offsets."""

    def __init__(self, database: str, member: str, behind: dict, waited_s: float, retry_after_s: float = 1.0):
        self.database, self.member, self.behind, self.waited_s = database, member, dict(behind), waited_s
        self.retry_after_s = retry_after_s
        super().__init__(f"database {database!r}: pool member {member!r} has not applied what was written before "
                         f"the query after {waited_s:.1f} s (Kafka partition: applied / needed offset: "
                         + ", ".join(f"{kp}: {a} / {n}" for kp, (a, n) in sorted(self.behind.items())) + ")")


class OwnershipMoving(ServerError):
    """A query through an ingester pool member read a Kafka partition while it was being handed
    over (an owner answered "not the owner" until the deadline, this member had not taken up a
    partition it claimed, or it lost one while the query started): UNAVAILABLE, nothing queried."""

    def __init__(self, database: str, reason: str, retry_after_s: float = 0.5):
        self.database, self.reason, self.retry_after_s = database, reason, retry_after_s
        super().__init__(f"database {database!r}: a Kafka partition this query reads is being handed over "
                         f"({reason}); nothing was queried, retry")


class StreamRestartTimedOut(ServerError):
    """An admin change that needs the write-buffer stream stopped (a poisoned message retried or
    accepted, a freeze, a pool claim or loss, a topic switch) found a micro-batch of the stopped
    stream still applying after ``waited_s``: UNAVAILABLE, nothing changed. The stream starts again
    on its own once that batch ends (server/consume/consumer.py)."""

    def __init__(self, waited_s: float, retry_after_s: float = 5.0):
        self.waited_s, self.retry_after_s = waited_s, retry_after_s
        super().__init__(f"a write-buffer micro-batch was still being applied {waited_s:g} s after its stream "
                         f"stopped; nothing was changed, retry after {retry_after_s:g}s")


class ColumnAgreementUnavailable(ServerError):
    """In an ingester pool, a write with a column new to this member needs the pool's type of it
    (catalog/pool_schema.py), and the object store did not answer: UNAVAILABLE, nothing written."""

    def __init__(self, database: str, reason: str, retry_after_s: float = 1.0):
        self.database, self.reason, self.retry_after_s = database, reason, retry_after_s
        super().__init__(f"database {database!r}: the pool's column types cannot be read from the object store "
                         f"({reason}); nothing written")


class RoleRefuses(ServerError):
    """This server's --role does not do what was asked (a querier claims nothing, an ingester
    answers no user query): FAILED_PRECONDITION naming where to go instead."""

    def __init__(self, role: str, what: str, instead: str):
        self.role, self.what, self.instead = role, what, instead
        super().__init__(f"this server's role is {role}: it does not {what}; {instead}")


class NotAPoolMember(ServerError):
    """A pool operation (claiming partitions) on a server started without --pool-member."""

    def __init__(self, what: str):
        self.what = what
        super().__init__(f"{what}: this server is not a member of an ingester pool (start it with --pool-member NAME)")


class QueryRefused(ServerError):
    """A Query API statement the SQL sandbox (server/query/sql_sandbox.py) does not run: it reaches beyond the
    tables of the request's ``database`` (PERMISSION_DENIED). Nothing of it ran."""

    def __init__(self, database: str, message: str):
        self.database = database
        super().__init__(f"query refused on database {database!r}: {message}")


class NotAQuery(QueryRefused):
    """A statement that is no query (DDL, DML, SET / RESET, ADD JAR, CACHE, ...; ``statement``: Spark's name
    of its plan): INVALID_ARGUMENT, the Query API runs queries only."""

    def __init__(self, database: str, statement: str):
        self.statement = statement
        super().__init__(database, f"{statement} is not a query; the Query API runs queries only (SELECT, WITH, "
                                   "VALUES, TABLE, EXPLAIN, DESCRIBE, SHOW TABLES, SHOW COLUMNS)")


class PathReadRefused(QueryRefused):
    """A read of files by path, ``source``.`path` (text.`/etc/passwd`, parquet.`...`, ...)."""

    def __init__(self, database: str, source: str, path: str):
        self.source = source
        self.path = path
        super().__init__(database, f"reading files is not allowed: {source}.`{path}`")


class RelationRefused(QueryRefused):
    """A relation (``name``: its parts) that is not one of the database's tables: another database's view,
    a global or other temp view, a catalog table."""

    def __init__(self, database: str, name: tuple, reason: str):
        self.name = tuple(name)
        self.reason = reason
        super().__init__(database, f"{'.'.join(self.name)} is refused: {reason}")


class FunctionRefused(QueryRefused):
    """A function a query may not call (``function``: as named in the query): it reaches the JVM or the host
    (reflect, java_method, ...), or it is not a builtin one."""

    def __init__(self, database: str, function: str, reason: str):
        self.function = function
        self.reason = reason
        super().__init__(database, f"function {function} is refused: {reason}")


class ConstructRefused(QueryRefused):
    """A query construct outside the sandbox (``construct``: Spark's name of it), such as TRANSFORM ... USING
    or IDENTIFIER(...) over an expression."""

    def __init__(self, database: str, construct: str, reason: str):
        self.construct = construct
        self.reason = reason
        super().__init__(database, f"{construct} is refused: {reason}")


class PoisonedMessageNotFound(ServerError):
    """`iox poison retry|accept` named no held poisoned message of the database (NOT_FOUND)."""

    def __init__(self, database: str, partition: int | None = None, offset: int | None = None):
        self.database = database
        self.partition = partition
        self.offset = offset
        where = ("" if partition is None else f" on Kafka partition {partition}") + \
            ("" if offset is None else f" at offset {offset}")
        super().__init__(f"database {database!r}: no held poisoned message{where} (see `iox status --db {database}`)")


class NothingToAccept(ServerError):
    """`iox accept-lost-writes` for a database with no loss to accept and a topic not replaced
    (FAILED_PRECONDITION)."""

    def __init__(self, database: str):
        self.database = database
        super().__init__(f"database {database!r}: no lost writes to accept (every loss recorded is accepted and its "
                         "topic was not replaced)")


class NotReadyToAccept(ServerError):
    """`iox accept-lost-writes` could not yet persist everything the database applied (it continues
    on a new topic only once nothing of the old one is unpersisted); nothing changed (UNAVAILABLE,
    retry)."""

    def __init__(self, database: str, reason: str, retry_after_s: float = 1.0):
        self.database = database
        self.reason = reason
        self.retry_after_s = retry_after_s
        super().__init__(f"database {database!r}: the lost writes are not accepted yet: {reason}; nothing changed, "
                         "try again")


class ReplayNotCaughtUp(ServerError):
    """A query waited its deadline for the database's replay of the write buffer after a restart
    (it would have answered without writes acknowledged before the restart): UNAVAILABLE, retry
    or accept a partial answer (`allow_partial`). ``done`` / ``todo``: offsets replayed / to replay."""

    def __init__(self, database: str, done: int, todo: int, waited_s: float, retry_after_s: float = 1.0):
        self.database, self.done, self.todo, self.waited_s = database, done, todo, waited_s
        self.retry_after_s = retry_after_s
        pct = f" ({100.0 * done / todo:.1f}%)" if todo else ""
        super().__init__(f"database {database!r} is replaying its write buffer after a restart: {done} of {todo} "
                         f"offsets done{pct}; waited {waited_s:.1f} s. Retry later (`iox status --wait-replay`), "
                         "or accept a partial answer (--allow-partial)")


class WriteTokenNotVisible(ServerError):
    """A query's write token (`after`) was not visible within its deadline: DEADLINE_EXCEEDED, never
    an answer without the write. ``needed`` / ``visible``: {kafka partition: offset}, inclusive."""

    def __init__(self, database: str, needed: dict, visible: dict, waited_s: float):
        self.database, self.needed, self.visible, self.waited_s = database, dict(needed), dict(visible), waited_s
        behind = {kp: (visible.get(kp, -1), off) for kp, off in sorted(needed.items()) if visible.get(kp, -1) < off}
        super().__init__(f"database {database!r}: the write token is not visible after {waited_s:.1f} s (Kafka "
                         "partition: visible / needed offset: "
                         + ", ".join(f"{kp}: {v} / {n}" for kp, (v, n) in behind.items()) + "); nothing was queried")


class WriteTokenOfOtherDatabase(InvalidArgument):
    """A query's write token names the topic of another database."""

    def __init__(self, database: str, topic: str, token_topic: str):
        self.database, self.topic, self.token_topic = database, topic, token_topic
        super().__init__(f"the write token is of topic {token_topic!r}, not of database {database!r} "
                         f"(topic {topic!r})")


class WriteTokenOfOtherIncarnation(ServerError):
    """A query's write token is of another write-buffer epoch or topic incarnation of the database
    than the one it reads now (its offsets mean other messages): FAILED_PRECONDITION."""

    def __init__(self, database: str, token_epoch: int, epoch: int, token_topic_id: str | None,
                 topic_id: str | None):
        self.database, self.token_epoch, self.epoch = database, token_epoch, epoch
        self.token_topic_id, self.topic_id = token_topic_id, topic_id
        super().__init__(f"database {database!r}: the write token is of write-buffer epoch {token_epoch} (topic id "
                         f"{token_topic_id}), the database is in epoch {epoch} (topic id {topic_id}); its offsets "
                         "name other messages now. Query without it (what that write held was persisted with its "
                         "epoch) or write again for a new token")


class MemoryLimitReached(WriteBufferOverloaded):
    """The server's process tree is at its --memory-limit-bytes (RSS, server/runtime/memory_guard.py):
    writes are refused (RESOURCE_EXHAUSTED / HTTP 503 with Retry-After) until it is back under."""

    def __init__(self, rss_bytes: int, limit_bytes: int, retry_after_s: float = 1.0):
        self.rss_bytes = rss_bytes
        self.limit_bytes = limit_bytes
        self.buffer_bytes = rss_bytes
        self.hard_limit_bytes = limit_bytes
        self.retry_after_s = retry_after_s
        ServerError.__init__(self, f"the server's memory ({rss_bytes} bytes resident, driver, Spark and workers) is "
                                   f"at its limit ({limit_bytes} bytes, --memory-limit-bytes); retry after "
                                   f"{retry_after_s:g}s")


class OlderThanRetention(InvalidArgument):
    """A write holds a point older than its database's retention allows (older than reader_lo):
    the whole request is rejected, nothing is stored (INVALID_ARGUMENT; HTTP 422 as InfluxDB does).
    ``line``: the 1-based line of the first such point (None for an Arrow write), ``row`` its row
    in ``table`` (0-based)."""

    def __init__(self, database: str, table: str, time_ns: int, reader_lo_ns: int, retention: str,
                 line: int | None = None, row: int | None = None):
        self.database, self.table, self.time_ns = database, table, time_ns
        self.reader_lo_ns, self.retention, self.line, self.row = reader_lo_ns, retention, line, row
        where = f"line {line}" if line is not None else f"table {table!r} row {row}"
        super().__init__(f"{where}: point at time {time_ns} is older than the retention of database {database!r} "
                         f"({retention}: nothing older than {reader_lo_ns} is kept); nothing written")


class DownsamplerNotFound(ServerError):
    """No downsampler of that name (NOT_FOUND)."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"no downsampler {name!r} (a downsampler is named <destination database>.<destination table>)")


class DownsamplerExists(ServerError):
    """The destination table has a downsampler already (ALREADY_EXISTS): one destination table, one downsampler."""

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"downsampler {name!r} exists: its destination table has a downsampler already "
                         "(drop it first, or write into another table)")
