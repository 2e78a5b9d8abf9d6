"""AIPerf, inference-perf, SGLang bench_serving and llm-d report readers, on real files
(tests/fixtures/ingest/SOURCES.md), plus the legacy benchmark_serving drain."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.backends.ingest import ingest_file
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS, validate_table

FIX = Path(__file__).parent / "fixtures" / "ingest"


def _one(name: str, **kw) -> dict:
    [row] = ingest_file(FIX / name, workload="w", **kw)
    validate_table(pd.DataFrame([row], columns=[*COLUMNS, "failure"]), source=name)
    return row


def _refused(name: str, message: str, **kw) -> None:
    with pytest.raises(InputError) as err:
        ingest_file(FIX / name, workload="w", **kw)
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith(str(FIX / name))


# --- AIPerf ---------------------------------------------------------------------------------


def test_aiperf_dynamo_concurrency_runs() -> None:
    data = json.loads((FIX / "dynamo_aic_medium_profile_export_aiperf.json").read_text())
    row = _one("dynamo_aic_medium_profile_export_aiperf.json", tp=1)
    dur = data["benchmark_duration"]["avg"]
    assert row["load"] == "C4" and row["success_rate"] == 1.0  # error_request_count null: none
    assert row["ttft_p99_s"] == pytest.approx(data["time_to_first_token"]["p99"] / 1000)
    assert row["completion_p99_s"] == pytest.approx(data["request_latency"]["p99"] / 1000)
    assert row["duration_s"] == dur
    # closed loop: offered = what it sent; served = 100 / duration, the file's request_throughput
    assert row["offered_rps"] == pytest.approx(100 / dur) == pytest.approx(data["request_throughput"]["avg"])
    assert row["throughput_rps"] == pytest.approx(100 / dur)
    idle = _one("dynamo_online_idle_profile_export_aiperf.json", tp=2)
    assert idle["load"] == "C1" and idle["tp"] == 2
    assert idle["ttft_p99_s"] == pytest.approx(2.05961771758)


def test_aiperf_cancellation_run_is_refused_and_old_layout_read(tmp_path) -> None:
    _refused("aiperf_run1_cancellation_profile_export_aiperf.json",
             "request_cancellation_rate = 10.0: the client cancelled requests on purpose")
    data = json.loads((FIX / "aiperf_run1_cancellation_profile_export_aiperf.json").read_text())
    del data["input_config"]["loadgen"]["request_cancellation_rate"]  # the `records` layout itself
    p = tmp_path / "old.json"
    p.write_text(json.dumps(data))
    [row] = ingest_file(p, workload="w", tp=1)
    assert row["success_rate"] == pytest.approx(89 / 100)  # request_count 89, error_request_count 11
    assert row["ttft_p99_s"] == pytest.approx(data["records"]["ttft"]["p99"] / 1000)


def test_aiperf_p90_only_is_refused(tmp_path) -> None:
    data = json.loads((FIX / "dynamo_aic_medium_profile_export_aiperf.json").read_text())
    del data["time_to_first_token"]["p99"]
    p = tmp_path / "p90.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"'time_to_first_token' has no p99 \(only .*p90.*\); a lower percentile"):
        ingest_file(p, workload="w", tp=1)


# --- inference-perf -----------------------------------------------------------------------


def test_inference_perf_stage_files() -> None:
    data = json.loads((FIX / "inference_perf_vllm_stage_0_lifecycle_metrics.json").read_text())
    row = _one("inference_perf_vllm_stage_0_lifecycle_metrics.json", tp=1)
    assert row["load"] == "1rps" and row["offered_rps"] == 1.0
    assert row["duration_s"] == data["load_summary"]["send_duration"]
    assert row["ttft_p99_s"] == data["successes"]["latency"]["time_to_first_token"]["p99"]
    assert row["completion_p99_s"] == data["successes"]["latency"]["request_latency"]["p99"]
    # the file's served rate 1.017 is above the offered 1.0; the row keeps the table's rule
    assert row["throughput_rps"] == 1.0 and row["success_rate"] == 1.0
    eagle = _one("inference_perf_eagle_stage_3_lifecycle_metrics.json", tp=1)
    assert eagle["offered_rps"] == 52.49 and eagle["throughput_rps"] == pytest.approx(51.63746915121225)


def test_inference_perf_client_behind_schedule_offers_what_it_sent() -> None:
    [row] = ingest_file(FIX / "inference_perf_vllm_stage_6_lifecycle_metrics.json", workload="w", tp=1,
                        details=True)
    assert row["load"] == "183.38rps"
    assert row["offered_rps"] == pytest.approx(106.54759673128557)
    assert "below the requested 183.4 req/s" in row["note"]


def test_inference_perf_summary_is_refused() -> None:
    _refused("inference_perf_vllm_summary_lifecycle_metrics.json", "a summary over all stages", tp=1)


# --- SGLang -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sglang_llama_3_3_70b_online_output.jsonl",
                                  "sglang_llama_3_3_70b_offline_output.jsonl"])
def test_sglang_old_files_have_no_p99_and_are_refused(name) -> None:
    with pytest.raises(InputError) as err:
        ingest_file(FIX / name, workload="w", tp=4)
    assert f"{FIX / name}: line 1: no p99_ttft_ms (this bench_serving writes median_ttft_ms only)" in str(err.value)


def test_sglang_newer_lines_read_one_row_each(tmp_path) -> None:
    lines = [json.loads(x) for x in (FIX / "sglang_llama_3_3_70b_online_output.jsonl").read_text().splitlines()]
    for d in lines:  # what newer bench_serving writes besides: p99s
        d["p99_ttft_ms"] = 2.0 * d["median_ttft_ms"]
        d["p99_e2e_latency_ms"] = 1.5 * d["median_e2e_latency_ms"]
    p = tmp_path / "new.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    rows = ingest_file(p, workload="w", tp=4)
    assert [r["load"] for r in rows] == [f"{d['request_rate']:g}rps" for d in lines]
    for r, d in zip(rows, lines, strict=True):
        assert r["success_rate"] == 1.0 and r["offered_rps"] == d["request_rate"]
        assert r["ttft_p99_s"] == pytest.approx(d["p99_ttft_ms"] / 1000)
        assert r["throughput_rps"] == pytest.approx(min(d["completed"] / d["duration"], d["request_rate"]))
    offline = [json.loads(x) for x in (FIX / "sglang_llama_3_3_70b_offline_output.jsonl").read_text().splitlines()]
    d = dict(offline[0], p99_ttft_ms=1.0)
    p.write_text(json.dumps(d).replace("Infinity", "Infinity"))
    [row] = ingest_file(p, workload="w", tp=4)
    assert row["load"] == "max" and row["offered_rps"] == pytest.approx(d["completed"] / d["duration"])


# --- llm-d ------------------------------------------------------------------------------


def test_llmd_examples() -> None:
    _refused("llmd_br_v0_1_example.yaml", "not one engine replica (prefill×1, decode×1, decode×1)")
    _refused("llmd_br_v0_1_example.yaml", "'metrics.latency.time_to_first_token' has no p99 (only p10, p50, p90)",
             tp=8)
    _refused("llmd_br_v0_2_example.yaml", "the stack is not one engine replica (decode×2)")
    _refused("llmd_br_v0_2_1_example.yaml", "2262 req/s served but 10 req/s offered", tp=8)
    row = _one("llmd_br_v0_2_edited_one_replica.yaml")
    assert row["tp"] == 8 and row["load"] == "10rps" and row["offered_rps"] == 10.0
    assert row["duration_s"] == pytest.approx(49.97206788184121)
    assert row["ttft_p99_s"] == pytest.approx(0.05029489721637218)
    assert math.isnan(row["completion_p99_s"])  # request_latency has a mean only: unobserved


# --- legacy benchmark_serving drain -------------------------------------------------------


def _legacy(**kw) -> dict:
    d = {"backend": "vllm", "num_prompts": 300, "request_rate": 10.0, "max_concurrency": None,
         "duration": 36.0, "completed": 300, "p99_ttft_ms": 150.0}
    d.update(kw)
    return d


def test_legacy_all_completed_open_loop_reads_the_offered_rate(tmp_path, capsys) -> None:
    p = tmp_path / "legacy.json"
    p.write_text(json.dumps(_legacy()))
    [row] = ingest_file(p, workload="w", tp=1, details=True)
    assert row["throughput_rps"] == 10.0 and row["offered_rps"] == 10.0  # not 300 / 36 = 8.33
    assert "completed / duration, 8.333 req/s, counts the drain" in row["note"]
    assert math.isnan(row["completion_p99_s"])
    assert main(["ingest", str(p), "--workload", "w", "--tp", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "note:" in captured.err and "note" not in json.loads(captured.out)[0]


def test_legacy_with_failures_keeps_completed_over_duration(tmp_path) -> None:
    p = tmp_path / "legacy.json"
    p.write_text(json.dumps(_legacy(completed=290)))
    [row] = ingest_file(p, workload="w", tp=1, details=True)
    assert row["throughput_rps"] == pytest.approx(290 / 36) and "note" not in row


def test_unknown_format_is_one_line(tmp_path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(InputError, match=r"x.json: unknown result format"):
        ingest_file(p, workload="w", tp=1)


# --- no ingested row breaks the table rule ------------------------------------------------

_num = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
_pos = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
_count = st.integers(min_value=0, max_value=5000)


def _aiperf(ok, err, dur, rate, conc, p99, thr) -> dict:
    lg = {k: v for k, v in (("request_rate", rate), ("concurrency", conc)) if v is not None}
    return {"input_config": {"loadgen": lg}, "request_count": {"avg": ok}, "error_request_count": {"avg": err},
            "benchmark_duration": {"unit": "sec", "avg": dur},
            "time_to_first_token": {"unit": "ms", "p99": p99}, "request_latency": {"unit": "ms", "p99": 2 * p99}}


def _ip(ok, err, dur, rate, conc, p99, thr) -> dict:
    ls = {"send_duration": dur, "achieved_rate": thr + 1e-3}
    if rate is not None:
        ls["requested_rate"] = rate
    lat = {"time_to_first_token": {"p99": p99}, "request_latency": {"p99": 2 * p99}}
    return {"load_summary": ls, "successes": {"count": ok, "latency": lat, "throughput": {"requests_per_sec": thr}},
            "failures": {"count": err}}


def _sgl(ok, err, dur, rate, conc, p99, thr) -> dict:
    return {"backend": "sglang", "completed": ok, "duration": dur, "median_e2e_latency_ms": 1.0,
            "request_rate": rate if rate is not None else "inf", "max_concurrency": conc, "p99_ttft_ms": p99}


def _llmd(ok, err, dur, rate, conc, p99, thr) -> dict:
    engine = {"standardized": {"kind": "inference_engine", "replicas": 1,
                               "accelerator": {"parallelism": {"tp": 2}}}}
    agg = {"requests": {"total": ok + err, "failures": err},
           "latency": {"time_to_first_token": {"units": "ms", "p99": p99}},
           "throughput": {"request_rate": {"units": "queries/s", "mean": thr}}}
    std = {"rate_qps": rate, "concurrency": conc if conc is not None else float("inf")}
    return {"version": "0.2", "run": {"time": {"duration": f"PT{dur}S"}},
            "scenario": {"stack": [engine], "load": {"standardized": std}},
            "results": {"request_performance": {"aggregate": agg}}}


def _write(tmp_path: Path, fmt, obj: dict) -> Path:
    if fmt is _llmd:
        import yaml

        p = tmp_path / "r.yaml"
        p.write_text(yaml.safe_dump(obj))
    else:
        p = tmp_path / "r.json"
        p.write_text(json.dumps(obj))
    return p


# The p99 TTFT each generator writes, in its format's unit (inference-perf's default is seconds).
_TTFT_SCALE = {_aiperf: 1e-3, _ip: 1.0, _sgl: 1e-3, _llmd: 1e-3}
_CONTRADICTION = re.compile(r": field '[^']+': ([0-9.e+-]+) req/s served but ([0-9.e+-]+) req/s offered; "
                            r"the file contradicts itself and is not converted$")
_NOTHING_SENT = ("no requests (", "no completed or failed request", "no request completed in a closed-loop run")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from([_aiperf, _ip, _sgl, _llmd]), ok=_count, err=_count, dur=_pos,
       rate_factor=st.none() | st.floats(min_value=1.0, max_value=4.0), conc=st.none() | st.integers(1, 512),
       p99=_num, thr_frac=st.floats(min_value=0.0, max_value=1.0),
       raw=st.one_of(st.none(), st.none(), st.none(), st.tuples(st.none() | _pos, _num)))  # 3 in 4 consistent
def test_no_ingested_row_breaks_the_table_rule(tmp_path, fmt, ok, err, dur, rate_factor, conc, p99, thr_frac,
                                               raw) -> None:
    """Most files are consistent (an open-loop rate at least what was sent, a reported throughput at
    most what succeeded): each parses to its own numbers, refused only when nothing was sent. The
    rest (``raw``: any rate and throughput) parse to a valid row or are refused in one line naming
    the file and the field whose served rate exceeds the offered one."""
    sent = ok + err
    if raw is None:
        rate = None if rate_factor is None else max(sent, 1) / dur * rate_factor
        thr = ok / dur * thr_frac
    else:
        rate, thr = raw
    p = _write(tmp_path, fmt, fmt(ok, err, dur, rate, conc, p99, thr))
    # Nothing sent (SGLang counts no errors: nothing completed), and no open-loop rate to offer.
    sgl_open = fmt is _sgl and rate is not None and conc is None
    nothing = (ok == 0 and not sgl_open) if fmt is _sgl else sent == 0
    try:
        rows = ingest_file(p, workload="w", tp=1)
    except InputError as exc:
        event(f"{fmt.__name__[1:]}: refused")  # --hypothesis-show-statistics: the share of each outcome
        text = str(exc)
        assert "\n" not in text and text.startswith(f"{p}: "), text
        if nothing:
            assert any(reason in text for reason in _NOTHING_SENT), text
            return
        # Anything else refused is a raw file whose served rate contradicts its offered rate.
        assert raw is not None, f"a consistent file was refused: {text}"
        m = _CONTRADICTION.search(text)
        assert m is not None, text
        assert float(m.group(1)) > float(m.group(2)), text
        return
    event(f"{fmt.__name__[1:]}: parsed")
    assert not nothing, f"a file with nothing sent was converted: {rows}"
    [row] = rows
    assert (row["workload"], row["tp"]) == ("w", 1)
    assert row["duration_s"] == pytest.approx(dur, rel=1e-12)
    success = (1.0 if ok > 0 else 0.0) if fmt is _sgl else ok / sent
    assert row["success_rate"] == pytest.approx(success, rel=1e-12)
    assert row["ttft_p99_s"] == (pytest.approx(p99 * _TTFT_SCALE[fmt], rel=1e-12) if ok > 0 else math.inf)
    assert row["throughput_rps"] <= row["offered_rps"] * row["success_rate"] * (1 + 1e-12)
    if raw is None and fmt is _llmd and ok > 0:  # the report's own served rate, under the cap
        assert row["throughput_rps"] == pytest.approx(thr, rel=1e-9)
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "note"} for r in rows], columns=[*COLUMNS, "failure"])
    validate_table(df, source="hypothesis")  # raises on any broken row


# --- llm-d reports: the values a report holds are the values its row has ------------------

_AGG = "results.request_performance.aggregate"


@st.composite
def _llmd_case(draw) -> dict:
    counted = draw(st.integers(1, 10_000))
    return {
        "counted": counted,
        "ok": draw(st.integers(0, counted)),
        "incomplete": draw(st.integers(0, 50)),
        "dur": draw(st.floats(min_value=1.0, max_value=1e4)),
        "tp": draw(st.integers(1, 8)),
        "mode": draw(st.sampled_from(["open", "capped", "closed-C", "closed"])),
        "rate": draw(st.floats(min_value=0.01, max_value=500.0)),
        "conc": draw(st.integers(1, 512)),
        "ttft_ms": draw(st.floats(min_value=0.0, max_value=1e5)),
        "e2e_ms": draw(st.none() | st.floats(min_value=0.0, max_value=1e6)),
        "frac": draw(st.floats(min_value=0.0, max_value=1.04)),  # above 1: the reader's cap applies
        "lengths": draw(st.none() | st.tuples(st.floats(1.0, 1e4), st.floats(1.0, 1e4))),
    }


def _llmd_report(c: dict, defect: str | None = None) -> tuple[dict, dict]:
    """A v0.2 report of case ``c`` (with ``defect``: one thing wrong), and the row the module
    docstring's table gives it (for a valid report)."""
    ok, counted = c["ok"], c["counted"]
    if defect == "nothing":
        ok = counted = 0
    per_s = max(counted, 1) / c["dur"]
    if c["mode"] == "open":
        offered, label = c["rate"], f"{c['rate']:g}rps"
    elif c["mode"] == "capped":
        offered, label = min(c["rate"], per_s), f"{c['rate']:g}rps-C{c['conc']}"
    else:
        offered, label = per_s, (f"C{c['conc']}" if c["mode"] == "closed-C" else "closed")
    success = ok / counted if counted else 0.0
    thr = offered * success * c["frac"]
    if defect == "overstated":
        from fleetsieve_bayes.table import max_throughput_rps

        thr = max_throughput_rps(offered, c["dur"]) * 1.5 + 1.0
    engine = {"standardized": {"kind": "inference_engine", "replicas": 2 if defect == "replicas" else 1,
                               "accelerator": {"parallelism": {"tp": c["tp"]}}}}
    latency = {"time_to_first_token": {"units": "ms", ("p90" if defect == "no-p99" else "p99"): c["ttft_ms"]}}
    if c["e2e_ms"] is not None:
        latency["request_latency"] = {"units": "ms", "p50": c["e2e_ms"] / 2, "p99": c["e2e_ms"]}
    requests = {"total": counted + c["incomplete"], "failures": counted - ok, "incomplete": c["incomplete"]}
    if c["lengths"] is not None:
        requests.update(input_length={"mean": c["lengths"][0]}, output_length={"mean": c["lengths"][1]})
    std = {}
    if c["mode"] in ("open", "capped") or defect == "sweep":
        std["rate_qps"] = [c["rate"], 2 * c["rate"]] if defect == "sweep" else c["rate"]
    if c["mode"] in ("capped", "closed-C"):
        std["concurrency"] = c["conc"]
    elif c["mode"] == "open":
        std["concurrency"] = float("inf")
    report = {"version": "0.2", "run": {"time": {"duration": f"PT{c['dur']!r}S"}},
              "scenario": {"stack": [engine], "load": {"standardized": std}},
              "results": {"request_performance": {"aggregate": {
                  "requests": requests, "latency": latency,
                  "throughput": {"request_rate": {"units": "queries/s", "mean": thr}}}}}}
    from fleetsieve_bayes.backends.failures import NO_SUCCESS

    if ok == 0:
        served = {"throughput_rps": 0.0, "ttft_p99_s": math.inf, "completion_p99_s": math.inf,
                  "success_rate": 0.0, "failure": NO_SUCCESS}
    else:
        served = {"throughput_rps": pytest.approx(min(thr, offered * success), rel=1e-12),
                  "ttft_p99_s": pytest.approx(c["ttft_ms"] / 1000, rel=1e-12),
                  "completion_p99_s": (math.nan if c["e2e_ms"] is None
                                       else pytest.approx(c["e2e_ms"] / 1000, rel=1e-12)),
                  "success_rate": pytest.approx(success, rel=1e-12), "failure": ""}
    row = {"workload": "w", "tp": c["tp"], "load": label, "offered_rps": pytest.approx(offered, rel=1e-12),
           "duration_s": c["dur"], **served, **({} if c["lengths"] is None else {"lengths": c["lengths"]})}
    return report, row


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=_llmd_case())
def test_llmd_report_round_trips_to_its_row(tmp_path, c) -> None:
    """A valid v0.2 report gives a row of exactly its numbers (TP from the stack, the load label
    from its rate and concurrency, the served rate capped at offered x success, its lengths)."""
    report, expected = _llmd_report(c)
    [row] = ingest_file(_write(tmp_path, _llmd, report), workload="w", details=True)
    if c["e2e_ms"] is None and c["ok"] > 0:  # unobserved: NaN, which equals nothing
        assert math.isnan(row.pop("completion_p99_s"))
        expected.pop("completion_p99_s")
    assert row == expected


