"""Workload classes from a request log: services first, then clusters in log-length space.

The method, so that a user can read it back:

1. Requests are split by service (the file, or a model/tenant column).
2. Within a service, each request is the point ``(ln prompt tokens, ln output
   tokens)``. Both axes are in the same unit (a factor e in length), so they are
   not rescaled. K-means (k-means++ start, :data:`N_INIT` starts, fixed seed)
   groups the points; with ``k`` given it uses that many classes.
3. ``auto``: the mean silhouette (Rousseeuw 1987) of each K in 2..:data:`K_MAX`
   is computed on a fixed sample of :data:`SILHOUETTE_SAMPLE` requests, among
   the Ks whose every class has at least :data:`MIN_CLASS_REQUESTS` requests.
   K is the smallest one within :data:`SILHOUETTE_TOLERANCE` of the largest
   silhouette (fewer classes when more do not separate the requests clearly
   better; the silhouettes of neighbouring Ks on halves of a trace differ by
   about that much), among the Ks that show structure: a silhouette of at
   least :data:`SILHOUETTE_STRUCTURE` (Kaufman & Rousseeuw's "no substantial
   structure" threshold) and at least :data:`REFERENCE_MARGIN` above the same
   K's silhouette on a Gaussian sample of the service's mean and covariance
   (k-means splits even one Gaussian blob, at a silhouette near 0.35; the
   reference plays the part of the gap statistic's null, Tibshirani et al.
   2001). With no such K the service is one class.
4. A request belongs to the class with the nearest centre (in log tokens).
   Classes are numbered by their centre's prompt length, then output length.

Each class is described by its centre (geometric-mean lengths) and its 5–95 %
length ranges. Demand: the mean rate is the class's requests over its service's
period (span plus one mean gap, :attr:`~fleetsieve_bayes.backends.traces.Trace.period_s`,
so that the classes' rates add up to the service's rate); the peak is a
percentile of the rate in consecutive windows of ``window_s`` over the span.

The evidence for the thresholds below (stability across halves of the Azure
trace, the silhouette of one Gaussian blob) is in ``docs/classes.md``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.workloads.logs import RequestLog

__all__ = [
    "KMeans",
    "ClassSummary",
    "Classification",
    "kmeans",
    "silhouette",
    "choose_k",
    "classify",
    "assign",
    "adjusted_rand_index",
    "window_rates",
    "K_MAX",
    "MIN_CLASS_REQUESTS",
]

K_MAX = 6
N_INIT = 4
MAX_ITER = 100
CENTRE_TOL = 1e-4  # ln tokens: iterations stop when no centre moves by 0.01 %
FIT_SAMPLE = 20_000  # requests a k-means fit sees (the rest are assigned to its centres)
SILHOUETTE_SAMPLE = 2_000
SILHOUETTE_STRUCTURE = 0.25
SILHOUETTE_TOLERANCE = 0.05
REFERENCE_MARGIN = 0.05
MIN_CLASS_REQUESTS = 30
INTERACTIVE_MAX_OUTPUT = 512  # median output tokens at or below which a class is interactive-short
SEED = 0


class KMeans(NamedTuple):
    """A k-means fit. ``centres`` ``(k, 2)`` in ln tokens (prompt, output), sorted; ``inertia``
    the mean squared distance of the fitted points to their centre."""

    centres: np.ndarray
    inertia: float


class ClassSummary(NamedTuple):
    """One workload class (see the module docstring for what each number means)."""

    name: str
    service: str
    index: np.ndarray  # (n_class,) rows of the log, in arrival order
    centre_tokens: tuple[float, float]  # geometric-mean prompt, output tokens
    prompt_range: tuple[int, int]  # 5-95 % prompt tokens
    output_range: tuple[int, int]
    mean_rps: float
    peak_rps: float
    window_rates: np.ndarray  # (n_windows,) req/s of the class in consecutive windows
    slo_family: str  # "interactive-short" | "batch-long"


class Classification(NamedTuple):
    """All classes of a log. ``labels`` ``(n,)`` the class of every request (index into ``classes``)."""

    classes: tuple[ClassSummary, ...]
    labels: np.ndarray
    k_per_service: dict[str, int]
    silhouettes: dict[str, dict[int, float]]  # service → K → mean silhouette (auto only)
    window_s: float
    peak_pct: float
    service_rps: dict[str, float]
    window_start: dict[str, float]  # service → start of its first window (log clock)


def _points(inp: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``(n, 2)`` ln tokens; a zero count is read as 1 token (it is replayed as 1)."""
    return np.log(np.maximum(np.stack([inp, out], axis=1), 1).astype(np.float64))


