"""``fleetsieve-bayes allocate``: JSON contract, demand scales, solvers, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from installed_entry_point import console_script

from fleetsieve_bayes.cli import main
from fleetsieve_bayes.resources import data_dir

EXAMPLE_DIR = data_dir("examples") / "h100_31b_fp8"
CAMPAIGN = EXAMPLE_DIR / "campaign.toml"
TP4_C96_X2 = {"tp": 4, "load": "C96", "replicas": 2}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(["allocate", str(CAMPAIGN), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_allocate_json_exact_contract(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys)
    assert out == {
        "status": "feasible",
        "allocation": {"chat": TP4_C96_X2, "code": TP4_C96_X2},
        "objective": {"min_fulfillment": 1.0, "goodput_rps": 28.0, "gpus_used": 16},
    }


def test_allocate_several_scales(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "--demand-scale", "0.7,1.0,1.3")
    assert isinstance(out, list) and [r["demand_scale"] for r in out] == [0.7, 1.0, 1.3]
    assert out[0]["allocation"]["chat"] == {"tp": 4, "load": "C64", "replicas": 2}
    assert out[0]["objective"]["goodput_rps"] == pytest.approx(19.6)
    assert out[2]["objective"]["min_fulfillment"] == pytest.approx(13.192 / 15.6)
    assert out[2]["objective"]["goodput_rps"] == pytest.approx(33.992)
    assert {r["status"] for r in out} == {"feasible"}


def test_allocate_jax_solver_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_json(capsys, "--solver", "jax") == run_json(capsys, "--solver", "milp")


def test_allocate_infeasible_and_explicit_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both classes critical at full demand on 8 GPUs: 8 + 8 needed → infeasible.
    text = CAMPAIGN.read_text().replace("gpus = 16", "gpus = 8")
    text = text.replace('name = "chat"', 'name = "chat"\ncritical = true')
    text = text.replace('name = "code"', 'name = "code"\ncritical = true')
    text = text.replace('table = "grid.csv"', 'table = "t.csv"')
    shutil.copy(EXAMPLE_DIR / "grid.csv", tmp_path / "t.csv")
    (tmp_path / "c.toml").write_text(text)
    assert main(["allocate", str(tmp_path / "c.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "infeasible" and out["allocation"] is None
    # --table overrides the campaign's table; TP8-only rows at 16 GPUs (hand-derived in
    # test_allocation_milp.py): chat TP8@C128 ×1, code TP8@C96 ×1, min 0.696.
    rows = (EXAMPLE_DIR / "grid.csv").read_text().splitlines()
    (tmp_path / "tp8.csv").write_text(
        "\n".join([rows[0]] + [r for r in rows[1:] if r.split(",")[1] == "8"])
    )
    out = run_json(capsys, "--table", str(tmp_path / "tp8.csv"))
    assert out["allocation"] == {
        "chat": {"tp": 8, "load": "C128", "replicas": 1},
        "code": {"tp": 8, "load": "C96", "replicas": 1},
    }
    assert out["objective"]["min_fulfillment"] == pytest.approx(0.696)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["missing.toml"], "campaign file not found"),
        (["CAMPAIGN", "--table", "nope.csv"], "nope.csv: measurement table not found"),
        (["CAMPAIGN", "--demand-scale", "1,-2"], "--demand-scale"),
        (["CAMPAIGN", "--table", "BADTABLE"], "no rows for workload 'code'"),
    ],
)
def test_allocate_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    rows = (EXAMPLE_DIR / "grid.csv").read_text().splitlines()
    bad = tmp_path / "chat_only.csv"
    bad.write_text("\n".join([rows[0]] + [r for r in rows[1:] if r.startswith("chat,")]))
    argv = [str(CAMPAIGN) if a == "CAMPAIGN" else str(bad) if a == "BADTABLE" else a for a in argv]
    assert main(["allocate", *argv, "--json"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_allocate_readable_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allocate", str(CAMPAIGN), "--demand-scale", "0.7,1.3"]) == 0
    out = capsys.readouterr().out
    assert "TP4@C64 ×2" in out and "TP4@C96 ×2" in out and "0.846" in out


def test_console_script() -> None:
    """The installed ``fleetsieve-bayes`` script itself (never ``python -m`` in its place)."""
    proc = subprocess.run(
        [*console_script(), "allocate", str(CAMPAIGN), "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["objective"] == {
        "min_fulfillment": 1.0,
        "goodput_rps": 28.0,
        "gpus_used": 16,
    }
