"""A certification attempt: the converged posterior, the interval certificate
on it, and the decision-level joint check.

Every round fits a cheap posterior (:mod:`fleetsieve_bayes.round`). When its
interval certificate says certified (feasible or infeasible), the round calls
:func:`attempt_certification`, which

1. fits the certifying posterior (:func:`fleetsieve_bayes.model.converged_fit.fit_certifying`:
   r_hat ≤ 1.01, bulk ESS ≥ 400, no divergences, sampling more if needed);
2. recomputes the credible bounds, both allocations and the interval
   certificate on it (an unconverged posterior certifies nothing);
3. runs the joint check (:mod:`fleetsieve_bayes.decision.joint_check`) of the
   conservative allocation — or of "no allocation" for an infeasible call —
   and keeps the certified state only if its probability is ≥ ``1 − risk``.

The attempt's posterior is what a certified campaign stores as
``posterior.nc``; its numbers go to ``result.json`` under ``certificate``.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.bounds import (
    Attainment,
    cell_to_repeat,
    committed_attainment,
    decision_tables,
    repeat_entry,
    repeatable_mask,
    slo_levels,
)
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    UNDECIDED,
    Certificate,
    certify,
)
from fleetsieve_bayes.decision.joint_check import (
    JointCheck,
    apply_joint_check,
    joint_check,
    make_joint_check,
)
from fleetsieve_bayes.jax_cache import on_release
from fleetsieve_bayes.model.converged_fit import fit_certifying
from fleetsieve_bayes.settings import DecisionSettings

__all__ = ["CertificationAttempt", "attempt_certification", "thin"]


class CertificationAttempt(NamedTuple):
    """Everything one attempt produced."""

    certificate: Certificate
    posterior: Any  # the certifying Posterior
    bounds: Any
    conservative: Allocation
    optimistic: Allocation
    check: JointCheck
    diagnostics: dict[str, Any]
    wall_s: float
    # At an SLO-attainment level: every cell's attainment on the certifying posterior,
    # and what result.json reports of it (committed cells, the cell to repeat).
    attainment: Attainment | None = None
    attainment_json: dict[str, Any] | None = None

    @property
    def certified(self) -> bool:
        return self.certificate.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE)

    @property
    def gap_closed(self) -> bool:
        """The interval rule alone would certify (what is left is the joint check or convergence)."""
        return self.diagnostics.get("interval_status") in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE)

    def to_json(self) -> dict[str, Any]:
        d = self.diagnostics
        return {
            **self.check.to_json(),
            "diagnostics": {
                "r_hat_max": d.get("r_hat_max"),
                "ess_bulk_min": d.get("ess_bulk_min"),
                "divergences": d.get("divergences"),
                "chains": d.get("chains"),
                "draws": d.get("draws"),
                "converged": d.get("converged"),
                "restarted_chains": d.get("restarted_chains"),
                "windowed_fallback": d.get("windowed_fallback"),
                "r_hat_max_parameters": d.get("r_hat_max_parameters"),
                "ess_bulk_min_parameters": d.get("ess_bulk_min_parameters"),
                "nuts_runs": d.get("nuts_runs"),
            },
            "attempt_s": float(self.wall_s),
            **(self.attainment_json or {}),
        }


_KERNELS: dict[bytes, Any] = {}
on_release(_KERNELS.clear)  # fleetsieve_bayes.jax_cache.release_compiled


def joint_kernel(grid: CellGrid, problem: AllocationProblem) -> Any:
    """The joint-check kernel of ``(grid, problem)``, compiled once per campaign."""
    key = repr((grid.workloads, grid.load, grid.tp.tolist(), grid.workload_idx.tolist(),
                [np.asarray(a).tolist() for a in problem],
                *(() if grid.config is None else (grid.config.tolist(),)))).encode()
    if key not in _KERNELS:
        _KERNELS.clear()  # one campaign at a time: keep one compiled kernel
        _KERNELS[key] = make_joint_check(grid, problem)
    return _KERNELS[key]


def attempt_certification(
    grid: CellGrid,
    problem: AllocationProblem,
    card: Any,
    observed: np.ndarray,
    measured: np.ndarray,
    settings: DecisionSettings,
    *,
    seed: int,
    preset: Any = None,
    mass_from: Any = None,
    server_failed: np.ndarray | None = None,
    windows: tuple[np.ndarray, np.ndarray] | None = None,
    window_limit: np.ndarray | None = None,
) -> CertificationAttempt:
    """One certification attempt on what is measured now (see the module docstring), under
    ``settings`` (ε, credible level, repeatability, interval rules, risk, SLO attainment).

    ``observed (n_cells, 4)``, ``measured (n_cells,)`` bool; ``preset``: the certifying
    NUTS preset (name, path or object; default ``settings.certify_inference``).

    ``mass_from``: the round's cheap posterior, if any; the certifying
    warm-up starts from its draws' covariance as the mass matrix
    (:func:`fleetsieve_bayes.model.converged_fit.fit_certifying`). ``server_failed``:
    bool ``(n_cells,)``, failed cells whose server never served
    (:func:`fleetsieve_bayes.round.server_failures`). ``windows``: ``(rows (n_rows, 4),
    row_cell (n_rows,))`` every measurement window, read at an attainment level
    (``settings.slo_attainment`` not ``"point"``): the window-noise posterior,
    admissibility by attainment, and a certified-feasible verdict that also
    needs ``P(SLO met) ≥ 1 − risk``. ``window_limit (n_cells,)``: the windows the
    backend can give of each cell (``inf``: no limit), for the cell to repeat."""
    t0 = time.perf_counter()
    levels = slo_levels(grid, settings.slo_attainment)
    rows, row_cell = windows if (levels is not None and windows is not None) else (None, None)
    if levels is not None and rows is None:
        cells = np.flatnonzero(np.asarray(measured, bool))
        rows, row_cell = np.asarray(observed, np.float64)[cells], cells
    certifying = settings.certify_inference if preset is None else preset
    cf = fit_certifying(
        grid, observed, measured, card, certifying, seed=seed, mass_from=mass_from, server_failed=server_failed,
        rows=rows, row_cell=row_cell,
    )
    post = cf.posterior
    bounds, att, cons_t, opt_t = decision_tables(
        post, grid, problem, observed, measured, settings.credible_level, settings.repeatability, settings.rules,
        levels, seed=seed,
    )
    cons = allocate_milp(grid, cons_t, problem)
    opt = allocate_milp(grid, opt_t, problem)
    cert = certify(grid, problem, cons, opt, measured, observed if levels is None else cons_t, settings.epsilon, opt_t)
    interval_status = cert.status
    candidate = cons if cert.status != CERTIFIED_INFEASIBLE else None
    check = joint_check(
        grid, problem, candidate, post.latent, post.noise, observed, measured, settings.epsilon, seed=seed,
        kernel=joint_kernel(grid, problem),
        attainment=None if att is None else att.draws,
        levels=levels,
    )
    if not cf.converged and cert.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        d = cf.diagnostics
        cert = cert._replace(
            status=UNDECIDED,
            reason=(
                f"certifying posterior not converged (r_hat_max {d['r_hat_max']:.3f}, ess_bulk_min "
                f"{(d['ess_bulk_min'] or 0):.0f}, divergences {d['divergences']})"
            ),
        )
    else:
        cert = apply_joint_check(cert, check, settings.risk, require_slo=levels is not None)
    diag = {**cf.diagnostics, "interval_status": interval_status}
    att_json = None
    if att is not None:
        counts = np.bincount(np.asarray(row_cell, np.int64), minlength=grid.n_cells)
        committed = cons.committed() if cons.feasible else []
        repeat = None
        if cert.status == UNDECIDED:
            limits = np.full(grid.n_cells, np.inf) if window_limit is None else window_limit
            failed = np.zeros(grid.n_cells, bool) if server_failed is None else server_failed
            rep = repeatable_mask(counts, limits, failed, settings.max_windows_per_cell)
            c = cell_to_repeat(committed or opt.committed(), att, levels, rep, counts)
            if c is not None:
                repeat = repeat_entry(grid, c, counts, settings.max_windows_per_cell, window_limit)
        att_json = {
            "committed": committed_attainment(grid, committed, att, counts, levels),
            "repeat": repeat,
        }
    return CertificationAttempt(
        cert, post, bounds, cons, opt, check, diag, time.perf_counter() - t0, att, att_json
    )


def thin(posterior: Any, n_draws: int) -> Any:
    """``posterior`` with ``n_draws`` evenly spaced draws of ``latent``/``noise`` (shapes of the cheap fit)."""
    total = int(posterior.latent.shape[0])
    idx = np.round(np.linspace(0, total - 1, n_draws)).astype(int)
    window = None if getattr(posterior, "window", None) is None else posterior.window[idx]
    return posterior._replace(latent=posterior.latent[idx], noise=posterior.noise[idx], window=window)