def _nearest(x: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(labels (n,), squared distance (n,))`` of each point to its nearest centre."""
    d = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ centres.T) + (centres * centres).sum(axis=1)[None, :]
    lab = np.argmin(d, axis=1)
    return lab, np.maximum(d[np.arange(len(x)), lab], 0.0)


def _labels(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Nearest centre of each point ``(n,)`` (|x|² is the same for every centre, so left out)."""
    return np.argmin((centres * centres).sum(axis=1)[None, :] - 2.0 * (x @ centres.T), axis=1)


def _sort_centres(c: np.ndarray) -> np.ndarray:
    return c[np.lexsort((c[:, 1], c[:, 0]))]


def kmeans(x: np.ndarray, k: int, *, seed: int = SEED, n_init: int = N_INIT) -> KMeans:
    """K-means of ``x`` ``(n, 2)``: ``n_init`` k-means++ starts, the lowest inertia kept.

    Deterministic for a given ``seed``; the centres come back sorted (prompt, then output).
    """
    n = len(x)
    if k < 1 or k > n:
        raise ValueError(f"k = {k} for {n} points")
    rng = np.random.default_rng(seed)
    best: KMeans | None = None
    for _ in range(n_init):
        c = np.empty((k, x.shape[1]))
        c[0] = x[rng.integers(n)]
        d2 = ((x - c[0]) ** 2).sum(axis=1)
        for j in range(1, k):
            tot = d2.sum()
            i = int(rng.choice(n, p=d2 / tot)) if tot > 0 else int(rng.integers(n))
            c[j] = x[i]
            d2 = np.minimum(d2, ((x - c[j]) ** 2).sum(axis=1))
        for _it in range(MAX_ITER):
            lab = _labels(x, c)
            counts = np.bincount(lab, minlength=k)
            filled = counts > 0
            old = c.copy()
            for dim in range(x.shape[1]):
                sums = np.bincount(lab, weights=x[:, dim], minlength=k)
                c[filled, dim] = sums[filled] / counts[filled]
            if np.abs(c - old).max() < CENTRE_TOL:
                break
        _, d = _nearest(x, c)
        fit = KMeans(_sort_centres(c.copy()), float(d.mean()))
        if best is None or fit.inertia < best.inertia - 1e-12:
            best = fit
    assert best is not None
    return best


def assign(inp: np.ndarray, out: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Class of each request ``(n,)``: the nearest of ``centres`` ``(k, 2)`` (ln tokens)."""
    return _labels(_points(inp, out), centres)


def distances(x: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix ``(m, m)`` of the points ``x`` ``(m, 2)``."""
    sq = (x * x).sum(axis=1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0))
    np.fill_diagonal(d, 0.0)
    return d


def silhouette(x: np.ndarray, labels: np.ndarray, d: np.ndarray | None = None) -> float:
    """Mean silhouette of ``x`` ``(m, 2)`` under ``labels`` ``(m,)`` (0 for a singleton's point);
    ``d`` the points' :func:`distances`, when already at hand."""
    k = int(labels.max()) + 1
    if k < 2:
        return 0.0
    if d is None:
        d = distances(x)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = d @ (labels[:, None] == np.arange(k)[None, :]).astype(np.float64)  # (m, k)
    own = counts[labels] - 1
    a = np.where(own > 0, sums[np.arange(len(x)), labels] / np.maximum(own, 1), 0.0)
    other = np.where(np.arange(k)[None, :] == labels[:, None], np.inf,
                     sums / np.where(counts > 0, counts, np.inf)[None, :])
    other = np.where(counts[None, :] > 0, other, np.inf)
    b = other.min(axis=1)
    s = np.where(own > 0, (b - a) / np.maximum(np.maximum(a, b), 1e-300), 0.0)
    return float(s.mean())


def _sample(n: int, m: int, seed: int) -> np.ndarray:
    if n <= m:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))


