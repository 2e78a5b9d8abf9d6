"""Which SLO an unserved class misses, by how much, at its best measured cell."""

from __future__ import annotations

import math

from fleetsieve_bayes.reporting.misses import describe_unserved, slo_misses, unserved

SLO = {"success_min": 0.99, "ttft_p99_s": 0.1, "completion_p99_s": None}
ROWS = [
    {"workload": "chat", "tp": 1, "load": "x1", "throughput_rps": 2.0, "ttft_p99_s": 0.25,
     "completion_p99_s": 1.0, "success_rate": 1.0},
    {"workload": "chat", "tp": 1, "load": "x4", "throughput_rps": 7.0, "ttft_p99_s": 0.15,
     "completion_p99_s": 1.0, "success_rate": 1.0},
    {"workload": "chat", "tp": 1, "load": "x64", "throughput_rps": 70.0, "ttft_p99_s": 9.0,
     "completion_p99_s": 9.0, "success_rate": 0.9},
    {"workload": "code", "tp": 1, "load": "x1", "throughput_rps": 2.0, "ttft_p99_s": 0.05,
     "completion_p99_s": 1.0, "success_rate": 1.0},
]


def test_best_cell_is_the_smallest_worst_miss() -> None:
    alloc = {"chat": {"tp": None, "load": None, "replicas": 0}, "code": {"tp": 1, "load": "x1", "replicas": 1}}
    why = unserved(alloc, {"chat": SLO, "code": SLO}, ROWS)
    assert list(why) == ["chat"]
    assert why["chat"]["cell"] == {"workload": "chat", "tp": 1, "load": "x4"}
    [miss] = why["chat"]["misses"]
    assert miss.slo == "ttft_p99_s" and math.isclose(miss.relative, 0.5)
    line = describe_unserved("chat", why["chat"])
    assert line == "chat: no replicas — best measured cell TP1@x4 misses TTFT p99 0.15 s > 0.1 s (+50 %)"


def test_every_miss_is_named_and_unobserved_completion_says_so() -> None:
    slo = {"success_min": 0.99, "ttft_p99_s": 0.1, "completion_p99_s": 5.0}
    misses = slo_misses({"throughput_rps": 1.0, "ttft_p99_s": 0.2, "completion_p99_s": float("nan"),
                         "success_rate": 0.95}, slo)
    assert [m.slo for m in misses] == ["success_min", "ttft_p99_s", "completion_p99_s"]
    assert "unobserved" in misses[2].text() and misses[0].text() == "success 0.950 < 0.99"


def test_nothing_measured_and_budget_cases() -> None:
    alloc = {"chat": {"replicas": 0}, "code": {"replicas": 0}}
    why = unserved(alloc, {"chat": SLO, "code": SLO}, ROWS[3:])
    assert describe_unserved("chat", why["chat"]).endswith("no cell of this class was measured")
    assert "GPU budget" in describe_unserved("code", why["code"])
    assert unserved(None, {"chat": SLO}, ROWS) == {}


def test_a_class_whose_windows_meet_the_slo_is_explained_by_the_campaign_state() -> None:
    alloc = {"chat": {"replicas": 0}, "code": {"replicas": 0}}
    [code] = [unserved(alloc, {"chat": SLO, "code": SLO}, ROWS[3:])["code"]]
    at_level = {"status": "undecided", "slo_attainment": {"chat": 0.9, "code": 0.95},
                "repeat": {"workload": "code", "tp": 1, "load": "x1", "windows": 3}}
    assert describe_unserved("code", code, at_level) == (
        "code: no replicas — best measured cell TP1@x1 meets the SLO in its windows, but no cell of this "
        "class is shown to meet it in 95 % of windows (measure TP1@x1 again)"
    )
    capped = {**at_level, "repeat": {**at_level["repeat"], "limit": 3, "limited_by": "max_windows_per_cell"}}
    assert describe_unserved("code", code, capped).endswith(
        "(TP1@x1 needs another window and has 3, its limit: raise [stopping] max_windows_per_cell)")
    rows_out = {**at_level, "repeat": {**at_level["repeat"], "limit": 3, "limited_by": "backend"}}
    assert describe_unserved("code", code, rows_out).endswith("its replay table has no more rows of it)")
    other = {**at_level, "repeat": {"workload": "chat", "tp": 2, "load": "x4", "windows": 1}}
    assert describe_unserved("code", code, other).endswith("in 95 % of windows")
    point = {"status": "undecided", "slo_attainment": {"chat": "point", "code": "point"}}
    assert describe_unserved("code", code, point).endswith(
        "but the campaign is undecided and the conservative allocation does not count on it yet")
    assert describe_unserved("code", code, {"status": "certified-feasible"}).endswith(
        "but the GPU budget went to other classes")