@pytest.mark.parametrize(
    ("defect", "message"),
    [
        ("sweep", "field 'scenario.load.standardized.rate_qps' is a list"),
        ("replicas", "the stack is not one engine replica (replica×2)"),
        ("no-p99", f"field '{_AGG}.latency.time_to_first_token' has no p99 (only p90)"),
        ("overstated", "field 'throughput.request_rate.mean': "),
        ("nothing", f"{_AGG}.requests: no completed or failed request (total {{n}}, incomplete {{n}})"),
    ],
)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=_llmd_case())
def test_llmd_report_with_one_defect_is_refused_in_one_line(tmp_path, defect, message, c) -> None:
    if defect == "no-p99":
        c["ok"] = max(c["ok"], 1)  # with no success there is no TTFT to read, so none is missed
    report, _ = _llmd_report(c, defect)
    p = _write(tmp_path, _llmd, report)
    with pytest.raises(InputError) as err:
        ingest_file(p, workload="w", details=True)
    text = str(err.value)
    assert text.startswith(f"{p}: ") and "\n" not in text, text
    assert message.format(n=c["incomplete"]) in text, text


# --- a result against a class's trace: other lengths are another workload -----------------


def test_trace_lengths_refuse_another_workload(tmp_path, capsys) -> None:
    from fleetsieve_bayes.backends.traces import write_azure_trace

    trace = tmp_path / "class.csv"
    write_azure_trace(trace, [0.0, 1.0, 2.0], [2000, 2100, 2044], [250, 260, 258])  # means 2048, 256
    aiperf = FIX / "dynamo_aic_medium_profile_export_aiperf.json"  # ISL 2048, OSL 256
    assert main(["ingest", str(aiperf), "--workload", "w", "--tp", "1", "--trace", str(trace)]) == 0
    capsys.readouterr()
    other = tmp_path / "other.csv"
    write_azure_trace(other, [0.0, 1.0], [1000, 1000], [256, 256])
    assert main(["ingest", str(aiperf), "--workload", "w", "--tp", "1", "--trace", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "mean prompt 2048 tokens against 1000" in err and "another workload" in err and "\n" not in err
    [row] = ingest_file(FIX / "inference_perf_vllm_stage_0_lifecycle_metrics.json", workload="w", tp=1,
                        details=True)
    assert row["lengths"] == pytest.approx((204.1, 63.15))


def test_aiperf_metrics_nested_layout(tmp_path) -> None:
    data = json.loads((FIX / "dynamo_online_idle_profile_export_aiperf.json").read_text())
    names = ("request_count", "error_request_count", "benchmark_duration", "time_to_first_token",
             "request_latency", "input_sequence_length", "output_sequence_length")
    nested = {"aiperf_version": "0.12.0", "input_config": data["input_config"],
              "metrics": {k: data[k] for k in names}}
    p = tmp_path / "nested.json"
    p.write_text(json.dumps(nested))
    assert ingest_file(p, workload="w", tp=2) == ingest_file(FIX / "dynamo_online_idle_profile_export_aiperf.json",
                                                             workload="w", tp=2)