def choose_k(x: np.ndarray, *, seed: int = SEED, k_max: int = K_MAX,
             min_requests: int = MIN_CLASS_REQUESTS) -> tuple[int, dict[int, float], dict[int, KMeans]]:
    """``(K, {K: silhouette}, {K: fit})`` by the rule of the module docstring; ``x`` ``(n, 2)``."""
    fit_rows = x[_sample(len(x), FIT_SAMPLE, seed)]
    sil_rows = _sample(len(x), SILHOUETTE_SAMPLE, seed + 1)
    cov = np.cov(x.T) + 1e-9 * np.eye(x.shape[1])
    ref = np.random.default_rng(seed + 2).multivariate_normal(x.mean(axis=0), cov, size=len(sil_rows))
    d_sil, d_ref = distances(x[sil_rows]), distances(ref)
    scores: dict[int, float] = {}
    fits: dict[int, KMeans] = {}
    good: dict[int, float] = {}
    n_distinct = len(np.unique(fit_rows, axis=0))
    for k in range(2, k_max + 1):
        if k * min_requests > len(x) or n_distinct < k:
            break
        fit = kmeans(fit_rows, k, seed=seed)
        lab = _labels(x, fit.centres)
        if np.bincount(lab, minlength=k).min() < min_requests:
            continue
        fits[k] = fit
        scores[k] = silhouette(x[sil_rows], lab[sil_rows], d_sil)
        ref_lab = _labels(ref, kmeans(ref, k, seed=seed).centres)
        if scores[k] >= SILHOUETTE_STRUCTURE and scores[k] >= silhouette(ref, ref_lab, d_ref) + REFERENCE_MARGIN:
            good[k] = scores[k]
    if not good:
        return 1, scores, fits
    best = max(good.values())
    return min(k for k, v in good.items() if v >= best - SILHOUETTE_TOLERANCE), scores, fits


def window_rates(t: np.ndarray, start: float, span: float, window_s: float) -> np.ndarray:
    """Requests per second in consecutive windows ``[start + i·w, start + (i+1)·w)`` covering
    ``span`` (the last, partial window dropped); ``t`` ``(n,)`` arrival times."""
    m = int(math.floor(span / window_s + 1e-9))
    edges = start + window_s * np.arange(m + 1)
    counts = np.diff(np.searchsorted(np.sort(t), edges, side="left"))  # half-open windows
    return counts / window_s


