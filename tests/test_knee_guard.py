"""The knee guard: a cell beneath a measured one stays in the optimistic table.

The rule (``decision.intervals``, rule 3) is owned once and computed two ways:
from scratch (:func:`guard_state`, bounds) and updated by one measurement
(:func:`guard_after_measuring`, the acquisition kernel's fantasies). They must
agree; the kernel's "measure nothing" tables must equal the certificate's; and
the guard must keep a certificate open that the model alone would close.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.acquisition import (
    AcquisitionConfig,
    candidate_tables,
    kernel_functions,
    prepare_inputs,
)
from fleetsieve_bayes.decision.bounds import conservative_table, credible_bounds, optimistic_table
from fleetsieve_bayes.decision.certificate import CERTIFIED_INFEASIBLE, UNDECIDED, certify
from fleetsieve_bayes.decision.intervals import (
    guard_after_measuring,
    guard_state,
    knee_guard,
    load_ladder,
)
from fleetsieve_bayes.model.inference import Posterior


def test_ladder_orders_loads_within_class_and_tp():
    # class 0: TP1 at loads 1, 2, 4 (given out of order), TP2 at load 1; class 1: TP1 at load 2
    w = np.array([0, 0, 0, 0, 1])
    tp = np.array([1, 1, 1, 2, 1])
    x = np.array([4.0, 1.0, 2.0, 1.0, 2.0])
    one = load_ladder(w, tp, x, 1)
    assert one.near_above[1].tolist() == [False, False, True, False, False]  # load 1 → load 2 only
    assert one.near_above[2].tolist() == [True, False, False, False, False]  # load 2 → load 4
    assert not one.near_above[0].any() and not one.near_above[3].any() and not one.near_above[4].any()
    assert one.below[0].tolist() == [False, True, True, False, False]
    two = load_ladder(w, tp, x, 2)
    assert two.near_above[1].tolist() == [True, False, True, False, False]
    assert not load_ladder(w, tp, x, 0).near_above.any()


def test_another_gpu_type_is_another_ladder():
    # chat TP1 on two GPU types, loads interleaved by offered rate: an L40S cell above a
    # measured H100 cell is not guarded by it, and H100 tails set no L40S floor.
    w = np.array([0, 0, 0, 0])
    tp = np.array([1, 1, 1, 1])
    x = np.array([1.0, 2.0, 1.5, 3.0])
    gpu = np.array([0, 0, 1, 1])
    ladder = load_ladder(w, tp, x, 1, gpu)
    assert ladder.below.tolist() == [[False] * 4, [True, False, False, False],
                                     [False] * 4, [False, False, True, False]]
    assert ladder.near_above[0].tolist() == [False, True, False, False]
    assert ladder.near_above[2].tolist() == [False, False, False, True]
    # H100 @1.0 fast and L40S @3.0 slow measured: the L40S cell beneath its slow one is
    # guarded with no floor (nothing measured beneath it on the L40S), the H100 @2.0 is
    # not guarded (nothing measured above it on the H100) and its floor is the H100's.
    measured = np.array([True, False, False, True])
    obs = np.array([[1.0, 0.2, 2.0, 0.99], [np.nan] * 4, [np.nan] * 4, [1.0, 9.0, 30.0, 0.99]])
    guarded, floor = guard_state(obs, measured, ladder, 0.0)
    assert guarded.tolist() == [False, False, True, False]
    assert floor[:, 0].tolist() == [0.0, 0.2, 0.0, 0.0]
    # One pool: the GPU argument changes nothing.
    one = load_ladder(w, tp, x, 1)
    same = load_ladder(w, tp, x, 1, np.zeros(4, np.int64))
    assert (one.below == same.below).all() and (one.near_above == same.near_above).all()


@st.composite
def _guard_case(draw):
    n = draw(st.integers(2, 9))
    w = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    tp = np.array(draw(st.lists(st.sampled_from([1, 2]), min_size=n, max_size=n)))
    x = np.array(draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)), dtype=float)
    x = x + np.arange(n) * 1e-3  # distinct loads
    measured = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    vals = st.sampled_from([0.0, 0.3, 1.0, 2.5, np.inf, np.nan])
    obs = np.array(draw(st.lists(st.lists(vals, min_size=4, max_size=4), min_size=n, max_size=n)))
    obs[:, 3] = np.clip(np.nan_to_num(obs[:, 3], nan=0.5, posinf=1.0), 0.0, 1.0)
    y = np.array(draw(st.lists(st.lists(vals, min_size=4, max_size=4), min_size=3, max_size=3)))
    y[:, 3] = np.clip(np.nan_to_num(y[:, 3], nan=0.5, posinf=1.0), 0.0, 1.0)
    e = draw(st.integers(0, n))
    steps = draw(st.integers(0, 2))
    r = draw(st.sampled_from([0.0, 0.1]))
    return w, tp, x, measured, obs, y, e, steps, r


@settings(max_examples=150, deadline=None)
@given(_guard_case())
def test_guard_update_equals_recomputation(case):
    w, tp, x, measured, obs, y, e, steps, r = case
    n = len(w)
    ladder = load_ladder(w, tp, x, steps)
    if e < n and measured[e]:
        e = n  # the kernel only measures unmeasured cells
    g0, f0 = guard_state(obs, measured, ladder, r)
    g1, f1 = guard_after_measuring(g0, f0, measured, e, y, ladder, r)
    for k in range(len(y)):
        m_k, o_k = measured.copy(), obs.copy()
        if e < n:
            m_k[e], o_k[e] = True, y[k]
        g_ref, f_ref = guard_state(o_k, m_k, ladder, r)
        assert g1.tolist() == g_ref.tolist()
        np.testing.assert_array_equal(f1[k], f_ref)
    # ... and the JAX namespace gives the same numbers.
    jl = type(ladder)(*map(jnp.asarray, ladder))
    gj, fj = guard_after_measuring(
        jnp.asarray(g0), jnp.asarray(f0), jnp.asarray(measured), jnp.int32(e), jnp.asarray(y), jl, r
    )
    assert np.asarray(gj).tolist() == g1.tolist()
    np.testing.assert_allclose(np.asarray(fj), f1, rtol=1e-6)


def test_guard_only_lowers_guarded_tails():
    lo = np.array([[1.0, 5.0, 50.0, 0.9], [1.0, 5.0, 50.0, 0.9]])
    out = knee_guard(lo, np.array([True, False]), np.array([[0.5, 60.0], [0.1, 0.1]]))
    np.testing.assert_array_equal(out[0], [1.0, 0.5, 50.0, 0.9])  # min with the floor, per tail
    np.testing.assert_array_equal(out[1], lo[1])


# --- the c032 shape: the only admissible cell sits beneath a measured overload ---
# One class, TP4 at three loads. C22 is measured deep in overload (TTFT 3.5 s
# against an SLO of 0.547 s); the model's draws put C20's TTFT at 0.8-2 s (a
# knee fitted too low), C18's at 0.3-0.45 s. Truth: C20 meets the SLO.
GRID = CellGrid(
    workloads=("chat",),
    workload_idx=np.zeros(3, np.int64),
    tp=np.full(3, 4),
    load=("C18", "C20", "C22"),
    offered_rps=np.array([1.8, 2.0, 2.2]),
    duration_s=np.full(3, 300.0),
)
PROBLEM = AllocationProblem(
    demand=np.array([8.0]),
    critical=np.array([True]),
    floor=np.array([1.0]),
    success_min=np.array([0.99]),
    ttft_max=np.array([0.547]),
    completion_max=np.array([np.inf]),
    gpus=16,
)


def _posterior(n: int = 200) -> Posterior:
    rng = np.random.default_rng(0)
    latent = np.empty((n, 3, 4), np.float32)
    latent[:, :, 0] = [1.8, 2.0, 2.1]
    latent[:, 0, 1] = rng.uniform(0.30, 0.45, n)
    latent[:, 1, 1] = rng.uniform(0.8, 2.0, n)
    latent[:, 2, 1] = rng.uniform(3.0, 4.0, n)
    latent[:, :, 2] = 10.0
    latent[:, :, 3] = 0.999
    return Posterior(latent=latent, noise=np.full((n, 4), 0.03, np.float32), params={}, idata=None)


MEASURED = np.array([False, False, True])
OBSERVED = np.array([[np.nan] * 4, [np.nan] * 4, [2.1, 3.5, 40.0, 0.97]])


def _certify(steps: int | None):
    ladder = None if steps is None else load_ladder(GRID.workload_idx, GRID.tp, GRID.offered_rps, steps)
    b = credible_bounds(_posterior(), OBSERVED, MEASURED, 0.9, predictive=False, model_margin=0.0, ladder=ladder)
    cons = allocate_milp(GRID, conservative_table(b), PROBLEM)
    opt = allocate_milp(GRID, optimistic_table(b), PROBLEM)
    return b, opt, certify(GRID, PROBLEM, cons, opt, MEASURED, OBSERVED, 0.05)


def test_model_alone_certifies_infeasible_and_the_guard_keeps_it_open():
    _, _, cert = _certify(None)
    assert cert.status == CERTIFIED_INFEASIBLE  # the false certificate the guard exists for
    b, opt, cert = _certify(1)
    assert cert.status == UNDECIDED
    assert opt.status == "feasible" and opt.cell.tolist() == [1]  # C20 is the optimistic fleet's cell
    assert b.lo[1, 1] == 0.0  # nothing measured beneath C20: no model-free floor
    assert b.lo[0, 1] > 0.29  # C18 is two steps down: the model's bound stands
    np.testing.assert_array_equal(b.hi, _certify(None)[0].hi)  # the conservative side is untouched


def test_measured_cell_below_sets_the_floor():
    measured = np.array([True, False, True])
    observed = OBSERVED.copy()
    observed[0] = [1.8, 0.4, 9.0, 1.0]
    ladder = load_ladder(GRID.workload_idx, GRID.tp, GRID.offered_rps, 1)
    b = credible_bounds(_posterior(), observed, measured, 0.9, predictive=False, model_margin=0.0, ladder=ladder)
    assert b.lo[1, 1] == 0.4 and b.lo[1, 2] == 9.0  # C20 may be as fast as C18 was measured


def test_kernel_reads_the_guarded_table():
    post = _posterior(41)
    ladder = load_ladder(GRID.workload_idx, GRID.tp, GRID.offered_rps, 1)
    b = credible_bounds(post, OBSERVED, MEASURED, 0.9, model_margin=0.1, ladder=ladder)
    config = AcquisitionConfig(n_fantasies=4, credible_level=0.9, knee_guard=1)
    fns = kernel_functions(GRID, PROBLEM, allocator_solve=lambda v: None, knee_guard=1)
    obs = jnp.asarray(np.nan_to_num(OBSERVED, nan=1.0), jnp.float32)
    inp = prepare_inputs(
        jax.random.PRNGKey(0), jnp.asarray(post.latent, jnp.float64), jnp.asarray(post.noise), obs, jnp.asarray(MEASURED), fns, config
    )
    cons_k, opt_k, _, _ = candidate_tables(jnp.int32(3), inp, fns, config)  # measure nothing
    np.testing.assert_allclose(np.asarray(opt_k[0], np.float64), optimistic_table(b), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(cons_k[0], np.float64), conservative_table(b), rtol=2e-6)
    assert float(opt_k[0, 1, 1]) == 0.0
    # Measuring C20 lifts its guard (its own fantasy value stands) and floors nothing above it
    # beyond what was measured; C18 becomes guarded (C20 now sits one step above it).
    _, opt_e, _, _ = candidate_tables(jnp.int32(1), inp, fns, config)
    assert np.all(np.asarray(opt_e[:, 1, 1]) > 0.5)
    assert np.all(np.asarray(opt_e[:, 0, 1]) == 0.0)


# --- a server that cannot start at a TP cannot start there at any load ---


def _record(seq: int, workload: str, tp: int, load: str, failure: str, values: list[float]):
    from fleetsieve_bayes.campaign.journal import Cell, MeasurementRecord

    row = dict(zip(("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate"), values, strict=True))
    row.update(workload=workload, tp=tp, load=load, failure=failure)
    return MeasurementRecord(seq=seq, round=0, phase="design", cell=Cell(workload, tp, load), row=row, gpu_seconds=300.0 * tp)


def test_a_start_up_failure_is_known_at_every_load_of_its_class_and_tp():
    from fleetsieve_bayes.round import measured_state

    grid = CellGrid(
        workloads=("chat", "code"),
        workload_idx=np.array([0, 0, 0, 0, 0, 1, 1]),
        tp=np.array([1, 1, 1, 2, 2, 1, 1]),
        load=("C1", "C2", "C3", "C1", "C2", "C1", "C2"),
        offered_rps=np.array([1.0, 2.0, 3.0, 1.0, 2.0, 1.0, 2.0]),
        duration_s=np.full(7, 300.0),
    )
    records = [
        _record(0, "chat", 1, "C2", "startup-oom", [0.0, 0.0, 0.0, 0.0]),
        _record(1, "chat", 2, "C2", "no-success", [0.0, 0.0, 0.0, 0.0]),  # load-dependent: says nothing of C1
        _record(2, "code", 1, "C1", "memory-guard", [0.0, 0.0, 0.0, 0.0]),
        _record(3, "chat", 1, "C3", "startup-oom", [0.0, 0.0, 0.0, 0.0]),  # measured anyway: kept once, in order
    ]
    measured, observed, order = measured_state(grid, records)
    assert measured.tolist() == [True, True, True, False, True, True, True]
    assert order == [1, 4, 5, 2]  # only the cells that ran
    np.testing.assert_array_equal(observed[0], [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(observed[6], [0.0, 0.0, 0.0, 0.0])
    assert np.isnan(observed[3]).all()


def _pool_record(seq: int, workload: str, tp: int, load: str, gpu: str, failure: str, values: list[float]):
    from fleetsieve_bayes.campaign.journal import Cell

    rec = _record(seq, workload, tp, load, failure, values)
    return rec._replace(cell=Cell(workload, tp, load, gpu), row={**rec.row, "gpu": gpu})


def test_a_start_up_failure_and_an_overload_stay_on_their_gpu_type():
    from fleetsieve_bayes.model.joint import model_data
    from fleetsieve_bayes.round import measured_state, server_failures

    grid = CellGrid(
        workloads=("chat",),
        workload_idx=np.zeros(6, np.int64),
        tp=np.ones(6, np.int64),
        load=("C1", "C2", "C3", "C1", "C2", "C3"),
        offered_rps=np.array([1.0, 2.0, 3.0, 0.5, 1.0, 1.5]),
        duration_s=np.full(6, 300.0),
        gpu=np.array([0, 0, 0, 1, 1, 1]),
        pools=("h100-sxm-80gb", "l40s-48gb"),
    )
    ok = [1.0, 0.5, 5.0, 0.99]
    records = [
        _pool_record(0, "chat", 1, "C2", "l40s-48gb", "startup-oom", [0.0, 0.0, 0.0, 0.0]),
        _pool_record(1, "chat", 1, "C1", "h100-sxm-80gb", "", ok),
    ]
    measured, observed, _ = measured_state(grid, records)
    # the L40S OOM is known at every L40S load, never at an H100 one
    assert measured.tolist() == [True, False, False, True, True, True]
    server = server_failures(grid, records)
    assert server.tolist() == [False, False, False, True, True, True]
    # An H100 failure above a working H100 load is overload; an L40S failure whose only
    # working load beneath it (by offered rate) is an H100 one is not.
    records = [
        _pool_record(0, "chat", 1, "C1", "h100-sxm-80gb", "", ok),
        _pool_record(1, "chat", 1, "C2", "h100-sxm-80gb", "", [0.0, 0.0, 0.0, 0.0]),
        _pool_record(2, "chat", 1, "C3", "l40s-48gb", "", [0.0, 0.0, 0.0, 0.0]),
    ]
    measured, observed, _ = measured_state(grid, records)
    data = model_data(grid, observed, measured, server_failed=server_failures(grid, records))
    assert [grid.describe(c) for c in np.flatnonzero(np.asarray(data.failed_under_load))] == [grid.describe(1)]


def test_only_a_failure_under_load_reads_as_overload():
    """A run that failed above a working load of its TP is evidence of overload
    in the model (``failed_under_load``); a server that never served — start-up
    OOM (and the loads it is inferred for), a flaky start-up timeout, the memory
    guard — is not, wherever it sits."""
    from fleetsieve_bayes.model.joint import model_data
    from fleetsieve_bayes.round import measured_state, server_failures

    grid = CellGrid(
        workloads=("chat", "code"),
        workload_idx=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1]),
        tp=np.array([1, 1, 1, 2, 2, 2, 1, 1, 1]),
        load=("C1", "C2", "C3", "C1", "C2", "C3", "C1", "C2", "C3"),
        offered_rps=np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0]),
        duration_s=np.full(9, 300.0),
    )
    ok = [1.0, 0.5, 5.0, 0.99]
    records = [
        _record(0, "chat", 1, "C2", "startup-oom", [0.0, 0.0, 0.0, 0.0]),
        _record(1, "chat", 2, "C1", "", ok),
        _record(2, "chat", 2, "C2", "no-success", [0.0, 0.0, 0.0, 0.0]),  # fell over under load
        _record(3, "code", 1, "C1", "", ok),
        _record(4, "code", 1, "C2", "startup-timeout", [0.0, 0.0, 0.0, 0.0]),  # a flaky start-up
        _record(5, "code", 1, "C3", "", [0.0, 0.0, 0.0, 0.0]),  # zeros, no label: a failed run
        _record(6, "chat", 2, "C3", "", ok),  # chat TP2 works above its failure: a fluke
    ]
    measured, observed, _ = measured_state(grid, records)
    server = server_failures(grid, records)
    assert [grid.describe(c) for c in np.flatnonzero(server)] == [
        "chat TP1@C1", "chat TP1@C2", "chat TP1@C3", "code TP1@C2"
    ]
    data = model_data(grid, observed, measured, server_failed=server)
    assert [grid.describe(c) for c in np.flatnonzero(np.asarray(data.failed_under_load))] == ["code TP1@C3"]
    # before chat TP2@C3 worked, its failure at C2 read as overload
    measured_5, observed_5, _ = measured_state(grid, records[:6])
    data = model_data(grid, observed_5, measured_5, server_failed=server_failures(grid, records[:6]))
    assert [grid.describe(c) for c in np.flatnonzero(np.asarray(data.failed_under_load))] == [
        "chat TP2@C2", "code TP1@C3"
    ]
    # without the server failures, the flaky start-up would read as overload
    data = model_data(grid, observed, measured)
    assert "code TP1@C2" in [grid.describe(c) for c in np.flatnonzero(np.asarray(data.failed_under_load))]
