"""`classes`: workload classes from a request log (real Azure 2023 trace, synthetic mixtures)."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

from fleetsieve_bayes.backends.traces import read_azure_trace, window_rate
from fleetsieve_bayes.campaign.config import parse_campaign
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.workloads import (
    RequestLog,
    adjusted_rand_index,
    assign,
    classify,
    read_log,
    read_logs,
    write_outputs,
)

AZURE = data_dir("examples") / "azure_llm_2023"
CODE, CONV = AZURE / "code.csv", AZURE / "conv.csv"


@pytest.fixture(scope="module")
def azure_log() -> RequestLog:
    return read_logs([CODE, CONV])


@pytest.fixture(scope="module")
def azure_classes(azure_log):
    return classify(azure_log)


def _centres(cls, service: str) -> np.ndarray:
    return np.log(np.array([c.centre_tokens for c in cls.classes if c.service == service]))


def _subset(log: RequestLog, mask: np.ndarray) -> RequestLog:
    return RequestLog(log.arrival_s[mask], log.input_tokens[mask], log.output_tokens[mask], log.service[mask],
                      log.services, log.sources, log.origins, 0)


# --- the real Azure trace ------------------------------------------------------------------


def test_azure_two_services_and_their_classes(azure_log, azure_classes):
    assert azure_log.services == ("code", "conv")
    assert azure_log.n == 8819 + 19366
    assert azure_classes.k_per_service == {"code": 2, "conv": 3}
    names = [c.name for c in azure_classes.classes]
    assert names == ["code-0", "code-1", "conv-0", "conv-1", "conv-2"]
    # every request is in exactly one class of its own service
    assert (azure_classes.labels >= 0).all()
    for c in azure_classes.classes:
        assert set(azure_log.service[c.index]) == {azure_log.services.index(c.service)}


@pytest.mark.parametrize("path,service", [(CODE, "code"), (CONV, "conv")])
def test_azure_mean_rate_matches_the_trace(azure_classes, path, service):
    """The classes' mean rates add up to the service's trace rate (within 2 % of n / span)."""
    trace = read_azure_trace(path)
    total = sum(c.mean_rps for c in azure_classes.classes if c.service == service)
    assert total == pytest.approx(trace.rate_rps, rel=1e-12)
    naive = trace.n / float(trace.arrival_s[-1])
    assert abs(total / naive - 1) < 0.02


def test_azure_classes_stable_across_halves(azure_log, azure_classes):
    """Fitted on either half (by time), the same K per service, and the whole trace assigned to
    the half's centres agrees with the full fit: ARI >= 0.9 (measured 0.93-0.98)."""
    for part in ("first", "second"):
        mask = np.zeros(azure_log.n, dtype=bool)
        for s in range(len(azure_log.services)):
            rows = np.flatnonzero(azure_log.service == s)
            t = azure_log.arrival_s[rows]
            sel = rows[t <= np.median(t)] if part == "first" else rows[t > np.median(t)]
            mask[sel] = True
        half = classify(_subset(azure_log, mask))
        assert half.k_per_service == azure_classes.k_per_service, part
        for s, svc in enumerate(azure_log.services):
            rows = np.flatnonzero(azure_log.service == s)
            inp, out = azure_log.input_tokens[rows], azure_log.output_tokens[rows]
            ari = adjusted_rand_index(assign(inp, out, _centres(azure_classes, svc)),
                                      assign(inp, out, _centres(half, svc)))
            assert ari >= 0.9, (part, svc, ari)


def test_deterministic_outputs(tmp_path, azure_log, azure_classes):
    a, b = tmp_path / "a", tmp_path / "b"
    write_outputs(azure_log, azure_classes, a, plots=False)
    write_outputs(read_logs([CODE, CONV]), classify(read_logs([CODE, CONV])), b, plots=False)
    for f in ["classes.json", "campaign.toml", *[f"traces/{c}.csv" for c in ("code-0", "conv-2")]]:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_trace_round_trip_and_replay_reaches_peak(tmp_path, azure_log, azure_classes):
    summ = write_outputs(azure_log, azure_classes, tmp_path, plots=False)
    for c, entry in zip(azure_classes.classes, summ["classes"], strict=True):
        trace = read_azure_trace(tmp_path / entry["trace"])
        np.testing.assert_array_equal(trace.input_tokens, azure_log.input_tokens[c.index])
        np.testing.assert_array_equal(trace.output_tokens, azure_log.output_tokens[c.index])
        t = azure_log.arrival_s[c.index]
        np.testing.assert_allclose(trace.arrival_s, t - t[0], atol=1e-6)
        # The campaign replays the class's own lengths at a scale: at replay_scale_for_peak its
        # send plan offers the class's peak demand (backends/traces.py, tiled over 3 periods).
        scale = entry["replay_scale_for_peak"]
        horizon = 3 * trace.period_s / scale
        assert window_rate(trace, scale, 0.0, horizon) == pytest.approx(c.peak_rps, rel=1e-9, abs=2 / horizon)
        assert c.peak_rps >= c.mean_rps


