"""How far the running fit has got, for a progress display.

A certification attempt can sample for many minutes (four chains of 800
transitions at tree depth up to 10, then extensions), and a campaign's
display would otherwise show only a ticking clock. Inside
:func:`sampling_progress`, every NUTS and SVI fit of this process reports
``sink(preset, done, total)`` when it starts (``done`` 0) and after each
compiled chunk of iterations: ``preset`` is the inference preset's name
(``"certify"`` for a certification attempt), ``done`` and ``total`` count
iterations of the current fit (NUTS: transitions over every chain; SVI:
optimizer steps). A fit that
has to sample more than it planned (a warm start re-tuned, or redone cold)
raises ``total`` as it goes. Each fit call starts a new count, so an
extension of a certifying fit is a fit of its own.

The sink is process-wide (the innermost :func:`sampling_progress` receives the
reports) and is called from the chains' threads, under a lock; it must be
quick. Nothing is counted when no sink is set.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["ProgressSink", "sampling_progress", "begin", "expect_more", "advance"]

ProgressSink = Callable[[str, int, int], None]

_SINKS: list[ProgressSink] = []
_LOCK = threading.Lock()
_COUNT = {"done": 0, "total": 0}
_NAME = [""]


@contextlib.contextmanager
def sampling_progress(sink: ProgressSink) -> Iterator[None]:
    """Send every NUTS fit's progress to ``sink(preset, done, total)`` inside the block."""
    _SINKS.append(sink)
    try:
        yield
    finally:
        _SINKS.remove(sink)


def _emit() -> None:
    _SINKS[-1](_NAME[0], _COUNT["done"], max(_COUNT["total"], _COUNT["done"]))


def begin(preset: str, total: int) -> None:
    """A fit of ``preset`` starts and plans ``total`` iterations (NUTS: over every chain)."""
    if not _SINKS:
        return
    with _LOCK:
        _NAME[0] = preset
        _COUNT["done"], _COUNT["total"] = 0, int(total)
        _emit()


def expect_more(n: int) -> None:
    """The running fit runs ``n`` iterations more than it planned."""
    _bump("total", n)


def advance(n: int) -> None:
    """``n`` more iterations (of one chain) are done."""
    _bump("done", n)


def _bump(which: str, n: int) -> None:
    if not _SINKS:
        return
    with _LOCK:
        _COUNT[which] += int(n)
        _emit()
