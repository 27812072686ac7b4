"""Free loopback ports for child processes that bind them later.

Asking the kernel for port 0 hands out a port from the *ephemeral* range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768–60999 on Linux), the same
range the kernel draws from for every outgoing connection. Between closing the
probe socket and the child binding the port, any outgoing connection on the
machine (a Redis client, an HTTP request to a replica) may take it, and the
child then fails with "address already in use". Drawing at random from below
the ephemeral range removes that race; only another process that binds fixed
ports there can still collide, and a bind probe catches those before returning.
"""

from __future__ import annotations

import random
import socket
import threading

_LOW, _HIGH = 20000, 32767
_lock = threading.Lock()
_handed_out: set[int] = set()
_rng = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, outside the kernel's ephemeral range, and not
    handed out before by this process."""
    lo_eph, hi_eph = _ephemeral_range()
    if not (_HIGH < lo_eph or _LOW > hi_eph):  # unusual kernel setting: fall back to the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    return _draw(host, (0,))


def free_port_pair(offset: int = 10000, host: str = "127.0.0.1") -> int:
    """A port like ``free_port`` whose ``port + offset`` is free and below the ephemeral range
    too (a Redis Cluster node listens on both: its cluster bus is the port + 10000)."""
    return _draw(host, (0, offset))


def _draw(host: str, offsets: tuple[int, ...]) -> int:
    """A random port below the ephemeral range such that ``port + o`` is bindable and not handed
    out before for every ``o`` in ``offsets``; all of them are handed out."""
    with _lock:
        for _ in range(2000):
            port = _rng.randint(_LOW, _HIGH - max(offsets))
            ports = {port + o for o in offsets}
            if ports & _handed_out or not all(_bindable(p, host) for p in ports):
                continue
            _handed_out.update(ports)
            return port
    raise RuntimeError(f"no free port (+ {offsets}) in {_LOW}-{_HIGH} on {host}")
