"""`ingest`: vllm bench serve results and GuideLLM benchmarks.json → table rows."""

from __future__ import annotations

import json
import math

import pytest

from fleetsieve_bayes.backends.ingest import ingest_file
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
                "request_totals": {"successful": 120 * (i + 1), "errored": 0, "incomplete": 0, "total": 150 * (i + 1)},
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


def test_vllm_bench_inf_rate_and_detailed_latencies(tmp_path) -> None:
    data = {k: v for k, v in VLLM.items() if k not in ("p99_ttft_ms", "p99_e2el_ms", "workload", "tp", "load")}
    data["request_rate"] = "inf"
    data["ttfts"] = [0.1, 0.2, 0.0]
    data["latencies"] = [1.0, 2.0, 0.0]
    data["errors"] = ["", "", "timeout"]
    [row] = ingest_file(_write(tmp_path, "v.json", data), workload="code", tp=2, loads=["L1"])
    assert row["offered_rps"] == 100 / 25  # num_prompts / duration when the rate was inf
    assert row["ttft_p99_s"] == pytest.approx(0.199) and row["completion_p99_s"] == pytest.approx(1.99)
    assert (row["workload"], row["tp"], row["load"]) == ("code", 2, "L1")


def test_guidellm_benchmarks(tmp_path) -> None:
    rows = ingest_file(_write(tmp_path, "benchmarks.json", _guidellm()), workload="chat", tp=8)
    assert [r["load"] for r in rows] == ["constant@2.5", "constant@5"]
    assert rows[1]["offered_rps"] == 5.0 and rows[1]["throughput_rps"] == 4.0
    assert rows[1]["success_rate"] == 0.8 and rows[1]["ttft_p99_s"] == 0.8 and rows[1]["completion_p99_s"] == 15.0
    rows = ingest_file(tmp_path / "benchmarks.json", workload="chat", tp=8, loads=["a", "b"])
    assert [r["load"] for r in rows] == ["a", "b"]


def test_guidellm_no_success_has_infinite_tails(tmp_path) -> None:
    g = _guidellm(1)
    g["benchmarks"][0]["metrics"]["request_totals"]["successful"] = 0
    [row] = ingest_file(_write(tmp_path, "g.json", g), workload="w", tp=1)
    assert row["success_rate"] == 0.0 and math.isinf(row["ttft_p99_s"])


@pytest.mark.parametrize(
    ("obj", "kwargs", "message"),
    [
        ({k: v for k, v in VLLM.items() if k != "workload"}, {}, "no workload label"),
        ({**VLLM, "tp": "four"}, {}, "tp label 'four' is not an integer"),
        ({k: v for k, v in VLLM.items() if k != "p99_e2el_ms"}, {}, "missing field 'p99_e2el_ms'"),
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
