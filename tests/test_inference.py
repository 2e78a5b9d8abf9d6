"""Inference: NUTS and SVI posteriors, warm refits, simulation-based calibration, the knee.

One compile serves every NUTS test here: the shipped grid's shape (22 cells,
2 classes), the prior card and the ``fast`` preset (module-scoped fixtures).
Long studies are marked slow; the full ones are in benchmarks/calibration_study.py.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
from fleetsieve_bayes.decision.bounds import credible_bounds
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.model.diagnostics import summarize
from fleetsieve_bayes.model.inference import Posterior, fit, load_preset, prior_predictive
from fleetsieve_bayes.model.joint import ROW_BUCKET, latent_metrics, model_data
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

GRID_CSV = data_dir("examples") / "h100_31b_fp8" / "grid.csv"
CARD = "dense-31b-fp8-h100"
GROUPS = {"posterior", "posterior_predictive", "observed_data", "sample_stats"}


@pytest.fixture(scope="module")
def shipped():
    df = read_table(GRID_CSV)
    grid = grid_from_table(df, ("chat", "code"))
    return grid, values_from_table(grid, df)


@pytest.fixture(scope="module")
def design_fit(shipped):
    grid, obs = shipped
    m = np.zeros(grid.n_cells, bool)
    m[initial_design(grid)] = True
    return m, fit(grid, obs, m, CARD, "fast", seed=0)


def _check_posterior(post: Posterior, n_draws: int, n_cells: int) -> None:
    assert isinstance(post, Posterior)
    assert post.latent.shape == (n_draws, n_cells, 4) and post.noise.shape == (n_draws, 4)
    assert set(post.idata.groups()) >= GROUPS
    assert post.idata.posterior_predictive["y"].shape[-2:] == (n_cells, 4)
    assert "diverging" in post.idata.sample_stats
    assert np.all(np.isfinite(post.latent)) and np.all(post.noise > 0)


def test_nuts_posterior_type_and_warm_refit(shipped, design_fit):
    grid, obs = shipped
    m, post = design_fit
    n = load_preset("fast").n_draws
    _check_posterior(post, n, grid.n_cells)
    assert post.idata.posterior.attrs["inference_method"] == "nuts"
    # measured cells are observed data; the others are NaN
    od = post.idata.observed_data["y"].values
    assert np.all(np.isfinite(od[m])) and np.all(np.isnan(od[~m]))
    m2 = m.copy()
    m2[np.flatnonzero(~m)[0]] = True
    warm = fit(grid, obs, m2, CARD, "fast", seed=1, warm_start=post)
    _check_posterior(warm, n, grid.n_cells)
    assert warm.state["key"] == post.state["key"]  # same compiled program, warmup skipped
    assert int(warm.idata.sample_stats["diverging"].sum()) <= 0.02 * n


def test_data_override_the_knee(shipped, design_fit):
    """A fleet whose per-GPU capacity rises monotonically with TP (truth: knee past
    TP8) gets its per-GPU capacity peak at the TP8 edge once every cell is measured,
    although the card puts the knee at TP4."""
    grid, _ = shipped
    data = model_data(grid, np.ones((grid.n_cells, 4)), np.ones(grid.n_cells, bool))
    params = {
        "knee": np.array([3.6, 3.6]),
        "curvature": np.array([0.35, 0.35]),
        "cap_level": np.log(np.array([1.1, 1.3])),
        "sharpness": 12.0,
        "exponent": 2.0,
        "tail_base": np.log(np.array([[0.5, 8.0], [0.8, 4.0]])),
        "tail_slope": np.array([-0.5, -0.35]),
        "tail_blowup": np.array([[0.7, 0.9], [0.7, 0.9]]),
        "succ_base": np.array([6.5, 6.5]),
        "succ_drop": np.array([2.5, 2.5]),
    }
    truth, cap = latent_metrics({k: jax.numpy.asarray(v) for k, v in params.items()}, data)
    per_gpu = np.asarray(cap) / grid.tp
    for w in range(2):  # the truth really is monotone over the grid
        sel = grid.workload_idx == w
        tps = np.unique(grid.tp[sel])
        k = [per_gpu[sel & (grid.tp == t)][0] for t in tps]
        assert np.all(np.diff(k) > 0)
    post = fit(grid, np.asarray(truth), np.ones(grid.n_cells, bool), CARD, "fast", seed=3, warm_start=design_fit[1])
    cap_draws = np.asarray(post.idata.posterior["capacity"]).reshape(-1, grid.n_cells) / grid.tp
    for w in range(2):
        c4 = np.flatnonzero((grid.workload_idx == w) & (grid.tp == 4))[0]
        c8 = np.flatnonzero((grid.workload_idx == w) & (grid.tp == 8))[0]
        assert np.mean(cap_draws[:, c8] > cap_draws[:, c4]) > 0.9


def test_tails_rising_below_saturation_do_not_pin_capacity(shipped):
    """A regression from the random-order benchmark: code's TTFT rises from 0.9 s
    to 1.6 s between TP4@C32 and TP4@C64, far below saturation (capacity > 13
    req/s). Read as utilisation alone, that rise put code TP4's capacity near
    9 req/s and the optimistic TTFT of TP4@C96 above its 5 s SLO (measured:
    4.1 s, success 0.996) — so a campaign could certify TP4@C64 without ever
    measuring the better C96. With the tails' load elasticity the optimistic
    table keeps TP4@C96 SLO-feasible on the same measurements."""
    grid, obs = shipped
    names = [grid.describe(c) for c in range(grid.n_cells)]
    measured = ["chat TP2@C32", "chat TP4@C64", "chat TP8@C64", "code TP2@C16", "code TP4@C64",
                "code TP8@C96", "code TP8@C128", "chat TP4@C96", "chat TP4@C32"]
    m = np.array([n in measured for n in names])
    c = names.index("code TP4@C96")
    # The default preset's 2,000 draws: from the fast preset's 500, this 5 %
    # quantile moves between 2.3 and 5.4 s with the seed alone.
    post = fit(grid, obs, m, CARD, "default", seed=0)
    b = credible_bounds(post, obs, m, 0.9)
    assert b.lo[c, 1] <= 5.0, b.lo[c]  # optimistic TTFT within the code SLO
    assert b.hi[c, 3] >= 0.99, b.hi[c]  # optimistic success within it
    assert b.hi[c, 0] >= 0.95 * obs[c, 0], b.hi[c]  # capacity not pinned below the offered load


def _simulate(grid, n, seed):
    pred = prior_predictive(grid, CARD, n, seed=seed)
    return pred["y"], pred["knee"]


def _sbc(grid, fleets, seed):
    """Cold fits: a warm start carries one fleet's sampler state (no warm-up,
    last positions) into another fleet's data, which is not a posterior of it."""
    ys, knees = _simulate(grid, fleets, seed)
    rng = np.random.default_rng(seed)
    hits, zs = [], []
    for f in range(fleets):
        m = np.zeros(grid.n_cells, bool)
        m[initial_design(grid)] = True
        m[rng.choice(np.flatnonzero(~m), size=4, replace=False)] = True
        post = fit(grid, ys[f], m, CARD, "fast", seed=100 + f)
        b = credible_bounds(post, ys[f], m, 0.9)
        hits.append((b.lo[~m] <= ys[f][~m]) & (ys[f][~m] <= b.hi[~m]))
        k = np.asarray(post.idata.posterior["knee"]).reshape(-1, grid.n_classes)
        zs.extend((knees[f] - k.mean(0)) / k.std(0))
    return float(np.mean(hits)), np.asarray(zs)


