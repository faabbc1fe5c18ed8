"""gRPC services: Write, Query, Management; plus health and reflection.

Invariant: every ServerError maps to one gRPC status a user can act on
(INVALID_ARGUMENT with a google.rpc.BadRequest for bad lines, NOT_FOUND,
RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, FAILED_PRECONDITION); anything else is INTERNAL and logged.
A query waits at its read barrier (server/query/read_barrier.py): a replay not caught up by its deadline is
UNAVAILABLE with the replay's progress, a write token not visible by then DEADLINE_EXCEEDED, a token of another
write-buffer epoch or topic incarnation FAILED_PRECONDITION (of another database, or malformed: INVALID_ARGUMENT).
A query the SQL sandbox refuses (server/query/sql_sandbox.py) is PERMISSION_DENIED, or INVALID_ARGUMENT when it is
no query at all (NotAQuery).
A fenced database (DatabaseFenced, or the catalog's RevisionConflict of an `iox persist` / `iox compact`
that found it fenced) is FAILED_PRECONDITION naming the other server's revision.
With tokens (server/api/auth.py), an RPC without a valid `authorization` token is UNAUTHENTICATED and one
its token may not make (database, permission) PERMISSION_DENIED; health and reflection stay open.
"""
from __future__ import annotations

import logging
from concurrent import futures

import grpc
import pyarrow as pa
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from iox_spark.iox import delete_pb2, delete_pb2_grpc, management_pb2, management_pb2_grpc, query_pb2, query_pb2_grpc, write_pb2, write_pb2_grpc

from iox_spark.catalog.errors import RevisionConflict

from iox_spark.catalog.errors import PartitionsNotOwned
from iox_spark.server.errors import (NotAPoolMember, PoolMemberUnavailable, RoleRefuses, WriteBufferOverloaded, BadLines, CatchUpTimedOut, DatabaseFenced, DatabaseNotFound, TopicReplaced, WritesLost, InvalidArgument, RequestTooLarge, ServerError,
                     WriteBufferUnavailable, NotAQuery, QueryRefused)
from iox_spark.server.errors import (ColumnAgreementUnavailable, NothingToAccept, NotPartitionOwner, NotReadyToAccept, OwnerNotCaughtUp,
                           OwnershipMoving,
                           PoisonedMessageNotFound, StreamRestartTimedOut)
from iox_spark.server.errors import NotServed, QueryTimedOut, ReplayNotCaughtUp, WriteTokenNotVisible, WriteTokenOfOtherIncarnation
from iox_spark.server.errors import DownsamplerExists, DownsamplerNotFound
from iox_spark.server.api.api_parts import ApiParts
from iox_spark.server.api.auth import PermissionDenied, current_scope
from iox_spark.server.write.router import ArrowTableWrite
from iox_spark.server.pool.rows import NOT_OWNER_METADATA, scans_of
from iox_spark.server.write_buffer.write_token import format_token, token_for

__all__ = ["build_grpc_server", "SERVICE_NAMES"]

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    write_pb2.DESCRIPTOR.services_by_name["WriteService"].full_name,
    query_pb2.DESCRIPTOR.services_by_name["QueryService"].full_name,
    management_pb2.DESCRIPTOR.services_by_name["ManagementService"].full_name,
    delete_pb2.DESCRIPTOR.services_by_name["DeleteService"].full_name,
)
#: Rows per Arrow record batch streamed back by Query.
QUERY_BATCH_ROWS = 64_000
#: gRPC message size limit of responses (a query answer is one message per Arrow batch).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
#: A request message may be this much larger than --max-request-bytes: its protobuf framing
#: (database and table names, column roles). grpc refuses a larger message with RESOURCE_EXHAUSTED
#: before it is read into memory.
REQUEST_FRAMING_BYTES = 1024 * 1024
#: WriteArrow column roles -> the router's role names ("unspecified" is rejected there).
_ROLE_NAMES = {write_pb2.ColumnRole.TAG: "tag", write_pb2.ColumnRole.FIELD: "field",
               write_pb2.ColumnRole.TIME: "time", write_pb2.ColumnRole.ROLE_UNSPECIFIED: "unspecified"}


