"""Test helpers shipped with the package.

:mod:`fleetsieve_bayes.testing.fake_server` is a small OpenAI-compatible
streaming server whose throughput and tails respond to load like a serving
engine's (bounded engine slots, fixed per-token step time), with switches to
fail the ways a real vLLM server fails. Tests and CI point the vLLM backend's
command template at it.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fake_server_command", "running_fake_server"]


def fake_server_command(*flags: str) -> list[str]:
    """Command template that runs the fake server (``{port}``, ``{model}``, ``{tp}`` filled by the launcher)."""
    return [sys.executable, "-m", "fleetsieve_bayes.testing.fake_server",
            "--port", "{port}", "--model", "{model}", "--tp", "{tp}", *flags]


@contextmanager
def running_fake_server(*flags: str, model: str = "fake-model", tp: int = 1,
                        ready_timeout_s: float = 20.0) -> Iterator[str]:
    """Start the fake server on a free loopback port; yield its base URL; stop its whole group."""
    from fleetsieve_bayes.backends.server import (
        free_port,
        log_tail,
        render_command,
        start_server,
        stop_server,
        wait_ready,
    )

    port = free_port()
    cmd = render_command(fake_server_command(*flags), model=model, tp=tp, port=port)
    with tempfile.TemporaryDirectory() as tmp:
        handle = start_server(cmd, port=port, log_path=Path(tmp) / "server.log")
        try:
            ready = wait_ready(handle, ready_timeout_s)
            if ready.status != "ready":
                raise RuntimeError(f"fake server not ready ({ready.status}): {log_tail(handle.log_path)}")
            yield handle.url
        finally:
            left = stop_server(handle, grace_s=5.0)
            if left:
                raise RuntimeError(f"fake server left processes behind: {sorted(left)}")
