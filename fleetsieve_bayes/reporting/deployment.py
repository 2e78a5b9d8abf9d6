"""The report's deployment sections: a plan's packing and, with a verify report, live windows.

:func:`plot_packing` draws each node's GPUs and the replica on each (in a
catalogued plan each worker, labelled by its configuration and role:
``prefill 0``, ``decode 1``; the decode workers hatched);
:func:`plot_live_windows` draws, per class and tail metric, the plan's
predicted interval, the SLO and the live p99's bucket interval.
:func:`deployment_html` renders both with their tables (used by
:func:`fleetsieve_bayes.reporting.report.build_report` when given a plan).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import pandas as pd

__all__ = ["plot_packing", "plot_live_windows", "deployment_html"]


def plot_packing(plan: dict[str, Any]) -> Any:
    """One row of GPU boxes per node, each replica a coloured block.

    Returns:
        ``Plotted`` with data ``placements`` (workload, index, tp, node, first_gpu, port; in a
        catalogued plan also config and role, ``engine`` for an aggregated replica).
    """
    import matplotlib.pyplot as plt

    from fleetsieve_bayes.reporting.plots import Plotted

    g = int(plan["gpus_per_node"])
    nodes = int(plan["nodes"])
    catalogued = any("config" in p for p in plan["placements"])
    extra = ["config", "role"] if catalogued else []
    df = pd.DataFrame(
        [{"workload": p["workload"], "index": p["index"], "tp": p["tp"], "node": p["node"],
          "first_gpu": p["gpus"][0], "port": p["port"],
          **({"config": p.get("config"), "role": _role_label(p)} if catalogued else {})} for p in plan["placements"]],
        columns=["workload", "index", "tp", "node", "first_gpu", "port", *extra],
    )
    classes = [c["workload"] for c in plan["classes"]]
    colors = {w: plt.get_cmap("tab10")(i % 10) for i, w in enumerate(classes)}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * g + 2), 0.8 + 0.7 * nodes), layout="constrained")
    for n in range(nodes):
        for k in range(g):
            ax.add_patch(plt.Rectangle((k, n - 0.4), 1, 0.8, fill=False, edgecolor="0.8"))
    for _, r in df.iterrows():
        decode = catalogued and str(r["role"]).startswith("decode")
        ax.add_patch(plt.Rectangle((r["first_gpu"] + 0.05, r["node"] - 0.35), r["tp"] - 0.1, 0.7,
                                   color=colors[r["workload"]], alpha=0.85, hatch="//" if decode else None))
        if catalogued:
            role = "" if r["role"] == "engine" else f" {r['role']}"
            label = f"{r['workload']}#{r['index']}{role}\n{r['config']}\nTP{r['tp']} :{r['port']}"
        else:
            label = f"{r['workload']}#{r['index']}\nTP{r['tp']} :{r['port']}"
        ax.text(r["first_gpu"] + r["tp"] / 2, r["node"], label,
                ha="center", va="center", fontsize=8 if not catalogued else 6, color="white")
    ax.set_xlim(0, g)
    ax.set_ylim(nodes - 0.5, -0.5)
    ax.set_yticks(range(nodes))
    ax.set_yticklabels([f"node {n}" for n in range(nodes)])
    ax.set_xticks([k + 0.5 for k in range(g)])
    ax.set_xticklabels([str(k) for k in range(g)])
    ax.set_xlabel("GPU")
    mark = "" if plan["certified"] else " (UNCERTIFIED)"
    ax.set_title(f"Replica packing: {plan['gpus_used']} of {nodes * g} GPUs{mark}")
    return Plotted(fig, {"placements": df})


def _role_label(p: dict[str, Any]) -> str:
    """A catalogued placement's role: ``engine`` (an aggregated replica), ``prefill 0``, ``decode 1``, …"""
    role = str(p.get("role") or "engine")
    return role if role == "engine" else f"{role} {p.get('worker', 0)}"


def _placement_words(p: dict[str, Any]) -> str:
    """``chat#0 TP4 GPUs 0–3 :8000``; in a catalogued plan ``chat#0 2p-tp2+1d-tp4 prefill 1 TP2 GPUs 2–3 :8001``."""
    where = f"TP{p['tp']} GPUs {p['gpus'][0]}–{p['gpus'][-1]} :{p['port']}"
    if "config" not in p:
        return f"{p['workload']}#{p['index']} {where}"
    role = "" if p.get("role") in (None, "engine") else f" {_role_label(p)}"
    return f"{p['workload']}#{p['index']} {p['config']}{role} {where}"


_TAILS = (("ttft_p99_s", "TTFT p99 (s)"), ("completion_p99_s", "completion p99 (s)"))


