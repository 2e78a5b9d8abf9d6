"""Verify reports as production observations (deploy/production.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.deploy.metrics import QuantileBound, WindowReading
from fleetsieve_bayes.deploy.production import (
    PHASE_NOISE_SCALE,
    pooled_observation,
    production_rows,
    read_verify,
)
from fleetsieve_bayes.deploy.verify import verify_report
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import validate_table

PLAN = {
    "campaign": "t", "campaign_dir": "/x", "certified": True, "certificate": {"campaign_fingerprint": "f"},
    "classes": [
        {"workload": "chat", "tp": 4, "load": "C96", "replicas": 2, "offered_rps_per_replica": 6.6,
         "slo": {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 30.0},
         "predicted": {"ttft_p99_s": {"interval": [0.5, 1.4]}}},
        {"workload": "code", "tp": 4, "load": "C96", "replicas": 2, "offered_rps_per_replica": 11.1,
         "slo": {"success_min": 0.99, "ttft_p99_s": 5.0, "completion_p99_s": None}, "predicted": {}},
    ],
}


def _report() -> dict:
    live = {
        "chat": WindowReading(300.0, 2, 3000, 2994, 10.2, 9.98, 2994 / 3000, QuantileBound(2.5, 5.0, 3.1, 3000),
                              QuantileBound(20.0, 30.0, 24.0, 3000), 0.5, {}),
        "code": WindowReading(300.0, 2, 0, 0, 0.0, 0.0, None, QuantileBound(math.nan, math.nan, math.nan, 0),
                              QuantileBound(math.nan, math.nan, math.nan, 0), None, {}),
    }
    return verify_report(PLAN, live, {"kind": "metrics", "window_s": 300.0})


def test_rows_are_valid_table_rows_of_the_planned_cells(tmp_path: Path) -> None:
    (tmp_path / "v.json").write_text(json.dumps(_report()))
    rows = production_rows(read_verify(tmp_path / "v.json"), "v.json")
    assert len(rows) == 1  # code finished nothing in its window: no observation
    cell, row, source = rows[0]
    assert cell == {"workload": "chat", "tp": 4, "load": "C96"}
    assert row["throughput_rps"] == pytest.approx(9.98 / 2) and row["offered_rps"] == pytest.approx(10.2 / 2)
    assert row["ttft_p99_s"] == 3.1 and row["completion_p99_s"] == 24.0  # histogram_quantile-style values
    assert row["success_rate"] == pytest.approx(0.998) and row["duration_s"] == 300.0
    assert "class chat (violates)" in source
    validate_table(__import__("pandas").DataFrame([row]))


def test_read_verify_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_verify(tmp_path / "nope.json")
    (tmp_path / "a.json").write_text("[1]")
    with pytest.raises(InputError, match="not a verify report"):
        read_verify(tmp_path / "a.json")
    bad = _report()
    del bad["classes"][0]["window_s"]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"classes\[0\]\.window_s"):
        read_verify(tmp_path / "b.json")


def test_pooling_weights_production_by_its_noise_scale() -> None:
    k = PHASE_NOISE_SCALE["production"]
    profile = np.array([6.6, 0.93, 16.0, 0.992])
    live = np.array([6.0, 3.1, 24.0, 0.998])
    got = pooled_observation([(profile, "design"), (live, "production")])
    w = 1 / k**2
    assert got[1] == pytest.approx(math.exp((math.log(0.93) + w * math.log(3.1)) / (1 + w)))
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert got[3] == pytest.approx(1 / (1 + math.exp(-(logit(0.992) + w * logit(0.998)) / (1 + w))))
    # Profiling rows only: the first measurement, exactly (today's behaviour).
    assert np.array_equal(pooled_observation([(profile, "design"), (live, "seed")]), profile)
    # A metric missing in the live window (NaN) keeps the profiling value.
    live_nan = live.copy()
    live_nan[2] = np.nan
    assert pooled_observation([(profile, "design"), (live_nan, "production")])[2] == pytest.approx(16.0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), ttft=st.floats(0.01, 100.0), live=st.floats(0.01, 100.0))
def test_pooled_tail_moves_towards_the_windows_monotonically(n: int, ttft: float, live: float) -> None:
    profile = np.array([1.0, ttft, 10.0, 0.99])
    window = np.array([1.0, live, 10.0, 0.99])
    one = pooled_observation([(profile, "design"), (window, "production")])[1]
    more = pooled_observation([(profile, "design")] + [(window, "production")] * n)[1]
    lo, hi = sorted((ttft, live))
    assert lo * (1 - 1e-9) <= one <= hi * (1 + 1e-9)
    assert abs(math.log(more) - math.log(live)) <= abs(math.log(one) - math.log(live)) + 1e-9
