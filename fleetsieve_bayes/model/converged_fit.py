"""The certifying posterior: a converged NUTS run that a certificate may rest on.

The acquisition loop refits a cheap posterior every round (the ``fast``
preset: two short chains, warm-started; r_hat around 1.1 and a few dozen
effective draws are fine for *ranking* cells, not for 5 %/95 % quantiles).
A certified state is only issued from a posterior that passes
:data:`CONVERGENCE`: r_hat ≤ 1.01 and bulk ESS ≥ 400 on every cell's latent
metrics and on the noise scales — everything a decision reads from the
posterior (:func:`decision_samples`) — and no divergent transition.

A cell measured as a failure (start-up OOM, every request failed) is left out
of that check: the decision reads its measurement, and its latent metrics are
a counterfactual (what a TP that does not fit in memory would serve) that no
data constrains. Neither are the class-level parameters checked: with a TP
that fails for a class, or a grid of two TPs, the capacity parabola's knee and
curvature are pinned by the prior alone along a curved ridge that NUTS
crosses slowly (suite fleet c029: parameters r_hat 1.10, every cell a decision
reads 1.01 on the same draws). They are reported
(``r_hat_max_parameters``, ``ess_bulk_min_parameters``) and
``fleetsieve-bayes diagnose`` lists them.

:func:`fit_certifying` runs the ``certify`` preset (``fleetsieve_bayes/data/presets/certify.toml``:
four chains of 400 warm-up and 400 draws, target acceptance 0.95, tree depth
10, the chains in threads) with the same compiled NUTS runner as every round's
fit (:func:`fleetsieve_bayes.model.inference.fit`; chains start from
independent random points near the prior's centre), and checks the result.
The ``certify`` preset's warm-up is ``[nuts] adaptation = "pooled"``: the
step size is tuned under a fixed dense mass — first the covariance of the
round's cheap posterior (``mass_from``), then that of all four chains'
first-half draws pooled (a chain in a minor mode left out of the pool and
moved into the main one). NumPyro's per-chain windows estimate the mass from
25–200 of one chain's own draws, which on the hard suite keeps the trees at
their maximum depth and the chains apart for most of the warm-up
(docs/results.md, "Certification attempt time": every attempt that ended on
the windowed fallback, marked w, took 1,000 or more leapfrog steps a draw in
its last run; ``benchmarks/certification_time.py --adaptation windowed`` times
that warm-up alone).
A pooled run that cannot reach the criteria within its rounds is redone with
the windowed warm-up before the fit gives up (``windowed_fallback`` in the
diagnostics).
If it does not pass:

* a chain stuck in a minor mode (:func:`minor_mode_chains`) restarts at a draw
  of a chain in the main mode, and the earlier draws are dropped;
* otherwise it *samples more*: the chains continue from where they stopped
  (adapted step size and mass matrix kept, no new warm-up) and the new draws
  are appended, up to ``max_rounds`` extensions — fewer when the ESS projected
  from the draws so far cannot reach the target within that cap;
* after a run with divergences its draws are dropped and the chains go on from
  where they stopped at :data:`STEP_SHRINK` of their step size (mass kept, no
  new warm-up, the same compiled sampler); a run that still diverges after
  :data:`SMALLER_STEPS_MAX` such shrinks ends the stretch, as a hopeless one
  does.

It never hides a failure: the result says whether the posterior converged
(and how many chains were restarted), and the campaign does not certify on
one that did not.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.model import inference as _inference
from fleetsieve_bayes.model.data import model_data
from fleetsieve_bayes.model.diagnostics import (
    MINOR_MODE_LP_GAP,
    convergence_diagnostics,
    decision_samples,
    failed_cells,
    minor_mode_chains,
)
from fleetsieve_bayes.model.gpu_axis import grid_gpu_inputs
from fleetsieve_bayes.model.priors import PriorCard, load_card

__all__ = [
    "CONVERGENCE",
    "Convergence",
    "CertifyingFit",
    "fit_certifying",
    "convergence_diagnostics",
    "minor_mode_chains",
    "MINOR_MODE_LP_GAP",
    "STEP_SHRINK",
    "SMALLER_STEPS_MAX",
]


class Convergence(NamedTuple):
    """Thresholds a certifying posterior must meet."""

    r_hat_max: float = 1.01
    ess_bulk_min: float = 400.0
    divergences_max: int = 0


CONVERGENCE = Convergence()
# After a run with divergences the chains go on at this share of their step size, at most
# SMALLER_STEPS_MAX times a stretch (down to 0.42 of the adapted step). A shrink costs a draw
# phase, not a warm-up and a newly compiled sampler; on the hard suite the divergences mostly
# fell to none within three (docs/results.md, "Certification attempt time": each run's
# divergences in order, and the last run's step scale).
STEP_SHRINK = 0.75
SMALLER_STEPS_MAX = 3


class CertifyingFit(NamedTuple):
    """A certifying fit: the posterior, its diagnostics, and whether they pass."""

    posterior: Any  # fleetsieve_bayes.model.inference.Posterior
    diagnostics: dict[str, Any]  # r_hat_max, ess_bulk_min, divergences, draws, chains, attempts, wall_s, nuts_runs
    converged: bool


def _passes(diag: dict[str, Any], crit: Convergence) -> bool:
    ess = diag["ess_bulk_min"]
    return (
        diag["r_hat_max"] <= crit.r_hat_max
        and ess is not None
        and ess >= crit.ess_bulk_min
        and diag["divergences"] <= crit.divergences_max
    )


def fit_certifying(
    grid: CellGrid,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    card: PriorCard | str | Path,
    preset: Any = "certify",
    *,
    seed: int,
    criteria: Convergence = CONVERGENCE,
    max_rounds: int = 12,
    time_budget_s: float | None = None,
    failed: np.ndarray | None = None,
    mass_from: Any = None,
    server_failed: np.ndarray | None = None,
    rows: np.ndarray | None = None,
    row_cell: np.ndarray | None = None,
) -> CertifyingFit:
    """Fit the certifying posterior and check it against ``criteria``: a :class:`CertifyingFit`
    whose ``posterior.latent`` has ``chains × samples × (1 + extensions)`` draws.

    Args:
        grid, observed, measured_mask, failed, server_failed, rows, row_cell: as
            :func:`fleetsieve_bayes.model.inference.fit` (rows: the window-noise likelihood).
        card: prior card (object, name or path).
        preset: an NUTS preset (object, name or path); default ``certify``.
        seed: PRNG seed (the same seed gives the same posterior).
        max_rounds: extensions (more draws), chain restarts or re-runs after
            the first run; an attempt also stops once the ESS projected from
            the draws so far cannot reach ``criteria.ess_bulk_min`` within
            ``samples · (1 + max_rounds)`` draws per chain.
        mass_from: with ``adaptation = "pooled"``: a posterior of the same data (the round's cheap fit) whose
            draws' covariance is the first mass matrix of the warm-up; None:
            the identity.
        time_budget_s: no further extension starts after this many seconds
            (default None: the number of draws alone decides, so a resumed
            campaign reproduces the same posterior).
    """
    t0 = time.perf_counter()
    card = card if isinstance(card, PriorCard) else load_card(card)
    preset = preset if isinstance(preset, _inference.InferencePreset) else _inference.load_preset(preset)
    if preset.method != "nuts":
        raise ValueError(f"the certifying posterior needs a NUTS preset, got {preset.method!r}")
    restarted, ok = 0, False
    fits: list[Any] = []
    seq = np.random.SeedSequence(seed)
    diag: dict[str, Any] = {}
    stats: dict[str, np.ndarray] = {}
    fallback, stretch = False, 0  # switched to the windowed warm-up; runs before this stretch
    data = model_data(grid, observed, measured_mask, failed=failed, server_failed=server_failed, rows=rows, row_cell=row_cell,
                      gpu=grid_gpu_inputs(grid, card))
    args, same = (grid, observed, measured_mask, card), {"failed": failed, "server_failed": server_failed, "rows": rows, "row_cell": row_cell}
    # Cells measured as failures: left out of the convergence check (what the decision reads).
    excluded = failed_cells(np.asarray(data.measured), np.asarray(data.fit_mask))
    runs: list[dict[str, Any]] = []
    shrunk = 0  # smaller-step runs in this stretch
    while True:
        sub = int(seq.spawn(1)[0].generate_state(1)[0])
        t_run = time.perf_counter()
        stuck = minor_mode_chains(stats["lp"]) if fits and not ok else {}
        if stuck:
            # Restart the stuck chains inside the main mode; every earlier draw
            # is dropped (the others' served as a longer warm-up), so all chains
            # are judged on the same, fresh stretch.
            restarted += len(stuck)
            warm = _inference.restart_chains(fits[-1], stuck, data, seed=sub)
            fits, kind = [_inference.fit(*args, preset, seed=sub, warm_start=warm, **same)], "restart"
        elif not fits:
            fits, kind = [_inference.fit(*args, preset, seed=sub, **same, mass_from=mass_from)], "fresh"
        elif diag["divergences"] > criteria.divergences_max:
            # Smaller steps: every chain goes on from where it stopped at STEP_SHRINK of its step
            # size (mass kept, no new warm-up); the divergent run's draws are dropped.
            shrunk += 1
            fits = [_inference.fit(*args, preset, seed=sub, warm_start=fits[-1], step_scale=STEP_SHRINK, **same)]
            kind = "smaller-steps"
        else:
            # Sample more: every chain continues from its last state (adapted step size and
            # mass matrix kept, no new warm-up); draws are appended.
            fits.append(_inference.fit(*args, preset, seed=sub, warm_start=fits[-1], **same))
            kind = "extension"
        runs.append(_run_record(fits[-1], kind, preset, STEP_SHRINK**shrunk, time.perf_counter() - t_run))
        samples, stats = _concatenate(fits)
        diag = convergence_diagnostics(decision_samples(samples, excluded), stats["diverging"])
        ok = _passes(diag, criteria)
        late = time_budget_s is not None and time.perf_counter() - t0 > time_budget_s
        if ok or late:
            break
        if _stretch_over(diag, stats, preset, len(runs) - stretch, len(fits), shrunk, max_rounds, criteria):
            if preset.adaptation != "pooled":
                break
            # The pooled warm-up gambles on one shared mass matrix; where it
            # lost (suite fleet c016: r_hat 1.18 after 800 draws), start
            # again with NumPyro's per-chain windows, which adapt to each
            # chain's own geometry — the same cap on rounds, judged afresh.
            preset = preset._replace(adaptation="windowed")
            fallback, stretch, fits, shrunk = True, len(runs), [], 0
    post = _inference.assemble(samples, stats, data, seed, method="nuts", state=None)
    diag = _report(diag, samples, stats, preset, attempts=len(runs), restarted=restarted, fallback=fallback,
                   wall_s=time.perf_counter() - t0, converged=ok)
    diag["nuts_runs"] = runs
    return CertifyingFit(posterior=post, diagnostics=diag, converged=bool(ok))


def _stretch_over(
    diag: dict[str, Any], stats: dict[str, np.ndarray], preset: Any, runs: int, fits: int, shrunk: int,
    max_rounds: int, criteria: Convergence,
) -> bool:
    """The stretch of ``runs`` runs (``fits`` of them in the draws judged, ``shrunk`` of them at
    smaller steps) ends unconverged: its rounds are spent, sampling more is :func:`_hopeless`,
    or its last run diverged at the smallest steps (``STEP_SHRINK ** SMALLER_STEPS_MAX`` of the
    adapted step size): not mended by smaller steps, only redrawn (docs/results.md,
    "Certification attempt time", divergences)."""
    capped = diag["divergences"] > criteria.divergences_max and shrunk >= SMALLER_STEPS_MAX
    return capped or runs > max_rounds or (fits > 1 and _hopeless(diag, stats, preset, max_rounds, criteria))


def _run_record(posterior: Any, kind: str, preset: Any, step_scale: float, seconds: float) -> dict[str, Any]:
    """One NUTS run of a certifying fit, as ``diagnostics["nuts_runs"]`` lists it: how it
    started (``fresh`` warm-up, ``extension`` of the last run's chains, ``restart`` of stuck
    chains, ``smaller-steps`` after divergences), its warm-up and target acceptance, its draws
    per chain, its step size against the stretch's adapted one (``step_scale``), the median over
    chains of its step size, the mean leapfrog steps a draw, its divergences and seconds."""
    ss = posterior.idata.sample_stats
    return {
        "kind": kind,
        "adaptation": preset.adaptation,
        "target_accept": float(preset.target_accept),
        "draws": int(ss["diverging"].shape[1]),
        "step_scale": float(step_scale),
        "step_size": float(np.median(np.asarray(ss["step_size"].values)[:, -1])),
        "steps_per_draw": float(np.mean(ss["n_steps"].values)),
        "divergences": int(np.sum(ss["diverging"].values)),
        "seconds": float(seconds),
    }


def _report(
    diag: dict[str, Any], samples: dict[str, np.ndarray], stats: dict[str, np.ndarray], preset: Any, *,
    attempts: int, restarted: int, fallback: bool, wall_s: float, converged: bool,
) -> dict[str, Any]:
    """The diagnostics a certifying fit reports: the decision's, the parameters', and how it got there."""
    params = convergence_diagnostics(
        {k: v for k, v in samples.items() if k not in ("latent", "capacity")}, stats["diverging"]
    )
    return {
        **diag,
        "r_hat_max_parameters": params["r_hat_max"],
        "ess_bulk_min_parameters": params["ess_bulk_min"],
        "chains": int(stats["diverging"].shape[0]),
        "draws": int(stats["diverging"].shape[1]),
        "attempts": attempts,
        "restarted_chains": restarted,
        "adaptation": preset.adaptation,
        "windowed_fallback": fallback,
        "target_accept": float(preset.target_accept),
        "wall_s": wall_s,
        "converged": bool(converged),
    }


def _hopeless(
    diag: dict[str, Any], stats: dict[str, np.ndarray], preset: Any, max_rounds: int, criteria: Convergence
) -> bool:
    """Sampling more cannot reach the ESS target within the draw cap.

    Bulk ESS grows about linearly with the draws of chains that mix in one
    mode: at ``e`` effective draws from ``n`` per chain, the target needs about
    ``n · target / e``. Past ``samples · (1 + max_rounds)`` per chain the
    attempt stops instead of spending minutes on a posterior that will not
    pass (deterministic, unlike a time budget: the same inputs give the same
    posterior on any machine). Judged from the second run of a stretch on (a
    fresh or restarted run's ESS is dragged down by its start). Chains in
    different modes are not judged here.
    """
    if minor_mode_chains(stats["lp"]):
        return False
    ess = diag.get("ess_bulk_min") or 0.0
    per_chain = int(stats["diverging"].shape[1])
    cap = preset.samples * (1 + max_rounds)
    return ess <= 0.0 or per_chain * criteria.ess_bulk_min / ess > cap


def _concatenate(fits: list[Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Posterior sites and sample stats of consecutive fits, draws appended: ``(chains, draws, ...)``."""
    names = list(fits[0].idata.posterior.data_vars)
    samples = {k: np.concatenate([f.idata.posterior[k].values for f in fits], axis=1) for k in names}
    stat_names = [k for k in fits[0].idata.sample_stats.data_vars if k != "lp"] + ["lp"]
    stats = {
        k: np.concatenate([f.idata.sample_stats[k].values for f in fits], axis=1)
        for k in stat_names
        if k in fits[0].idata.sample_stats
    }
    return samples, stats
