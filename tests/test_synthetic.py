"""The synthetic fleet generator: valid tables and campaigns, the intended curve shapes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    problem_from_campaign,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import parse_campaign
from fleetsieve_bayes.evaluation.regret import make_oracle
from fleetsieve_bayes.evaluation.synthetic import (
    TRUE_COLUMNS,
    SyntheticSpec,
    _capacity,
    _class_curve,
    campaign_toml,
    random_spec,
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
    assert 2 <= spec.n_classes <= 4 and set(spec.tps) <= {1, 2, 4, 8} and len(spec.tps) >= 2
    df, camp = synthetic_fleet(rng, spec)
    campaign = write_synthetic(tmp_path_factory.mktemp("syn"), df, camp)
    table = read_table(campaign.measurement.table)  # validates every row
    assert len(table) == len(df)
    grid = grid_from_table(table, campaign.workload_names)  # one offered rate per load label
    assert grid.n_cells == len(df)
    assert campaign.gpus == spec.gpus and len(campaign.workloads) == spec.n_classes
    # Per (class, TP): tails rise and success falls with load; served ≤ offered.
    for (_, _), g in df.groupby(["workload", "tp"]):
        g = g.sort_values("offered_rps")
        assert np.all(np.diff(g["true_ttft_p99_s"]) > 0)
        assert np.all(np.diff(g["true_completion_p99_s"]) > 0)
        assert np.all(np.diff(g["true_success_rate"]) <= 1e-12)
        assert np.all(g["true_throughput_rps"] <= g["offered_rps"] + 1e-9)
        assert np.all(g["throughput_rps"] <= g["offered_rps"] + 1e-4)
    # The critical flavour decides true feasibility.
    values = values_from_table(grid, table)
    oracle = make_oracle(grid, values, problem_from_campaign(campaign))
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