def adjusted_rand_index(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985) of two labelings ``(n,)``; 1 = identical partitions."""
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), dtype=np.float64)
    np.add.at(table, (ai, bi), 1.0)

    def pairs(v: np.ndarray) -> float:
        return float((v * (v - 1) / 2).sum())

    n = len(a)
    index = pairs(table)
    ea, eb = pairs(table.sum(axis=1)), pairs(table.sum(axis=0))
    expected = ea * eb / (n * (n - 1) / 2)
    top = (ea + eb) / 2
    if top == expected:
        return 1.0
    return (index - expected) / (top - expected)


def classify(log: RequestLog, *, k: int | None = None, window_s: float = 60.0, peak_pct: float = 95.0,
             seed: int = SEED, min_requests: int = MIN_CLASS_REQUESTS) -> Classification:
    """Workload classes of ``log`` (module docstring). ``k``: classes per service (None: auto).

    Raises:
        InputError: a service or class with fewer than ``min_requests`` requests, a trace
            shorter than one window, or no token counts to tell requests apart.
    """
    if not (window_s > 0 and math.isfinite(window_s)):
        raise InputError(f"--window must be a positive number of seconds, got {window_s!r}")
    if not 0 < peak_pct <= 100:
        raise InputError(f"--peak must be a percentile in (0, 100], got {peak_pct!r}")
    classes: list[ClassSummary] = []
    labels = np.full(log.n, -1, dtype=np.int64)
    k_per: dict[str, int] = {}
    sils: dict[str, dict[int, float]] = {}
    svc_rps: dict[str, float] = {}
    starts: dict[str, float] = {}
    for s, (name, src) in enumerate(zip(log.services, log.sources, strict=True)):
        rows = np.flatnonzero(log.service == s)
        shared = sum(1 for other in log.sources if other == src) > 1  # a service column
        where = f"{src}: service {name!r}" if shared else src
        if len(rows) < min_requests:
            raise InputError(f"{where}: {len(rows)} requests, fewer than the {min_requests} a class needs "
                             "for its demand and tails")
        t = log.arrival_s[rows]
        span = float(t[-1] - t[0])
        if span <= 0:
            raise InputError(f"{where}: every request has the same timestamp; no arrival rate to read")
        if span < window_s:
            raise InputError(f"{where}: the trace spans {span:.1f} s, shorter than one --window of {window_s:g} s")
        period = span + span / (len(rows) - 1)
        svc_rps[name] = len(rows) / period
        starts[name] = float(t[0])
        x = _points(log.input_tokens[rows], log.output_tokens[rows])
        if k is None:
            kk, scores, fits = choose_k(x, seed=seed, min_requests=min_requests)
            sils[name] = scores
            centres = fits[kk].centres if kk > 1 else x.mean(axis=0, keepdims=True)
        else:
            if k < 1:
                raise InputError(f"--k must be >= 1, got {k}")
            if len(np.unique(x, axis=0)) < k:
                raise InputError(f"{where}: only {len(np.unique(x, axis=0))} distinct (prompt, output) "
                                 f"lengths, fewer than --k {k}")
            kk = k
            centres = kmeans(x[_sample(len(x), FIT_SAMPLE, seed)], k, seed=seed).centres if k > 1 \
                else x.mean(axis=0, keepdims=True)
        k_per[name] = kk
        lab = _labels(x, centres)
        counts = np.bincount(lab, minlength=kk)
        for j in range(kk):
            if counts[j] < min_requests:
                raise InputError(f"{where}: class {j} of {kk} has {counts[j]} requests, fewer than "
                                 f"{min_requests}; use a smaller --k")
        for j in range(kk):
            sel = rows[lab == j]
            labels[sel] = len(classes)
            inp, out = log.input_tokens[sel], log.output_tokens[sel]
            rates = window_rates(log.arrival_s[sel], float(t[0]), span, window_s)
            cname = name if kk == 1 else f"{name}-{j}"
            med_out = float(np.median(out))
            classes.append(ClassSummary(
                name=cname, service=name, index=sel,
                centre_tokens=(float(np.exp(centres[j, 0])), float(np.exp(centres[j, 1]))),
                prompt_range=(int(np.percentile(inp, 5)), int(np.percentile(inp, 95))),
                output_range=(int(np.percentile(out, 5)), int(np.percentile(out, 95))),
                mean_rps=len(sel) / period,
                peak_rps=float(np.percentile(rates, peak_pct)),
                window_rates=rates,
                slo_family="interactive-short" if med_out <= INTERACTIVE_MAX_OUTPUT else "batch-long",
            ))
    return Classification(tuple(classes), labels, k_per, sils, window_s, peak_pct, svc_rps, starts)
