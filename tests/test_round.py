"""The round shared by both drivers (fleetsieve_bayes.round).

- The fleetsieve strategy's own regret fallback: after a certification attempt
  that closed the interval gap but not the joint check, it picks the cell of
  largest expected regret reduction on the attempt's converged draws.
- Both drivers hand that attempt to the strategy (the pool driver used to
  drop it, so its fleetsieve never fell back to regret).
- ``step`` + ``record`` is the one-at-a-time campaign: the same cells, in the
  same order, as ``run_campaign``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_strategies import make_state
from tiny_campaign import write_tiny

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.attempt import CertificationAttempt
from fleetsieve_bayes.decision.bounds import conservative_table, optimistic_table, rule_bounds
from fleetsieve_bayes.decision.certificate import CERTIFIED_FEASIBLE, UNDECIDED, certify
from fleetsieve_bayes.decision.regret_acquisition import regret_scores, select_by_regret
from fleetsieve_bayes.decision.strategies import Strategy, make_strategy
from fleetsieve_bayes.decision.strategies.base import cheapest
from fleetsieve_bayes.seeds import round_seed
from fleetsieve_bayes.settings import DecisionSettings


class _Attempt(CertificationAttempt):
    """An attempt whose joint check failed after the interval gap closed."""

    def to_json(self) -> dict[str, Any]:
        return {"p_epsilon_optimal": 0.5, "p_slo_met": 0.5, "p_infeasible": 0.0, "diagnostics": None}


def _failed_attempt(state: Any, posterior: Any) -> _Attempt:
    cert = state.certificate._replace(status=UNDECIDED, reason="joint check below 1 - risk")
    return _Attempt(cert, posterior, state.bounds, state.conservative, state.optimistic, None,
                    {"interval_status": CERTIFIED_FEASIBLE}, 0.0)


def test_fleetsieve_falls_back_to_regret_after_a_failed_attempt() -> None:
    state = make_state(rnd=3)
    strategy = make_strategy("fleetsieve", state.grid, state.problem, DecisionSettings(), seed=7)
    attempt = _failed_attempt(state, state.posterior)
    scores = regret_scores(
        state.grid, state.problem, state.conservative, attempt.posterior.latent, attempt.posterior.noise,
        state.observed, state.measured, seed=round_seed(7, 3) + 2,
    )
    expected = select_by_regret(scores, state.grid.cost_gpu_s)
    assert expected is not None and not state.measured[expected]
    assert strategy.select(state._replace(attempt=attempt)) == expected
    # Without an attempt (or one whose interval gap stayed open) the kernel decides.
    plain = strategy.select(state)
    not_closed = attempt._replace(diagnostics={"interval_status": UNDECIDED})
    assert strategy.select(state._replace(attempt=not_closed)) == plain


class _Recorder:
    """A strategy object: the cheapest unmeasured cell; records what each call saw."""

    name = "recorder"

    def __init__(self) -> None:
        self.saw: list[bool] = []

    def build(self, grid: Any, problem: Any, settings: DecisionSettings, seed: int) -> Strategy:
        def select(state: Any) -> int:
            self.saw.append(state.attempt is not None and state.attempt.gap_closed)
            return cheapest(np.flatnonzero(~state.measured), grid)

        return Strategy(self.name, select)


def _fake_attempt_certification(grid, problem, card, observed, measured, settings, *, seed, mass_from=None,
                                 server_failed=None, preset="certify", windows=None, window_limit=None):  # noqa: ANN001, ANN202
    bounds = rule_bounds(mass_from, observed, measured, settings.credible_level, settings.repeatability, grid,
                         settings.rules)
    cons = allocate_milp(grid, conservative_table(bounds), problem)
    opt = allocate_milp(grid, optimistic_table(bounds), problem)
    cert = certify(grid, problem, cons, opt, measured, observed, settings.epsilon)
    cert = cert._replace(status=UNDECIDED, reason="joint check below 1 - risk")
    return _Attempt(cert, mass_from, bounds, cons, opt, None, {"interval_status": CERTIFIED_FEASIBLE}, 0.0)


@pytest.mark.parametrize("pool", ["", "pool_gpus = 8"])
def test_both_drivers_hand_the_failed_attempt_to_the_strategy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    import fleetsieve_bayes.round as round_mod
    from fleetsieve_bayes.campaign.runner import run_campaign

    real_believe = round_mod.believe

    def interval_certifies(*args: Any, **kwargs: Any) -> Any:  # the round's real view: the gap closed
        view = real_believe(*args, **kwargs)
        return view._replace(certificate=view.certificate._replace(status=CERTIFIED_FEASIBLE))

    monkeypatch.setattr(round_mod, "believe", interval_certifies)
    monkeypatch.setattr(round_mod, "attempt_certification", _fake_attempt_certification)
    path = write_tiny(tmp_path / "c", measurement_extra=pool)
    path.write_text(path.read_text().replace("epsilon = 0.05", "epsilon = 0.05\nmax_rounds = 3"))
    recorder = _Recorder()
    result = run_campaign(load_campaign(path), tmp_path / "out", strategy=recorder)
    assert result.status == UNDECIDED  # the attempt never certifies: out of rounds
    assert recorder.saw and all(recorder.saw), "a pick did not see the round's certification attempt"


def test_step_and_record_are_the_one_at_a_time_campaign(tmp_path: Path) -> None:
    """Two rounds of the tiny campaign (the design, two fits, one acquisition or more) by the
    public init/step/measure loop decide as `fleetsieve-bayes run` on the same file, read back
    from the result.json the command wrote."""
    import fleetsieve_bayes as fsb
    from fleetsieve_bayes.cli import main as cli_main

    path = write_tiny(tmp_path / "c")
    path.write_text(path.read_text().replace("epsilon = 0.05", "epsilon = 0.05\nmax_rounds = 2"))
    assert cli_main(["run", str(path), "--out", str(tmp_path / "cli"), "--seed", "0", "--quiet"]) == 0
    reference = json.loads((tmp_path / "cli" / "result.json").read_text())

    campaign = fsb.load_campaign(path)
    state = fsb.init(campaign, seed=0)
    settings = fsb.DecisionSettings.from_campaign(campaign)
    rounds = 0
    while not state.done:
        state, out = fsb.step(state, settings)
        rounds += 1
        if out.chosen is not None:
            state = fsb.measure(state, out.chosen, repeat=out.repeat)
    assert rounds >= 2  # the loop really ran: the design's round, then a decision round
    cells = [{**r.cell.to_json(), "replicate": r.replicate} for r in state.records]
    assert len(cells) > 0 and cells == reference["measured"]  # the same cells, in the same order
    assert state.status == reference["status"]
    assert state.gpu_seconds == reference["gpu_seconds"]
    allocation = fsb.allocation_of(state)
    placed = None if allocation is None else {
        name: {"tp": a.tp, "load": a.load, "replicas": a.replicas} for name, a in allocation.items()
    }
    assert placed == reference["allocation"]