def test_simulated_fleets_are_recovered(shipped, design_fit):
    """Fleets drawn from the model's own prior: held-out cells' 90 % intervals
    cover the simulated truth at about the nominal rate, and the true knee is
    within the posterior's spread (z-scores)."""
    grid, _ = shipped
    cov, z = _sbc(grid, fleets=8, seed=11)
    assert 0.8 <= cov <= 0.98, cov
    # Knee recovery: the true knee sits within the posterior's spread (over 40
    # fleets in benchmarks/calibration_study.py: z mean -0.05, sd 1.02).
    assert np.median(np.abs(z)) < 1.5, z


@pytest.mark.slow
def test_simulated_fleets_calibration_many(shipped, design_fit):
    grid, _ = shipped
    cov, z = _sbc(grid, fleets=40, seed=5)
    assert 0.85 <= cov <= 0.95, cov
    assert abs(np.mean(z)) < 0.5 and 0.6 < np.std(z) < 1.5


@pytest.mark.slow  # the SVI compile alone is ~25 s on 2 cores
def test_svi_returns_the_same_posterior_type(shipped):
    grid, obs = shipped
    preset = load_preset("svi")._replace(steps=600, warm_steps=300, draws=200)
    m = np.ones(grid.n_cells, bool)
    post = fit(grid, obs, m, CARD, preset, seed=0)
    _check_posterior(post, 200, grid.n_cells)
    assert post.idata.posterior.attrs["inference_method"] == "svi"
    assert math.isfinite(post.idata.sample_stats.attrs["final_elbo_loss"])
    warm = fit(grid, obs, m, CARD, preset, seed=1, warm_start=post)
    _check_posterior(warm, 200, grid.n_cells)


