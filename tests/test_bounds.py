import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.decision.bounds import (
    BOUNDS_COLUMNS,
    Attainment,
    attainment_lines,
    bounds_frame,
    cell_to_repeat,
    conservative_table,
    credible_bounds,
    optimistic_table,
    repeat_advice,
    repeat_entry,
)
from fleetsieve_bayes.model.inference import Posterior


def _posterior(n_draws=2000, n_cells=3, seed=0):
    rng = np.random.default_rng(seed)
    latent = np.empty((n_draws, n_cells, 4))
    latent[..., 0] = np.exp(rng.normal(np.log(5.0), 0.2, (n_draws, n_cells)))
    latent[..., 1] = np.exp(rng.normal(np.log(1.0), 0.3, (n_draws, n_cells)))
    latent[..., 2] = np.exp(rng.normal(np.log(10.0), 0.3, (n_draws, n_cells)))
    latent[..., 3] = 1 / (1 + np.exp(-rng.normal(5.0, 1.0, (n_draws, n_cells))))
    noise = np.full((n_draws, 4), 0.05)
    return Posterior(latent=latent, noise=noise, params={}, idata=None)


def test_latent_quantiles_and_collapse():
    post = _posterior()
    obs = np.array([[4.0, 2.0, 20.0, 0.99], [0, 0, 0, 0], [0.0, np.inf, np.inf, 0.0]])
    mask = np.array([True, False, True])
    b = credible_bounds(post, obs, mask, 0.9, predictive=False, model_margin=0.0, success_margin=0.0)
    np.testing.assert_allclose(b.lo[1], np.quantile(post.latent[:, 1], 0.05, axis=0))
    np.testing.assert_allclose(b.hi[1], np.quantile(post.latent[:, 1], 0.95, axis=0))
    np.testing.assert_array_equal(b.lo[0], obs[0])
    np.testing.assert_array_equal(b.hi[2], obs[2])  # a failed cell keeps 0 / inf
    assert np.all(b.lo <= b.hi)


def _raw_and_wide(model_margin: float, success_margin: float):
    """Bounds without and with the margins; the measured cell 0 must not move."""
    post = _posterior()
    obs = np.array([[4.0, 2.0, 20.0, 0.99], [0, 0, 0, 0], [0, 0, 0, 0]])
    mask = np.array([True, False, False])
    raw = credible_bounds(post, obs, mask, 0.9, predictive=False, model_margin=0.0, success_margin=0.0)
    wide = credible_bounds(
        post, obs, mask, 0.9, predictive=False, model_margin=model_margin, success_margin=success_margin
    )
    np.testing.assert_array_equal(wide.lo[0], raw.lo[0])  # a measured cell is its measurement
    np.testing.assert_array_equal(wide.hi[0], raw.hi[0])
    return raw, wide


def test_model_margin_widens_only_the_tails_of_unmeasured_cells():
    raw, wide = _raw_and_wide(0.2, 0.0)
    f = np.exp(0.2)
    np.testing.assert_allclose(wide.lo[1:, 1:3], raw.lo[1:, 1:3] / f)
    np.testing.assert_allclose(wide.hi[1:, 1:3], raw.hi[1:, 1:3] * f)
    np.testing.assert_array_equal(wide.lo[1:, [0, 3]], raw.lo[1:, [0, 3]])  # throughput, success: as predicted
    np.testing.assert_array_equal(wide.hi[1:, [0, 3]], raw.hi[1:, [0, 3]])


def test_success_margin_widens_the_failure_probability_of_unmeasured_cells():
    raw, wide = _raw_and_wide(0.0, 0.7)
    f = np.exp(0.7)
    np.testing.assert_allclose(1.0 - wide.lo[1:, 3], np.minimum((1.0 - raw.lo[1:, 3]) * f, 1.0))
    np.testing.assert_allclose(1.0 - wide.hi[1:, 3], (1.0 - raw.hi[1:, 3]) / f)
    assert np.all(wide.hi[1:, 3] < 1.0) and np.all(wide.hi[1:, 3] > raw.hi[1:, 3])
    np.testing.assert_array_equal(wide.lo[1:, :3], raw.lo[1:, :3])  # throughput and tails: as predicted
    # an interval already reaching 1.0 (or 0.0) keeps its end
    from fleetsieve_bayes.decision.intervals import widen_by_margin

    lo, hi = widen_by_margin(np.array([[1.0, 1.0, 1.0, 0.0]]), np.array([[1.0, 1.0, 1.0, 1.0]]), 0.0, 0.7)
    assert lo[0, 3] == 0.0 and hi[0, 3] == 1.0


