"""Figures that explain a campaign's decision (matplotlib, Agg backend).

Every ``plot_*`` function returns a :class:`Plotted`: the figure *and* the
data it drew as DataFrames, so tests (and users) can check that a figure shows
exactly what the campaign files say. Inputs are the campaign-directory files
as DataFrames (``bounds.csv``, ``measurements.csv``), the journal's round
records, and per-class SLOs as ``{workload: {success_min, ttft_p99_s,
completion_p99_s}}`` (a missing or ``None`` tail limit is not checked; an empty
mapping means "SLOs unknown": every cell counts as feasible and no SLO line is
drawn).

Capacity of a cell, per GPU = ``throughput_rps / tp`` (served req/s of one
replica at that load, divided by the GPUs it uses). A class's per-GPU capacity
curve against TP is the max over the loads whose cells are SLO-feasible:
conservatively (lower throughput bound over cells feasible on their pessimistic
bounds) and optimistically (upper bound over cells feasible on their
optimistic bounds) — the band between the two is what is still unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from fleetsieve_bayes.allocation.problem import meets_slo  # noqa: E402
from fleetsieve_bayes.decision.intervals import bound_tables  # noqa: E402
from fleetsieve_bayes.table import BOUNDS_COLUMNS  # noqa: E402

__all__ = [
    "Plotted",
    "BOUNDS_COLUMNS",
    "load_order",
    "slo_feasible",
    "capacity_curves",
    "plot_capacity",
    "plot_tails",
    "plot_gap",
    "plot_allocations",
    "select_diagnostic_vars",
    "diagnostics_summary",
    "plot_diagnostics",
    "knee_quantiles",
]

# Tail metrics: (measurement-table column, bounds prefix, SLO key, axis label).
_TAILS = (
    ("ttft_p99_s", "ttft_p99", "ttft_p99_s", "TTFT p99 (s)"),
    ("completion_p99_s", "completion_p99", "completion_p99_s", "completion p99 (s)"),
)
# Posterior sites never worth a trace/rank plot (per-cell, many elements).
_SKIP_VARS = {"latent", "capacity", "y"}
# Class-level and global parameters of model.py, in the order worth showing first.
_PREFERRED_VARS = (
    "knee",
    "curvature",
    "cap_level",
    "sharpness",
    "exponent",
    "tail_slope",
    "noise",
    "succ_base",
    "succ_drop",
    "tail_base",
    "tail_blowup",
    "tail_elasticity",
)


class Plotted(NamedTuple):
    """A figure and the data drawn on it (one DataFrame per layer)."""

    figure: Figure
    data: dict[str, pd.DataFrame]


def load_order(labels: Sequence[str]) -> list[str]:
    """Load labels in natural order ("C8" < "C16" < "C128"), unique."""

    def key(s: str) -> tuple[Any, ...]:
        return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))

    return sorted(dict.fromkeys(str(x) for x in labels), key=key)


def _limit(slo: Mapping[str, Any] | None, key: str) -> float:
    if not slo or slo.get(key) is None:
        return math.inf
    return float(slo[key])


def slo_feasible(
    workload: pd.Series, thr: pd.Series, ttft: pd.Series, comp: pd.Series, succ: pd.Series, slos: Mapping[str, Mapping[str, Any]]
) -> np.ndarray:
    """Which cells meet their class's SLO on the given values; every Series is ``(n,)``.

    Returns:
        bool ``(n,)``; a class without a known SLO only needs throughput > 0.
    """
    w = workload.astype(str).to_numpy()
    smin = np.array([float((slos.get(x) or {}).get("success_min") or 0.0) for x in w])
    tmax = np.array([_limit(slos.get(x), "ttft_p99_s") for x in w])
    cmax = np.array([_limit(slos.get(x), "completion_p99_s") for x in w])
    values = np.stack([x.to_numpy(float) for x in (thr, ttft, comp, succ)], axis=-1)
    return meets_slo(values, smin, tmax, cmax)


def capacity_curves(bounds: pd.DataFrame, slos: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Per-class per-GPU capacity against TP, from ``bounds.csv``.

    Returns:
        One row per (workload, tp): ``lo``/``hi`` (per-GPU req/s, NaN where no
        load is feasible), ``lo_load``/``hi_load`` (the load attaining it) and
        ``any_slo`` (the max of ``throughput_hi / tp`` over all loads, SLO
        ignored: what a capacity-only rule would read).
    """
    b = bounds.copy()
    cols = ("throughput", "ttft_p99", "completion_p99", "success")
    cons, opt = bound_tables(*(b[[f"{c}_{end}" for c in cols]].to_numpy(float) for end in ("lo", "hi")))
    for name, table in (("cons_ok", cons), ("opt_ok", opt)):
        b[name] = slo_feasible(b["workload"], *(pd.Series(table[:, k]) for k in range(4)), slos)
    b["lo_pg"] = b["throughput_lo"] / b["tp"]
    b["hi_pg"] = b["throughput_hi"] / b["tp"]
    rows = []
    for (w, tp), g in b.groupby(["workload", "tp"], sort=False):
        cons = g[g["cons_ok"]]
        opt = g[g["opt_ok"]]
        lo_i = cons["lo_pg"].idxmax() if len(cons) else None
        hi_i = opt["hi_pg"].idxmax() if len(opt) else None
        rows.append(
            {
                "workload": w,
                "tp": int(tp),
                "lo": float(b.at[lo_i, "lo_pg"]) if lo_i is not None else math.nan,
                "lo_load": b.at[lo_i, "load"] if lo_i is not None else None,
                "hi": float(b.at[hi_i, "hi_pg"]) if hi_i is not None else math.nan,
                "hi_load": b.at[hi_i, "load"] if hi_i is not None else None,
                "any_slo": float(g["hi_pg"].max()),
            }
        )
    out = pd.DataFrame(rows, columns=["workload", "tp", "lo", "lo_load", "hi", "hi_load", "any_slo"])
    return out.sort_values(["workload", "tp"], kind="stable").reset_index(drop=True)


