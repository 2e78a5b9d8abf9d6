"""The HTML report and its figures, on a campaign directory built by hand.

The fixture writes exactly what ``campaign.py`` writes (journal header,
measurement and round records; measurements.csv; bounds.csv; result.json;
posterior.nc) from the shipped H100 grid, so these tests need no model fit.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table, write_table

EXAMPLE = data_dir("examples") / "h100_31b_fp8"
GRID = EXAMPLE / "grid.csv"
CAMPAIGN = EXAMPLE / "campaign.toml"

DESIGN = [("chat", 2, "C16"), ("chat", 4, "C64"), ("chat", 8, "C64"), ("code", 2, "C16"), ("code", 4, "C64"), ("code", 8, "C96")]
ACQUIRED = [("chat", 4, "C96"), ("code", 4, "C96"), ("chat", 4, "C128")]
FINAL = {"chat": {"tp": 4, "load": "C96", "replicas": 2}, "code": {"tp": 4, "load": "C96", "replicas": 2}}
WORKLOADS_HEADER = [
    {"name": "chat", "demand_rps": 12.0, "critical": False, "floor": 1.0, "slo": {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 30.0}},
    {"name": "code", "demand_rps": 16.0, "critical": False, "floor": 1.0, "slo": {"success_min": 0.99, "ttft_p99_s": 5.0, "completion_p99_s": None}},
]


def _cell(key: tuple[str, int, str]) -> dict[str, Any]:
    return {"workload": key[0], "tp": key[1], "load": key[2]}


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)


def build_campaign_dir(
    out: Path,
    *,
    finished: bool = True,
    header_workloads: bool = True,
    posterior: bool = True,
    n_rounds: int = 4,
) -> dict[str, Any]:
    """Write a campaign directory as campaign.py would; return what was written."""
    out.mkdir(parents=True, exist_ok=True)
    grid = read_table(GRID)
    grid["key"] = list(zip(grid["workload"], grid["tp"], grid["load"], strict=True))
    rows = {k: {c: (v.item() if hasattr(v, "item") else v) for c, v in r.items() if c != "key"} for k, r in zip(grid["key"], grid.to_dict("records"), strict=True)}
    header: dict[str, Any] = {
        "type": "header",
        "version": 1,
        "campaign": "h100-31b-fp8",
        "strategy": "fleetsieve",
        "seed": 0,
        "cells": [_cell(k) for k in grid["key"]],
        "created_at": 1.7e9,
    }
    if header_workloads:
        header["workloads"] = WORKLOADS_HEADER
        header["gpus"] = 16
        header["epsilon"] = 0.05
    records: list[dict[str, Any]] = [header]
    seq = 0
    spent = 0.0

    def measure(key: tuple[str, int, str], round_no: int, phase: str) -> None:
        nonlocal seq, spent
        row = rows[key]
        gpu_s = float(row["duration_s"]) * int(row["tp"])
        spent += gpu_s
        records.append({"type": "measurement", "seq": seq, "round": round_no, "phase": phase, "cell": _cell(key), "row": row, "gpu_seconds": gpu_s, "started_at": 1.7e9 + seq, "finished_at": 1.7e9 + seq + 300, "wall_s": 300.0})
        seq += 1

    for k in DESIGN:
        measure(k, 0, "design")
    gaps = [(1.0, 0.6, 0.4), (0.0, 0.3, 0.2), (0.0, 0.08, 0.05), (0.0, 0.0, 0.0)]
    cons_allocs = [None, {"chat": {"tp": 4, "load": "C64", "replicas": 2}, "code": {"tp": 4, "load": "C64", "replicas": 2}}, {"chat": {"tp": 4, "load": "C96", "replicas": 2}, "code": {"tp": 4, "load": "C64", "replicas": 2}}, FINAL]
    n_meas_rounds = n_rounds - 1 if finished else n_rounds
    for r in range(n_rounds):
        last = finished and r == n_rounds - 1
        crit, mf, gp = gaps[min(r, len(gaps) - 1)] if not last else (0.0, 0.0, 0.0)
        cons = cons_allocs[min(r, len(cons_allocs) - 1)] if not last else FINAL
        chosen = None if last else ACQUIRED[r % len(ACQUIRED)]
        records.append(
            {
                "type": "round",
                "round": r + 1,
                "certificate": "certified-feasible" if last else "undecided",
                "outcome": "certified-feasible" if last else "measure",
                "reason": "gap within epsilon=0.05 and every committed cell measured within SLO" if last else f"gap above epsilon=0.05: min fulfillment {mf:.3f}, goodput {gp:.3f}",
                "gap": {"critical": crit, "min_fulfillment": mf, "goodput": gp},
                "conservative": {"allocation": cons, "objective": {"feasible": cons is not None, "min_fulfillment": 1.0 - mf, "goodput_rps": 28.0 * (1 - gp), "gpus_used": 16}},
                "optimistic": {"allocation": FINAL, "objective": {"feasible": True, "min_fulfillment": 1.0, "goodput_rps": 28.0, "gpus_used": 16}},
                "measured_cells": seq,
                "gpu_seconds": spent,
                "chosen": None if chosen is None else _cell(chosen),
                "timings": {"fit_s": 2.0, "allocate_s": 0.1, "acquire_s": 0.5},
            }
        )
        if r < n_meas_rounds and chosen is not None:
            measure(chosen, r + 1, "acquire")
    (out / "journal.jsonl").write_text(_jsonl(records))

    meas_rows = [r["row"] for r in records if r["type"] == "measurement"]
    write_table(pd.DataFrame(meas_rows), out / "measurements.csv")
    measured_keys = {(r["cell"]["workload"], r["cell"]["tp"], r["cell"]["load"]) for r in records if r["type"] == "measurement"}
    brows = []
    for k, row in rows.items():
        m = k in measured_keys
        f = (lambda v, s: v) if m else (lambda v, s: v * s)  # noqa: E731
        brows.append(
            {
                "workload": k[0], "tp": k[1], "load": k[2], "measured": m,
                "throughput_lo": f(row["throughput_rps"], 0.8), "throughput_hi": f(row["throughput_rps"], 1.2),
                "ttft_p99_lo": f(row["ttft_p99_s"], 0.7), "ttft_p99_hi": f(row["ttft_p99_s"], 1.5),
                "completion_p99_lo": f(row["completion_p99_s"], 0.7), "completion_p99_hi": f(row["completion_p99_s"], 1.5),
                "success_lo": row["success_rate"] if m else row["success_rate"] - 0.02, "success_hi": row["success_rate"] if m else min(1.0, row["success_rate"] + 0.005),
            }
        )
    pd.DataFrame(brows).to_csv(out / "bounds.csv", index=False)
    result = None
    if finished:
        meas = [r for r in records if r["type"] == "measurement"]
        result = {
            "status": "certified-feasible",
            "gpu_seconds": spent,
            "measured": [r["cell"] for r in meas],
            "allocation": FINAL,
            "timings": {"total_s": 100.0, "rounds": n_rounds, "per_round_s": [2.6] * n_rounds, "per_round": [], "this_invocation_s": 12.0},
            "campaign": "h100-31b-fp8",
            "strategy": "fleetsieve",
            "seed": 0,
            "objective": {"min_fulfillment": 1.0, "goodput_rps": 28.0, "gpus_used": 16},
            "epsilon": 0.05,
            "candidates": len(rows),
        }
        (out / "result.json").write_text(json.dumps(result, indent=2))
    if posterior:
        from fleetsieve_bayes.arviz_import import import_arviz

        az = import_arviz()

        rng = np.random.default_rng(0)
        idata = az.from_dict(
            posterior={
                "knee": rng.normal([2.0, 2.2], 0.1, size=(2, 60, 2)),
                "curvature": rng.lognormal(0.0, 0.1, size=(2, 60, 2)),
                "sharpness": rng.lognormal(1.0, 0.1, size=(2, 60)),
                "knee_z_eps": rng.normal(size=(2, 60, 2)),
                "latent": rng.normal(size=(2, 60, len(rows), 4)),
            }
        )
        idata.to_netcdf(str(out / "posterior.nc"))
    return {"records": records, "result": result, "measurements": pd.DataFrame(meas_rows), "bounds": pd.DataFrame(brows)}


@pytest.fixture(scope="module")
def campaign_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    d = tmp_path_factory.mktemp("campaign")
    return d, build_campaign_dir(d)


@pytest.fixture(scope="module")
def written(campaign_dir: tuple[Path, dict[str, Any]]) -> tuple[Path, Any]:
    from fleetsieve_bayes.reporting.report import write_report

    d, _ = campaign_dir
    return write_report(d)


class _Structure(HTMLParser):
    """Checks nesting (every non-void element closed in order) and collects what the tests need."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.figures: dict[str, list[str]] = {}  # figure id → img srcs
        self.urls: list[str] = []
        self.tags: list[str] = []
        self.cells: dict[tuple[str, str, str], str] = {}
        self._fig: str | None = None
        self._cell: tuple[str, str, str] | None = None
        self._text: list[str] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        for k in ("src", "href"):
            if a.get(k):
                self.urls.append(str(a[k]))
        if tag == "figure":
            self._fig = a.get("id") or "?"
            self.figures[self._fig] = []
        if tag == "img" and self._fig is not None:
            self.figures[self._fig].append(str(a.get("src")))
        if tag == "td" and a.get("data-alloc"):
            self._cell = (str(a["data-alloc"]), str(a.get("data-workload") or ""), str(a.get("data-field")))
            self._text = []
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()
        if tag == "figure":
            self._fig = None
        if tag == "td" and self._cell is not None:
            self.cells[self._cell] = "".join(self._text).strip()
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text.append(data)