def test_skeleton_refused_until_slos_filled(tmp_path, azure_log, azure_classes):
    write_outputs(azure_log, azure_classes, tmp_path, plots=False)
    path = tmp_path / "campaign.toml"
    raw = tomllib.loads(path.read_text())
    assert [w["name"] for w in raw["workloads"]] == [c.name for c in azure_classes.classes]
    assert [w["demand_rps"] for w in raw["workloads"]] == pytest.approx(
        [c.peak_rps for c in azure_classes.classes], rel=1e-5)
    assert set(raw["measurement"]["traces"]) == {c.name for c in azure_classes.classes}
    raw["fleet"]["gpus"] = 16
    raw["model"]["family"] = "dense-8b-bf16-h100"
    raw["measurement"]["model"] = "/models/m"
    with pytest.raises(InputError, match=r"\[\[workloads\]\] 'code-0' slo\.success_min: still 'TODO'"):
        parse_campaign(raw, path)
    for w in raw["workloads"]:
        w["slo"] = {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 20.0}
    campaign = parse_campaign(raw, path)
    assert campaign.workload_names == tuple(c.name for c in azure_classes.classes)
    # and the CLI says it in one line, exit 2
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 2


def test_cli_json_and_figures(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["classes", str(CODE), "--out", str(out), "--json", "--window", "5m", "--peak", "p99"]) == 0
    summ = json.loads(capsys.readouterr().out)
    assert summ["window_s"] == 300 and summ["peak_percentile"] == 99
    assert [c["name"] for c in summ["classes"]] == ["code-0", "code-1"]
    assert json.loads((out / "classes.json").read_text())["classes"] == summ["classes"]
    for f in ("classes.png", "rate.png", "report.html"):
        assert (out / f).stat().st_size > 1000
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 2


# --- a synthetic mixture with known classes ----------------------------------------------


def _mixture(n_per: tuple[int, ...], seed: int = 3):
    rng = np.random.default_rng(seed)
    centres = [(100, 20), (2000, 30), (800, 600)]
    inp, out, truth = [], [], []
    for j, (n, (p, o)) in enumerate(zip(n_per, centres, strict=False)):
        inp.append(np.round(np.exp(rng.normal(np.log(p), 0.3, n))))
        out.append(np.round(np.exp(rng.normal(np.log(o), 0.3, n))))
        truth.append(np.full(n, j))
    order = rng.permutation(sum(n_per))
    return (np.concatenate(inp)[order].astype(int), np.concatenate(out)[order].astype(int),
            np.concatenate(truth)[order])


def test_synthetic_mixture_recovered_with_a_service_column(tmp_path):
    inp, out, truth = _mixture((600, 900, 500))
    n = len(inp)
    t = np.sort(np.random.default_rng(1).uniform(0, 1800, n))
    tenant = np.where(np.arange(n) % 4 == 0, "b", "a")
    lines = ["ts,model,prompt_tokens,completion_tokens"] + [
        f"{t[i]:.3f},{tenant[i]},{inp[i]},{out[i]}" for i in range(n)]
    p = tmp_path / "log.csv"
    p.write_text("\n".join(lines) + "\n")
    log = read_log(p, columns={"ts": "ts", "prompt": "prompt_tokens", "output": "completion_tokens",
                               "service": "model"})
    assert log.services == ("a", "b")
    cls = classify(log)
    assert cls.k_per_service == {"a": 3, "b": 3}
    for s in range(2):
        rows = np.flatnonzero(log.service == s)
        assert adjusted_rand_index(cls.labels[rows], truth[rows]) > 0.99
    # the class centres are the known ones (geometric means), in sorted order
    got = np.array([c.centre_tokens for c in cls.classes if c.service == "a"])
    np.testing.assert_allclose(got, [(100, 20), (800, 600), (2000, 30)], rtol=0.05)


def test_one_cluster_is_one_class(tmp_path):
    rng = np.random.default_rng(0)
    n = 500
    p = tmp_path / "one.jsonl"
    inp = np.round(np.exp(rng.normal(np.log(1000), 0.4, n))).astype(int)  # one lognormal blob
    out = np.round(np.exp(rng.normal(np.log(100), 0.4, n))).astype(int)
    p.write_text("".join(json.dumps({"timestamp": i * 1000, "input_length": int(inp[i]),
                                     "output_length": int(out[i]), "hash_ids": [1]}) + "\n"
                         for i in range(n)))
    cls = classify(read_log(p))
    assert cls.k_per_service == {"one": 1}
    assert cls.classes[0].mean_rps == pytest.approx(n / (n - 1 + 1))  # span n-1 s + one gap


def test_explicit_k_and_percentile_values(tmp_path):
    inp, out, _ = _mixture((300, 300, 300))
    t = np.arange(len(inp)) * 0.5  # 2 req/s, steady
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"{t[i]:.1f},{inp[i]},{out[i]}" for i in range(len(inp))]
    p = tmp_path / "steady.csv"
    p.write_text("\n".join(lines) + "\n")
    cls = classify(read_log(p, "azure"), k=1, window_s=60.0)
    (c,) = cls.classes
    np.testing.assert_array_equal(c.window_rates, np.full(7, 2.0))  # 449.5 s span: 7 full windows
    assert c.peak_rps == 2.0


