"""What ``fleetsieve-bayes classes`` writes into its output directory.

==========================  ====================================================
``classes.json``            the summary (also printed by ``--json``)
``traces/<class>.csv``      each class's requests as a replay trace, Azure format
                            (the vLLM backend's ``traces``), on its service's clock
``campaign.toml``           a campaign skeleton: one ``[[workloads]]`` per class
                            with ``demand_rps`` and TODO SLOs; ``run`` refuses it
                            until every TODO is filled in
``classes.png``             the classes in the (prompt, output) length plane
``rate.png``                each class's windowed arrival rate over time
``report.html``             the two figures and the class table, self-contained
==========================  ====================================================

``demand_rps`` in the skeleton is the class's peak (the ``--peak`` percentile of
its rate over ``--window`` windows): fleets miss SLOs in bursts, not at the
mean. The mean is written next to it. A class's replay trace at arrival scale
``s`` sends ``s ×`` its mean rate (``backends/traces.py``); ``replay_scale_for_peak``
is the scale at which it sends its peak demand.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fleetsieve_bayes.backends.traces import Trace, write_azure_trace
from fleetsieve_bayes.workloads.classes import Classification, ClassSummary
from fleetsieve_bayes.workloads.logs import RequestLog

__all__ = ["summary", "write_outputs", "class_trace", "LOAD_LADDER", "TODO"]

TODO = "TODO"
LOAD_LADDER = (0.25, 0.5, 1.0, 2.0, 4.0)
_PCTS = (5, 25, 50, 75, 95, 99)
_SLO_NOTE = {
    "interactive-short": "a user waits for the first token: TTFT and completion p99 are checked",
    "batch-long": "long outputs read as a whole: completion p99 is checked, TTFT is not",
}
_EPOCH_2000 = 946684800.0  # a clock past this is read as epoch seconds (date-time stamps)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "class"


def _dist(x: np.ndarray) -> dict[str, float]:
    out = {f"p{p}": float(np.percentile(x, p)) for p in _PCTS}
    out.update(mean=float(x.mean()), min=float(x.min()), max=float(x.max()))
    return out


def class_trace(log: RequestLog, c: ClassSummary, start: float) -> Trace:
    """The class's requests as a :class:`Trace` (offsets from its first request)."""
    t = log.arrival_s[c.index] - start
    return Trace(t - t[0], np.maximum(log.input_tokens[c.index], 1), np.maximum(log.output_tokens[c.index], 1),
                 c.name)


def summary(log: RequestLog, cls: Classification) -> dict[str, Any]:
    """The ``classes.json`` object."""
    services = {}
    for name, src in zip(log.services, log.sources, strict=True):
        n = int(sum(len(c.index) for c in cls.classes if c.service == name))
        services[name] = {
            "source": src, "requests": n, "mean_rps": cls.service_rps[name], "k": cls.k_per_service[name],
            "silhouette": {str(k): v for k, v in cls.silhouettes.get(name, {}).items()},
        }
    classes = []
    for c in cls.classes:
        tr = class_trace(log, c, cls.window_start[c.service])
        rate = tr.rate_rps if tr.n >= 2 and tr.arrival_s[-1] > 0 else math.nan
        classes.append({
            "name": c.name, "service": c.service, "requests": len(c.index),
            "mean_rps": c.mean_rps, "peak_rps": c.peak_rps,
            "centre_tokens": {"prompt": c.centre_tokens[0], "output": c.centre_tokens[1]},
            "prompt_range": list(c.prompt_range), "output_range": list(c.output_range),
            "prompt_tokens": _dist(log.input_tokens[c.index]), "output_tokens": _dist(log.output_tokens[c.index]),
            "slo_family": c.slo_family,
            "trace": f"traces/{_safe(c.name)}.csv",
            "trace_rate_rps": rate,
            "replay_scale_for_peak": c.peak_rps / rate if rate > 0 else math.nan,
        })
    return {
        "method": "per service, k-means in (ln prompt, ln output) tokens; K by the mean silhouette "
                  "(fleetsieve_bayes/workloads/classes.py)",
        "window_s": cls.window_s, "peak_percentile": cls.peak_pct,
        "requests": log.n, "dropped_requests": log.dropped,
        "sources": sorted(set(log.sources)),
        "services": services, "classes": classes,
    }


