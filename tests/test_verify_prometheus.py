"""``verify --prometheus`` against a real Prometheus server scraping fake vLLM servers.

Prometheus is the Debian package's binary (``.ci/run`` installs it). These
tests fail, never skip, when it is missing.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from campaign_dirs import build_campaign_dir

from fleetsieve_bayes.backends.loadgen import LoadSpec, run_cell_sync
from fleetsieve_bayes.backends.traces import Schedule
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.deploy.plan import build_plan, write_plan
from fleetsieve_bayes.deploy.verify import counter_increase, read_direct, read_prometheus
from fleetsieve_bayes.testing import running_fake_server
from fleetsieve_bayes.testing.fake_metrics import E2E_BUCKETS, TTFT_BUCKETS
from fleetsieve_bayes.testing.prometheus import prometheus_binary, running_prometheus

FLAGS = ("--slots", "64", "--token-delay", "0.15")


@pytest.fixture(scope="module", autouse=True)
def _need_prometheus() -> None:
    if prometheus_binary() is None:
        pytest.fail("the Prometheus binary is missing: apt-get install prometheus (.ci/run installs it)")


def _query(base: str, promql: str) -> list:
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def _wait_up(base: str, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(_query(base, "up == 1")) >= n:
            return
        time.sleep(0.3)
    raise AssertionError(f"Prometheus did not scrape {n} targets in {timeout_s:g} s")


def _wait_for_value(base: str, promql: str, value: float, timeout_s: float = 60.0) -> None:
    """Poll Prometheus until the instant query ``promql`` (one number) reads ``value``: a
    scrape of that state has landed in its storage. Fails naming the last reading."""
    deadline = time.monotonic() + timeout_s
    got: list = []
    while time.monotonic() < deadline:
        got = _query(base, promql)
        if got and float(got[0]["value"][1]) == value:
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus did not read {promql} = {value:g} within {timeout_s:g} s (last: {got})")


def _window_since(t0: float, margin_s: float = 30.0) -> float:
    """A window, in whole seconds, reaching back past ``t0`` (Unix time) by ``margin_s``."""
    return float(math.ceil(time.time() - t0 + margin_s))


FINISHED = 'sum(vllm:request_success_total{class="chat"})'


def _traffic(url: str, n: int, rate: float) -> None:
    sched = Schedule(np.arange(n) / rate, np.full(n, 8), np.full(n, 12), np.arange(n))
    run_cell_sync(LoadSpec(endpoint=url, model="m", warmup_s=0.0, duration_s=n / rate, request_timeout_s=30.0), sched)


def _neighbours(edges: tuple[float, ...], x: float) -> tuple[float, float]:
    """The edges one bucket beyond each side of the bucket holding ``x``."""
    le = [0.0, *edges, float("inf")]
    j = next(i for i, b in enumerate(le) if x <= b)
    return le[max(j - 2, 0)], le[min(j + 1, len(le) - 1)]


def test_prometheus_reading_is_within_one_bucket_of_the_direct_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    build_campaign_dir(d, posterior=False)
    write_plan(build_plan(d, 2, 8), tmp_path / "plan", ["launch"])
    with running_fake_server(*FLAGS, model="m") as chat:
        host = chat.split("//")[1]
        t0 = time.time()  # before Prometheus' first sample: the window reaches back past it
        with running_prometheus({"chat": [host]}, scrape_interval_s=1.0) as prom:
            _wait_up(prom, 1)
            _wait_for_value(prom, FINISHED, 0.0)  # a sample before the traffic
            direct = read_direct({"chat": [chat + "/metrics"]}, 0.0, during=lambda: _traffic(chat, 60, 15.0))["chat"]
            _wait_for_value(prom, FINISHED, 60.0)  # the last state scraped (every series of one scrape lands at once)
            # Every sample Prometheus holds is in the window: zeros before the traffic, then
            # its counts, then the same counts again.
            window = _window_since(t0)
            via = read_prometheus(prom, {"chat": 'class="chat"'}, window)["chat"]
            reports = []
            for selector in ((), ("--selector", 'job="vllm-{workload}"')):  # by the class label, by the job's name
                rc = cli_main(["verify", str(tmp_path / "plan"), "--prometheus", prom,
                               "--window", f"{window:.0f}s", "--json", *selector])
                assert rc == 0
                reports.append(json.loads(capsys.readouterr().out))
            # Matchers no series holds: no class read, one line naming each class's.
            rc = cli_main(["verify", str(tmp_path / "plan"), "--prometheus", prom, "--window", f"{window:.0f}s",
                           "--selector", 'job="prod-{workload}"'])
            err = capsys.readouterr().err.strip()
            assert rc == 2 and len(err.splitlines()) == 1, err
            assert 'no vllm:* series for any class ({job="prod-chat"}, {job="prod-code"})' in err, err
    with capsys.disabled():
        print(f"\ndirect: finished {direct.finished:g}, TTFT p99 in [{direct.ttft_p99.lo:g}, {direct.ttft_p99.hi:g}], "
              f"e2e p99 in [{direct.completion_p99.lo:g}, {direct.completion_p99.hi:g}]; Prometheus ({window:.1f} s): "
              f"finished {via.finished:.2f}, TTFT p99 in [{via.ttft_p99.lo:g}, {via.ttft_p99.hi:g}] "
              f"(histogram_quantile {via.ttft_p99.interpolated:.4f}), e2e p99 in [{via.completion_p99.lo:g}, "
              f"{via.completion_p99.hi:g}] (histogram_quantile {via.completion_p99.interpolated:.4f})")
    report, by_job = reports
    assert report["source"]["kind"] == "prometheus"
    assert report["source"]["selectors"] == {"chat": 'class="chat"', "code": 'class="code"'}
    assert by_job["source"]["selectors"] == {"chat": 'job="vllm-chat"', "code": 'job="vllm-code"'}
    for r in (report, by_job):
        assert [c["workload"] for c in r["classes"]] == ["chat"] and r["unread_classes"] == ["code"]
        c = r["classes"][0]
        # The raw samples' differences: exact whatever the selector that found the series.
        for key, b in (("ttft_p99_s", via.ttft_p99), ("completion_p99_s", via.completion_p99)):
            assert (c["metrics"][key]["lo"], c["metrics"][key]["hi"], c["metrics"][key]["count"]) == (b.lo, b.hi, b.count)
        assert c["replicas_seen"] == 1
    assert direct.finished == 60 and direct.served == 60
    # increase() extrapolates to the window's edges: counts agree within a few percent.
    assert via.finished == pytest.approx(60, rel=0.15) and via.success_rate == pytest.approx(1.0)
    for name, edges, a, b in (("ttft", TTFT_BUCKETS, direct.ttft_p99, via.ttft_p99),
                              ("completion", E2E_BUCKETS, direct.completion_p99, via.completion_p99)):
        # The window holds a sample before the traffic and one after it: the raw samples'
        # differences are the direct reading's counts, so the bucket bound is the same.
        assert (b.lo, b.hi, b.count) == (a.lo, a.hi, a.count), (name, a, b)
        lo, hi = _neighbours(edges, a.hi)
        assert lo <= b.interpolated <= hi, (name, a, b)  # histogram_quantile extrapolates: a neighbour at most


def test_counter_increase_counts_a_reset_from_zero() -> None:
    assert counter_increase([4.0, 4.0, 9.0, 12.0]) == 8.0
    assert counter_increase([4.0, 10.0, 3.0, 5.0]) == 6.0 + 3.0 + 2.0
    assert counter_increase([7.0]) == 0.0 and counter_increase([]) == 0.0


def test_prometheus_counter_reset_and_missing_class(tmp_path: Path) -> None:
    from fleetsieve_bayes.errors import EnvironmentProblem, InputError

    with running_fake_server(*FLAGS, "--metrics-reset-after", "10", model="m") as chat:
        t0 = time.time()
        with running_prometheus({"chat": [chat.split("//")[1]]}, scrape_interval_s=1.0) as prom:
            _wait_up(prom, 1)
            _wait_for_value(prom, FINISHED, 0.0)  # a sample of the first process
            _traffic(chat, 40, 20.0)  # counters zeroed and the start time moved at the 10th finish
            _wait_for_value(prom, FINISHED, 30.0)  # a sample after the restart: the 30 finished since
            window = _window_since(t0)
            with pytest.raises(EnvironmentProblem, match="reset"):
                read_prometheus(prom, {"chat": 'class="chat"'}, window)
            with pytest.raises(InputError, match="no vllm:\\* series for class code"):
                read_prometheus(prom, {"code": 'class="code"'}, window)
