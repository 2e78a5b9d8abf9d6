"""Servers die with the process that started them, however it dies (SIGKILL included).

Two guards, both armed by :func:`fleetsieve_bayes.backends.server.start_server`:

- **A parent-death signal on the server.** The server is started through
  ``python lifeline.py exec PARENT_PID -- COMMAND…``, which sets
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux) and then ``exec``\\ s the
  command: same pid, same exit status, and the kernel kills it when the
  thread that started it dies. The launcher starts every server from one
  long-lived thread (its spawner) so that this is the process's death.
- **A watchdog for the server's workers.** The signal reaches the server
  alone; its workers (vLLM's tensor-parallel processes) would outlive it and
  keep their GPUs. ``python lifeline.py watch`` is a small process, in a
  session of its own, that reads ``+PGID`` / ``-PGID`` lines on its stdin (a
  pipe from the launcher) for the process groups of the live servers. When
  the pipe closes, i.e. when the launcher's process has exited or been killed,
  it SIGKILLs every group still registered (and every process left in that
  group's session) and exits.

This file is run as a script by path (``python -I``): it imports only the
standard library, never the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

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


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return int(text[text.rfind(")") + 2:].split()[3])


def kill_groups(groups: set[int]) -> None:
    """SIGKILL each process group in ``groups`` and every process left in those sessions."""
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    if not os.path.isdir("/proc"):
        return
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _session_of(int(entry)) in groups:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def watch(fd: int = 0) -> None:
    """Track ``+PGID`` / ``-PGID`` lines on ``fd``; at end of input kill what is left."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()

    def on_term(signum: int, frame: object) -> None:
        kill_groups(groups)  # stopped politely: clean up as if the launcher had gone
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
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
    kill_groups(groups)


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"]:
        watch()
        return 0
    if len(argv) >= 4 and argv[0] == "exec" and argv[2] == "--":
        exec_with_parent(int(argv[1]), argv[3:])
    print("usage: lifeline.py watch | lifeline.py exec PARENT_PID -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