def _start_stamp(t0: float) -> str:
    if t0 > _EPOCH_2000:
        return pd.Timestamp(round(t0 * 1e6), unit="us").strftime("%Y-%m-%d %H:%M:%S.%f")
    return "2023-11-16 18:00:00"


def _toml_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def campaign_skeleton(summ: dict[str, Any], name: str = "classes") -> str:
    """A campaign TOML with one ``[[workloads]]`` per class and TODO SLOs (module docstring)."""
    srcs = ", ".join(Path(s).name for s in summ["sources"])
    pct = f"p{summ['peak_percentile']:g}"
    win = f"{summ['window_s']:g} s"
    lines = [
        f"# Campaign skeleton written by `fleetsieve-bayes classes` from {srcs}.",
        "# Fill in every TODO; `fleetsieve-bayes run` refuses this file while one is left.",
        f"name = {_toml_str(name)}",
        "",
        "[fleet]",
        f"gpus = {_toml_str(TODO + ': the GPU budget, an integer')}",
        "",
        "[model]",
        f"family = {_toml_str(TODO + ': a prior card (fleetsieve-bayes priors list) or a path')}",
        "",
        "[measurement]",
        'backend = "vllm"',
        f"model = {_toml_str(TODO + ': the model path or name the server loads')}",
        "tp = [1, 2, 4, 8]",
        "# Arrival scale s replays a class's trace at s x its mean rate; see each class for the",
        f"# scale at which its trace sends its demand ({pct} of {win} windows).",
        "loads = { " + ", ".join(f'x{str(s).replace(".", "_")} = {s}' for s in LOAD_LADDER) + " }",
        "traces = { " + ", ".join(f"{_toml_str(c['name'])} = {_toml_str(c['trace'])}" for c in summ["classes"])
        + " }",
    ]
    for c in summ["classes"]:
        p, o = c["prompt_range"], c["output_range"]
        fam = c["slo_family"]
        slo = [f"success_min = {_toml_str(TODO)}"]
        if fam == "interactive-short":
            slo.append(f"ttft_p99_s = {_toml_str(TODO)}")
        slo.append(f"completion_p99_s = {_toml_str(TODO)}")
        lines += [
            "",
            "[[workloads]]",
            f"name = {_toml_str(c['name'])}",
            f"# {c['requests']} requests of {c['service']}; prompt {p[0]}-{p[1]}, output {o[0]}-{o[1]} tokens "
            "(5-95 %)",
            f"# mean {c['mean_rps']:.4g} req/s; its trace reaches demand_rps at arrival scale "
            f"{c['replay_scale_for_peak']:.3g}",
            f"demand_rps = {c['peak_rps']:.6g}  # {pct} of the rate in {win} windows",
            f"# SLO family {fam}: {_SLO_NOTE[fam]}",
            "slo = { " + ", ".join(slo) + " }",
        ]
    return "\n".join(lines) + "\n"


