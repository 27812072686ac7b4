"""The OpenAI-compatible HTTP gateway (aiohttp).

Routes: POST /v1/chat/completions, POST /v1/completions (streaming and not), GET /v1/models
(aggregated from the replicas' last answers, so a down replica never makes it fail), GET
/health (200 while at least one replica takes requests, else 503), GET /metrics, POST
/v1/sessions/{id}/release (``?force=true`` while a request is in flight) and ThunderAgent's
POST /programs/release ``{"program_id": ...}`` -> ``{"program_id", "released"}``; GET
/v1/sessions and GET /v1/sessions/{id}: the operators' list and "why is it waiting" answer
(``sessions_http.py``, ``core/explain.py``; ``tao sessions`` / ``tao explain``).

Session: ``x-session-id`` header, else ``program_id`` in the body or in a literal
``extra_body`` object; none -> a single-turn session. Every error is an OpenAI-style
``{"error": {"message", "type", "param", "code"}}``; a rejected request changes nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.common import tracing
from services.router import sessions_http
from services.router import tracing as router_tracing
from services.router.auth import Authenticator, ReloadingAuthenticator, bearer_key
from services.router.core.model import Grant, NewRequest
from services.router.core.ratelimit import parse_limits
from services.router.core.state import SessionBusy, SessionConflict, UnknownSession
from services.router.proxy import Exchange, error_response, serve, unavailable
from services.router.ratelimit import RateLimiter, admit
from services.router.runtime import HoldTimeout, RouterRuntime, SessionReleased
from services.router.validation import RequestError, check_context, check_session_id, parse_request

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: the x-ratelimit-* headers of a rate-limited tenant's request, added to its answer
RATE_HEADERS = web.RequestKey("tao_rate_headers", dict)


class Gateway:
    def __init__(self, rt: RouterRuntime, auth: Authenticator | None) -> None:
        self.rt = rt
        self.auth = auth
        self.settings = rt.settings
        self.limiter = RateLimiter(rt.ctx.redis, rt.ctx.metrics, self.settings.rate_limit_timeout_s, rt.log)
        self.base_limits = parse_limits(self.settings.rate_limits, "rate_limits")

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[*tracing.aiohttp_middlewares(), self._errors])
        app.on_response_prepare.append(self._rate_headers)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/sessions/{session_id}/release", self.release_session)
        app.router.add_post("/programs/release", self.release_program)
        app.router.add_get("/v1/sessions", self.list_sessions)
        app.router.add_get("/v1/sessions/{session_id}", self.explain_session)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as err:
            return error_response(err)
        except web.HTTPRequestEntityTooLarge:
            return error_response(RequestError(
                413, f"request body larger than {self.settings.max_body_bytes} bytes", code="request_too_large"))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(RequestError(exc.status, exc.reason, code=None))
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # a bug: answer like OpenAI would, and leave a trace
            self.rt.log.error("unhandled error", path=request.path, error=repr(exc), exc_info=True)
            return error_response(RequestError(500, "internal router error", code="internal_error",
                                               type_="server_error"))

    # ------------------------------------------------------------------ helpers

    @staticmethod
    async def _rate_headers(request: web.Request, response: web.StreamResponse) -> None:
        """OpenAI's ``x-ratelimit-*`` headers on every answer of a rate-limited tenant."""
        headers = request.get(RATE_HEADERS)
        if headers:
            response.headers.update(headers)

    def tenant(self, request: web.Request) -> str:
        if self.auth is None:
            return request.headers.get(self.settings.dev_tenant_header) or self.settings.default_tenant
        key = bearer_key(request.headers.get("Authorization"), request.headers.get("api-key"))
        tenant = self.auth.tenant_for(key)
        if tenant is None:
            raise RequestError(401, "Incorrect API key provided." if key else "Missing API key: send "
                               "'Authorization: Bearer <key>'.", code="invalid_api_key")
        return tenant

    def viewer(self, request: web.Request) -> str | None:
        """Whose sessions the caller may see: None = all (dev mode, or the admin token)."""
        if self.auth is None:
            return None
        key = bearer_key(request.headers.get("Authorization"), request.headers.get("api-key"))
        admin = self.settings.admin_secret()
        if key and admin and hmac.compare_digest(key.encode(), admin.encode()):
            return None
        return self.tenant(request)

    async def body(self, request: web.Request) -> bytes:
        length = request.content_length
        if length is not None and length > self.settings.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.settings.max_body_bytes, actual_size=length)
        return await request.read()

    # ------------------------------------------------------------------ completions

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "/v1/chat/completions", chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "/v1/completions", chat=False)

    async def _complete(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        rt = self.rt
        entered = rt.now()
        tenant = self.tenant(request)
        parsed = parse_request(await self.body(request), chat)
        header_sid = request.headers.get("x-session-id")
        session_id = check_session_id(header_sid, "x-session-id") if header_sid is not None else parsed.session_id
        if not rt.models:
            return unavailable(rt, "no replica is available yet")
        if parsed.model not in rt.models:
            raise RequestError(404, f"The model `{parsed.model}` does not exist.", param="model",
                               code="model_not_found")
        check_context(parsed, rt.max_model_len(parsed.model))
        limits = {**self.base_limits, **self.auth.limits} if isinstance(self.auth, ReloadingAuthenticator) \
            else self.base_limits
        if limits:
            decision, rate_headers = await admit(self.limiter, limits, tenant, parsed.prompt_tokens_estimate,
                                                 parsed.max_tokens, self.settings.default_output_tokens,
                                                 rt.clock.unix())
            if decision is not None and not decision.allowed:  # OpenAI's 429; nothing changed
                rt.metrics.count_request(path, 429)
                return web.json_response(decision.error_body(tenant), status=429, headers=rate_headers)
            request[RATE_HEADERS] = rate_headers
        if len(rt.core.held) >= self.settings.max_held_requests:
            return unavailable(rt, "too many requests are held; retry later")
        request_id = os.urandom(16).hex()  # 128 random bits, like uuid4().hex without the UUID object
        single = session_id is None
        sid = f"req-{request_id}" if session_id is None else session_id
        router_tracing.annotate(request_id, sid, tenant)
        arrived = rt.now()
        try:
            pending = rt.submit(NewRequest(request_id, sid, tenant, single, parsed.prompt_tokens_estimate,
                                           parsed.max_tokens))
        except SessionConflict as exc:
            raise RequestError(409, str(exc), param="x-session-id", code="session_conflict") from exc
        own_s = rt.now() - entered
        if isinstance(pending, Grant):
            grant = pending
        else:
            hold = router_tracing.start_hold(rt, request_id)
            try:
                grant = await rt.wait_grant(request_id, pending, arrived)
            except HoldTimeout as exc:
                router_tracing.end_hold(rt, hold, f"hold timeout: {exc.reason}")
                rt.metrics.count_request(path, 503)
                return unavailable(rt, f"not admitted within {rt.now() - arrived:.3g} s: {exc.reason}")
            except SessionReleased:
                router_tracing.end_hold(rt, hold, "session released")
                raise RequestError(409, "the session was released", code="session_released") from None
            except BaseException:
                router_tracing.end_hold(rt, hold, "client gone")
                raise
            router_tracing.end_hold(rt, hold)
        granted = rt.now()
        rt.metrics.hold.observe(granted - arrived)
        ex = Exchange(request_id, sid, tenant, path, parsed, arrived, arrived + self.settings.hold_timeout_s,
                      pre_s=own_s, mark_s=granted, hold_s=granted - arrived)
        response = await serve(rt, request, ex, grant)
        rt.metrics.count_request(path, response.status)
        return response

    # ------------------------------------------------------------------ the rest

    async def list_models(self, request: web.Request) -> web.Response:
        self.tenant(request)
        cards: dict[str, dict[str, object]] = {}
        for entry in self.rt.registry.entries.values():
            if entry.view().healthy:
                for card in entry.model_cards:
                    cards.setdefault(str(card.get("id")), card)
        return web.json_response({"object": "list", "data": [cards[k] for k in sorted(cards)]})

    async def health(self, request: web.Request) -> web.Response:
        views = [e.view() for e in self.rt.registry.entries.values()]
        ok = sum(1 for v in views if v.healthy and not v.draining)
        body = {
            "status": "ok" if ok else "unavailable",
            "replicas": {"healthy": ok, "total": len(views)},
            "policy": self.rt.policy.name,
            "planner_silent": self.rt.core.config.gating and self.rt.planner_silent(),
            "sessions": len(self.rt.core.sessions),
            "held_requests": len(self.rt.core.held),
        }
        return web.json_response(body, status=200 if ok else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.rt.ctx.metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _release(self, tenant: str, session_id: str, force: bool) -> bool:
        s = self.rt.core.sessions.get(session_id)
        if s is None or s.tenant != tenant:
            return False
        self.rt.release(session_id, force)
        return True

    async def release_session(self, request: web.Request) -> web.Response:
        tenant = self.tenant(request)
        sid = check_session_id(request.match_info["session_id"], "session_id")
        force = request.query.get("force", "").lower() in ("1", "true", "yes")
        try:
            released = self._release(tenant, sid, force)
        except SessionBusy as exc:
            raise RequestError(409, str(exc), code="session_busy") from exc
        except UnknownSession:
            released = False
        if not released:
            raise RequestError(404, f"unknown session {sid!r}", param="session_id", code="session_not_found")
        return web.json_response({"session_id": sid, "released": True})

    async def list_sessions(self, request: web.Request) -> web.Response:
        return web.json_response(sessions_http.list_sessions(self.rt, self.viewer(request), dict(request.query)))

    async def explain_session(self, request: web.Request) -> web.Response:
        viewer = self.viewer(request)
        sid = check_session_id(request.match_info["session_id"], "session_id")
        return web.json_response(await sessions_http.explain(self.rt, sid, viewer))

    async def release_program(self, request: web.Request) -> web.Response:
        tenant = self.tenant(request)
        try:
            payload = await request.json()
        except (ValueError, RecursionError):
            raise RequestError(400, "Invalid JSON", code="invalid_json") from None
        if not isinstance(payload, dict) or not payload.get("program_id"):
            raise RequestError(400, "Missing program_id", param="program_id", code="missing_required_parameter")
        pid = check_session_id(payload["program_id"], "program_id")
        try:
            released = self._release(tenant, pid, force=True)
        except UnknownSession:
            released = False
        return web.json_response({"program_id": pid, "released": released})
