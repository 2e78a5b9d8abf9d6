"""Synthetic ground-truth fleets for the profiling-cost benchmark suite.

A synthetic fleet is a fully measured table in the docs/contracts.md schema plus a
campaign (budget, demands, SLOs) over it. The ground truth comes from a
plausible serving curve, deliberately *not* the model's own parametric form
(so the benchmark does not test the model against itself):

- per-GPU capacity is concave in ``u = log2(TP)`` with a knee ``m`` placed
  inside the TP range or at either edge:
  ``c(u) = peak · max(floor, 1 − b·|u − m|^1.5)``; a replica serves ``TP·c(u)``;
- served throughput is the smooth minimum ``(offered^-k + cap^-k)^(-1/k)``;
- tails rise with utilisation ``ρ = offered / cap``:
  ``L = base · TP-slope · (offered/ref)^e · (1 + A·g(ρ))``. Open-loop classes
  (a Poisson rate) have ``g(ρ) = ρ / (s·log(1 + e^{(1−ρ)/s}))`` (≈ ρ/(1−ρ)
  below saturation, huge past it, capped): a *sharp* tail knee (small ``s``,
  no load elasticity ``e``: flat, then an explosion, M/M/1-like) or a
  *gradual* one (larger ``s`` and ``e > 0``: rising well before saturation).
  Closed-loop classes (load = N requests kept in flight, offered rate
  ``N / completion at light load``) queue instead of exploding: past
  saturation the wait grows linearly in ``ρ`` (``g = min(g_open, 8ρ²)``);
- success falls near saturation (softplus in ρ − 1); a class with *partial
  failures* loses a large share of its requests in overload, and its most
  overloaded cell is a failed run that reports throughput 0, success 0 and
  TTFT/completion 0 (no failure label: what a naive ingest of such a run
  returns);
- a class may fail to start at its smallest TP (start-up OOM): every cell of
  that TP has throughput 0, success 0, tails 0, ``failure = "startup-oom"``
  and costs only the start-up attempt (:data:`OOM_DURATION_S`);
- measurements carry multiplicative log-normal noise (tails ``σ``, throughput
  ``σ/3``, the failure rate ``1 − success`` ``σ``); failed cells are exact.
- with ``window_noise`` (issue 29's suite) a measurement is one *window* drawn
  around the truth with noise of the shape real repeats show
  (:func:`window_noise_params`): tails scatter log-normally with an sd that is
  small at light load and grows near and past the knee, success mostly sits
  near its truth but with a small probability drops in a burst (an
  exponential drop on the logit), throughput barely moves. ``windows`` rows
  per cell (``replicate`` 0, 1, …) are drawn independently, and
  ``true_attainment`` is the probability that one window meets the class's
  SLOs (:func:`true_attainment`, exact under that noise).

SLOs sit on a cell's true value rounded to 3 significant digits (for
:func:`random_spec`'s ``slo_on_cell``), so some cells sit within 1 % of their
SLO — on either side.

The returned table holds the *noisy* metrics in the docs/contracts.md columns (what
the replay backend reveals) and the noise-free truth in ``true_<metric>``
columns; :func:`truth_table` swaps them in. ``read_table`` ignores the extra
columns, so the written CSV is a valid replay table.

Load ladders: each class has a geometric ladder of offered rates labelled
``C0, C1, …`` (closed loop: ``N<requests>``); each TP gets the ladder points
inside a window around its replica capacity (at most ``n_loads`` of them,
spread evenly), so one label always means one offered rate, as the grid
requires. The window may end below saturation (knee past the top edge of the
loads) or start past it (knee at the bottom edge).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.campaign.config import Campaign, parse_campaign
from fleetsieve_bayes.table import COLUMNS, METRICS

__all__ = [
    "SyntheticSpec",
    "random_spec",
    "synthetic_fleet",
    "truth_table",
    "campaign_toml",
    "toml_value",
    "write_synthetic",
    "round_sig",
    "TRUE_COLUMNS",
    "CLASS_NAMES",
    "OOM_DURATION_S",
    "window_noise_params",
    "true_attainment",
    "window_draws",
]

CLASS_NAMES: tuple[str, ...] = ("chat", "code", "rank", "batch")
TRUE_COLUMNS: tuple[str, ...] = tuple(f"true_{m}" for m in METRICS)
KNEES: tuple[str, ...] = ("interior", "low", "high")
TAIL_KNEES: tuple[str, ...] = ("gradual", "sharp")
LOOPS: tuple[str, ...] = ("open", "closed")
CRITICAL: tuple[str, ...] = ("none", "feasible", "infeasible")
TP_CHOICES: frozenset[int] = frozenset({1, 2, 4, 8, 16})
# Wall seconds a start-up attempt that dies of OOM costs (weights loaded, KV cache not).
OOM_DURATION_S = 90.0

_SAT_SHARPNESS = 8.0  # k of the smooth minimum
_G_SOFT = {"gradual": 0.05, "sharp": 0.015}  # s of the open-loop congestion term g(ρ)
_G_MAX = 1000.0  # cap of g(ρ): a finite measurement window bounds the queue
_G_SAT, _G_OVER = 100.0, 600.0  # overload: g ≤ 100 + 600·(ρ − 1)
_CLOSED_QUEUE = 8.0  # closed loop: g ≤ 8ρ² (the wait grows, it does not explode)


class SyntheticSpec(NamedTuple):
    """What to generate. Per-class tuples have length ``n_classes`` (or are
    empty: the default for every class).

    Attributes:
        tps: TP degrees, a subset of {1, 2, 4, 8, 16} with at least two.
        knees: per class, ``"interior"`` (strictly inside the TP range),
            ``"low"`` (at the smallest TP or just below it) or ``"high"``.
        gpus: fleet budget G.
        pressure: total demand relative to what G GPUs can serve within SLO at
            each class's best per-GPU rate (1.0: just enough in the fractional
            relaxation; integer replicas make it contested).
        noise: σ of the multiplicative measurement noise (0: exact).
        critical: ``"none"``, ``"feasible"`` (class 0 critical, floor 0.5) or
            ``"infeasible"`` (class 0 critical, floor 1, demand above what the
            whole fleet can serve).
        n_loads: load settings per (class, TP), at most.
        duration_s: measurement duration of every cell.
        tail_knees: per class ``"gradual"`` or ``"sharp"`` (default gradual).
        loops: per class ``"open"`` (a rate) or ``"closed"`` (N requests).
        oom: per class, whether its smallest TP fails at start-up.
        partial_fail: per class, heavy request failures in overload and a
            failed run (all zeros) at its most overloaded cell.
        slo_on_cell: SLO limits are a cell's true value rounded to 3
            significant digits (else the value at a utilisation, as before).
        load_window: ``(lo, hi)`` of the per-TP load window relative to the
            replica capacity (``None``: 0.45–1.25, jittered per TP when
            ``slo_on_cell``).
        window_noise: measurements are windows with issue 29's noise shape
            (replaces ``noise``); the table gains ``replicate`` and
            ``true_attainment`` columns.
        windows: rows per cell (window noise only).
    """

    n_classes: int = 2
    tps: tuple[int, ...] = (2, 4, 8)
    knees: tuple[str, ...] = ("interior", "interior")
    gpus: int = 16
    pressure: float = 1.0
    noise: float = 0.03
    critical: str = "none"
    n_loads: int = 4
    duration_s: float = 300.0
    tail_knees: tuple[str, ...] = ()
    loops: tuple[str, ...] = ()
    oom: tuple[bool, ...] = ()
    partial_fail: tuple[bool, ...] = ()
    slo_on_cell: bool = False
    load_window: tuple[float, float] | None = None
    window_noise: bool = False
    windows: int = 1


def round_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (0 stays 0)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(round(x, digits - 1 - int(math.floor(math.log10(abs(x))))))


def _ceil_sig(x: float, digits: int = 3) -> float:
    """The smallest ``digits``-significant-digit number ≥ ``x``."""
    e = digits - 1 - int(math.floor(math.log10(abs(x))))
    return float(math.ceil(x * 10**e) / 10**e)


def random_spec(rng: np.random.Generator, *, hard: bool = True) -> SyntheticSpec:
    """Draw one spec for the benchmark suite.

    ``hard`` (the default; docs/results.md, "Unseen fleets"): 2–4 classes; 2–5 TPs from
    {1, 2, 4, 8, 16} (TP1 in most sets); 4–8 loads; capacity knees inside and
    at both edges; sharp and gradual tail knees; open- and closed-loop
    classes; start-up OOM at the smallest TP and partial failures in overload;
    SLOs on a cell's true value (3 significant digits); critical floors that
    make some fleets infeasible. ``hard=False`` draws the easier ``v1`` family
    (2–4 classes, TPs within {1, 2, 4, 8}, 3–4 loads, open loop, no failures).
    """
    n_classes = int(rng.choice([2, 2, 3, 3, 4]))
    if not hard:
        tp_sets = [(2, 4, 8), (2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (2, 4), (4, 8), (1, 2, 4, 8)]
        tps = tp_sets[int(rng.integers(len(tp_sets)))]
        knees = tuple(str(rng.choice(KNEES, p=[0.5, 0.25, 0.25])) for _ in range(n_classes))
        gpus = int(rng.choice([g for g in (8, 16, 32) if g >= max(tps) * max(1.0, n_classes / 2)]))
        pressure = float(rng.choice([0.6, 1.0, 1.0, 1.3]))
        noise = float(rng.choice([0.0, 0.02, 0.05]))
        critical = str(rng.choice(CRITICAL, p=[0.6, 0.25, 0.15]))
        n_loads = int(rng.choice([3, 4]))
        return SyntheticSpec(n_classes, tps, knees, gpus, pressure, noise, critical, n_loads)
    tp_sets = [
        (1, 2), (1, 4), (2, 4), (1, 2, 4), (1, 2, 4), (2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8),
        (1, 4, 8), (1, 2, 4, 8, 16), (2, 4, 8, 16),
    ]
    tps = tp_sets[int(rng.integers(len(tp_sets)))]
    knees = tuple(str(rng.choice(KNEES, p=[0.5, 0.25, 0.25])) for _ in range(n_classes))
    gpus = int(rng.choice([g for g in (8, 16, 32, 64) if g >= max(tps) * max(1.0, n_classes / 2)][:3]))
    pressure = float(rng.choice([0.6, 1.0, 1.0, 1.3]))
    noise = float(rng.choice([0.0, 0.02, 0.05]))
    critical = str(rng.choice(CRITICAL, p=[0.5, 0.25, 0.25]))
    n_loads = int(rng.integers(4, 9))
    tail_knees = tuple(str(rng.choice(TAIL_KNEES)) for _ in range(n_classes))
    loops = tuple(str(rng.choice(LOOPS, p=[0.7, 0.3])) for _ in range(n_classes))
    # OOM only where a larger TP remains (a class must have somewhere to run).
    oom = tuple(bool(len(tps) >= 2 and rng.random() < 0.25) for _ in range(n_classes))
    partial = tuple(bool(rng.random() < 0.3) for _ in range(n_classes))
    return SyntheticSpec(
        n_classes, tps, knees, gpus, pressure, noise, critical, n_loads,
        tail_knees=tail_knees, loops=loops, oom=oom, partial_fail=partial, slo_on_cell=True,
    )


def _g(rho: np.ndarray, soft: float = _G_SOFT["gradual"], closed: bool = False) -> np.ndarray:
    """Congestion term ``(…,)``: ≈ ρ/(1−ρ) below saturation, large past it, capped;
    closed loop: at most ``8ρ²`` (a queue of N requests grows linearly, no explosion)."""
    s = soft * np.logaddexp(0.0, (1.0 - rho) / soft)
    # Past saturation the queue of a finite window grows with the excess load.
    g = np.minimum(rho / s, np.minimum(_G_SAT + _G_OVER * np.maximum(rho - 1.0, 0.0), _G_MAX))
    if closed:
        g = np.minimum(g, _CLOSED_QUEUE * rho * rho)
    return g


def _knee(rng: np.random.Generator, kind: str, u: np.ndarray) -> float:
    """Knee position in log2 TP; ``u`` is ``(n_tp,)`` sorted."""
    lo, hi = float(u[0]), float(u[-1])
    if kind == "low":
        return lo - float(rng.uniform(0.0, 0.4))
    if kind == "high":
        return hi + float(rng.uniform(0.0, 0.4))
    if len(u) >= 3:
        # Strictly inside: between the second-smallest and second-largest TP, ±0.3.
        return float(rng.uniform(float(u[1]) - 0.3, float(u[-2]) + 0.3))
    return float(rng.uniform(lo + 0.25, hi - 0.25))


def _class_curve(
    rng: np.random.Generator,
    tps: np.ndarray,
    knee_kind: str,
    tail_knee: str = "gradual",
    loop: str = "open",
    partial_fail: bool = False,
) -> dict[str, Any]:
    """Ground-truth parameters of one class; ``tps`` is ``(n_tp,)``."""
    u = np.log2(tps.astype(float))
    p = {
        "peak": float(rng.uniform(1.0, 4.0)),  # req/s per GPU at the knee
        "knee": _knee(rng, knee_kind, u),
        "bend": float(rng.uniform(0.2, 0.45)),
        "ttft0": float(rng.uniform(0.2, 1.0)),  # s, light-load p99 at TP 4
        "comp0": float(rng.uniform(4.0, 15.0)),
        "ttft_slope": float(rng.uniform(0.5, 0.9)),  # ∝ TP^-slope
        "comp_slope": float(rng.uniform(0.2, 0.5)),
        "ttft_amp": float(rng.uniform(0.1, 0.4)),
        "comp_amp": float(rng.uniform(0.1, 0.4)),
        "success_drop": float(rng.uniform(0.01, 0.03)),
        "soft": _G_SOFT["gradual"],
        "elasticity": 0.0,
        "closed": False,
    }
    # Only these draws consume randomness beyond the v1 family's, and only for
    # the hard kinds, so v1 fleets stay reproducible.
    if tail_knee == "sharp":
        p["soft"] = _G_SOFT["sharp"]
        p["ttft_amp"] = float(rng.uniform(0.05, 0.2))  # flat, then an explosion
        p["comp_amp"] = float(rng.uniform(0.05, 0.2))
    elif tail_knee != "gradual":
        raise ValueError(f"tail knee must be 'gradual' or 'sharp', got {tail_knee!r}")
    if tail_knee == "gradual" and loop == "closed" or tail_knee == "gradual" and partial_fail:
        p["elasticity"] = float(rng.uniform(0.1, 0.4))
    if loop == "closed":
        p["closed"] = True
        p["success_drop"] = float(rng.uniform(0.001, 0.005))  # queued, not timed out
    elif loop != "open":
        raise ValueError(f"loop must be 'open' or 'closed', got {loop!r}")
    if partial_fail:
        p["success_drop"] = float(rng.uniform(0.3, 0.8))
    return p


def _capacity(p: dict[str, Any], tp: np.ndarray) -> np.ndarray:
    """Replica capacity (req/s) ``(n,)`` of TPs ``tp (n,)``."""
    u = np.log2(tp.astype(float))
    per_gpu = p["peak"] * np.maximum(0.15, 1.0 - p["bend"] * np.abs(u - p["knee"]) ** 1.5)
    return tp * per_gpu


def _metrics(
    p: dict[str, Any], tp: np.ndarray, offered: np.ndarray, load_ref: float | None = None
) -> np.ndarray:
    """Noise-free metrics ``(n, 4)`` (METRICS order) of cells ``tp, offered (n,)``.

    ``load_ref`` is the class's reference load of the tails' load elasticity
    (ignored when the class has none).
    """
    cap = _capacity(p, tp)
    k = _SAT_SHARPNESS
    thr = (offered**-k + cap**-k) ** (-1.0 / k)
    rho = offered / cap
    g = _g(rho, p.get("soft", _G_SOFT["gradual"]), bool(p.get("closed", False)))
    e = float(p.get("elasticity", 0.0))
    grow = (offered / (load_ref if load_ref else float(np.median(offered)))) ** e if e else 1.0
    ttft = p["ttft0"] * (4.0 / tp) ** p["ttft_slope"] * grow * (1.0 + p["ttft_amp"] * g)
    comp = p["comp0"] * (4.0 / tp) ** p["comp_slope"] * grow * (1.0 + p["comp_amp"] * g)
    fail = 0.001 + p["success_drop"] * 0.08 * np.logaddexp(0.0, (rho - 1.05) / 0.08)
    succ = np.clip(1.0 - fail, 0.0, 1.0)
    return np.stack([thr, ttft, comp, succ], axis=-1)


def _ladder_loads(
    rng: np.random.Generator,
    caps: np.ndarray,
    n_loads: int,
    window: tuple[float, float] | None = None,
    jitter: bool = False,
    ratio: float = 1.3,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A class's geometric ladder and, per TP, the ladder indices it is measured at.

    Args:
        caps: ``(n_tp,)`` replica capacities.
        window: per-TP window ``(lo, hi)`` relative to the replica capacity.
        jitter: draw each TP's window around ``window`` (edges of the load
            range may then sit below or past saturation).

    Returns:
        ``ladder (n_ladder,)`` offered rates and one index array per TP (≥ 2 each).
    """
    w_lo, w_hi = window if window is not None else (0.45, 1.25)
    if jitter:
        lows = w_lo * np.exp(rng.uniform(-0.5, 0.9, len(caps)))
        highs = np.maximum(w_hi * np.exp(rng.uniform(-0.35, 0.45, len(caps))), lows * ratio ** 3)
    else:
        lows = np.full(len(caps), w_lo)
        highs = np.full(len(caps), w_hi)
    start = float((lows * caps).min()) * ratio ** float(rng.uniform(-1.0, 0.0))
    n_ladder = int(math.ceil(math.log(float((highs * caps).max()) * 1.05 / start) / math.log(ratio))) + 1
    ladder = start * ratio ** np.arange(n_ladder)
    picks = []
    for cap, lo, hi in zip(caps, lows, highs, strict=True):
        idx = np.flatnonzero((ladder >= lo * cap) & (ladder <= hi * cap))
        if len(idx) < 2:  # at least two loads per TP
            near = int(np.argmin(np.abs(np.log(ladder / cap))))
            idx = np.array(sorted({max(near - 1, 0), near, min(near + 1, n_ladder - 1)}))
        if len(idx) > n_loads:
            idx = idx[np.round(np.linspace(0, len(idx) - 1, n_loads)).astype(int)]
        picks.append(idx)
    return ladder, picks


