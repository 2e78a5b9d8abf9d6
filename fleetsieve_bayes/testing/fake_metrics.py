"""vLLM's ``/metrics`` for the fake server: the same names, label sets and histogram buckets.

The buckets are vLLM's (``vllm/v1/metrics/buckets.py`` of vLLM 0.32:
``TIME_TO_FIRST_TOKEN_BUCKETS``, ``REQUEST_LATENCY_BUCKETS``); each series
carries ``model_name`` and ``engine`` labels as vLLM's do. Failure injection
for tests of ``verify``: ``missing`` names metrics left out, ``legacy_names``
exposes the pre-rename gauge ``vllm:gpu_cache_usage_perc``, and
``reset_after`` zeroes every counter and histogram once that many requests
have finished and moves ``process_start_time_seconds`` (a restarted engine).
With ``itl`` it also exposes the inter-token latency histogram,
``vllm:inter_token_latency_seconds`` (``legacy_names``: its older name
``vllm:time_per_output_token_seconds``), one observation per gap between
output tokens (:data:`ITL_BUCKETS`, vLLM's per-token buckets); without it the
page is as it always was.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable

__all__ = ["TTFT_BUCKETS", "E2E_BUCKETS", "ITL_BUCKETS", "FakeMetrics"]

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
E2E_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # per bucket (not cumulative), last = +Inf
        self.sum = 0.0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, x)] += 1
        self.sum += x

    def lines(self, name: str, labels: str) -> Iterable[str]:
        cum = 0
        for b, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
            cum += c
            le = "+Inf" if b == float("inf") else repr(float(b))
            yield f'{name}_bucket{{{labels},le="{le}"}} {float(cum)}'
        yield f"{name}_sum{{{labels}}} {self.sum}"
        yield f"{name}_count{{{labels}}} {float(cum)}"


class FakeMetrics:
    """Counters, gauges and histograms of one fake engine, rendered as vLLM's exposition."""

    def __init__(self, model: str, *, missing: Iterable[str] = (), legacy_names: bool = False,
                 reset_after: int = 0, kv_slots: int = 1, itl: bool = False) -> None:
        self.model = model
        self.missing = frozenset(missing)
        self.legacy_names = legacy_names
        self.reset_after = reset_after
        self.kv_slots = max(kv_slots, 1)
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS) if itl else None
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
        self.finished_total = 0
        self.waiting = 0
        self.started_at = time.time()

    def finish(self, ttft_s: float, e2e_s: float, reason: str = "length", itl_s: Iterable[float] = ()) -> None:
        """Record a finished request (server-side times from its arrival; ``itl_s``: the gaps
        between its output tokens, recorded when the histogram is exposed)."""
        self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)
        if self.itl is not None:
            for gap in itl_s:
                self.itl.observe(gap)
        self.success[reason] = self.success.get(reason, 0) + 1
        self.finished_total += 1
        if self.reset_after and self.finished_total == self.reset_after:
            self.ttft.reset()
            self.e2e.reset()
            if self.itl is not None:
                self.itl.reset()
            self.success = dict.fromkeys(self.success, 0)
            self.started_at = time.time() + 1.0  # a new process (prometheus_client's collector)

    def render(self, running: int) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        out: list[str] = []

        def emit(name: str, kind: str, lines: Iterable[str]) -> None:
            if name in self.missing:
                return
            out.append(f"# HELP {name} fake engine metric (vLLM's name).")
            out.append(f"# TYPE {name} {kind}")
            out.extend(lines)

        emit("process_start_time_seconds", "gauge", [f"process_start_time_seconds {self.started_at}"])
        emit("vllm:num_requests_running", "gauge", [f"vllm:num_requests_running{{{labels}}} {float(running)}"])
        emit("vllm:num_requests_waiting", "gauge", [f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}"])
        kv = "vllm:gpu_cache_usage_perc" if self.legacy_names else "vllm:kv_cache_usage_perc"
        emit(kv, "gauge", [f"{kv}{{{labels}}} {min(running / self.kv_slots, 1.0)}"])
        emit("vllm:request_success_total", "counter", [
            f'vllm:request_success_total{{{labels},finished_reason="{r}"}} {float(n)}'
            for r, n in self.success.items()
        ])
        emit("vllm:time_to_first_token_seconds", "histogram",
             self.ttft.lines("vllm:time_to_first_token_seconds", labels))
        emit("vllm:e2e_request_latency_seconds", "histogram",
             self.e2e.lines("vllm:e2e_request_latency_seconds", labels))
        if self.itl is not None:
            itl = "vllm:time_per_output_token_seconds" if self.legacy_names else "vllm:inter_token_latency_seconds"
            emit(itl, "histogram", self.itl.lines(itl, labels))
        return "\n".join(out) + "\n"
