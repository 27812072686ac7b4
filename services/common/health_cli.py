"""`tao health HOST:PORT [--service NAME] [--timeout S]`: exit 0 when SERVING (compose healthcheck)."""

from __future__ import annotations

import argparse
import asyncio
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.channels import add_tls_arguments, channel_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="HOST:PORT of a TAO gRPC service")
    parser.add_argument("--service", default="", help="service name to check (default: the server as a whole)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds before giving up")
    add_tls_arguments(parser)
    parser.add_argument("--wait", type=float, default=0.0, help="keep probing up to this many seconds until SERVING")


async def probe(args: argparse.Namespace) -> str:
    """The health status name of ``args.service`` at ``args.target`` (or an error description)."""
    async with channel_from_args(args.target, args) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def run(args: argparse.Namespace) -> int:
    async def loop() -> str:
        deadline = asyncio.get_running_loop().time() + args.wait
        while True:
            status = await probe(args)
            if status == "SERVING" or asyncio.get_running_loop().time() >= deadline:
                return status
            await asyncio.sleep(0.25)

    status = asyncio.run(loop())
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace()))
