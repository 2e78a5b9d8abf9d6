"""A hope no window can test does not stop the campaign (issue 29).

A small noisy fleet with a hand-built posterior (no fit). Class a needs 4 rps
on 2 GPUs (with B1 for class b, 3 in all): X (a TP1@L2, 2 rps, one window of
TTFT 0.8 s against 1 s) straddles 0.9 and is at its window limit; U (a
TP1@L3, 1.8 rps, unmeasured) may meet its level or miss it; Y (1 rps) is
safe. The optimistic allocation leans on X, which no window may test: the
round reads X at its lower bound for acquisition, turns to U, and stops only
when U is ruled out too.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_repeat_choice import PROBLEM, _Post  # the same two classes' demands and SLOs

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.bounds import Attainment, capped_hopes, settle
from fleetsieve_bayes.decision.certificate import UNDECIDED
from fleetsieve_bayes.decision.strategies import make_strategy
from fleetsieve_bayes.model.joint import window_rows
from fleetsieve_bayes.round import _attainment_state, answer_rule, assess, choose, new_state, record
from fleetsieve_bayes.settings import DecisionSettings

X, U, Y, B1, W = 0, 1, 2, 3, 4
N_DRAWS = 400
SETTINGS = DecisionSettings(slo_attainment=0.9, max_windows_per_cell=1)
GRID = CellGrid(
    workloads=("a", "b"),
    workload_idx=np.array([0, 0, 0, 1, 1]),
    tp=np.array([1, 1, 1, 1, 1]),
    load=("L2", "L3", "L1", "L1", "L2"),
    offered_rps=np.array([2.0, 1.8, 1.0, 2.0, 3.0]),
    duration_s=np.full(5, 300.0),
)
# throughput, TTFT p99, completion p99, success: each cell's curve (and measured window)
CURVE = np.array([
    [2.0, 0.80, 10.0, 0.995],
    [1.8, 0.80, 10.0, 0.995],
    [1.0, 0.30, 5.0, 0.999],
    [2.0, 1.00, 8.0, 0.999],
    [3.0, 9.00, 9.0, 0.995],
])


def _state(curve: np.ndarray, measured: list[int], grid: CellGrid = GRID, problem: AllocationProblem = PROBLEM,
           settings: DecisionSettings = SETTINGS):
    """The state after one window of each cell in ``measured`` (a cell listed again: a
    repeat, its window the same values) and a hand-built posterior around ``curve``."""
    strategy = make_strategy("fleetsieve", grid, problem, settings, seed=3, n_fantasies=16)
    state = new_state(grid, problem, None, None, strategy, seed=3)
    keys = ("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate")
    for i, c in enumerate(measured):
        row = {**dict(zip(keys, map(float, curve[c]), strict=True)), "duration_s": 300.0, "tp": int(grid.tp[c])}
        state = record(state, c, row, phase="design", repeat=c in measured[:i])
    n = grid.n_cells
    rng = np.random.default_rng(0)
    latent = curve[None] * np.exp(np.array([0.02, 0.08, 0.05, 0.0]) * rng.normal(size=(N_DRAWS, n, 4)))
    latent[..., 3] = curve[None, :, 3]
    post = _Post(
        latent,
        np.tile([0.02, 0.08, 0.08, 0.3], (N_DRAWS, 1)),
        np.tile([0.01, 0.1, 0.1, 0.3, 0.03, 1.5], (N_DRAWS, n, 1)),
        window_rows(curve[measured], np.array(measured), np.ones(n, bool)),
    )
    return state, post


def test_settling_reads_a_capped_hope_at_its_lower_bound() -> None:
    lo, hi = np.array([0.8, 0.5, 0.95]), np.array([0.99, 0.99, 0.99])
    att = Attainment(draws=np.zeros((2, 3)), lo=lo, median=lo, hi=hi, binding=np.zeros(3, int),
                     lo_draws=np.tile(lo, (2, 1)), hi_draws=np.tile(hi, (2, 1)))
    levels = np.full(3, 0.9)
    # 0 straddles and may not be repeated; 1 straddles and may; 2 is settled above its level.
    assert capped_hopes([0, 1, 2], att, levels, np.array([False, True, False]), np.array([1, 1, 1])) == [0]
    # a cell never measured is a hope a first window tests
    assert capped_hopes([0, 1, 2], att, levels, np.zeros(3, bool), np.array([0, 1, 1])) == [1]
    s = settle(att, [0])
    assert s.hi.tolist() == [0.8, 0.99, 0.99] and s.hi_draws[:, 0].tolist() == [0.8, 0.8]
    assert s.lo.tolist() == lo.tolist() and att.hi[0] == 0.99  # the input is left as it was
    assert settle(att, []) is att


def test_a_capped_hope_turns_acquisition_to_the_next_one() -> None:
    state, post = _state(CURVE, [X, Y, B1])
    a = assess(state, SETTINGS, post, attempt_seed=1)
    # The real view leans on X (at its one window) and says so ...
    assert X in a.view.optimistic.committed() and a.view.certificate.status == UNDECIDED
    assert a.view.conservative.committed() == [Y, B1]
    rep = a.attainment_json["repeat"]
    assert (rep["workload"], rep["load"], rep["windows"], rep["limit"]) == ("a", "L2", 1, 1)
    # ... while acquisition reads X settled: the next hope is U, and the campaign goes on.
    assert a.settled == (X,)
    assert U in a.acting_view.optimistic.committed() and X not in a.acting_view.optimistic.committed()
    assert a.decision.acquire
    assert choose(state, SETTINGS, a.acting_view, post, round_no=1) == U


def test_the_campaign_stops_when_only_untestable_hopes_are_left() -> None:
    curve = CURVE.copy()
    curve[U, 1] = 2.0  # U's window misses its TTFT limit: no hope is left but X
    state, post = _state(curve, [X, U, Y, B1])
    a = assess(state, SETTINGS, post, attempt_seed=1)
    assert a.settled == (X,) and X in a.view.optimistic.committed()
    # W is unmeasured but no allocation wants it: the round stops undecided, naming X.
    assert not a.decision.acquire and a.decision.status == UNDECIDED
    assert a.attainment_json["repeat"]["load"] == "L2"
    # Its answer is its best estimate: at level 0.9, X more likely meets its level than not.
    att = a.view.attainment
    assert att.lo[X] < 0.9 <= att.median[X] and att.median[U] < 0.9
    assert answer_rule(a.decision.status, SETTINGS) == "credible"
    assert a.final is not None and a.final.committed() == [X, B1]
    # Asked for more confidence than X's lower bound holds, it answers without X.
    p_x = float(np.mean(np.asarray(att.draws)[:, X] >= 0.9))
    assert 0.5 <= p_x < 0.95
    sure = SETTINGS._replace(uncertified_answer=0.95)
    s = assess(state, sure, post, attempt_seed=1)
    assert answer_rule(s.decision.status, sure) == "credible"
    assert s.final is not None and s.final.committed() == [Y, B1]
    assert [c["load"] for c in a.attainment_json["committed"]] == ["L2", "L1"]  # what result.json reports
    # ... or, asked for, the conservative fleet.
    conservative = SETTINGS._replace(uncertified_answer="conservative")
    b = assess(state, conservative, post, attempt_seed=1)
    assert answer_rule(b.decision.status, conservative) == "conservative"
    assert b.final is not None and b.final.committed() == [Y, B1] == b.view.conservative.committed()



def test_the_probable_answer_is_the_weighed_answer_most_likely_epsilon_optimal() -> None:
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.decision.bounds import best_estimate_table, slo_levels
    from fleetsieve_bayes.decision.joint_check import joint_check
    from fleetsieve_bayes.settings import PROBABLE_CONFIDENCES

    curve = CURVE.copy()
    curve[U, 1] = 2.0  # the stop of the test above: X (P(attainment ≥ 0.9) in [0.5, 0.95)) is all that is left
    probable = SETTINGS._replace(uncertified_answer="probable")
    state, post = _state(curve, [X, U, Y, B1])
    a = assess(state, probable, post, attempt_seed=1)
    assert not a.decision.acquire and answer_rule(a.decision.status, probable) == "probable"
    choice = a.attainment_json["answer_choice"]
    assert list(choice["chances"]) == ["conservative", *map(str, PROBABLE_CONFIDENCES)]
    # Each chance is the joint check's P(ε-optimal) of that answer on the same draws.
    levels = slo_levels(GRID, 0.9)
    view = a.view
    cands = [view.conservative] + [allocate_milp(GRID, best_estimate_table(
        GRID, PROBLEM, view.bounds, view.attainment, state.measured, levels, c), PROBLEM) for c in PROBABLE_CONFIDENCES]
    direct = [joint_check(GRID, PROBLEM, c, post.latent, post.noise, state.observed, state.measured, SETTINGS.epsilon,
                          seed=1, attainment=view.attainment.draws, levels=levels).p_epsilon_optimal for c in cands]
    np.testing.assert_allclose(list(choice["chances"].values()), direct, atol=5e-5)
    # The answer is the first (most cautious) of the most probable ones.
    best = int(np.argmax(direct))
    assert choice["candidate"] == ["conservative", *PROBABLE_CONFIDENCES][best]
    assert choice["p_epsilon_optimal"] == pytest.approx(max(direct), abs=5e-5)
    assert a.final is not None and a.final.committed() == cands[best].committed()
    # Here the fleet with X is the likelier: without X class a is short of its optimum
    # in every draw where X meets its level.
    assert a.final.committed() == [X, B1] and direct[0] < max(direct)

# A stop with a repeatable hope beside the capped one. Class a: X (4 rps on one GPU,
# TTFT 0.8 s against 1 s) straddles 0.9 with both its windows held; Y serves 1 rps.
# Class b needs 5 rps: B1 serves 2 on one GPU; R (TP2, 5 rps, one window of TTFT 4 s
# against 5 s) straddles and may be measured again. The optimistic fleet X + R leans
# on both, but R is worth its two GPUs only beside X: read X at its lower bound and the
# best fleet is 2 × Y + B1 with or without R, so no window of R can close the gap.
# W (b, unmeasured) misses its TTFT limit: no allocation wants it.
XC, YC, B1C, RC, WC = 0, 1, 2, 3, 4
CAPPED = DecisionSettings(slo_attainment=0.9, max_windows_per_cell=2)
GRID_R = CellGrid(
    workloads=("a", "b"),
    workload_idx=np.array([0, 0, 1, 1, 1]),
    tp=np.array([1, 1, 1, 2, 1]),
    load=("L2", "L1", "L1", "L3", "L2"),
    offered_rps=np.array([4.0, 1.0, 2.0, 5.0, 3.0]),
    duration_s=np.full(5, 300.0),
)
CURVE_R = np.array([
    [4.0, 0.80, 10.0, 0.995],
    [1.0, 0.30, 5.0, 0.999],
    [2.0, 1.00, 8.0, 0.999],
    [5.0, 4.00, 9.0, 0.995],
    [3.0, 9.00, 9.0, 0.995],
])


def test_a_stop_names_the_capped_hope_not_a_repeat_that_cannot_settle_it() -> None:
    problem = PROBLEM._replace(demand=np.array([4.0, 5.0]))
    state, post = _state(CURVE_R, [XC, YC, B1C, RC, XC], GRID_R, problem, CAPPED)
    a = assess(state, CAPPED, post, attempt_seed=1)
    att = a.view.attainment
    for c in (XC, RC):  # both hopes straddle their level; only R may be measured again
        assert att.lo[c] < 0.9 <= att.hi[c]
    assert state.windows.tolist() == [2, 1, 1, 1, 0]
    assert a.view.optimistic.committed() == [XC, RC] and a.view.conservative.committed() == [YC, B1C]
    assert a.settled == (XC,) and a.acting_view.optimistic.committed() == [YC, B1C]
    assert not a.decision.acquire and a.decision.status == UNDECIDED
    rep = a.attainment_json["repeat"]
    assert (rep["workload"], rep["load"], rep["windows"], rep["limit"]) == ("a", "L2", 2, 2)
    # While the campaign goes on, the cell to repeat is one it may still measure.
    going = _attainment_state(state, CAPPED, a.view)
    assert (going["repeat"]["workload"], going["repeat"]["windows"]) == ("b", 1)


def test_answer_confidence_by_level_and_setting() -> None:
    from fleetsieve_bayes.decision.bounds import answer_confidence

    levels = np.array([0.3, 0.5, 0.65, 0.8, 0.95])
    np.testing.assert_allclose(answer_confidence("credible", levels), [0.8, 0.8, 0.65, 0.5, 0.5])
    np.testing.assert_allclose(answer_confidence("best-estimate", levels), 0.5)
    np.testing.assert_allclose(answer_confidence(0.7, levels), 0.7)
    assert answer_confidence("conservative", levels) is None


def test_a_measured_cell_is_admitted_where_its_attainment_reaches_its_level_with_the_confidence() -> None:
    from fleetsieve_bayes.decision.bounds import Bounds, best_estimate_table

    grid = CellGrid(workloads=("a",), workload_idx=np.zeros(3, np.int64), tp=np.ones(3, np.int64),
                    load=("L1", "L2", "L3"), offered_rps=np.array([1.0, 2.0, 3.0]), duration_s=np.full(3, 300.0))
    problem = AllocationProblem(demand=np.array([1.0]), critical=np.array([False]), floor=np.array([0.0]),
                                success_min=np.array([0.9]), ttft_max=np.array([1.0]),
                                completion_max=np.array([np.inf]), gpus=4)
    vals = np.array([[1.0, 0.5, 5.0, 0.999]] * 3)  # every cell within its SLOs, by value
    bounds = Bounds(vals, vals)
    # P(attainment ≥ 0.5) by cell: 0.9, 0.7, 0.4 (1000 draws each).
    n = 1000
    draws = np.stack([np.r_[np.full(int(n * p), 0.6), np.full(n - int(n * p), 0.3)] for p in (0.9, 0.7, 0.4)], axis=1)
    att = Attainment(draws, np.quantile(draws, 0.05, axis=0), np.median(draws, axis=0),
                     np.quantile(draws, 0.95, axis=0), np.zeros(3, np.int64))
    levels = np.full(3, 0.5)

    def admitted(conf: float, measured: tuple[bool, ...] = (True, True, True)) -> list[bool]:
        t = best_estimate_table(grid, problem, bounds, att, np.array(measured), levels, conf)
        return [bool(t[c, 0] > 0) for c in range(3)]  # an inadmissible cell serves nothing

    assert admitted(0.5) == [True, True, False]
    assert admitted(0.8) == [True, False, False]
    assert admitted(0.95) == [False, False, False]
    # A cell never measured: only by its lower bound, whatever the confidence.
    assert admitted(0.5, (True, False, True)) == [True, False, False]


def test_result_json_reports_the_probable_answers_choice() -> None:
    import dataclasses

    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.campaign.outputs import _attainment_json
    from fleetsieve_bayes.resources import data_dir

    camp = dataclasses.replace(load_campaign(data_dir("examples") / "h100_31b_fp8" / "campaign.toml"),
                               uncertified_answer="probable")
    chances = {"conservative": 0.2, "0.95": 0.2, "0.9": 0.61, "0.8": 0.61, "0.7": 0.4, "0.6": 0.4, "0.5": 0.3}
    joint = {"committed": [], "repeat": None,
             "answer_choice": {"candidate": 0.9, "p_epsilon_optimal": 0.61, "chances": chances}}
    out = _attainment_json(camp, joint, "undecided")
    assert out["answer_choice"]["candidate"] == 0.9 and out["answer_confidence"] == {"chat": 0.9, "code": 0.9}
    cons = {**joint, "answer_choice": {**joint["answer_choice"], "candidate": "conservative"}}
    out = _attainment_json(camp, cons, "undecided")
    assert out["answer_choice"]["candidate"] == "conservative" and "answer_confidence" not in out
    # a certificate answers conservatively, whatever the setting
    assert "answer_choice" not in _attainment_json(camp, joint, "certified-feasible")
