"""examples/python_api.py runs as a script: a whole campaign, then the same decision
one round at a time (the tiny campaign by default; the shipped grid is slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_campaign import write_tiny

import fleetsieve_bayes as fsb

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "python_api.py"


def _run(*args: str) -> list[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(EXAMPLE), *args], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_public_names_are_importable() -> None:
    for name in fsb.__all__:
        assert getattr(fsb, name) is not None, name
    assert fsb.strategies.Fleetsieve().name == "fleetsieve"
    with pytest.raises(AttributeError):
        fsb.no_such_name  # noqa: B018


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/ is not shipped in the wheel")
def test_example_on_the_tiny_campaign(tmp_path: Path) -> None:
    campaign = write_tiny(tmp_path / "c")
    whole, by_hand = _run(str(campaign), str(tmp_path / "out"))
    status, gpu_s = whole.split()[:2]
    assert status == "certified-feasible"
    assert by_hand.split()[:2] == [status, gpu_s]  # the same decision, round by round


@pytest.mark.slow
@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/ is not shipped in the wheel")
def test_example_on_the_shipped_grid(tmp_path: Path) -> None:
    whole, by_hand = _run()
    assert whole == "certified-feasible 10800.0 GPU-s; chat on TP 4"
    assert by_hand == "certified-feasible 10800.0 GPU-s; {'chat': 2, 'code': 2}"