def knee_quantiles(idata: Any, workloads: Sequence[str], q: tuple[float, float, float] = (0.05, 0.5, 0.95)) -> pd.DataFrame | None:
    """Posterior knee of each class in TP units (the model's ``knee`` site is log2 TP).

    Returns:
        ``workload, q_lo, q_mid, q_hi`` (TP), or ``None`` when the posterior has
        no ``knee`` site with one entry per class.
    """
    post = getattr(idata, "posterior", None)
    if post is None or "knee" not in post:
        return None
    arr = np.asarray(post["knee"].values, dtype=float)
    if arr.ndim != 3 or arr.shape[-1] != len(workloads):
        return None
    flat = arr.reshape(-1, arr.shape[-1])
    qs = np.quantile(flat, q, axis=0)
    return pd.DataFrame(
        {"workload": list(workloads), "q_lo": 2.0 ** qs[0], "q_mid": 2.0 ** qs[1], "q_hi": 2.0 ** qs[2]}
    )


def _tp_axis(ax: Any, tps: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(tps))
    ax.set_xticklabels([f"TP{t}" for t in tps])
    ax.minorticks_off()


def plot_capacity(
    bounds: pd.DataFrame,
    measurements: pd.DataFrame | None,
    slos: Mapping[str, Mapping[str, Any]],
    *,
    knee: pd.DataFrame | None = None,
    workloads: Sequence[str] | None = None,
    chosen: Mapping[str, Mapping[str, Any]] | None = None,
) -> Plotted:
    """Per-GPU capacity against TP, one panel per class.

    ``chosen`` (an allocation ``{workload: {tp, load, replicas}}``) marks each
    class's chosen cell with a star (its measured value, else its conservative
    bound).

    Draws the credible band (conservative–optimistic SLO-feasible max over
    loads), the SLO-ignoring max (dotted), the measured cells (filled: within
    SLO; ``x``: SLO violated) and the knee (the TP of the band's peak; the
    posterior knee's 90 % interval when ``knee`` is given).

    Returns:
        data ``curves`` (:func:`capacity_curves`), ``measured`` (workload, tp,
        load, per_gpu_rps, slo_ok), ``knee`` (workload, tp) and ``chosen``
        (workload, tp, load, per_gpu_rps).
    """
    curves = capacity_curves(bounds, slos)
    names = list(workloads) if workloads else list(dict.fromkeys(bounds["workload"]))
    meas = _measured_points(measurements, slos)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.0), squeeze=False, layout="constrained")
    knees = []
    for ax, w in zip(axes[0], names, strict=True):
        c = curves[curves["workload"] == w]
        tps = c["tp"].to_numpy()
        ax.fill_between(tps, c["lo"], c["hi"], color="tab:blue", alpha=0.25, label="credible band (SLO-feasible)")
        ax.plot(tps, c["lo"], "-", color="tab:blue", lw=1.2, label="conservative")
        ax.plot(tps, c["hi"], "--", color="tab:blue", lw=1.2, label="optimistic")
        ax.plot(tps, c["any_slo"], ":", color="grey", lw=1.2, label="max ignoring SLO")
        m = meas[meas["workload"] == w]
        ok, bad = m[m["slo_ok"]], m[~m["slo_ok"]]
        ax.scatter(ok["tp"], ok["per_gpu_rps"], color="black", zorder=3, s=28, label="measured, within SLO")
        ax.scatter(bad["tp"], bad["per_gpu_rps"], color="tab:red", marker="x", zorder=3, s=32, label="measured, violates SLO")
        mid = (c["lo"].to_numpy() + c["hi"].to_numpy()) / 2
        if np.isfinite(mid).any():
            k_tp = int(tps[int(np.nanargmax(mid))])
            knees.append({"workload": w, "tp": k_tp})
            ax.axvline(k_tp, color="tab:orange", lw=1.5, label="knee (peak of the band)")
        if knee is not None and (knee["workload"] == w).any():
            k = knee[knee["workload"] == w].iloc[0]
            ax.axvspan(k["q_lo"], k["q_hi"], color="tab:orange", alpha=0.12, label="posterior knee, 90 % CI")
        _tp_axis(ax, sorted(set(int(t) for t in tps)))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{w}: per-GPU capacity vs TP" + (f" (knee TP{knees[-1]['tp']})" if knees and knees[-1]["workload"] == w else ""))
        ax.set_xlabel("tensor-parallel degree")
        ax.set_ylabel("capacity per GPU (req/s / GPU)")
        ax.grid(alpha=0.3)
    chosen_rows = []
    for ax, w in zip(axes[0], names, strict=True):
        a = (chosen or {}).get(w) or {}
        if not a.get("replicas"):
            continue
        tp, load = int(a["tp"]), str(a["load"])
        hit = meas[(meas["workload"] == w) & (meas["tp"] == tp) & (meas["load"] == load)]
        if len(hit):
            y = float(hit["per_gpu_rps"].iloc[0])
        else:
            b = bounds[(bounds["workload"] == w) & (bounds["tp"] == tp) & (bounds["load"] == load)]
            if b.empty:
                continue
            y = float(b["throughput_lo"].iloc[0]) / tp
        chosen_rows.append({"workload": w, "tp": tp, "load": load, "per_gpu_rps": y})
        ax.scatter([tp], [y], marker="*", s=260, color="gold", edgecolor="black", zorder=4, label="chosen cell")
        ax.annotate(f"TP{tp}@{load} ×{a['replicas']}", (tp, y), textcoords="offset points", xytext=(8, -14), fontsize=8)
    _shared_legend(fig, axes.ravel(), ncol=min(5, 2 * len(names)))  # narrow figures: fewer columns
    return Plotted(
        fig,
        {
            "curves": curves,
            "measured": meas,
            "knee": pd.DataFrame(knees, columns=["workload", "tp"]),
            "chosen": pd.DataFrame(chosen_rows, columns=["workload", "tp", "load", "per_gpu_rps"]),
        },
    )


