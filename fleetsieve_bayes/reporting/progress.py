"""Live progress display for ``run``: quiet when not on a terminal or with ``--quiet``.

:func:`make_progress` yields the ``on_event(kind, info)`` callback that
:func:`fleetsieve_bayes.campaign.runner.run_campaign` calls. The callback only updates
a :class:`ProgressState`; a rich ``Live`` display re-renders that state a few
times a second from its own refresh thread, so the elapsed time of a running
measurement (which can take minutes) keeps ticking between events. Each
finished round and measurement is also printed once above the live panel, so
the terminal keeps a scroll-back history of the campaign.

Events (see ``campaign.py``): ``resume`` ``{measured}``; ``round`` (the journal's
round record); ``measure-start`` ``{cell, label, expected_s, round}``;
``measure-done`` ``{cell, label, row, gpu_seconds}``; ``sampling`` ``{preset, done,
total}`` (iterations of the running fit, NUTS transitions over its chains or SVI steps: the bar under
"deciding", labelled "certifying" for the ``certify`` preset); ``done`` (result.json).
A ``candidates``/``total_cells`` key in any event, or ``make_progress``'s
``total_cells``, sets the denominator of "cells measured".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = ["ProgressState", "make_progress", "render_progress", "update_state"]

# Certificate → display style (green: decided feasible; red: decided infeasible).
CERT_STYLE = {
    "certified-feasible": "bold green",
    "certified-infeasible": "bold red",
    "undecided": "yellow",
    "exhausted": "magenta",
}


@dataclass
class ProgressState:
    """What the live panel shows; mutated only by :func:`update_state`."""

    round: int = 0
    measured: int = 0
    total_cells: int | None = None
    gpu_seconds: float = 0.0
    certificate: str | None = None
    reason: str = ""
    gap: dict[str, float] | None = None
    current_label: str | None = None
    current_started: float | None = None  # time.monotonic() at measure-start
    current_expected_s: float | None = None
    status: str | None = None  # final status after "done"
    deciding_since: float | None = None  # between measurements: fit → allocate → acquire
    history: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)  # labels of cells being measured (parallel runs)
    sampling: tuple[str, int, int] | None = None  # (preset, iterations done, total) of the running fit


def update_state(state: ProgressState, kind: str, info: dict[str, Any], now: float) -> str | None:
    """Apply one campaign event to ``state``.

    Returns:
        A line to print once above the live panel (history), or ``None``.
    """
    for key in ("candidates", "total_cells"):
        if isinstance(info.get(key), int):
            state.total_cells = int(info[key])
    if kind == "sampling":
        state.sampling = (str(info.get("preset", "")), int(info.get("done", 0)), int(info.get("total", 0)))
        return None
    if kind in ("round", "measure-start", "done"):
        state.sampling = None
    if kind == "resume":
        state.measured = int(info.get("measured", state.measured))
        state.deciding_since = now
        return f"resuming: {state.measured} cells already measured"
    if kind == "round":
        from fleetsieve_bayes.campaign.journal import RoundRecord

        rec = info if isinstance(info, RoundRecord) else RoundRecord.from_json(info, "round event")
        state.round = rec.round
        state.measured = rec.measured_cells
        state.gpu_seconds = rec.gpu_seconds
        state.certificate = rec.certificate
        state.reason = rec.reason
        state.gap = dict(rec.gap)
        then = f"next {rec.chosen.label}" if rec.chosen is not None else rec.outcome
        return f"round {state.round}: {state.certificate}, gap {_gap_text(state.gap)}; {then}"
    if kind == "measure-start":
        state.in_flight.append(str(info.get("label", "?")))
        state.current_label = str(info.get("label", "?"))
        state.current_started = now
        state.deciding_since = None
        state.current_expected_s = float(info["expected_s"]) if info.get("expected_s") is not None else None
        if info.get("round") is not None:
            state.round = int(info["round"])
        return None
    if kind == "measure-done":
        took = now - state.current_started if state.current_started is not None else None
        state.measured += 1
        gpu_s = float(info.get("gpu_seconds", 0.0))
        state.gpu_seconds += gpu_s
        label = str(info.get("label", state.current_label or "?"))
        if label in state.in_flight:
            state.in_flight.remove(label)
        state.current_label = state.current_started = state.current_expected_s = None
        state.deciding_since = now
        row = info.get("row") or {}
        detail = ""
        if row:
            detail = (
                f": {float(row.get('throughput_rps', float('nan'))):.2f} req/s, "
                f"TTFT p99 {float(row.get('ttft_p99_s', float('nan'))):.2f} s, "
                f"success {float(row.get('success_rate', float('nan'))):.3f}"
            )
        wall = f" in {took:.0f} s" if took is not None else ""
        return f"  measured {label}{wall}{detail} ({gpu_s:.0f} GPU-s)"
    if kind == "done":
        state.status = str(info.get("status"))
        state.gpu_seconds = float(info.get("gpu_seconds", state.gpu_seconds))
        if isinstance(info.get("measured"), list):
            state.measured = len(info["measured"])
        state.current_label = state.deciding_since = None
        return f"done: {state.status}, {state.gpu_seconds:.0f} GPU-seconds, {state.measured} cells measured"
    return None


def _gap_text(gap: dict[str, float] | None) -> str:
    if not gap:
        return "—"
    return (
        f"critical {gap.get('critical', 0.0):.0f} · min fulfillment {gap.get('min_fulfillment', 0.0):.3f}"
        f" · goodput {gap.get('goodput', 0.0):.3f}"
    )


def _duration(s: float) -> str:
    s = max(0.0, s)
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def render_progress(state: ProgressState, now: float) -> RenderableType:
    """The live panel for ``state`` at monotonic time ``now``."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", justify="right")
    table.add_column()
    total = "?" if state.total_cells is None else str(state.total_cells)
    table.add_row("round", str(state.round))
    table.add_row("cells measured", f"{state.measured} / {total}")
    table.add_row("GPU-seconds", f"{state.gpu_seconds:,.0f}")
    cert = state.status or state.certificate or "—"
    table.add_row("certificate", Text(cert, style=CERT_STYLE.get(cert, "")))
    table.add_row("gap", _gap_text(state.gap))
    if state.reason:
        table.add_row("why", Text(state.reason, style="dim"))
    parts: list[RenderableType] = [table]
    if state.current_label is not None and state.current_started is not None:
        elapsed = now - state.current_started
        line = Table.grid(padding=(0, 1))
        line.add_column(style="bold")
        line.add_column(width=30)
        line.add_column()
        exp = state.current_expected_s
        if exp and exp > 0:
            bar = ProgressBar(total=exp, completed=min(elapsed, exp), width=30)
            times = f"{_duration(elapsed)} / ~{_duration(exp)}"
        else:
            bar = ProgressBar(total=None, width=30)  # pulsing: duration unknown
            times = _duration(elapsed)
        line.add_row(f"measuring {state.current_label}", bar, times)
        parts.append(line)
    if len(state.in_flight) > 1 or (state.in_flight and state.current_label is None):
        parts.append(Text(f"in flight ({len(state.in_flight)}): {', '.join(state.in_flight)}", style="bold"))
    elif state.deciding_since is not None and state.current_label is None:
        parts.append(Text(f"deciding: fit → bounds → allocate → next cell  {_duration(now - state.deciding_since)}", style="dim"))
        if state.sampling is not None:
            parts.append(_sampling_line(*state.sampling))
    return Group(*parts)


