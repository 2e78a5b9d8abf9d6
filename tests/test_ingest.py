"""`ingest`: vllm bench serve results and GuideLLM benchmarks.json → table rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.backends.ingest import ingest_file, rows_from_vllm_bench
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import read_table

VLLM = {
    "date": "20250101-000000", "backend": "vllm", "model_id": "m", "num_prompts": 100,
    "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "duration": 25.0,
    "completed": 98, "total_input_tokens": 1000, "total_output_tokens": 5000,
    "request_throughput": 3.92, "output_throughput": 200.0, "total_token_throughput": 240.0,
    "mean_ttft_ms": 100.0, "p99_ttft_ms": 850.0, "mean_e2el_ms": 5000.0, "p99_e2el_ms": 12500.0,
    "workload": "chat", "tp": "4", "load": "C32",
}


def _guidellm(n: int = 2) -> dict:
    benches = []
    for i in range(n):
        benches.append({
            "type_": "generative_benchmark",
            "args": {"strategy": {"type_": "constant", "rate": 2.5 * (i + 1)}},
            "duration": 60.0,
            "metrics": {
                "request_totals": {"successful": 120 * (i + 1), "errored": 30 * (i + 1), "incomplete": 0,
                                   "total": 150 * (i + 1)},
                "time_to_first_token_ms": {"successful": {"mean": 50.0, "percentiles": {"p99": 400.0 * (i + 1)}}},
                "request_latency": {"successful": {"mean": 3.0, "percentiles": {"p99": 7.5 * (i + 1)}}},
            },
        })
    return {"benchmarks": benches}


def _write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_vllm_bench_result_with_metadata_labels(tmp_path) -> None:
    [row] = ingest_file(_write(tmp_path, "v.json", VLLM))
    assert row == {
        "workload": "chat", "tp": 4, "load": "C32", "offered_rps": 4.0, "throughput_rps": 98 / 25,
        "ttft_p99_s": 0.85, "completion_p99_s": 12.5, "success_rate": 0.98, "duration_s": 25.0, "failure": "",
    }


def test_guidellm_benchmarks(tmp_path) -> None:
    rows = ingest_file(_write(tmp_path, "benchmarks.json", _guidellm()), workload="chat", tp=8)
    assert [r["load"] for r in rows] == ["constant@2.5", "constant@5"]
    assert rows[1]["offered_rps"] == 5.0 and rows[1]["throughput_rps"] == 4.0
    assert rows[1]["success_rate"] == 0.8 and rows[1]["ttft_p99_s"] == 0.8 and rows[1]["completion_p99_s"] == 15.0
    rows = ingest_file(tmp_path / "benchmarks.json", workload="chat", tp=8, loads=["a", "b"])
    assert [r["load"] for r in rows] == ["a", "b"]


def test_guidellm_no_success_has_infinite_tails(tmp_path) -> None:
    g = _guidellm(1)
    g["benchmarks"][0]["metrics"]["request_totals"].update(successful=0, errored=150)
    g["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]["percentiles"]["p99"] = 0.0
    [row] = ingest_file(_write(tmp_path, "g.json", g), workload="w", tp=1)
    assert row["success_rate"] == 0.0 and math.isinf(row["ttft_p99_s"]) and math.isinf(row["completion_p99_s"])
    assert row["throughput_rps"] == 0.0 and row["failure"] == "no-success"


@pytest.mark.parametrize(
    ("obj", "kwargs", "message"),
    [
        ({k: v for k, v in VLLM.items() if k != "workload"}, {}, "no workload label"),
        ({**VLLM, "tp": "four"}, {}, "tp label 'four' is not an integer"),
        ({k: v for k, v in VLLM.items() if k != "p99_ttft_ms"}, {}, "missing field 'p99_ttft_ms'"),
        ({**VLLM, "duration": -1}, {}, "field 'duration'"),
        ({"hello": 1}, {}, "not a vllm bench serve result"),
        (_guidellm(2), {"workload": "w", "tp": 1, "loads": ["x"]}, "2 benchmarks but 1 load labels"),
    ],
)
def test_bad_results_are_one_line_errors(tmp_path, obj, kwargs, message) -> None:
    p = _write(tmp_path, "bad.json", obj)
    with pytest.raises(InputError) as err:
        ingest_file(p, **kwargs)
    assert message in str(err.value) and str(p) in str(err.value) and "\n" not in str(err.value)


def test_cli_appends_to_a_table_and_rejects_duplicates(tmp_path, capsys) -> None:
    v = _write(tmp_path, "v.json", VLLM)
    g = _write(tmp_path, "benchmarks.json", _guidellm())
    out = tmp_path / "seed.csv"
    assert main(["ingest", str(v), "--out", str(out)]) == 0
    assert main(["ingest", str(g), "--workload", "code", "--tp", "2", "--load", "C8,C16", "--out", str(out)]) == 0
    df = read_table(out)
    assert list(zip(df["workload"], df["tp"], df["load"], strict=True)) == [("chat", 4, "C32"), ("code", 2, "C8"), ("code", 2, "C16")]
    before = out.read_bytes()
    assert main(["ingest", str(v), "--out", str(out)]) == 2  # the same cell again
    assert "duplicate cell" in capsys.readouterr().err
    assert out.read_bytes() == before  # nothing already recorded lost
    assert main(["ingest", str(tmp_path / "missing.json")]) == 2


# --- upstream formats (tests/fixtures/ingest/, see make_fixtures.py for provenance) ---------

FIX = Path(__file__).parent / "fixtures" / "ingest"


def test_newest_default_vllm_bench_file_is_read_and_drain_is_not_throughput() -> None:
    # Default `vllm bench serve --save-result`: no e2el percentiles, no ttfts; latencies kept.
    # 100 prompts offered at 10 req/s, all completed, duration 12 s (request_throughput 8.33).
    data = json.loads((FIX / "vllm_bench_serve_default.json").read_text())
    assert "p99_e2el_ms" not in data and "ttfts" not in data and data["request_throughput"] == pytest.approx(8.333, 1e-3)
    [row] = ingest_file(FIX / "vllm_bench_serve_default.json", loads=["L10"])
    assert row["offered_rps"] == 10.0 and row["success_rate"] == 1.0
    # Sending time = 12 − 1.8 s (the fastest request's end-to-end time): 100 / 10.2.
    assert row["throughput_rps"] == pytest.approx(100 / 10.2)
    assert row["ttft_p99_s"] == pytest.approx(data["p99_ttft_ms"] / 1000)
    assert row["completion_p99_s"] == pytest.approx(float(np.percentile(data["latencies"], 99)))


def test_detailed_vllm_bench_file_with_string_tp_and_a_failed_request() -> None:
    data = json.loads((FIX / "vllm_bench_serve_detailed.json").read_text())
    [row] = ingest_file(FIX / "vllm_bench_serve_detailed.json")
    assert (row["workload"], row["tp"], row["load"]) == ("chat", 2, "C16")  # tp = "2.0" in metadata
    assert row["success_rate"] == pytest.approx(19 / 20)
    assert row["completion_p99_s"] == pytest.approx(data["p99_e2el_ms"] / 1000)
    assert row["offered_rps"] == 2.0 and row["throughput_rps"] <= 2.0 * 19 / 20 + 1e-12


def test_no_oversample_counts_what_was_sent_not_num_prompts() -> None:
    [row] = ingest_file(FIX / "vllm_bench_serve_no_oversample.json")
    assert row["success_rate"] == 1.0  # 380 completed of 380 sent, num_prompts said 1000


def test_closed_loop_offered_is_the_rate_actually_sent() -> None:
    data = json.loads((FIX / "vllm_bench_serve_closed_loop.json").read_text())
    assert data["request_rate"] == "inf" and data["max_concurrency"] == 8
    [row] = ingest_file(FIX / "vllm_bench_serve_closed_loop.json")
    fastest = min(x for x in data["latencies"] if x > 0)
    assert row["load"] == "C8"
    assert row["offered_rps"] == pytest.approx(200 / (data["duration"] - fastest))
    assert row["throughput_rps"] == pytest.approx(row["offered_rps"])


def test_concurrency_capped_rate_is_not_offered_beyond_what_was_sent(tmp_path) -> None:
    data = json.loads((FIX / "vllm_bench_serve_detailed.json").read_text())
    data.update(request_rate=50.0, max_concurrency=4)  # the cap held the client to ~2 req/s
    [row] = ingest_file(_write(tmp_path, "capped.json", data))
    starts = data["start_times"]
    assert row["offered_rps"] == pytest.approx((len(starts) - 1) / (max(starts) - min(starts)))
    assert row["offered_rps"] < 5


def test_append_result_file_is_one_row_per_run() -> None:
    rows = ingest_file(FIX / "vllm_bench_serve_append.json")
    assert [(r["load"], r["offered_rps"]) for r in rows] == [("r2", 2.0), ("r4", 4.0)]
    with pytest.raises(InputError, match="2 vllm bench result"):
        ingest_file(FIX / "vllm_bench_serve_append.json", loads=["only-one"])


def test_legacy_benchmark_serving_rebuilds_completion_from_ttfts_and_itls() -> None:
    data = json.loads((FIX / "vllm_benchmark_serving_legacy.json").read_text())
    assert "failed" not in data and "latencies" not in data and "request_goodput:" in data
    [row] = ingest_file(FIX / "vllm_benchmark_serving_legacy.json", workload="chat", tp=1)
    ok = [not e for e in data["errors"]]
    e2e = [t + sum(i) for t, i, o in zip(data["ttfts"], data["itls"], ok, strict=True) if o]
    assert row["completion_p99_s"] == pytest.approx(float(np.percentile(e2e, 99)))
    assert row["success_rate"] == pytest.approx(49 / 50) and row["load"] == "5rps"


def test_legacy_p99_latency_ms_is_the_completion_p99(tmp_path) -> None:
    data = {k: v for k, v in VLLM.items() if k != "p99_e2el_ms"}
    data["p99_latency_ms"] = 9100.0
    [row] = ingest_file(_write(tmp_path, "old.json", data))
    assert row["completion_p99_s"] == pytest.approx(9.1)


def test_no_completion_timing_leaves_completion_empty_never_from_means(tmp_path) -> None:
    data = {k: v for k, v in VLLM.items() if k != "p99_e2el_ms"}  # mean_e2el_ms stays: not a p99
    [row] = ingest_file(_write(tmp_path, "v.json", data))
    assert math.isnan(row["completion_p99_s"])
    out = tmp_path / "t.csv"
    assert main(["ingest", str(tmp_path / "v.json"), "--out", str(out)]) == 0
    assert out.read_text().splitlines()[1].split(",")[6] == ""  # empty cell, not 0
    assert math.isnan(read_table(out)["completion_p99_s"][0])


def test_guidellm_current_incomplete_requests_are_not_failures() -> None:
    rows = ingest_file(FIX / "guidellm_current.json", workload="chat", tp=1)
    sync, const = rows
    assert sync["load"] == "synchronous" and sync["success_rate"] == 1.0  # 47 ok, 1 incomplete
    # Closed loop: offers what it sends (47 in the 120 s window).
    assert sync["offered_rps"] == pytest.approx(47 / 120) and sync["throughput_rps"] == pytest.approx(47 / 120)
    assert const["load"] == "constant@2" and const["offered_rps"] == 2.0
    assert const["throughput_rps"] == pytest.approx(238 / 120)
    data = json.loads((FIX / "guidellm_current.json").read_text())
    m = data["benchmarks"][1]["metrics"]
    assert const["ttft_p99_s"] == pytest.approx(m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"] / 1000)
    assert const["completion_p99_s"] == pytest.approx(m["request_latency"]["successful"]["percentiles"]["p99"])


def test_guidellm_v03_schema() -> None:
    [row] = ingest_file(FIX / "guidellm_v03.json", workload="code", tp=2)
    assert row["load"] == "poisson@4" and row["offered_rps"] == 4.0
    assert row["success_rate"] == pytest.approx(236 / 238)  # 3 incomplete left out
    assert row["throughput_rps"] == pytest.approx(236 / 60)


def _mutate(name: str, fn) -> dict:
    data = json.loads((FIX / name).read_text())
    fn(data)
    return data


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_mutate("guidellm_current.json", lambda d: d["benchmarks"][0].__setitem__("metrics", [1, 2])),
         "field 'metrics': expected an object, got list"),
        (_mutate("guidellm_current.json", lambda d: d["benchmarks"][0]["metrics"]["time_to_first_token_ms"]
                 ["successful"]["percentiles"].__setitem__("p99", None)),
         "time_to_first_token_ms.successful.percentiles.p99': expected a number, got null"),
        (_mutate("guidellm_v03.json", lambda d: d["benchmarks"][0]["metrics"]["request_latency"]
                 ["successful"]["percentiles"].__setitem__("p99", "4.9")),
         "request_latency.successful.percentiles.p99': expected a number, got str '4.9'"),
        (_mutate("vllm_bench_serve_detailed.json", lambda d: d.__setitem__("ttfts", [str(x) for x in d["ttfts"]])),
         "field 'ttfts[0]': expected a number, got str"),
        (_mutate("vllm_bench_serve_default.json", lambda d: d.__setitem__("ramp_up_strategy", "linear")),
         "ramp-up run"),
        (_mutate("vllm_benchmark_serving_legacy.json", lambda d: d.update(completed=60)),
         "success rate 1.2 outside [0, 1]"),
    ],
)
def test_malformed_upstream_files_are_one_line_exit_2(tmp_path, capsys, obj, message) -> None:
    p = _write(tmp_path, "bad.json", obj)
    with pytest.raises(InputError) as err:
        ingest_file(p, workload="w", tp=1)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert main(["ingest", str(p), "--workload", "w", "--tp", "1"]) == 2
    assert "Traceback" not in capsys.readouterr().err


@given(
    rate=st.floats(0.1, 100), n=st.integers(1, 300), ok_frac=st.floats(0, 1), drain=st.floats(0, 30),
    fastest=st.floats(0.01, 10), conc=st.sampled_from([None, 1, 8]),
)
@settings(max_examples=60, deadline=None)
def test_ingested_vllm_rows_are_always_physical(rate, n, ok_frac, drain, fastest, conc) -> None:
    completed = int(round(n * ok_frac))
    duration = n / rate + drain + fastest
    data = {**VLLM, "request_rate": rate, "max_concurrency": conc, "num_prompts": n, "completed": completed,
            "failed": n - completed, "duration": duration,
            "latencies": [fastest] * completed + [0.0] * (n - completed)}
    row = rows_from_vllm_bench(data, "h.json")
    assert 0.0 <= row["success_rate"] <= 1.0
    assert row["throughput_rps"] <= row["offered_rps"] * 1.05
    assert row["offered_rps"] > 0
