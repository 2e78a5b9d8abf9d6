"""The HTML report and its figures, on the campaign directory that `run` wrote.

The directory is the session's run of the shipped H100 campaign at "point"
(tests/campaign_dirs.py): the journal, measurements.csv, bounds.csv,
posterior.nc and result.json of a real campaign, and its copy killed after
round 2. Every value checked comes from those files.
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
from campaign_dirs import (
    CANDIDATES,
    CERTIFIED_ALLOCATION,
    CERTIFIED_GPU_SECONDS,
    Runs,
    copy_run,
    journal,
)

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

EXAMPLE = data_dir("examples") / "h100_31b_fp8"
CAMPAIGN = EXAMPLE / "campaign.toml"


@pytest.fixture(scope="module")
def campaign_dir(shipped_runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A copy of the certified run (the report is written into it), with its journal and result."""
    d = copy_run(shipped_runs.certified, tmp_path_factory.mktemp("campaign"))
    return d, {"records": journal(d), "result": json.loads((d / "result.json").read_text())}


@pytest.fixture(scope="module")
def written(campaign_dir: tuple[Path, dict[str, Any]]) -> tuple[Path, Any]:
    from fleetsieve_bayes.reporting.report import write_report

    d, _ = campaign_dir
    return write_report(d)


def _slo_ok(row: dict[str, Any], slo: dict[str, Any]) -> bool:
    """A measured row against its class's SLO, as the campaign file states it."""
    return (row["success_rate"] >= slo["success_min"] and row["ttft_p99_s"] <= slo["ttft_p99_s"]
            and (slo.get("completion_p99_s") is None or row["completion_p99_s"] <= slo["completion_p99_s"]))


def _slos(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w["slo"] for w in records[0]["workloads"]}


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
    result = campaign_dir[1]["result"]
    assert result["status"] == "certified-feasible" and result["allocation"] == CERTIFIED_ALLOCATION
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
    d, built = campaign_dir
    m = read_table(d / "measurements.csv")
    # measurements.csv holds the journal's measured rows, in the journal's order: result.json's cells.
    assert [(r.workload, r.tp, r.load) for r in m.itertuples()] == [(c["workload"], c["tp"], c["load"]) for c in built["result"]["measured"]]
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
    # Each measured point's SLO verdict is its row against its class's SLO (the journal header's).
    slos = _slos(built["records"])
    verdict = {(r["workload"], r["tp"], r["load"]): _slo_ok(r, slos[r["workload"]]) for r in m.to_dict("records")}
    assert dict(zip(zip(cap["workload"], cap["tp"], cap["load"], strict=True), cap["slo_ok"], strict=True)) == verdict
    # The design's chat TP2@C32 (TTFT p99 2.9 s > 2 s) is one that violates; the committed cells do not.
    assert ("chat", 2, "C32") in {k for k, ok in verdict.items() if not ok}
    assert all(verdict[(w, a["tp"], a["load"])] for w, a in built["result"]["allocation"].items())


