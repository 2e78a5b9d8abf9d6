"""Ranked alternatives: the fleets a campaign's posterior finds most probably ε-optimal.

A campaign answers with one allocation. Beside it, result.json lists up to
``[stopping] alternatives`` distinct fleets, ranked by the posterior probability
that each is ε-optimal (:mod:`fleetsieve_bayes.decision.joint_check`), all on
one set of joint tables — the certification attempt's converged draws when the
final round made one, else the round's cheap posterior:

* the candidates are the answer given, the conservative and the optimistic
  allocations, and the most frequent per-draw optima of those tables (the
  actions the regret acquisition weighs,
  :func:`~fleetsieve_bayes.decision.regret_acquisition.action_set`);
* each is checked on the same tables with one shared kernel
  (:func:`~fleetsieve_bayes.decision.joint_check.check_candidates`), which gives
  its P(ε-optimal) and P(SLO met) (at an SLO-attainment level, at the level);
* they are ranked by P(ε-optimal), ties broken by fewer GPUs, then fewer
  dollars per hour, then the allocation's cells and replicas in class order.

"No allocation" is never an alternative: an entry is a fleet to deploy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.objective import allocation_from_choice
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.joint_check import check_candidates
from fleetsieve_bayes.decision.regret_acquisition import action_set

__all__ = ["Alternative", "rank_alternatives"]


class Alternative(NamedTuple):
    """One ranked fleet: the allocation (its ``gpus_used`` and ``usd_per_hour``) and its chances."""

    allocation: Allocation
    p_epsilon_optimal: float
    p_slo_met: float

    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Its cells (−1 for a class given nothing) and replicas, in class order."""
        return _key(self.allocation.cell, self.allocation.replicas)


def _key(cell: Any, replicas: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    reps = tuple(int(r) if int(c) >= 0 else 0 for c, r in zip(cell, replicas, strict=True))
    return tuple(int(c) if n > 0 else -1 for c, n in zip(cell, reps, strict=True)), reps


def rank_alternatives(
    grid: CellGrid,
    problem: AllocationProblem,
    candidates: Sequence[Allocation | None],
    latent: np.ndarray,
    noise: np.ndarray,
    observed: np.ndarray,
    measured: np.ndarray,
    epsilon: float,
    *,
    count: int,
    seed: int = 0,
    kernel: Any = None,
    attainment: np.ndarray | None = None,
    levels: np.ndarray | None = None,
) -> tuple[list[Alternative], int]:
    """Up to ``count`` distinct fleets, best first (module docstring), and the draws they were
    checked on.

    Args:
        candidates: the allocations always weighed (the answer, the conservative and the
            optimistic one; None or infeasible ones are skipped); the ``count`` most
            frequent per-draw optima are added.
        latent, noise, observed, measured, epsilon, seed, kernel, attainment, levels: as
            :func:`~fleetsieve_bayes.decision.joint_check.joint_check` (one ``seed``: one
            set of tables for every candidate).
    """
    keys: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for a in candidates:
        if a is not None and a.feasible and (k := _key(a.cell, a.replicas)) not in keys and any(k[1]):
            keys.append(k)
    args = (latent, noise, observed, measured, epsilon)
    opts = {"seed": seed, "kernel": kernel, "attainment": attainment, "levels": levels}
    first = check_candidates(grid, problem, np.array([k[0] for k in keys]), np.array([k[1] for k in keys]),
                             *args, **opts)
    p_eps, p_slo = list(first.p_epsilon_optimal), list(first.p_slo_met)
    a_cell, a_reps, present = action_set(first.optimum_cell, first.optimum_replicas, first.feasible, None, count)
    new = [k for c, r, p in zip(a_cell, a_reps, present, strict=True) if p and (k := _key(c, r)) not in keys and any(k[1])]
    if new:
        more = check_candidates(grid, problem, np.array([k[0] for k in new]), np.array([k[1] for k in new]),
                                *args, **opts)
        keys += new
        p_eps += list(more.p_epsilon_optimal)
        p_slo += list(more.p_slo_met)
    table = np.nan_to_num(np.asarray(observed, np.float64), nan=0.0, posinf=0.0)
    out = [
        Alternative(allocation_from_choice(grid, table, problem, np.array(k[0]), np.array(k[1]), feasible=True),
                    float(pe), float(ps))
        for k, pe, ps in zip(keys, p_eps, p_slo, strict=True)
    ]
    out.sort(key=lambda a: (-a.p_epsilon_optimal, a.allocation.gpus_used, a.allocation.usd_per_hour or 0.0, a.key()))
    return out[:count], first.n_draws
