"""The floor of `python -m bench.peers`: the bare replicas behind a plain HTTP round-robin.

    python -m bench.peers.rrproxy --port 8000 --replica http://127.0.0.1:8001 --replica ...

Every request goes to the next replica in turn, body and headers unchanged (hop-by-hop headers
dropped), the response streamed back chunk by chunk. No sessions, no state: what a client
would get from the replicas with no router at all, spread evenly.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})


def build_app(replicas: list[str]) -> web.Application:
    turn = itertools.cycle(replicas)
    app = web.Application(client_max_size=256 * 1024 * 1024)

    async def on_startup(app: web.Application) -> None:
        app["http"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def on_cleanup(app: web.Application) -> None:
        await app["http"].close()

    async def health(_req: web.Request) -> web.Response:
        return web.Response(status=200)

    async def proxy(req: web.Request) -> web.StreamResponse:
        url = next(turn) + req.path_qs
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await req.read()
        try:
            async with req.app["http"].request(req.method, url, data=body or None, headers=headers) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP})
                await resp.prepare(req)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            return web.json_response({"error": {"message": f"upstream {url}: {exc}", "type": "BadGateway",
                                                "param": None, "code": 502}}, status=502)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.rrproxy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--replica", action="append", required=True, help="replica base URL (repeat)")
    args = ap.parse_args(argv)
    web.run_app(build_app([r.rstrip("/") for r in args.replica]), host=args.host, port=args.port,
                access_log=None, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
