"""Reading a campaign directory, and the self-contained HTML report.

:func:`load_campaign_dir` reads what ``status`` and ``report`` need from a
campaign directory — the journal (which a running or killed campaign keeps
complete up to its last record), ``result.json`` when the campaign finished —
and never imports JAX or matplotlib, so ``status`` stays fast.

:func:`write_report` renders one HTML file with every figure embedded as a
base64 PNG and the styles inline: it opens offline, from a mail attachment,
with no network. The figures come from :mod:`fleetsieve_bayes.reporting.plots`.

SLOs and demands are not in the journal header of every campaign; they come
from, in order: an explicit campaign file (``--campaign``), the header's
``workloads`` entry (``[{name, demand_rps, critical, floor, slo: {...}}]``),
else they are unknown (figures then draw no SLO lines and count every cell as
feasible).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import html
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fleetsieve_bayes.campaign.journal import JOURNAL_NAME, LOCK_NAME, read_journal
from fleetsieve_bayes.errors import InputError

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

FINISHED, RUNNING, STOPPED = "finished", "running", "stopped"


class CampaignView(NamedTuple):
    """What a campaign directory says, read without JAX."""

    directory: Path
    header: dict[str, Any]
    measurements: list[dict[str, Any]]  # journal measurement records, in order
    rounds: list[dict[str, Any]]  # journal round records, in order
    result: dict[str, Any] | None  # result.json, None while running / when killed
    state: str  # finished | running | stopped (killed or interrupted, no result.json)
    workloads: tuple[str, ...]
    slos: dict[str, dict[str, Any]]  # workload → {success_min, ttft_p99_s, completion_p99_s}
    demand: dict[str, float]  # workload → req/s (empty when unknown)
    epsilon: float | None
    gpus: int | None
    slo_source: str  # where the SLOs came from (for the reader)

    @property
    def n_candidates(self) -> int | None:
        cells = self.header.get("cells")
        return len(cells) if isinstance(cells, list) else None

    @property
    def gpu_seconds(self) -> float:
        return float(sum(float(r.get("gpu_seconds", 0.0)) for r in self.measurements))

    @property
    def last_round(self) -> dict[str, Any] | None:
        return self.rounds[-1] if self.rounds else None

    @property
    def status(self) -> str:
        """The campaign's status: result.json's, else the last round's certificate, else 'design'."""
        if self.result is not None:
            return str(self.result.get("status"))
        if self.rounds:
            return str(self.rounds[-1].get("certificate"))
        return "initial design"


def _is_locked(directory: Path) -> bool:
    """Whether a ``run`` currently holds the directory (flock dies with its process)."""
    lock = directory / LOCK_NAME
    if not lock.exists():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases our shared lock, if we got it
    return False


def _slos_from_campaign(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, float], float, int]:
    from fleetsieve_bayes.campaign.config import load_campaign

    c = load_campaign(path)
    slos = {
        w.name: {"success_min": w.slo.success_min, "ttft_p99_s": w.slo.ttft_p99_s, "completion_p99_s": w.slo.completion_p99_s}
        for w in c.workloads
    }
    return slos, {w.name: w.demand_rps for w in c.workloads}, c.epsilon, c.gpus


