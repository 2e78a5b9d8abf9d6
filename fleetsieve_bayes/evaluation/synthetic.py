"""Synthetic ground-truth fleets for the profiling-cost benchmark suite.

A synthetic fleet is a fully measured table in the docs/contracts.md schema plus a
campaign (budget, demands, SLOs) over it. The ground truth comes from a
plausible serving curve, deliberately *not* the model's own parametric form
(so the benchmark does not test the model against itself):

- per-GPU capacity is concave in ``u = log2(TP)`` with a knee ``m`` placed
  inside the TP range or at either edge:
  ``c(u) = peak · max(floor, 1 − b·|u − m|^1.5)``; a replica serves ``TP·c(u)``;
- served throughput is the smooth minimum ``(offered^-k + cap^-k)^(-1/k)``;
- tails rise with utilisation ``ρ = offered / cap`` and blow up near
  saturation: ``L = base · TP-slope · (1 + A·g(ρ))`` with
  ``g(ρ) = ρ / (s·log(1 + e^{(1−ρ)/s}))`` (≈ ρ/(1−ρ) below saturation, huge
  past it, capped);
- success falls near saturation (softplus in ρ − 1);
- measurements carry multiplicative log-normal noise (tails ``σ``, throughput
  ``σ/3``, the failure rate ``1 − success`` ``σ``).

The returned table holds the *noisy* metrics in the docs/contracts.md columns (what
the replay backend reveals) and the noise-free truth in ``true_<metric>``
columns; :func:`truth_table` swaps them in. ``read_table`` ignores the extra
columns, so the written CSV is a valid replay table.

Load ladders: each class has a geometric ladder of offered rates labelled
``C0, C1, …``; each TP gets the ladder points between 0.45× and 1.25× its replica
capacity (at most ``n_loads`` of them, spread evenly), so one label always
means one offered rate, as the grid requires.
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
    "write_synthetic",
    "TRUE_COLUMNS",
    "CLASS_NAMES",
]

CLASS_NAMES: tuple[str, ...] = ("chat", "code", "rank", "batch")
TRUE_COLUMNS: tuple[str, ...] = tuple(f"true_{m}" for m in METRICS)
KNEES: tuple[str, ...] = ("interior", "low", "high")
CRITICAL: tuple[str, ...] = ("none", "feasible", "infeasible")

_SAT_SHARPNESS = 8.0  # k of the smooth minimum
_G_SOFT = 0.05  # s of the congestion term g(ρ)
_G_MAX = 400.0  # cap of g(ρ): a finite measurement window bounds the queue


class SyntheticSpec(NamedTuple):
    """What to generate. Per-class tuples have length ``n_classes``.

    Attributes:
        tps: TP degrees, a subset of {1, 2, 4, 8} with at least two.
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


def random_spec(rng: np.random.Generator) -> SyntheticSpec:
    """Draw one spec for the benchmark suite: 2–4 classes, TP sets within {1,2,4,8}, mixed knees, budgets, pressure, noise, critical demands."""
    n_classes = int(rng.choice([2, 2, 3, 3, 4]))
    tp_sets = [(2, 4, 8), (2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (2, 4), (4, 8), (1, 2, 4, 8)]
    tps = tp_sets[int(rng.integers(len(tp_sets)))]
    knees = tuple(str(rng.choice(KNEES, p=[0.5, 0.25, 0.25])) for _ in range(n_classes))
    # Room for every class to get a replica at the largest TP now and then.
    gpus = int(rng.choice([g for g in (8, 16, 32) if g >= max(tps) * max(1.0, n_classes / 2)]))
    pressure = float(rng.choice([0.6, 1.0, 1.0, 1.3]))
    noise = float(rng.choice([0.0, 0.02, 0.05]))
    critical = str(rng.choice(CRITICAL, p=[0.6, 0.25, 0.15]))
    n_loads = int(rng.choice([3, 4]))
    return SyntheticSpec(n_classes, tps, knees, gpus, pressure, noise, critical, n_loads)


def _g(rho: np.ndarray) -> np.ndarray:
    """Congestion term ``(…,)``: ≈ ρ/(1−ρ) below saturation, large past it, capped."""
    soft = _G_SOFT * np.logaddexp(0.0, (1.0 - rho) / _G_SOFT)
    return np.minimum(rho / soft, _G_MAX)


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
    rng: np.random.Generator, tps: np.ndarray, knee_kind: str
) -> dict[str, Any]:
    """Ground-truth parameters of one class; ``tps`` is ``(n_tp,)``."""
    u = np.log2(tps.astype(float))
    return {
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
    }


