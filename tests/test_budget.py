"""The profiling budget: ``[stopping] max_gpu_seconds`` and ``max_wall_s``.

The shipped campaign at ``"point"``: its initial design costs 8,400 GPU-seconds; round 1
measures code TP4@C96 (1,200) and round 2 picks chat TP4@C96 (1,200 more), which a budget
of 9,600 does not admit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from campaign_dirs import CERTIFIED_ALLOCATION, CERTIFIED_CELLS, CERTIFIED_GPU_SECONDS
from shipped import point_text

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.cli import main
from fleetsieve_bayes.errors import InputError

GRID = Path(__file__).resolve().parent.parent / "examples" / "h100_31b_fp8" / "grid.csv"


def _campaign_file(tmp: Path, extra: str = "", name: str = "campaign.toml", measurement: str = "") -> Path:
    text = point_text().replace('table = "grid.csv"', f'table = "{GRID}"{measurement}')
    text = text.replace("[stopping]\n", f"[stopping]\n{extra}", 1)
    path = tmp / name
    path.write_text(text)
    return path


def _trail(result: dict) -> tuple:
    rounds = [(r["round"], r["outcome"], r["gpu_seconds"], json.dumps(r["chosen"], sort_keys=True),
               json.dumps(r["gap"], sort_keys=True))
              for r in map(json.loads, (Path(result["_dir"]) / "journal.jsonl").read_text().splitlines())
              if r["type"] == "round"]
    return (result["status"], result["gpu_seconds"], json.dumps(result["measured"]),
            json.dumps(result["allocation"], sort_keys=True), tuple(rounds))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_gpu_seconds = 0\n", "[stopping] max_gpu_seconds: must be > 0, got 0"),
        ("max_gpu_seconds = -5\n", "[stopping] max_gpu_seconds: must be > 0, got -5"),
        ("max_wall_s = 0.0\n", "[stopping] max_wall_s: must be > 0, got 0.0"),
        ('max_gpu_seconds = "lots"\n', "[stopping] max_gpu_seconds: expected a number, got 'lots'"),
    ],
)
def test_a_zero_negative_or_non_numeric_budget_is_one_line_naming_file_and_field(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _campaign_file(tmp_path, line)
    with pytest.raises(InputError) as exc:
        load_campaign(path)
    assert str(exc.value) == f"{path}: {message}"
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: {message}" in err


def test_a_budget_below_the_initial_design_is_refused_before_the_directory_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _campaign_file(tmp_path, "max_gpu_seconds = 8000\n")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (f"fleetsieve-bayes run: error: {path}: [stopping] max_gpu_seconds: 8000 is less than the "
                   f"initial design's cost (8,400 GPU-seconds, 6 cells); give at least 8400\n")
    assert not out.exists()


def test_a_wall_budget_below_the_initial_design_is_refused(tmp_path: Path) -> None:
    path = _campaign_file(tmp_path, "max_wall_s = 600\n")
    with pytest.raises(InputError, match=r"\[stopping\] max_wall_s: 600 is less than the initial design's wall "
                                         r"clock \(1,800 s\); give at least 1800$"):
        run_campaign(load_campaign(path), tmp_path / "out")


def test_the_budget_is_fingerprinted_only_when_set(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.fingerprint import campaign_digest, campaign_inputs

    plain = load_campaign(_campaign_file(tmp_path))
    capped = load_campaign(_campaign_file(tmp_path, "max_gpu_seconds = 9600\n", name="c.toml"))
    assert "max_gpu_seconds" not in campaign_inputs(plain)["stopping"]
    assert campaign_inputs(capped)["stopping"]["max_gpu_seconds"] == 9600.0
    assert campaign_digest(plain) != campaign_digest(capped)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("budget")
    path = _campaign_file(tmp, "max_gpu_seconds = 9600\n")
    out = tmp / "run"
    result = run_campaign(load_campaign(path), out, seed=0).result
    return tmp, out, {**result, "_dir": str(out)}


def test_the_shipped_campaign_capped_at_9600_ends_undecided_by_the_budget(capped: tuple[Path, Path, dict]) -> None:
    _, out, r = capped
    assert r["status"] == "undecided"
    assert r["stop_reason"] == "budget"
    assert r["gpu_seconds"] == 9600.0
    assert [(m["workload"], m["tp"], m["load"]) for m in r["measured"]][-1] == ("code", 4, "C96")
    b = r["budget"]
    assert (b["max_gpu_seconds"], b["max_wall_s"], b["gpu_seconds"], b["stopped"]) == (9600.0, None, 9600.0, True)
    assert b["next_cell"] == {"workload": "chat", "tp": 4, "load": "C96", "gpu_seconds": 1200.0, "duration_s": 300.0}
    first = b["next_cells"][0]
    assert (first["workload"], first["tp"], first["load"], first["chosen"], first["fits_budget"]) == (
        "chat", 4, "C96", True, False)
    # Round 2 rests on several hopes: no single cell narrows the gap on its own, and the
    # strategy measures the conservative allocation's unmeasured cell first (docs/method.md, §7).
    assert [c["expected_gap_reduction"] for c in b["next_cells"][1:]] == [0.0] * 4
    assert first["expected_gap_reduction"] == pytest.approx(-0.0046, abs=5e-4)  # a fantasy's noise, not a gain
    assert first["per_gpu_second"] == pytest.approx(first["expected_gap_reduction"] / 1200.0)
    assert [c["chosen"] for c in b["next_cells"]] == [True, False, False, False, False]
    assert [c["fits_budget"] for c in b["next_cells"]] == [False] * 5
    assert r["allocation"] is not None  # the usual uncertified answer: the conservative allocation
    assert r["answer"] == "conservative"


def test_status_shows_the_gpu_seconds_against_the_budget(capped: tuple[Path, Path, dict],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = capped
    assert main(["status", str(out)]) == 0
    assert "budget: GPU-seconds 9,600 of 9,600 — stopped by the budget" in capsys.readouterr().out
    assert main(["status", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["budget"]
    assert got == {"max_gpu_seconds": 9600.0, "max_wall_s": None, "gpu_seconds": 9600.0}


def test_a_resume_with_a_lower_budget_is_refused_and_the_same_budget_measures_nothing(
    capped: tuple[Path, Path, dict], tmp_path: Path
) -> None:
    tmp, out, r = capped
    lower = _campaign_file(tmp_path, "max_gpu_seconds = 9000\n")
    with pytest.raises(InputError) as exc:
        run_campaign(load_campaign(lower), out, seed=0)
    assert str(exc.value) == (f"{lower}: [stopping] max_gpu_seconds: 9000 is lower than the budget this campaign "
                              f"ran under (9600); a resume may only raise it")
    n = len((out / "journal.jsonl").read_text().splitlines())
    again = run_campaign(load_campaign(tmp / "campaign.toml"), out, seed=0).result
    assert (again["status"], again["gpu_seconds"], again["stop_reason"]) == ("undecided", 9600.0, "budget")
    assert len((out / "journal.jsonl").read_text().splitlines()) == n


def test_a_campaign_run_without_a_budget_refuses_one_on_resume(capped: tuple[Path, Path, dict], tmp_path: Path) -> None:
    _, out, _ = capped
    path = _campaign_file(tmp_path, "max_gpu_seconds = 99999\n", name="b.toml")
    with pytest.raises(InputError) as exc:
        run_campaign(load_campaign(path), _copy_without_budget(out, tmp_path), seed=0)
    assert str(exc.value) == (f"{path}: [stopping] max_gpu_seconds: 99999 is lower than the budget this campaign "
                              f"ran under (no limit); a resume may only raise it")


def _copy_without_budget(out: Path, tmp: Path) -> Path:
    """A copy of ``out`` whose header holds no budget and no other record (a campaign run
    without a budget, stopped after its header)."""
    dst = tmp / "nobudget"
    dst.mkdir()
    header = json.loads((out / "journal.jsonl").read_text().splitlines()[0])
    header["inputs"]["stopping"].pop("max_gpu_seconds")
    from fleetsieve_bayes.campaign.fingerprint import campaign_digest

    header["fingerprint"]["campaign"] = campaign_digest(load_campaign(_campaign_file(tmp, "", name="h.toml")))
    (dst / "journal.jsonl").write_text(json.dumps(header) + "\n")
    return dst


def test_a_raised_budget_goes_on_from_the_stop(capped: tuple[Path, Path, dict], tmp_path: Path) -> None:
    import shutil

    _, out, r = capped
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    raised = _campaign_file(tmp_path, "max_gpu_seconds = 10000\n")
    again = run_campaign(load_campaign(raised), copy, seed=0).result
    # Round 2 is decided again under the raised budget: its cell still does not fit.
    assert (again["stop_reason"], again["gpu_seconds"], again["budget"]["max_gpu_seconds"]) == ("budget", 9600.0, 10000.0)
    records = [json.loads(x) for x in (copy / "journal.jsonl").read_text().splitlines()]
    assert [x for x in records if x["type"] == "budget"] == [
        {"type": "budget", "max_gpu_seconds": 10000.0, "max_wall_s": None}]
    stops = [x["stop"]["budget"]["max_gpu_seconds"] for x in records if x["type"] == "round" and x.get("stop")]
    assert stops == [9600.0, 10000.0]
    # Lowering back to the first budget is now refused: the directory ran under 10,000.
    with pytest.raises(InputError, match=r"9600 is lower than the budget this campaign ran under \(10000\)"):
        run_campaign(load_campaign(_campaign_file(tmp_path, "max_gpu_seconds = 9600\n", name="b.toml")), copy)


def test_a_budget_that_does_not_bind_leaves_the_trail_identical(tmp_path: Path) -> None:
    plain = _campaign_file(tmp_path, "max_rounds = 1\n", name="plain.toml")
    generous = _campaign_file(tmp_path, "max_rounds = 1\nmax_gpu_seconds = 1e6\nmax_wall_s = 1e7\n", name="gen.toml")
    a = run_campaign(load_campaign(plain), tmp_path / "a", seed=0).result
    b = run_campaign(load_campaign(generous), tmp_path / "b", seed=0).result
    assert _trail({**a, "_dir": str(tmp_path / "a")}) == _trail({**b, "_dir": str(tmp_path / "b")})
    assert (a["stop_reason"], b["stop_reason"], a["budget"]) == ("max_rounds", "max_rounds", None)
    assert (b["budget"]["stopped"], b["budget"]["gpu_seconds"]) == (False, 9600.0)


def test_a_budget_that_never_binds_leaves_the_certified_run_as_without_one(shipped_runs: Any, tmp_path: Path) -> None:
    # Ten times the full grid's 30,600 GPU-seconds: the campaign runs to its certificate as the
    # session's certified run (no budget) does — the same cells in the same order, GPU-seconds,
    # profiling wall, decision, certificate and ranked alternatives; the budget only reports
    # what was spent.
    path = _campaign_file(tmp_path, "max_gpu_seconds = 306000\nmax_wall_s = 1e7\n")
    r = run_campaign(load_campaign(path), tmp_path / "run", seed=0).result
    plain = json.loads((shipped_runs.certified / "result.json").read_text())
    assert (r["status"], r["stop_reason"], plain["budget"]) == ("certified-feasible", "certificate", None)
    assert (r["allocation"], r["gpu_seconds"], len(r["measured"])) == (
        CERTIFIED_ALLOCATION, CERTIFIED_GPU_SECONDS, CERTIFIED_CELLS)
    for key in ("status", "stop_reason", "measured", "gpu_seconds", "profiling_wall_s", "allocation", "alternatives",
                "alternatives_draws"):
        assert r[key] == plain[key], key
    assert r["certificate"]["p_epsilon_optimal"] == plain["certificate"]["p_epsilon_optimal"]
    b = r["budget"]
    assert (b["stopped"], b["gpu_seconds"], b["profiling_wall_s"], b["next_cell"]) == (
        False, r["gpu_seconds"], r["profiling_wall_s"], None)


def test_the_pool_never_runs_past_the_budget(tmp_path: Path) -> None:
    path = _campaign_file(tmp_path, "max_gpu_seconds = 9600\n", measurement="\npool_gpus = 16")
    r = run_campaign(load_campaign(path), tmp_path / "pool", seed=0).result
    assert (r["status"], r["stop_reason"]) == ("undecided", "budget")
    assert r["gpu_seconds"] <= 9600.0
    assert r["cancelled"] == []
    assert r["budget"]["next_cell"]["gpu_seconds"] + r["gpu_seconds"] > 9600.0