def _slos_from_header(header: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    slos: dict[str, dict[str, Any]] = {}
    demand: dict[str, float] = {}
    for w in header.get("workloads") or []:
        if not isinstance(w, dict) or "name" not in w:
            continue
        s = w.get("slo") or {}
        slos[str(w["name"])] = {k: s.get(k) for k in ("success_min", "ttft_p99_s", "completion_p99_s")}
        if w.get("demand_rps") is not None:
            demand[str(w["name"])] = float(w["demand_rps"])
    return slos, demand


def load_campaign_dir(directory: str | Path, *, campaign_file: str | Path | None = None) -> CampaignView:
    """Read a campaign directory (running, killed or finished).

    Raises:
        InputError: no journal, a journal without a header, a corrupt
            journal line or ``result.json``, or a bad campaign file.
    """
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{d}: not a campaign directory (no such directory)")
    jpath = d / JOURNAL_NAME
    if not jpath.is_file():
        raise InputError(f"{d}: not a campaign directory (no {JOURNAL_NAME})")
    records, _ = read_journal(jpath)
    headers = [r for r in records if r.get("type") == "header"]
    if not headers:
        raise InputError(f"{jpath}: no header record (is the campaign still starting?)")
    header = headers[0]
    result = None
    rpath = d / "result.json"
    if rpath.is_file():
        try:
            result = json.loads(rpath.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise InputError(f"{rpath}: cannot read result ({exc})") from None
        if not isinstance(result, dict):
            raise InputError(f"{rpath}: expected a JSON object")
    locked = _is_locked(d)
    state = RUNNING if locked else (FINISHED if result is not None else STOPPED)

    epsilon = header.get("epsilon", (result or {}).get("epsilon"))
    gpus = header.get("gpus")
    if campaign_file is not None:
        slos, demand, epsilon, gpus = _slos_from_campaign(Path(campaign_file))
        source = f"campaign file {campaign_file}"
    else:
        slos, demand = _slos_from_header(header)
        source = "journal header" if slos else "unknown (pass --campaign FILE to draw SLO lines)"
    cells = header.get("cells") or []
    workloads = tuple(dict.fromkeys([str(c["workload"]) for c in cells if isinstance(c, dict)] or list(slos)))
    return CampaignView(
        directory=d,
        header=header,
        measurements=[r for r in records if r.get("type") == "measurement"],
        rounds=[r for r in records if r.get("type") == "round"],
        result=result,
        state=state,
        workloads=workloads,
        slos=slos,
        demand=demand,
        epsilon=None if epsilon is None else float(epsilon),
        gpus=None if gpus is None else int(gpus),
        slo_source=source,
    )


def read_measurements(view: CampaignView) -> pd.DataFrame:
    """``measurements.csv`` (validated), else the journal's rows (a campaign killed before writing it)."""
    from fleetsieve_bayes.table import read_table, validate_table

    path = view.directory / "measurements.csv"
    if path.is_file():
        return read_table(path)
    rows = [r["row"] for r in view.measurements]
    if not rows:
        return pd.DataFrame(columns=["workload", "tp", "load", "offered_rps", "throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate", "duration_s"])
    return validate_table(pd.DataFrame(rows), source=f"{view.directory / JOURNAL_NAME}")


def read_bounds(view: CampaignView, measurements: pd.DataFrame) -> pd.DataFrame:
    """``bounds.csv``; before the first round, the measured cells collapsed to their values.

    Raises:
        InputError: the file lacks a column of :data:`fleetsieve_bayes.table.BOUNDS_COLUMNS`.
    """
    from fleetsieve_bayes.table import BOUNDS_COLUMNS

    path = view.directory / "bounds.csv"
    if path.is_file():
        try:
            b = pd.read_csv(path)
        except Exception as exc:  # noqa: BLE001 - any parser failure is bad input
            raise InputError(f"{path}: cannot parse bounds ({exc})") from None
        missing = [c for c in BOUNDS_COLUMNS if c not in b.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        b["workload"] = b["workload"].astype(str)
        b["load"] = b["load"].astype(str)
        b["tp"] = b["tp"].astype(int)
        b["measured"] = b["measured"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))
        for c in BOUNDS_COLUMNS[4:]:
            b[c] = pd.to_numeric(b[c], errors="coerce")
        return b
    m = measurements
    return pd.DataFrame(
        {
            "workload": m["workload"].astype(str),
            "tp": m["tp"].astype(int),
            "load": m["load"].astype(str),
            "measured": True,
            "throughput_lo": m["throughput_rps"],
            "throughput_hi": m["throughput_rps"],
            "ttft_p99_lo": m["ttft_p99_s"],
            "ttft_p99_hi": m["ttft_p99_s"],
            "completion_p99_lo": m["completion_p99_s"],
            "completion_p99_hi": m["completion_p99_s"],
            "success_lo": m["success_rate"],
            "success_hi": m["success_rate"],
        }
    )


def read_posterior(view: CampaignView) -> Any | None:
    """``posterior.nc`` as ArviZ InferenceData, or ``None`` if there is none yet."""
    path = view.directory / "posterior.nc"
    if not path.is_file():
        return None
    import arviz as az

    try:
        return az.from_netcdf(str(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure is bad input
        raise InputError(f"{path}: cannot read posterior ({type(exc).__name__}: {exc})") from None


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
            part = last.get(key) or {}
            obj = part.get("objective") or {}
            out[key] = (part.get("allocation"), obj if obj.get("feasible", True) else None, part.get("allocation") is None)
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


def _decided(view: CampaignView) -> dict[str, Any] | None:
    """The allocation to explain: result.json's, else the last round's conservative one."""
    if view.result is not None:
        return view.result.get("allocation")
    last = view.last_round
    return None if last is None else (last.get("conservative") or {}).get("allocation")


def _why_html(view: CampaignView, measurements: pd.DataFrame) -> str:
    """One line per class: the chosen cell, its capacity against demand, and its SLO margins."""
    alloc = _decided(view)
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


def build_report(
    view: CampaignView,
    measurements: pd.DataFrame,
    bounds: pd.DataFrame,
    idata: Any | None,
) -> Report:
    """Render the report for ``view``.

    Args:
        measurements: the measurement table (docs/contracts.md columns).
        bounds: ``bounds.csv`` (:data:`fleetsieve_bayes.table.BOUNDS_COLUMNS`).
        idata: the posterior InferenceData, or ``None``.
    """
    from fleetsieve_bayes.reporting import plots

    figures: dict[str, Any] = {}
    parts: list[str] = []
    name = view.header.get("campaign", view.directory.name)
    status = view.status
    n_total = view.n_candidates
    parts.append(f"<h1>Campaign report: {_esc(name)}</h1>")
    parts.append(
        f'<p class="meta"><span class="badge {_esc(status)}">{_esc(status)}</span> &nbsp; '
        f"strategy <b>{_esc(view.header.get('strategy', '?'))}</b>, seed {_esc(view.header.get('seed', '?'))}; "
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
    if last is not None:
        g = last.get("gap") or {}
        cards.append(("gap (min fulfil.)", _fmt(g.get("min_fulfillment"))))
        cards.append(("gap (goodput)", _fmt(g.get("goodput"))))
        j = last.get("joint")
        if j:  # the certification attempt's joint check
            cards.append(("P(ε-optimal)", _fmt(j.get("p_epsilon_optimal"))))
            cards.append(("P(SLO met)", _fmt(j.get("p_slo_met"))))
    parts.append('<div class="cards">' + "".join(f'<div class="card"><div class="k">{_esc(k)}</div><div class="v">{_esc(v)}</div></div>' for k, v in cards) + "</div>")
    if last is not None:
        parts.append(f"<p><b>Why:</b> {_esc(last.get('reason', ''))}</p>")

    # --- The decision.
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
        parts.append(_why_html(view, measurements))
        p = plots.plot_allocations({lab: allocs[lab][0] for lab in labels}, view.workloads, view.gpus)
        figures["fig-allocations"] = p
        parts.append(_figure("fig-allocations", p, "GPUs per class in each allocation (bars stacked up to the budget)."))
    else:
        parts.append("<p>No round has completed yet: the campaign is still in its initial design.</p>")

    # --- Gap against cost.
    parts.append("<h2>Gap against profiling cost</h2>")
    if view.rounds:
        p = plots.plot_gap(view.rounds, view.epsilon, (view.result or {}).get("status"))
        figures["fig-gap"] = p
        parts.append(_figure("fig-gap", p, "Stage-wise gap between the optimistic and conservative allocations after each round, against the GPU-seconds spent so far; the star is the certificate."))
        rt = pd.DataFrame(
            [
                {
                    "round": r["round"],
                    "GPU-s": r.get("gpu_seconds"),
                    "certificate": r.get("certificate"),
                    "gap crit.": (r.get("gap") or {}).get("critical"),
                    "gap min fulfil.": (r.get("gap") or {}).get("min_fulfillment"),
                    "gap goodput": (r.get("gap") or {}).get("goodput"),
                    "next cell": "—" if not r.get("chosen") else f"{r['chosen']['workload']} TP{r['chosen']['tp']}@{r['chosen']['load']}",
                    "fit s": (r.get("timings") or {}).get("fit_s"),
                }
                for r in view.rounds
            ]
        )
        parts.append('<div class="scroll">' + _table(rt, "rounds-table", 3, {"GPU-s": 0, "fit s": 1}) + "</div>")
    else:
        parts.append("<p>No round yet.</p>")

    # --- Per class.
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
        p = plots.plot_capacity(bounds, measurements, view.slos, knee=knee, workloads=[w for w in view.workloads if (bounds["workload"] == w).any()], chosen=_decided(view))
        figures["fig-capacity"] = p
        parts.append(_figure("fig-capacity", p, "Per-GPU capacity (served req/s of one replica ÷ TP) against TP: max over SLO-feasible loads, conservative to optimistic; dots are measured cells; the orange line is the knee; the star is the chosen cell. A TP without a point has no SLO-feasible load at that bound."))
        p = plots.plot_tails(bounds, measurements, view.slos, workloads=[w for w in view.workloads if (bounds["workload"] == w).any()])
        figures["fig-tails"] = p
        parts.append(_figure("fig-tails", p, "Tail latencies and success against load, per TP: credible bands, measured points, and the SLO limits (red dashed)."))
    else:
        parts.append("<p>Nothing measured yet.</p>")

    # --- Measurements.
    parts.append("<h2>Measured cells</h2>")
    if view.measurements:
        mt = pd.DataFrame(
            [
                {
                    "#": i + 1,
                    "cell": f"{r['cell']['workload']} TP{r['cell']['tp']}@{r['cell']['load']}",
                    "phase": r.get("phase"),
                    "round": r.get("round"),
                    "throughput (req/s)": r["row"].get("throughput_rps"),
                    "TTFT p99 (s)": r["row"].get("ttft_p99_s"),
                    "completion p99 (s)": r["row"].get("completion_p99_s"),
                    "success": r["row"].get("success_rate"),
                    "GPU-s": r.get("gpu_seconds"),
                }
                for i, r in enumerate(view.measurements)
            ]
        )
        parts.append('<div class="scroll">' + _table(mt, "measurements-table", 3, {"GPU-s": 0}) + "</div>")
    else:
        parts.append("<p>No cell measured yet.</p>")

    # --- Diagnostics.
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
    directory: str | Path, out: str | Path | None = None, *, campaign_file: str | Path | None = None
) -> tuple[Path, Report]:
    """Read a campaign directory and write its HTML report (default ``DIR/report.html``).

    Raises:
        InputError: a missing or malformed campaign file (named).
    """
    view = load_campaign_dir(directory, campaign_file=campaign_file)
    measurements = read_measurements(view)
    bounds = read_bounds(view, measurements)
    idata = read_posterior(view)
    report = build_report(view, measurements, bounds, idata)
    path = Path(out) if out is not None else view.directory / "report.html"
    from fleetsieve_bayes.campaign.journal import atomic_write_text

    with contextlib.suppress(FileNotFoundError):
        path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, report.html)
    return path, report
