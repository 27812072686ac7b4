"""Child-process supervision for `tao up`: start, wait healthy, stop cleanly, leave no orphans.

Children are started in their own process group with PR_SET_PDEATHSIG (Linux) so they die
with `tao up` even if it is killed; `stop_all` sends SIGTERM, waits, then SIGKILLs stragglers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setpgrp()


# The same without Python code between fork and exec (the default). In a process that runs
# gRPC threads, a preexec_fn runs grpc's at-fork handlers in the child, which can abort it
# before exec ("epoll_wait error: Bad file descriptor", SIGABRT: seen when fault tests
# restart a service, and when a second stack starts in the same process). So the child
# execs at once (vfork, no Python code) into this trampoline, which sets the death signal
# and execs the real command; Popen itself puts it in its own process group.
_TRAMPOLINE = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "sys.exit(1) if os.getppid() != int(sys.argv[1]) else os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class PortInUse(RuntimeError):
    pass


def check_port_free(port: int, what: str, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise PortInUse(f"port {port} ({what}) is already in use") from exc


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    #: the extra environment it was started with (kept for ``Supervisor.respawn``)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Supervisor:
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: Sequence[str], extra_env: dict[str, str] | None = None,
              fork_safe: bool = True) -> Child:
        """Start ``argv`` as child ``name``. ``fork_safe`` (default): no Python code between
        fork and exec, which a parent that already runs gRPC threads needs (see ``_TRAMPOLINE``;
        seen with a second stack in one process: the child died with SIGABRT before exec)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name, list(argv), self.log_dir / f"{name}.log", env=dict(extra_env or {}))
        env = {**os.environ, **self.env, **(extra_env or {})}
        log = open(child.log_path, "ab")
        try:
            if fork_safe:
                cmd = [sys.executable, "-c", _TRAMPOLINE, str(os.getpid()), *child.argv]
                child.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              env=env, process_group=0)
            else:
                child.proc = subprocess.Popen(child.argv, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        finally:
            log.close()
        self.children.append(child)
        return child

    def wait_until(self, child: Child, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited during start-up: {child.tail(3)}")
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{child.name} not {what} after {timeout_s:.0f} s: {child.tail(3)}")

    def find(self, name: str) -> Child:
        """The live record of child ``name`` (KeyError when there is none)."""
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(f"no child named {name!r}; children: {', '.join(c.name for c in self.children)}")

    def send_signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to child ``name`` (fault injection); a SIGKILL is waited for."""
        child = self.find(name)
        if child.proc is None or child.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            child.proc.wait(timeout=10)

    def respawn(self, name: str, extra_env: dict[str, str] | None = None) -> Child:
        """Start child ``name`` again with the same argv (so the same ports), replacing its
        record in place; a still-running process is SIGKILLed first."""
        old = self.find(name)
        if old.proc is not None and old.proc.poll() is None:
            self.send_signal(name, signal.SIGKILL)
        index = self.children.index(old)
        self.children.remove(old)
        child = self.spawn(name, old.argv, {**old.env, **(extra_env or {})})
        self.children.remove(child)
        self.children.insert(index, child)
        return child

    def dead_children(self) -> list[Child]:
        return [c for c in self.children if not c.alive()]

    def stop_all(self, grace_s: float = 8.0) -> None:
        """SIGTERM every child (newest first), wait up to ``grace_s``, SIGKILL the rest."""
        for child in reversed(self.children):
            if child.alive() and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            if child.proc is None:
                continue
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(timeout=5)
            # anything the child itself spawned in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
        self.children.clear()


def tao_argv(*args: str) -> list[str]:
    """Run a `tao` subcommand with this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "services.cli", *args]