def _measured_points(measurements: pd.DataFrame | None, slos: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    cols = ["workload", "tp", "load", "per_gpu_rps", "slo_ok"]
    if measurements is None or measurements.empty:
        return pd.DataFrame(columns=cols).astype({"slo_ok": bool})
    m = measurements
    ok = slo_feasible(m["workload"], m["throughput_rps"], m["ttft_p99_s"], m["completion_p99_s"], m["success_rate"], slos)
    return pd.DataFrame(
        {
            "workload": m["workload"].astype(str).to_numpy(),
            "tp": m["tp"].astype(int).to_numpy(),
            "load": m["load"].astype(str).to_numpy(),
            "per_gpu_rps": (m["throughput_rps"] / m["tp"]).to_numpy(float),
            "slo_ok": ok,
        }
    )


def plot_tails(
    bounds: pd.DataFrame,
    measurements: pd.DataFrame | None,
    slos: Mapping[str, Mapping[str, Any]],
    *,
    workloads: Sequence[str] | None = None,
) -> Plotted:
    """Tails and success against load: one row per class, columns TTFT p99, completion p99, success.

    Each TP is one colour: its credible band (lo–hi) and its measured points;
    the SLO limit is a red dashed line. Tails are on a log scale; an infinite
    measured tail (no request completed) is drawn as a ``^`` at the top.

    Returns:
        data ``measured`` (workload, tp, load, metric, value — the
        measurement-table values drawn) and ``bands`` (workload, tp, load,
        metric, lo, hi).
    """
    names = list(workloads) if workloads else list(dict.fromkeys(bounds["workload"]))
    metrics = [
        (col, prefix, key, label) for col, prefix, key, label in _TAILS
    ] + [("success_rate", "success", "success_min", "success rate")]
    fig, axes = plt.subplots(len(names), 3, figsize=(15, 3.6 * len(names)), squeeze=False, layout="constrained")
    tp_values = sorted(set(int(t) for t in bounds["tp"]))
    colors = {tp: plt.get_cmap("tab10")(i % 10) for i, tp in enumerate(tp_values)}
    meas_rows: list[dict[str, Any]] = []
    band_rows: list[dict[str, Any]] = []
    for r, w in enumerate(names):
        bw = bounds[bounds["workload"] == w]
        order = load_order(bw["load"])
        xpos = {lab: i for i, lab in enumerate(order)}
        mw = measurements[measurements["workload"].astype(str) == w] if measurements is not None and not measurements.empty else None
        for k, (col, prefix, key, label) in enumerate(metrics):
            ax = axes[r][k]
            finite_max = 0.0
            for tp in tp_values:
                g = bw[bw["tp"] == tp].copy()
                if g.empty:
                    continue
                g["x"] = g["load"].map(xpos)
                g = g.sort_values("x")
                lo = g[f"{prefix}_lo"].to_numpy(float)
                hi = g[f"{prefix}_hi"].to_numpy(float)
                for lab, a, b in zip(g["load"], lo, hi, strict=True):
                    band_rows.append({"workload": w, "tp": tp, "load": lab, "metric": col, "lo": a, "hi": b})
                fin = np.isfinite(hi)
                if fin.any():
                    finite_max = max(finite_max, float(np.nanmax(hi[fin])))
                hi_plot = np.where(np.isfinite(hi), hi, np.nan)
                ax.fill_between(g["x"], lo, hi_plot, color=colors[tp], alpha=0.2)
                ax.plot(g["x"], lo, "-", color=colors[tp], lw=0.8, alpha=0.7)
                ax.plot(g["x"], hi_plot, "-", color=colors[tp], lw=0.8, alpha=0.7, label=f"TP{tp} band")
            if mw is not None:
                for tp in tp_values:
                    p = mw[mw["tp"].astype(int) == tp]
                    if p.empty:
                        continue
                    xs = p["load"].astype(str).map(xpos).to_numpy(float)
                    vals = p[col].to_numpy(float)
                    for lab, v in zip(p["load"].astype(str), vals, strict=True):
                        meas_rows.append({"workload": w, "tp": tp, "load": lab, "metric": col, "value": v})
                    fin = np.isfinite(vals)
                    if fin.any():
                        finite_max = max(finite_max, float(vals[fin].max()))
                    ax.scatter(xs[fin], vals[fin], color=colors[tp], edgecolor="black", zorder=3, s=30, label=f"TP{tp} measured")
                    if (~fin).any():
                        top = max(finite_max, 1.0) * 1.5
                        ax.scatter(xs[~fin], np.full((~fin).sum(), top), color=colors[tp], marker="^", zorder=3, s=36)
            limit = (slos.get(w) or {}).get(key)
            if limit is not None:
                ax.axhline(float(limit), color="tab:red", ls="--", lw=1.3, label=f"SLO {'≥' if key == 'success_min' else '≤'} {float(limit):g}")
            if col != "success_rate":
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(_plain)
                ax.yaxis.set_minor_formatter(_plain_minor)
            if col != "success_rate":
                lo_y, hi_y = ax.get_ylim()
                if lo_y > 0 and math.log10(hi_y / lo_y) > 2.0:
                    ax.yaxis.set_minor_formatter(NullFormatter())  # many decades: label powers of ten only
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels(order)
            ax.set_xlabel("load setting (concurrency)")
            ax.set_ylabel(label)
            ax.set_title(f"{w}: {label} vs load")
            ax.grid(alpha=0.3)
    _shared_legend(fig, axes.ravel(), ncol=2 * len(tp_values) + 1, slo_label="SLO limit")
    measured = pd.DataFrame(meas_rows, columns=["workload", "tp", "load", "metric", "value"])
    bands = pd.DataFrame(band_rows, columns=["workload", "tp", "load", "metric", "lo", "hi"])
    return Plotted(fig, {"measured": measured, "bands": bands})


def _plain_fmt(v: float, _pos: Any = None) -> str:
    return f"{v:g}"


def _plain_minor_fmt(v: float, _pos: Any = None) -> str:
    # Label only 2× and 5× minor ticks on a log axis, so labels never collide.
    m = v / 10 ** math.floor(math.log10(v)) if v > 0 else 0
    return f"{v:g}" if round(m, 6) in (2.0, 5.0) else ""


_plain = FuncFormatter(_plain_fmt)
_plain_minor = FuncFormatter(_plain_minor_fmt)


def _shared_legend(fig: Figure, axes: Any, *, ncol: int, slo_label: str | None = None) -> None:
    """One legend for all panels, below them (never on top of the data); SLO entries merged."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if slo_label is not None and lab.startswith("SLO"):
                lab = slo_label
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=min(ncol, len(seen)), fontsize=8, frameon=False)


def plot_gap(rounds: Sequence[Any], epsilon: float | None, status: str | None = None) -> Plotted:
    """The stage-wise gap against cumulative GPU-seconds, one point per round.

    The certificate point (the last round, labelled with its certificate or
    the final ``status``) is a star; ε is the dashed line.

    Returns:
        data ``rounds`` (round, gpu_seconds, critical, min_fulfillment,
        goodput, certificate) and ``certificate`` (the starred round).
    """
    from fleetsieve_bayes.campaign.journal import rounds_of

    df = pd.DataFrame(
        [
            {
                "round": r.round,
                "gpu_seconds": r.gpu_seconds,
                "critical": r.gap.get("critical", math.nan),
                "min_fulfillment": r.gap.get("min_fulfillment", math.nan),
                "goodput": r.gap.get("goodput", math.nan),
                "certificate": r.certificate,
            }
            for r in rounds_of(rounds)
        ],
        columns=["round", "gpu_seconds", "critical", "min_fulfillment", "goodput", "certificate"],
    )
    fig, ax = plt.subplots(figsize=(9, 4.0), layout="constrained")
    styles = {"min_fulfillment": ("tab:blue", "o", "min-fulfillment gap"), "goodput": ("tab:green", "s", "goodput gap (/ total demand)"), "critical": ("tab:red", "v", "critical-floor gap (0/1)")}
    for col, (color, marker, label) in styles.items():
        ax.plot(df["gpu_seconds"], df[col], marker=marker, color=color, lw=1.3, ms=4, label=label)
    if epsilon is not None:
        ax.axhline(epsilon, color="black", ls="--", lw=1, label=f"ε = {epsilon:g}")
    cert = df.tail(1)
    if len(cert):
        last = cert.iloc[0]
        y = max(last["min_fulfillment"], last["goodput"])
        label = status or last["certificate"]
        ax.scatter([last["gpu_seconds"]], [y], marker="*", s=260, color="gold", edgecolor="black", zorder=4, label=f"certificate: {label}")
        ax.annotate(f"round {int(last['round'])}: {label}", (last["gpu_seconds"], y), textcoords="offset points", xytext=(-10, 14), ha="right", fontsize=9)
    ax.set_xlabel("GPU-seconds spent profiling (cumulative)")
    ax.set_ylabel("conservative–optimistic gap")
    ax.set_title("Allocation gap against profiling cost")
    ax.set_ylim(bottom=-0.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return Plotted(fig, {"rounds": df, "certificate": cert.reset_index(drop=True)})


def plot_allocations(allocations: Mapping[str, Mapping[str, Any] | None], workloads: Sequence[str], gpus: int | None = None) -> Plotted:
    """GPUs given to each class by each allocation, as stacked horizontal bars.

    Args:
        allocations: ``{label: {workload: {tp, load, replicas}} | None}``, e.g.
            conservative, optimistic and final; ``None`` = infeasible.

    Returns:
        data ``allocations`` (allocation, workload, tp, load, replicas, gpus).
    """
    rows = []
    for label, alloc in allocations.items():
        for w in workloads:
            a = (alloc or {}).get(w) or {}
            reps = int(a.get("replicas") or 0)
            tp = a.get("tp")
            rows.append({"allocation": label, "workload": w, "tp": tp, "load": a.get("load"), "replicas": reps, "gpus": reps * int(tp or 0)})
    df = pd.DataFrame(rows, columns=["allocation", "workload", "tp", "load", "replicas", "gpus"])
    labels = list(allocations)
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * max(1, len(labels))), layout="constrained")
    colors = {w: plt.get_cmap("tab10")(i % 10) for i, w in enumerate(workloads)}
    for y, label in enumerate(labels):
        left = 0
        if allocations[label] is None:
            ax.text(0.2, y, "infeasible", va="center", color="tab:red")
            continue
        for _, r in df[df["allocation"] == label].iterrows():
            if r["gpus"] <= 0:
                continue
            ax.barh(y, r["gpus"], left=left, color=colors[r["workload"]], edgecolor="white", label=r["workload"] if y == 0 else None)
            ax.text(left + r["gpus"] / 2, y, f"{r['workload']}\nTP{r['tp']}@{r['load']} ×{r['replicas']}", ha="center", va="center", fontsize=8)
            left += r["gpus"]
    if gpus is not None:
        ax.axvline(gpus, color="black", ls="--", lw=1, label=f"budget {gpus} GPUs")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("GPUs")
    ax.set_title("Allocations: GPUs per class")
    handles, names = ax.get_legend_handles_labels()
    if handles:  # outside the axes: bars fill the plot up to the budget
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return Plotted(fig, {"allocations": df})


def select_diagnostic_vars(idata: Any, max_panels: int = 8) -> list[str]:
    """Low-dimensional posterior variables worth a rank/trace plot (≤ ``max_panels`` panels)."""
    post = idata.posterior
    sizes = {str(v): int(np.prod([n for d, n in post[v].sizes.items() if d not in ("chain", "draw")] or [1])) for v in post.data_vars}
    names = [v for v in sizes if v not in _SKIP_VARS and not v.endswith("_eps")]
    names.sort(key=lambda v: (next((i for i, p in enumerate(_PREFERRED_VARS) if v == p), len(_PREFERRED_VARS)), sizes[v], v))
    out, panels = [], 0
    for v in names:
        if panels + sizes[v] > max_panels:
            continue
        out.append(v)
        panels += sizes[v]
    return out


def diagnostics_summary(idata: Any, var_names: Sequence[str] | None = None) -> pd.DataFrame:
    """ArviZ ``r_hat``, ``ess_bulk``, ``ess_tail`` (and ``mcse_mean``) of ``var_names`` (default: all)."""
    import warnings

    from fleetsieve_bayes.arviz_import import import_arviz

    az = import_arviz()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one chain: r_hat is NaN, which the table shows
        return az.summary(idata, var_names=list(var_names) if var_names else None, kind="diagnostics")


def plot_diagnostics(idata: Any, var_names: Sequence[str]) -> Plotted:
    """Rank plots (≥ 2 chains) or trace plots (one chain) of ``var_names``.

    Returns:
        data ``variables`` (variable, n_chains, n_draws, kind).
    """
    import warnings

    from fleetsieve_bayes.arviz_import import import_arviz

    az = import_arviz()

    post = idata.posterior
    n_chains, n_draws = int(post.sizes.get("chain", 1)), int(post.sizes.get("draw", 0))
    kind = "rank" if n_chains >= 2 else "trace"
    n_panels = sum(int(np.prod([n for d, n in post[v].sizes.items() if d not in ("chain", "draw")] or [1])) for v in var_names)
    # ArviZ's default size is a full page per row; keep rows short enough to read at a glance.
    figsize = (13, 2.4 * math.ceil(n_panels / 4)) if kind == "rank" else (13, 1.8 * len(var_names))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "rank":
            axes = az.plot_rank(idata, var_names=list(var_names), kind="bars", grid=(math.ceil(n_panels / 4), min(4, n_panels)), figsize=figsize, show=False, backend_kwargs={"layout": "constrained"})
        else:
            axes = az.plot_trace(idata, var_names=list(var_names), figsize=figsize, show=False, backend_kwargs={"layout": "constrained"})
    fig = np.asarray(axes).ravel()[0].figure
    fig.suptitle(f"{'Rank' if kind == 'rank' else 'Trace'} plots ({n_chains} chain{'s' if n_chains != 1 else ''} × {n_draws} draws)")
    data = pd.DataFrame({"variable": list(var_names), "n_chains": n_chains, "n_draws": n_draws, "kind": kind})
    return Plotted(fig, {"variables": data})