def plot_live_windows(plan: dict[str, Any], verify: dict[str, Any]) -> Any:
    """Per class and tail: predicted interval (bar), SLO (line) and the live p99's bucket (bracket).

    Returns:
        ``Plotted`` with data ``windows`` (workload, metric, pred_lo, pred_hi, live_lo, live_hi, slo, verdict).
    """
    import matplotlib.pyplot as plt

    from fleetsieve_bayes.reporting.plots import Plotted

    planned = {c["workload"]: c for c in plan["classes"]}
    rows = []
    for c in verify.get("classes", []):
        for key, _ in _TAILS:
            m = c["metrics"].get(key) or {}
            pred = ((planned.get(c["workload"]) or {}).get("predicted") or {}).get(key) or {}
            iv = pred.get("interval") or [None, None]
            rows.append({"workload": c["workload"], "metric": key, "pred_lo": iv[0], "pred_hi": iv[1],
                         "live_lo": m.get("lo"), "live_hi": m.get("hi"), "slo": m.get("slo"),
                         "verdict": c["verdict"]})
    df = pd.DataFrame(rows, columns=["workload", "metric", "pred_lo", "pred_hi", "live_lo", "live_hi", "slo", "verdict"])
    classes = list(dict.fromkeys(df["workload"]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.9 + 0.6 * max(1, len(classes))), layout="constrained", squeeze=False)
    for ax, (key, label) in zip(axes[0], _TAILS, strict=True):
        sub = df[df["metric"] == key]
        for y, w in enumerate(classes):
            r = sub[sub["workload"] == w]
            if r.empty:
                continue
            r = r.iloc[0]
            if pd.notna(r["pred_lo"]) and pd.notna(r["pred_hi"]):
                ax.barh(y, r["pred_hi"] - r["pred_lo"], left=r["pred_lo"], height=0.35, color="tab:blue", alpha=0.35,
                        label="predicted" if y == 0 else None)
            if pd.notna(r["live_lo"]):
                hi = r["live_hi"] if pd.notna(r["live_hi"]) else r["live_lo"] * 2
                ax.errorbar([(r["live_lo"] + hi) / 2], [y], xerr=[[(hi - r["live_lo"]) / 2]], fmt="none",
                            ecolor="tab:red" if r["verdict"] == "violates" else "black", capsize=6, lw=2,
                            label="live p99 bucket" if y == 0 else None)
            if pd.notna(r["slo"]):
                ax.plot([r["slo"], r["slo"]], [y - 0.4, y + 0.4], color="tab:red", ls="--", label="SLO" if y == 0 else None)
        ax.set_yticks(range(len(classes)))
        ax.set_yticklabels([f"{w} ({df[df['workload'] == w]['verdict'].iloc[0]})" for w in classes])
        ax.set_ylim(len(classes) - 0.5, -0.5)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8, loc="best")
    fig.suptitle("Live windows against the plan's predicted intervals")
    return Plotted(fig, {"windows": df})


def deployment_html(plan: dict[str, Any], verify: dict[str, Any] | None, figures: dict[str, Any],
                    figure: Callable[[str, Any, str], str]) -> list[str]:
    """The report's "Deployment" section (``figure(id, plotted, caption)`` renders a figure)."""
    esc = html.escape
    parts = ["<h2>Deployment</h2>"]
    mark = "" if plan["certified"] else " <b>UNCERTIFIED</b> (planned with --allow-uncertified)"
    parts.append(
        f"<p>Plan of campaign <b>{esc(str(plan['campaign']))}</b> ({esc(str(plan['status']))}){mark}: "
        f"{plan['gpus_used']} of {plan['nodes'] * plan['gpus_per_node']} GPUs on {plan['nodes']} node(s) "
        f"of {plan['gpus_per_node']}, packed by {esc(str(plan['packing_method']))}; certificate "
        f"<code>{esc(str((plan.get('certificate') or {}).get('campaign_fingerprint'))[:16])}</code>.</p>"
    )
    rows = []
    for n in range(int(plan["nodes"])):
        here = [p for p in plan["placements"] if p["node"] == n]
        rows.append(f"<tr><td>node {n}</td><td>{len(here)}</td><td>{sum(p['tp'] for p in here)}</td><td>"
                    + esc(", ".join(_placement_words(p) for p in here)) + "</td></tr>")
    unit = "workers" if any("config" in p for p in plan["placements"]) else "replicas"
    parts.append(f'<table id="plan-nodes"><thead><tr><th>node</th><th>{unit}</th><th>GPUs</th>'
                 f"<th>{unit} (GPUs, port)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    p = plot_packing(plan)
    figures["fig-packing"] = p
    parts.append(figure("fig-packing", p, "Replicas packed onto each node's GPUs (a TP-t replica on t GPUs of one node)."))
    if verify is not None:
        lines = []
        for c in verify.get("classes", []):
            t, e, s = (c["metrics"].get(k) or {} for k in ("ttft_p99_s", "completion_p99_s", "success_rate"))
            lines.append(
                f"<tr><td>{esc(c['workload'])}</td><td>{c['offered_rps']:.3g}</td><td>{c['served_rps']:.3g}</td>"
                f"<td>[{t.get('lo')}, {t.get('hi')}]</td><td>[{e.get('lo')}, {e.get('hi')}]</td>"
                f"<td>{s.get('value')}</td><td><b>{esc(c['verdict'])}</b></td></tr>"
            )
        parts.append(
            f"<h3>Live windows ({esc(str(verify['source'].get('kind')))}, "
            f"{float(verify['source'].get('window_s') or 0):g} s)</h3>"
            '<table id="verify-table"><thead><tr><th>class</th><th>offered req/s</th><th>served req/s</th>'
            "<th>TTFT p99 bucket (s)</th><th>completion p99 bucket (s)</th><th>success</th><th>verdict</th></tr>"
            "</thead><tbody>" + "".join(lines) + "</tbody></table>"
        )
        if verify.get("classes"):
            lw = plot_live_windows(plan, verify)
            figures["fig-live"] = lw
            parts.append(figure("fig-live", lw, "Live p99 bucket intervals against the plan's predicted intervals and the SLOs."))
    return parts