@pytest.mark.slow
def test_default_preset_converges_on_shipped_grid(shipped):
    grid, obs = shipped
    post = fit(grid, obs, np.ones(grid.n_cells, bool), CARD, "default", seed=0)
    d = summarize(post.idata)
    assert d["divergences"] == 0
    assert d["r_hat_max"] <= 1.01, d["r_hat_max"]


@pytest.mark.slow
def test_svi_agrees_with_nuts(shipped):
    grid, obs = shipped
    m = np.zeros(grid.n_cells, bool)
    m[initial_design(grid)] = True
    nuts = credible_bounds(fit(grid, obs, m, CARD, "default", seed=0), obs, m, 0.9)
    svi = credible_bounds(fit(grid, obs, m, CARD, "svi", seed=0), obs, m, 0.9)
    mid = lambda b: np.log(np.sqrt(b.lo[~m, :3] * b.hi[~m, :3]))  # noqa: E731
    width = np.log(nuts.hi[~m, :3] / nuts.lo[~m, :3])
    # centres within half a NUTS interval width, widths within a factor 2.5
    assert np.mean(np.abs(mid(nuts) - mid(svi)) < 0.5 * width) > 0.8
    ratio = np.log(svi.hi[~m, :3] / svi.lo[~m, :3]) / width
    assert 0.4 < np.median(ratio) < 2.5


def test_prior_predictive_is_public_and_in_natural_units(shipped):
    grid, _ = shipped
    pred = prior_predictive(grid, CARD, 3, seed=1)
    assert pred["y"].shape == pred["latent"].shape == (3, grid.n_cells, 4)
    assert pred["knee"].shape[0] == 3
    y = pred["y"]
    assert np.all(y[..., :3] > 0) and np.all((y[..., 3] > 0) & (y[..., 3] < 1))
    again = prior_predictive(grid, CARD, 3, seed=1)
    np.testing.assert_array_equal(again["y"], y)  # seeded


def test_parallel_chains_draw_exactly_what_sequential_chains_draw(shipped, design_fit):
    # Threads change when a chain runs, never what it draws (each chain has its own key).
    grid, obs = shipped
    m, post = design_fit  # the "fast" preset runs its chains in threads
    seq = load_preset("fast")._replace(chain_method="sequential")
    again = fit(grid, obs, m, CARD, seq, seed=0)
    np.testing.assert_array_equal(again.latent, post.latent)


def test_restarted_chain_starts_at_its_donors_draw_and_keeps_its_adaptation(shipped, design_fit):
    from fleetsieve_bayes.model.inference import restart_chains

    grid, obs = shipped
    m, post = design_fit
    data = model_data(grid, obs, m)
    warm = restart_chains(post, {0: 1}, data, seed=3)
    s0, s1 = warm.state["states"]
    assert float(s0.adapt_state.step_size) == float(s1.adapt_state.step_size)
    # Chain 0 now sits at one of chain 1's draws (second half of its sampling phase).
    per_chain = post.latent.shape[0] // 2
    z_class = np.asarray(s0.z["class_z"])
    hits = [i for i in range(per_chain, 2 * per_chain) if np.allclose(post.params["class_z"][i], z_class)]
    assert hits and min(hits) >= per_chain + per_chain // 2
    refit = fit(grid, obs, m, CARD, "fast", seed=1, warm_start=warm)
    assert refit.latent.shape == post.latent.shape and np.all(np.isfinite(refit.latent))


