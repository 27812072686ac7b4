"""NVIDIA Dynamo's KV router in front of vLLM-compatible replicas (``dynamo:kv`` in ``bench.peers``).

Runs in the peers' venv (``ai-dynamo-runtime`` and ``aiohttp``; nothing of this repository is
imported), never in this package's environment. The routing decision is Dynamo's own
``KvRouter`` (``dynamo._core``, the Rust ``lib/llm/src/kv_router`` of github.com/ai-dynamo/dynamo):
its radix-tree indexer, fed by each replica's vLLM KV events, and its cost (overlap score weight ×
prefill blocks + decode blocks, lowest wins) with its load tracking, every ``KvRouterConfig``
parameter at its default. What Dynamo's frontend does around it is done here the way its
custom-routing API describes (``KvRouter.best_worker`` with a request id, then
``mark_prefill_complete`` at the first token and ``free`` at the end):

- one *worker* process per replica (``worker``): a Dynamo endpoint registered with the
  replica's KV geometry (``register_model`` with ``skip_model_assets``, the external-adapter
  path: no weights or tokenizer are fetched) and a ``KvEventPublisher`` that relays the
  replica's vLLM ZMQ KV events (``--kv-events-config``) into Dynamo's event plane. It serves no
  requests: the replica does.
- the *router* process (``serve``): Dynamo's runtime with file discovery, TCP request plane and
  ZMQ event plane (no etcd, no NATS), one ``KvRouter``, and an HTTP front that, per request,
  asks the replica for the prompt's token ids (vLLM's ``/v1/chat/completions/render`` or
  ``/v1/completions/render``: where Dynamo's frontend tokenizes with the model's tokenizer, the
  emulated replicas' prompts are synthetic, and the render gives exactly the ids the engine
  hashes into its KV events), lets ``best_worker`` choose, and relays the request to that
  replica unchanged (streamed back as it comes).

    python bench/peers/dynamo_kv.py serve --port P --store DIR --block-size 16 --kv-blocks N \\
        --context-length L --model M --replica URL=ZMQ_ENDPOINT [--replica ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

#: the one Dynamo endpoint the workers register and the router routes over
ENDPOINT = "tao.backend.generate"
#: request headers relayed to the replica
RELAYED = ("content-type", "authorization", "x-session-id", "traceparent")


def _runtime(loop: asyncio.AbstractEventLoop) -> Any:
    from dynamo._core import DistributedRuntime

    # discovery in a folder (DYN_FILE_KV), requests over TCP, KV events over ZMQ: no etcd, no NATS
    return DistributedRuntime(loop, "file", "tcp", event_plane="zmq")


async def worker(args: argparse.Namespace) -> None:
    from dynamo._core import (
        KvEventPublisher,
        ModelInput,
        ModelRuntimeConfig,
        ModelType,
        WorkerType,
        register_model,
    )

    rt = _runtime(asyncio.get_running_loop())
    ep = rt.endpoint(ENDPOINT)
    rc = ModelRuntimeConfig()
    rc.total_kv_blocks = args.kv_blocks
    rc.max_num_seqs = args.max_num_seqs
    rc.max_num_batched_tokens = args.max_num_batched_tokens
    rc.context_length = args.context_length
    rc.kv_event_publishing_enabled = True
    await register_model(ModelInput.Tokens, ModelType.Chat, ep, args.model, args.model,
                         worker_type=WorkerType.Aggregated, kv_cache_block_size=args.block_size,
                         runtime_config=rc, skip_model_assets=True)
    _relay = KvEventPublisher(ep, kv_block_size=args.block_size, zmq_endpoint=args.zmq)  # held while serving

    async def handler(request: Any, context: Any = None) -> Any:  # never called: the replica serves
        yield {"error": "this worker only publishes KV events"}

    tmp = args.id_file.with_suffix(".tmp")
    tmp.write_text(str(ep.connection_id()))
    tmp.replace(args.id_file)
    await ep.serve_endpoint(handler)


class Front:
    """The HTTP front: render, ``best_worker``, relay."""

    def __init__(self, router: Any, replicas: dict[int, str]) -> None:
        self.router = router
        self.replicas = replicas  # Dynamo worker id -> replica base URL
        self._render_at = itertools.cycle(sorted(replicas.values()))
        self.http: aiohttp.ClientSession | None = None
        self.routed: dict[str, int] = dict.fromkeys(replicas.values(), 0)

    async def start(self, app: web.Application) -> None:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                          connector=aiohttp.TCPConnector(limit=0))

    async def stop(self, app: web.Application) -> None:
        if self.http is not None:
            await self.http.close()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        assert self.http is not None
        async with self.http.get(next(self._render_at) + "/v1/models") as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type="application/json")

    async def routed_counts(self, request: web.Request) -> web.Response:
        return web.json_response(self.routed)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        assert self.http is not None
        body = await request.read()
        headers = {h: v for h in RELAYED if (v := request.headers.get(h)) is not None}
        # the prompt's token ids, as the engine will hash them (Dynamo's frontend tokenizes here)
        async with self.http.post(next(self._render_at) + request.path + "/render", data=body,
                                  headers=headers) as resp:
            rendered = await resp.read()
            if resp.status != 200:  # the replica's own 4xx (bad body, prompt past max_model_len)
                return web.Response(status=resp.status, body=rendered, content_type="application/json")
        doc = json.loads(rendered)
        tokens = (doc[0] if isinstance(doc, list) else doc)["token_ids"]
        rid = uuid.uuid4().hex
        worker_id, _, _ = await self.router.best_worker(tokens, request_id=rid)
        target = self.replicas[worker_id]
        self.routed[target] += 1
        first = True
        try:  # a request that fails before its first chunk is only freed
            async with self.http.post(target + request.path, data=body, headers=headers) as upstream:
                out = web.StreamResponse(status=upstream.status)
                out.content_type = upstream.content_type
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    if first:
                        first = False
                        await self.router.mark_prefill_complete(rid)
                    await out.write(chunk)
                await out.write_eof()
                return out
        finally:
            await self.router.free(rid)


def front_app(router: Any, replicas: dict[int, str]) -> web.Application:
    """The HTTP front over ``router`` (a ``KvRouter``, or anything with its ``best_worker``,
    ``mark_prefill_complete`` and ``free``) and ``replicas`` (Dynamo worker id -> base URL)."""
    front = Front(router, replicas)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(front.start)
    app.on_cleanup.append(front.stop)
    app.router.add_get("/health", front.health)
    app.router.add_get("/v1/models", front.models)
    app.router.add_get("/routed", front.routed_counts)
    app.router.add_post("/v1/chat/completions", front.generate)
    app.router.add_post("/v1/completions", front.generate)
    return app


def start_workers(args: argparse.Namespace) -> tuple[list[subprocess.Popen[bytes]], dict[int, str]]:
    """One worker process per ``--replica``, sharing this process's file discovery folder; returns
    them and each one's Dynamo worker id -> its replica's base URL, once all have registered."""
    args.store.mkdir(parents=True, exist_ok=True)
    os.environ["DYN_FILE_KV"] = str(args.store)  # the router's runtime and the workers' share it
    children: list[subprocess.Popen[bytes]] = []
    ids: dict[Path, str] = {}
    for i, spec in enumerate(args.replica):
        url, _, zmq = spec.partition("=")
        id_file = args.store / f"worker-{i}.id"
        ids[id_file] = url.rstrip("/")
        children.append(subprocess.Popen(
            [sys.executable, __file__, "worker", "--zmq", zmq, "--id-file", str(id_file),
             "--block-size", str(args.block_size), "--kv-blocks", str(args.kv_blocks),
             "--context-length", str(args.context_length), "--model", args.model,
             "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]))
    deadline = time.monotonic() + 60
    while not all(f.exists() for f in ids):
        if time.monotonic() > deadline or any(c.poll() is not None for c in children):
            stop_workers(children)
            raise SystemExit("dynamo_kv: a worker did not register")
        time.sleep(0.1)
    return children, {int(f.read_text()): url for f, url in ids.items()}


def stop_workers(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        c.terminate()
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.wait(timeout=5)


async def serve(args: argparse.Namespace, replicas: dict[int, str]) -> None:
    from dynamo._core import KvRouter, KvRouterConfig

    rt = _runtime(asyncio.get_running_loop())
    ep = rt.endpoint(ENDPOINT)
    client = await ep.client()
    for _ in range(600):  # until the router's client sees every worker (60 s)
        if set(replicas) <= set(client.instance_ids()):
            break
        await asyncio.sleep(0.1)
    else:
        raise SystemExit(f"dynamo_kv: workers {sorted(replicas)} not discovered, saw {client.instance_ids()}")
    app = front_app(KvRouter(ep, args.block_size, KvRouterConfig()), replicas)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    print(f"dynamo_kv: serving on http://127.0.0.1:{args.port} (workers {replicas})", flush=True)
    await asyncio.Event().wait()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="dynamo_kv.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "worker"):
        p = sub.add_parser(name)
        p.add_argument("--block-size", type=int, required=True)
        p.add_argument("--kv-blocks", type=int, required=True)
        p.add_argument("--context-length", type=int, required=True)
        p.add_argument("--model", required=True)
        p.add_argument("--max-num-seqs", type=int, default=1024)
        p.add_argument("--max-num-batched-tokens", type=int, default=8192)
        if name == "serve":
            p.add_argument("--port", type=int, required=True)
            p.add_argument("--store", type=Path, required=True, help="Dynamo's file discovery folder")
            p.add_argument("--replica", action="append", required=True, metavar="URL=ZMQ_ENDPOINT")
        else:
            p.add_argument("--zmq", required=True)
            p.add_argument("--id-file", type=Path, required=True)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    os.environ.setdefault("DYN_LOG", "warn")
    if args.cmd == "worker":
        asyncio.run(worker(args))
        return
    children, replicas = start_workers(args)
    try:
        asyncio.run(serve(args, replicas))
    finally:
        stop_workers(children)


if __name__ == "__main__":
    main()
