"""A Ctrl-C that a finaliser swallows still stops the campaign (fleetsieve_bayes/interrupts.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tiny_campaign import write_tiny

from fleetsieve_bayes import interrupts
from fleetsieve_bayes.campaign import load_campaign, run_campaign
from fleetsieve_bayes.campaign.journal import read_journal


class _SignalledInFinaliser:
    """Sends SIGINT to this process from ``__del__``: the handler runs inside the finaliser."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the interpreter runs the pending handler at a loop's back edge
            pass


def test_an_interrupt_swallowed_by_a_finaliser_is_raised_by_the_next_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert threading.current_thread() is threading.main_thread()  # signal handlers live there
    before = signal.getsignal(signal.SIGINT)
    swallowed: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", swallowed.append)
    with interrupts.recording():
        interrupts.check()  # nothing recorded yet
        obj = _SignalledInFinaliser()
        del obj  # Python reports the KeyboardInterrupt as unraisable and goes on
        assert [type(u.exc_value) for u in swallowed] == [KeyboardInterrupt]
        assert interrupts.requested()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()  # it stays recorded until cleared
    assert signal.getsignal(signal.SIGINT) is before
    interrupts.clear()
    interrupts.check()


def test_recording_starts_from_a_clear_request() -> None:
    interrupts.request()
    with interrupts.recording():
        assert not interrupts.requested()
    interrupts.clear()


@pytest.mark.parametrize("measurement", ["", "pool_gpus = 8"], ids=["sequential", "pool"])
def test_both_drivers_stop_at_their_next_turn_on_a_recorded_interrupt(tmp_path: Path, measurement: str) -> None:
    out = tmp_path / "run"
    seen: list[str] = []

    def on_event(kind: str, info: Any) -> None:
        seen.append(kind)
        if kind == "measure-done":
            interrupts.request()  # as if the signal's KeyboardInterrupt had been swallowed

    try:
        with pytest.raises(KeyboardInterrupt):
            run_campaign(load_campaign(write_tiny(tmp_path / "c", measurement_extra=measurement)), out, on_event=on_event)
    finally:
        interrupts.clear()
    # The measurement that finished is kept; nothing after it started.
    records, good = read_journal(out / "journal.jsonl")
    assert good == (out / "journal.jsonl").stat().st_size
    assert seen.count("measure-done") == sum(r["type"] == "measurement" for r in records) >= 1
    assert "round" not in seen and not (out / "result.json").exists()


@pytest.mark.parametrize("measurement", ["", "pool_gpus = 8"], ids=["sequential", "pool"])
def test_both_drivers_report_how_far_each_fit_has_got(tmp_path: Path, measurement: str) -> None:
    events: list[tuple[str, Any]] = []
    run_campaign(load_campaign(write_tiny(tmp_path / "c", measurement_extra=measurement)), tmp_path / "run",
                 on_event=lambda kind, info: events.append((kind, info)))
    sampling = [info for kind, info in events if kind == "sampling"]
    assert sampling, [k for k, _ in events]
    first_round = next(i for i, (kind, _) in enumerate(events) if kind == "round")
    assert any(kind == "sampling" for kind, _ in events[:first_round])  # the first fit, before its round
    assert all(0 <= s["done"] <= s["total"] for s in sampling)
    starts = [i for i, s in enumerate(sampling) if s["done"] == 0]
    # every fit runs to its end: the report before the next fit's start has done == total
    for i in starts[1:]:
        assert sampling[i - 1]["done"] == sampling[i - 1]["total"] > 0