def test_repeatability_band_and_tables():
    post = _posterior()
    obs = np.array([[4.0, 2.0, 20.0, 0.99]] * 3)
    mask = np.array([True, False, False])
    b = credible_bounds(post, obs, mask, 0.9, repeatability=0.1)
    np.testing.assert_allclose(b.lo[0, :3], [3.6, 1.8, 18.0])
    np.testing.assert_allclose(b.hi[0, :3], [4.4, 2.2, 22.0])
    np.testing.assert_allclose([b.lo[0, 3], b.hi[0, 3]], [0.989, 0.991])
    cons, opt = conservative_table(b), optimistic_table(b)
    assert np.all(cons[:, 0] <= opt[:, 0]) and np.all(cons[:, 1:3] >= opt[:, 1:3])
    assert np.all(cons[:, 3] <= opt[:, 3])
    # predictive intervals (latent + noise) are wider than latent ones on average
    bl = credible_bounds(post, obs, mask, 0.9, predictive=False)
    assert np.mean(np.log(b.hi[1:, :3] / b.lo[1:, :3])) > np.mean(np.log(bl.hi[1:, :3] / bl.lo[1:, :3]))


def test_bounds_frame():
    grid = _grid3()
    b = credible_bounds(_posterior(), np.ones((3, 4)), np.array([True, False, False]), 0.8)
    df = bounds_frame(grid, b, np.array([True, False, False]))
    assert tuple(df.columns) == BOUNDS_COLUMNS
    assert list(df["workload"]) == ["chat", "chat", "code"] and df["measured"].tolist() == [True, False, False]
    assert isinstance(df, pd.DataFrame) and df["tp"].dtype == np.int64


def _grid3() -> CellGrid:
    return CellGrid(
        workloads=("chat", "code"),
        workload_idx=np.array([0, 0, 1]),
        tp=np.array([2, 4, 4]),
        load=("C16", "C32", "C32"),
        offered_rps=np.array([1.0, 2.0, 2.0]),
        duration_s=np.full(3, 300.0),
    )


def test_the_cell_to_repeat_says_which_limit_binds():
    grid, windows = _grid3(), np.array([3, 1, 2])
    # No backend limit: the cap binds.
    assert repeat_entry(grid, 1, windows, 3) == {
        "workload": "chat", "tp": 4, "load": "C32", "windows": 1, "limit": 3, "limited_by": "max_windows_per_cell"}
    # A replayed cell with two rows: fewer than the cap.
    limits = np.array([np.inf, np.inf, 2.0])
    assert repeat_entry(grid, 2, windows, 3, limits)["limit"] == 2
    assert repeat_entry(grid, 2, windows, 3, limits)["limited_by"] == "backend"
    # Rows equal to the cap: the cap is what the user can raise first... and no more rows: the backend.
    assert repeat_entry(grid, 0, windows, 3, np.full(3, 3.0))["limited_by"] == "max_windows_per_cell"
    assert repeat_entry(grid, 0, windows, 5, np.full(3, 3.0))["limited_by"] == "backend"


def test_repeat_advice_names_what_to_raise_at_the_limit():
    grid = _grid3()
    free = repeat_entry(grid, 1, np.array([3, 1, 2]), 3)
    assert repeat_advice(free) == "to settle the decision, measure chat TP4@C32 again (1 window so far)"
    capped = repeat_entry(grid, 0, np.array([3, 1, 2]), 3)
    assert repeat_advice(capped) == (
        "to settle the decision, chat TP2@C16 needs another window, and it has 3 windows, the most "
        "[stopping] max_windows_per_cell = 3 allows: raise it and start a new run with --reuse-measurements "
        "from this one")
    rows = repeat_entry(grid, 2, np.array([3, 1, 2]), 3, np.array([np.inf, np.inf, 2.0]))
    assert repeat_advice(rows) == ("to settle the decision, code TP4@C32 needs another window, and the backend "
                                   "has no more (2 windows, every replicate row the table holds of it)")
    # An entry written before ``limit`` existed reads as one that may be repeated.
    old = {"workload": "chat", "tp": 4, "load": "C32", "windows": 3}
    assert repeat_advice(old).startswith("to settle the decision, measure chat TP4@C32 again")
    joint = {"committed": [], "repeat": capped}
    assert attainment_lines(joint) == [repeat_advice(capped)]


def test_the_cell_to_repeat_is_one_with_a_window():
    # Cell 0: measured, straddles its level; cell 1: straddles it further below, never
    # measured (an optimistic hope); cell 2: measured, settled above its level.
    lo, hi = np.array([0.8, 0.2, 0.95]), np.array([0.99, 0.99, 0.99])
    att = Attainment(draws=np.zeros((1, 3)), lo=lo, median=(lo + hi) / 2, hi=hi, binding=np.zeros(3, int))
    levels = np.full(3, 0.9)
    free = np.array([True, False, True])
    assert cell_to_repeat([0, 1, 2], att, levels, free, np.array([1, 0, 1])) == 0
    # Cell 0 at its limit is still the one to name (result.json says what to raise) ...
    assert cell_to_repeat([0, 1, 2], att, levels, np.zeros(3, bool), np.array([3, 0, 1])) == 0
    # ... and with a window, the hope would have come first: the furthest below.
    assert cell_to_repeat([0, 1, 2], att, levels, np.ones(3, bool), np.array([1, 1, 1])) == 1
    # Nothing measured straddles: none.
    assert cell_to_repeat([1, 2], att, levels, free, np.array([1, 0, 1])) is None
