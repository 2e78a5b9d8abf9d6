"""A Ctrl-C that a campaign cannot lose.

Python raises ``KeyboardInterrupt`` wherever the main thread is when it
handles SIGINT. When that is inside a finaliser (a ``__del__`` or a weakref
callback, which JAX and NumPyro run during a fit), Python prints "Exception
ignored" and carries on, and the campaign would run to its end. The handler
that :func:`recording` installs also records the request, and both campaign
drivers call :func:`check` at every turn, so a swallowed interrupt still stops
the campaign before its next measurement or fit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["recording", "request", "requested", "check", "clear"]

_REQUESTED = threading.Event()


def request() -> None:
    """Record an interrupt; the next :func:`check` raises ``KeyboardInterrupt``."""
    _REQUESTED.set()


def requested() -> bool:
    """Whether an interrupt was recorded and not cleared."""
    return _REQUESTED.is_set()


def clear() -> None:
    """Forget a recorded interrupt."""
    _REQUESTED.clear()


def check() -> None:
    """Raise ``KeyboardInterrupt`` if an interrupt was recorded (it stays recorded)."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _REQUESTED.set()
    raise KeyboardInterrupt


@contextmanager
def recording() -> Iterator[None]:
    """Within the block, SIGINT records itself before it raises ``KeyboardInterrupt``.

    Installs the handler only in the main thread (elsewhere the block changes
    nothing); clears any earlier request on entry and restores the previous
    handler on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear()
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