def _plots(log: RequestLog, cls: Classification, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    rng = np.random.default_rng(0)
    for j, c in enumerate(cls.classes):
        idx = c.index if len(c.index) <= 4000 else np.sort(rng.choice(c.index, 4000, replace=False))
        ax.scatter(np.maximum(log.input_tokens[idx], 1), np.maximum(log.output_tokens[idx], 1), s=3,
                   alpha=0.35, color=colours(j % 10), linewidths=0, rasterized=True)
        ax.scatter([c.centre_tokens[0]], [c.centre_tokens[1]], s=90, marker="X", color=colours(j % 10),
                   edgecolors="black", linewidths=0.8, zorder=3,
                   label=f"{c.name}: {len(c.index)} req, {c.mean_rps:.2f} req/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("output tokens")
    ax.set_title("Workload classes in the length plane (X: class centre)")
    ax.legend(fontsize=8, loc="best", markerscale=0.8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    p1 = out / "classes.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    services = list(dict.fromkeys(c.service for c in cls.classes))
    fig, axes = plt.subplots(len(services), 1, figsize=(8, 2.6 * len(services) + 0.6), squeeze=False,
                             sharex=True)
    for ax, svc in zip(axes[:, 0], services, strict=True):
        for j, c in enumerate(cls.classes):
            if c.service != svc:
                continue
            r = c.window_rates
            tmin = np.arange(len(r) + 1) * cls.window_s / 60.0
            ax.stairs(r, tmin, color=colours(j % 10), label=f"{c.name}")
            ax.axhline(c.peak_rps, color=colours(j % 10), ls="--", lw=0.8)
        ax.set_ylabel("req/s")
        ax.set_title(f"{svc}: rate in {cls.window_s:g} s windows (dashed: p{cls.peak_pct:g})", fontsize=10)
        ax.legend(fontsize=8, loc="upper right", ncol=3)
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("minutes since the service's first request")
    fig.tight_layout()
    p2 = out / "rate.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]


def _html(summ: dict[str, Any], figures: list[Path]) -> str:
    imgs = "".join(
        f'<figure><img alt="{html.escape(f.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(f.read_bytes()).decode()}"></figure>' for f in figures)
    head = ("<tr><th>class</th><th>service</th><th>requests</th><th>prompt 5-95 %</th><th>output 5-95 %</th>"
            f"<th>mean req/s</th><th>p{summ['peak_percentile']:g} req/s</th><th>SLO family</th><th>trace</th></tr>")
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{html.escape(c['service'])}</td><td>{c['requests']}</td>"
        f"<td>{c['prompt_range'][0]}-{c['prompt_range'][1]}</td><td>{c['output_range'][0]}-{c['output_range'][1]}</td>"
        f"<td>{c['mean_rps']:.4g}</td><td>{c['peak_rps']:.4g}</td><td>{c['slo_family']}</td>"
        f"<td>{html.escape(c['trace'])}</td></tr>" for c in summ["classes"])
    srcs = "".join(f"<li>{html.escape(s)}</li>" for s in summ["sources"])
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Workload classes</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #bbb;padding:.2em .5em;text-align:right}img{max-width:100%}</style></head><body>"
        "<h1>Workload classes</h1>"
        f"<p>{html.escape(summ['method'])}. Windows of {summ['window_s']:g} s.</p>"
        f"<table>{head}{rows}</table>{imgs}"
        f"<h2>Sources</h2><ul>{srcs}</ul><p>The replay traces are derived from these files and carry "
        "their license and attribution.</p></body></html>"
    )


def write_outputs(log: RequestLog, cls: Classification, out: Path, *, plots: bool = True) -> dict[str, Any]:
    """Write everything listed in the module docstring into ``out``; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(exist_ok=True)
    summ = summary(log, cls)
    for c, entry in zip(cls.classes, summ["classes"], strict=True):
        start = cls.window_start[c.service]
        origin = log.origins[log.services.index(c.service)]
        write_azure_trace(out / entry["trace"], log.arrival_s[c.index] - start, log.input_tokens[c.index],
                          log.output_tokens[c.index], start=_start_stamp(origin + start))
    (out / "traces" / "SOURCES.md").write_text(
        "# Sources\n\nEach trace here holds the requests of one workload class, taken unchanged from:\n\n"
        + "".join(f"- `{s}`\n" for s in summ["sources"])
        + "\nThey are derived from those files and keep their license and attribution.\n", encoding="utf-8")
    (out / "campaign.toml").write_text(campaign_skeleton(summ), encoding="utf-8")
    figures = _plots(log, cls, out) if plots else []
    summ["files"] = {"campaign": "campaign.toml", "figures": [f.name for f in figures],
                     "report": "report.html" if plots else None}
    if plots:
        (out / "report.html").write_text(_html(summ, figures), encoding="utf-8")
    (out / "classes.json").write_text(json.dumps(_jsonable(summ), indent=2) + "\n", encoding="utf-8")
    return summ


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
