"""Ranked alternatives: result.json's ``alternatives``, the journal record they come from,
``status``, the report, ``plan --alternative K`` and ``[stopping] alternatives``.

The campaign ones read the session's run of the shipped campaign at ``"point"``
(tests/campaign_dirs.py: made at session start by the installed package), which
certifies chat and code TP4@C96 ×2 at 10,800 GPU-seconds.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from campaign_dirs import CERTIFIED_ALLOCATION, Runs, copy_run, journal
from rich.console import Console
from shipped import point_text

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.directory import fleet_words, load_campaign_dir
from fleetsieve_bayes.campaign.journal import RoundRecord
from fleetsieve_bayes.campaign.outputs import alternatives_json
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.commands.status import render_status, status_json
from fleetsieve_bayes.decision.alternatives import rank_alternatives
from fleetsieve_bayes.decision.joint_check import check_candidates, joint_check
from fleetsieve_bayes.deploy.plan import read_plan
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.reporting.report import build_report, read_bounds, read_measurements


@pytest.fixture(scope="module")
def finished(shipped_runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A copy of the certified run and its result.json."""
    d = copy_run(shipped_runs.certified, tmp_path_factory.mktemp("finished"))
    return d, json.loads((d / "result.json").read_text())


def _committed(alloc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(({"workload": w, "tp": a["tp"], "load": a["load"]} for w, a in alloc.items() if a["replicas"]),
                  key=json.dumps)


# --- result.json on the shipped campaign ---------------------------------------------------


def test_the_first_alternative_is_the_certified_allocation_on_the_attempts_draws(
    finished: tuple[Path, dict[str, Any]],
) -> None:
    _, result = finished
    alts = result["alternatives"]
    assert result["status"] == "certified-feasible" and result["allocation"] == CERTIFIED_ALLOCATION
    assert 2 <= len(alts) <= 5
    first = alts[0]
    assert first["rank"] == 1 and first["allocation"] == CERTIFIED_ALLOCATION
    assert first["gpus"] == 16 and "usd_per_hour" not in first  # one unpriced pool
    # The same draws and seed as the certification attempt's joint check: its numbers.
    assert first["p_epsilon_optimal"] == result["certificate"]["p_epsilon_optimal"]
    assert first["p_slo_met"] == result["certificate"]["p_slo_met"]
    assert result["alternatives_draws"] == {"posterior": "certifying", "draws": result["certificate"]["diagnostics"]["draws"] * result["certificate"]["diagnostics"]["chains"]}


def test_alternatives_are_distinct_and_ranked_by_p_epsilon_optimal(finished: tuple[Path, dict[str, Any]]) -> None:
    _, result = finished
    alts = result["alternatives"]
    assert [a["rank"] for a in alts] == list(range(1, len(alts) + 1))
    keys = [json.dumps(a["allocation"], sort_keys=True) for a in alts]
    assert len(set(keys)) == len(keys)
    p = [a["p_epsilon_optimal"] for a in alts]
    assert p == sorted(p, reverse=True) and all(0.0 <= x <= 1.0 for x in p)
    for a in alts:
        assert 0.0 <= a["p_slo_met"] <= 1.0
        assert a["gpus"] == sum(e["tp"] * e["replicas"] for e in a["allocation"].values() if e["replicas"])
    for a, b in zip(alts, alts[1:], strict=False):  # a tie goes to fewer GPUs
        assert a["p_epsilon_optimal"] > b["p_epsilon_optimal"] or a["gpus"] <= b["gpus"]


def test_each_alternative_splits_its_cells_into_measured_and_predicted(finished: tuple[Path, dict[str, Any]]) -> None:
    _, result = finished
    measured = {json.dumps({k: m[k] for k in ("workload", "tp", "load")}, sort_keys=True) for m in result["measured"]}
    for a in result["alternatives"]:
        cells = sorted(a["measured_cells"] + a["predicted_cells"], key=json.dumps)
        assert cells == _committed(a["allocation"])
        assert all(json.dumps(c, sort_keys=True) in measured for c in a["measured_cells"])
        assert not any(json.dumps(c, sort_keys=True) in measured for c in a["predicted_cells"])
    first = result["alternatives"][0]
    assert first["predicted_cells"] == [] and sorted(first["measured_cells"], key=json.dumps) == _committed(CERTIFIED_ALLOCATION)
    assert any(a["predicted_cells"] for a in result["alternatives"][1:])  # the others lean on predictions


def test_the_final_round_record_keeps_them_and_a_rerun_writes_the_same(
    finished: tuple[Path, dict[str, Any]], tmp_path: Path,
) -> None:
    d, result = finished
    final = [r for r in journal(d) if r["type"] == "round"][-1]
    assert final["outcome"] == "certified-feasible"
    assert final["alternatives"]["ranked"] == result["alternatives"]
    assert RoundRecord.from_json(final).alternatives == final["alternatives"]
    again = copy_run(d, tmp_path / "again")
    campaign = tmp_path / "campaign.toml"
    grid = Path(__file__).resolve().parent.parent / "examples" / "h100_31b_fp8" / "grid.csv"
    campaign.write_text(point_text().replace('table = "grid.csv"', f'table = "{grid}"'))
    run = subprocess.run([sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(again), "--quiet"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rerun = json.loads((again / "result.json").read_text())
    assert rerun["alternatives"] == result["alternatives"] and rerun["alternatives_draws"] == result["alternatives_draws"]


def test_zero_or_an_older_journal_gives_null_and_fewer_are_cut() -> None:
    rec = SimpleNamespace(alternatives={"posterior": "round", "draws": 400, "ranked": [{"rank": 1}, {"rank": 2}]})
    assert alternatives_json(SimpleNamespace(alternatives=0), rec) == {"alternatives": None, "alternatives_draws": None}
    assert alternatives_json(SimpleNamespace(alternatives=5), SimpleNamespace(alternatives=None))["alternatives"] is None
    cut = alternatives_json(SimpleNamespace(alternatives=1), rec)
    assert cut == {"alternatives": [{"rank": 1}], "alternatives_draws": {"posterior": "round", "draws": 400}}


# --- status, report, plan ------------------------------------------------------------------


def _words(alt: dict[str, Any]) -> str:
    return fleet_words(alt["allocation"], ("chat", "code"))


def test_status_shows_the_ranking_in_text_and_json(finished: tuple[Path, dict[str, Any]]) -> None:
    d, result = finished
    view = load_campaign_dir(d)
    assert status_json(view)["alternatives"] == result["alternatives"]
    buf = io.StringIO()
    render_status(view, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "Alternatives (ranked by P(ε-optimal) on" in text and "certifying draws" in text
    assert _words(result["alternatives"][0]) == "chat TP4@C96 ×2, code TP4@C96 ×2"
    for a in result["alternatives"]:
        line = next(x for x in text.splitlines() if _words(a) in x)
        assert f"{a['p_epsilon_optimal']:.3f}" in line and f"{a['p_slo_met']:.3f}" in line and f" {a['gpus']} " in line
    second = result["alternatives"][1]
    pred = ", ".join(f"{c['workload']} TP{c['tp']}@{c['load']}" for c in second["predicted_cells"])
    assert pred in next(x for x in text.splitlines() if _words(second) in x)
    assert "none (all measured)" in next(x for x in text.splitlines() if _words(result["alternatives"][0]) in x)


def test_the_report_shows_the_ranking(finished: tuple[Path, dict[str, Any]]) -> None:
    d, result = finished
    view = load_campaign_dir(d)
    html = build_report(view, read_measurements(view), read_bounds(view, read_measurements(view)), None).html
    assert 'id="alternatives-table"' in html
    for a in result["alternatives"]:
        row = html.split(f'<tr data-rank="{a["rank"]}">', 1)[1].split("</tr>", 1)[0]
        assert _words(a) in row and f"{a['p_epsilon_optimal']:.3f}" in row and f">{a['gpus']}<" in row


def test_plan_alternative_2_plans_the_second_fleet(
    finished: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    d, result = finished
    second = result["alternatives"][1]
    out = tmp_path / "plan"
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), "--alternative", "2"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "[alternative 2, P(ε-optimal)" in printed.out
    plan = read_plan(out)
    got = {c["workload"]: {"tp": c["tp"], "load": c["load"], "replicas": c["replicas"]} for c in plan["classes"]}
    assert got == {w: a for w, a in second["allocation"].items() if a["replicas"]}
    assert plan["gpus_used"] == second["gpus"] and plan["alternative"]["rank"] == 2
    assert plan["alternative"]["p_epsilon_optimal"] == second["p_epsilon_optimal"]
    assert plan["certified"] is False and plan["status"] == "certified-feasible"
    launched = "".join(p.read_text() for p in sorted((out / "launch").glob("node_*.sh")))
    for w, a in got.items():
        assert launched.count(f"# {w} replica") == a["replicas"]
    assert "# UNCERTIFIED: alternative 2 of campaign" in launched
    assert "alternative 2 of campaign" in (out / "k8s" / "chat.yaml").read_text().splitlines()[0]
    # The first alternative is the certified allocation itself: a certified plan.
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(tmp_path / "p1"), "--alternative", "1"])
    assert rc == 0 and read_plan(tmp_path / "p1")["certified"] is True
    capsys.readouterr()


@pytest.mark.parametrize("k", ["0", "-1", "6"])
def test_an_alternative_out_of_range_is_one_line(
    finished: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str], k: str,
) -> None:
    d, result = finished
    k = k if k != "6" else str(len(result["alternatives"]) + 1)
    out = tmp_path / "plan"
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), "--alternative", k])
    err = capsys.readouterr().err
    n = len(result["alternatives"])
    assert rc == 2 and err.count("\n") == 1 and not out.exists()
    assert f"--alternative {k}: {d} ranks {n} alternative(s); choose 1 to {n}" in err


