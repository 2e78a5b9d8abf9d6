"""vLLM's Prometheus metrics: parsing ``/metrics``, window differences and p99 bounds from buckets.

:func:`parse_text` reads the Prometheus text exposition format (version
0.0.4, what vLLM's ``/metrics`` serves): ``name{label="value",…} value
[timestamp]`` lines, ``#`` comments, label values with ``\\\\``, ``\\"`` and
``\\n`` escapes. :func:`reading` turns two scrapes of one or more replicas
into a :class:`WindowReading`: differences of the cumulative histogram
buckets of ``vllm:time_to_first_token_seconds`` and
``vllm:e2e_request_latency_seconds`` and of ``vllm:request_success_total``
by ``finished_reason``, summed over the replicas; also, where exposed, the
p99 bucket of ``vllm:inter_token_latency_seconds`` and the
``vllm:num_requests_waiting`` gauge at both scrapes (what ``verify`` shows per
role of a disaggregated class).

A quantile read from histogram buckets is only known to lie in a bucket:
:func:`quantile_bounds` returns the bucket interval ``[lo, hi]`` that holds
the sample p99 whatever the values inside the buckets are (the p99 of
``np.percentile``, linear between order statistics k and k+1, lies between
the lower edge of statistic k's bucket and the upper edge of statistic
k+1's), and the linear interpolation inside the bucket that Prometheus'
``histogram_quantile`` reports.

Metric names that changed between vLLM versions are read under any of their
names (:data:`ALIASES`: ``vllm:gpu_cache_usage_perc`` became
``vllm:kv_cache_usage_perc``, ``vllm:time_per_output_token_seconds`` became
``vllm:inter_token_latency_seconds``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from fleetsieve_bayes.errors import EnvironmentProblem, InputError

__all__ = [
    "ALIASES",
    "REQUIRED",
    "SUCCESS_REASONS",
    "Sample",
    "Scrape",
    "QuantileBound",
    "WindowReading",
    "parse_text",
    "parse_scrape",
    "resolve_names",
    "histogram",
    "quantile_bounds",
    "reading",
]

TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
SUCCESS = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
ITL = "vllm:inter_token_latency_seconds"
# Canonical name → every name a vLLM version has exposed it under, newest first.
ALIASES: dict[str, tuple[str, ...]] = {
    TTFT: (TTFT,),
    E2E: (E2E,),
    SUCCESS: (SUCCESS,),
    RUNNING: (RUNNING,),
    WAITING: (WAITING,),
    KV_USAGE: (KV_USAGE, "vllm:gpu_cache_usage_perc"),
    ITL: (ITL, "vllm:time_per_output_token_seconds"),
}
# What a verification cannot do without.
REQUIRED: tuple[str, ...] = (TTFT, E2E, SUCCESS, RUNNING)
# finished_reason values of vLLM's FinishReason that are successes ("abort", "error" are not).
SUCCESS_REASONS: frozenset[str] = frozenset({"stop", "length", "repetition"})

Labels = tuple[tuple[str, str], ...]


class Sample(NamedTuple):
    """One exposition line: metric name, sorted labels, value."""

    name: str
    labels: Labels
    value: float


class Scrape(NamedTuple):
    """One ``/metrics`` read: where, when (monotonic seconds) and its samples by (name, labels)."""

    url: str
    t: float
    samples: dict[tuple[str, Labels], float]


class QuantileBound(NamedTuple):
    """A quantile from histogram buckets: ``lo ≤ q ≤ hi``; ``interpolated`` as histogram_quantile."""

    lo: float
    hi: float
    interpolated: float
    count: float  # observations in the window


class WindowReading(NamedTuple):
    """What one class's replicas did between two scrapes (rates in req/s over all its replicas)."""

    window_s: float
    replicas: int
    finished: float  # requests that finished, any reason
    served: float  # finished with a success reason
    offered_rps: float  # (finished + change in running + waiting) / window
    served_rps: float
    success_rate: float | None
    ttft_p99: QuantileBound
    completion_p99: QuantileBound
    kv_cache_usage: float | None  # mean over replicas at the second scrape
    names: dict[str, str]  # canonical → the name this server exposes
    # The HTTP server's own duration of completion requests (front end included;
    # prometheus-fastapi-instrumentator's histogram), None when not exposed.
    http_p99: QuantileBound | None = None
    # The p99 gap between output tokens (vllm:inter_token_latency_seconds, or its older
    # name), None when not exposed; read for the roles of a disaggregated class.
    itl_p99: QuantileBound | None = None
    # Requests waiting (queued) at the window's start and at its end, summed over the
    # replicas; None when the gauge is not exposed.
    waiting: tuple[float, float] | None = None
    # Requests running at the window's end, summed over the replicas.
    running: float | None = None


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def _value(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(text)  # "NaN" parses


def parse_text(text: str, source: str = "/metrics") -> list[Sample]:
    """Parse the Prometheus text format.

    Raises:
        InputError: a line that is not a sample or a comment (named by its number).
    """
    out: list[Sample] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise InputError(f"{source}: line {n} is not Prometheus text format: {line[:80]!r}")
        name, body, val = m.group(1), m.group(2), m.group(3)
        labels: list[tuple[str, str]] = []
        if body:
            inner = body[1:-1].strip()
            pos = 0
            while pos < len(inner):
                lm = _LABEL.match(inner, pos)
                if not lm:
                    raise InputError(f"{source}: line {n}: bad labels {body[:80]!r}")
                labels.append((lm.group(1), _unescape(lm.group(2))))
                pos = lm.end()
        try:
            value = _value(val)
        except ValueError:
            raise InputError(f"{source}: line {n}: bad value {val!r}") from None
        out.append(Sample(name, tuple(sorted(labels)), value))
    return out


def parse_scrape(text: str, url: str, t: float) -> Scrape:
    """A :class:`Scrape` of ``url`` read at ``t``."""
    return Scrape(url, t, {(s.name, s.labels): s.value for s in parse_text(text, url)})


def resolve_names(names: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """Map each canonical metric to the name present in ``names``; also the required ones missing.

    A histogram counts as present when its ``_bucket`` series is.
    """
    present = set(names)
    found: dict[str, str] = {}
    for canon, alts in ALIASES.items():
        for alt in alts:
            if alt in present or f"{alt}_bucket" in present:
                found[canon] = alt
                break
    missing = [c for c in REQUIRED if c not in found]
    return found, missing


HTTP_DURATION = "http_request_duration_seconds"
# The handlers of completion requests in vLLM's OpenAI-compatible server.
COMPLETION_HANDLERS = frozenset({"/v1/completions", "/v1/chat/completions"})


def histogram(samples: dict[tuple[str, Labels], float], name: str,
              handlers: frozenset[str] | None = None) -> tuple[list[float], list[float]]:
    """Upper bounds and cumulative counts of histogram ``name``, summed over its series
    (only those whose ``handler`` label is in ``handlers``, when given).

    Returns:
        ``(le, counts)``, both ``(n_buckets,)``, ``le`` ascending and ending in ``inf``.
    """
    acc: dict[float, float] = {}
    for (n, labels), v in samples.items():
        if n != f"{name}_bucket":
            continue
        lab = dict(labels)
        le = lab.get("le")
        if le is None or (handlers is not None and lab.get("handler") not in handlers):
            continue
        b = _value(le)
        acc[b] = acc.get(b, 0.0) + v
    les = sorted(acc)
    return les, [acc[b] for b in les]


def quantile_bounds(le: Sequence[float], counts: Sequence[float], q: float = 0.99) -> QuantileBound:
    """The bucket interval that must hold the sample ``q``-quantile, and the interpolated value.

    Args:
        le: bucket upper bounds ``(n_buckets,)``, ascending, the last ``inf``.
        counts: cumulative counts ``(n_buckets,)`` (a window's differences).
        q: the quantile in (0, 1).

    Returns:
        ``QuantileBound``; ``lo = hi = interpolated = nan`` with ``count = 0``
        when the window holds no observation; ``hi = inf`` when the
        quantile's observations are in the ``+Inf`` bucket.
    """
    n = float(counts[-1]) if counts else 0.0
    if n <= 0:
        return QuantileBound(math.nan, math.nan, math.nan, 0.0)
    h = (n - 1) * q  # 0-based rank of np.percentile's linear rule
    k_lo, k_hi = math.floor(h), min(math.ceil(h), n - 1)

    def bucket_of(rank: float) -> int:
        # The first bucket whose cumulative count exceeds the 0-based rank.
        for j, c in enumerate(counts):
            if c > rank + 1e-9:
                return j
        return len(counts) - 1

    j_lo, j_hi = bucket_of(k_lo), bucket_of(k_hi)
    lo = 0.0 if j_lo == 0 else float(le[j_lo - 1])
    hi = float(le[j_hi])
    # Prometheus' histogram_quantile: rank q·n, linear inside its bucket.
    rank = q * n
    j = next((i for i, c in enumerate(counts) if c >= rank), len(counts) - 1)
    below = 0.0 if j == 0 else float(counts[j - 1])
    start = 0.0 if j == 0 else float(le[j - 1])
    if math.isinf(le[j]):
        interp = start  # Prometheus returns the highest finite bound
    else:
        inside = float(counts[j]) - below
        interp = start + (float(le[j]) - start) * ((rank - below) / inside if inside > 0 else 1.0)
    return QuantileBound(lo, hi, interp, n)


def _series_sum(samples: dict[tuple[str, Labels], float], name: str, **match: str) -> float:
    total = 0.0
    for (n, labels), v in samples.items():
        if n == name and all(dict(labels).get(k) == val for k, val in match.items()):
            total += v
    return total


def _check_monotone(a: Scrape, b: Scrape, names: Iterable[str]) -> None:
    """A counter or bucket that went down, or a new process start time: the replica restarted."""
    start_a = a.samples.get(("process_start_time_seconds", ()))
    start_b = b.samples.get(("process_start_time_seconds", ()))
    if start_a is not None and start_b is not None and start_b != start_a:
        raise EnvironmentProblem(
            f"{b.url}: the server restarted mid-window (process_start_time_seconds changed), so its "
            "counters were reset; verify again over a window without a restart"
        )
    watched = tuple(names)
    for key, v in a.samples.items():
        n = key[0]
        if not any(n == w or n.startswith(w + "_") for w in watched):
            continue
        if key in b.samples and b.samples[key] < v - 1e-9:
            raise EnvironmentProblem(
                f"{b.url}: counter {n} went from {v:g} to {b.samples[key]:g} mid-window "
                "(the replica restarted?); verify again over a window without a restart"
            )


def reading(first: Sequence[Scrape], second: Sequence[Scrape], q: float = 0.99) -> WindowReading:
    """The window between ``first`` and ``second`` (one scrape per replica, same order), summed.

    Raises:
        InputError: a scrape with no ``vllm:`` series (not a vLLM server), or
            required metrics missing (all named, one line).
        EnvironmentProblem: a counter went down (a restart mid-window).
    """
    names: dict[str, str] = {}
    for s in (*first, *second):
        present = {n for n, _ in s.samples}
        if not any(n.startswith("vllm:") for n in present):
            raise InputError(f"{s.url}: not a vLLM /metrics (no vllm:* series)")
        found, missing = resolve_names(present)
        if missing:
            raise InputError(f"{s.url}: /metrics lacks {', '.join(missing)}")
        names = found
    for a, b in zip(first, second, strict=True):
        _check_monotone(a, b, [names[TTFT], names[E2E], names[SUCCESS]])
    window = max(b.t for b in second) - min(a.t for a in first)

    def diff_hist(name: str, handlers: frozenset[str] | None = None) -> tuple[list[float], list[float]]:
        total: dict[float, float] = {}
        for a, b in zip(first, second, strict=True):
            la, ca = histogram(a.samples, name, handlers)
            lb, cb = histogram(b.samples, name, handlers)
            da = dict(zip(la, ca, strict=True))
            for le_, c in zip(lb, cb, strict=True):
                total[le_] = total.get(le_, 0.0) + c - da.get(le_, 0.0)
        les = sorted(total)
        return les, [total[x] for x in les]

    ttft = quantile_bounds(*diff_hist(names[TTFT]), q=q)
    http = None
    if all(histogram(s.samples, HTTP_DURATION, COMPLETION_HANDLERS)[0] for s in (*first, *second)):
        http = quantile_bounds(*diff_hist(HTTP_DURATION, COMPLETION_HANDLERS), q=q)
    e2e = quantile_bounds(*diff_hist(names[E2E]), q=q)
    finished = served = inflight = 0.0
    for a, b in zip(first, second, strict=True):
        finished += _series_sum(b.samples, names[SUCCESS]) - _series_sum(a.samples, names[SUCCESS])
        for reason in SUCCESS_REASONS:
            served += (_series_sum(b.samples, names[SUCCESS], finished_reason=reason)
                       - _series_sum(a.samples, names[SUCCESS], finished_reason=reason))
        for g in (RUNNING, WAITING):
            if g in names:
                inflight += _series_sum(b.samples, names[g]) - _series_sum(a.samples, names[g])
    kv = None
    if KV_USAGE in names:
        kv = sum(_series_sum(b.samples, names[KV_USAGE]) for b in second) / max(len(second), 1)
    itl = quantile_bounds(*diff_hist(names[ITL]), q=q) if ITL in names else None
    waiting = None
    if WAITING in names:
        waiting = (sum(_series_sum(a.samples, names[WAITING]) for a in first),
                   sum(_series_sum(b.samples, names[WAITING]) for b in second))
    running = sum(_series_sum(b.samples, names[RUNNING]) for b in second)
    w = max(window, 1e-9)
    return WindowReading(
        window_s=window,
        replicas=len(second),
        finished=finished,
        served=served,
        offered_rps=max(finished + inflight, 0.0) / w,
        served_rps=served / w,
        success_rate=(served / finished) if finished > 0 else None,
        ttft_p99=ttft,
        completion_p99=e2e,
        kv_cache_usage=kv,
        names=names,
        http_p99=http,
        itl_p99=itl,
        waiting=waiting,
        running=running,
    )