def _capacity(p: dict[str, Any], tp: np.ndarray) -> np.ndarray:
    """Replica capacity (req/s) ``(n,)`` of TPs ``tp (n,)``."""
    u = np.log2(tp.astype(float))
    per_gpu = p["peak"] * np.maximum(0.15, 1.0 - p["bend"] * np.abs(u - p["knee"]) ** 1.5)
    return tp * per_gpu


def _metrics(p: dict[str, Any], tp: np.ndarray, offered: np.ndarray) -> np.ndarray:
    """Noise-free metrics ``(n, 4)`` (METRICS order) of cells ``tp, offered (n,)``."""
    cap = _capacity(p, tp)
    k = _SAT_SHARPNESS
    thr = (offered**-k + cap**-k) ** (-1.0 / k)
    rho = offered / cap
    g = _g(rho)
    ttft = p["ttft0"] * (4.0 / tp) ** p["ttft_slope"] * (1.0 + p["ttft_amp"] * g)
    comp = p["comp0"] * (4.0 / tp) ** p["comp_slope"] * (1.0 + p["comp_amp"] * g)
    fail = 0.001 + p["success_drop"] * 0.08 * np.logaddexp(0.0, (rho - 1.05) / 0.08)
    succ = np.clip(1.0 - fail, 0.0, 1.0)
    return np.stack([thr, ttft, comp, succ], axis=-1)


