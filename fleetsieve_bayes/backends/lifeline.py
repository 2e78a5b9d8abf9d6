"""Servers die with the process that started them, however it dies (SIGKILL included).

Two guards, both armed by :func:`fleetsieve_bayes.backends.server.start_server`:

- **A parent-death signal on the server.** The server is started through
  ``python lifeline.py exec PARENT_PID -- COMMAND…``, which sets
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux) and then ``exec``\\ s the
  command: same pid, same exit status, and the kernel kills it when the
  thread that started it dies. The launcher starts every server from one
  long-lived thread (its spawner) so that this is the process's death.
- **A watchdog for the server's workers and everything else.** The signal
  reaches the server alone; its workers (vLLM's tensor-parallel processes)
  would outlive it and keep their GPUs, and so would the processes of a
  local Ray the campaign started. ``python lifeline.py watch PID`` is a small
  process, in a session of its own, that reads ``+PGID`` / ``-PGID`` lines on
  its stdin (a pipe from the launcher, process ``PID``) for the process
  groups of the live servers, and notes the launcher's descendants every
  second (pid and start time, so a reused pid is never mistaken for one).
  When the pipe closes, i.e. when the launcher has exited or been killed, it
  SIGKILLs every group still registered (and every process left in that
  group's session) and every noted descendant still alive, and exits.

This file is run as a script by path (``python -I``): it imports only the
standard library, never the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
from collections.abc import Mapping
from typing import Any

PR_SET_PDEATHSIG = 1


def arm_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for the calling process; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def stop_workers_on_sigterm(running: Mapping[Any, Any]) -> None:
    """On SIGTERM, SIGKILL the worker processes of every executor in ``running``'s values
    (``concurrent.futures.ProcessPoolExecutor``s, read when the signal comes), then exit with
    128 + the signal: a benchmark's workers would otherwise run on, orphaned, holding cores
    and gigabytes (a SIGKILL reaches them through :func:`arm_parent_death_signal`)."""

    def stop(signum: int, frame: Any) -> None:
        for ex in running.values():
            for proc in list(getattr(ex, "_processes", {}).values()):
                proc.kill()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def exec_with_parent(parent: int, argv: list[str]) -> None:
    """Arm the parent-death signal, then become ``argv`` (never returns)."""
    arm_parent_death_signal()
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was armed
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"lifeline: cannot execute {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)


SCAN_S = 1.0  # how often the watchdog notes the launcher's descendants


def _stat(pid: int) -> tuple[int, int, int] | None:
    """``(ppid, session, start time)`` of a live (non-zombie) ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[3]), int(rest[19])


def _table() -> dict[int, tuple[int, int, int]]:
    if not os.path.isdir("/proc"):
        return {}
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


def descendants(root: int, table: dict[int, tuple[int, int, int]]) -> dict[int, int]:
    """``{pid: start time}`` of the descendants of ``root`` in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out[c] = table[c][2]
                todo.append(c)
    return out


def kill_all(groups: set[int], noted: dict[int, int]) -> None:
    """SIGKILL the process groups ``groups``, every process left in those sessions, and
    every process of ``noted`` (``{pid: start time}``) that is still the one noted."""
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    me = os.getpid()
    for pid, (_, session, started) in _table().items():
        if pid != me and (session in groups or (noted.get(pid) == started and not _is_watchdog(pid))):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _is_watchdog(pid: int) -> bool:
    """Whether ``pid`` is another watchdog (a descendant's, e.g. a Ray worker's): it is left
    to do its own work, killing the groups registered with it, which this one may not know."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"lifeline.py") for a in argv) and b"watch" in argv


def watch(launcher: int, fd: int = 0) -> None:
    """Track ``+PGID`` / ``-PGID`` lines on ``fd`` and ``launcher``'s descendants; at end of input kill them."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    noted: dict[int, int] = {}
    me = os.getpid()

    def on_term(signum: int, frame: object) -> None:
        kill_all(groups, noted)  # stopped politely: clean up as if the launcher had gone
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    pending = b""
    while True:
        table = _table()
        if launcher in table:
            # The live descendants now; those that died since are forgotten (their pids may be reused).
            noted = {pid: t for pid, t in descendants(launcher, table).items() if pid != me}
        try:
            ready, _, _ = select.select([fd], [], [], SCAN_S)
            chunk = os.read(fd, 4096) if ready else None
        except OSError:
            break
        if chunk is None:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                pgid = int(line[1:])
                if line[:1] == b"+":
                    groups.add(pgid)
                elif line[:1] == b"-":
                    groups.discard(pgid)
    kill_all(groups, noted)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "watch":
        watch(int(argv[1]))
        return 0
    if len(argv) >= 4 and argv[0] == "exec" and argv[2] == "--":
        exec_with_parent(int(argv[1]), argv[3:])
    print("usage: lifeline.py watch LAUNCHER_PID | lifeline.py exec PARENT_PID -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
