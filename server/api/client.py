"""A small Python client for the iox gRPC API (used by the CLI, the demo, tests and benchmarks)."""
from __future__ import annotations

import time

import grpc
import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from iox_spark.iox import delete_pb2, delete_pb2_grpc, management_pb2, management_pb2_grpc, query_pb2, query_pb2_grpc, write_pb2, write_pb2_grpc

__all__ = ["IoxClient", "NotAPoolMember", "DEFAULT_ADDR", "owned_partitions_status", "as_dict"]

DEFAULT_ADDR = "localhost:8082"
_MAX = 256 * 1024 * 1024
#: How long the channel waits before reconnecting to a server it could not reach, at first and at
#: most, in milliseconds. gRPC's defaults (1 s, growing 1.6x up to 120 s) leave a client that waits
#: for a restarting server (``wait_ready``, ``query(after=...)``) idle for seconds after the server
#: serves again; a reconnect attempt costs the server one refused or accepted TCP connection.
RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1_000
_ROLES = {"tag": write_pb2.ColumnRole.TAG, "field": write_pb2.ColumnRole.FIELD, "time": write_pb2.ColumnRole.TIME}


class NotAPoolMember(Exception):
    """`pool_status` asked a server that is not a member of an ingester pool."""


class _TokenMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Token <token>` to every call."""

    def __init__(self, token: str):
        self._md = ("authorization", f"Token {token}")

    def _details(self, d):
        md = list(d.metadata or ()) + [self._md]
        return d._replace(metadata=md) if hasattr(d, "_replace") else _CallDetails(
            d.method, d.timeout, md, d.credentials, getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


class IoxClient:
    """`token`: sent as `authorization: Token <token>` metadata on every call (a server started
    with --auth-token or --auth-tokens-file requires one); None sends none."""

    def __init__(self, addr: str = DEFAULT_ADDR, token: str | None = None):
        self.addr = addr
        self._token = token
        self._raw_channel = grpc.insecure_channel(addr, options=[
            ("grpc.max_receive_message_length", _MAX), ("grpc.max_send_message_length", _MAX),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS)])
        self.channel = (grpc.intercept_channel(self._raw_channel, _TokenMetadata(token)) if token
                        else self._raw_channel)
        self.write_stub = write_pb2_grpc.WriteServiceStub(self.channel)
        self.query_stub = query_pb2_grpc.QueryServiceStub(self.channel)
        self.mgmt_stub = management_pb2_grpc.ManagementServiceStub(self.channel)
        self.delete_stub = delete_pb2_grpc.DeleteServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        if self._raw_channel is not self.channel:
            self._raw_channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = self.health_stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {self.addr} not ready within {timeout_s}s")
            time.sleep(0.2)

    def write(self, database: str, lines: bytes | str, precision: str = "ns", timeout_s: float = 60.0) -> dict:
        """Returns the write token {kafka partition: offset}."""
        return dict(self.write_response(database, lines, precision, timeout_s).token.offsets)

    def write_response(self, database: str, lines: bytes | str, precision: str = "ns",
                       timeout_s: float = 60.0) -> write_pb2.WriteResponse:
        """The Write answer: `token_text` is the printable write token `query(after=...)` takes."""
        if isinstance(lines, str):
            lines = lines.encode()
        return self.write_stub.Write(write_pb2.WriteRequest(database=database, line_protocol=lines,
                                                            precision=precision), timeout=timeout_s)

    def write_arrow(self, database: str, tables: dict, timeout_s: float = 60.0) -> dict:
        """Columnar write. `tables`: {table name: (pa.Table | pa.RecordBatch, roles)} where roles is
        {column: "tag" | "field" | "time"} (or a list of (column, role) pairs), one per column.

        Returns the write token {kafka partition: offset}.
        """
        req = write_pb2.WriteArrowRequest(database=database)
        for name, (data, roles) in tables.items():
            if isinstance(data, pa.RecordBatch):
                data = pa.Table.from_batches([data])
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, data.schema) as w:
                w.write_table(data)
            t = req.tables.add(table=name, arrow_ipc=sink.getvalue().to_pybytes())
            for col, role in (roles.items() if isinstance(roles, dict) else roles):
                if isinstance(role, str):
                    if role.lower() not in _ROLES:
                        raise ValueError(f"column {col!r}: role must be tag, field or time, got {role!r}")
                    role = _ROLES[role.lower()]
                t.columns.add(name=col, role=role)
        r = self.write_stub.WriteArrow(req, timeout=timeout_s)
        return dict(r.token.offsets)

    def query(self, database: str, sql: str, timeout_s: float = 120.0, after: str = "",
              allow_partial: bool = False) -> pa.Table:
        """The answer of `sql`. `after`: a printable write token (WriteResponse.token_text): the query
        runs once that write is visible (DEADLINE_EXCEEDED past `timeout_s`); `allow_partial`: during
        a replay after a restart, answer at once (marked partial, see `query_with_watermark`)."""
        return self.query_with_watermark(database, sql, timeout_s, after, allow_partial)[0]

    def query_with_watermark(self, database: str, sql: str, timeout_s: float = 120.0, after: str = "",
                             allow_partial: bool = False) -> tuple[pa.Table, dict]:
        """(answer, what it reflects): {applied_hi_inclusive, visible_hi_inclusive ({kp: offset}),
        partial, topic, topic_id, epoch}."""
        tables, info = [], {}
        req = query_pb2.QueryRequest(database=database, sql=sql, after=after, allow_partial=allow_partial)
        for resp in self.query_stub.Query(req, timeout=timeout_s):
            tables.append(pa.ipc.open_stream(pa.py_buffer(resp.arrow_ipc)).read_all())
            if not info:
                info = {"applied_hi_inclusive": dict(sorted(resp.applied_hi_inclusive.items())),
                        "visible_hi_inclusive": dict(sorted(resp.visible_hi_inclusive.items())),
                        "partial": resp.partial, "topic": resp.topic, "topic_id": resp.topic_id,
                        "epoch": resp.epoch}
        return (pa.concat_tables(tables) if tables else pa.table({})), info

    def status_proto(self, database: str = "", pool_members: bool = False) -> management_pb2.GetStatusResponse:
        return self.mgmt_stub.GetStatus(management_pb2.GetStatusRequest(database=database, pool_members=pool_members),
                                        timeout=30)

    def pool_status(self, timeout_s: float = 10.0) -> dict:
        """`iox status --pool`: every member of the ingester pool this server belongs to (as
        published in the pool's object store), each asked for its status with this client's token:
        {"members": [{"member", "address", "reachable", "frozen", "databases": [{"name",
        "partitions": [{"partition", "epoch", "applied_hi_inclusive", "high_watermark",
        "lag_messages", "lag_bytes"}]}]}]}, a member that does not answer with "reachable": False
        and its error. The partitions are those the member owns, with the epoch it claimed them at.
        Raises grpc.RpcError when this server cannot be asked, NotAPoolMember when it is no pool member."""
        st = self.status_proto(pool_members=True)
        if not st.pool_member:
            raise NotAPoolMember(f"the server at {self.addr} is not a member of an ingester pool (--pool-member)")
        members = []
        for m in st.pool_members:
            entry = {"member": m.member, "address": m.address, "host": m.host}
            other = self if m.address == self.addr else IoxClient(m.address, token=self._token)
            try:
                ms = other.mgmt_stub.GetStatus(management_pb2.GetStatusRequest(), timeout=timeout_s)
            except grpc.RpcError as e:
                members.append({**entry, "reachable": False, "error": f"{e.code().name}: {e.details()}"})
                continue
            finally:
                if other is not self:
                    other.close()
            members.append({**entry, "reachable": True, "frozen": ms.freeze.frozen,
                            "databases": [owned_partitions_status(d, ms.pool_member) for d in ms.databases
                                          if d.owned_partitions]})
        return {"members": members}

    def status(self, database: str = "") -> dict:
        """GetStatus as a dict; every field present (zeros included), int64 as int."""
        return as_dict(self.status_proto(database))

    def delete(self, database: str, start: str | int, stop: str | int, predicate: str = "", table: str = "",
               timeout_s: float = 60.0) -> dict:
        """Returns the delete's write token {kafka partition: offset}."""
        return dict(self.delete_response(database, start, stop, predicate, table, timeout_s).offsets)

    def delete_response(self, database: str, start: str | int, stop: str | int, predicate: str = "",
                        table: str = "", timeout_s: float = 60.0) -> delete_pb2.DeleteResponse:
        """The Delete answer: `token_text` is the printable write token `query(after=...)` takes."""
        return self.delete_stub.Delete(delete_pb2.DeleteRequest(database=database, table=table, start=str(start),
                                                                stop=str(stop), predicate=predicate),
                                       timeout=timeout_s)

    def persist(self, database: str, table: str = "", partition_key: str = "", timeout_s: float = 300.0) -> dict:
        r = self.mgmt_stub.Persist(management_pb2.PersistRequest(database=database, table=table,
                                                                  partition_key=partition_key), timeout=timeout_s)
        return as_dict(r)

    def compact(self, database: str, table: str, partition_key: str, timeout_s: float = 300.0,
                persisted: bool = False) -> dict:
        r = self.mgmt_stub.Compact(management_pb2.CompactRequest(database=database, table=table,
                                                                  partition_key=partition_key, persisted=persisted),
                                   timeout=timeout_s)
        return as_dict(r)

    def retry_poisoned(self, database: str, partition: int | None = None, offset: int | None = None,
                       timeout_s: float = 300.0) -> list:
        """Applies the database's held poisoned messages again (of `partition`, at `offset`, when
        given); returns them (dicts, as in status) as they are now."""
        r = self.mgmt_stub.RetryPoisoned(_poisoned_request(database, partition, offset), timeout=timeout_s)
        return as_dict(r)["messages"]

    def accept_poisoned(self, database: str, partition: int | None = None, offset: int | None = None,
                        timeout_s: float = 300.0) -> list:
        """Skips the database's held poisoned messages for good (recorded, marked accepted);
        returns them (dicts, as in status)."""
        r = self.mgmt_stub.AcceptPoisoned(_poisoned_request(database, partition, offset), timeout=timeout_s)
        return as_dict(r)["messages"]

    def accept_lost_writes(self, database: str, timeout_s: float = 300.0) -> dict:
        """Accepts the database's lost writes while the server runs; returns {accepted: [...], epoch, new_topic}."""
        r = self.mgmt_stub.AcceptLostWrites(management_pb2.AcceptLostWritesRequest(database=database),
                                            timeout=timeout_s)
        return as_dict(r)

    def freeze(self, reason: str = "", timeout_s: float = 120.0) -> dict:
        """Freezes the server (server/write_buffer/freeze.py); returns {frozen, reason, since_s, offsets}."""
        return as_dict(self.mgmt_stub.Freeze(management_pb2.FreezeRequest(reason=reason), timeout=timeout_s))

    def claim_partitions(self, database: str, partitions, timeout_s: float = 120.0) -> dict:
        """Ingester pool: claims Kafka `partitions` of `database` for this server; returns {database,
        claimed: [{partition, epoch, resume_offset}], catalog_revision}."""
        req = management_pb2.ClaimPartitionsRequest(database=database, partitions=list(partitions))
        return as_dict(self.mgmt_stub.ClaimPartitions(req, timeout=timeout_s))

    def verify(self, database: str, table: str = "", max_differences: int = 0, timeout_s: float = 900.0,
               here_only: bool = False) -> dict:
        """`iox verify`: the server checks its answers against its write buffer; returns the report
        ({database, partitions: [...], difference_count, ok}; each difference's `want` and `got` as
        dicts, None for no row)."""
        import json

        out = as_dict(self.verify_proto(database, table, max_differences, timeout_s, here_only))
        for p in out["partitions"]:
            for d in p["differences"]:
                d["want"], d["got"] = json.loads(d.pop("want_json")), json.loads(d.pop("got_json"))
        return out

    def verify_proto(self, database: str, table: str = "", max_differences: int = 0, timeout_s: float = 900.0,
                     here_only: bool = False) -> management_pb2.VerifyResponse:
        req = management_pb2.VerifyRequest(database=database, table=table, max_differences=max_differences,
                                           here_only=here_only)
        return self.mgmt_stub.Verify(req, timeout=timeout_s)

    def unfreeze(self, timeout_s: float = 60.0) -> dict:
        """Ends frozen mode; returns {frozen, reason, since_s, offsets} as it is now."""
        return as_dict(self.mgmt_stub.Unfreeze(management_pb2.UnfreezeRequest(), timeout=timeout_s))

    def set_retention(self, database: str, period_s: int, timeout_s: float = 60.0) -> dict:
        """Sets (period_s > 0) or removes (0) the database's retention; returns {database, period_s,
        reader_lo_ns?, pruner_hi_ns?}."""
        r = self.mgmt_stub.SetRetention(management_pb2.SetRetentionRequest(database=database, period_s=period_s),
                                        timeout=timeout_s)
        return as_dict(r)

    def create_downsampler(self, database: str, table: str, every: str, aggregates: str, into: str,
                           group_by_tags: str = "all", start: str = "", timeout_s: float = 60.0) -> dict:
        """Creates a downsampler of `database`.`table` into `into` ("DST" or "DST.TABLE"); returns its
        status ({name, state, progress, ...}: `iox downsample list`)."""
        req = management_pb2.CreateDownsamplerRequest(database=database, table=table, every=every,
                                                      aggregates=aggregates, group_by_tags=group_by_tags,
                                                      into=into, start=start)
        return as_dict(self.mgmt_stub.CreateDownsampler(req, timeout=timeout_s))

    def list_downsamplers(self, database: str = "", timeout_s: float = 30.0) -> list:
        """Every downsampler (whose source or destination is `database`, when given), as dicts."""
        resp = self.mgmt_stub.ListDownsamplers(management_pb2.ListDownsamplersRequest(database=database),
                                               timeout=timeout_s)
        return [as_dict(d) for d in resp.downsamplers]

    def drop_downsampler(self, name: str, timeout_s: float = 60.0) -> dict:
        """Drops downsampler `name` ("<destination database>.<destination table>"); returns its last status."""
        req = management_pb2.DropDownsamplerRequest(database=name.partition(".")[0], name=name)
        return as_dict(self.mgmt_stub.DropDownsampler(req, timeout=timeout_s))

    def applied(self, database: str) -> dict:
        """{kafka partition: applied_hi_inclusive}."""
        out = {}
        for db in self.status_proto(database).databases:
            for wb in db.write_buffer:
                out[wb.partition] = wb.applied_hi_inclusive
        return out

    def visible(self, database: str) -> dict:
        """{kafka partition: visible_hi_inclusive}: every offset up to it is queryable (applied, or
        read from the write buffer's tail)."""
        out = {}
        for db in self.status_proto(database).databases:
            for wb in db.write_buffer:
                out[wb.partition] = max(wb.visible_hi_inclusive, wb.applied_hi_inclusive)
        return out

    def wait_visible(self, database: str, token: dict, timeout_s: float = 30.0) -> None:
        """Waits until every offset of a write token is visible to queries (see `visible`)."""
        self._wait_watermark(database, token, timeout_s, self.visible, "visible")

    def wait_caught_up(self, database: str, timeout_s: float = 120.0) -> None:
        """Waits until a restarted server replayed everything the write buffer held at its start."""
        deadline = time.monotonic() + timeout_s
        while True:
            dbs = self.status_proto(database).databases
            if dbs and not dbs[0].replaying:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{database}: replay not caught up within {timeout_s}s")
            time.sleep(0.1)

    def wait_applied(self, database: str, token: dict, timeout_s: float = 30.0) -> None:
        """Waits until every offset of a write token is applied to the catalog (queryable, also
        through Spark Connect's views, and seen by the lifecycle)."""
        self._wait_watermark(database, token, timeout_s, self.applied, "applied")

    @staticmethod
    def _wait_watermark(database: str, token: dict, timeout_s: float, read, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            have = read(database)
            if all(have.get(int(p), -1) >= off for p, off in token.items()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"write token {token} not {what} within {timeout_s}s ({what}: {have})")
            time.sleep(0.05)


def _poisoned_request(database: str, partition: int | None, offset: int | None):
    req = management_pb2.PoisonedRequest(database=database)
    if partition is not None:
        req.partition = partition
    if offset is not None:
        req.offset = offset
    return req


_INT64_TYPES = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})


def owned_partitions_status(d, member: str) -> dict:
    """{"name", "partitions": [...]} of the DatabaseStatus `d` of pool member `member`: the
    partitions it owns, each with the epoch it claimed it at and its write-buffer watermarks."""
    epochs = {o.partition: o.epoch for o in d.owners if o.owner == member}
    marks = {w.partition: w for w in d.write_buffer}
    parts = []
    for kp in sorted(d.owned_partitions):
        w = marks.get(kp)
        parts.append({"partition": kp, "epoch": epochs.get(kp),
                      **({} if w is None else {"applied_hi_inclusive": w.applied_hi_inclusive,
                                               "high_watermark": w.high_watermark, "lag_messages": w.lag_messages,
                                               "lag_bytes": w.lag_bytes})})
    return {"name": d.name, "partitions": parts}


def as_dict(msg) -> dict:
    """A response as a dict: every field present (zeros included), field names as in the .proto,
    and 64-bit integers as ints (protobuf's JSON mapping writes them as strings)."""
    return _ints_as_ints(msg.DESCRIPTOR, MessageToDict(msg, preserving_proto_field_name=True,
                                                       always_print_fields_with_no_presence=True))


def _ints_as_ints(descriptor, d: dict) -> dict:
    for f in descriptor.fields:
        if f.name not in d:
            continue
        v = d[f.name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            if value_field.type in _INT64_TYPES:
                d[f.name] = {k: int(x) for k, x in v.items()}
            elif value_field.message_type is not None:
                d[f.name] = {k: _ints_as_ints(value_field.message_type, x) for k, x in v.items()}
        elif f.message_type is not None:
            d[f.name] = ([_ints_as_ints(f.message_type, x) for x in v] if isinstance(v, list)
                         else _ints_as_ints(f.message_type, v))
        elif f.type in _INT64_TYPES:
            d[f.name] = [int(x) for x in v] if isinstance(v, list) else int(v)
    return d