def _parse(text: str) -> _Structure:
    p = _Structure()
    p.feed(text)
    p.close()
    return p


def test_report_is_valid_self_contained_html(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    path, report = written
    assert path == campaign_dir[0] / "report.html"
    text = path.read_text()
    assert text == report.html
    p = _parse(text)
    assert p.doctype
    assert p.errors == []
    assert p.stack == []
    assert p.tags[:2] == ["html", "head"]
    assert {"title", "style", "body", "main", "h1", "table"} <= set(p.tags)
    assert "script" not in p.tags and "link" not in p.tags
    # No network: every src/href is an embedded data URI.
    assert p.urls and all(u.startswith("data:") for u in p.urls), [u[:40] for u in p.urls if not u.startswith("data:")]
    assert "http://" not in text and "https://" not in text


def test_report_embeds_every_figure_as_png(written: tuple[Path, Any]) -> None:
    _, report = written
    p = _parse(report.html)
    expected = {"fig-allocations", "fig-gap", "fig-capacity", "fig-tails", "fig-diagnostics"}
    assert set(report.figures) == expected
    assert set(p.figures) == expected
    for fig_id, srcs in p.figures.items():
        assert len(srcs) == 1, fig_id
        prefix = "data:image/png;base64,"
        assert srcs[0].startswith(prefix)
        png = base64.b64decode(srcs[0][len(prefix):], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(png) > 5000  # a real plot, not an empty canvas


def test_allocation_table_matches_result_json(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    result = json.loads((campaign_dir[0] / "result.json").read_text())
    last_round = [r for r in campaign_dir[1]["records"] if r["type"] == "round"][-1]
    cells = _parse(report.html).cells
    for label, alloc in (("final", result["allocation"]), ("conservative", last_round["conservative"]["allocation"]), ("optimistic", last_round["optimistic"]["allocation"])):
        for w, a in alloc.items():
            assert cells[(label, w, "tp")] == str(a["tp"])
            assert cells[(label, w, "load")] == a["load"]
            assert cells[(label, w, "replicas")] == str(a["replicas"])
            assert cells[(label, w, "gpus")] == str(a["replicas"] * a["tp"])
    obj = result["objective"]
    assert float(cells[("final", "", "min_fulfillment")]) == pytest.approx(obj["min_fulfillment"], abs=1e-3)
    assert float(cells[("final", "", "goodput_rps")]) == pytest.approx(obj["goodput_rps"], abs=1e-2)
    assert cells[("final", "", "gpus_used")] == str(obj["gpus_used"])
    drawn = report.figures["fig-allocations"].data["allocations"]
    final = drawn[drawn["allocation"] == "final"].set_index("workload")
    for w, a in result["allocation"].items():
        assert final.loc[w, "replicas"] == a["replicas"] and final.loc[w, "tp"] == a["tp"]


def test_plotted_measured_points_equal_measurements_csv(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    m = read_table(campaign_dir[0] / "measurements.csv")
    cap = report.figures["fig-capacity"].data["measured"]
    got = sorted(zip(cap["workload"], cap["tp"], cap["load"], np.round(cap["per_gpu_rps"], 12), strict=True))
    want = sorted(zip(m["workload"], m["tp"], m["load"], np.round(m["throughput_rps"] / m["tp"], 12), strict=True))
    assert got == want
    tails = report.figures["fig-tails"].data["measured"]
    for metric in ("ttft_p99_s", "completion_p99_s", "success_rate"):
        t = tails[tails["metric"] == metric]
        got = sorted(zip(t["workload"], t["tp"], t["load"], t["value"], strict=True))
        want = sorted(zip(m["workload"], m["tp"], m["load"], m[metric], strict=True))
        assert got == want, metric
    # SLO verdict of the measured points: chat TP4@C128 violates completion p99 ≤ 30 s (46.4 s).
    bad = cap[~cap["slo_ok"]]
    assert ("chat", 4, "C128") in set(zip(bad["workload"], bad["tp"], bad["load"], strict=True))


def test_capacity_curve_is_max_over_slo_feasible_loads(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    curves = report.figures["fig-capacity"].data["curves"].set_index(["workload", "tp"])
    # chat TP4: C128 is measured and violates the completion SLO, so the conservative max is C96 (measured 6.596/4).
    assert curves.loc[("chat", 4), "lo_load"] == "C96"
    assert curves.loc[("chat", 4), "lo"] == pytest.approx(6.596 / 4)
    # Ignoring the SLO, C128's 11.27 req/s would win.
    assert curves.loc[("chat", 4), "any_slo"] == pytest.approx(11.27 / 4)
    chosen = report.figures["fig-capacity"].data["chosen"].set_index("workload")
    assert chosen.loc["chat", "per_gpu_rps"] == pytest.approx(6.596 / 4)
    assert chosen.loc["code", "per_gpu_rps"] == pytest.approx(11.116 / 4)
    # The explanation line of each class: capacity against demand, and the SLO checks.
    assert "2 × TP4@C96 = 8 GPUs; capacity 13.19 req/s for a demand of 12 req/s (fulfillment 1.000)" in report.html
    assert "completion p99 15.98 s ≤ 30 s" in report.html
    knee = report.figures["fig-capacity"].data["knee"].set_index("workload")["tp"]
    assert set(knee.index) == {"chat", "code"}
    assert knee["code"] == 4  # code TP4@C96: 11.116/4 per GPU beats TP2 and TP8


def test_gap_figure_data_and_certificate(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    rounds = [r for r in campaign_dir[1]["records"] if r["type"] == "round"]
    d = report.figures["fig-gap"].data
    assert d["rounds"]["gpu_seconds"].tolist() == [r["gpu_seconds"] for r in rounds]
    assert d["rounds"]["min_fulfillment"].tolist() == [r["gap"]["min_fulfillment"] for r in rounds]
    assert d["certificate"]["round"].tolist() == [rounds[-1]["round"]]
    assert d["certificate"]["certificate"].tolist() == ["certified-feasible"]
    # GPU-seconds never decrease along the campaign.
    assert np.all(np.diff(d["rounds"]["gpu_seconds"]) >= 0)


def test_diagnostics_pick_low_dimensional_vars(written: tuple[Path, Any]) -> None:
    _, report = written
    v = report.figures["fig-diagnostics"].data["variables"]
    names = v["variable"].tolist()
    assert names[0] == "knee"
    assert "latent" not in names and "knee_z_eps" not in names
    assert set(v["kind"]) == {"rank"} and set(v["n_chains"]) == {2}
    p = _parse(report.html)
    assert "diagnostics-table" in report.html and p.errors == []


def test_report_cli_on_interrupted_campaign_without_posterior(tmp_path: Path) -> None:
    """A killed campaign: no result.json, no posterior, a partial last journal line."""
    from fleetsieve_bayes.cli import main

    build_campaign_dir(tmp_path, finished=False, header_workloads=False, posterior=False, n_rounds=2)
    with open(tmp_path / "journal.jsonl", "a") as fh:
        fh.write('{"type":"measurement","seq":')  # a write cut by a kill
    out = tmp_path / "sub" / "r.html"
    assert main(["report", str(tmp_path), "--out", str(out), "--campaign", str(CAMPAIGN)]) == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    p = _parse(text)
    assert p.errors == []
    assert set(p.figures) == {"fig-gap", "fig-capacity", "fig-tails", "fig-allocations"}
    assert ("final", "chat", "tp") not in p.cells  # no result.json → no final column
    assert ("conservative", "chat", "tp") in p.cells
    assert "No posterior.nc yet" in text
    assert "campaign file" in text  # SLO lines come from --campaign
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_report_errors_are_one_line(tmp_path: Path) -> None:
    from fleetsieve_bayes.reporting.report import write_report

    with pytest.raises(InputError, match="no journal.jsonl"):
        write_report(tmp_path)
    build_campaign_dir(tmp_path, posterior=False)
    (tmp_path / "bounds.csv").write_text("workload,tp\nchat,2\n")
    with pytest.raises(InputError, match=r"bounds\.csv: missing column\(s\) load"):
        write_report(tmp_path)


def test_report_module_does_not_import_jax() -> None:
    code = (
        "import sys; import fleetsieve_bayes.reporting.report, fleetsieve_bayes.commands.status, fleetsieve_bayes.commands.report; "
        "assert 'jax' not in sys.modules and 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if m in ('jax', 'matplotlib'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