def _ladder_loads(
    rng: np.random.Generator, caps: np.ndarray, n_loads: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A class's geometric ladder and, per TP, the ladder indices it is measured at.

    Args:
        caps: ``(n_tp,)`` replica capacities.

    Returns:
        ``ladder (n_ladder,)`` offered rates and one index array per TP.
    """
    ratio = 1.3
    start = 0.45 * float(caps.min()) * ratio ** float(rng.uniform(-1.0, 0.0))
    n_ladder = int(math.ceil(math.log(1.3 * float(caps.max()) / start) / math.log(ratio))) + 1
    ladder = start * ratio ** np.arange(n_ladder)
    picks = []
    for cap in caps:
        idx = np.flatnonzero((ladder >= 0.45 * cap) & (ladder <= 1.25 * cap))
        if len(idx) > n_loads:
            idx = idx[np.round(np.linspace(0, len(idx) - 1, n_loads)).astype(int)]
        picks.append(idx)
    return ladder, picks


def synthetic_fleet(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Generate one ground-truth table and a campaign over it.

    Returns:
        ``(table, campaign)``: ``table`` has the docs/contracts.md columns with noisy
        metrics plus ``true_*`` noise-free columns and ``calibration``;
        ``campaign`` is the campaign mapping (as ``tomllib`` would parse it)
        with ``[measurement] table = "grid.csv"``; write both with
        :func:`write_synthetic`.
    """
    if len(spec.knees) != spec.n_classes:
        raise ValueError(f"spec.knees has {len(spec.knees)} entries for {spec.n_classes} classes")
    if not 1 <= spec.n_classes <= len(CLASS_NAMES):
        raise ValueError(f"n_classes must be 1..{len(CLASS_NAMES)}")
    tps = np.array(sorted(set(spec.tps)), dtype=np.int64)
    if len(tps) < 2 or not set(tps.tolist()) <= {1, 2, 4, 8}:
        raise ValueError(f"tps must be at least two of 1, 2, 4, 8; got {spec.tps}")
    rows: list[dict[str, Any]] = []
    workloads: list[dict[str, Any]] = []
    best: list[float] = []
    for i in range(spec.n_classes):
        name = CLASS_NAMES[i]
        p = _class_curve(rng, tps, spec.knees[i])
        caps = _capacity(p, tps)
        ladder, picks = _ladder_loads(rng, caps, spec.n_loads)
        # SLO: the tail limit binds at utilisation u* of the knee-nearest TP, so
        # smaller TPs (slower prefill) may pass only at lighter load.
        ref = int(np.argmin(np.abs(np.log2(tps) - np.clip(p["knee"], np.log2(tps[0]), np.log2(tps[-1])))))
        u_star = float(rng.uniform(0.75, 0.97))
        ref_m = _metrics(p, tps[ref : ref + 1], np.array([u_star * caps[ref]]))[0]
        slo: dict[str, float] = {"success_min": float(rng.choice([0.98, 0.99]))}
        slo["ttft_p99_s"] = round(float(ref_m[1]), 3)
        if rng.random() < 0.6:
            u_c = float(rng.uniform(0.75, 0.97))
            slo["completion_p99_s"] = round(
                float(_metrics(p, tps[ref : ref + 1], np.array([u_c * caps[ref]]))[0, 2]), 2
            )
        best_i = 0.0  # best SLO-admissible served rate per GPU over the grid (truth)
        for t_i, tp in enumerate(tps):
            idx = picks[t_i]
            # Round the offered rate as the table stores it first, so the
            # true served rate never exceeds the offered rate in the file.
            offered = np.round(ladder[idx], 4)
            truth = _metrics(p, np.full(offered.shape, tp), offered)
            z = rng.standard_normal(truth.shape)
            s = spec.noise
            noisy = truth.copy()
            noisy[:, 0] = np.minimum(truth[:, 0] * np.exp(s / 3 * z[:, 0]), offered)
            noisy[:, 1] = truth[:, 1] * np.exp(s * z[:, 1])
            noisy[:, 2] = truth[:, 2] * np.exp(s * z[:, 2])
            noisy[:, 3] = np.clip(1.0 - (1.0 - truth[:, 3]) * np.exp(s * z[:, 3]), 0.0, 1.0)
            for j, k in enumerate(idx):
                row: dict[str, Any] = {
                    "workload": name,
                    "tp": int(tp),
                    "load": f"C{int(k)}",
                    "offered_rps": round(float(offered[j]), 4),
                }
                for m_i, m in enumerate(METRICS):
                    row[m] = round(float(noisy[j, m_i]), 5)
                row["duration_s"] = float(spec.duration_s)
                row["calibration"] = False
                for m_i, m in enumerate(METRICS):
                    row[f"true_{m}"] = float(truth[j, m_i])
                rows.append(row)
            ok = (truth[:, 3] >= slo["success_min"]) & (truth[:, 1] <= slo["ttft_p99_s"])
            ok &= truth[:, 2] <= slo.get("completion_p99_s", np.inf)
            best_i = max(best_i, float(truth[ok, 0].max() / tp) if ok.any() else 0.0)
        best.append(best_i)
        workloads.append({"name": name, "slo": slo})

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

    table = pd.DataFrame(rows, columns=[*COLUMNS, "calibration", *TRUE_COLUMNS])
    campaign = {
        "name": "synthetic",
        "fleet": {"gpus": int(spec.gpus)},
        "model": {"family": "generic"},
        "measurement": {"backend": "replay", "table": "grid.csv"},
        "stopping": {"epsilon": 0.05, "credible_level": 0.9},
        "workloads": workloads,
    }
    return table, campaign


def truth_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its noise-free ``true_*`` columns as the metrics (a copy; unchanged if there are none)."""
    out = table.copy()
    if all(c in out.columns for c in TRUE_COLUMNS):
        for m in METRICS:
            out[m] = out[f"true_{m}"]
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def campaign_toml(campaign: dict[str, Any]) -> str:
    """TOML text of a campaign mapping (top-level scalars, tables, and ``[[workloads]]``)."""
    lines: list[str] = []
    for k, v in campaign.items():
        if not isinstance(v, (dict, list)):
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in campaign.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]", *(f"{kk} = {_toml_value(x)}" for kk, x in v.items())]
    for k, v in campaign.items():
        if isinstance(v, list):
            for item in v:
                lines += ["", f"[[{k}]]", *(f"{kk} = {_toml_value(x)}" for kk, x in item.items())]
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