def test_a_warm_start_of_another_model_version_starts_cold(shipped, design_fit):
    """Draws saved before a class-level parameter was added (``class_z`` one
    column short) cannot seed this model: the fit starts cold instead of failing,
    and gives what a cold fit gives."""
    grid, obs = shipped
    m, post = design_fit
    old = {k: (v[..., :-1] if k == "class_z" else v) for k, v in post.params.items()}
    stale = Posterior(latent=None, noise=None, params=old, idata=None, state=None)
    warm = fit(grid, obs, m, CARD, "fast", seed=0, warm_start=stale)
    np.testing.assert_array_equal(warm.latent, post.latent)


def test_a_sampler_state_saved_in_other_coordinates_seeds_no_chain(shipped, design_fit, monkeypatch):
    """A state whose sites meant something else at the same shapes (another
    ``joint.COORDINATES``) is not continued: the chains warm up afresh."""
    import fleetsieve_bayes.model.inference as inference

    grid, obs = shipped
    m, _ = design_fit
    preset = load_preset("fast")._replace(warmup=40, samples=20)
    first = fit(grid, obs, m, CARD, preset, seed=0)
    same = fit(grid, obs, m, CARD, preset, seed=1, warm_start=first)
    assert [int(s.i) for s in same.state["states"]] == [int(s.i) + 20 for s in first.state["states"]]
    monkeypatch.setattr(inference, "COORDINATES", inference.COORDINATES + 1)
    other = fit(grid, obs, m, CARD, preset, seed=1, warm_start=first)
    assert [int(s.i) for s in other.state["states"]] == [60] * preset.chains
    assert other.state["sampler"] != first.state["sampler"]


def test_pooled_warmup_shares_one_mass_matrix_the_regularised_pooled_covariance(shipped, design_fit):
    """The pooled warm-up runs through a compiled chunk of its own kernel; every
    chain ends on one shared, fixed mass matrix, and ``mass_from_draws`` is Stan's
    regularised covariance."""
    from fleetsieve_bayes.model.inference import mass_from_draws

    grid, obs = shipped
    m, cheap = design_fit
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled")
    post = fit(grid, obs, m, CARD, preset, seed=1, mass_from=cheap)
    assert post.latent.shape[0] == 2 * 20
    mass = [np.asarray(s.adapt_state.inverse_mass_matrix) for s in post.state["states"]]
    np.testing.assert_allclose(mass[0], mass[1])  # one mass for every chain
    flat = np.random.default_rng(0).normal(size=(50, 3))
    np.testing.assert_allclose(
        mass_from_draws(flat), 50 / 55 * np.cov(flat, rowvar=False) + 1e-3 * 5 / 55 * np.eye(3)
    )


def test_pooled_warmup_leaves_a_minor_mode_chain_out_of_the_pool(shipped, design_fit, monkeypatch):
    """A chain that the first half finds in a minor mode does not feed the
    shared mass matrix: only the other chains' second-quarter draws are pooled."""
    import fleetsieve_bayes.model.inference as inference

    grid, obs = shipped
    m, cheap = design_fit
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled")
    pooled_rows: list[int] = []
    real = inference.mass_from_draws

    def recording(flat: np.ndarray, free: np.ndarray | None = None) -> np.ndarray:
        pooled_rows.append(int(np.asarray(flat).shape[0]))
        return real(flat, free)

    monkeypatch.setattr(inference, "mass_from_draws", recording)
    monkeypatch.setattr(inference, "minor_mode_chains", lambda lp: {})
    fit(grid, obs, m, CARD, preset, seed=1)
    monkeypatch.setattr(inference, "minor_mode_chains", lambda lp: {1: 0})
    post = fit(grid, obs, m, CARD, preset, seed=1)
    # warm-up 40: the first half records its last 10 draws per chain
    assert pooled_rows == [2 * 10, 10]
    assert np.isfinite(post.latent).all()


def test_certifying_fit_falls_back_to_windowed_warmup_when_pooled_does_not_converge(shipped, design_fit):
    """A pooled warm-up that cannot meet the criteria within its rounds is
    redone with NumPyro's per-chain windows before the fit gives up."""
    from fleetsieve_bayes.model.converged_fit import Convergence, fit_certifying

    grid, obs = shipped
    m, cheap = design_fit
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled")
    out = fit_certifying(
        grid, obs, m, CARD, preset, seed=2, criteria=Convergence(ess_bulk_min=1e9), max_rounds=0, mass_from=cheap
    )
    d = out.diagnostics
    assert not out.converged
    assert d["windowed_fallback"] and d["adaptation"] == "windowed"
    assert d["attempts"] == 2 and d["draws"] == 20
    windowed = fit_certifying(
        grid, obs, m, CARD, preset._replace(adaptation="windowed"), seed=2,
        criteria=Convergence(ess_bulk_min=1e9), max_rounds=0,
    )
    assert windowed.diagnostics["attempts"] == 1 and not windowed.diagnostics["windowed_fallback"]