def _sampling_line(preset: str, done: int, total: int) -> RenderableType:
    """The running fit: a bar of its iterations (NUTS: over every chain)."""
    line = Table.grid(padding=(0, 1))
    line.add_column(style="bold")
    line.add_column(width=30)
    line.add_column()
    what = "certifying" if preset == "certify" else f"fitting ({preset})"
    total = max(total, done, 1)
    line.add_row(what, ProgressBar(total=total, completed=done, width=30), f"{done:,} / {total:,} iterations")
    return line


class _LiveView:
    """A renderable that reads the clock at render time, so elapsed time ticks."""

    def __init__(self, state: ProgressState, clock: Callable[[], float]) -> None:
        self.state = state
        self.clock = clock

    def __rich__(self) -> RenderableType:
        return render_progress(self.state, self.clock())


@contextlib.contextmanager
def make_progress(
    *,
    quiet: bool,
    stream: TextIO,
    total_cells: int | None = None,
    refresh_per_second: float = 4.0,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """Yield an ``on_event(kind, info)`` callback for :func:`fleetsieve_bayes.campaign.runner.run_campaign`.

    A no-op (nothing is written to ``stream``) when ``quiet`` or when
    ``stream`` is not a TTY; otherwise a rich ``Live`` panel on ``stream``
    for the duration of the ``with`` block.

    Args:
        total_cells: number of candidate cells, if known (else taken from events).
        refresh_per_second: how often the panel (and elapsed time) is redrawn.
        clock: monotonic seconds (tests pass a fake one).
    """
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    if quiet or not is_tty:

        def _silent(kind: str, info: dict[str, Any]) -> None:
            return None

        yield _silent
        return

    state = ProgressState(total_cells=total_cells)
    console = Console(file=stream, force_terminal=True)
    with Live(
        _LiveView(state, clock),
        console=console,
        refresh_per_second=refresh_per_second,
        transient=False,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as live:

        def on_event(kind: str, info: dict[str, Any]) -> None:
            line = update_state(state, kind, info, clock())
            if line is not None:
                state.history.append(line)
                live.console.print(line, highlight=False, markup=False)
            live.refresh()

        yield on_event
