"""Client channels to TAO services: plaintext, TLS or mTLS, with an optional bearer token."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc

from services.common import tracing
from services.common.interceptors import BearerTokenAuth


class _TokenInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                        grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor):
    """Adds the bearer token on plaintext channels (grpc refuses call credentials without TLS)."""

    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or [])
        metadata.append(self._md)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, grpc.aio.Metadata(*metadata), details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)

    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request_iterator)


def make_channel(
    target: str,
    *,
    token: str | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    server_name: str | None = None,
) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (host:port). TLS when ``ca_file`` is given; mTLS
    when a client cert and key are given too."""
    options: list[tuple[str, object]] = [("grpc.enable_retries", 1), ("grpc.keepalive_time_ms", 20_000)]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    traced = tracing.grpc_client_interceptors()  # none while tracing is off
    if ca_file is None:
        interceptors = [*traced, _TokenInterceptor(token)] if token else traced
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors or None)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca_file.read_bytes(),
        private_key=key_file.read_bytes() if key_file else None,
        certificate_chain=cert_file.read_bytes() if cert_file else None,
    )
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.metadata_call_credentials(BearerTokenAuth(token)))
    return grpc.aio.secure_channel(target, creds, options=options, interceptors=traced or None)


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The client TLS options of the `tao` commands that call a service (``channel_from_args``)."""
    parser.add_argument("--ca-file", type=Path, default=None, help="CA bundle: use TLS")
    parser.add_argument("--cert-file", type=Path, default=None, help="client certificate (mTLS)")
    parser.add_argument("--key-file", type=Path, default=None, help="client key (mTLS)")


def channel_from_args(target: str, args: argparse.Namespace, token: str | None = None) -> grpc.aio.Channel:
    """``make_channel`` with the options ``add_tls_arguments`` added."""
    return make_channel(target, token=token, ca_file=args.ca_file, cert_file=args.cert_file, key_file=args.key_file)
