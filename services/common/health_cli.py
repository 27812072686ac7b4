"""`tao health HOST:PORT [--service NAME] [--timeout S]`: exit 0 when SERVING (compose healthcheck)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.channels import make_channel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="HOST:PORT of a TAO gRPC service")
    parser.add_argument("--service", default="", help="service name to check (default: the server as a whole)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds before giving up")
    parser.add_argument("--ca-file", type=Path, default=None, help="CA bundle: use TLS")
    parser.add_argument("--cert-file", type=Path, default=None, help="client certificate (mTLS)")
    parser.add_argument("--key-file", type=Path, default=None, help="client key (mTLS)")
    parser.add_argument("--wait", type=float, default=0.0, help="keep probing up to this many seconds until SERVING")


async def probe(target: str, service: str, timeout_s: float, *, ca_file: Path | None = None,
                cert_file: Path | None = None, key_file: Path | None = None) -> str:
    """The health status name of ``service`` at ``target`` (or an error description)."""
    async with make_channel(target, ca_file=ca_file, cert_file=cert_file, key_file=key_file) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def run(args: argparse.Namespace) -> int:
    async def loop() -> str:
        deadline = asyncio.get_running_loop().time() + args.wait
        while True:
            status = await probe(args.target, args.service, args.timeout, ca_file=args.ca_file,
                                 cert_file=args.cert_file, key_file=args.key_file)
            if status == "SERVING" or asyncio.get_running_loop().time() >= deadline:
                return status
            await asyncio.sleep(0.25)

    status = asyncio.run(loop())
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace()))
