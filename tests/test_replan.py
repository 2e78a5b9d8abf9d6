"""A campaign directory is resumed only by the campaign that started it; a changed campaign
re-plans from the old measurements (`run --reuse-measurements`) or from `[measurement]
seed_tables`; a successful run keeps stderr quiet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_campaign import cli, write_tiny

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.fingerprint import fingerprint, mismatch, reuse_refusal
from fleetsieve_bayes.campaign.journal import read_records
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.inference import load_preset
from fleetsieve_bayes.resources import data_dir

CARD = data_dir("priors") / "dense-31b-fp8-h100.toml"


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, str]:
    """A tiny campaign run to its end by the CLI in a fresh process with a fresh user cache."""
    folder = tmp_path_factory.mktemp("tiny")
    campaign = write_tiny(folder)
    out = folder / "old"
    # A fresh XDG cache makes ArviZ want to print its once-a-day notice.
    done = cli("run", str(campaign), "--out", str(out), "--quiet", env={"XDG_CACHE_HOME": str(folder / "xdg")})
    assert done.returncode == 0, done.stderr[-2000:]
    return campaign, out, json.loads((out / "result.json").read_text()), done.stderr


def test_stderr_is_quiet_on_a_successful_run(finished: tuple[Path, Path, dict, str]) -> None:
    *_, stderr = finished
    assert stderr == ""


def _fp(campaign: Path, **kw: object) -> tuple[dict, dict]:
    from fleetsieve_bayes.campaign.fingerprint import campaign_inputs
    from fleetsieve_bayes.model.priors import card_path

    c = load_campaign(campaign)
    fp = fingerprint(c, card_file=card_path(c.family), preset=load_preset(c.inference),
                     strategy=str(kw.get("strategy", "fleetsieve")), seed=int(kw.get("seed", 0)))  # type: ignore[arg-type]
    return fp, campaign_inputs(c)


def test_changed_demand_is_refused_naming_the_field(
    finished: tuple[Path, Path, dict, str], tmp_path: Path
) -> None:
    campaign, out, _, _ = finished
    before = (out / "journal.jsonl").read_bytes()
    changed = write_tiny(campaign.parent, name="busier.toml", chat_demand=7.8)
    with pytest.raises(InputError, match=r"changed: campaign \(workloads\.chat\.demand_rps: 6\.0 → 7\.8\)"):
        run_campaign(load_campaign(changed), out)
    assert (out / "journal.jsonl").read_bytes() == before
    proc = cli("run", str(changed), "--out", str(out), "--quiet")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--reuse-measurements" in proc.stderr


def test_every_decision_input_is_fingerprinted(tmp_path: Path) -> None:
    """Card content, preset, table content, seed and strategy changes are each named."""
    a = tmp_path / "a"
    shutil.copytree(data_dir("priors"), a / "cards")
    base = write_tiny(a, family="cards/dense-31b-fp8-h100.toml")
    fp0, in0 = _fp(base)
    assert mismatch(fp0, *(_fp(base)[:1]), in0, in0) is None

    def changed(edit: str, text: str, new: str) -> str | None:
        p = a / edit
        old = p.read_text()
        p.write_text(old.replace(text, new, 1))
        try:
            fp, inputs = _fp(base)
            return mismatch(fp0, fp, in0, inputs)
        finally:
            p.write_text(old)

    text = (a / "cards/dense-31b-fp8-h100.toml").read_text()
    assert changed("cards/dense-31b-fp8-h100.toml", text, text + "\n# edited\n") == "prior card content"
    assert changed("tiny-svi.toml", "steps = 600", "steps = 800") == "inference preset"
    assert changed("tiny-certify.toml", "samples = 400", "samples = 500") == "certifying inference preset"
    assert changed("grid.csv", "0.82", "0.83") == "replay table content"
    assert changed("campaign.toml", "epsilon = 0.05", "epsilon = 0.1") == "campaign (stopping.epsilon: 0.05 → 0.1)"
    # The SLO-attainment rule and the window cap decide too: a directory started at "point"
    # does not resume at 0.9 (nor one started before the default level changed).
    assert changed("campaign.toml", 'slo_attainment = "point"', "slo_attainment = 0.9") == (
        'campaign (stopping.slo_attainment: "point" → 0.9)')
    assert changed("campaign.toml", "epsilon = 0.05", "epsilon = 0.05\nmax_windows_per_cell = 2") == (
        "campaign (stopping.max_windows_per_cell: 5 → 2)")
    fp_seed, _ = _fp(base, seed=3)
    assert mismatch(fp0, fp_seed, in0, in0, old_seed=0) == "seed (0 → 3)"
    fp_s, _ = _fp(base, strategy="random")
    assert mismatch(fp0, fp_s, in0, in0, old_strategy="fleetsieve") == "strategy (fleetsieve → random)"
    # What re-planning may change, and what it may not.
    fp_d, in_d = _fp(write_tiny(a, name="d.toml", chat_demand=20.0, gpus=12))
    assert reuse_refusal(fp0, fp_d, in0, in_d) is None
    # The interval rules read measurements differently; the measurements stand.
    ruled = write_tiny(a, name="r.toml")
    ruled.write_text(ruled.read_text().replace("[measurement]", "knee_guard = 0\nsuccess_margin = 0.3\n\n[measurement]", 1))
    fp_r, in_r = _fp(ruled)
    assert in_r["model"]["knee_guard"] == 0 and in_r["model"]["success_margin"] == 0.3
    assert reuse_refusal(fp0, fp_r, in0, in_r) is None
    assert "model.knee_guard" in (mismatch(fp0, fp_r, in0, in_r) or "")
    (a / "grid2.csv").write_text((a / "grid.csv").read_text().replace("0.82", "0.83"))
    other = write_tiny(a, name="t.toml")
    other.write_text(other.read_text().replace('"grid.csv"', '"grid2.csv"'))
    fp_t, in_t = _fp(other)
    assert reuse_refusal(fp0, fp_t, in0, in_t) == "its replay table content differs"


def test_reuse_measurements_replans_for_a_new_demand(
    finished: tuple[Path, Path, dict, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    campaign, old, old_result, _ = finished
    busier = write_tiny(campaign.parent, name="replan.toml", chat_demand=6.0 * 1.3, gpus=10)
    new = tmp_path / "new"
    from fleetsieve_bayes import cli as cli_main

    rc = cli_main.main(["run", str(busier), "--out", str(new), "--json", "--reuse-measurements", str(old)])
    stdout, stderr = capsys.readouterr()
    assert rc == 0, stderr[-2000:]
    result = json.loads(stdout)
    records, _ = read_records(new / "journal.jsonl")
    header, meas = records[0], [r for r in records if hasattr(r, "row")]
    assert header.reused_from["directory"] == str(old.resolve())
    assert header.reused_from["measurements"] == len(old_result["measured"])
    assert header.workloads[0]["demand_rps"] == pytest.approx(7.8)  # the header keeps the new demand
    seeded = [r for r in meas if r.seeded]
    assert [{**r.cell.to_json(), "replicate": r.replicate} for r in seeded] == old_result["measured"]
    assert all(r.gpu_seconds == 0.0 and r.phase == "seed" for r in seeded)
    assert result["seeded"] == old_result["measured"]
    assert result["measured"][: len(seeded)] == old_result["measured"]
    assert result["gpu_seconds"] == pytest.approx(sum(r.gpu_seconds for r in meas if not r.seeded))
    assert result["reused_from"] == str(old.resolve())
    # The re-plan resumes like any campaign (no flag needed), and appends nothing more.
    before = (new / "journal.jsonl").read_bytes()
    again = run_campaign(load_campaign(busier), new)
    assert (new / "journal.jsonl").read_bytes() == before
    assert again.result["allocation"] == result["allocation"]
    # Re-planning into the old directory itself, or from another table, is refused.
    with pytest.raises(InputError, match="that is --out itself"):
        run_campaign(load_campaign(busier), old, reuse_measurements=old)


def test_reuse_is_refused_when_a_measurement_input_changed(
    finished: tuple[Path, Path, dict, str], tmp_path: Path
) -> None:
    campaign, old, _, _ = finished
    other = write_tiny(tmp_path / "other")
    (other.parent / "grid.csv").write_text((other.parent / "grid.csv").read_text().replace("0.82", "0.81"))
    proc = cli("run", str(other), "--out", str(tmp_path / "n"), "--quiet", "--reuse-measurements", str(old))
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("cannot re-plan from that campaign: its replay table content differs")
    assert not (tmp_path / "n").exists()


SEED = """workload,tp,load,offered_rps,throughput_rps,ttft_p99_s,completion_p99_s,success_rate,duration_s
other,2,C1,1.0,1.0,1.0,1.0,1.0,300
chat,4,C96,9.6,8.9,1.5,24.0,0.992,300
code,4,C96,9.6,8.7,3.0,22.0,0.991,300
"""


def test_seed_tables_enter_as_measured_cells_at_no_cost(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    campaign = write_tiny(folder, measurement_extra='seed_tables = ["old/week1.csv"]')
    (folder / "old").mkdir()
    (folder / "old" / "week1.csv").write_text(SEED)
    out = tmp_path / "o"
    result = run_campaign(load_campaign(campaign), out).result
    records, _ = read_records(out / "journal.jsonl")
    meas = [r for r in records if hasattr(r, "row")]
    seeded = [r for r in meas if r.seeded]
    # Rows of other workloads are not this campaign's; the two others come first, free.
    assert [r.cell.label for r in seeded] == ["chat TP4@C96", "code TP4@C96"]
    assert [r.source for r in seeded] == [f"seed table {folder / 'old' / 'week1.csv'} line {n}" for n in (3, 4)]
    assert all(r.gpu_seconds == 0.0 and r.phase == "seed" and r.round == 0 for r in seeded)
    assert result["seeded"] == [{**r.cell.to_json(), "replicate": r.replicate} for r in seeded]
    assert result["gpu_seconds"] == pytest.approx(sum(r.gpu_seconds for r in meas if not r.seeded))
    assert result["gpu_seconds"] < 6000.0  # without the seeds: 5 cells x 1200


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (SEED.replace("8.9", "89"), "week1.csv: line 3, column 'throughput_rps'"),
        (SEED.replace("0.992", "1.5"), "week1.csv: line 3, column 'success_rate'"),
        (SEED.replace("chat,4,C96", "chat,8,C96"), "cell chat TP8@C96 is not a candidate"),
    ],
    ids=["throughput-above-offered", "success-above-1", "not-a-candidate"],
)
def test_seed_tables_are_validated_like_any_table(
    tmp_path: Path, text: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetsieve_bayes import cli as cli_main

    folder = tmp_path / "c"
    campaign = write_tiny(folder, measurement_extra='seed_tables = ["week1.csv"]')
    (folder / "week1.csv").write_text(text)
    rc = cli_main.main(["run", str(campaign), "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert f"{campaign}: [measurement] " in line and says in line
    assert not (tmp_path / "o").exists()
