"""Serving-process lifecycle for one measured cell.

A cell gets a free port, a server process in its own session (so it and all
its workers form one process group), ``GET /health`` polled until 200 (503
while the engine loads; failing fast when the process exits), then, after the
measurement, the whole group is stopped — SIGTERM, a grace period, SIGKILL —
and we verify that nothing of it is left. vLLM's tensor-parallel workers can
outlive a killed parent and keep GPU memory, so descendants that left the
group are tracked through ``/proc`` as well.

A server never outlives the process that started it, even one killed with
SIGKILL: it is started with a parent-death signal, and a watchdog process
kills its whole group when this process is gone
(:mod:`fleetsieve_bayes.backends.lifeline`). A resumed campaign therefore
finds no server, worker or held port of the run it resumes.

The command is a template: an argument list (never a shell string) whose
items may contain ``{model}``, ``{tp}`` and ``{port}``; nothing else in an
item is interpreted, so JSON arguments with braces pass through unchanged.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "DEFAULT_COMMAND",
    "PLACEHOLDERS",
    "ServerHandle",
    "Readiness",
    "render_command",
    "free_port",
    "start_server",
    "wait_ready",
    "stop_server",
    "probe",
    "group_members",
    "log_tail",
    "guard_descendants",
]

DEFAULT_COMMAND: tuple[str, ...] = (
    "vllm", "serve", "{model}", "--tensor-parallel-size", "{tp}", "--port", "{port}", "--seed", "0",
)
PLACEHOLDERS: tuple[str, ...] = ("{model}", "{tp}", "{port}")
HOST = "127.0.0.1"


class ServerHandle(NamedTuple):
    """A launched server: its process (session leader), port, log file and start time."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    started: float  # time.monotonic() at launch

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session=True: the leader's pid is the group id


class Readiness(NamedTuple):
    """Outcome of waiting for a server: ``status`` is ``"ready"``, ``"exited"`` or ``"timeout"``."""

    status: str
    waited_s: float
    returncode: int | None