# --- readers -------------------------------------------------------------------------------


def test_azure_2024_timestamps_with_offset(tmp_path):
    p = tmp_path / "a24.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,2162,5\n2024-05-10 00:00:01.509930+00:00,100,7\n"
                 "2024-05-10 00:00:02+00:00,10,7\n")  # the release mixes stamps with and without fractions
    log = read_log(p)
    np.testing.assert_allclose(log.arrival_s, [0.0, 1.5, 1.99007])
    np.testing.assert_allclose(read_azure_trace(p).arrival_s, [0.0, 1.5, 1.99007])


def test_burstgpt_model_column_is_the_service(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
                 "47,GPT-4,417,276,693,Conversation log\n")
    log = read_log(p)
    assert log.services == ("ChatGPT", "GPT-4") and log.dropped == 1 and log.n == 2


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_one_line(tmp_path, capsys):
    out = str(tmp_path / "o")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty.csv: empty trace" in _cli_error(capsys, ["classes", str(empty), "--out", out])
    header_only = tmp_path / "hdr.csv"
    header_only.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert "hdr.csv: empty trace" in _cli_error(capsys, ["classes", str(header_only), "--out", out])
    notok = tmp_path / "notok.csv"
    notok.write_text("time,prompt\n1,5\n2,6\n")
    err = _cli_error(capsys, ["classes", str(notok), "--out", out, "--columns", "ts=time,prompt=prompt,output=out"])
    assert "notok.csv: no column 'out' for output (token counts)" in err
    assert "notok.csv: unknown trace format" in _cli_error(capsys, ["classes", str(notok), "--out", out])
    back = tmp_path / "back.csv"
    back.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:01,5,5\n"
                    "2023-11-16 18:00:02,5,5\n2023-11-16 18:00:00,5,5\n")
    assert "back.csv: line 4: timestamp goes back in time" in _cli_error(capsys, ["classes", str(back), "--out", out])
    small = tmp_path / "small.csv"
    small.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{i:02d}:00,5,5\n" for i in range(10)))
    assert "small.csv: 10 requests, fewer than the 30" in _cli_error(capsys, ["classes", str(small), "--out", out])
    assert "missing.csv: trace file not found" in _cli_error(capsys, ["classes", str(tmp_path / "missing.csv"),
                                                                       "--out", out])
    assert "--window" in _cli_error(capsys, ["classes", str(CODE), "--out", out, "--window", "soon"])


def test_k_too_large_names_the_class(capsys, tmp_path):
    inp, out, _ = _mixture((200, 200, 25))
    t = np.arange(len(inp)) * 1.0
    p = tmp_path / "mix.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{t[i]:.1f},{inp[i]},{out[i]}\n" for i in range(len(inp))))
    err = _cli_error(capsys, ["classes", str(p), "--out", str(tmp_path / "o"), "--k", "3"])
    assert "mix.csv: class 1 of 3 has 25 requests, fewer than 30; use a smaller --k" in err
    # auto skips the K whose small class would be refused
    assert classify(read_log(p)).k_per_service == {"mix": 2}


def test_mooncake_trace_replays(tmp_path):
    from fleetsieve_bayes.backends.traces import read_mooncake_trace

    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}\n'
                 '{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46]}\n\n')
    tr = read_mooncake_trace(p)
    np.testing.assert_allclose(tr.arrival_s, [0.0, 3.053])
    np.testing.assert_array_equal(tr.input_tokens, [6955, 6472])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 5}\n{"timestamp": 2, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(InputError, match=r"bad.jsonl: line 1, field 'output_length'"):
        read_log(bad)


def test_a_small_service_of_a_column_is_named(tmp_path, capsys):
    lines = ["ts,model,p,o"] + [f"{i},big,{100 + i % 7},{20 + i % 5}" for i in range(60)] + [
        f"{60 + i},tiny,100,20" for i in range(5)]
    p = tmp_path / "svc.csv"
    p.write_text("\n".join(lines) + "\n")
    err = _cli_error(capsys, ["classes", str(p), "--out", str(tmp_path / "o"), "--window", "10s",
                              "--columns", "ts=ts,prompt=p,output=o,service=model"])
    assert "svc.csv: service 'tiny': 5 requests, fewer than the 30" in err


def test_todo_marker_only_as_a_marker(tmp_path):
    from fleetsieve_bayes.campaign.config import refuse_todo
    from fleetsieve_bayes.validation import Validator

    refuse_todo(Validator(tmp_path / "c.toml"), {"name": "todo-list", "measurement": {"model": "TODOS/m"}})
    with pytest.raises(InputError, match=r"c.toml: \[measurement\] env.X: still 'TODO: a key'"):
        refuse_todo(Validator(tmp_path / "c.toml"), {"measurement": {"env": {"X": "TODO: a key"}}})
