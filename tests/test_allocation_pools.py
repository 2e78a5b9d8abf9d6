"""Allocation over several GPU pools: known answers, and MILP == JAX == brute force.

The oracle enumerates every (cell, replicas) choice of every class — a cell
runs on its pool — and applies the five lexicographic stages of
:mod:`fleetsieve_bayes.allocation.objective` with the same relative tolerance:
critical floors, max min-fulfillment, max goodput, min dollars per hour
(keeping ``cost ≤ c*·(1 + tol)``), min GPUs. Capacities, demands and prices
sit on coarse grids (quarters, halves), so distinct stage values differ by far
more than the tolerance.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_allocation_milp import KNOWN_CASES, build_case

from fleetsieve_bayes.allocation.batched import allocate_jax, jax_problem, solve_jax_problem
from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, allocation_from_choice, within
from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    CellGrid,
    admissible,
    allocation_to_json,
    within_cap,
)
from fleetsieve_bayes.errors import InputError

_padded_solve = jax.jit(solve_jax_problem, static_argnames=("max_gpus", "tol"))


def brute_force(grid: CellGrid, values: np.ndarray, problem: AllocationProblem, tol: float = DEFAULT_TOL):
    """``(feasible, min_fulfillment, goodput, usd_per_hour, gpus)`` of the lexicographic optimum."""
    adm = admissible(grid, values, problem)
    lam = problem.demand
    n_p = grid.n_pools
    counts = np.minimum(np.asarray(problem.pool_gpus, np.int64), problem.gpus)
    price = np.asarray(problem.usd_per_gpu_hour, np.float64)
    pool = grid.gpu_idx
    options = []  # per class: (served, gpus, pool) of every choice, "nothing" first
    for i in range(grid.n_classes):
        opts = [(0.0, 0, 0)]
        for q in np.flatnonzero(adm & (grid.workload_idx == i)):
            tp, p = int(grid.tp[q]), int(pool[q])
            opts += [(min(lam[i], n * values[q, 0]), n * tp, p) for n in range(1, counts[p] // tp + 1)]
        options.append(np.array(opts))
    combos = np.array(list(itertools.product(*[range(len(o)) for o in options])))
    served = np.stack([options[i][combos[:, i], 0] for i in range(grid.n_classes)], axis=1)
    gpus = np.stack([options[i][combos[:, i], 1] for i in range(grid.n_classes)], axis=1)
    on = np.stack([options[i][combos[:, i], 2] for i in range(grid.n_classes)], axis=1).astype(int)
    by_pool = np.stack([np.sum(np.where(on == p, gpus, 0), axis=1) for p in range(n_p)], axis=1)
    used = by_pool.sum(axis=1)
    cost = by_pool @ price
    r = served / lam
    ok = (
        np.all(by_pool <= counts, axis=1)
        & (used <= problem.gpus)
        & (cost <= within_cap(problem.usd_per_hour_max, tol))
        & np.all(~problem.critical | (r >= within(problem.floor, tol)), axis=1)
    )
    if not ok.any():
        return (False, 0.0, 0.0, 0.0, 0)
    t = r.min(axis=1)
    keep = ok & (t >= within(t[ok].max(), tol))
    g = served.sum(axis=1)
    keep &= g >= within(g[keep].max(), tol)
    keep &= cost <= within_cap(cost[keep].min(), tol)
    best = np.flatnonzero(keep)[np.argmin(used[keep])]
    return (True, float(t[best]), float(g[best]), float(cost[best]), int(used[best]))


def _check(alloc, grid, values, problem) -> None:
    feasible, t, g, usd, used = brute_force(grid, values, problem)
    assert alloc.feasible == feasible
    if not feasible:
        assert alloc.usd_per_hour == 0.0 and alloc.gpus_used == 0
        return
    assert alloc.min_fulfillment == pytest.approx(t, rel=1e-5, abs=1e-9)
    assert alloc.goodput_rps == pytest.approx(g, rel=1e-5, abs=1e-9)
    assert alloc.usd_per_hour == pytest.approx(usd, rel=1e-9, abs=1e-9)
    assert alloc.gpus_used == used
    # The constraints hold: own admissible cells, per-pool counts, total, cap, floors.
    adm = admissible(grid, values, problem)
    for i in range(grid.n_classes):
        c = int(alloc.cell[i])
        if c >= 0:
            assert grid.workload_idx[c] == i and adm[c] and alloc.replicas[i] > 0
    assert np.all(alloc.pool_gpus_used <= problem.pool_gpus)
    assert alloc.gpus_used <= problem.gpus
    assert alloc.usd_per_hour <= within_cap(problem.usd_per_hour_max, DEFAULT_TOL)


# ----------------------------------------------------------------------------- known answers

POOLS = ("h100-sxm-80gb", "a100-80gb")
# chat on H100: TP4 10 req/s; on A100: TP4 4 req/s. code on H100: TP2 3 req/s; on A100: TP2 2 req/s.
GRID = CellGrid(
    workloads=("chat", "code"),
    workload_idx=np.array([0, 0, 1, 1]),
    tp=np.array([4, 4, 2, 2]),
    load=("C64", "C64", "C16", "C16"),
    offered_rps=np.ones(4),
    duration_s=np.full(4, 300.0),
    gpu=np.array([0, 1, 0, 1]),
    pools=POOLS,
)
VALUES = np.array([[10.0, 1, 10, 1], [4.0, 1, 10, 1], [3.0, 1, 10, 1], [2.0, 1, 10, 1]])
PROBLEM = AllocationProblem(
    demand=np.array([10.0, 6.0]),
    critical=np.zeros(2, bool),
    floor=np.ones(2),
    success_min=np.full(2, 0.99),
    ttft_max=np.full(2, np.inf),
    completion_max=np.full(2, np.inf),
    gpus=16,
    pool_gpus=np.array([8, 8]),
    usd_per_gpu_hour=np.array([4.0, 2.0]),
)

# (id, problem changes, {class: (gpu, tp, replicas)}, min r, goodput, $/h, GPUs)
POOL_CASES = [
    # Full service: chat needs the H100 (A100 ×2 serves 8 < 10 within 8 GPUs);
    # code on H100 ×2 = 4 GPUs $16, on A100 ×3 = 6 GPUs $12: dollars before GPUs.
    ("cheapest", {}, {"chat": ("h100-sxm-80gb", 4, 1), "code": ("a100-80gb", 2, 3)}, 1.0, 16.0, 28.0, 10),
    # A 27 $/h cap: chat H100 ($16) leaves $11 → code A100 ×2 (4 req/s, r 0.667);
    # chat A100 ×2 + code A100 ×2 ties on r but serves 12 < 14.
    (
        "cap-27",
        {"usd_per_hour_max": 27.0},
        {"chat": ("h100-sxm-80gb", 4, 1), "code": ("a100-80gb", 2, 2)},
        4.0 / 6.0,
        14.0,
        24.0,
        8,
    ),
    # 8 GPUs in all: chat H100 (4) + code A100 (6) no longer fits; code H100 ×2 does ($32).
    ("total-8", {"gpus": 8}, {"chat": ("h100-sxm-80gb", 4, 1), "code": ("h100-sxm-80gb", 2, 2)}, 1.0, 16.0, 32.0, 8),
    # H100 pool of 4: the same as "cheapest" (code was on the A100 anyway).
    (
        "h100-4",
        {"pool_gpus": np.array([4, 8])},
        {"chat": ("h100-sxm-80gb", 4, 1), "code": ("a100-80gb", 2, 3)},
        1.0,
        16.0,
        28.0,
        10,
    ),
    # No H100s: chat A100 ×2 (8 GPUs, r 0.8) leaves nothing for code (r 0) — or
    # chat ×1 (r 0.4) + code ×2 (r 0.667): min 0.4 wins, goodput 4 + 4.
    (
        "a100-only",
        {"pool_gpus": np.array([0, 8])},
        {"chat": ("a100-80gb", 4, 1), "code": ("a100-80gb", 2, 2)},
        0.4,
        8.0,
        16.0,
        8,
    ),
    # Code critical at 1.0 under a 20 $/h cap, 12 A100s: code A100 ×3 ($12) leaves
    # exactly $8, chat A100 ×1 (r 0.4): a fleet costing the cap is within it.
    (
        "critical-cap-20",
        {"usd_per_hour_max": 20.0, "critical": np.array([False, True]), "pool_gpus": np.array([8, 12])},
        {"chat": ("a100-80gb", 4, 1), "code": ("a100-80gb", 2, 3)},
        0.4,
        10.0,
        20.0,
        10,
    ),
    # ... under 19 $/h: $7 left, no chat cell fits.
    (
        "critical-cap-19",
        {"usd_per_hour_max": 19.0, "critical": np.array([False, True]), "pool_gpus": np.array([8, 12])},
        {"chat": None, "code": ("a100-80gb", 2, 3)},
        0.0,
        6.0,
        12.0,
        6,
    ),
    # Both critical at 1.0 under 20 $/h: chat needs the H100 ($16) + code $12 → infeasible.
    ("critical-infeasible", {"usd_per_hour_max": 20.0, "critical": np.array([True, True])}, None, 0, 0, 0, 0),
]


@pytest.mark.parametrize("solver", ["milp", "jax"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_known_answers(case: tuple, solver: str) -> None:
    _, changes, expected, min_f, goodput, usd, gpus = case
    problem = PROBLEM._replace(**changes)
    alloc = (allocate_milp if solver == "milp" else allocate_jax)(GRID, VALUES, problem)
    _check(alloc, GRID, VALUES, problem)
    if expected is None:
        assert alloc.status == "infeasible" and allocation_to_json(alloc, GRID) is None
        return
    got = allocation_to_json(alloc, GRID)
    want = {}
    for w, e in expected.items():
        if e is None:
            want[w] = {"tp": None, "load": None, "replicas": 0, "gpu": None}
        else:
            gpu, tp, n = e
            want[w] = {"tp": tp, "load": "C64" if w == "chat" else "C16", "replicas": n, "gpu": gpu}
    assert got == want
    assert alloc.min_fulfillment == pytest.approx(min_f, abs=1e-9)
    assert alloc.goodput_rps == pytest.approx(goodput, abs=1e-9)
    assert alloc.usd_per_hour == pytest.approx(usd, abs=1e-9)
    assert alloc.gpus_used == gpus


@pytest.mark.parametrize("solver", ["milp", "jax"])
@pytest.mark.parametrize("case", KNOWN_CASES, ids=[c[0] for c in KNOWN_CASES])
def test_one_named_priced_pool_changes_nothing_but_reports_dollars(case: tuple, solver: str) -> None:
    """The shipped-grid answers with the one pool named and priced: same cells, usd = price × GPUs."""
    grid, values, problem = build_case(case)
    fn = allocate_milp if solver == "milp" else allocate_jax
    plain = fn(grid, values, problem)
    named = grid._replace(gpu=np.zeros(grid.n_cells, np.int64), pools=("h100-sxm-80gb",))
    priced_problem = problem._replace(pool_gpus=np.array([problem.gpus]), usd_per_gpu_hour=np.array([2.5]))
    alloc = fn(named, values, priced_problem)
    assert alloc.status == plain.status
    assert list(alloc.cell) == list(plain.cell) and list(alloc.replicas) == list(plain.replicas)
    assert (alloc.min_fulfillment, alloc.goodput_rps, alloc.gpus_used) == (
        plain.min_fulfillment,
        plain.goodput_rps,
        plain.gpus_used,
    )
    assert plain.usd_per_hour is None
    assert alloc.usd_per_hour == pytest.approx(2.5 * plain.gpus_used)


@pytest.mark.parametrize("solver", ["milp", "jax"])
def test_one_pool_dollar_cap_is_a_gpu_budget(solver: str) -> None:
    """One pool at 2 $/GPU-h under a 20 $/h cap solves exactly like a 10-GPU budget."""
    grid, values, problem = build_case(KNOWN_CASES[0])
    fn = allocate_milp if solver == "milp" else allocate_jax
    capped = fn(grid, values, problem._replace(usd_per_gpu_hour=np.array([2.0]), usd_per_hour_max=20.0))
    ten = fn(grid, values, problem._replace(gpus=10))
    assert list(capped.cell) == list(ten.cell) and list(capped.replicas) == list(ten.replicas)
    assert capped.gpus_used == ten.gpus_used <= 10
    assert capped.usd_per_hour == pytest.approx(2.0 * ten.gpus_used)


# ----------------------------------------------------------------------------- CBC regressions

# Two instances on which CBC's clique strengthening went wrong (now off in milp_pools.py):
# a 2.0 $/h fleet returned as the stage-4 optimum (1.5 $/h: code on the cheaper pool),
# and a feasible stage-4 model declared infeasible. Both fully served at 1.5 $/h, 3 GPUs.
_CBC_GRID = CellGrid(
    workloads=("w0", "w1"),
    workload_idx=np.array([0, 0, 0, 1, 1, 1, 1]),
    tp=np.ones(7, np.int64),
    load=tuple(f"L{i}" for i in range(7)),
    offered_rps=np.ones(7),
    duration_s=np.full(7, 60.0),
    gpu=np.array([0, 0, 2, 0, 0, 1, 1]),
    pools=("gpu0", "gpu1", "gpu2"),
)
_CBC_VALUES = np.array([[0.25, 0.5, 10.0, s] for s in (0.98, 0.98, 1.0, 0.98, 1.0, 0.98, 1.0)])
_CBC_PROBLEM = AllocationProblem(
    demand=np.array([0.75, 0.25]),
    critical=np.array([True, False]),
    floor=np.array([0.25, 0.25]),
    success_min=np.full(2, 0.99),
    ttft_max=np.full(2, 2.0),
    completion_max=np.full(2, np.inf),
    gpus=3,
    pool_gpus=np.array([1, 1, 2]),
    usd_per_gpu_hour=np.array([1.0, 0.5, 0.5]),
)
_CBC_VALUES_2 = _CBC_VALUES.copy()
_CBC_VALUES_2[2, 0] = 0.5  # w0's one admissible cell serves 0.5 req/s per replica
CBC_CASES = [
    (_CBC_VALUES_2, _CBC_PROBLEM, 1.0),
    (
        _CBC_VALUES,
        _CBC_PROBLEM._replace(
            demand=np.array([0.5, 0.25]), critical=np.array([False, True]), usd_per_gpu_hour=np.full(3, 0.5)
        ),
        0.75,
    ),
]


@pytest.mark.parametrize("solver", ["milp", "jax"])
@pytest.mark.parametrize("case", range(len(CBC_CASES)))
def test_cbc_clique_strengthening_regressions(case: int, solver: str) -> None:
    values, problem, goodput = CBC_CASES[case]
    alloc = (allocate_milp if solver == "milp" else allocate_jax)(_CBC_GRID, values, problem)
    _check(alloc, _CBC_GRID, values, problem)
    assert alloc.min_fulfillment == 1.0 and alloc.goodput_rps == goodput
    assert alloc.usd_per_hour == 1.5 and alloc.gpus_used == 3


# ----------------------------------------------------------------------------- random agreement

MAX_POOLS, MAX_CLASSES, MAX_CELLS, MAX_POOL_GPUS, LEVELS = 3, 3, 24, 5, (1, 2, 4)
_PRICE = st.integers(1, 8).map(lambda k: k / 2)  # $/GPU-h on a half grid


@st.composite
def pool_instances(draw: st.DrawFn) -> tuple[CellGrid, np.ndarray, AllocationProblem]:
    n_p = draw(st.integers(2, MAX_POOLS))
    k = draw(st.integers(1, MAX_CLASSES))
    rows = []
    for i in range(k):
        for p in range(n_p):
            for _ in range(draw(st.integers(0, 2))):
                tp = draw(st.sampled_from(LEVELS))
                rows.append(
                    (
                        i,
                        p,
                        tp,
                        draw(st.integers(1, 24)) / 4 * tp,  # capacity per replica, quarter grid
                        draw(st.sampled_from([0.5, 3.0])),
                        draw(st.sampled_from([0.98, 1.0])),
                    )
                )
    if not rows:
        rows.append((0, 0, 1, 1.0, 0.5, 1.0))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))  # the grid's order: class, pool, TP
    a = np.array(rows, dtype=np.float64)
    n = len(rows)
    grid = CellGrid(
        workloads=tuple(f"w{i}" for i in range(k)),
        workload_idx=a[:, 0].astype(np.int64),
        tp=a[:, 2].astype(np.int64),
        load=tuple(f"L{j}" for j in range(n)),
        offered_rps=np.ones(n),
        duration_s=np.full(n, 60.0),
        gpu=a[:, 1].astype(np.int64),
        pools=tuple(f"gpu{p}" for p in range(n_p)),
    )
    values = np.stack([a[:, 3], a[:, 4], np.full(n, 10.0), a[:, 5]], axis=1)
    counts = np.array(draw(st.lists(st.integers(0, MAX_POOL_GPUS), min_size=n_p, max_size=n_p)))
    total = int(counts.sum()) if draw(st.booleans()) else draw(st.integers(1, max(1, int(counts.sum()))))
    price = np.array(draw(st.lists(_PRICE, min_size=n_p, max_size=n_p)))
    cap = np.inf if draw(st.booleans()) else draw(st.integers(1, 40)) / 2
    problem = AllocationProblem(
        demand=np.array(draw(st.lists(st.integers(1, 60), min_size=k, max_size=k))) / 4,
        critical=np.array(draw(st.lists(st.booleans(), min_size=k, max_size=k))) & draw(st.booleans()),
        floor=np.array(draw(st.lists(st.sampled_from([0.25, 0.5, 1.0]), min_size=k, max_size=k))),
        success_min=np.full(k, 0.99),
        ttft_max=np.array(draw(st.lists(st.sampled_from([2.0, np.inf]), min_size=k, max_size=k))),
        completion_max=np.full(k, np.inf),
        gpus=total,
        pool_gpus=counts,
        usd_per_gpu_hour=price,
        usd_per_hour_max=float(cap),
    )
    return grid, values, problem


def _padded_jax(
    grid: CellGrid, values: np.ndarray, problem: AllocationProblem, axes: int | tuple[int, ...] = MAX_POOL_GPUS
):
    """The JAX allocator at one padded shape (3 pools, 3 classes, 24 cells; ``axes``: 5 GPUs
    on every pool's axis, or each pool's own)."""
    n_p = grid.n_pools
    if n_p < MAX_POOLS:  # pad with empty pools: no cells, no GPUs
        extra = MAX_POOLS - n_p
        grid = grid._replace(pools=grid.pools + tuple(f"pad{j}" for j in range(extra)))
        problem = problem._replace(
            pool_gpus=np.concatenate([problem.pool_gpus, np.zeros(extra, np.int64)]),
            usd_per_gpu_hour=np.concatenate([problem.usd_per_gpu_hour, np.ones(extra)]),
        )
    spec = jax_problem(grid, problem, n_cells=MAX_CELLS, n_classes=MAX_CLASSES, tp_levels=LEVELS)
    padded = np.zeros((MAX_CELLS, 4))
    padded[: grid.n_cells] = values
    out = _padded_solve(spec, jnp.asarray(padded), max_gpus=axes, tol=DEFAULT_TOL)
    k = grid.n_classes
    alloc = allocation_from_choice(
        grid, values, problem, np.asarray(out.cell)[:k], np.asarray(out.replicas)[:k], feasible=bool(out.feasible)
    )
    assert int(out.gpus_used) == alloc.gpus_used
    assert float(out.usd_per_hour) == pytest.approx(alloc.usd_per_hour, rel=1e-6)
    if alloc.pool_gpus_used is None:
        return alloc
    assert not alloc.pool_gpus_used[n_p:].any()  # nothing on a padding pool
    return alloc._replace(pool_gpus_used=alloc.pool_gpus_used[:n_p])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_instances())
def test_milp_matches_brute_force_on_pools(inst) -> None:
    _check(allocate_milp(*inst), *inst)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_instances())
def test_jax_matches_brute_force_on_pools(inst) -> None:
    _check(_padded_jax(*inst), *inst)


# Each pool's own axis (pool p uses 0 … OWN_AXES[p] GPUs): fewer states than 6^3.
OWN_AXES = (3, 5, 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_instances())
def test_jax_on_each_pools_own_axis_matches_brute_force(inst) -> None:
    """Pools of different sizes on axes of their own sizes (the states ∏ (G_p + 1), as
    make_jax_allocator and allocate_jax build them) give the brute-force optimum."""
    grid, values, problem = inst
    own = np.minimum(problem.pool_gpus, OWN_AXES[: grid.n_pools])
    problem = problem._replace(pool_gpus=own, gpus=min(int(problem.gpus), int(own.sum())))
    _check(_padded_jax(grid, values, problem, OWN_AXES), grid, values, problem)


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_instances())
def test_milp_jax_brute_force_agree_on_pools_many(inst) -> None:
    _check(allocate_milp(*inst), *inst)
    _check(_padded_jax(*inst), *inst)


def test_jax_refuses_a_pool_state_space_too_large() -> None:
    """3 pools of 128 GPUs: 129^4 ≈ 2.8e8 > 2^26; the MILP solves it."""
    big = PROBLEM._replace(pool_gpus=np.array([128, 128]), gpus=256)
    grid3 = GRID._replace(pools=(*POOLS, "l40s-48gb"))
    big3 = big._replace(pool_gpus=np.array([128, 128, 128]), usd_per_gpu_hour=np.array([4.0, 2.0, 1.0]), gpus=384)
    with pytest.raises(InputError, match=r"3-pool state space \(129 × 129 × 129 states × 129\) is over 6.71e\+07; solve it with the MILP"):
        allocate_jax(grid3, VALUES, big3)
    a = allocate_milp(grid3, VALUES, big3)
    assert a.feasible and a.min_fulfillment == 1.0 and a.usd_per_hour == 28.0
    assert allocate_jax(GRID, VALUES, big).usd_per_hour == 28.0  # 2 pools: 129^3 ≈ 2.1e6, fine


def test_batched_pool_allocator_matches_the_milp_per_table() -> None:
    """make_jax_allocator on several pools: a (2, 3) batch inside jit + vmap, each table its MILP answer."""
    from fleetsieve_bayes.allocation.batched import make_jax_allocator

    problem = PROBLEM._replace(usd_per_hour_max=27.0)
    alloc = make_jax_allocator(GRID, problem)
    tables = []
    for scale in (1.0, 0.5, 2.0, 1.5, 0.75, 1.25):
        v = VALUES.copy()
        v[:, 0] *= scale
        tables.append(v)
    batch = np.stack(tables).reshape(2, 3, *VALUES.shape)
    out = jax.jit(jax.vmap(alloc.solve))(jnp.asarray(batch))
    assert out.cell.shape == (2, 3, 2) and out.usd_per_hour.shape == (2, 3)
    for b in range(2):
        for j in range(3):
            m = allocate_milp(GRID, batch[b, j], problem)
            assert bool(out.feasible[b, j]) == m.feasible
            assert float(out.min_fulfillment[b, j]) == pytest.approx(m.min_fulfillment, abs=1e-6)
            assert float(out.goodput[b, j]) == pytest.approx(m.goodput_rps, rel=1e-6)
            assert float(out.usd_per_hour[b, j]) == pytest.approx(m.usd_per_hour, rel=1e-6)
            assert int(out.gpus_used[b, j]) == m.gpus_used