def render_command(template: Sequence[str], *, model: str, tp: int, port: int) -> list[str]:
    """Fill ``{model}``, ``{tp}``, ``{port}`` in each item of ``template``.

    Raises:
        ValueError: an item contains another ``{name}`` placeholder — most
            likely a typo — rather than silently passing it to the server.
    """
    import re

    values = {"model": model, "tp": str(tp), "port": str(port)}
    out = []
    for item in template:
        for name in re.findall(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", item):
            if name not in values:
                raise ValueError(f"unknown placeholder {{{name}}} in command item {item!r} (allowed: {', '.join(PLACEHOLDERS)})")
        out.append(re.sub(r"\{(model|tp|port)\}", lambda m: values[m.group(1)], item))
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (a fresh one per cell: crashed servers can hold theirs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start_server(
    command: Sequence[str],
    *,
    port: int,
    log_path: Path,
    gpus: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerHandle:
    """Launch ``command`` in a new session with stdout+stderr to ``log_path``.

    ``CUDA_VISIBLE_DEVICES`` is set to ``gpus`` (when given) and vLLM workers
    are spawned, not forked, as in vLLM's own test helper.
    """
    child_env = dict(os.environ)
    child_env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if gpus is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if env:
        child_env.update(env)
    command = list(command)
    if not command or shutil.which(command[0], path=child_env.get("PATH")) is None:
        raise FileNotFoundError(f"executable not found: {command[0] if command else ''!r}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    line = _lifeline()
    with log_path.open("ab") as log:
        proc = line.spawn(
            [sys.executable, "-I", _LIFELINE_SCRIPT, "exec", str(os.getpid()), "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    line.watch(proc.pid)
    return ServerHandle(proc=proc, port=port, log_path=log_path, started=time.monotonic())


_LIFELINE_SCRIPT = str(Path(__file__).resolve().with_name("lifeline.py"))


class _Lifeline:
    """This process's spawner thread and server watchdog (see :mod:`.lifeline`)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        # One long-lived thread starts every server: the parent-death signal
        # fires when the starting thread dies, which is then this process's death.
        self.spawner = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetsieve-spawn")
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.groups: set[int] = set()

    def spawn(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        return self.spawner.submit(subprocess.Popen, argv, **kwargs).result()

    def _send(self, line: str) -> None:
        for _ in range(2):
            if self.watchdog is None or self.watchdog.poll() is not None:
                self.watchdog = subprocess.Popen(
                    [sys.executable, "-I", _LIFELINE_SCRIPT, "watch", str(self.pid)],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True,  # terminal signals to the campaign do not reach it
                )
                assert self.watchdog.stdin is not None
                self.watchdog.stdin.write(b"".join(b"+%d\n" % g for g in self.groups))
            try:
                assert self.watchdog.stdin is not None
                self.watchdog.stdin.write(line.encode() + b"\n")
                self.watchdog.stdin.flush()
                return
            except (BrokenPipeError, OSError):
                self.watchdog = None

    def guard(self) -> None:
        """Start the watchdog now (it also notes this process's other descendants)."""
        with self.lock:
            if self.watchdog is None or self.watchdog.poll() is not None:
                self._send("")

    def watch(self, pgid: int) -> None:
        with self.lock:
            self.groups.add(pgid)
            self._send(f"+{pgid}")

    def unwatch(self, pgid: int) -> None:
        with self.lock:
            if pgid in self.groups:
                self.groups.discard(pgid)
                self._send(f"-{pgid}")


def guard_descendants() -> None:
    """Make every process this one starts from now on die with it, servers or not.

    Starts this process's watchdog (:mod:`.lifeline`), which SIGKILLs the
    descendants it has seen once this process is gone; for example the
    processes of a local Ray that a campaign starts.
    """
    _lifeline().guard()


_LIFELINES: dict[int, _Lifeline] = {}
_LIFELINES_LOCK = threading.Lock()


def _lifeline() -> _Lifeline:
    """This process's :class:`_Lifeline` (a forked child gets its own)."""
    with _LIFELINES_LOCK:
        line = _LIFELINES.get(os.getpid())
        if line is None:
            line = _LIFELINES[os.getpid()] = _Lifeline()
        return line


def probe(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback/user URL
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_ready(handle: ServerHandle, timeout_s: float, *, poll_s: float = 0.25) -> Readiness:
    """Poll ``/health`` until 200, the process exits, or ``timeout_s`` passes.

    ``/v1/models`` is not used: it can answer before the engine is ready.
    """
    start = time.monotonic()
    while True:
        rc = handle.proc.poll()
        if rc is not None:
            return Readiness("exited", time.monotonic() - start, rc)
        if probe(handle.url + "/health", timeout_s=min(2.0, max(poll_s, 0.5))) == 200:
            return Readiness("ready", time.monotonic() - start, None)
        if time.monotonic() - start > timeout_s:
            return Readiness("timeout", time.monotonic() - start, None)
        time.sleep(poll_s)


def group_members(pgid: int, extra: set[int] | None = None) -> set[int]:
    """Live (non-zombie) pids in process group/session ``pgid``, plus live ``extra`` pids.

    Reads ``/proc/<pid>/stat`` (no psutil). Zombies are ignored: they hold no
    memory and are reaped by their parent.
    """
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _stat(int(entry))
        if stat is None or stat[0] == "Z":
            continue
        if stat[2] == pgid or stat[3] == pgid or int(entry) in (extra or set()):
            found.add(int(entry))
    return found


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """``(state, ppid, pgrp, session)`` of ``pid``, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces.
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3])


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[1], []).append(int(entry))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def stop_server(handle: ServerHandle, *, grace_s: float = 10.0) -> set[int]:
    """Stop the server's whole process group: SIGTERM, wait ``grace_s``, SIGKILL.

    Returns:
        pids of the group still alive afterwards (empty on success).
    """
    pgid = handle.pgid
    # Descendants that called setsid() themselves escape the group; note them now,
    # before the parent dies and they are re-parented.
    tracked = _descendants(handle.proc.pid) | {handle.proc.pid}

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for pid in group_members(pgid, tracked):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        handle.proc.poll()  # reap the leader as soon as it exits
        if not group_members(pgid, tracked):
            break
        time.sleep(0.05)
    else:
        send(signal.SIGKILL)
        kill_deadline = time.monotonic() + 5.0
        while time.monotonic() < kill_deadline:
            handle.proc.poll()
            if not group_members(pgid, tracked):
                break
            time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        handle.proc.wait(timeout=1.0)
    left = group_members(pgid, tracked)
    if not left:
        _lifeline().unwatch(pgid)
    return left


def log_tail(path: Path, n_bytes: int = 20_000) -> str:
    """Last ``n_bytes`` of a server log (for failure classification and messages)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
