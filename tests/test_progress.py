"""The live progress display: silent off a terminal, informative and ticking on one."""

from __future__ import annotations

import io
import re
import time
from typing import Any

from rich.console import Console

from fleetsieve_bayes.reporting.progress import (
    ProgressState,
    make_progress,
    render_progress,
    update_state,
)

ROUND = {
    "type": "round",
    "round": 2,
    "certificate": "undecided",
    "outcome": "measure",
    "reason": "gap above epsilon=0.05: min fulfillment 0.300, goodput 0.200",
    "gap": {"critical": 0.0, "min_fulfillment": 0.3, "goodput": 0.2},
    "conservative": {"allocation": None, "objective": {}},
    "optimistic": {"allocation": None, "objective": {}},
    "measured_cells": 7,
    "gpu_seconds": 9600.0,
    "chosen": {"workload": "chat", "tp": 4, "load": "C96"},
    "timings": {"fit_s": 1.0, "allocate_s": 0.1, "acquire_s": 0.2},
}
START = {"cell": {"workload": "chat", "tp": 4, "load": "C96"}, "label": "chat TP4@C96", "expected_s": 300.0, "round": 2}
ROW = {"throughput_rps": 6.596, "ttft_p99_s": 0.93, "completion_p99_s": 15.98, "success_rate": 0.992}
DONE_MEAS = {"cell": START["cell"], "label": "chat TP4@C96", "row": ROW, "gpu_seconds": 1200.0}
RESULT = {"status": "certified-feasible", "gpu_seconds": 10800.0, "measured": [{}] * 8, "candidates": 22}


class FakeTTY(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _events(on_event: Any) -> None:
    on_event("resume", {"measured": 6})
    on_event("round", ROUND)
    on_event("measure-start", START)
    on_event("measure-done", DONE_MEAS)
    on_event("done", RESULT)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text)


def test_silent_when_not_a_tty_or_quiet() -> None:
    for tty, quiet in ((False, False), (False, True), (True, True)):
        stream = FakeTTY(tty)
        with make_progress(quiet=quiet, stream=stream) as on_event:
            _events(on_event)
        assert stream.getvalue() == "", (tty, quiet)


def test_state_follows_events() -> None:
    s = ProgressState()
    assert update_state(s, "resume", {"measured": 6}, 0.0) == "resuming: 6 cells already measured"
    line = update_state(s, "round", ROUND, 1.0)
    assert line == "round 2: undecided, gap critical 0 · min fulfillment 0.300 · goodput 0.200; next chat TP4@C96"
    assert (s.round, s.measured, s.gpu_seconds, s.certificate) == (2, 7, 9600.0, "undecided")
    assert update_state(s, "measure-start", START, 10.0) is None
    assert s.current_label == "chat TP4@C96" and s.current_expected_s == 300.0
    line = update_state(s, "measure-done", DONE_MEAS, 310.0)
    assert line is not None and line.startswith("  measured chat TP4@C96 in 300 s: 6.60 req/s")
    assert (s.measured, s.gpu_seconds, s.current_label) == (8, 10800.0, None)
    update_state(s, "done", RESULT, 311.0)
    assert (s.status, s.total_cells, s.measured) == ("certified-feasible", 22, 8)


def test_render_shows_round_cells_gpu_seconds_gap_and_running_cell() -> None:
    s = ProgressState(total_cells=22)
    update_state(s, "round", ROUND, 0.0)
    update_state(s, "measure-start", START, 100.0)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=190.0))
    out = buf.getvalue()
    assert re.search(r"round\s+2", out)
    assert re.search(r"cells measured\s+7 / 22", out)
    assert re.search(r"GPU-seconds\s+9,600", out)
    assert "undecided" in out and "min fulfillment 0.300" in out
    assert "measuring chat TP4@C96" in out and "1:30 / ~5:00" in out
    # Between measurements the panel says the campaign is deciding, with its own clock.
    update_state(s, "measure-done", DONE_MEAS, 400.0)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=412.0))
    assert "measuring" not in buf.getvalue() and "deciding: fit → bounds → allocate → next cell  0:12" in buf.getvalue()


def test_live_elapsed_ticks_between_events() -> None:
    """The refresh thread re-renders with the clock: no event is needed for elapsed to advance."""
    now = [1000.0]
    stream = FakeTTY(True)
    with make_progress(quiet=False, stream=stream, total_cells=22, refresh_per_second=20, clock=lambda: now[0]) as on_event:
        on_event("round", ROUND)
        on_event("measure-start", START)
        now[0] = 1065.0
        deadline = time.monotonic() + 5.0
        while "1:05 / ~5:00" not in _plain(stream.getvalue()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "1:05 / ~5:00" in _plain(stream.getvalue())
        on_event("measure-done", DONE_MEAS)
        on_event("done", RESULT)
    out = _plain(stream.getvalue())
    # History lines printed once above the live panel.
    assert out.count("round 2: undecided") == 1
    assert "measured chat TP4@C96 in 65 s" in out
    assert "done: certified-feasible, 10800 GPU-seconds, 8 cells measured" in out


def test_a_running_fit_shows_its_transitions_under_deciding_until_the_round_ends() -> None:
    s = ProgressState(total_cells=22)
    update_state(s, "round", ROUND, 0.0)
    update_state(s, "measure-start", START, 1.0)
    update_state(s, "measure-done", DONE_MEAS, 301.0)
    assert update_state(s, "sampling", {"preset": "certify", "done": 1200, "total": 3200}, 302.0) is None
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=400.0))
    out = buf.getvalue()
    assert "deciding" in out and re.search(r"certifying .* 1,200 / 3,200 iterations", out)
    update_state(s, "sampling", {"preset": "fast", "done": 100, "total": 800}, 401.0)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=402.0))
    assert "fitting (fast)" in buf.getvalue() and "100 / 800 iterations" in buf.getvalue()
    update_state(s, "round", ROUND, 403.0)
    assert s.sampling is None
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=404.0))
    assert "iterations" not in buf.getvalue()
