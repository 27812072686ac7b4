"""`python -m bench.router.client_cost [--src DIR]`: the load generator's own CPU per streamed
chunk, which ``bench.router`` cannot resolve on a shared machine (its figures are the router's).

A stub server (its own process, no model: every chunk written at once) streams ``--chunks``
content chunks per request (plus the role, usage and ``[DONE]`` events vLLM sends); a client
process sends ``--requests`` requests over ``--concurrency`` workers through
``bench.router.load.one_request`` (``send_chat`` with ``parse=False``: counted) and, where the
tree has it, through ``send_chat`` with ``parse=True`` (decoded: the trace driver's and the
fault accounting's way), and reports its process CPU time per chunk. ``--src DIR`` also runs
the client of another source tree (e.g. a ``git archive`` of an earlier commit), alternating
with this one every round: an A/B of the client under the same server. ``--replay`` leaves the
network out: each request replays 34 canned events in-process, so the figure is the client's own
code per event.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from services.common.testing import free_port

ROOT = Path(__file__).resolve().parents[2]

SERVER = r"""
import sys
from aiohttp import web
chunks = int(sys.argv[2])
ROLE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
USAGE = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d}}\n\n' % chunks
async def answer(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(ROLE)
    for _ in range(chunks):
        await resp.write(TOKEN)
    await resp.write(USAGE)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
app = web.Application()
app.router.add_post("/v1/chat/completions", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

CLIENT = r"""
import asyncio, json, sys, time
import aiohttp
from bench.router.load import PROMPT, one_request
url, requests, concurrency, mode, replay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64, "stream": True}
class Replay:
    # the server's answer as aiohttp hands it over, without a network: the client's own code alone
    LINES = [b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n', b"\n"] * 34 + [b"data: [DONE]\n", b"\n"]
    status, headers = 200, {"content-type": "text/event-stream"}
    def post(self, url, json=None, headers=None):
        return self
    async def __aenter__(self):
        await asyncio.sleep(0)
        return self
    async def __aexit__(self, *exc):
        return False
    @property
    def content(self):
        return self._lines()
    async def _lines(self):
        for line in self.LINES:
            yield line
    async def close(self):
        pass
async def main():
    if mode == "parsed":
        from services.driver.chat import send_chat
    chunks = errors = 0
    async with (aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) if replay == "0" else Replay()) as http:
        async def worker(n):
            nonlocal chunks, errors
            for _ in range(n):
                if mode == "parsed":
                    out = await send_chat(http, url, body, {}, parse=True)
                    ok, got = out.ok, out.chunks
                else:
                    s = await one_request(http, url, body, {})
                    ok, got = s.ok, s.chunks
                chunks += got
                errors += not ok
        await worker(5)  # warm the connection pool and the code paths
        chunks = errors = 0
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"chunks": chunks, "errors": errors, "cpu_s": cpu, "wall_s": wall}))
asyncio.run(main())
"""


def _client(src: Path, url: str, requests: int, concurrency: int, mode: str, replay: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CLIENT, url, str(requests), str(concurrency), mode, str(int(replay))],
                         cwd=src,
                         env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router.client_cost", description=__doc__.splitlines()[0])
    p.add_argument("--src", default=None, metavar="DIR", help="also run the client of this source tree (A/B)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--chunks", type=int, default=32, help="content chunks per request")
    p.add_argument("--replay", action="store_true",
                   help="no server: each request replays 34 canned events in-process (the client's code alone, "
                        "without aiohttp's network path and its noise)")
    args = p.parse_args(argv)
    if min(args.rounds, args.requests, args.concurrency, args.chunks) < 1:
        p.error("--rounds, --requests, --concurrency and --chunks must be >= 1")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(args.chunks)])
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("bench.router.client_cost: the stub server did not start") from None
                time.sleep(0.1)
        paths = [("this", ROOT, "counted"), ("this", ROOT, "parsed")]
        if args.src:
            paths.insert(0, ("src", Path(args.src).resolve(), "counted"))
        cost: dict[str, list[float]] = {f"{n}:{m}": [] for n, _, m in paths}
        for r in range(args.rounds):
            for name, src, mode in paths[r % len(paths):] + paths[: r % len(paths)]:
                got = _client(src, url, args.requests, args.concurrency, mode, args.replay)
                if got["errors"]:
                    raise SystemExit(f"{name}:{mode}: {got['errors']:.0f} requests failed")
                cost[f"{name}:{mode}"].append(got["cpu_s"] / got["chunks"] * 1e6)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print(f"# bench.router.client_cost — {args.requests} requests x ({args.chunks} + 2) events, "
          f"{args.concurrency} workers, {args.rounds} rounds; client process CPU us per event")
    for key, xs in cost.items():
        print(f"{key:>14}: median {statistics.median(xs):.2f}  (rounds {' '.join(f'{x:.2f}' for x in xs)})")
    if args.src:
        ratio = statistics.median(cost["this:counted"]) / statistics.median(cost["src:counted"])
        print(f"this / src (counted): {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
