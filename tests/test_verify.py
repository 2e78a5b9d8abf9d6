"""``fleetsieve-bayes verify`` against fake vLLM servers: readings, verdicts and one-line failures."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from campaign_dirs import build_campaign_dir

from fleetsieve_bayes.backends.loadgen import LoadSpec, run_cell_sync, summarize
from fleetsieve_bayes.backends.server import free_port
from fleetsieve_bayes.backends.traces import Schedule
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.commands.verify import _fmt
from fleetsieve_bayes.deploy import verify as verify_module
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


def _write_plan(tmp_path_factory: pytest.TempPathFactory, *, fingerprint: bool) -> Path:
    d = tmp_path_factory.mktemp("c")
    build_campaign_dir(d, posterior=False)  # what `run` wrote: its journal header has a fingerprint
    if not fingerprint:  # as a journal written before headers had one
        journal = d / "journal.jsonl"
        header, rest = journal.read_text().split("\n", 1)
        journal.write_text(json.dumps({k: v for k, v in json.loads(header).items() if k != "fingerprint"}) + "\n" + rest)
    out = tmp_path_factory.mktemp("plan")
    write_plan(build_plan(d, 2, 8), out, ["launch"])
    return out


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plan of a campaign directory that `run` wrote (its journal header has a fingerprint)."""
    return _write_plan(tmp_path_factory, fingerprint=True)


@pytest.fixture(scope="module")
def unfingerprinted_plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, its journal header without a fingerprint."""
    return _write_plan(tmp_path_factory, fingerprint=False)


def _campaign_fingerprint(plan: dict[str, Any]) -> str | None:
    """The campaign digest in the journal header of the plan's campaign directory, or None."""
    header = json.loads((Path(plan["campaign_dir"]) / "journal.jsonl").read_text().split("\n", 1)[0])
    return (header.get("fingerprint") or {}).get("campaign")


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


def _event_ordered_window(monkeypatch: pytest.MonkeyPatch, drive: Callable[[], None]) -> list[str]:
    """Make ``verify --metrics … --window W`` event-ordered: the first scrape of every URL,
    then ``drive()`` to its end in place of the W-second sleep, then the second scrapes.

    The scrapes read a clock that says 0 before ``drive`` and W after it, so the
    window is exactly W seconds whatever the machine's speed. Returns the URLs
    scraped, in order."""
    now = {"t": 0.0}
    scraped: list[str] = []
    read_direct, scrape = verify_module.read_direct, verify_module.scrape

    def ordered_read_direct(urls: dict[str, list[str]], window_s: float, **kw: Any) -> Any:
        def during() -> None:
            drive()
            now["t"] = window_s

        return read_direct(urls, window_s, during=during, **kw)

    def clocked_scrape(url: str, timeout: float = 10.0, clock: Any = None) -> Any:
        scraped.append(url)
        return scrape(url, timeout, clock=lambda: now["t"])

    # The command imports read_direct from the module when it runs; read_direct calls scrape through it.
    monkeypatch.setattr(verify_module, "read_direct", ordered_read_direct)
    monkeypatch.setattr(verify_module, "scrape", clocked_scrape)
    return scraped


