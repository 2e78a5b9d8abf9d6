"""The decision-level joint check: is the candidate allocation ε-optimal on the
tables the posterior finds plausible, all cells at once?

The interval certificate (:mod:`fleetsieve_bayes.decision.certificate`) looks
at each cell's credible interval separately. With dozens of unmeasured cells,
some cell's truth lies outside its 90 % interval in most campaigns, and when
that cell is the one the decision hinges on the certificate is false. The
joint check asks the question the certificate stands for, once per joint
posterior draw ``d``:

1. build the table ``T_d``: an unmeasured cell takes the draw's
   posterior-predictive value (latent metrics of draw ``d`` plus one
   observation-noise draw with that draw's noise scales — what measuring the
   cell would return); a measured cell keeps its measured value (the decision
   is judged on what was measured, as the replay judges it);
2. solve ``T_d`` exactly with the batched JAX allocator
   (:mod:`fleetsieve_bayes.allocation.batched`) → the draw's optimum;
3. evaluate the candidate allocation ``A`` on ``T_d``: class ``i`` serves
   ``min(λ_i, n_i·c_d)`` if its committed cell is admissible on ``T_d`` and 0
   otherwise; regret per stage as in :mod:`fleetsieve_bayes.evaluation.regret`
   (critical feasibility, ``r*_d − r``, ``(g*_d − g)/Σλ``).

From the draws:

* ``p_epsilon_optimal`` = P(critical feasibility right and every continuous
  stage's regret ≤ ε); for a "no allocation" (infeasible) decision it is
  P(no allocation of ``T_d`` meets the critical floors);
* ``p_slo_met`` = P(every committed cell meets its SLOs) where a measured
  committed cell is re-drawn around its measured value with the draw's noise
  scales (what the single measurement could hide: the probability that the
  cell's performance, not just this measurement of it, is within SLO);
* ``p_infeasible`` = P(no allocation meets the critical floors).

At an SLO-attainment level ``q`` (``attainment`` and ``levels`` given: the
window-noise posterior's attainment draws ``(n_draws, n_cells)``), a cell is
admissible on ``T_d`` when its attainment in draw ``d`` is ≥ q — the rule of
:func:`fleetsieve_bayes.decision.intervals.level_tables`, with the draw's
attainment as both bounds — so ``p_epsilon_optimal`` is P(ε-optimal at level
q) and ``p_slo_met`` = P(every committed cell's attainment ≥ q).

Rule (:func:`apply_joint_check`): certified-feasible additionally needs
``p_epsilon_optimal ≥ 1 − risk``; certified-infeasible needs
``p_infeasible ≥ 1 − risk``; otherwise the round is undecided.

The per-cell ``threat`` (``(n_cells,)``: the share of draws in which the cell
is unmeasured and committed by the draw's optimum while the candidate is not
ε-optimal there) names the cells whose measurement would settle the check;
the acquisition uses it when the interval gap is already closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid, meets_slo
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    UNDECIDED,
    Certificate,
)
from fleetsieve_bayes.decision.intervals import level_tables
from fleetsieve_bayes.model.observation import sample_obs
from fleetsieve_bayes.numerics import at_least

__all__ = [
    "DEFAULT_RISK",
    "JointCheck",
    "joint_tables",
    "evaluate_on_tables",
    "make_joint_check",
    "joint_check",
    "answer_chances",
    "CandidateChecks",
    "check_candidates",
    "apply_joint_check",
]

DEFAULT_RISK = 0.05


class JointCheck(NamedTuple):
    """Result of :func:`joint_check`. Arrays are NumPy; ``(n_draws,)`` per draw."""

    p_epsilon_optimal: float
    p_slo_met: float
    p_infeasible: float
    n_draws: int
    eps_optimal: np.ndarray  # bool (n_draws,)
    regret_min_fulfillment: np.ndarray  # (n_draws,)
    regret_goodput: np.ndarray  # (n_draws,)
    threat: np.ndarray  # (n_cells,), see the module docstring

    def to_json(self) -> dict[str, Any]:
        return {
            "p_epsilon_optimal": float(self.p_epsilon_optimal),
            "p_slo_met": float(self.p_slo_met),
            "p_infeasible": float(self.p_infeasible),
            "draws": int(self.n_draws),
        }


def joint_tables(
    key: jax.Array, latent: jax.Array, noise: jax.Array, observed: jax.Array, measured: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The per-draw tables.

    Args:
        latent: ``(n_draws, n_cells, 4)``; noise: ``(n_draws, 4)``;
        observed: ``(n_cells, 4)`` (rows of unmeasured cells ignored);
        measured: bool ``(n_cells,)``.

    Returns:
        ``(T, T_hidden)`` each ``(n_draws, n_cells, 4)``: ``T`` has measured
        cells at their measured values; ``T_hidden`` re-draws measured cells
        around them with each draw's noise scales (unmeasured cells equal).
    """
    k1, k2 = jax.random.split(key)
    latent, noise = jnp.asarray(latent), jnp.asarray(noise)
    measured = jnp.asarray(measured, bool)
    obs = jnp.where(measured[:, None], jnp.asarray(observed, latent.dtype), 1.0)
    y = sample_obs(k1, latent, noise[:, None, :])
    t = jnp.where(measured[None, :, None], obs[None], y)
    # A failed measurement (zero throughput) hides nothing: it stays a failure.
    hidden = sample_obs(k2, jnp.broadcast_to(jnp.maximum(obs, 1e-9)[None], latent.shape), noise[:, None, :])
    dead = (obs[:, 0] <= 0) | (obs[:, 3] <= 0)
    hidden = jnp.where(dead[None, :, None], obs[None], hidden)
    t_hidden = jnp.where(measured[None, :, None], hidden, y)
    return t, t_hidden


