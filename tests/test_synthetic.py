"""The synthetic fleet generator: valid tables and campaigns, the intended curve shapes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.allocation.problem import (
    admissible,
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import parse_campaign
from fleetsieve_bayes.evaluation.regret import make_oracle
from fleetsieve_bayes.evaluation.synthetic import (
    OOM_DURATION_S,
    TRUE_COLUMNS,
    SyntheticSpec,
    _capacity,
    _class_curve,
    campaign_toml,
    random_spec,
    round_sig,
    synthetic_fleet,
    truth_table,
    write_synthetic,
)
from fleetsieve_bayes.table import METRICS, read_table


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_fleet_round_trips_as_a_valid_campaign(seed: int, tmp_path_factory) -> None:
    rng = np.random.default_rng(seed)
    spec = random_spec(rng)
    assert 2 <= spec.n_classes <= 4 and set(spec.tps) <= {1, 2, 4, 8, 16} and 2 <= len(spec.tps) <= 5
    df, camp = synthetic_fleet(rng, spec)
    campaign = write_synthetic(tmp_path_factory.mktemp("syn"), df, camp)
    table = read_table(campaign.measurement.table)  # validates every row
    assert len(table) == len(df)
    grid = grid_from_table(table, campaign.workload_names)  # one offered rate per load label
    assert grid.n_cells == len(df)
    assert campaign.gpus == spec.gpus and len(campaign.workloads) == spec.n_classes
    # Per (class, TP): tails rise and success falls with load; served ≤ offered.
    for (_, _), g in df[df["true_throughput_rps"] > 0].groupby(["workload", "tp"]):
        g = g.sort_values("offered_rps")
        assert np.all(np.diff(g["true_ttft_p99_s"]) > 0)
        assert np.all(np.diff(g["true_completion_p99_s"]) > 0)
        assert np.all(np.diff(g["true_success_rate"]) <= 1e-12)
        assert np.all(g["true_throughput_rps"] <= g["offered_rps"] + 1e-9)
        assert np.all(g["throughput_rps"] <= g["offered_rps"] + 1e-4)
    # The critical flavour decides true feasibility.
    values = values_from_table(grid, table)
    oracle = make_oracle(grid, values, campaign.problem())
    if spec.critical == "infeasible":
        assert not oracle.allocation.feasible
    else:
        assert oracle.allocation.feasible


@pytest.mark.parametrize(
    ("kind", "tps", "where"),
    [("low", (1, 2, 4, 8), "first"), ("high", (2, 4, 8), "last"), ("interior", (1, 2, 4, 8), "inside"), ("interior", (2, 4, 8), "inside")],
)
def test_knee_placement(kind: str, tps: tuple[int, ...], where: str) -> None:
    rng = np.random.default_rng(7)
    tp = np.array(tps)
    for _ in range(30):
        p = _class_curve(rng, tp, kind)
        per_gpu = _capacity(p, tp) / tp
        k = int(np.argmax(per_gpu))
        if where == "first":
            assert k == 0
        elif where == "last":
            assert k == len(tps) - 1
        else:
            assert 0 < k < len(tps) - 1


def test_noise_free_spec_has_truth_equal_to_measurement_and_is_deterministic() -> None:
    spec = SyntheticSpec(n_classes=3, tps=(1, 2, 4, 8), knees=("interior", "low", "high"), gpus=32, noise=0.0)
    a, ca = synthetic_fleet(np.random.default_rng(3), spec)
    b, cb = synthetic_fleet(np.random.default_rng(3), spec)
    assert a.equals(b) and ca == cb
    for m, t in zip(METRICS, TRUE_COLUMNS, strict=True):
        np.testing.assert_allclose(a[m], a[t], rtol=1e-4, atol=1e-5)
    noisy, _ = synthetic_fleet(np.random.default_rng(3), spec._replace(noise=0.05))
    assert not np.allclose(noisy["ttft_p99_s"], noisy["true_ttft_p99_s"])
    swapped = truth_table(noisy)
    np.testing.assert_array_equal(swapped["ttft_p99_s"], noisy["true_ttft_p99_s"])


def test_campaign_toml_round_trip() -> None:
    spec = SyntheticSpec(critical="feasible")
    _, camp = synthetic_fleet(np.random.default_rng(11), spec)
    raw = tomllib.loads(campaign_toml(camp))
    assert raw == camp
    c = parse_campaign({**raw, "measurement": {"backend": "none"}}, Path("x.toml"))
    assert c.workloads[0].critical and c.workloads[0].floor == 0.5
    assert c.family == "generic"


def test_bad_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match="knees"):
        synthetic_fleet(np.random.default_rng(0), SyntheticSpec(n_classes=3))
    with pytest.raises(ValueError, match="tps"):
        synthetic_fleet(np.random.default_rng(0), SyntheticSpec(tps=(3, 4)))


def _suite(n: int = 40, seed: int = 0) -> list[tuple]:
    out = []
    for k in range(n):
        rng = np.random.default_rng([seed, k])
        spec = random_spec(rng)
        df, camp = synthetic_fleet(rng, spec)
        out.append((spec, df, camp))
    return out


def test_hard_suite_covers_every_kind_of_difficulty(tmp_path: Path) -> None:
    """The benchmark's first 40 fleets hold every kind of difficulty the suite promises."""
    suite = _suite()
    specs = [s for s, _, _ in suite]
    assert {s.n_classes for s in specs} == {2, 3, 4}
    assert {len(s.tps) for s in specs} == {2, 3, 4, 5}
    assert sum(1 in s.tps for s in specs) >= 20 and any(16 in s.tps for s in specs)
    assert {s.n_loads for s in specs} >= {4, 8} and all(4 <= s.n_loads <= 8 for s in specs)
    assert {k for s in specs for k in s.knees} == {"interior", "low", "high"}
    assert {k for s in specs for k in s.tail_knees} == {"sharp", "gradual"}
    assert {k for s in specs for k in s.loops} == {"open", "closed"}
    n_infeasible = n_oom = n_crash = n_closed = n_near = 0
    for k, (spec, df, camp) in enumerate(suite):
        campaign = write_synthetic(tmp_path / f"c{k}", df, camp)
        table = read_table(campaign.measurement.table)
        grid = grid_from_table(table, campaign.workload_names)
        values = values_from_table(grid, table)
        problem = campaign.problem()
        oracle = make_oracle(grid, values, problem)
        n_infeasible += not oracle.allocation.feasible
        assert oracle.allocation.feasible == (spec.critical != "infeasible")
        # Start-up OOM: every cell of the class's smallest TP, labelled, success 0, cheap.
        oom = df[df["failure"] == "startup-oom"]
        n_oom += len(oom)
        assert np.all(oom["success_rate"] == 0) and np.all(oom["duration_s"] == OOM_DURATION_S)
        for w, g in oom.groupby("workload"):
            assert set(g["tp"]) == {int(df[df["workload"] == w]["tp"].min())}
        # A failed run that reports TTFT 0 and success 0, without a label.
        crash = df[(df["failure"] == "") & (df["success_rate"] == 0)]
        n_crash += len(crash)
        assert np.all(crash["ttft_p99_s"] == 0) and np.all(crash["throughput_rps"] == 0)
        n_closed += int(df["load"].str.startswith("N").any())
        # SLOs have at most 3 significant digits; every class has an admissible cell
        # as measured unless its SLO reference TP had no usable cell.
        for w in camp["workloads"]:
            for key in ("ttft_p99_s", "completion_p99_s"):
                if key in w["slo"]:
                    assert w["slo"][key] == round_sig(w["slo"][key], 3)
        true_vals = df[[f"true_{m}" for m in METRICS]].to_numpy()
        for w in camp["workloads"]:
            g = df[df["workload"] == w["name"]]
            rel = np.abs(g["true_ttft_p99_s"] / w["slo"]["ttft_p99_s"] - 1.0)
            n_near += int((rel < 0.01).any())
        assert true_vals.shape[0] == grid.n_cells
        assert admissible(grid, values, problem).any()
    assert n_infeasible >= 4 and n_oom >= 10 and n_crash >= 5 and n_closed >= 5
    assert n_near >= 40  # classes with a cell within 1 % of its TTFT limit


def test_sharp_tail_knee_is_flat_then_explodes() -> None:
    """A sharp knee: tails within ~25 % of light load up to ρ ≈ 0.7, then ×8 past saturation."""
    rng = np.random.default_rng(5)
    tp = np.array([4])
    for _ in range(20):
        p = _class_curve(rng, np.array([2, 4, 8]), "interior", "sharp")
        cap = float(_capacity(p, tp)[0])
        off = np.array([0.3, 0.7, 1.3]) * cap
        from fleetsieve_bayes.evaluation.synthetic import _metrics

        m = _metrics(p, np.full(3, 4), off)
        assert m[1, 1] < 1.5 * m[0, 1]
        assert m[2, 1] > 8 * m[1, 1]
