"""Tenant authentication with API keys stored hashed (docs/architecture.md#security).

Keys file (YAML or JSON)::

    keys:
      - tenant: A
        sha256: 9f86d081...            # hex sha256 of the key
      - tenant: B
        scrypt: scrypt$16384$8$1$<salt hex>$<hash hex>

An optional ``limits`` mapping sets tenants' rate limits (``core/ratelimit.py``; ``"*"``:
every tenant not listed; they override the router's ``rate_limits`` setting)::

    limits:
      A: {rpm: 600, tpm: 200000}
      "*": {rpm: 60}

The file is re-read when it changes (``ReloadingAuthenticator``: its size, mtime or inode,
checked at most every ``reload_interval_s`` on the request path), without a restart; a file
that does not parse keeps the previous keys and limits in force and is logged.

``python -m services.router.auth hash [--scrypt] KEY`` prints an entry. A presented key is
hashed and compared with ``hmac.compare_digest`` against every stored hash of its kind
(no early exit, so timing does not reveal which entry matched); verified keys are cached by
their sha256 so scrypt runs once per key, not per request. Keys come from the
``Authorization: Bearer`` header (or ``api-key``, as Azure-style clients send it).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.common.core.ratelimit import RateLimit
from services.common.errors import StartupError
from services.router.core.ratelimit import parse_limits

SCRYPT_N, SCRYPT_R, SCRYPT_P = 16384, 8, 1


@dataclass(frozen=True, slots=True)
class KeyEntry:
    tenant: str
    kind: str  # "sha256" | "scrypt"
    digest: bytes
    salt: bytes = b""
    n: int = SCRYPT_N
    r: int = SCRYPT_R
    p: int = SCRYPT_P


def _scrypt(key: str, e: KeyEntry) -> bytes:
    return hashlib.scrypt(key.encode(), salt=e.salt, n=e.n, r=e.r, p=e.p, maxmem=256 * 1024 * 1024,
                          dklen=len(e.digest))


def parse_entry(raw: object, where: str) -> KeyEntry:
    if not isinstance(raw, dict) or not isinstance(raw.get("tenant"), str) or not raw["tenant"]:
        raise StartupError(f"{where}: each key needs a non-empty 'tenant' and 'sha256' or 'scrypt'")
    tenant = raw["tenant"]
    try:
        if isinstance(raw.get("sha256"), str):
            digest = bytes.fromhex(raw["sha256"])
            if len(digest) != 32:
                raise ValueError("sha256 must be 64 hex digits")
            return KeyEntry(tenant, "sha256", digest)
        if isinstance(raw.get("scrypt"), str):
            name, n, r, p, salt, digest_hex = raw["scrypt"].split("$")
            if name != "scrypt":
                raise ValueError("expected scrypt$N$r$p$salt$hash")
            return KeyEntry(tenant, "scrypt", bytes.fromhex(digest_hex), bytes.fromhex(salt), int(n), int(r), int(p))
    except ValueError as exc:
        raise StartupError(f"{where}: {exc}") from exc
    raise StartupError(f"{where}: each key needs 'sha256' or 'scrypt'")


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise StartupError(f"cannot read API keys file {path}: {exc}") from exc


def _entries(data: Any, path: Path) -> list[KeyEntry]:
    keys = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(keys, list) or not keys:
        raise StartupError(f"API keys file {path} must hold a non-empty 'keys' list")
    return [parse_entry(k, f"{path}: keys[{i}]") for i, k in enumerate(keys)]


def load_keys(path: Path) -> list[KeyEntry]:
    return _entries(_read(path), path)


def load_keys_file(path: Path) -> tuple[list[KeyEntry], dict[str, RateLimit]]:
    """The keys and the per-tenant rate limits of a keys file (``StartupError`` when invalid)."""
    data = _read(path)
    entries = _entries(data, path)
    try:
        limits = parse_limits(data.get("limits"), str(path))
    except ValueError as exc:
        raise StartupError(str(exc)) from exc
    return entries, limits


class Authenticator:
    """Maps a presented key to its tenant, or None."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        self._sha = [e for e in entries if e.kind == "sha256"]
        self._scrypt = [e for e in entries if e.kind == "scrypt"]
        self._verified: dict[bytes, str] = {}  # sha256(key) -> tenant, for scrypt entries

    def tenant_for(self, key: str | None) -> str | None:
        if not key:
            return None
        fast = hashlib.sha256(key.encode()).digest()
        found: str | None = None
        for e in self._sha:
            if hmac.compare_digest(fast, e.digest):
                found = e.tenant
        if found is not None:
            return found
        cached = self._verified.get(fast)
        if cached is not None:
            return cached
        for e in self._scrypt:
            if hmac.compare_digest(_scrypt(key, e), e.digest):
                found = e.tenant
        if found is not None:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[fast] = found
        return found


class ReloadingAuthenticator(Authenticator):
    """An ``Authenticator`` over a keys file that re-reads it when it changes (checked at most
    every ``reload_interval_s`` wall seconds, lazily on the request path: one ``stat``)."""

    def __init__(self, path: Path, reload_interval_s: float = 1.0, log: Any = None) -> None:
        entries, limits = load_keys_file(path)
        super().__init__(entries)
        self.path = path
        self.limits = limits
        self.reload_interval_s = reload_interval_s
        self.reloads = 0
        self._log = log
        self._signature = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def maybe_reload(self) -> bool:
        """Re-read the file if it changed; True when new keys are in force."""
        now = time.monotonic()
        if now - self._checked < self.reload_interval_s:
            return False
        self._checked = now
        signature = self._stat()
        if signature == self._signature or signature is None:
            return False
        self._signature = signature
        try:
            entries, limits = load_keys_file(self.path)
        except StartupError as exc:
            if self._log is not None:
                self._log.error("API keys file not reloaded: keeping the previous keys", error=str(exc))
            return False
        Authenticator.__init__(self, entries)
        self.limits = limits
        self.reloads += 1
        if self._log is not None:
            self._log.info("API keys file reloaded", keys=len(entries), limits=len(limits))
        return True

    def tenant_for(self, key: str | None) -> str | None:
        self.maybe_reload()
        return super().tenant_for(key)


def bearer_key(authorization: str | None, api_key_header: str | None) -> str | None:
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return api_key_header.strip() if api_key_header else None


def hash_entry(tenant: str, key: str, use_scrypt: bool) -> dict[str, str]:
    if not use_scrypt:
        return {"tenant": tenant, "sha256": hashlib.sha256(key.encode()).hexdigest()}
    salt = secrets.token_bytes(16)
    e = KeyEntry(tenant, "scrypt", b"\0" * 32, salt)
    digest = _scrypt(key, e)
    return {"tenant": tenant, "scrypt": f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.router.auth", description="hash an API key")
    sub = parser.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hash", help="print a keys-file entry for KEY")
    h.add_argument("--tenant", required=True)
    h.add_argument("--scrypt", action="store_true", help="scrypt instead of sha256")
    h.add_argument("key")
    args = parser.parse_args(argv)
    print(json.dumps(hash_entry(args.tenant, args.key, args.scrypt)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