def evaluate_on_tables(
    values: jax.Array,
    cell: jax.Array,
    replicas: jax.Array,
    present: bool,
    cell_class: jax.Array,
    demand: jax.Array,
    floor_req: jax.Array,
    success_min: jax.Array,
    ttft_max: jax.Array,
    completion_max: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """A fixed allocation evaluated on many tables.

    Args:
        values: ``(n_draws, n_cells, 4)``; cell, replicas: ``(n_classes,)``
            (cell −1: nothing); ``present``: False for "no allocation";
            per-class arrays ``(n_classes,)``; ``cell_class (n_cells,)``.

    Returns:
        ``min_fulfillment (n_draws,)``, ``goodput (n_draws,)``, ``meets_floors
        (n_draws,)`` and ``slo_ok (n_draws,)`` (every committed cell admissible).
    """
    del cell_class
    if not present:
        zero = jnp.zeros(values.shape[0], values.dtype)
        meets = jnp.all(floor_req <= 0) * jnp.ones(values.shape[0], bool)
        return zero, zero, meets, jnp.ones(values.shape[0], bool)
    has = (cell >= 0) & (replicas > 0)
    c = jnp.maximum(cell, 0)
    v = values[:, c, :]  # (D, K, 4)
    adm = meets_slo(v, success_min[None], ttft_max[None], completion_max[None])  # (D, K)
    served = jnp.where(has[None] & adm, jnp.minimum(demand[None], replicas[None] * v[..., 0]), 0.0)
    r = served / demand[None]
    meets = jnp.all(r >= floor_req[None] - 1e-6, axis=-1)
    slo_ok = jnp.all(~has[None] | adm, axis=-1)
    return jnp.min(r, axis=-1), jnp.sum(served, axis=-1), meets, slo_ok


class _Kernel(NamedTuple):
    run: Callable[..., tuple]
    # Several present allocations on one set of tables (one solve): see :func:`check_candidates`.
    run_many: Callable[..., tuple] | None = None


def make_joint_check(grid: CellGrid, problem: AllocationProblem, *, solve: Callable | None = None) -> _Kernel:
    """A jitted joint-check kernel for one (grid, problem); ``solve`` defaults to the batched JAX allocator."""
    if solve is None:
        from fleetsieve_bayes.allocation.batched import make_jax_allocator

        solve = make_jax_allocator(grid, problem).solve
    lam = jnp.asarray(problem.demand)
    floor_req = jnp.asarray(np.where(problem.critical, problem.floor, 0.0))
    smin = jnp.asarray(problem.success_min)
    tmax = jnp.asarray(problem.ttft_max)
    cmax = jnp.asarray(problem.completion_max)
    cclass = jnp.asarray(grid.workload_idx, jnp.int32)
    total = float(np.sum(problem.demand))
    n_cells = grid.n_cells

    def tables(key, latent, noise, observed, measured, attainment=None, levels=None):
        t, t_hidden = joint_tables(key, latent, noise, observed, measured)
        if attainment is not None:
            att = attainment.astype(t.dtype)
            lim = (smin.astype(t.dtype)[cclass], tmax.astype(t.dtype)[cclass], cmax.astype(t.dtype)[cclass])
            t, _ = level_tables(t, t, att, att, levels.astype(t.dtype), *lim)
            t_hidden = t
        return t, t_hidden

    def verdict(t, t_hidden, opt, cell, replicas, present: bool, epsilon: float):
        lam_ = lam.astype(t.dtype)
        args = (cclass, lam_, floor_req.astype(t.dtype), smin.astype(t.dtype), tmax.astype(t.dtype), cmax.astype(t.dtype))
        r, g, meets, _ = evaluate_on_tables(t, cell, replicas, present, *args)
        _, _, _, slo_ok = evaluate_on_tables(t_hidden, cell, replicas, present, *args)
        # A present allocation is wrong where the floors are unreachable (any
        # allocation is a false claim) or where it misses them; "none" is wrong
        # where some allocation meets them.
        crit_wrong = ((opt.feasible & ~meets) | ~opt.feasible) if present else opt.feasible
        dr = jnp.where(opt.feasible, opt.min_fulfillment - r, 0.0)
        dg = jnp.where(opt.feasible, (opt.goodput - g) / total, 0.0)
        ok = ~crit_wrong & (dr <= epsilon) & (dg <= epsilon)
        return ok, slo_ok, dr, dg

    def run(key, latent, noise, observed, measured, cell, replicas, present: bool, epsilon: float, attainment=None, levels=None):
        t, t_hidden = tables(key, latent, noise, observed, measured, attainment, levels)
        opt = solve(t)
        ok, slo_ok, dr, dg = verdict(t, t_hidden, opt, cell, replicas, present, epsilon)
        # Cells that threaten the decision: committed by a draw's optimum where
        # the candidate is not ε-optimal, and not measured yet.
        oc = jnp.where(opt.replicas > 0, opt.cell, -1)  # (D, K)
        hit = jnp.zeros((t.shape[0], n_cells + 1), bool)
        hit = hit.at[jnp.arange(t.shape[0])[:, None], jnp.where(oc >= 0, oc, n_cells)].set(True)[:, :n_cells]
        threat = jnp.mean(hit & ~ok[:, None] & ~jnp.asarray(measured, bool)[None], axis=0)
        return ok, slo_ok, opt.feasible, dr, dg, threat

    def run_many(key, latent, noise, observed, measured, cells, replicas, epsilon: float, attainment=None, levels=None):
        t, t_hidden = tables(key, latent, noise, observed, measured, attainment, levels)
        opt = solve(t)

        def one(cell, reps):
            ok, slo_ok, _, _ = verdict(t, t_hidden, opt, cell, reps, True, epsilon)
            return ok, slo_ok

        ok, slo_ok = jax.vmap(one)(cells, replicas)  # (A, D) each
        reps = jnp.where(opt.cell >= 0, opt.replicas, 0)
        return ok, slo_ok, opt.feasible, jnp.where(reps > 0, opt.cell, -1), reps

    return _Kernel(
        run=jax.jit(run, static_argnames=("present", "epsilon")),
        run_many=jax.jit(run_many, static_argnames=("epsilon",)),
    )


def joint_check(
    grid: CellGrid,
    problem: AllocationProblem,
    candidate: Allocation | None,
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    epsilon: float,
    *,
    seed: int = 0,
    kernel: _Kernel | None = None,
    attainment: np.ndarray | None = None,
    levels: np.ndarray | None = None,
) -> JointCheck:
    """Run the joint check of ``candidate`` (None or infeasible: the "no allocation" decision).

    Args:
        latent: ``(n_draws, n_cells, 4)`` posterior draws of the latent metrics.
        noise: ``(n_draws, 4)`` the draws' observation-noise scales.
        observed: ``(n_cells, 4)`` measured values (read where measured).
        measured: bool ``(n_cells,)``.
        attainment: optional ``(n_draws, n_cells)`` attainment draws and
            ``levels (n_cells,)`` each cell's level: check at those levels
            (see the module docstring); None: the metric rule.
    """
    kernel = kernel or make_joint_check(grid, problem)
    present = candidate is not None and candidate.feasible
    k = grid.n_classes
    cell = np.full(k, -1, np.int32) if not present else np.asarray(candidate.cell, np.int32)
    reps = np.zeros(k, np.int32) if not present else np.asarray(candidate.replicas, np.int32)
    obs = np.where(np.asarray(measured, bool)[:, None], np.nan_to_num(np.asarray(observed, np.float64), nan=1.0, posinf=1e9), 1.0)
    ok, slo_ok, feas, dr, dg, threat = kernel.run(
        jax.random.PRNGKey(seed),
        jnp.asarray(latent),
        jnp.asarray(noise),
        jnp.asarray(obs, jnp.asarray(latent).dtype),
        jnp.asarray(measured, bool),
        jnp.asarray(cell),
        jnp.asarray(reps),
        bool(present),
        float(epsilon),
        *(() if attainment is None else (jnp.asarray(attainment, jnp.asarray(latent).dtype), jnp.asarray(levels))),
    )
    ok, slo_ok, feas = (np.asarray(x, bool) for x in (ok, slo_ok, feas))
    return JointCheck(
        p_epsilon_optimal=float(ok.mean()),
        p_slo_met=float(slo_ok.mean()),
        p_infeasible=float(1.0 - feas.mean()),
        n_draws=int(ok.size),
        eps_optimal=ok,
        regret_min_fulfillment=np.asarray(dr, np.float64),
        regret_goodput=np.asarray(dg, np.float64),
        threat=np.asarray(threat, np.float64),
    )


def answer_chances(
    grid: CellGrid,
    problem: AllocationProblem,
    candidates: Sequence[Allocation | None],
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    epsilon: float,
    *,
    attainment: np.ndarray | None = None,
    levels: np.ndarray | None = None,
    seed: int = 0,
    kernel: _Kernel | None = None,
) -> np.ndarray:
    """``(n_candidates,)``: each candidate allocation's ``p_epsilon_optimal``
    (:func:`joint_check`, at the levels when ``attainment`` is given), all on the
    same posterior tables (one ``seed``), so that the chances compare; a candidate
    equal to an earlier one is not checked again. Arguments as :func:`joint_check`."""
    kernel = kernel or make_joint_check(grid, problem)
    seen: dict[tuple, float] = {}
    out = np.empty(len(candidates))
    for i, cand in enumerate(candidates):
        present = cand is not None and cand.feasible
        key = (tuple(np.asarray(cand.cell).tolist()), tuple(np.asarray(cand.replicas).tolist())) if present else ()
        if key not in seen:
            seen[key] = joint_check(grid, problem, cand, latent, noise, observed, measured, epsilon, seed=seed,
                                    kernel=kernel, attainment=attainment, levels=levels).p_epsilon_optimal
        out[i] = seen[key]
    return out


class CandidateChecks(NamedTuple):
    """Result of :func:`check_candidates`: ``A`` allocations on one set of joint tables."""

    p_epsilon_optimal: np.ndarray  # (A,)
    p_slo_met: np.ndarray  # (A,)
    n_draws: int
    optimum_cell: np.ndarray  # int (n_draws, n_classes): each draw's optimum, −1 for a class given nothing
    optimum_replicas: np.ndarray  # int (n_draws, n_classes)
    feasible: np.ndarray  # bool (n_draws,): the draw's critical floors are reachable


def check_candidates(
    grid: CellGrid,
    problem: AllocationProblem,
    cells: np.ndarray,
    replicas: np.ndarray,
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    epsilon: float,
    *,
    attainment: np.ndarray | None = None,
    levels: np.ndarray | None = None,
    seed: int = 0,
    kernel: _Kernel | None = None,
) -> CandidateChecks:
    """The joint check of several present allocations (``cells``, ``replicas``: ``(A, n_classes)``,
    cell −1 for a class given nothing) on the same posterior tables, solved once: what
    :func:`joint_check` gives each of them with this ``seed`` (its ``p_epsilon_optimal`` and
    ``p_slo_met``), and each draw's optimum (the actions
    :mod:`~fleetsieve_bayes.decision.regret_acquisition` weighs are the most frequent of them).
    Other arguments as :func:`joint_check`."""
    kernel = kernel or make_joint_check(grid, problem)
    assert kernel.run_many is not None
    cells = np.asarray(cells, np.int32).reshape(-1, grid.n_classes)
    replicas = np.asarray(replicas, np.int32).reshape(-1, grid.n_classes)
    n = cells.shape[0]
    width = max(8, 1 << max(n - 1, 0).bit_length())  # a few shapes: one compile each
    pad = np.arange(width) % max(n, 1)
    if n == 0:
        cells, replicas = np.full((1, grid.n_classes), -1, np.int32), np.zeros((1, grid.n_classes), np.int32)
    dt = jnp.asarray(latent).dtype
    obs = np.where(np.asarray(measured, bool)[:, None], np.nan_to_num(np.asarray(observed, np.float64), nan=1.0, posinf=1e9), 1.0)
    ok, slo_ok, feas, oc, orep = kernel.run_many(
        jax.random.PRNGKey(seed), jnp.asarray(latent), jnp.asarray(noise), jnp.asarray(obs, dt),
        jnp.asarray(measured, bool), jnp.asarray(cells[pad]), jnp.asarray(replicas[pad]), float(epsilon),
        *(() if attainment is None else (jnp.asarray(attainment, dt), jnp.asarray(levels))),
    )
    ok, slo_ok = np.asarray(ok, bool)[:n], np.asarray(slo_ok, bool)[:n]
    return CandidateChecks(
        p_epsilon_optimal=ok.mean(axis=1) if n else np.zeros(0),
        p_slo_met=slo_ok.mean(axis=1) if n else np.zeros(0),
        n_draws=int(np.asarray(feas).shape[0]),
        optimum_cell=np.asarray(oc, np.int64),
        optimum_replicas=np.asarray(orep, np.int64),
        feasible=np.asarray(feas, bool),
    )


def apply_joint_check(
    cert: Certificate, check: JointCheck, risk: float = DEFAULT_RISK, *, require_slo: bool = False
) -> Certificate:
    """The certificate after the joint check: a certified state stands only if the
    posterior backs it with probability ≥ ``1 − risk``; otherwise undecided (same gap).
    ``require_slo`` (an SLO-attainment level): certified-feasible also needs
    ``p_slo_met`` ≥ ``1 − risk`` (every committed cell's attainment ≥ q)."""
    if cert.status == CERTIFIED_FEASIBLE and require_slo and not at_least(check.p_slo_met, 1.0 - risk):
        return cert._replace(
            status=UNDECIDED,
            reason=(
                f"joint check: P(SLO met) = {check.p_slo_met:.3f} < {1.0 - risk:.3f} "
                f"(P(ε-optimal) = {check.p_epsilon_optimal:.3f})"
            ),
        )
    if cert.status == CERTIFIED_FEASIBLE and not at_least(check.p_epsilon_optimal, 1.0 - risk):
        return cert._replace(
            status=UNDECIDED,
            reason=(
                f"joint check: P(ε-optimal) = {check.p_epsilon_optimal:.3f} < {1.0 - risk:.3f} "
                f"(interval gap closed; P(SLO met) = {check.p_slo_met:.3f})"
            ),
        )
    if cert.status == CERTIFIED_INFEASIBLE and not at_least(check.p_infeasible, 1.0 - risk):
        return cert._replace(
            status=UNDECIDED,
            reason=f"joint check: P(critical floors unreachable) = {check.p_infeasible:.3f} < {1.0 - risk:.3f}",
        )
    if cert.status in (CERTIFIED_FEASIBLE, CERTIFIED_INFEASIBLE):
        p = check.p_epsilon_optimal if cert.status == CERTIFIED_FEASIBLE else check.p_infeasible
        return cert._replace(reason=f"{cert.reason}; joint check {p:.3f} ≥ {1.0 - risk:.3f}")
    return cert
