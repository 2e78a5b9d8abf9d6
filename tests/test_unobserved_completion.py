"""A row without completion timing (ingested): unobserved in the model, inadmissible where named."""

from __future__ import annotations

import math

import numpy as np

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid, admissible
from fleetsieve_bayes.decision.bounds import conservative_table, credible_bounds, optimistic_table
from fleetsieve_bayes.model.inference import Posterior
from fleetsieve_bayes.model.joint import usable_mask

# Two classes on the same two cells each: cell 0/2 (TP1, completion unobserved), cell 1/3 (TP2, measured).
GRID = CellGrid(
    workloads=("chat", "code"),
    workload_idx=np.array([0, 0, 1, 1]),
    tp=np.array([1, 2, 1, 2]),
    load=("L1", "L1", "L1", "L1"),
    offered_rps=np.full(4, 4.0),
    duration_s=np.full(4, 300.0),
)
OBS = np.array([
    [4.0, 0.5, np.nan, 1.0],  # chat TP1: completion p99 unobserved
    [4.0, 0.5, 8.0, 1.0],
    [4.0, 0.5, np.nan, 1.0],  # code TP1: completion p99 unobserved
    [4.0, 0.5, 8.0, 1.0],
])
# chat names completion p99 (≤ 10 s), code does not.
PROBLEM = AllocationProblem(demand=np.array([4.0, 4.0]), critical=np.array([True, True]),
                            floor=np.array([1.0, 1.0]), success_min=np.array([0.99, 0.99]),
                            ttft_max=np.array([1.0, 1.0]), completion_max=np.array([10.0, np.inf]), gpus=8)


def test_model_treats_it_as_unobserved_not_zero() -> None:
    fit = usable_mask(OBS, np.ones(4, bool))
    assert fit[0].tolist() == [True, True, False, True]  # only the missing metric drops out
    assert fit[1].all()


def test_inadmissible_where_the_slo_names_it_admissible_elsewhere() -> None:
    adm = admissible(GRID, OBS, PROBLEM)
    assert adm.tolist() == [False, True, True, True]


def test_bounds_and_allocation_never_commit_chat_to_it() -> None:
    rng = np.random.default_rng(0)
    latent = np.exp(rng.normal(0.0, 0.1, (200, 4, 4)))
    latent[..., 3] = 0.999
    post = Posterior(latent=latent, noise=np.full((200, 4), 0.05), params={}, idata=None)
    b = credible_bounds(post, OBS, np.ones(4, bool), 0.9)
    assert math.isinf(b.lo[0, 2]) and math.isinf(b.hi[0, 2])  # never a made-up completion
    for table in (conservative_table(b), optimistic_table(b)):
        alloc = allocate_milp(GRID, table, PROBLEM)
        assert alloc.feasible
        assert int(alloc.cell[0]) == 1  # chat: the TP2 cell whose completion p99 was measured
        assert int(alloc.cell[1]) == 2  # code (no completion SLO): the cheaper TP1 cell is fine
