"""Several cells at once: pool keys, GPU packing, believer batches, the asynchronous driver (simulated clock)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from shipped import point_text

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.executor import GpuPool
from fleetsieve_bayes.campaign.makespan import cell_key, in_flight_cells, profiling_wall_s
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.settings import DecisionSettings

SHIPPED = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
GRID = SHIPPED.parent / "grid.csv"

# The decision trail of the shipped campaign at "point" on a pool of 16 GPUs (simulated clock,
# seed 0): (profiling_wall_s, gpu_seconds, cells measured). One exact value, pinned from this
# machine: a change in the campaign's decisions must show here.
POOL_TRAIL = (900.0, 10800.0, 8)


def pooled_campaign(tmp: Path, extra: str = "pool_gpus = 16", name: str = "c.toml") -> Path:
    text = point_text().replace('table = "grid.csv"', f'table = "{GRID}"\n{extra}')
    p = tmp / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------- campaign keys


def test_pool_keys_parse_and_default_to_one_cell_at_a_time(tmp_path: Path) -> None:
    assert not load_campaign(SHIPPED).pool.parallel
    c = load_campaign(pooled_campaign(tmp_path, 'pool_gpus = 8\nexecutor = "ray"\nray_address = "auto"'))
    assert (c.pool.pool_gpus, c.pool.executor, c.pool.ray_address) == (8, "ray", "auto")
    assert c.pool.parallel
    # The backend never sees the pool keys.
    assert "pool_gpus" not in c.measurement.options


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("pool_gpus = 0", "[measurement] pool_gpus: must be >= 1, got 0"),
        ("pool_gpus = 2.5", "[measurement] pool_gpus: expected an integer, got 2.5"),
        ('executor = "slurm"', "[measurement] executor: unknown executor 'slurm'; choose one of local, ray"),
        ('ray_address = "auto"', '[measurement] ray_address: only meaningful with executor = "ray"'),
        ("pool_gpu = 8", "unknown key 'pool_gpu'"),
    ],
)
def test_bad_pool_keys_are_one_line_errors(tmp_path: Path, extra: str, message: str) -> None:
    from fleetsieve_bayes.backends import make_backend

    with pytest.raises(InputError) as err:  # a misspelt key is the backend's: refused when it is built
        make_backend(load_campaign(pooled_campaign(tmp_path, extra)), tmp_path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_pool_smaller_than_the_largest_tp_is_refused(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.runner import run_campaign

    with pytest.raises(InputError, match=r"pool_gpus: 4 GPUs cannot hold cell chat TP8@.*use at least 8"):
        run_campaign(load_campaign(pooled_campaign(tmp_path, "pool_gpus = 4")), tmp_path / "out")


# ----------------------------------------------------------------------------- GPU packing


def test_gpu_pool_packs_aligned_blocks_and_a_tp8_waits() -> None:
    pool = GpuPool(16)
    assert pool.take(2) == (0, 1)
    assert pool.take(4) == (4, 5, 6, 7)  # aligned: 2-3 stay free for another TP2
    assert pool.take(8) == (8, 9, 10, 11, 12, 13, 14, 15)
    assert pool.take(2) == (2, 3)
    assert pool.take(2) is None and pool.n_free == 0
    pool.give((0, 1))
    pool.give((4, 5, 6, 7))
    assert pool.take(8) is None  # 6 free: a TP8 cell waits
    assert pool.take(4) == (4, 5, 6, 7)


def test_gpu_pool_by_type_hands_out_slots_of_the_cells_own_group() -> None:
    pool = GpuPool(12, sizes=(8, 4))  # 8 slots of type 0, then 4 of type 1
    assert pool.take(4, group=1) == (8, 9, 10, 11)
    assert pool.take(1, group=1) is None and not pool.fits(1, group=1)  # type 0's free slots do not count
    assert pool.fits(8, group=0) and pool.take(2, group=0) == (0, 1)
    assert pool.take(2, prefer=(8, 9), group=0) == (2, 3)  # a preferred slot of another group is ignored
    assert (pool.free_in(0), pool.free_in(1), pool.n_free) == (4, 0, 4)
    pool.give((8, 9))
    assert pool.take(2, prefer=(8, 9), group=1) == (8, 9)
    with pytest.raises(ValueError, match="do not add up"):
        GpuPool(12, sizes=(8, 8))


@given(
    st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(0, 2), st.booleans()), max_size=60),
    st.tuples(st.integers(4, 8), st.integers(4, 8), st.integers(4, 8)),
)
def test_gpu_pool_by_type_never_mixes_groups_or_hands_out_a_gpu_twice(
    ops: list[tuple[int, int, bool]], sizes: tuple[int, int, int]
) -> None:
    pool = GpuPool(sum(sizes), sizes=sizes)
    lo = [0, sizes[0], sizes[0] + sizes[1]]
    held: list[tuple[int, ...]] = []
    for tp, group, release in ops:
        if release and held:
            pool.give(held.pop(0))
            continue
        ids = pool.take(tp, group=group)
        in_use = {g for h in held for g in h}
        mine = set(range(lo[group], lo[group] + sizes[group]))
        if ids is None:
            assert len(mine - in_use) < tp
        else:
            assert len(ids) == tp and set(ids) <= mine and not set(ids) & in_use
            held.append(ids)


@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.booleans()), max_size=60))
def test_gpu_pool_never_hands_out_a_gpu_twice(ops: list[tuple[int, bool]]) -> None:
    pool = GpuPool(16)
    held: list[tuple[int, ...]] = []
    for tp, release in ops:
        if release and held:
            pool.give(held.pop(0))
            continue
        ids = pool.take(tp)
        in_use = {g for h in held for g in h}
        if ids is None:
            assert 16 - len(in_use) < tp
        else:
            assert len(ids) == tp and not set(ids) & in_use and all(0 <= g < 16 for g in ids)
            held.append(ids)
        assert pool.n_free == 16 - sum(len(h) for h in held)


# ----------------------------------------------------------------------------- makespan


def _cell(w: str, tp: int, load: str) -> dict[str, Any]:
    return {"workload": w, "tp": tp, "load": load}


def test_profiling_wall_is_the_union_of_cell_intervals() -> None:
    a, b, c = _cell("chat", 2, "C1"), _cell("chat", 4, "C1"), _cell("code", 8, "C1")
    row = {"duration_s": 300.0}
    recs = [
        {"type": "started", "cell": a, "start_s": 0.0},
        {"type": "started", "cell": b, "start_s": 100.0},
        {"type": "measurement", "cell": a, "row": row, "wall_s": 0.0},
        {"type": "finished", "cell": a, "start_s": 0.0, "finish_s": 300.0},
        {"type": "measurement", "cell": b, "row": row, "wall_s": 0.0},  # no finished record: start + duration
        {"type": "started", "cell": c, "start_s": 500.0},
        {"type": "cancelled", "cell": c, "start_s": 500.0, "finish_s": 550.0},
    ]
    assert profiling_wall_s(recs) == pytest.approx(400.0 + 50.0)
    assert in_flight_cells(recs) == []
    assert [r["cell"] for r in in_flight_cells(recs[:2])] == [a, b]
    # One at a time (no started record): occupancies add up; real time wins over the window.
    seq = [
        {"type": "measurement", "cell": a, "row": row, "wall_s": 0.01},
        {"type": "measurement", "cell": b, "row": {"duration_s": 300.0, "startup_s": 60.0}, "wall_s": 400.0},
    ]
    assert profiling_wall_s(seq) == pytest.approx(300.0 + 400.0)


# ----------------------------------------------------------------------------- believer batches


class _Cert(NamedTuple):
    status: str
    gap: Any = None


def test_plan_batch_conditions_each_pick_and_stops_when_the_belief_certifies() -> None:
    from fleetsieve_bayes.decision.batch import Belief, plan_batch

    seen: list[tuple[int, ...]] = []

    def believe_fn(believed: Any) -> Belief:
        seen.append(tuple(believed))
        # Certified once 3 cells are believed (two in flight + one pick).
        status = "certified-feasible" if len(believed) >= 3 else "undecided"
        m = np.zeros(6, bool)
        m[list(believed)] = True
        return Belief(m, None, None, None, None, _Cert(status))

    def select(belief: Belief, round_no: int) -> int:
        return int(np.flatnonzero(~belief.measured)[0])  # lowest unbelieved cell

    plan = plan_batch(
        believe_fn=believe_fn,
        select=select,
        candidates=np.array([False, False, True, True, True, True]),
        in_flight=[0, 1],
        admit=lambda c, reserved, believed: True,
        first_round=5,
        max_picks=8,
    )
    assert [p.cell for p in plan.picks] == [2]
    assert plan.picks[0].believed == (0, 1) and plan.picks[0].round == 5
    assert seen == [(0, 1), (0, 1, 2)]
    assert "waiting for the 3 cell(s) in flight" in plan.stop


def test_plan_batch_reserves_a_cell_that_does_not_fit_and_backfills() -> None:
    from fleetsieve_bayes.decision.batch import Belief, plan_batch

    def believe_fn(believed: Any) -> Belief:
        m = np.zeros(5, bool)
        m[list(believed)] = True
        return Belief(m, None, None, None, None, _Cert("undecided"))

    admits: list[tuple[int, int | None]] = []

    def admit(c: int, reserved: int | None, believed: tuple[int, ...]) -> bool:
        admits.append((c, reserved))
        return c != 0 and c != 2  # cells 0 and 2 are too big for the free GPUs

    plan = plan_batch(
        believe_fn=believe_fn,
        select=lambda b, r: int(np.flatnonzero(~b.measured)[0]),
        candidates=np.ones(5, bool),
        in_flight=[],
        admit=admit,
        first_round=1,
        max_picks=8,
    )
    assert plan.reserved == 0
    assert [(p.cell, p.start, p.round) for p in plan.picks] == [(0, False, 1), (1, True, 1), (2, False, 2)]
    assert admits == [(0, None), (1, 0), (2, 0)]
    assert plan.stop == "the next pick waits for GPUs"


class _GateCert(NamedTuple):
    status: str
    gap: Any
    unmeasured_committed: tuple[int, ...] = ()


def test_value_gate_defers_speculative_picks_and_starts_what_the_certificate_needs() -> None:
    from fleetsieve_bayes.allocation.objective import Gap
    from fleetsieve_bayes.decision.batch import BatchGate, Belief, DecisionValues, plan_batch

    n = 6

    def belief_of(believed: Any) -> Belief:
        m = np.zeros(n, bool)
        m[list(believed)] = True
        # Once cells 0 and 1 are believed, the conservative allocation commits to cell 3.
        committed = (3,) if {0, 1} <= set(believed) else ()
        return Belief(m, None, None, None, None, _GateCert("undecided", Gap(0.0, 1.0, 0.0), committed))

    def value(belief: Belief, round_no: int) -> DecisionValues:
        # Gap 1; cell 0 is expected to remove 0.6 of it, cell 3 0.01, the others 0.3 each.
        score = np.where(belief.measured, -np.inf, np.array([0.6, 0.3, 0.3, 0.01, 0.3, 0.3]))
        return DecisionValues(score, 1.0)

    real = belief_of([])
    started: list[int] = []
    plan = plan_batch(
        believe_fn=belief_of,
        select=lambda b, r: int(np.flatnonzero(~b.measured)[0]),
        candidates=np.ones(n, bool),
        in_flight=[],
        admit=lambda c, reserved, believed: started.append(c) is None,
        first_round=1,
        max_picks=6,
        real=real,
        gate=BatchGate(value=value, real=real, real_round=1, fraction=0.5),
    )
    # Cell 0 starts (nothing in flight: one at a time would measure it). Cell 1 is worth
    # 0.3 x (1 - 0.6) = 0.12 < 0.5 x 0.6: deferred, and cell 2 (0.3 x 0.4 x 0.7); cell 3
    # starts although it is worth little, because the believed certificate needs it. Then
    # no pick can be worth 0.3 any more (the gap left, 1 x 0.4 x 0.7 x 0.7 x 0.99, is less):
    # planning stops.
    assert started == [0, 3]
    assert [(p.cell, p.start, p.deferred) for p in plan.picks] == [
        (0, True, False), (1, False, True), (2, False, True), (3, True, False)
    ]
    assert [p.round for p in plan.picks] == [1, 2, 2, 2]
    assert plan.picks[1].value == pytest.approx(0.3 * 0.4)
    assert plan.picks[3].believed == (0, 1, 2)
    assert plan.reserved is None and plan.stop == "no further pick can be worth starting now"

    # A cell in flight expected to settle the gap: nothing speculative starts; at fraction
    # 0 the gate is off and every pick that fits starts.
    for fraction, expect in ((0.5, []), (0.0, [1, 2, 3, 4])):
        started.clear()
        plan_batch(
            believe_fn=belief_of, select=lambda b, r: int(np.flatnonzero(~b.measured)[0]),
            candidates=np.arange(n) > 0, in_flight=[0],
            admit=lambda c, reserved, believed: started.append(c) is None,
            first_round=2, max_picks=4, real=real,
            gate=BatchGate(value=lambda b, r: DecisionValues(np.full(n, 0.5), 0.5), real=real, real_round=1,
                           fraction=fraction),
        )
        assert started == expect


def test_believe_collapses_in_flight_cells_at_posterior_medians() -> None:
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.allocation.problem import grid_from_table
    from fleetsieve_bayes.decision.batch import believe
    from fleetsieve_bayes.table import read_table

    camp = load_campaign(SHIPPED)
    grid = grid_from_table(read_table(GRID), camp.workload_names)
    problem = camp.problem()
    rng = np.random.default_rng(0)
    latent = np.exp(rng.normal(0.0, 0.3, size=(200, grid.n_cells, 4)))
    latent[..., 3] = rng.uniform(0.9, 1.0, size=(200, grid.n_cells))

    class Post(NamedTuple):
        latent: np.ndarray
        noise: np.ndarray

    post = Post(latent, np.full((200, 4), 1e-6))
    measured = np.zeros(grid.n_cells, bool)
    observed = np.full((grid.n_cells, 4), np.nan)
    b = believe(
        grid, problem, post, measured, observed, [3, 7], DecisionSettings(credible_level=0.9, epsilon=0.05),
        allocate=lambda v: allocate_milp(grid, v, problem),
    )
    assert b.measured.sum() == 2 and b.measured[[3, 7]].all()
    np.testing.assert_allclose(b.observed[[3, 7]], np.median(latent[:, [3, 7], :], axis=0))
    np.testing.assert_allclose(b.bounds.lo[[3, 7]], b.bounds.hi[[3, 7]])  # collapsed
    assert not measured.any()  # the caller's state is untouched


# ----------------------------------------------------------------------------- the driver (simulated clock)


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def pooled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from fleetsieve_bayes.campaign.runner import run_campaign

    tmp = tmp_path_factory.mktemp("pool16")
    out = tmp / "run"
    outcome = run_campaign(load_campaign(pooled_campaign(tmp)), out)
    return out, outcome.result


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]


@pytest.mark.slow  # the shipped campaign on a pool of 16 (its module fixture)
def test_pool_of_16_certifies_the_oracle_allocation_in_900_seconds_at_10800_gpu_seconds(
    pooled_run: tuple[Path, dict],
) -> None:
    out, r = pooled_run
    assert r["status"] == "certified-feasible"
    assert r["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C96", "replicas": 2},
    }
    # The simulated clock makes the pool deterministic at a fixed seed. One at a time the
    # same campaign measures 8 cells: 2,400 s and 10,800 GPU-s (test_campaign.py). The pool
    # measures the same 8 cells: the design in two waves (28 GPUs of cells on 16), then
    # code TP4@C96 (the strategy's pick) and chat TP4@C96 side by side — the value gate
    # starts the second because the believed certificate needs it, and nothing while the
    # design's last cells are expected to settle the gap: 900 s (0.375x), 10,800 GPU-s (1.00x).
    assert (r["profiling_wall_s"], r["gpu_seconds"], len(r["measured"])) == POOL_TRAIL
    assert r["pool"] == {"pool_gpus": 16, "executor": "local", "clock": "simulated"}
    recs = _records(out)
    cells = [json.dumps(m["cell"], sort_keys=True) for m in recs if m["type"] == "measurement"]
    assert len(cells) == len(set(cells))  # no cell measured twice
    # The pool is never over-subscribed and really runs cells side by side.
    events = []
    for rec in recs:
        if rec["type"] == "started":
            events.append((rec["start_s"], 1, len(rec["gpus"])))
        if rec["type"] in ("finished", "cancelled"):
            events.append((rec["finish_s"], 0, -len(rec["gpus"])))
    used, peak, concurrent, peak_cells = 0, 0, 0, 0
    for _, _, d in sorted(events):
        used += d
        concurrent += 1 if d > 0 else -1
        peak, peak_cells = max(peak, used), max(peak_cells, concurrent)
    assert peak == 16 and peak_cells >= 3
    # Every acquisition names the cells it was conditioned on (in flight or reserved when picked).
    acq = [rec for rec in recs if rec["type"] == "started" and rec["phase"] == "acquire"]
    assert acq and all("believed" in rec for rec in acq)
    assert any(rec["believed"] for rec in acq)


@pytest.mark.slow  # the shipped campaign on a pool of 16 (its module fixture)
def test_interrupted_with_cells_in_flight_resumes_to_the_same_decisions(
    pooled_run: tuple[Path, dict], tmp_path: Path
) -> None:
    from fleetsieve_bayes.campaign.runner import run_campaign

    first_out, first = pooled_run
    camp = load_campaign(pooled_campaign(tmp_path))
    out = tmp_path / "cut"
    starts = []

    def stop_after_first_acquisition(kind: str, info: dict[str, Any]) -> None:
        if kind == "measure-start":
            starts.append(info["label"])
            # The design's 6 cells, then the first pick of a batch of two: the resume
            # re-plans the batch and its value gate must start the second pick again.
            if len(starts) == 7:
                raise Stop

    with pytest.raises(Stop):
        run_campaign(camp, out, on_event=stop_after_first_acquisition)
    flying = in_flight_cells(_records(out))
    # In flight at the cut: the strategy's first pick, the one the uninterrupted run started first.
    first_pick = next(r for r in _records(first_out) if r["type"] == "started" and r["phase"] == "acquire")
    assert [cell_key(f["cell"]) for f in flying] == [cell_key(first_pick["cell"])]
    resumed = run_campaign(camp, out).result
    assert resumed["measured"] == first["measured"]
    assert resumed["profiling_wall_s"] == first["profiling_wall_s"]
    assert resumed["status"] == first["status"]
    recs = _records(out)
    assert sum(1 for r in recs if r["type"] == "started" and r.get("resumed")) == 1
    cells = [json.dumps(m["cell"], sort_keys=True) for m in recs if m["type"] == "measurement"]
    assert len(cells) == len(set(cells))


@pytest.mark.slow  # the shipped campaign on a pool of 16 (its module fixture)
def test_status_shows_cells_in_flight(pooled_run: tuple[Path, dict], tmp_path: Path) -> None:
    from fleetsieve_bayes.commands.status import status_json
    from fleetsieve_bayes.reporting.report import load_campaign_dir

    out, _ = pooled_run
    assert status_json(load_campaign_dir(out))["in_flight"] == []
    # A journal cut right after the starts of the design: those cells are in flight.
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = (out / "journal.jsonl").read_text().splitlines()
    first_done = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "measurement")
    (cut / "journal.jsonl").write_text("\n".join(lines[:first_done]) + "\n")
    flying = status_json(load_campaign_dir(cut))["in_flight"]
    assert [(c["workload"], c["tp"]) for c in flying] == [("chat", 2), ("chat", 4), ("chat", 8), ("code", 2)]


def test_progress_lists_the_cells_in_flight() -> None:
    import io

    from rich.console import Console

    from fleetsieve_bayes.reporting.progress import ProgressState, render_progress, update_state

    s = ProgressState()
    for label in ("chat TP2@C32", "chat TP8@C64", "code TP2@C16"):
        update_state(s, "measure-start", {"label": label, "expected_s": 300.0, "round": 0}, now=0.0)
    update_state(s, "measure-done", {"label": "chat TP8@C64", "gpu_seconds": 2400.0, "row": {}}, now=300.0)
    assert s.in_flight == ["chat TP2@C32", "code TP2@C16"] and s.measured == 1
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(render_progress(s, now=310.0))
    assert "in flight (2): chat TP2@C32, code TP2@C16" in buf.getvalue()


# ----------------------------------------------------------------------------- executors


def test_simulated_executor_hands_back_cells_by_simulated_finish_ties_together() -> None:
    from fleetsieve_bayes.campaign.executor import Job, local_executor

    durations = {0: 300.0, 1: 100.0, 2: 300.0, 3: 50.0}
    ex = local_executor(lambda c, slots, rep: {"duration_s": durations[c], "tp": 2}, simulated=True, offset_s=1000.0)
    try:
        for seq, c in enumerate([0, 1, 2]):
            ex.submit(Job(c, 2, (2 * seq, 2 * seq + 1), 1000.0, seq))
        first = ex.wait_any()
        assert [d.job.cell for d in first] == [1] and first[0].finish_s == 1100.0 and ex.now() == 1100.0
        ex.submit(Job(3, 2, (2, 3), ex.now(), 3))  # finishes at 1150, before cells 0 and 2
        assert [d.job.cell for d in ex.wait_any()] == [3]
        both = ex.wait_any()  # 0 and 2 finish at the same instant: handed back together, in start order
        assert [d.job.cell for d in both] == [0, 2] and {d.finish_s for d in both} == {1300.0}
    finally:
        ex.close()


def test_real_clock_executor_runs_cells_side_by_side_and_cancels() -> None:
    import threading

    from fleetsieve_bayes.campaign.executor import Job, local_executor

    # Cells 0 and 1 each wait for the other at a barrier: one after another they
    # could never both pass it (the barrier breaks after 60 s and the cells fail).
    both = threading.Barrier(2, timeout=60.0)
    release = threading.Event()
    cell_2_returned = threading.Event()
    runs_of_2: list[int] = []

    def measure(c: int, slots: tuple[int, ...], replicate: int) -> dict[str, Any]:
        if c == 9:
            raise RuntimeError("harness broke")
        if c == 2:
            runs_of_2.append(replicate)
            release.wait(60.0)  # in flight until cancelled
            cell_2_returned.set()
            return {"duration_s": 300.0, "replicate": replicate}
        both.wait()
        return {"duration_s": 300.0}

    ex = local_executor(measure, simulated=False, offset_s=500.0)
    try:
        for c in range(3):
            ex.submit(Job(c, 1, (c,), ex.now(), c))
        ex.submit(Job(9, 1, (9,), ex.now(), 3))
        got: list[int] = []
        errors: list[str] = []
        while len(got) + len(errors) < 3:
            for d in ex.wait_any():
                (errors.append(d.error) if d.error else got.append(d.job.cell))
        assert errors == ["RuntimeError: harness broke"] and sorted(got) == [0, 1]
        with pytest.raises(RuntimeError, match="cell 2 is already in flight"):
            ex.submit(Job(2, 1, (2,), ex.now(), 4))  # still running: the executor holds it
        before = ex.now()
        stopped = ex.cancel(2)
        # When on the campaign clock (which starts at offset_s) the cell stopped: now, not a default.
        assert before <= stopped <= ex.now() and stopped >= 500.0
        # The cancelled cell's thread still finishes; its row is discarded, never handed back.
        release.set()
        assert cell_2_returned.wait(60.0)
        assert ex.ready() == []
        with pytest.raises(RuntimeError, match="wait_any with no cell in flight"):
            ex.wait_any()
        # Nothing of cell 2 is in flight any more: it can be submitted again, and this run is handed back.
        ex.submit(Job(2, 1, (2,), ex.now(), 5, replicate=1))
        [again] = ex.wait_any()
        assert (again.job.seq, again.row) == (5, {"duration_s": 300.0, "replicate": 1})
        assert runs_of_2 == [0, 1]
    finally:
        release.set()
        ex.close()


def test_ready_hands_back_finished_cells_without_waiting() -> None:
    import threading
    import time

    from fleetsieve_bayes.campaign.executor import Job, local_executor

    release = threading.Event()

    def measure(c: int, slots: tuple[int, ...], replicate: int) -> dict[str, Any]:
        if c == 1:
            release.wait(60.0)  # still running while the test looks
        return {"duration_s": 1.0}

    ex = local_executor(measure, simulated=False)
    sim = local_executor(lambda c, slots, rep: {"duration_s": 1.0}, simulated=True)
    try:
        ex.submit(Job(0, 1, (0,), 0.0, 0))
        ex.submit(Job(1, 1, (1,), 0.0, 1))
        got: list[int] = []
        deadline = time.monotonic() + 60.0
        while not got and time.monotonic() < deadline:
            got = [d.job.cell for d in ex.ready()]  # cell 1 holds until released: never waited for
            time.sleep(0.01)
        assert got == [0]
        assert ex.ready() == []
        release.set()
        assert [d.job.cell for d in ex.wait_any()] == [1]
        sim.submit(Job(0, 1, (0,), 0.0, 0))
        assert sim.ready() == []  # the simulated clock moves only in wait_any
    finally:
        release.set()
        ex.close()
        sim.close()
