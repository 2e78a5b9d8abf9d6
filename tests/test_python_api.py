"""examples/python_api.py runs as a script: a whole campaign, then the same decision
one round at a time, on the tiny campaign (without arguments it runs the shipped grid,
whose decision tests/test_campaign.py and tests/test_installed.py pin)."""

from __future__ import annotations

import dataclasses
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


# Two whole campaigns in a fresh process; test_round.py's
# test_step_and_record_are_the_one_at_a_time_campaign checks the same decision in process.
def test_a_class_without_replicas_reads_as_none() -> None:
    # result.json writes a class the fleet does not serve as tp/load null, replicas 0.
    result = fsb.CampaignResult("undecided", {"allocation": {
        "chat": {"tp": None, "load": None, "replicas": 0},
        "code": {"tp": 4, "load": "C64", "replicas": 3},
    }})  # fmt: skip
    assert result.allocation == {"chat": fsb.Placement(None, None, 0), "code": fsb.Placement(4, "C64", 3)}
    assert fsb.CampaignResult("certified-infeasible", {"allocation": None}).allocation is None


@pytest.mark.slow
@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/ is not shipped in the wheel")
def test_example_on_the_tiny_campaign(tmp_path: Path) -> None:
    campaign = write_tiny(tmp_path / "c")
    whole, by_hand = _run(str(campaign), str(tmp_path / "out"))
    status, gpu_s = whole.split()[:2]
    assert status == "certified-feasible"
    assert by_hand.split()[:2] == [status, gpu_s]  # the same decision, round by round


def test_objects_resolve_like_their_names(tmp_path: Path) -> None:
    """A strategy, prior card and preset given as objects are the same decision inputs as
    their names (same fingerprint, so a directory started with one resumes with the other)."""
    from fleetsieve_bayes.campaign.setup import resolve

    campaign = fsb.load_campaign(write_tiny(tmp_path / "c"))
    by_name = resolve(campaign, "fleetsieve", 3)
    by_object = resolve(
        campaign, fsb.strategies.Fleetsieve(), 3,
        prior=fsb.load_card(campaign.family), preset=fsb.load_preset(campaign.inference),
    )
    assert by_object.fingerprint == by_name.fingerprint
    assert by_object.strategy_name == "fleetsieve"
    edited = dataclasses.replace(by_name.card, knee_logit_sd=by_name.card.knee_logit_sd * 2)
    assert resolve(campaign, "fleetsieve", 3, prior=edited).fingerprint["prior_card"] != by_name.fingerprint["prior_card"]
    with pytest.raises(fsb.InputError, match="unknown strategy 'nope'"):
        resolve(campaign, "nope", 3)