def test_a_directory_without_alternatives_is_refused_in_one_line(
    finished: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    d = copy_run(finished[0], tmp_path / "older")
    result = json.loads((d / "result.json").read_text())
    result["alternatives"] = None  # as a journal written before them, or alternatives = 0
    (d / "result.json").write_text(json.dumps(result))
    out = tmp_path / "plan"
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), "--alternative", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "ranks no alternatives" in err and not out.exists()
    buf = io.StringIO()
    render_status(load_campaign_dir(d), Console(file=buf, width=200))
    assert "Alternatives" not in buf.getvalue()


# --- [stopping] alternatives ---------------------------------------------------------------


def _campaign_file(tmp: Path, line: str) -> Path:
    grid = Path(__file__).resolve().parent.parent / "examples" / "h100_31b_fp8" / "grid.csv"
    path = tmp / "campaign.toml"
    text = point_text().replace('table = "grid.csv"', f'table = "{grid}"')
    path.write_text(text.replace("[stopping]\n", f"[stopping]\n{line}", 1))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("alternatives = -1\n", "[stopping] alternatives: must be >= 0, got -1"),
        ("alternatives = 2.5\n", "[stopping] alternatives: expected an integer, got 2.5"),
        ('alternatives = "all"\n', "[stopping] alternatives: expected an integer, got 'all'"),
    ],
)
def test_a_negative_or_non_integer_count_is_one_line_naming_file_and_field(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    path = _campaign_file(tmp_path, line)
    with pytest.raises(InputError) as exc:
        load_campaign(path)
    assert str(exc.value) == f"{path}: {message}"
    assert cli_main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {message}" in err


def test_the_count_defaults_to_five_and_zero_turns_it_off(tmp_path: Path) -> None:
    assert load_campaign(_campaign_file(tmp_path, "")).alternatives == 5
    off = load_campaign(_campaign_file(tmp_path, "alternatives = 0\n"))
    assert off.alternatives == 0 and off.settings.alternatives == 0


# --- the ranking itself, on a small grid ---------------------------------------------------

# One class, two TPs × two loads; cell 1 (TP2@hi) meets its TTFT limit in a share of the draws.
GRID = CellGrid(
    workloads=("chat",), workload_idx=np.zeros(4, np.int64), tp=np.array([2, 2, 4, 4]),
    load=("lo", "hi", "lo", "hi"), offered_rps=np.array([1.0, 2.0, 1.0, 2.0]), duration_s=np.full(4, 300.0),
)
PROBLEM = AllocationProblem(
    demand=np.array([4.0]), critical=np.array([False]), floor=np.array([1.0]), success_min=np.array([0.99]),
    ttft_max=np.array([1.0]), completion_max=np.array([np.inf]), gpus=4,
)
N_DRAWS = 400
TINY = np.full((N_DRAWS, 4), 1e-4)


def _small(frac_good: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    base = np.array([[1.0, 0.5, 5.0, 0.999], [2.0, 0.5, 5.0, 0.999], [1.0, 0.3, 5.0, 0.999], [1.5, 3.0, 9.0, 0.999]])
    lat = np.broadcast_to(base, (N_DRAWS, 4, 4)).copy()
    lat[np.arange(N_DRAWS) >= int(frac_good * N_DRAWS), 1, 1] = 3.0
    measured = np.array([True, False, True, True])
    obs = np.where(measured[:, None], lat[0], np.nan)
    answer = allocate_milp(GRID, np.where(measured[:, None], lat[-1], [0, np.inf, np.inf, 0]), PROBLEM)
    return lat, obs, measured, answer


def test_the_ranking_adds_the_draws_optima_and_agrees_with_the_joint_check() -> None:
    lat, obs, measured, answer = _small(0.97)
    assert answer.committed() == [0] and int(answer.replicas[0]) == 2  # TP2@lo ×2: half the demand
    ranked, draws = rank_alternatives(GRID, PROBLEM, [answer, answer, None], lat, TINY, obs, measured, 0.05,
                                      count=3, seed=1)
    assert draws == N_DRAWS and len(ranked) == 2  # the answer and TP2@hi ×2, the draws' other optimum
    best, other = ranked
    assert best.allocation.committed() == [1] and best.p_epsilon_optimal == pytest.approx(0.97)
    assert other.allocation.committed() == [0] and other.p_epsilon_optimal == pytest.approx(0.03)
    for alt in ranked:
        jc = joint_check(GRID, PROBLEM, alt.allocation, lat, TINY, obs, measured, 0.05, seed=1)
        assert (alt.p_epsilon_optimal, alt.p_slo_met) == (jc.p_epsilon_optimal, jc.p_slo_met)
    assert [a.allocation.gpus_used for a in ranked] == [4, 4] and best.allocation.usd_per_hour is None
    checks = check_candidates(GRID, PROBLEM, np.array([[0]]), np.array([[2]]), lat, TINY, obs, measured, 0.05, seed=1)
    assert checks.optimum_cell.shape == (N_DRAWS, 1) and set(checks.optimum_cell[:, 0]) == {0, 1}


def test_ties_go_to_fewer_gpus_then_to_the_cells_in_order() -> None:
    lat, obs, measured, answer = _small(0.5)
    ranked, _ = rank_alternatives(GRID, PROBLEM, [answer], lat, TINY, obs, measured, 0.05, count=5, seed=1)
    assert [a.p_epsilon_optimal for a in ranked] == [0.5, 0.5]
    assert [a.allocation.committed() for a in ranked] == [[0], [1]]  # equal GPUs: cell 0 first
    one, _ = rank_alternatives(GRID, PROBLEM, [answer], lat, TINY, obs, measured, 0.05, count=1, seed=1)
    assert len(one) == 1 and one[0].allocation.committed() == [0]
