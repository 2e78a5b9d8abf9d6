"""The self-contained HTML report of a campaign directory.

:func:`write_report` renders one HTML file with every figure embedded as a
base64 PNG and the styles inline: it opens offline, from a mail attachment,
with no network. The directory is read by
:mod:`fleetsieve_bayes.campaign.directory` (the one reader ``status`` uses
too); the figures come from :mod:`fleetsieve_bayes.reporting.plots`.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fleetsieve_bayes.campaign.directory import (
    CampaignView,
    load_campaign_dir,
    read_bounds,
    read_measurements,
    read_posterior,
)
from fleetsieve_bayes.errors import EnvironmentProblem, InputError

__all__ = [
    "CampaignView",
    "Report",
    "load_campaign_dir",
    "read_bounds",
    "read_measurements",
    "read_posterior",
    "build_report",
    "write_report",
]


# ---------------------------------------------------------------------------- HTML


class Report(NamedTuple):
    """A rendered report: the HTML and every figure (with its data) it embeds."""

    html: str
    figures: dict[str, Any]  # figure id → plots.Plotted (figures closed)


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int,)):
        return str(x)
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(f):
        return "—"
    if math.isinf(f):
        return "∞"
    return f"{f:.{digits}f}"


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figure(fig_id: str, plotted: Any, caption: str) -> str:
    data = _png(plotted.figure)
    return (
        f'<figure id="{_esc(fig_id)}"><img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_esc(caption)}</figcaption></figure>"
    )


def _table(df: pd.DataFrame, table_id: str, digits: int = 3, per_column: dict[str, int] | None = None) -> str:
    """An HTML table of ``df``; ``per_column`` overrides ``digits`` for named columns."""
    head = "".join(f"<th>{_esc(c)}</th>" for c in df.columns)
    widths = [(per_column or {}).get(str(c), digits) for c in df.columns]
    body = []
    for _, row in df.iterrows():
        cells = "".join(f"<td>{_esc(_fmt(v, d))}</td>" for v, d in zip(row.to_numpy(), widths, strict=True))
        body.append(f"<tr>{cells}</tr>")
    return f'<table id="{_esc(table_id)}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _alloc_cells(label: str, workload: str, a: dict[str, Any] | None, infeasible: bool) -> str:
    if infeasible:
        return f'<td colspan="4" class="bad" data-alloc="{_esc(label)}" data-workload="{_esc(workload)}" data-field="infeasible">infeasible</td>'
    a = a or {}
    reps = int(a.get("replicas") or 0)
    tp = a.get("tp")
    gpus = reps * int(tp or 0)
    out = []
    for field, val in (("tp", tp), ("load", a.get("load")), ("replicas", reps), ("gpus", gpus)):
        out.append(f'<td data-alloc="{_esc(label)}" data-workload="{_esc(workload)}" data-field="{field}">{_esc(_fmt(val))}</td>')
    return "".join(out)


def _objective_row(label: str, obj: dict[str, Any] | None) -> str:
    if not obj:
        return f"<tr><th>{_esc(label)}</th><td colspan='3'>—</td></tr>"
    return (
        f"<tr><th>{_esc(label)}</th>"
        f'<td data-alloc="{_esc(label)}" data-field="min_fulfillment">{_fmt(obj.get("min_fulfillment"))}</td>'
        f'<td data-alloc="{_esc(label)}" data-field="goodput_rps">{_fmt(obj.get("goodput_rps"), 2)}</td>'
        f'<td data-alloc="{_esc(label)}" data-field="gpus_used">{_fmt(obj.get("gpus_used"))}</td></tr>'
    )


def _allocations(view: CampaignView) -> dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None, bool]]:
    """label → (allocation, objective, infeasible) for final / conservative / optimistic."""
    out: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None, bool]] = {}
    if view.result is not None:
        alloc = view.result.get("allocation")
        out["final"] = (alloc, view.result.get("objective"), alloc is None)
    last = view.last_round
    if last is not None:
        for key in ("conservative", "optimistic"):
            side = last.conservative if key == "conservative" else last.optimistic
            out[key] = (side.allocation, side.objective if side.feasible else None, side.allocation is None)
    return out


def _name_class_dims(idata: Any, workloads: tuple[str, ...]) -> Any:
    """Label ArviZ's anonymous ``<var>_dim_k`` dims of length n_classes with the class names."""
    post = getattr(idata, "posterior", None)
    if post is None or not workloads:
        return idata
    coords = {
        d: list(workloads)
        for d, n in post.sizes.items()
        # Class-level sites put the class first (model.py), so only `_dim_0` is a class axis.
        if str(d).endswith("_dim_0") and n == len(workloads) and str(d)[: -len("_dim_0")] in post.data_vars
        and str(d)[: -len("_dim_0")] not in ("latent", "capacity", "y")  # per-cell sites
    }
    if coords:
        idata = idata.copy()
        idata.posterior = post.assign_coords(coords)
    return idata


