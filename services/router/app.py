"""The OpenAI-compatible HTTP gateway (aiohttp).

Routes: POST /v1/chat/completions, POST /v1/completions (streaming and not), GET /v1/models
(aggregated from the replicas' last answers, so a down replica never makes it fail), GET
/health (200 while at least one replica takes requests, else 503), GET /metrics, POST
/v1/sessions/{id}/release (``?force=true`` while a request is in flight) and ThunderAgent's
POST /programs/release ``{"program_id": ...}`` -> ``{"program_id", "released"}``; GET
/v1/sessions and GET /v1/sessions/{id}: the operators' list and "why is it waiting" answer
(``sessions_http.py``, ``core/explain.py``; ``tao sessions`` / ``tao explain``).
ThunderAgent's other endpoints answer in its JSON shapes (``core/programs.py``): GET /programs,
GET /profiles[/{id}] (400 "Profiling not enabled", as ThunderAgent without ``--profile``), its
``/health`` fields next to the router's, and its JSON ``/metrics`` with ``?format=json`` or
``Accept: application/json``.

Session: ``x-session-id`` header, else ``program_id`` in the body or in a literal
``extra_body`` object; none -> a single-turn session (or, with ``default_program_id`` set,
that session, as ThunderAgent files every request without a ``program_id`` under "default"). Every error is an OpenAI-style
``{"error": {"message", "type", "param", "code"}}``; a rejected request changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.common import tracing
from services.router import sessions_http
from services.router import tracing as router_tracing
from services.router.auth import Authenticator, ReloadingAuthenticator, bearer_key
from services.router.core import programs
from services.router.core.model import Grant, NewRequest, Session
from services.router.core.ratelimit import limit_for, parse_limits
from services.router.core.state import SessionBusy, SessionConflict, UnknownSession
from services.router.prompt_length import PromptCounter
from services.router.proxy import Exchange, error_response, serve, unavailable
from services.router.ratelimit import RateLimiter, admit
from services.router.runtime import HoldTimeout, RouterRuntime, SessionReleased
from services.router.validation import (
    ParsedRequest,
    RequestError,
    check_context,
    check_session_id,
    parse_request,
)

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
        self.counter = PromptCounter(self.settings.prompt_length, self.settings.tokenize_timeout_s,
                                     self.settings.tokenizer, rt.ctx.metrics, rt.log)

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes,
                              middlewares=[*tracing.aiohttp_middlewares(), self._errors])
        app.on_response_prepare.append(self._rate_headers)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._cleanup)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/sessions/{session_id}/release", self.release_session)
        app.router.add_post("/programs/release", self.release_program)
        app.router.add_get("/programs", self.list_programs)
        app.router.add_get("/profiles", self.profiles)
        app.router.add_get("/profiles/{program_id}", self.profiles)
        app.router.add_get("/v1/sessions", self.list_sessions)
        app.router.add_get("/v1/sessions/{session_id}", self.explain_session)
        return app

    async def _start(self, _app: web.Application) -> None:
        await self.counter.start()

    async def _cleanup(self, _app: web.Application) -> None:
        await self.counter.close()

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
        if session_id is None:
            session_id = self.settings.default_program_id  # ThunderAgent files these under "default"
        if rt.fleet is not None and session_id is not None and not rt.fleet.owns(session_id):
            # another router may own the session: it serves the request (fleet.py)
            answer = await rt.fleet.route(request, session_id, await self.body(request))
            if answer is not None:
                return answer
        if not rt.models:
            return unavailable(rt, "no replica is available yet")
        if parsed.model not in rt.models:
            # vLLM's answer, word for word (vllm-project/vllm, vllm/entrypoints/openai/engine/serving.py,
            # OpenAIServing._check_model): NotFoundError, param "model", code = the HTTP status
            raise RequestError(404, f"The model `{parsed.model}` does not exist.", param="model", code=404,
                               type_="NotFoundError")
        parsed = await self._prompt_length(parsed, session_id, chat)
        check_context(parsed, rt.max_model_len(parsed.model))
        # per tenant: the budget's (ConfigureTenants, the same on every router) over the keys file's
        # over the settings'; "*" from the router's own configuration covers every tenant not named
        keyfile = self.auth.limits if isinstance(self.auth, ReloadingAuthenticator) else {}
        limit = limit_for(rt.budget_limits, tenant, keyfile, self.base_limits)
        if limit.active:
            decision, rate_headers = await admit(self.limiter, limit, tenant, parsed.prompt_tokens_estimate,
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
        if single and rt.fleet is not None:
            rt.fleet.local(sid)
        router_tracing.annotate(request_id, sid, tenant)
        arrived = rt.now()
        try:
            pending = rt.submit(NewRequest(request_id, sid, tenant, single, parsed.prompt_tokens_estimate,
                                           parsed.max_tokens, parsed.model, parsed.prefix_key, parsed.prefix_tokens))
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

    async def _prompt_length(self, parsed: ParsedRequest, session_id: str | None, chat: bool) -> ParsedRequest:
        """The exact prompt length of a session's first request (``prompt_length.py``)."""
        if parsed.prompt_tokens_exact:
            self.counter.exact()
            return parsed
        s = self.rt.core.sessions.get(session_id) if session_id is not None else None
        if s is not None and (s.tokens.requests or s.in_flight or s.held):
            self.counter.estimated()  # its footprint comes from the last answer's usage
            return parsed
        urls = [e.url for e in self.rt.registry.entries.values()
                if parsed.model in e.models and e.view().healthy and not e.draining]
        n = await self.counter.count(parsed.upstream_body, chat, urls, self.rt.upstream_headers)
        if n is None:
            return parsed
        return dataclasses.replace(parsed, prompt_tokens_estimate=n, prompt_tokens_exact=True)

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
            **self._thunderagent_health(),
        }
        return web.json_response(body, status=200 if ok else 503)

    def _thunderagent_health(self) -> dict[str, object]:
        """ThunderAgent's ``/health`` fields (ThunderAgent-org/ThunderAgent, ThunderAgent/app.py
        ``health_check``), for harnesses that read them."""
        core = self.rt.core
        stats = programs.program_stats(core.sessions.values(), core.replicas, core.config.gating)
        return {"router_mode": "tr" if core.config.gating else "default", "scheduling_enabled": core.config.gating,
                "backends": [e.url for e in self.rt.registry.entries.values()], "programs_count": stats["total"],
                "reasoning_count": stats["reasoning"], "acting_count": stats["acting"],
                "paused_count": stats["paused"], "per_backend": stats["per_backend"], "profile_enabled": False}

    async def metrics(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        prometheus = "text/plain" in accept or "openmetrics" in accept
        if request.query.get("format") == "json" or accept.startswith("application/json") or (
                self.settings.thunderagent_metrics and not prometheus):
            return web.json_response(self._thunderagent_metrics())
        return web.Response(body=generate_latest(self.rt.ctx.metrics), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _release(self, tenant: str, session_id: str, force: bool) -> bool:
        s = self.rt.core.sessions.get(session_id)
        if s is None or s.tenant != tenant:
            return False
        self.rt.release(session_id, force)
        return True

    async def _at_owner(self, request: web.Request, session_id: str) -> web.StreamResponse | None:
        """Fleet mode: the owner's answer for a request about an existing session owned by
        another router (None: answer here)."""
        fleet = self.rt.fleet
        if fleet is None or fleet.owns(session_id):
            return None
        return await fleet.route_existing(request, session_id, await request.read())

    async def release_session(self, request: web.Request) -> web.StreamResponse:
        tenant = self.tenant(request)
        sid = check_session_id(request.match_info["session_id"], "session_id")
        if (answer := await self._at_owner(request, sid)) is not None:
            return answer
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

    async def explain_session(self, request: web.Request) -> web.StreamResponse:
        viewer = self.viewer(request)
        sid = check_session_id(request.match_info["session_id"], "session_id")
        if (answer := await self._at_owner(request, sid)) is not None:
            return answer
        return web.json_response(await sessions_http.explain(self.rt, sid, viewer))

    def _thunderagent_metrics(self) -> dict[str, object]:
        """ThunderAgent's JSON ``/metrics`` (ThunderAgent/app.py ``get_metrics``), asked for with
        ``?format=json`` or ``Accept: application/json``; Prometheus text otherwise."""
        core = self.rt.core
        stats = programs.program_stats(core.sessions.values(), core.replicas, core.config.gating)
        admitted: dict[str | None, list[Session]] = {}
        for s in core.sessions.values():
            if s.admitted:
                admitted.setdefault(s.replica, []).append(s)
        backends = {}
        for rep in core.replicas.values():
            backends[rep.url] = programs.backend_entry(
                rep, admitted.get(rep.id, []), core.used.get(rep.id, 0), core.config.target_utilisation, core.config.gating,
                stats["per_backend"][rep.url]["paused"])
        return {"metrics_enabled": True, "metrics_interval": self.settings.health_interval_s, "backends": backends}

    async def list_programs(self, request: web.Request) -> web.Response:
        """ThunderAgent's ``GET /programs`` (ThunderAgent/app.py ``list_programs``): the caller's
        sessions (all of them in dev mode or with the admin token) as programs."""
        core = self.rt.core
        return web.json_response(programs.list_programs(core.sessions.values(), core.replicas, core.config.gating,
                                                        self.viewer(request)))

    async def profiles(self, request: web.Request) -> web.Response:
        """ThunderAgent's ``GET /profiles`` and ``/profiles/{id}`` answer when it runs without
        ``--profile`` (ThunderAgent/app.py ``list_profiles`` / ``get_profile``): the router keeps
        no per-step profile; ``GET /v1/sessions/{id}`` has its timings."""
        self.viewer(request)
        return web.json_response({"error": "Profiling not enabled. Start with --profile flag."}, status=400)

    async def release_program(self, request: web.Request) -> web.StreamResponse:
        tenant = self.tenant(request)
        try:
            payload = await request.json()
        except (ValueError, RecursionError):
            raise RequestError(400, "Invalid JSON", code="invalid_json") from None
        if not isinstance(payload, dict) or not payload.get("program_id"):
            raise RequestError(400, "Missing program_id", param="program_id", code="missing_required_parameter")
        pid = check_session_id(payload["program_id"], "program_id")
        if (answer := await self._at_owner(request, pid)) is not None:
            return answer
        try:
            released = self._release(tenant, pid, force=True)
        except UnknownSession:
            released = False
        return web.json_response({"program_id": pid, "released": released})
