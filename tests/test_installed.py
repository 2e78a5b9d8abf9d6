"""The package carries its own data, and the installed wheel runs the Quickstart.

`.ci/run`'s wheel stage runs this file (and the other installed-package tests)
from a temporary folder against a wheel installed in a fresh virtual
environment, with ``FLEETSIEVE_EXPECT_INSTALLED=1``: there the package must be
imported from site-packages, never from the source tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from installed_entry_point import console_script

import fleetsieve_bayes
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.derive import load_architecture
from fleetsieve_bayes.model.presets import load_preset
from fleetsieve_bayes.model.priors import list_cards, load_card
from fleetsieve_bayes.resources import DATA_KINDS, data_dir, legacy_path

PACKAGE = Path(fleetsieve_bayes.__file__).resolve().parent
INSTALLED = os.environ.get("FLEETSIEVE_EXPECT_INSTALLED") == "1"


def test_cards_presets_and_architectures_are_package_data() -> None:
    assert data_dir("priors") == PACKAGE / "data" / "priors"
    assert data_dir("presets") == PACKAGE / "data" / "presets"
    assert {"dense-31b-fp8-h100", "dense-8b-bf16-h100", "generic"} <= set(list_cards())
    assert (data_dir("priors") / "hardware" / "gpus.toml").is_file()
    assert (data_dir("priors") / "architectures" / "dense-31b.json").is_file()
    assert {p.stem for p in data_dir("presets").glob("*.toml")} >= {"certify", "default", "fast", "svi"}
    assert data_dir("models") == data_dir("priors") and data_dir("inference") == data_dir("presets")
    with pytest.raises(ValueError, match="unknown data kind 'cards'"):
        data_dir("cards")
    assert DATA_KINDS == ("priors", "presets", "examples")


@pytest.mark.installed
def test_the_package_is_imported_from_the_installed_wheel() -> None:
    assert INSTALLED, "run by the wheel stage of .ci/run, which sets FLEETSIEVE_EXPECT_INSTALLED=1"
    assert {"site-packages", "dist-packages"} & set(PACKAGE.parts), PACKAGE
    source = os.environ.get("FLEETSIEVE_SOURCE_DIR")
    if source:
        assert not PACKAGE.is_relative_to(Path(source).resolve()), PACKAGE
    # The examples ship inside the package: nothing is read from a source tree.
    assert data_dir("examples") == PACKAGE / "data" / "examples"
    assert (data_dir("examples") / "h100_31b_fp8" / "grid.csv").is_file()


def test_models_and_inference_paths_name_the_shipped_files(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # where no models/ or inference/ folder exists
    assert legacy_path("models/generic.toml") == data_dir("priors") / "generic.toml"
    assert load_card("models/generic.toml").name == load_card("generic").name
    assert load_preset("inference/fast.toml") == load_preset("fast")
    assert load_architecture("models/architectures/dense-31b.json") == load_architecture("dense-31b")
    assert legacy_path("models/nope.toml") is None and legacy_path("elsewhere/generic.toml") is None
    with pytest.raises(InputError, match=r"models/nope\.toml: prior card not found"):
        load_card("models/nope.toml")
    # A file that exists as given is that file, not the shipped one.
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "generic.toml").write_text("not = [a card")
    assert legacy_path("models/generic.toml") is None
    with pytest.raises(InputError, match="generic.toml"):
        load_card("models/generic.toml")


def _entry_point() -> list[str]:
    """The installed ``fleetsieve-bayes`` script beside this interpreter (the wheel stage's venv:
    its own ``bin/``); the test fails when the wheel did not install it."""
    cmd = console_script()
    if INSTALLED:
        # The wheel's script, in the venv it was installed into: not one of another environment.
        assert Path(sys.prefix).resolve() in Path(cmd[0]).resolve().parents, (cmd, sys.prefix)
    return cmd


@pytest.mark.installed
def test_quickstart_campaign_from_the_installed_package(tmp_path: Path) -> None:
    """README Quickstart: `fleetsieve-bayes run examples/h100_31b_fp8/campaign.toml --out runs/h100`."""
    campaign = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
    out = tmp_path / "runs" / "h100"
    proc = subprocess.run(
        [*_entry_point(), "run", str(campaign), "--out", str(out), "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    # At the default level (0.9) one window per cell cannot settle code TP4@C96: undecided,
    # naming it, with its best estimate (tests/test_campaign.py pins the same run in-tree).
    assert result["status"] == "undecided" and result["gpu_seconds"] == 16800.0
    assert result["repeat"] == {"workload": "code", "tp": 4, "load": "C96", "windows": 1, "limit": 1,
                                "limited_by": "backend"}
    assert result["answer"] == "credible" and result["answer_confidence"] == {"chat": 0.5, "code": 0.5}
    assert result["allocation"] == {
        "chat": {"tp": 4, "load": "C96", "replicas": 2},
        "code": {"tp": 4, "load": "C64", "replicas": 2},
    }
    assert len(result["measured"]) == 11