def test_a_certifying_fit_goes_on_at_smaller_steps_after_divergences_and_stops_at_the_smallest(
    shipped, design_fit, monkeypatch
):
    """After a run with divergences the chains go on from where they stopped at
    STEP_SHRINK of their step size (same compiled sampler, no warm-up); a run that
    diverges SMALLER_STEPS_MAX shrinks down ends the stretch (pooled, then the
    windowed fallback once, whose first warm-up starts from the cheap mass again)."""
    from fleetsieve_bayes.model import converged_fit
    from fleetsieve_bayes.model.converged_fit import (
        SMALLER_STEPS_MAX,
        STEP_SHRINK,
        Convergence,
        fit_certifying,
    )

    grid, obs = shipped
    m, cheap = design_fit
    runs: list[tuple[str, float, object, object, object]] = []
    real = converged_fit._inference.fit

    def spy(*args, **kw):
        post = real(*args, **kw)
        runs.append((args[4].adaptation, kw.get("step_scale", 1.0), kw.get("mass_from"), kw.get("warm_start"), post))
        return post

    monkeypatch.setattr(converged_fit._inference, "fit", spy)
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled", target_accept=0.96)
    # divergences_max = -1: every run counts as divergent. At seed 3 no chain falls into a minor
    # mode within the stretch (a restart would add a run at the same step size).
    out = fit_certifying(grid, obs, m, CARD, preset, seed=3, criteria=Convergence(divergences_max=-1),
                         max_rounds=12, mass_from=cheap)
    assert not out.converged
    stretch = [1.0] + [STEP_SHRINK] * SMALLER_STEPS_MAX
    assert [(a, s) for a, s, *_ in runs] == [("pooled", s) for s in stretch] + [("windowed", s) for s in stretch]
    for k in (0, len(stretch)):  # each stretch's fresh warm-up: the cheap mass, no warm start
        assert runs[k][2] is cheap and runs[k][3] is None
    for k, (_, scale, _, warm, post) in enumerate(runs):
        if scale != 1.0:  # from the last run's chains, each at STEP_SHRINK of its step size
            assert warm is runs[k - 1][4]
            before = [float(s.adapt_state.step_size) for s in warm.state["states"]]
            after = post.idata.sample_stats["step_size"].values
            np.testing.assert_allclose(after, np.asarray(before, np.float32)[:, None] * STEP_SHRINK
                                       * np.ones_like(after), rtol=1e-6)
    assert out.diagnostics["attempts"] == 2 * len(stretch) and out.diagnostics["windowed_fallback"]
    assert [(r["kind"], r["step_scale"], r["target_accept"]) for r in out.diagnostics["nuts_runs"]] == 2 * [
        ("fresh" if k == 0 else "smaller-steps", STEP_SHRINK**k, 0.96) for k in range(len(stretch))
    ]


def test_step_scale_needs_a_warm_start(shipped, design_fit):
    grid, obs = shipped
    m, _ = design_fit
    with pytest.raises(ValueError, match="step_scale needs a warm start"):
        fit(grid, obs, m, CARD, load_preset("fast")._replace(warmup=40, samples=20), seed=0, step_scale=0.5)