def _abort(context, err: Exception):
    """Aborts the RPC with the status that belongs to `err`."""
    if isinstance(err, RevisionConflict):
        err = DatabaseFenced(err.db, err.revision)
    if isinstance(err, PoisonedMessageNotFound):
        context.abort(grpc.StatusCode.NOT_FOUND, str(err))
    if isinstance(err, NotPartitionOwner):  # the asking pool member reads the owners again (server/pool/membership.py)
        context.set_trailing_metadata(((NOT_OWNER_METADATA, ",".join(map(str, err.partitions))),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    if isinstance(err, (OwnerNotCaughtUp, ColumnAgreementUnavailable, OwnershipMoving, StreamRestartTimedOut)):
        context.set_trailing_metadata((("retry-after-s", str(err.retry_after_s)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    if isinstance(err, NothingToAccept):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    if isinstance(err, NotReadyToAccept):
        context.set_trailing_metadata((("retry-after-s", str(err.retry_after_s)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    if isinstance(err, BadLines):
        br = error_details_pb2.BadRequest()
        for line, reason in err.errors:
            v = br.field_violations.add()
            v.field = f"line {line}"
            v.description = reason
        detail = any_pb2.Any()
        detail.Pack(br)
        st = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(err), details=[detail])
        context.abort_with_status(rpc_status.to_status(st))
    if isinstance(err, NotServed):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, str(err))
    if isinstance(err, (InvalidArgument, NotAQuery)):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    if isinstance(err, (QueryRefused, PermissionDenied)):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
    if isinstance(err, (DatabaseNotFound, DownsamplerNotFound)):
        context.abort(grpc.StatusCode.NOT_FOUND, str(err))
    if isinstance(err, DownsamplerExists):
        context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err))
    if isinstance(err, (CatchUpTimedOut, WriteTokenNotVisible, QueryTimedOut)):
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(err))
    if isinstance(err, WriteTokenOfOtherIncarnation):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    if isinstance(err, ReplayNotCaughtUp):
        context.set_trailing_metadata((("retry-after-s", str(err.retry_after_s)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    if isinstance(err, (WritesLost, TopicReplaced, DatabaseFenced, NotAPoolMember, PartitionsNotOwned, RoleRefuses)):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
    if isinstance(err, (RequestTooLarge, WriteBufferOverloaded)):
        if isinstance(err, WriteBufferOverloaded):
            context.set_trailing_metadata((("retry-after-s", str(err.retry_after_s)),))
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
    if isinstance(err, (WriteBufferUnavailable, PoolMemberUnavailable)):
        context.set_trailing_metadata((("retry-after-s", str(err.retry_after_s)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
    log.exception("internal error", exc_info=err)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error: {err}")


class _WriteService(write_pb2_grpc.WriteServiceServicer):
    def __init__(self, parts: ApiParts):
        self.parts = parts

    def Write(self, request, context):
        try:
            res = self.parts.router.write_line_protocol(request.database, request.line_protocol,
                                                         request.precision or "ns")
        except ServerError as e:
            _abort(context, e)
        except Exception as e:
            _abort(context, e)
        return _write_response(self.parts, request.database, res)

    def WriteArrow(self, request, context):
        try:
            tables = [ArrowTableWrite(t.table, t.arrow_ipc, [(c.name, _ROLE_NAMES.get(c.role, str(c.role)))
                                                             for c in t.columns])
                      for t in request.tables]
            res = self.parts.router.write_arrow(request.database, tables)
        except Exception as e:
            _abort(context, e)
        return _write_response(self.parts, request.database, res)


def _write_response(parts: ApiParts, database: str, res) -> write_pb2.WriteResponse:
    """The answer to an acknowledged write: its token, structured and printable
    (server/write_buffer/write_token.py)."""
    t = token_for(parts.catalog, database, res.token)
    return write_pb2.WriteResponse(token=write_pb2.WriteToken(offsets=res.token, epoch=t.epoch if t else 0,
                                                              topic_id=(t.topic_id or "") if t else ""),
                                   points=res.points, topic=res.topic, token_text=format_token(t) if t else "")


class _QueryService(query_pb2_grpc.QueryServiceServicer):
    def __init__(self, parts: ApiParts):
        self.parts = parts

    def UnpersistedRows(self, request, context):
        try:
            for msg in self.parts.queries.unpersisted_rows(request.database, list(request.tables),
                                                           dict(request.wait_applied), context.time_remaining(),
                                                           dict(request.written_before), scans_of(request.reads),
                                                           request.max_bytes):
                yield msg
        except Exception as e:
            _abort(context, e)

    def Query(self, request, context):
        try:
            res = self.parts.queries.query(request.database, request.sql, request.after, request.allow_partial,
                                           deadline_s=context.time_remaining())
        except Exception as e:
            _abort(context, e)
        try:
            sent = False
            for batch in res.batches():  # streamed from Spark as the query runs
                for o in range(0, batch.num_rows, QUERY_BATCH_ROWS):
                    b = batch.slice(o, QUERY_BATCH_ROWS)
                    sent = True
                    yield self._message(res, b)
            if not sent:
                yield self._message(res, None)
        except Exception as e:
            _abort(context, e)
        finally:
            res.close()

    @staticmethod
    def _message(res, batch):
        """One QueryResponse: `batch` (None: no row, the schema only) and what the answer reflects."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, res.schema) as w:
            if batch is not None:
                w.write_batch(batch)
        return query_pb2.QueryResponse(arrow_ipc=sink.getvalue().to_pybytes(),
                                       applied_hi_inclusive=res.applied_hi_inclusive,
                                       visible_hi_inclusive=res.visible_hi_inclusive, partial=res.partial,
                                       topic=res.topic, topic_id=res.topic_id, epoch=res.epoch)


class _DeleteService(delete_pb2_grpc.DeleteServiceServicer):
    def __init__(self, parts: ApiParts):
        self.parts = parts

    def Delete(self, request, context):
        from iox_spark.server.write.deletes import submit_delete

        try:
            token = submit_delete(self.parts.catalog, self.parts.write_buffer, request.database, request.table,
                                  request.start, request.stop, request.predicate)
        except Exception as e:
            _abort(context, e)
        t = token_for(self.parts.catalog, request.database, token)
        return delete_pb2.DeleteResponse(offsets=token, token_text=format_token(t) if t else "")


class _ManagementService(management_pb2_grpc.ManagementServiceServicer):
    def __init__(self, parts: ApiParts):
        self.parts = parts

    def GetStatus(self, request, context):
        scope = current_scope()
        try:
            if request.pool_members and scope is not None:  # the pool's members: server-wide
                scope.check("query", None)
            resp = self.parts.status(request.database, request.pool_members)
        except Exception as e:
            _abort(context, e)
        if scope is not None:  # the token's databases only: the listing, and the freeze's offsets
            kept = [d for d in resp.databases if scope.allows("query", d.name)]
            del resp.databases[:]
            resp.databases.extend(kept)
            for name in [n for n in resp.freeze.offsets if not scope.allows("query", n)]:
                del resp.freeze.offsets[name]
            _keep_allowed(resp.downsamplers, scope)
        return resp

    def Persist(self, request, context):
        try:
            return self.parts.persist(request.database, request.table, request.partition_key,
                                      deadline_s=context.time_remaining())
        except Exception as e:
            _abort(context, e)

    def Compact(self, request, context):
        try:
            return self.parts.compact(request.database, request.table, request.partition_key,
                                      request.persisted, deadline_s=context.time_remaining())
        except Exception as e:
            _abort(context, e)

    def RetryPoisoned(self, request, context):
        try:
            return self.parts.retry_poisoned(request.database, _optional(request, "partition"),
                                             _optional(request, "offset"))
        except Exception as e:
            _abort(context, e)

    def AcceptPoisoned(self, request, context):
        try:
            return self.parts.accept_poisoned(request.database, _optional(request, "partition"),
                                              _optional(request, "offset"))
        except Exception as e:
            _abort(context, e)

    def AcceptLostWrites(self, request, context):
        try:
            return self.parts.accept_lost_writes(request.database)
        except Exception as e:
            _abort(context, e)

    def SetRetention(self, request, context):
        try:
            return self.parts.set_retention(request.database, request.period_s)
        except Exception as e:
            _abort(context, e)

    def Freeze(self, request, context):
        try:
            return self.parts.freeze(request.reason)
        except Exception as e:
            _abort(context, e)

    def Unfreeze(self, request, context):
        try:
            return self.parts.unfreeze()
        except Exception as e:
            _abort(context, e)

    def ClaimPartitions(self, request, context):
        try:
            return self.parts.claim_partitions(request.database, list(request.partitions))
        except Exception as e:
            _abort(context, e)

    def Verify(self, request, context):
        from iox_spark.server.query.verify import report_to_proto

        try:
            return report_to_proto(self.parts.verify(request.database, request.table, request.max_differences,
                                                     request.here_only))
        except Exception as e:
            _abort(context, e)

    def CreateDownsampler(self, request, context):
        scope = current_scope()
        try:
            if scope is not None:  # it writes into its destination: the token must administer both
                dest = (request.into or "").partition(".")[0]
                if dest:
                    scope.check("admin", dest)
            return self.parts.downsamplers.create(request.database, request.table, request.every,
                                                  request.aggregates, request.group_by_tags, request.into,
                                                  request.start)
        except Exception as e:
            _abort(context, e)

    def ListDownsamplers(self, request, context):
        try:
            found = self.parts.downsamplers.list(request.database)
        except Exception as e:
            _abort(context, e)
        resp = management_pb2.ListDownsamplersResponse(downsamplers=found)
        scope = current_scope()
        if scope is not None:
            _keep_allowed(resp.downsamplers, scope)
        return resp

    def DropDownsampler(self, request, context):
        try:
            if request.name.partition(".")[0] != request.database:
                raise InvalidArgument(f"downsampler {request.name!r} is not of database {request.database!r} "
                                      "(a downsampler is named <destination database>.<destination table>)")
            return self.parts.downsamplers.drop(request.name)
        except Exception as e:
            _abort(context, e)

    def ListDatabases(self, request, context):
        scope = current_scope()  # a listing: the token's databases only
        return management_pb2.ListDatabasesResponse(names=[d.name for d in self.parts.catalog.databases()
                                                          if scope is None or scope.allows("query", d.name)])


def _keep_allowed(downsamplers, scope) -> None:
    """Removes from a repeated DownsamplerStatus those whose source or destination the token may not query."""
    kept = [d for d in downsamplers if scope.allows("query", d.source_database)
            and scope.allows("query", d.destination_database)]
    del downsamplers[:]
    downsamplers.extend(kept)


def _optional(request, name: str):
    """The value of an `optional` proto3 field, or None when it is not set."""
    return getattr(request, name) if request.HasField(name) else None


def build_grpc_server(parts: ApiParts, bind: str, port: int, max_workers: int = 16, authenticator=None,
                      max_request_bytes: int = 10 << 20, max_concurrent_rpcs: int | None = None):
    """Creates (does not start) the gRPC server with our services, health and reflection.
    A request message over `max_request_bytes` + REQUEST_FRAMING_BYTES and an RPC beyond
    `max_concurrent_rpcs` in progress are answered RESOURCE_EXHAUSTED by grpc itself.
    With an `authenticator` (server/api/auth.py) every RPC but health and reflection needs a token."""
    opts = [("grpc.max_receive_message_length", max_request_bytes + REQUEST_FRAMING_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0)]
    interceptors = []
    if authenticator is not None and authenticator.enabled:
        from iox_spark.server.api.auth import AuthInterceptor

        interceptors.append(AuthInterceptor(authenticator))
    g = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"), options=opts,
                    interceptors=interceptors, maximum_concurrent_rpcs=max_concurrent_rpcs)
    write_pb2_grpc.add_WriteServiceServicer_to_server(_WriteService(parts), g)
    query_pb2_grpc.add_QueryServiceServicer_to_server(_QueryService(parts), g)
    management_pb2_grpc.add_ManagementServiceServicer_to_server(_ManagementService(parts), g)
    delete_pb2_grpc.add_DeleteServiceServicer_to_server(_DeleteService(parts), g)
    from iox_spark.iox import flight_pb2_grpc

    from iox_spark.server.api.flight import FlightService

    flight_pb2_grpc.add_FlightServiceServicer_to_server(FlightService(parts.queries, QUERY_BATCH_ROWS, _abort, current_scope), g)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, g)
    names = SERVICE_NAMES + (health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, g)
    host = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind  # an IPv6 address
    try:
        bound = g.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio raises it when the port cannot be bound
        bound = 0
    if bound == 0:
        from iox_spark.server.runtime.ports import PortTaken

        raise PortTaken(bind, port, "--grpc-port", "gRPC could not bind it")
    return g, health_servicer, bound
