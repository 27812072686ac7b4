"""Domain errors and the one place they become gRPC status codes."""

from __future__ import annotations

import grpc


class DomainError(Exception):
    """Base of errors a service reports to its caller with a specific status."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(DomainError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(DomainError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(DomainError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(DomainError):
    code = grpc.StatusCode.UNAVAILABLE


class StartupError(RuntimeError):
    """Start-up cannot continue; the message is printed as one line, without a traceback."""