def test_a_warm_refit_keeps_its_adaptation_when_the_window_rows_cross_a_bucket(shipped, design_fit):
    """A repeat that pushes the window rows into the next bucket compiles a new
    program, but the parameter space is the same: the fit goes on from the last
    state's step size, mass and position instead of rerunning the warm-up."""
    grid, obs = shipped
    m, _ = design_fit
    cells = np.flatnonzero(m)
    preset = load_preset("fast")
    first = fit(grid, obs, m, CARD, preset, seed=0, rows=obs[cells], row_cell=cells)
    assert first.windows.rows.shape[0] == ROW_BUCKET
    again = np.resize(cells, ROW_BUCKET + 1)  # every design cell again, some three times
    rows = obs[again] * np.exp(0.01 * np.random.default_rng(0).normal(size=(again.size, 4)))
    warm = fit(grid, obs, m, CARD, preset, seed=1, warm_start=first, rows=rows, row_cell=again)
    assert warm.windows.rows.shape[0] == 2 * ROW_BUCKET
    assert warm.state["key"] != first.state["key"] and warm.state["sampler"] == first.state["sampler"]
    for before, after in zip(first.state["states"], warm.state["states"], strict=True):
        # Either the chain went on (no warm-up at all) or, its draws diverging on
        # the new windows, its step size alone was re-tuned: the mass is kept.
        assert int(after.i) in (int(before.i) + preset.samples, preset.warmup + preset.samples)
        jax.tree.map(np.testing.assert_array_equal, after.adapt_state.inverse_mass_matrix,
                     before.adapt_state.inverse_mass_matrix)


def test_a_fit_reports_every_transition_of_every_chain_to_a_progress_sink(shipped, design_fit):
    from fleetsieve_bayes.model.sampling_progress import sampling_progress

    grid, obs = shipped
    m, _ = design_fit
    preset = load_preset("fast")._replace(warmup=40, samples=20, adaptation="pooled")
    seen: list[tuple[str, int, int]] = []
    with sampling_progress(lambda name, done, total: seen.append((name, done, total))):
        post = fit(grid, obs, m, CARD, preset, seed=1)
    assert seen[0] == ("fast", 0, 2 * 60) and seen[-1] == ("fast", 120, 120)
    assert all(b[1] >= a[1] for a, b in zip(seen, seen[1:], strict=False))
    seen.clear()
    with sampling_progress(lambda name, done, total: seen.append((name, done, total))):
        fit(grid, obs, m, CARD, preset, seed=2, warm_start=post)  # a warm refit samples only (or re-tunes: more)
    assert seen[0] == ("fast", 0, 2 * 20) and seen[-1][1] == seen[-1][2] >= 40
    n = len(seen)
    fit(grid, obs, m, CARD, preset, seed=3, warm_start=post)
    assert len(seen) == n  # no sink: nothing reported


def test_a_cold_round_fit_compiles_its_warm_refit_ahead(shipped, design_fit, monkeypatch, caplog):
    """``prime_warm_refit``: the programs a warm refit runs (``energy``, and
    ``init_fixed_mass`` when it re-tunes) are compiled after the cold fit, with
    the exact signatures the refit calls them with, so the next round compiles
    neither."""
    import fleetsieve_bayes.model.inference as inference

    grid, obs = shipped
    m, _ = design_fit
    cold = fit(grid, obs, m, CARD, "fast", seed=7, prime_warm_refit=True)
    assert cold.state["key"] in inference._WARM_PRIMED
    for thread in inference._PRIMING:
        thread.join()
    # every warm refit re-tunes (the divergence limit is negative)
    monkeypatch.setattr(inference, "_WARM_DIVERGENCE_LIMIT", -1.0)
    m2 = m.copy()
    m2[np.flatnonzero(~m)[0]] = True
    with jax.log_compiles(), caplog.at_level("WARNING"):
        warm = fit(grid, obs, m2, CARD, "fast", seed=8, warm_start=cold)
    assert warm.state["key"] == cold.state["key"]
    compiled = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not [c for c in compiled if "energy" in c or "init_fixed_mass" in c], compiled


def test_a_warm_start_on_the_same_data_keeps_its_energy_and_draws_what_a_recomputed_one_draws(
    shipped, design_fit, monkeypatch
):
    """A certifying fit's next run has the data its chains stopped on: their energy and
    gradient hold, and the draws are those of a start whose energy is computed afresh."""
    from fleetsieve_bayes.model import inference

    grid, obs = shipped
    m, post = design_fit
    objs = inference._CACHE[post.state["key"]]
    calls: list[int] = []

    def counted(z, d):
        calls.append(1)
        return objs.energy(z, d)

    monkeypatch.setitem(inference._CACHE, post.state["key"], objs._replace(energy=counted))
    same = fit(grid, obs, m, CARD, "fast", seed=1, warm_start=post)
    assert calls == [] and same.state["data"] == post.state["data"]
    moved = fit(grid, obs, m, CARD, "fast", seed=1, warm_start=post._replace(state={**post.state, "data": None}))
    assert len(calls) == len(post.state["states"])
    np.testing.assert_allclose(same.latent, moved.latent, rtol=1e-5)
    other = obs.copy()
    other[np.flatnonzero(m)[0], 0] *= 1.1
    fit(grid, other, m, CARD, "fast", seed=1, warm_start=post)  # other data: recomputed
    assert len(calls) == 2 * len(post.state["states"])


