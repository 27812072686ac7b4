"""How much load one `tao vllm-sim` process sustains before falling behind its own model.

For each time scale X and concurrency N, N closed-loop streaming clients keep one chat request
each in flight (~200-word prompt, 128 output tokens, ``ignore_eos``), sent with the one load
generator (``services.driver.chat.send_chat``, SSE lines counted without decoding, so the
clients stay cheap next to the server they share the cores with); a request counts when its
answer is ``ok`` (``req``), any other outcome is an error (``err``). Over a
measurement window we read the replica's /metrics twice and report:

- ``tok/s wall``: output tokens generated per wall second (vllm:generation_tokens_total);
- ``keep-up``: model seconds advanced / (wall seconds x X). The baseline is the ideal 1.0 (the
  emulator keeps its model's pace); below ~0.95 it is falling behind;
- ``lag``: how far model time trails scaled wall time at the end, and at worst (model seconds).

The server runs in its own process (as in deployments); clients run in this process and share
the machine's cores with it, which the report states.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from services.driver.chat import CHAT_PATH, open_http, send_chat

REPO = Path(__file__).resolve().parents[2]
PROMPT = " ".join(f"word{i % 97}" for i in range(200))


@dataclass(frozen=True)
class ServerBenchRow:
    time_scale: float
    streams: int
    wall_s: float
    tokens: int
    model_s: float
    lag_end_s: float
    max_lag_s: float
    requests: int
    errors: int

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def keep_up(self) -> float:
        return self.model_s / (self.wall_s * self.time_scale)


def _spawn(time_scale: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "vllm-sim", "--port", "0", "--profile",
                             "qwen3-32b-h100x2", "--time-scale", str(time_scale)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    m = re.search(r"(http://\S+)", proc.stdout.readline())
    if m is None:
        proc.kill()
        raise RuntimeError("vllm-sim did not start")
    return proc, m.group(1)


async def _gauges(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("tao_vllm_sim") or s.name == "vllm:generation_tokens_total":
                out[s.name] = s.value
    return out


async def _measure(url: str, time_scale: float, streams: int, window_s: float) -> ServerBenchRow:
    stop = asyncio.Event()
    counts = {"requests": 0, "errors": 0}
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 128, "ignore_eos": True,
            "stream": True}
    async with open_http(600) as session:

        async def client(i: int) -> None:
            while not stop.is_set():
                out = await send_chat(session, url + CHAT_PATH, {**body, "user": str(i)}, parse=False)
                counts["requests" if out.ok else "errors"] += 1

        tasks = [asyncio.create_task(client(i)) for i in range(streams)]
        await asyncio.sleep(min(2.0, window_s / 2))  # warm-up
        g0, t0 = await _gauges(session, url), time.perf_counter()
        await asyncio.sleep(window_s)
        g1, t1 = await _gauges(session, url), time.perf_counter()
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    tokens = int(g1["vllm:generation_tokens_total"] - g0["vllm:generation_tokens_total"])
    return ServerBenchRow(time_scale, streams, t1 - t0, tokens,
                          g1["tao_vllm_sim_model_time_seconds"] - g0["tao_vllm_sim_model_time_seconds"],
                          g1["tao_vllm_sim_lag_seconds"], g1["tao_vllm_sim_max_lag_seconds"],
                          counts["requests"], counts["errors"])


def run_server_bench(quick: bool) -> list[ServerBenchRow]:
    window = 3.0 if quick else 8.0
    grid = {1.0: [16, 64, 256] if quick else [16, 64, 128, 256, 512],
            10.0: [16, 64, 256] if quick else [16, 64, 128, 256, 512]}
    rows: list[ServerBenchRow] = []
    for scale, levels in grid.items():
        proc, url = _spawn(scale)
        try:
            for n in levels:
                rows.append(asyncio.run(_measure(url, scale, n, window)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    return rows