def test_capacity_curve_is_max_over_slo_feasible_loads(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    d, built = campaign_dir
    slos = _slos(built["records"])
    b = pd.read_csv(d / "bounds.csv")
    curves = report.figures["fig-capacity"].data["curves"].set_index(["workload", "tp"])
    assert len(curves) == 6
    for (w, tp), g in b.groupby(["workload", "tp"]):
        slo = slos[w]
        # Conservative: the loads whose pessimistic bounds meet the SLO, at their lower throughput.
        ok = g[(g["success_lo"] >= slo["success_min"]) & (g["ttft_p99_hi"] <= slo["ttft_p99_s"])
               & ((g["completion_p99_hi"] <= slo["completion_p99_s"]) if slo.get("completion_p99_s") is not None else True)]
        if len(ok):
            best = ok.loc[(ok["throughput_lo"] / tp).idxmax()]
            assert curves.loc[(w, tp), "lo_load"] == best["load"], (w, tp)
            assert curves.loc[(w, tp), "lo"] == pytest.approx(best["throughput_lo"] / tp)
        else:
            assert np.isnan(curves.loc[(w, tp), "lo"])
        assert curves.loc[(w, tp), "any_slo"] == pytest.approx((g["throughput_hi"] / tp).max())
    m = read_table(d / "measurements.csv").set_index(["workload", "tp", "load"])
    chosen = report.figures["fig-capacity"].data["chosen"].set_index("workload")
    why = report.html[report.html.index('<ul id="why">'):]
    for w, a in built["result"]["allocation"].items():
        row = m.loc[(w, a["tp"], a["load"])]  # every committed cell is measured
        assert chosen.loc[w, "per_gpu_rps"] == pytest.approx(row["throughput_rps"] / a["tp"])
        cap = a["replicas"] * row["throughput_rps"]
        demand = next(x["demand_rps"] for x in built["records"][0]["workloads"] if x["name"] == w)
        assert (f"{a['replicas']} × TP{a['tp']}@{a['load']} = {a['replicas'] * a['tp']} GPUs; capacity {cap:.2f} req/s "
                f"for a demand of {demand:g} req/s (fulfillment {min(1.0, cap / demand):.3f})") in why
    # chat: 2 × TP4@C96, each measured at 6.596 req/s; its completion p99 15.98 s against 30 s.
    assert "2 × TP4@C96 = 8 GPUs; capacity 13.19 req/s for a demand of 12 req/s (fulfillment 1.000)" in why
    assert "completion p99 15.98 s ≤ 30 s" in why
    knee = report.figures["fig-capacity"].data["knee"].set_index("workload")["tp"]
    assert set(knee.index) == {"chat", "code"}


def test_gap_figure_data_and_certificate(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    rounds = [r for r in campaign_dir[1]["records"] if r["type"] == "round"]
    meas = [r for r in campaign_dir[1]["records"] if r["type"] == "measurement"]
    d = report.figures["fig-gap"].data
    assert d["rounds"]["gpu_seconds"].tolist() == [r["gpu_seconds"] for r in rounds]
    assert d["rounds"]["min_fulfillment"].tolist() == [r["gap"]["min_fulfillment"] for r in rounds]
    assert d["certificate"]["round"].tolist() == [rounds[-1]["round"]]
    assert d["certificate"]["certificate"].tolist() == ["certified-feasible"]
    # The last round's spend is the whole campaign's: every measurement's GPU-seconds, result.json's total.
    assert rounds[-1]["gpu_seconds"] == sum(r["gpu_seconds"] for r in meas) == campaign_dir[1]["result"]["gpu_seconds"] == CERTIFIED_GPU_SECONDS
    assert np.all(np.diff(d["rounds"]["gpu_seconds"]) >= 0)


def test_diagnostics_pick_low_dimensional_vars(written: tuple[Path, Any], campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    _, report = written
    fit = campaign_dir[1]["result"]["certificate"]["diagnostics"]
    v = report.figures["fig-diagnostics"].data["variables"]
    names = v["variable"].tolist()
    assert names[0] == "knee"
    assert not {"latent", "capacity", "class_z", "y"} & set(names)
    # The certifying fit's chains and draws (result.json), as rank plots.
    assert set(v["kind"]) == {"rank"} and set(v["n_chains"]) == {fit["chains"]} and fit["chains"] >= 2
    assert set(v["n_draws"]) == {fit["draws"]}
    p = _parse(report.html)
    assert "diagnostics-table" in report.html and p.errors == []


def test_report_cli_on_interrupted_campaign_without_posterior(shipped_runs: Runs, tmp_path: Path) -> None:
    """A campaign killed after round 2 (no result.json), then cut mid-write by a kill and
    before its first posterior.nc: a partial last journal line and no posterior."""
    from fleetsieve_bayes.cli import main

    d = copy_run(shipped_runs.killed, tmp_path / "c")
    (d / "posterior.nc").unlink()  # bounds.csv is written before posterior.nc: a kill between them
    with open(d / "journal.jsonl", "a") as fh:
        fh.write('{"type":"measurement","seq":')  # a write cut by a kill
    out = tmp_path / "sub" / "r.html"
    assert main(["report", str(d), "--out", str(out), "--campaign", str(CAMPAIGN)]) == 0
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    p = _parse(text)
    assert p.errors == []
    assert set(p.figures) == {"fig-gap", "fig-capacity", "fig-tails", "fig-allocations"}
    assert ("final", "chat", "tp") not in p.cells  # no result.json → no final column
    last = [r for r in journal(d) if r["type"] == "round"][-1]
    assert last["round"] == 2
    for w, a in last["conservative"]["allocation"].items():
        assert p.cells[("conservative", w, "tp")] == str(a["tp"]) and p.cells[("conservative", w, "replicas")] == str(a["replicas"])
    assert "No posterior.nc yet" in text
    assert f"SLOs from: campaign file {CAMPAIGN}" in text  # --campaign overrides the header's SLOs
    assert main(["report", str(tmp_path / "nope")]) == 2


def test_report_of_the_killed_run_reads_its_journal(shipped_runs: Runs, tmp_path: Path) -> None:
    from fleetsieve_bayes.reporting.report import write_report

    d = copy_run(shipped_runs.killed, tmp_path / "c")
    _, report = write_report(d)
    rounds = [r for r in journal(d) if r["type"] == "round"]
    gap = report.figures["fig-gap"].data["rounds"]
    assert gap["gpu_seconds"].tolist() == [r["gpu_seconds"] for r in rounds] and len(rounds) == 2
    assert "SLOs from: journal header" in report.html
    cert = report.figures["fig-gap"].data["certificate"]
    assert cert["round"].tolist() == [2] and cert["certificate"].tolist() == ["undecided"]  # nothing certified yet


def test_report_errors_are_one_line(shipped_runs: Runs, tmp_path: Path) -> None:
    from fleetsieve_bayes.reporting.report import write_report

    with pytest.raises(InputError, match="no journal.jsonl"):
        write_report(tmp_path)
    d = copy_run(shipped_runs.certified, tmp_path / "c")
    (d / "bounds.csv").write_text("workload,tp\nchat,2\n")
    with pytest.raises(InputError, match=r"bounds\.csv: missing column\(s\) load"):
        write_report(d)


def test_the_campaign_is_what_run_writes(campaign_dir: tuple[Path, dict[str, Any]]) -> None:
    """The directory the report, status, plan and verify tests read: the journal header at the
    writer's version, with its fingerprint, the candidates and each window's replicate."""
    from fleetsieve_bayes.campaign.journal import HEADER_VERSION

    d, built = campaign_dir
    header = built["records"][0]
    assert header["type"] == "header" and header["version"] == HEADER_VERSION
    assert {"campaign", "prior_card", "table"} <= set(header["fingerprint"])
    assert len(header["cells"]) == CANDIDATES == built["result"]["candidates"]
    assert all(r["replicate"] == 0 for r in built["records"] if r["type"] == "measurement")
    assert built["result"]["measured"] == [{**r["cell"], "replicate": 0} for r in built["records"] if r["type"] == "measurement"]


def test_report_module_does_not_import_jax() -> None:
    code = (
        "import sys; import fleetsieve_bayes.reporting.report, fleetsieve_bayes.commands.status, fleetsieve_bayes.commands.report; "
        "assert 'jax' not in sys.modules and 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if m in ('jax', 'matplotlib'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
