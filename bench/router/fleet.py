"""Router fleet benchmark (docs/benchmarks.md#router-fleet): router CPU per request with one
router versus three fleet routers at the same load, and the time a dead router's session takes
to be served again.

    python -m bench.router.fleet [--sessions 32] [--turns 40] [--member-ttl-s 3]

Phases, each on a fresh Redis and the same emulated replica, the same closed-loop agent load
(``--sessions`` sessions, ``--turns`` sequential requests each):

- ``single``: one router, ``fleet`` off (today's deployment);
- ``single, a third of the load``: the same router with a third of the sessions, each running
  three times the turns (the same number of requests): what one router costs per request at
  the load each of three routers sees, so that the three-router phases can be read against the
  load each process carries as well as against ``single``;
- ``fleet-1``: one router, ``fleet`` on;
- ``3 solo routers hashed``: three routers with ``fleet`` off, each session always sent to the
  same one (not a valid deployment: they overwrite each other's epoch and each admits up to the
  whole budget; it only separates what three processes cost from what the fleet costs);
- ``fleet-3 hashed``: three fleet routers, each session always sent to the same router (what an
  L7 balancer hashing ``x-session-id`` does): no forwarding;
- ``fleet-3 round-robin``: three fleet routers, each request to the next router: about two of
  three requests are forwarded to the session's owner (the worst case).

CPU per request = Σ over the router processes of (utime + stime) during the phase / requests
answered; ``net`` subtracts the routers' idle CPU (probes, leases, flushes: measured for a few
seconds before the phase, times the phase's wall time). The ratios to ``single`` are printed; the load generator, the routers, the replica and
Redis share this machine's cores, so figures are noisy and only the ratios mean anything.
Takeover: after the round-robin phase one router is killed with SIGKILL and a request for a
session it owned is sent to another router; the time until it is answered is printed (bounded
by the member lease, ``--member-ttl-s``).

Controls (``--controls``): the ``single`` and ``single, a third of the load`` loads through
routers that are not TAO, in front of the same replica, measured the same way: the floor of
``bench.peers`` (a plain aiohttp proxy, ``bench/peers/rrproxy.py``) and vLLM's Rust router with
``round_robin`` (``vllm-router`` from PyPI, in the isolated venv ``bench.peers`` manages; left
out, saying why, when it cannot be installed). Their third / full ratios tell what a third of
the load costs any router per request on this machine, apart from anything TAO does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import zlib
from collections.abc import Iterator

import aiohttp
import redis

from bench.peers.core import parse_system, router_argv
from bench.router.procs import Proc, cpu_seconds, start_replica, start_vllm_router, vllm_router_bin
from services.common import keys
from services.common.ports import free_port
from services.common.testing import RedisServer, find_redis_binary
from services.driver.chat import CHAT_PATH, open_http, send_chat

MODEL = "Qwen/Qwen3-32B"
IDLE_S = 3.0
#: the routers that are not TAO in ``--controls``
CONTROLS = ("floor", "vllm-router:round_robin")
#: a phase's result: (name, routers, answered, failed, wall s, CPU s, CPU s per request, net CPU s per request)
Row = tuple[str, int, int, int, float, float, float, float]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Refactor the parser and explain. " * 20}],
        "max_tokens": 8}


def start_router(redis_url: str, replica: str, policy: str, fleet: bool, rid: str, ttl_s: float) -> Proc:
    args = [sys.executable, "-m", "services.cli", "serve", "router", "--redis-url", redis_url, "--port", "0",
            "--http-port", "0", "--replica", replica, "--policy", policy, "--log-level", "warning"]
    if fleet:
        args += ["--fleet", "--router-id", rid, "--member-ttl-s", str(ttl_s)]
    return Proc(args, "tao router gateway on", env={"TAO_ROUTER_HOLD_TIMEOUT_S": "120",
                                                     "TAO_ROUTER_LOG_FORMAT": "console"})


@contextlib.contextmanager
def stack(replica: str, n: int, fleet: bool, policy: str, ttl_s: float) -> Iterator[tuple[RedisServer, list[Proc]]]:
    binary = find_redis_binary()
    if binary is None:
        raise SystemExit("bench.router.fleet needs redis-server (apt) or the 'embedded' extra")
    server = RedisServer(binary)
    server.start()
    routers: list[Proc] = []
    try:
        for i in range(n):
            routers.append(start_router(server.url, replica, policy, fleet, f"r{i}", ttl_s))
        yield server, routers
    finally:
        for r in routers:
            r.stop()
        server.stop()


async def wait_healthy(http: aiohttp.ClientSession, urls: list[str]) -> None:
    for url in urls:
        for _ in range(300):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/health") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.1)


async def load(urls: list[str], sessions: int, turns: int, spread: str, tag: str) -> tuple[int, int]:
    """(answered, failed) of the closed-loop agent load: answered = ``send_chat``'s ``ok`` (a 200
    answer, read without decoding); anything else (an error status, a broken connection, the
    client's timeout) fails."""
    answered = failed = 0
    async with open_http(120) as http:
        await wait_healthy(http, urls)

        async def agent(i: int) -> None:
            nonlocal answered, failed
            sid = f"{tag}-{i}"
            home = zlib.crc32(sid.encode()) % len(urls)
            for turn in range(turns):
                url = urls[(home + turn) % len(urls)] if spread == "rr" else urls[home]
                out = await send_chat(http, url + CHAT_PATH, BODY, {"x-session-id": sid}, parse=False)
                if out.ok:
                    answered += 1
                else:
                    failed += 1

        await asyncio.gather(*(agent(i) for i in range(sessions)))
    return answered, failed


def measure(procs: list[Proc], sessions: int, turns: int, spread: str) -> tuple[int, int, float, float, float]:
    """(answered, failed, wall s, CPU s, net CPU s) of one phase through ``procs``: warmed by 4
    requests, then their idle CPU rate over ``IDLE_S`` (probes, leases, flushes), then the load;
    net = CPU less that rate times the phase's wall time."""
    urls = [r.url for r in procs]
    asyncio.run(load(urls, 4, 1, spread, "warm"))
    idle0 = sum(cpu_seconds(r.pid) for r in procs)
    time.sleep(IDLE_S)
    idle_rate = (sum(cpu_seconds(r.pid) for r in procs) - idle0) / IDLE_S
    before = sum(cpu_seconds(r.pid) for r in procs)
    t0 = time.perf_counter()
    ok, bad = asyncio.run(load(urls, sessions, turns, spread, "s"))
    wall = time.perf_counter() - t0
    cpu = sum(cpu_seconds(r.pid) for r in procs) - before
    return ok, bad, wall, cpu, max(0.0, cpu - idle_rate * wall)


def row(name: str, routers: int, measured: tuple[int, int, float, float, float]) -> Row:
    """A phase's ``Row`` from ``measure``'s result, per-request figures over the answered."""
    ok, bad, wall, cpu, net = measured
    return (name, routers, ok, bad, wall, cpu, cpu / max(1, ok), net / max(1, ok))


def start_control(name: str, replica: str, bin_dir: str | None) -> Proc:
    """A router of ``CONTROLS`` in front of ``replica``, ready once its /health answers."""
    system = parse_system(name)
    port = free_port()
    if system.kind == "floor":
        return Proc(router_argv(system, "", port, [replica], 0, python=sys.executable), None,
                    ready_url=f"http://127.0.0.1:{port}/health")
    assert bin_dir is not None
    return start_vllm_router(bin_dir, replica, system, port, free_port())


async def takeover(urls: list[str], victim: Proc, redis_url: str, victim_id: str) -> float | None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    owners = client.hgetall(keys.SESSION_OWNERS)
    client.close()
    mine = sorted(sid for sid, v in owners.items() if v.endswith(" " + victim_id))
    if not mine:
        return None
    victim.proc.kill()
    victim.proc.wait()
    t0 = time.perf_counter()
    async with open_http(60) as http:
        while True:
            out = await send_chat(http, urls[1] + CHAT_PATH, BODY, {"x-session-id": mine[0]}, parse=False, t0=t0)
            if out.ok:
                return out.total_s
            await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.router.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--policy", default="tao")
    p.add_argument("--member-ttl-s", type=float, default=3.0)
    p.add_argument("--time-scale", type=float, default=50.0, help="replica speed-up (the replica is not the point)")
    p.add_argument("--controls", action="store_true",
                   help="also the single and third-of-the-load phases through " + " and ".join(CONTROLS))
    p.add_argument("--venv", default=None, help="the peers' venv for vllm-router (default: bench.peers')")
    args = p.parse_args(argv)
    replica = start_replica("qwen3-32b-h100x2", args.time_scale)
    rows: list[Row] = []
    controls: list[Row] = []
    skipped: list[str] = []
    take_s: float | None = None
    third = max(1, args.sessions // 3)
    third_turns = args.turns * args.sessions // third  # the same requests from a third of the sessions
    try:
        for name, n, fleet, spread, sessions, turns in (
                ("single", 1, False, "hash", args.sessions, args.turns),
                ("single, a third of the load", 1, False, "hash", third, third_turns),
                ("fleet-1", 1, True, "hash", args.sessions, args.turns),
                ("3 solo routers hashed", 3, False, "hash", args.sessions, args.turns),
                ("fleet-3 hashed", 3, True, "hash", args.sessions, args.turns),
                ("fleet-3 round-robin", 3, True, "rr", args.sessions, args.turns)):
            with stack(replica.url, n, fleet, args.policy, args.member_ttl_s) as (server, routers):
                rows.append(row(name, n, measure(routers, sessions, turns, spread)))
                if n == 3 and spread == "rr":
                    take_s = asyncio.run(takeover([r.url for r in routers], routers[0], server.url, "r0"))
        if args.controls:
            bin_dir, why = vllm_router_bin(args.venv)
            for name in CONTROLS:
                if name != "floor" and bin_dir is None:
                    skipped.append(f"{name}: {why}")
                    continue
                proc = start_control(name, replica.url, bin_dir)
                try:
                    for tag, sessions, turns in (("", args.sessions, args.turns),
                                                 (", a third of the load", third, third_turns)):
                        controls.append(row(name + tag, 1, measure([proc], sessions, turns, "hash")))
                finally:
                    proc.stop()
    finally:
        replica.stop()
    base, base_net = rows[0][6], rows[0][7]
    print(f"router fleet: {args.sessions} sessions x {args.turns} turns, policy {args.policy}, replica x"
          f"{args.time_scale:g}; all processes share this machine")
    print(f"{'phase':<30}{'routers':>8}{'answered':>10}{'failed':>8}{'wall s':>9}{'router cpu s':>14}"
          f"{'cpu ms/req':>12}{'vs single':>11}{'net ms/req':>12}{'vs single':>11}")
    for name, n, ok, bad, wall, cpu, per, net in rows:
        print(f"{name:<30}{n:>8}{ok:>10}{bad:>8}{wall:>9.2f}{cpu:>14.2f}{per * 1000:>12.2f}{per / max(1e-9, base):>10.2f}x"
              f"{net * 1000:>12.2f}{net / max(1e-9, base_net):>10.2f}x")
    if controls:
        print("controls (not TAO; the same loads and measurement): a third of the load against the full load")
        print(f"{'router':<30}{'answered':>10}{'failed':>8}{'net ms/req full':>17}{'third':>9}{'third / full':>14}")
        pairs = [(f"tao router ({args.policy})", rows[0], rows[1])] + [
            (controls[i][0], controls[i], controls[i + 1]) for i in range(0, len(controls), 2)]
        for label, full, part in pairs:
            print(f"{label:<30}{full[2] + part[2]:>10}{full[3] + part[3]:>8}{full[7] * 1000:>17.3f}"
                  f"{part[7] * 1000:>9.3f}{part[7] / max(1e-9, full[7]):>13.2f}x")
    for line in skipped:
        print(f"control left out: {line}")
    print(f"net = router CPU minus the routers' idle CPU rate ({IDLE_S:g} s measured before each phase) x the "
          "phase's wall time")
    if take_s is None:
        print("takeover: the killed router owned no session")
    else:
        print(f"takeover: a killed router's session answered by another router {take_s:.2f} s after SIGKILL "
              f"(member_ttl_s {args.member_ttl_s:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