def _why_html(view: CampaignView, measurements: pd.DataFrame) -> str:
    """One line per class: the chosen cell, its capacity against demand, and its SLO margins."""
    alloc = view.decided_allocation
    if not alloc:
        return ""
    label = "final allocation" if view.result is not None else "current conservative allocation"
    items = []
    for w in view.workloads:
        a = alloc.get(w) or {}
        reps = int(a.get("replicas") or 0)
        if not reps:
            items.append(f"<li><b>{_esc(w)}</b>: no replicas</li>")
            continue
        tp, load = int(a["tp"]), str(a["load"])
        text = f"<b>{_esc(w)}</b>: {reps} × TP{tp}@{_esc(load)} = {reps * tp} GPUs"
        hit = measurements[(measurements["workload"] == w) & (measurements["tp"] == tp) & (measurements["load"] == load)]
        if len(hit):
            row = hit.iloc[0]
            cap = reps * float(row["throughput_rps"])
            demand = view.demand.get(w)
            if demand:
                text += f"; capacity {cap:.2f} req/s for a demand of {demand:g} req/s (fulfillment {min(1.0, cap / demand):.3f})"
            else:
                text += f"; capacity {cap:.2f} req/s"
            slo = view.slos.get(w) or {}
            checks = []
            for col, key, name, unit in (("ttft_p99_s", "ttft_p99_s", "TTFT p99", " s"), ("completion_p99_s", "completion_p99_s", "completion p99", " s")):
                lim = slo.get(key)
                checks.append(f"{name} {_fmt(row[col], 2)}{unit}" + (f" ≤ {lim:g}{unit}" if lim is not None else ""))
            smin = slo.get("success_min")
            checks.append(f"success {_fmt(row['success_rate'])}" + (f" ≥ {smin:g}" if smin is not None else ""))
            text += "; measured " + ", ".join(_esc(c) for c in checks)
        else:
            text += " (cell not measured yet)"
        items.append(f"<li>{text}</li>")
    return f'<p>Why this fleet ({_esc(label)}):</p><ul id="why">{"".join(items)}</ul>'


STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1300px;margin:0 auto;padding:24px 32px 64px}
h1{margin:0 0 4px;font-size:1.7em} h2{margin-top:40px;border-bottom:2px solid #ddd;padding-bottom:4px}
h3{margin-top:28px}
.meta{color:#555;margin:0 0 16px}
.badge{display:inline-block;padding:3px 10px;border-radius:12px;font-weight:600;color:#fff;background:#888}
.badge.certified-feasible{background:#1a7f37}.badge.certified-infeasible{background:#cf222e}
.badge.undecided{background:#bf8700}.badge.exhausted{background:#8250df}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#fff;border:1px solid #e1e1e1;border-radius:8px;padding:10px 16px;min-width:150px}
.card .k{font-size:.8em;color:#666;text-transform:uppercase;letter-spacing:.04em}.card .v{font-size:1.3em;font-weight:600}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px;font-size:.9em}
th,td{border:1px solid #ddd;padding:4px 10px;text-align:right}th{background:#f0f0f0}
td:first-child,th:first-child{text-align:left}th[colspan]{text-align:center}
td.bad{color:#cf222e;font-weight:600;text-align:center}
figure{margin:12px 0 24px;background:#fff;border:1px solid #e1e1e1;border-radius:8px;padding:8px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{color:#555;font-size:.9em;padding:6px 8px 0}
.note{color:#555;font-size:.92em}
.scroll{max-height:420px;overflow:auto;display:inline-block}
"""


def _alternatives_html(view: CampaignView) -> str:
    """result.json's ranked alternatives (empty when it ranks none)."""
    rows = view.alternative_rows()
    if not rows:
        return ""
    priced = any(r["usd_per_hour"] for r in rows)
    cols = [("rank", "#"), ("fleet", "fleet"), ("p_epsilon_optimal", "P(ε-optimal)"), ("p_slo_met", "P(SLO met)"),
            ("gpus", "GPUs"), *([("usd_per_hour", "$/h")] if priced else []), ("predicted", "predicted cells")]
    head = "".join(f"<th>{_esc(name)}</th>" for _, name in cols)
    body = "".join(
        f'<tr data-rank="{_esc(r["rank"])}">' + "".join(f'<td data-field="{k}">{_esc(r[k])}</td>' for k, _ in cols) + "</tr>"
        for r in rows
    )
    return (
        f"<h3>{_esc(view.alternatives_title())}</h3>"
        f'<table id="alternatives-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        '<p class="note">Each fleet\'s posterior probability of being ε-optimal and of meeting every SLO, all '
        "on the same posterior draws; <b>predicted cells</b> are the operating points it commits to that were "
        "never measured. <code>fleetsieve-bayes plan DIR --alternative K</code> plans the K-th.</p>"
    )


def _decision_html(view: CampaignView, measurements: pd.DataFrame, bounds: pd.DataFrame, idata: Any | None, figures: dict[str, Any]) -> list[str]:
    """The allocations, their objectives and why this fleet."""
    from fleetsieve_bayes.reporting import plots

    parts: list[str] = []
    parts.append("<h2>The decision</h2>")
    allocs = _allocations(view)
    if allocs:
        labels = list(allocs)
        head1 = "<tr><th rowspan='2'>class</th>" + "".join(f"<th colspan='4'>{_esc(lab)}</th>" for lab in labels) + "</tr>"
        head2 = "<tr>" + "<th>TP</th><th>load</th><th>replicas</th><th>GPUs</th>" * len(labels) + "</tr>"
        rows = []
        for w in view.workloads:
            cells = "".join(_alloc_cells(lab, w, (allocs[lab][0] or {}).get(w), allocs[lab][2]) for lab in labels)
            rows.append(f"<tr><td>{_esc(w)}</td>{cells}</tr>")
        parts.append(f'<table id="allocation-table"><thead>{head1}{head2}</thead><tbody>{"".join(rows)}</tbody></table>')
        obj_rows = "".join(_objective_row(lab, allocs[lab][1]) for lab in labels)
        parts.append(
            '<table id="objective-table"><thead><tr><th>allocation</th><th>min fulfillment</th>'
            f"<th>goodput (req/s)</th><th>GPUs used</th></tr></thead><tbody>{obj_rows}</tbody></table>"
        )
        parts.append(
            '<p class="note">The <b>conservative</b> allocation is solved on the pessimistic end of every '
            "cell's credible interval (low capacity, high tails, low success), the <b>optimistic</b> one on "
            "the other end; the campaign is certified when they agree within ε and every committed cell is "
            "measured within its SLO. <b>final</b> is the allocation in result.json.</p>"
        )
        parts.append(_alternatives_html(view))
        parts.append(_why_html(view, measurements))
        p = plots.plot_allocations({lab: allocs[lab][0] for lab in labels}, view.workloads, view.gpus)
        figures["fig-allocations"] = p
        parts.append(_figure("fig-allocations", p, "GPUs per class in each allocation (bars stacked up to the budget)."))
    else:
        parts.append("<p>No round has completed yet: the campaign is still in its initial design.</p>")
    return parts

def _gap_html(view: CampaignView, measurements: pd.DataFrame, bounds: pd.DataFrame, idata: Any | None, figures: dict[str, Any]) -> list[str]:
    """The stage-wise gap after each round against the GPU-seconds spent."""
    from fleetsieve_bayes.reporting import plots

    parts: list[str] = []
    parts.append("<h2>Gap against profiling cost</h2>")
    if view.rounds:
        p = plots.plot_gap(view.rounds, view.epsilon, (view.result or {}).get("status"))
        figures["fig-gap"] = p
        parts.append(_figure("fig-gap", p, "Stage-wise gap between the optimistic and conservative allocations after each round, against the GPU-seconds spent so far; the star is the certificate."))
        rt = pd.DataFrame(
            [
                {
                    "round": r.round,
                    "GPU-s": r.gpu_seconds,
                    "certificate": r.certificate,
                    "gap crit.": r.gap.get("critical"),
                    "gap min fulfil.": r.gap.get("min_fulfillment"),
                    "gap goodput": r.gap.get("goodput"),
                    "next cell": "—" if r.chosen is None else r.chosen.label,
                    "fit s": r.timings.get("fit_s"),
                }
                for r in view.rounds
            ]
        )
        parts.append('<div class="scroll">' + _table(rt, "rounds-table", 3, {"GPU-s": 0, "fit s": 1}) + "</div>")
    else:
        parts.append("<p>No round yet.</p>")
    return parts

def _per_class_html(view: CampaignView, measurements: pd.DataFrame, bounds: pd.DataFrame, idata: Any | None, figures: dict[str, Any]) -> list[str]:
    """Capacity, tails and success per class against the SLOs."""
    from fleetsieve_bayes.reporting import plots

    parts: list[str] = []
    parts.append("<h2>Capacity, tails and success per class</h2>")
    parts.append(f'<p class="note">SLOs from: {_esc(view.slo_source)}. Bands are the credible intervals of bounds.csv; measured cells collapse to their measured values.</p>')
    if view.slos:
        slo_df = pd.DataFrame(
            [{"class": w, "demand (req/s)": view.demand.get(w), "success ≥": s.get("success_min"), "TTFT p99 ≤ (s)": s.get("ttft_p99_s"), "completion p99 ≤ (s)": s.get("completion_p99_s")} for w, s in view.slos.items()]
        )
        parts.append(_table(slo_df, "slo-table", 3))
    knee = plots.knee_quantiles(idata, view.workloads) if idata is not None else None
    if idata is not None:
        idata = _name_class_dims(idata, view.workloads)
    if not bounds.empty:
        p = plots.plot_capacity(bounds, measurements, view.slos, knee=knee, workloads=[w for w in view.workloads if (bounds["workload"] == w).any()], chosen=view.decided_allocation)
        figures["fig-capacity"] = p
        parts.append(_figure("fig-capacity", p, "Per-GPU capacity (served req/s of one replica ÷ TP) against TP: max over SLO-feasible loads, conservative to optimistic; dots are measured cells; the orange line is the knee; the star is the chosen cell. A TP without a point has no SLO-feasible load at that bound."))
        p = plots.plot_tails(bounds, measurements, view.slos, workloads=[w for w in view.workloads if (bounds["workload"] == w).any()])
        figures["fig-tails"] = p
        parts.append(_figure("fig-tails", p, "Tail latencies and success against load, per TP: credible bands, measured points, and the SLO limits (red dashed)."))
    else:
        parts.append("<p>Nothing measured yet.</p>")
    return parts

def _measurements_html(view: CampaignView, measurements: pd.DataFrame, bounds: pd.DataFrame, idata: Any | None, figures: dict[str, Any]) -> list[str]:
    """The measured cells, in order."""
    parts: list[str] = []
    parts.append("<h2>Measured cells</h2>")
    if view.measurements:
        mt = pd.DataFrame(
            [
                {
                    "#": i + 1,
                    "cell": r.cell.label,
                    "phase": r.phase,
                    "round": r.round,
                    "throughput (req/s)": r.row.get("throughput_rps"),
                    "TTFT p99 (s)": r.row.get("ttft_p99_s"),
                    "completion p99 (s)": r.row.get("completion_p99_s"),
                    "success": r.row.get("success_rate"),
                    "GPU-s": r.gpu_seconds,
                }
                for i, r in enumerate(view.measurements)
            ]
        )
        parts.append('<div class="scroll">' + _table(mt, "measurements-table", 3, {"GPU-s": 0}) + "</div>")
    else:
        parts.append("<p>No cell measured yet.</p>")
    return parts

def _diagnostics_html(view: CampaignView, measurements: pd.DataFrame, bounds: pd.DataFrame, idata: Any | None, figures: dict[str, Any]) -> list[str]:
    """Posterior diagnostics (r̂, ESS, rank plots)."""
    from fleetsieve_bayes.reporting import plots

    idata = idata if idata is None else _name_class_dims(idata, view.workloads)
    parts: list[str] = []
    parts.append("<h2>Posterior diagnostics</h2>")
    if idata is not None and hasattr(idata, "posterior"):
        summ_all = plots.diagnostics_summary(idata)
        rhat = summ_all["r_hat"].to_numpy(float) if "r_hat" in summ_all else []
        ess = summ_all["ess_bulk"].to_numpy(float) if "ess_bulk" in summ_all else []
        worst_rhat = float(pd.Series(rhat).max()) if len(rhat) else math.nan
        min_ess = float(pd.Series(ess).min()) if len(ess) else math.nan
        verdict = "ok" if (not math.isnan(worst_rhat) and worst_rhat <= 1.01 and min_ess >= 400) else "check"
        parts.append(
            f'<p id="diagnostics-verdict">Over {len(summ_all)} parameters: max r̂ = {_esc(_fmt(worst_rhat))}, '
            f"min bulk ESS = {_esc(_fmt(min_ess, 0))} — <b>{verdict}</b> (r̂ ≤ 1.01 and ESS ≥ 400 are the usual targets; "
            "r̂ is undefined with one chain, e.g. a variational fit).</p>"
        )
        var_names = plots.select_diagnostic_vars(idata)
        if var_names:
            summ = plots.diagnostics_summary(idata, var_names).reset_index(names="parameter")
            parts.append(_table(summ, "diagnostics-table", 3, {"ess_bulk": 0, "ess_tail": 0}))
            p = plots.plot_diagnostics(idata, var_names)
            figures["fig-diagnostics"] = p
            parts.append(_figure("fig-diagnostics", p, "Rank plots (uniform bars per chain = good mixing) or trace plots of the model's class-level and global parameters."))
    else:
        parts.append("<p>No posterior.nc yet.</p>")
    return parts

def build_report(
    view: CampaignView,
    measurements: pd.DataFrame,
    bounds: pd.DataFrame,
    idata: Any | None,
    plan: dict[str, Any] | None = None,
    verify: dict[str, Any] | None = None,
) -> Report:
    """Render the report for ``view``.

    Args:
        measurements: the measurement table (docs/contracts.md columns).
        bounds: ``bounds.csv`` (:data:`fleetsieve_bayes.table.BOUNDS_COLUMNS`).
        idata: the posterior InferenceData, or ``None``.
        plan: a ``plan.json`` of this campaign: adds the Deployment section.
        verify: a ``verify --json`` report of that plan: adds its live windows.
    """

    figures: dict[str, Any] = {}
    parts: list[str] = []
    name = view.header.campaign or view.directory.name
    status = view.status
    n_total = view.n_candidates
    parts.append(f"<h1>Campaign report: {_esc(name)}</h1>")
    parts.append(
        f'<p class="meta"><span class="badge {_esc(status)}">{_esc(status)}</span> &nbsp; '
        f"strategy <b>{_esc(view.header.strategy)}</b>, seed {_esc(view.header.seed)}; "
        f"campaign directory <code>{_esc(view.directory)}</code>; state: {_esc(view.state)}; "
        f"generated {_esc(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>"
    )
    last = view.last_round
    cards = [
        ("GPU-seconds", f"{view.gpu_seconds:,.0f}"),
        ("cells measured", f"{len(view.measurements)} / {n_total if n_total is not None else '?'}"),
        ("rounds", str(len(view.rounds))),
        ("ε", _fmt(view.epsilon, 3)),
    ]
    if view.result is not None and view.result.get("profiling_wall_s") is not None:
        cards.append(("profiling wall clock", f"{float(view.result['profiling_wall_s']):,.0f} s"))
    budget = view.budget_line()
    if budget is not None:
        cards.append(("profiling budget", budget.removeprefix("budget: ")))
    from fleetsieve_bayes.campaign.makespan import read_in_flight

    flying = read_in_flight(view.directory)
    if flying:
        cards.append(("in flight", ", ".join(f"{c['workload']} TP{c['tp']}@{c['load']}" for c in flying)))
    if last is not None:
        g = last.gap
        cards.append(("gap (min fulfil.)", _fmt(g.get("min_fulfillment"))))
        cards.append(("gap (goodput)", _fmt(g.get("goodput"))))
        if last.joint:  # the certification attempt's joint check
            cards.append(("P(ε-optimal)", _fmt(last.joint.get("p_epsilon_optimal"))))
            cards.append(("P(SLO met)", _fmt(last.joint.get("p_slo_met"))))
    parts.append('<div class="cards">' + "".join(f'<div class="card"><div class="k">{_esc(k)}</div><div class="v">{_esc(v)}</div></div>' for k, v in cards) + "</div>")
    if last is not None:
        parts.append(f"<p><b>Why:</b> {_esc(last.reason)}</p>")
        from fleetsieve_bayes.decision.bounds import attainment_lines

        lines = attainment_lines(last.joint)
        if lines:
            parts.append("<p><b>SLO attainment:</b> " + "<br>".join(_esc(x) for x in lines) + "</p>")

    for section in (_decision_html, _gap_html, _per_class_html, _measurements_html, _diagnostics_html):
        parts.extend(section(view, measurements, bounds, idata, figures))
    if plan is not None:
        from fleetsieve_bayes.reporting.deployment import deployment_html

        parts.extend(deployment_html(plan, verify, figures, _figure))

    parts.append(
        '<p class="note">Sources: journal.jsonl, result.json, bounds.csv, measurements.csv, posterior.nc '
        f"in {_esc(view.directory)}. Generated by fleetsieve-bayes.</p>"
    )
    doc = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fleetsieve-bayes report: {_esc(name)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head><body><main>{''.join(parts)}</main></body></html>\n"
    )
    return Report(doc, figures)


def write_report(
    directory: str | Path, out: str | Path | None = None, *, campaign_file: str | Path | None = None,
    plan: str | Path | None = None, verify: str | Path | None = None,
) -> tuple[Path, Report]:
    """Read a campaign directory and write its HTML report (default ``DIR/report.html``).

    Raises:
        InputError: a missing or malformed campaign file (named).
    """
    view = load_campaign_dir(directory, campaign_file=campaign_file)
    measurements = read_measurements(view)
    bounds = read_bounds(view, measurements)
    idata = read_posterior(view)
    plan_json = verify_json = None
    if plan is not None:
        from fleetsieve_bayes.deploy.plan import read_plan

        plan_json = read_plan(plan)
    if verify is not None:
        from fleetsieve_bayes.deploy.production import read_verify

        if plan_json is None:
            raise InputError("--verify needs --plan (the plan the live windows are judged against)")
        verify_json = read_verify(verify)
    report = build_report(view, measurements, bounds, idata, plan=plan_json, verify=verify_json)
    path = Path(out) if out is not None else view.directory / "report.html"
    if path.is_dir():
        path = path / "report.html"  # `--out DIR` means "into DIR"
    from fleetsieve_bayes.atomic import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, report.html)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"--out {path}: a parent of the report path is a file, not a directory") from None
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot write the report ({exc.strerror or exc})") from None
    return path, report
