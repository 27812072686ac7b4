"""`tao vllm-sim`: one emulated vLLM replica (OpenAI HTTP API + /metrics).

Prints ``vllm-sim listening on http://HOST:PORT`` (flushed) once serving, so ``--port 0``
callers can read the chosen port. SIGTERM / SIGINT stop it cleanly (exit 0).
``--time-scale X``: model time runs X times faster than wall time (X = 10 turns a 24 ms decode
step into 2.4 ms of wall time); latencies in /metrics and usage are model seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from dataclasses import replace

from services.common.kv_events import KVEventsConfig
from services.sim.engine import PROFILES, Profile, get_profile
from services.sim.vllm_sim.server import start_vllm_sim


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, required=True, help="TCP port (0 = pick a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--profile", default="qwen3-32b-h100x2", choices=sorted(PROFILES),
                        help="model + hardware profile")
    parser.add_argument("--num-gpu-blocks", type=int, default=None,
                        help="KV cache blocks (default: derived from GPU memory, like vLLM)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="model time runs this many times faster than wall time")
    parser.add_argument("--model-name", default=None, help="served model name (default: the HF id)")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="vLLM's --served-model-name: one or more names requests may use (responses and "
                             "metrics report the first); wins over --model-name")
    parser.add_argument("--block-size", type=_block_size, default=None,
                        help="KV block size in tokens (vLLM's --block-size; default the profile's, 16); "
                             "exported as the block_size label of vllm:cache_config_info")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-events-config", type=KVEventsConfig.parse, default=None,
                        help='vLLM\'s KV-event publisher, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
                             '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'')


def _block_size(text: str) -> int:
    """vLLM's ``CacheConfig.block_size``: a positive integer (vllm-project/vllm, vllm/config/cache.py)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"block size must be a positive integer, got {value}")
    return value


def _profile(args: argparse.Namespace) -> Profile:
    prof = get_profile(args.profile)
    return prof if args.block_size is None else replace(prof, block_size=args.block_size)


async def _serve(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with start_vllm_sim(_profile(args), host=args.host, port=args.port, time_scale=args.time_scale,
                              model_name=args.served_model_name or args.model_name, num_gpu_blocks=args.num_gpu_blocks,
                              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                              max_model_len=args.max_model_len, kv_events=args.kv_events_config) as sim:
        e = sim.engine
        print(f"vllm-sim listening on {sim.base_url}", flush=True)
        print(f"vllm-sim: profile={args.profile} models={','.join(sim.server.served_model_names)} "
              f"blocks={e.num_gpu_blocks} block_size={e.block_size} "
              f"kv_tokens={e.capacity_tokens} max_model_len={e.max_model_len} max_num_seqs={e.max_num_seqs} "
              f"max_num_batched_tokens={e.max_num_batched_tokens} time_scale={args.time_scale}",
              file=sys.stderr, flush=True)
        pub = sim.server.runner.kv_publisher
        if pub is not None:
            print(f"vllm-sim: kv events on {pub.endpoint} (replay {pub.replay_endpoint})", file=sys.stderr, flush=True)
        await stop.wait()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except ValueError as exc:  # bad engine configuration (e.g. max_model_len does not fit)
        print(f"vllm-sim: {exc}", file=sys.stderr)
        return 2