@pytest.mark.parametrize("plan_fixture", ["plan_dir", "unfingerprinted_plan_dir"])
def test_cli_json_over_a_short_window(plan_fixture: str, request: pytest.FixtureRequest, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    plan_dir = request.getfixturevalue(plan_fixture)
    plan = json.loads((plan_dir / "plan.json").read_text())
    # What each fixture gives: the run's campaign digest (64 hex digits), or none.
    fingerprint = _campaign_fingerprint(plan)
    if plan_fixture == "plan_dir":
        assert isinstance(fingerprint, str) and re.fullmatch(r"[0-9a-f]{64}", fingerprint), fingerprint
    else:
        assert fingerprint is None
    with running_fake_server(*FLAGS, model="m") as url:
        scraped = _event_ordered_window(monkeypatch, lambda: _traffic(url, 30, 20.0))
        rc = cli_main(_verify(plan_dir, "--metrics", f"chat={url}/metrics", "--window", "3s", "--json",
                              "--out", str(tmp_path / "v.json")))
    out = capsys.readouterr().out
    assert rc == 0 and scraped == [f"{url}/metrics"] * 2
    report = json.loads(out)
    assert report == json.loads((tmp_path / "v.json").read_text())
    assert [c["workload"] for c in report["classes"]] == ["chat"] and report["unread_classes"] == ["code"]
    assert report["source"] == {"kind": "metrics", "urls": {"chat": [f"{url}/metrics"]}, "window_s": 3.0}
    c = report["classes"][0]
    # All 30 requests inside the window; 3 s on the scrapes' clock.
    assert c["window_s"] == 3.0 and c["metrics"]["ttft_p99_s"]["count"] == 30
    assert c["served_rps"] == pytest.approx(10.0) and c["metrics"]["success_rate"]["finished"] == 30
    # The plan's certificate, echoed: its campaign fingerprint the journal's, or None without one.
    assert report["certificate"] == plan["certificate"]
    assert report["certificate"]["campaign_fingerprint"] == fingerprint


@pytest.mark.parametrize(
    ("flags", "rc", "match", "n_scrapes"),
    [
        (("--not-vllm-metrics",), 2, "not a vLLM /metrics", 1),
        (("--metrics-missing", "vllm:time_to_first_token_seconds,vllm:num_requests_running"), 2,
         "lacks vllm:time_to_first_token_seconds, vllm:num_requests_running", 1),
        (("--metrics-reset-after", "3"), 1, "restarted mid-window", 2),
        (("--die-after", "3"), 1, "stopped answering mid-window", 2),
    ],
)
def test_cli_failures_are_one_line(plan_dir: Path, flags: tuple[str, ...], rc: int, match: str, n_scrapes: int,
                                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with running_fake_server(*FLAGS, *flags, model="m") as url:
        # The traffic runs between the two scrapes: the first finds the server as it started; the
        # reset (when the third request finishes) or the death (when the fourth arrives) comes before
        # the second. The first two cases end at the first scrape.
        scraped = _event_ordered_window(monkeypatch, lambda: _die(url) if "--die-after" in flags else _traffic(url, 6, 20.0))
        got = cli_main(_verify(plan_dir, "--metrics", f"chat={url}/metrics", "--window", "4s"))
    err = capsys.readouterr().err.strip()
    assert got == rc and len(err.splitlines()) == 1 and match in err, err
    assert len(scraped) == n_scrapes


def _die(url: str) -> None:
    with contextlib.suppress(Exception):  # the server dies under the load generator by design
        _traffic(url, 6, 20.0)


def test_cli_text_output(plan_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --json: one block per class read, its numbers those of the JSON report (--out)."""
    plan = json.loads((plan_dir / "plan.json").read_text())
    (chat,) = [c for c in plan["classes"] if c["workload"] == "chat"]
    with running_fake_server(*FLAGS, model="m") as url:
        _event_ordered_window(monkeypatch, lambda: _traffic(url, 30, 20.0))
        rc = cli_main(_verify(plan_dir, "--metrics", f"chat={url}/metrics", "--window", "10s",
                              "--out", str(tmp_path / "v.json")))
    text = capsys.readouterr().out
    assert rc == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    report = json.loads((tmp_path / "v.json").read_text())
    (c,) = report["classes"]
    lines = text.splitlines()
    verdict = c["verdict"]
    assert verdict == report["verdict"] and verdict in ("meets", "inconclusive", "drifted", "violates")
    assert lines[0] == f"verify {plan['campaign']} (metrics, window 10 s): {verdict}"
    assert lines[1] == f"  chat TP{chat['tp']}@{chat['load']} ×2 (1 seen): {verdict}"
    # 30 requests over the 10 s window: 3 req/s offered and served, 1.5 per planned replica.
    assert lines[2] == (f"    offered 3 req/s, served 3 req/s (1.5 per replica; certified load offers "
                        f"{_fmt(chat['offered_rps_per_replica'])})")
    # The p99's bucket, its interpolated value, the count and the comparisons, for both latencies.
    for line, label, key, bucket in ((lines[3], "TTFT p99", "ttft_p99_s", "[0.1, 0.25]"),
                                     (lines[4], "completion p99", "completion_p99_s", "[1.5, 2]")):
        m = c["metrics"][key]
        lo, hi = m["predicted"]
        assert line == (f"    {label} in {bucket} s (~{_fmt(m['interpolated'])}; 30 requests)  SLO "
                        f"{_fmt(chat['slo'][key])}: within  predicted [{_fmt(lo)}, {_fmt(hi)}]: {m['vs_predicted']}")
    s = c["metrics"]["success_rate"]
    assert lines[5].startswith(f"    success 1 (CI [{_fmt(s['interval'][0], 4)}, 1]) SLO "
                               f"{_fmt(chat['slo']['success_min'])}: within  predicted [")
    assert lines[6:6 + len(c["reasons"])] == [f"    - {r}" for r in c["reasons"]]
    assert (verdict == "meets") == (not c["reasons"])
    assert len(lines) == 8 + len(c["reasons"]) and lines[-2].startswith("  (p99s are vLLM's server-side timings")
    assert lines[-1] == "  not read: code"


class _PrometheusAPI:
    """A Prometheus HTTP API on loopback that records every PromQL query and answers
    series only for queries whose label matchers hold ``matcher``: one replica with
    30 finished requests, TTFT p99 in (0.1, 0.25] and completion p99 in (1.5, 2]."""

    BUCKETS = {"vllm:time_to_first_token_seconds": 0.25, "vllm:e2e_request_latency_seconds": 2.0}

    def __init__(self, matcher: str) -> None:
        self.matcher = matcher
        self.queries: list[str] = []

    def answer(self, promql: str) -> dict[str, Any]:
        self.queries.append(promql)

        def vector(*rows: tuple[dict[str, str], float]) -> dict[str, Any]:
            return {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in rows]}

        if self.matcher not in promql:
            return {"resultType": "vector", "result": []}
        if promql.startswith("group by (__name__)"):
            return vector(*(({"__name__": n}, 1) for n in (*(f"{h}_bucket" for h in self.BUCKETS),
                                                           "vllm:request_success_total", "vllm:num_requests_running")))
        if promql.startswith("up{"):
            return vector()
        for name, edge in self.BUCKETS.items():
            if promql.startswith(f"{name}_bucket{{"):
                return {"resultType": "matrix", "result": [
                    {"metric": {"le": le}, "values": [[0, "0"], [1, "30" if le == "+Inf" or float(le) >= edge else "0"]]}
                    for le in ("0.1", "0.25", "1.5", "2.0", "+Inf")]}
            if promql.startswith("histogram_quantile") and name in promql:
                return vector(({}, edge * 0.9))
        if promql.startswith("count("):
            return vector(({}, 1))
        if promql.startswith("sum(increase(vllm:request_success_total"):
            return vector(({}, 30))
        return vector(({}, 0))  # resets, restarts, gauges


@contextlib.contextmanager
def _running_prometheus_api(api: _PrometheusAPI) -> Any:
    import http.server
    import urllib.parse

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parsed = urllib.parse.urlparse(self.path)
            if parsed.path != "/api/v1/query":
                self.send_error(404)
                return
            body = json.dumps({"status": "success",
                               "data": api.answer(urllib.parse.parse_qs(parsed.query)["query"][0])}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _class_matchers(promql: str) -> set[str]:
    """The label matchers inside a query's braces, less the metric-name and label filters verify adds."""
    found: set[str] = set()
    for inner in re.findall(r"\{([^{}]*)\}", promql):
        kept = [m for m in inner.split(",") if not m.startswith(("__name__", "finished_reason"))]
        found.add(",".join(kept))
    return found


@pytest.mark.parametrize(
    ("selector", "matchers"),
    [
        (None, {"chat": 'class="chat"', "code": 'class="code"'}),  # the default: plan's prometheus.yml labels
        ('job="vllm-{workload}",env="prod"', {"chat": 'job="vllm-chat",env="prod"', "code": 'job="vllm-code",env="prod"'}),
    ],
)
def test_cli_prometheus_selector_labels_every_query_of_a_class(
    plan_dir: Path, selector: str | None, matchers: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--selector is each class's label matchers, {workload} filled: every query of a class carries
    them, and a class whose matchers select no series is not read."""
    api = _PrometheusAPI(matchers["chat"])  # only chat's matchers select series
    with _running_prometheus_api(api) as base:
        extra = () if selector is None else ("--selector", selector)
        rc = cli_main(_verify(plan_dir, "--prometheus", base, "--window", "2m", "--json", *extra))
    assert rc == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["source"] == {"kind": "prometheus", "url": base, "selectors": matchers, "window_s": 120.0}
    assert [c["workload"] for c in report["classes"]] == ["chat"] and report["unread_classes"] == ["code"]
    c = report["classes"][0]
    assert (c["metrics"]["ttft_p99_s"]["lo"], c["metrics"]["ttft_p99_s"]["hi"]) == (0.1, 0.25)
    assert (c["metrics"]["completion_p99_s"]["lo"], c["metrics"]["completion_p99_s"]["hi"]) == (1.5, 2.0)
    assert c["metrics"]["success_rate"]["finished"] == 30 and c["replicas_seen"] == 1
    # Every query names exactly one class's matchers: code's stop at its first (no series).
    by_class = {w: [q for q in api.queries if _class_matchers(q) == {m}] for w, m in matchers.items()}
    assert sum(map(len, by_class.values())) == len(api.queries)
    assert by_class["code"] == ['group by (__name__) ({__name__=~"vllm:.+",' + matchers["code"] + "})"]
    assert len(by_class["chat"]) > 10 and all("[120s]" in q for q in by_class["chat"] if "_bucket{" in q)


def test_cli_prometheus_selector_without_workload_is_refused(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = _PrometheusAPI('class="chat"')
    with _running_prometheus_api(api) as base:
        rc = cli_main(_verify(plan_dir, "--prometheus", base, "--selector", 'class="chat"'))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--selector: must contain {workload}" in err, err
    assert api.queries == []  # refused before asking anything


def test_cli_unreachable_url(plan_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(_verify(plan_dir, "--metrics", f"chat=http://127.0.0.1:{free_port()}/metrics", "--window", "1s"))
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "unreachable" in err and len(err.splitlines()) == 1
    rc = cli_main(_verify(plan_dir, "--prometheus", f"http://127.0.0.1:{free_port()}", "--window", "1s"))
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "unreachable" in err
