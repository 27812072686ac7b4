"""RouterAdminService: proto <-> domain conversion and thin handlers (errors become gRPC
codes in the shared interceptor: NotFound, FailedPrecondition, InvalidArgument, AlreadyExists)."""

from __future__ import annotations

import grpc

from services.common.convert import PHASE_TO_PROTO
from services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from services.router.core.model import Session
from services.router.core.state import SessionBusy, UnknownSession
from services.router.replicas import ReplicaEntry
from services.router.runtime import RouterRuntime
from tao.common.v1 import common_pb2
from tao.router.v1 import router_pb2, router_pb2_grpc

MAX_LIST = 10_000


class RouterAdmin(router_pb2_grpc.RouterAdminServiceServicer):
    def __init__(self, rt: RouterRuntime) -> None:
        self.rt = rt

    def _session(self, s: Session) -> router_pb2.SessionInfo:
        return router_pb2.SessionInfo(
            session_id=s.id, tenant=s.tenant, phase=PHASE_TO_PROTO[self.rt.core.phase(s)], replica=s.replica or "",
            admitted=s.admitted, context_tokens=s.tokens.context_tokens, footprint_tokens=s.footprint_tokens,
            requests=s.tokens.requests, last_cached_tokens=s.last_cached_tokens, last_ttft_s=s.last_ttft_s or 0.0,
            updated_at_unix_s=self.rt.to_unix(s.updated_s), model=s.model,
        )

    def _replica(self, e: ReplicaEntry) -> router_pb2.ReplicaInfo:
        core = self.rt.core
        view = core.replicas.get(e.id) or e.view()
        admitted = sum(1 for s in core.sessions.values() if s.admitted and s.replica == e.id)
        return router_pb2.ReplicaInfo(
            id=e.id, url=e.url, healthy=view.healthy, draining=view.draining,
            kv_capacity_tokens=view.kv_capacity_tokens, capacity_tokens=core.capacity(e.id),
            used_tokens=max(0, core.used.get(e.id, 0)), running=view.running, waiting=view.waiting,
            kv_cache_usage=view.kv_cache_usage, admitted_sessions=admitted, models=list(view.models),
            block_size=view.block_size,
        )

    async def ListSessions(self, request: router_pb2.ListSessionsRequest,
                           context: grpc.aio.ServicerContext) -> router_pb2.ListSessionsResponse:
        if request.limit < 0 or request.limit > MAX_LIST:
            raise InvalidArgument(f"limit must be in [0, {MAX_LIST}], got {request.limit}")
        if request.phase == common_pb2.SESSION_PHASE_ENDED:
            return router_pb2.ListSessionsResponse()  # ended sessions are forgotten
        if request.phase not in (common_pb2.SESSION_PHASE_UNSPECIFIED, *PHASE_TO_PROTO.values()):
            raise InvalidArgument(f"unknown phase {request.phase}")
        limit = request.limit or MAX_LIST
        core = self.rt.core
        out = []
        for sid in sorted(core.sessions):
            s = core.sessions[sid]
            if request.tenant and s.tenant != request.tenant:
                continue
            if request.phase and PHASE_TO_PROTO[core.phase(s)] != request.phase:
                continue
            out.append(self._session(s))
            if len(out) >= limit:
                break
        return router_pb2.ListSessionsResponse(sessions=out)

    async def ExplainSession(self, request: router_pb2.ExplainSessionRequest,
                             context: grpc.aio.ServicerContext) -> router_pb2.ExplainSessionResponse:
        s = self.rt.core.sessions.get(request.session_id)
        if s is None:
            raise NotFound(f"unknown session {request.session_id!r}")
        reason = self.rt.core.explain(s.id)
        if self.rt.core.config.gating and self.rt.planner_silent():
            reason += f"; planner silent, local fallback {self.rt.fallback.name} admits"
        applied = self.rt.plans.fence.applied
        revision = common_pb2.Revision(epoch=applied.epoch, revision=applied.rev) if applied else None
        return router_pb2.ExplainSessionResponse(session=self._session(s), reason=reason, applied_plan=revision)

    async def ReleaseSession(self, request: router_pb2.ReleaseSessionRequest,
                             context: grpc.aio.ServicerContext) -> router_pb2.ReleaseSessionResponse:
        try:
            self.rt.release(request.session_id, request.force)
        except UnknownSession as exc:
            raise NotFound(str(exc)) from exc
        except SessionBusy as exc:
            raise FailedPrecondition(str(exc)) from exc
        return router_pb2.ReleaseSessionResponse(released=True)

    async def ListReplicas(self, request: router_pb2.ListReplicasRequest,
                           context: grpc.aio.ServicerContext) -> router_pb2.ListReplicasResponse:
        entries = sorted(self.rt.registry.entries.values(), key=lambda e: e.id)
        return router_pb2.ListReplicasResponse(replicas=[self._replica(e) for e in entries])

    async def AddReplica(self, request: router_pb2.AddReplicaRequest,
                         context: grpc.aio.ServicerContext) -> router_pb2.AddReplicaResponse:
        if not request.url:
            raise InvalidArgument("url is required")
        # ids end up in Redis keys, Prometheus labels and response headers: bound them
        if request.id and (len(request.id) > 256 or not request.id.isprintable()):
            raise InvalidArgument("replica id must be 1-256 printable characters")
        entry, _ = self.rt.registry.add(request.id, request.url, int(request.kv_capacity_tokens))
        return router_pb2.AddReplicaResponse(replica=self._replica(entry))

    async def DrainReplica(self, request: router_pb2.DrainReplicaRequest,
                           context: grpc.aio.ServicerContext) -> router_pb2.DrainReplicaResponse:
        entry = self.rt.registry.drain(request.id)
        return router_pb2.DrainReplicaResponse(replica=self._replica(entry))
