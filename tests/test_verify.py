"""``fleetsieve-bayes verify`` against fake vLLM servers: readings, verdicts and one-line failures."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_report import build_campaign_dir

from fleetsieve_bayes.backends.loadgen import LoadSpec, run_cell_sync, summarize
from fleetsieve_bayes.backends.server import free_port
from fleetsieve_bayes.backends.traces import Schedule
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.deploy.metrics import QuantileBound, WindowReading
from fleetsieve_bayes.deploy.plan import build_plan, write_plan
from fleetsieve_bayes.deploy.verify import (
    assign_urls,
    judge,
    parse_window,
    read_direct,
    verify_report,
)
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.testing import running_fake_server

# Token step 0.15 s, 12 output tokens, slots enough for no queue: TTFT ≈ 0.15 s, in vLLM's
# (0.1, 0.25] bucket; completion ≈ 1.8 s, in (1.5, 2.0]. The client's clock starts before the
# request is sent, so each client time is at least the server's: the client p99 is never below
# the bucket's lower edge. Above it, one request delayed by a loaded machine can move the
# client p99 out of the bucket (seen: 1.12 s), but not the client median.
FLAGS = ("--slots", "64", "--token-delay", "0.15")


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("c")
    build_campaign_dir(d, posterior=False)
    out = tmp_path_factory.mktemp("plan")
    write_plan(build_plan(d, 2, 8), out, ["launch"])
    return out


def _schedule(n: int, rate: float) -> Schedule:
    return Schedule(np.arange(n) / rate, np.full(n, 8), np.full(n, 12), np.arange(n))


def _traffic(url: str, n: int = 40, rate: float = 20.0) -> Any:
    spec = LoadSpec(endpoint=url, model="m", warmup_s=0.0, duration_s=n / rate, request_timeout_s=30.0)
    return run_cell_sync(spec, _schedule(n, rate))


def test_direct_reading_contains_the_client_p99(plan_dir: Path) -> None:
    plan = json.loads((plan_dir / "plan.json").read_text())
    with running_fake_server(*FLAGS, model="m") as chat, running_fake_server(*FLAGS, model="m") as code:
        records: dict[str, Any] = {}

        def drive() -> None:
            threads = [threading.Thread(target=lambda u=u, w=w: records.__setitem__(w, _traffic(u)))
                       for w, u in (("chat", chat), ("code", code))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        readings = read_direct({"chat": [chat + "/metrics"], "code": [code + "/metrics"]}, 0.0, during=drive)
    report = verify_report(plan, readings, {"kind": "metrics", "window_s": 0.0})
    for c in report["classes"]:
        recs = records[c["workload"]]
        row = summarize(recs, 0.0, float(recs["arrival_s"].max()) + 1e-9)
        assert row["n_ok"] == 40 and c["metrics"]["success_rate"]["finished"] == 40
        t, e = c["metrics"]["ttft_p99_s"], c["metrics"]["completion_p99_s"]
        ttft, comp = (recs[col].to_numpy(float) - recs["sent_s"].to_numpy(float) for col in ("first_token_s", "last_token_s"))
        assert t["lo"] <= row["ttft_p99_s"] and t["lo"] <= float(np.median(ttft)) <= t["hi"], (t, row)
        assert e["lo"] <= row["completion_p99_s"] and e["lo"] <= float(np.median(comp)) <= e["hi"], (e, row)
        assert (t["lo"], t["hi"]) == (0.1, 0.25) and (e["lo"], e["hi"]) == (1.5, 2.0)
        assert c["metrics"]["success_rate"]["value"] == 1.0
        # TTFT and completion far inside the SLOs and the predicted intervals' neighbourhood.
        assert c["metrics"]["ttft_p99_s"]["p99_vs_slo"] == "within"
        assert c["replicas_seen"] == 1 and c["replicas_planned"] == 2


def _plan_class(**pred: Any) -> dict[str, Any]:
    base = {"ttft_p99_s": [0.5, 1.5], "completion_p99_s": [10.0, 20.0], "success_rate": [0.985, 0.999],
            "throughput_rps": [6.0, 7.0]}
    base.update(pred)
    return {"workload": "chat", "tp": 4, "load": "C96", "replicas": 2, "offered_rps_per_replica": 6.6,
            "slo": {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 30.0},
            "predicted": {k: {"median": sum(v) / 2, "interval": v} for k, v in base.items()}}


def _reading(ttft: tuple[float, float], comp: tuple[float, float] = (10.0, 15.0), served: float = 1000,
             finished: float = 1002) -> WindowReading:
    return WindowReading(300.0, 2, finished, served, finished / 300, served / 300, served / finished,
                         QuantileBound(*ttft, ttft[0], finished), QuantileBound(*comp, comp[0], finished), None, {})


@pytest.mark.parametrize(
    ("ttft", "kw", "verdict"),
    [
        ((0.75, 1.0), {}, "meets"),
        ((2.5, 5.0), {}, "violates"),  # the whole bucket beyond the 2 s SLO
        ((1.0, 2.5), {}, "inconclusive"),  # the SLO inside the p99's bucket
        ((0.1, 0.25), {}, "drifted"),  # bucket entirely below the predicted [0.5, 1.5]
        ((0.75, 1.0), {"served": 900, "finished": 1000}, "violates"),  # success 0.9 < 0.99
        ((0.75, 1.0), {"served": 1000, "finished": 1000}, "meets"),  # 1.0: CI overlaps [0.985, 0.999]
        ((0.75, 1.0), {"comp": (40.0, 50.0)}, "violates"),
    ],
)
def test_verdicts(ttft: tuple[float, float], kw: dict[str, Any], verdict: str) -> None:
    got = judge(_plan_class(), _reading(ttft, **kw))
    assert got["verdict"] == verdict, got["reasons"]
    assert got["served_rps_per_replica"] == pytest.approx(kw.get("served", 1000) / 300 / 2)


def test_parse_window_and_url_assignment(plan_dir: Path) -> None:
    assert parse_window("5m") == 300 and parse_window("30s") == 30 and parse_window("2") == 2
    for bad in ("", "5x", "-1", "0s"):
        with pytest.raises(InputError, match="--window"):
            parse_window(bad)
    plan = json.loads((plan_dir / "plan.json").read_text())
    urls = [f"http://h:{8000 + i}/metrics" for i in range(4)]
    by_order = assign_urls(plan, urls)
    assert {w: len(u) for w, u in by_order.items()} == {"chat": 2, "code": 2}
    assert assign_urls(plan, ["code=http://a/metrics"]) == {"code": ["http://a/metrics"]}
    with pytest.raises(InputError, match="class 'nope'"):
        assign_urls(plan, ["nope=http://a/metrics"])
    with pytest.raises(InputError, match="CLASS=URL"):
        assign_urls(plan, urls[:3])


def _verify(plan_dir: Path, *extra: str) -> list[str]:
    return ["verify", str(plan_dir), *extra]


def test_cli_json_over_a_short_window(plan_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_fake_server(*FLAGS, model="m") as url:
        t = threading.Thread(target=_traffic, args=(url, 30, 20.0))
        t.start()
        rc = cli_main(_verify(plan_dir, "--metrics", f"chat={url}/metrics", "--window", "3s", "--json",
                              "--out", str(tmp_path / "v.json")))
        t.join()
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(out)
    assert report == json.loads((tmp_path / "v.json").read_text())
    assert [c["workload"] for c in report["classes"]] == ["chat"] and report["unread_classes"] == ["code"]
    c = report["classes"][0]
    assert c["window_s"] >= 1.0 and c["metrics"]["ttft_p99_s"]["count"] > 0
    assert report["certificate"]["campaign_fingerprint"] is None or isinstance(report["certificate"]["campaign_fingerprint"], str)


@pytest.mark.parametrize(
    ("flags", "rc", "match"),
    [
        (("--not-vllm-metrics",), 2, "not a vLLM /metrics"),
        (("--metrics-missing", "vllm:time_to_first_token_seconds,vllm:num_requests_running"), 2,
         "lacks vllm:time_to_first_token_seconds, vllm:num_requests_running"),
        (("--metrics-reset-after", "3"), 1, "restarted mid-window"),
        (("--die-after", "3"), 1, "stopped answering mid-window"),
    ],
)
def test_cli_failures_are_one_line(plan_dir: Path, flags: tuple[str, ...], rc: int, match: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with running_fake_server(*FLAGS, *flags, model="m") as url:
        t = threading.Thread(target=lambda: _traffic(url, 20, 20.0) if "--die-after" not in flags else _die(url))
        t.start()
        # The reset comes when the third request finishes (~1.9 s in), the death when the fourth
        # request arrives (~1.7 s in, after the first scrape): the window ends well after either.
        window = "4s" if "--metrics-reset-after" in flags or "--die-after" in flags else "2s"
        got = cli_main(_verify(plan_dir, "--metrics", f"chat={url}/metrics", "--window", window))
        t.join()
    err = capsys.readouterr().err.strip()
    assert got == rc and len(err.splitlines()) == 1 and match in err, err


def _die(url: str) -> None:
    # The first scrape must find the server alive: it dies only once the window is open.
    time.sleep(1.5)
    with contextlib.suppress(Exception):  # the server dies under the load generator by design
        _traffic(url, 6, 20.0)


def test_cli_unreachable_url(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(_verify(plan_dir, "--metrics", f"chat=http://127.0.0.1:{free_port()}/metrics", "--window", "1s"))
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "unreachable" in err and len(err.splitlines()) == 1
    rc = cli_main(_verify(plan_dir, "--prometheus", f"http://127.0.0.1:{free_port()}", "--window", "1s"))
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "unreachable" in err