def test_a_pooled_warmup_compiles_one_start_program_and_its_windowed_fallback_none(shipped, design_fit):
    """Random starts and NumPyro's identity mass go through the same compiled
    ``init_fixed_mass`` as given ones; a windowed run of the same preset reuses the kernel."""
    from fleetsieve_bayes.model.inference import _nuts_kernel
    from fleetsieve_bayes.model.priors import load_card

    grid, obs = shipped
    m, _ = design_fit
    preset = load_preset("fast")._replace(warmup=48, samples=24, adaptation="pooled")
    fit(grid, obs, m, CARD, preset, seed=5)  # no mass_from, random starts
    data, card = model_data(grid, obs, m), load_card(CARD)
    objs = _nuts_kernel(data, card, preset)
    assert objs.init_fixed_mass._cache_size() == 1
    assert _nuts_kernel(data, card, preset._replace(adaptation="windowed")) is objs
    compiled = objs.chunk._cache_size()
    fit(grid, obs, m, CARD, preset._replace(adaptation="windowed"), seed=5)
    assert objs.chunk._cache_size() == compiled


def test_a_warm_refit_whose_trees_run_to_max_depth_is_re_massed_from_its_own_draws(shipped, design_fit, monkeypatch):
    """The window-noise model: a warm refit most of whose transitions run to
    ``max_tree_depth`` goes on from its last positions under one new mass, its draws'
    pooled covariance, the step size tuned afresh. At ``"point"`` (no windows) a fit is
    never re-massed."""
    import fleetsieve_bayes.model.inference as inference

    grid, obs = shipped
    m, _ = design_fit
    cells = np.flatnonzero(m)
    preset = load_preset("fast")
    first = fit(grid, obs, m, CARD, preset, seed=0, rows=obs[cells], row_cell=cells)
    pooled: list[np.ndarray] = []
    real = inference.mass_from_draws
    monkeypatch.setattr(inference, "mass_from_draws", lambda flat, free=None: pooled.append(real(flat, free)) or pooled[-1])
    monkeypatch.setattr(inference, "_SATURATED_SHARE", -1.0)  # every refit counts as saturated
    warm = fit(grid, obs, m, CARD, preset, seed=1, warm_start=first, rows=obs[cells], row_cell=cells)
    assert len(pooled) == 1 and pooled[0].shape[0] == pooled[0].shape[1]
    for before, after in zip(first.state["states"], warm.state["states"], strict=True):
        assert int(after.i) == preset.warmup + preset.samples  # tuned afresh, then sampled
        np.testing.assert_allclose(np.asarray(jax.tree.leaves(after.adapt_state.inverse_mass_matrix)[0]), pooled[0])
        assert not np.allclose(np.asarray(jax.tree.leaves(after.adapt_state.inverse_mass_matrix)[0]),
                               np.asarray(jax.tree.leaves(before.adapt_state.inverse_mass_matrix)[0]))
    assert np.all(np.isfinite(warm.latent))
    # at "point" the same refit keeps its mass
    point = fit(grid, obs, m, CARD, preset, seed=1, warm_start=design_fit[1])
    assert len(pooled) == 1
    for before, after in zip(design_fit[1].state["states"], point.state["states"], strict=True):
        jax.tree.map(np.testing.assert_array_equal, after.adapt_state.inverse_mass_matrix,
                     before.adapt_state.inverse_mass_matrix)


def test_saturation_is_the_share_of_transitions_at_max_tree_depth():
    from fleetsieve_bayes.model.inference import NutsTrace, _saturated

    preset = load_preset("fast")._replace(max_tree_depth=3)  # 7 leapfrog steps at most

    def chain(steps):
        return None, NutsTrace({}, None, None, np.asarray(steps), None, None)

    assert _saturated([chain([7, 7, 7, 3]), chain([7, 7, 3, 3])], preset)  # 5 of 8
    assert not _saturated([chain([7, 7, 3, 3]), chain([7, 7, 3, 3])], preset)  # half: not more
    assert not _saturated([chain([6, 6, 6, 6])], preset)