def _failed_row() -> np.ndarray:
    """The metrics a failed run reports: no throughput, no success, tails 0."""
    return np.zeros(4)


def synthetic_fleet(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Generate one ground-truth table and a campaign over it.

    Returns:
        ``(table, campaign)``: ``table`` has the docs/contracts.md columns with
        noisy metrics plus ``true_*`` noise-free columns, ``calibration`` and
        ``failure``; ``campaign`` is the campaign mapping (as ``tomllib``
        would parse it) with ``[measurement] table = "grid.csv"``; write both
        with :func:`write_synthetic`.
    """
    k_cls = spec.n_classes
    tps = _checked_tps(spec)
    rows: list[dict[str, Any]] = []
    workloads: list[dict[str, Any]] = []
    best: list[float] = []
    # The draws happen class by class in a fixed order (curve, ladder, SLO, noise),
    # so a seed always gives the same fleet.
    for i in range(k_cls):
        name = CLASS_NAMES[i]
        tail_knee = spec.tail_knees[i] if spec.tail_knees else "gradual"
        loop = spec.loops[i] if spec.loops else "open"
        oom = bool(spec.oom[i]) if spec.oom else False
        partial = bool(spec.partial_fail[i]) if spec.partial_fail else False
        p = _class_curve(rng, tps, spec.knees[i], tail_knee, loop, partial)
        caps = _capacity(p, tps)
        ratio = float(rng.uniform(1.15, 1.35)) if spec.slo_on_cell else 1.3
        ladder, picks = _ladder_loads(rng, caps, spec.n_loads, spec.load_window, spec.slo_on_cell, ratio)
        load_ref = float(np.median(ladder))
        closed_n = _closed_n(ladder, p)
        oom_tp = int(tps[0]) if oom else 0
        # Per TP: offered rates (rounded as the table stores them, so the true
        # served rate never exceeds the offered rate in the file) and truth.
        per_tp: list[tuple[np.ndarray, np.ndarray]] = []
        for t_i, tp in enumerate(tps):
            offered = np.round(ladder[picks[t_i]], 4)
            per_tp.append((offered, _metrics(p, np.full(offered.shape, tp), offered, load_ref)))
        slo, ref, j0 = _class_slo(rng, spec, p, tps, caps, per_tp, oom_tp, load_ref)
        wn = window_noise_params(rng) if spec.window_noise else None
        class_rows = _class_rows(rng, spec, name, tps, picks, per_tp, oom_tp, partial, loop, closed_n, caps, wn)
        if spec.slo_on_cell:
            # The lightest candidate of the SLO's reference TP stays admissible as
            # measured too (noise may push it over a limit placed at its truth).
            per_cell = max(int(spec.windows), 1) if spec.window_noise else 1
            r0 = class_rows[(sum(len(picks[t]) for t in range(ref)) + j0) * per_cell]
            for key in ("ttft_p99_s", "completion_p99_s"):
                if key in slo and r0[key] > slo[key]:
                    slo[key] = _ceil_sig(float(r0[key]))
        if wn is not None:
            for r in class_rows:
                truth = np.array([[r[f"true_{m}"] for m in METRICS]])
                r["true_attainment"] = float(true_attainment(truth, np.array([r["_rho"]]), wn, slo)[0])
                del r["_rho"]
        rows.extend(class_rows)
        best.append(_best_admissible_per_gpu(class_rows, slo))
        workloads.append({"name": name, "slo": slo})
    _set_demands(rng, spec, workloads, best)

    extra = ["replicate", "true_attainment"] if spec.window_noise else []
    table = pd.DataFrame(rows, columns=[*COLUMNS, "calibration", "failure", *TRUE_COLUMNS, *extra])
    campaign = {
        "name": "synthetic",
        "fleet": {"gpus": int(spec.gpus)},
        "model": {"family": "generic"},
        "measurement": {"backend": "replay", "table": "grid.csv"},
        "stopping": {"epsilon": 0.05, "credible_level": 0.9, "slo_attainment": "point"},
        "workloads": workloads,
    }
    return table, campaign


def _checked_tps(spec: SyntheticSpec) -> np.ndarray:
    """The spec's TPs ``(n_tp,)``, sorted, after checking the per-class lists' lengths."""
    k_cls = spec.n_classes
    if len(spec.knees) != k_cls:
        raise ValueError(f"spec.knees has {len(spec.knees)} entries for {k_cls} classes")
    if not 1 <= k_cls <= len(CLASS_NAMES):
        raise ValueError(f"n_classes must be 1..{len(CLASS_NAMES)}")
    for name in ("tail_knees", "loops", "oom", "partial_fail"):
        v = getattr(spec, name)
        if v and len(v) != k_cls:
            raise ValueError(f"spec.{name} has {len(v)} entries for {k_cls} classes")
    tps = np.array(sorted(set(spec.tps)), dtype=np.int64)
    if len(tps) < 2 or not set(tps.tolist()) <= TP_CHOICES:
        raise ValueError(f"tps must be at least two of 1, 2, 4, 8, 16; got {spec.tps}")
    return tps


def _class_slo(
    rng: np.random.Generator,
    spec: SyntheticSpec,
    p: dict[str, Any],
    tps: np.ndarray,
    caps: np.ndarray,
    per_tp: list[tuple[np.ndarray, np.ndarray]],
    oom_tp: int,
    load_ref: float,
) -> tuple[dict[str, float], int, int]:
    """One class's SLO, the index of its reference TP and (on-cell SLOs) the lightest
    candidate load there that must stay admissible (0 otherwise)."""
    slo: dict[str, float] = {"success_min": float(rng.choice([0.98, 0.99]))}
    # SLO: the tail limit binds near the knee-nearest TP, so smaller TPs
    # (slower prefill) may pass only at lighter load.
    ref = int(np.argmin(np.abs(np.log2(tps) - np.clip(p["knee"], np.log2(tps[0]), np.log2(tps[-1])))))
    if ref == 0 and oom_tp and len(tps) > 1:
        ref = 1
    j0 = 0
    if spec.slo_on_cell:
        offered_r, truth_r = per_tp[ref]
        # A cell that serves what it is offered and succeeds: a limit an
        # operator would write down, right at one measured value.
        ok_s = (truth_r[:, 3] >= slo["success_min"]) & (truth_r[:, 0] >= 0.97 * offered_r)
        cand = np.flatnonzero(ok_s) if ok_s.any() else np.arange(len(offered_r))
        j = int(rng.choice(cand[len(cand) // 3 :] if len(cand) > 2 else cand))
        slo["ttft_p99_s"] = round_sig(float(truth_r[j, 1]), 3)
        if rng.random() < 0.6:
            j2 = int(rng.choice(cand))
            slo["completion_p99_s"] = round_sig(float(truth_r[j2, 2]), 3)
        # Rounding may put the limit just below the cell it sits on; keep at
        # least the lightest candidate admissible so the class can be served.
        # (checked against the noisy values too, once they are drawn).
        j0 = int(cand[0])
        if truth_r[j0, 1] > slo["ttft_p99_s"]:
            slo["ttft_p99_s"] = _ceil_sig(float(truth_r[j0, 1]))
        if "completion_p99_s" in slo and truth_r[j0, 2] > slo["completion_p99_s"]:
            slo["completion_p99_s"] = _ceil_sig(float(truth_r[j0, 2]))
    else:
        u_star = float(rng.uniform(0.75, 0.97))
        ref_m = _metrics(p, tps[ref : ref + 1], np.array([u_star * caps[ref]]), load_ref)[0]
        slo["ttft_p99_s"] = round(float(ref_m[1]), 3)
        if rng.random() < 0.6:
            u_c = float(rng.uniform(0.75, 0.97))
            slo["completion_p99_s"] = round(
                float(_metrics(p, tps[ref : ref + 1], np.array([u_c * caps[ref]]), load_ref)[0, 2]), 2
            )
    return slo, ref, j0


def _class_rows(
    rng: np.random.Generator,
    spec: SyntheticSpec,
    name: str,
    tps: np.ndarray,
    picks: list[np.ndarray],
    per_tp: list[tuple[np.ndarray, np.ndarray]],
    oom_tp: int,
    partial: bool,
    loop: str,
    closed_n: list[int],
    caps: np.ndarray | None = None,
    window: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One class's table rows: failures applied to the truth, then measurement
    noise (``window``: :func:`window_noise_params`, ``spec.windows`` rows per
    cell, with the cell's utilisation from ``caps (n_tp,)``)."""
    class_rows: list[dict[str, Any]] = []
    for t_i, tp in enumerate(tps):
        idx = picks[t_i]
        offered, truth = per_tp[t_i]
        truth = truth.copy()
        failure = [""] * len(idx)
        duration = np.full(len(idx), float(spec.duration_s))
        if int(tp) == oom_tp:
            truth[:] = _failed_row()
            failure = ["startup-oom"] * len(idx)
            duration[:] = OOM_DURATION_S
        elif partial and truth[-1, 0] < 0.9 * offered[-1]:
            truth[-1] = _failed_row()  # the most overloaded run died: zeros, unlabelled
        dead = truth[:, 0] <= 0
        if window is not None:
            rho = offered / float(caps[t_i])
            draws = window_draws(rng, truth, offered, rho, window, max(int(spec.windows), 1))
            draws[:, dead] = truth[dead]
        else:
            z = rng.standard_normal(truth.shape)
            s = spec.noise
            noisy = truth.copy()
            noisy[:, 0] = np.minimum(truth[:, 0] * np.exp(s / 3 * z[:, 0]), offered)
            noisy[:, 1] = truth[:, 1] * np.exp(s * z[:, 1])
            noisy[:, 2] = truth[:, 2] * np.exp(s * z[:, 2])
            noisy[:, 3] = np.clip(1.0 - (1.0 - truth[:, 3]) * np.exp(s * z[:, 3]), 0.0, 1.0)
            noisy[dead] = truth[dead]
            draws = noisy[None]
        for (j, k), rep in ((jk, r) for jk in enumerate(idx) for r in range(draws.shape[0])):
            noisy = draws[rep]
            label = f"N{closed_n[k]}" if loop == "closed" else f"C{int(k)}"
            row: dict[str, Any] = {
                "workload": name,
                "tp": int(tp),
                "load": label,
                "offered_rps": round(float(offered[j]), 4),
            }
            for m_i, m in enumerate(METRICS):
                row[m] = round(float(noisy[j, m_i]), 5)
            row["duration_s"] = float(duration[j])
            row["calibration"] = False
            row["failure"] = failure[j]
            for m_i, m in enumerate(METRICS):
                row[f"true_{m}"] = float(truth[j, m_i])
            if window is not None:
                row["replicate"] = rep
                row["_rho"] = float(rho[j])
            class_rows.append(row)
    return class_rows


def window_noise_params(rng: np.random.Generator) -> dict[str, float]:
    """One class's true window noise (drawn around the published repeat spreads,
    docs/results.md "Window noise"): tails' log-sd ``light`` at light load plus
    ``knee`` near and past saturation (``s0 + s1·sigmoid((ρ − 0.85)/0.1)``),
    success's ordinary logit scatter ``success_sd``, its burst probability
    ``burst`` and mean logit drop ``drop``, throughput's log-sd ``throughput``."""
    return {
        "light": float(rng.uniform(0.02, 0.06)),
        "knee": float(rng.uniform(0.08, 0.25)),
        "success_sd": float(rng.uniform(0.15, 0.5)),
        "burst": float(rng.uniform(0.01, 0.08)),
        "drop": float(rng.uniform(0.8, 2.0)),
        "throughput": 0.01,
    }


def _tail_sd(rho: np.ndarray, w: dict[str, float]) -> np.ndarray:
    """Tails' window log-sd ``(n,)`` at utilisations ``rho (n,)``."""
    return w["light"] + w["knee"] / (1.0 + np.exp(-(rho - 0.85) / 0.1))


def window_draws(
    rng: np.random.Generator, truth: np.ndarray, offered: np.ndarray, rho: np.ndarray, w: dict[str, float], n: int
) -> np.ndarray:
    """``n`` independent windows ``(n, n_cells, 4)`` of cells with true metrics
    ``truth (n_cells, 4)``, offered rates and utilisations ``(n_cells,)``."""
    shape = (n, *truth.shape[:1])
    out = np.empty((n, *truth.shape))
    out[..., 0] = np.minimum(truth[:, 0] * np.exp(w["throughput"] * rng.standard_normal(shape)), offered)
    sd = _tail_sd(rho, w)
    out[..., 1] = truth[:, 1] * np.exp(sd * rng.standard_normal(shape))
    out[..., 2] = truth[:, 2] * np.exp(sd * rng.standard_normal(shape))
    s = np.clip(truth[:, 3], 1e-6, 1 - 1e-6)
    burst = rng.random(shape) < w["burst"]
    logit = np.log(s / (1 - s)) + w["success_sd"] * rng.standard_normal(shape) - burst * rng.exponential(w["drop"], shape)
    out[..., 3] = 1.0 / (1.0 + np.exp(-logit))
    return out


def true_attainment(truth: np.ndarray, rho: np.ndarray, w: dict[str, float], slo: dict[str, float]) -> np.ndarray:
    """``(n_cells,)``: the probability that one window (:func:`window_draws`) of
    cells ``truth (n_cells, 4)`` at utilisations ``rho`` meets ``slo`` (success,
    TTFT p99, completion p99 together; the three are independent given the
    cell). A failed cell (0 throughput) attains 0."""
    from scipy.special import log_ndtr, ndtr

    sd = _tail_sd(rho, w)
    p = np.ones(truth.shape[0])
    for k, key in ((1, "ttft_p99_s"), (2, "completion_p99_s")):
        if key in slo:
            with np.errstate(divide="ignore"):
                p = p * ndtr((np.log(slo[key]) - np.log(np.maximum(truth[:, k], 1e-300))) / sd)
    s = np.clip(truth[:, 3], 1e-6, 1 - 1e-6)
    t = float(np.clip(slo["success_min"], 1e-6, 1 - 1e-6))
    x = np.log(s / (1 - s)) - math.log(t / (1 - t))
    sig, lam, pb = w["success_sd"], 1.0 / w["drop"], w["burst"]
    core = ndtr(x / sig)
    tail = np.exp(0.5 * (lam * sig) ** 2 - lam * x + log_ndtr(x / sig - lam * sig))
    p_s = (1 - pb) * core + pb * np.clip(core - tail, 0.0, 1.0)
    return np.where(truth[:, 0] > 0, p * p_s, 0.0)


def _best_admissible_per_gpu(class_rows: list[dict[str, Any]], slo: dict[str, float]) -> float:
    """Best SLO-admissible served rate per GPU over the grid, on the truth and as measured."""
    best_i = 0.0
    for r in class_rows:
        for pre in ("", "true_"):
            ok = r[pre + "success_rate"] >= slo["success_min"] and r[pre + "ttft_p99_s"] <= slo["ttft_p99_s"]
            ok = ok and r[pre + "completion_p99_s"] <= slo.get("completion_p99_s", np.inf)
            if ok and r[pre + "throughput_rps"] > 0:
                best_i = max(best_i, r[pre + "throughput_rps"] / r["tp"])
    return best_i


def _set_demands(
    rng: np.random.Generator, spec: SyntheticSpec, workloads: list[dict[str, Any]], best: list[float]
) -> None:
    """Each class's demand (and the critical floor), in place."""
    share = rng.dirichlet(np.full(spec.n_classes, 3.0))
    for i, w in enumerate(workloads):
        # Demand = pressure × the share of G GPUs at the class's best admissible rate.
        w["demand_rps"] = round(float(max(spec.pressure * spec.gpus * share[i] * best[i], 0.05)), 3)
    if spec.critical == "feasible":
        workloads[0]["critical"] = True
        workloads[0]["floor"] = 0.5
    elif spec.critical == "infeasible":
        workloads[0]["critical"] = True
        workloads[0]["floor"] = 1.0
        # More than the whole fleet can serve within SLO, even at the best cell.
        workloads[0]["demand_rps"] = round(float(1.3 * spec.gpus * max(best[0], 0.05) + 0.1), 3)


def _closed_n(ladder: np.ndarray, p: dict[str, Any]) -> list[int]:
    """Closed-loop labels ``(n_ladder,)``: requests in flight that offer each rate
    at the light-load completion time (strictly increasing, so labels are unique)."""
    out: list[int] = []
    for rate in ladder:
        n = max(1, int(round(float(rate) * p["comp0"])))
        out.append(max(n, out[-1] + 1) if out else n)
    return out


def truth_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its noise-free ``true_*`` columns as the metrics (a copy; unchanged if there are none)."""
    out = table.copy()
    if all(c in out.columns for c in TRUE_COLUMNS):
        for m in METRICS:
            out[m] = out[f"true_{m}"]
    return out


def toml_value(v: Any) -> str:
    """One TOML value: a bool, integer, float, string, or an inline table of them."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def campaign_toml(campaign: dict[str, Any]) -> str:
    """TOML text of a campaign mapping (top-level scalars, tables, and ``[[workloads]]``)."""
    lines: list[str] = []
    for k, v in campaign.items():
        if not isinstance(v, (dict, list)):
            lines.append(f"{k} = {toml_value(v)}")
    for k, v in campaign.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]", *(f"{kk} = {toml_value(x)}" for kk, x in v.items())]
    for k, v in campaign.items():
        if isinstance(v, list):
            for item in v:
                lines += ["", f"[[{k}]]", *(f"{kk} = {toml_value(x)}" for kk, x in item.items())]
    return "\n".join(lines) + "\n"


def write_synthetic(directory: str | Path, table: pd.DataFrame, campaign: dict[str, Any]) -> Campaign:
    """Write ``grid.csv`` and ``campaign.toml`` into ``directory`` and return the parsed campaign."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table_name = str(campaign["measurement"]["table"])
    table.to_csv(directory / table_name, index=False)
    path = directory / "campaign.toml"
    text = campaign_toml(campaign)
    path.write_text(text, encoding="utf-8")
    import tomllib

    return parse_campaign(tomllib.loads(text), path)
