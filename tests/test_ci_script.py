"""`.ci/run` cannot be fooled: a failed install or an empty test run fails CI.

The script runs in a temporary copy of a tiny project whose build backend is
in the tree (no index, no network): pip really resolves its requirements, and
the project's one test leaves a marker file when it runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parent.parent / ".ci" / "run"
TEST_COMMAND = Path(__file__).resolve().parent.parent / "scripts" / "test"

BACKEND = '''
import base64, hashlib, os, zipfile

DIST = "ci_probe-0.dist-info"


def _metadata():
    with open("requires.txt") as f:
        reqs = f.read().split()
    lines = ["Metadata-Version: 2.1", "Name: ci-probe", "Version: 0", "Provides-Extra: test"]
    return "\\n".join(lines + [f"Requires-Dist: {r}" for r in reqs]) + "\\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, DIST))
    with open(os.path.join(metadata_directory, DIST, "METADATA"), "w") as f:
        f.write(_metadata())
    return DIST


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "ci_probe-0-py3-none-any.whl"
    files = {
        DIST + "/METADATA": _metadata(),
        DIST + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: probe\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        z.writestr(DIST + "/RECORD", "\\n".join(record + [DIST + "/RECORD,,"]) + "\\n")
    return name
'''

PYPROJECT = """
[build-system]
requires = []
build-backend = "probe_backend"
backend-path = ["."]

[tool.pytest.ini_options]
addopts = "-p no:cacheprovider -p no:randomly"
"""

PROBE_TEST = """
import os
from pathlib import Path


def test_probe():
    Path(os.environ["CI_PROBE_MARKER"]).write_text("ran")
"""


def _project(tmp: Path, *, requires: str, with_test: bool = True) -> Path:
    root = tmp / "project"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(CI_RUN, root / ".ci" / "run")
    (root / ".ci" / "run").chmod((root / ".ci" / "run").stat().st_mode | stat.S_IXUSR)
    (root / "scripts").mkdir()
    shutil.copy(TEST_COMMAND, root / "scripts" / "test")
    (root / "scripts" / "test").chmod((root / "scripts" / "test").stat().st_mode | stat.S_IXUSR)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "probe_backend.py").write_text(BACKEND)
    (root / "requires.txt").write_text(requires)
    (root / "tests").mkdir()
    if with_test:
        (root / "tests" / "test_probe.py").write_text(PROBE_TEST)
    return root


def _ci(root: Path, tmp: Path, *stages: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    marker = tmp / "marker"
    # The test command installs Debian's prometheus when none is on PATH: a stand-in here.
    fake_bin = tmp / "bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "prometheus").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "prometheus").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}",
        "CI_PROBE_MARKER": str(marker),
        "PIP_NO_INDEX": "1",  # nothing from the network
        "PIP_TARGET": str(tmp / "target"),  # nothing into the running environment
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    proc = subprocess.run(
        ["bash", str(root / ".ci" / "run"), *stages], env=env, capture_output=True, text=True, timeout=300
    )
    return proc, marker


def test_a_failed_install_fails_ci_and_runs_no_test(tmp_path: Path) -> None:
    root = _project(tmp_path, requires="fleetsieve-no-such-package==0")
    proc, marker = _ci(root, tmp_path, "tests")
    assert proc.returncode != 0
    assert "fleetsieve-no-such-package" in proc.stdout + proc.stderr  # pip's own error
    assert not marker.exists()  # the test stage never ran
    assert "CI: stage tests passed" not in proc.stderr


def test_a_good_install_then_runs_the_tests(tmp_path: Path) -> None:
    """The control: the same project with a requirement that resolves installs, then runs its test."""
    root = _project(tmp_path, requires="")
    proc, marker = _ci(root, tmp_path, "tests")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.read_text() == "ran"
    assert (tmp_path / "target" / "ci_probe-0.dist-info" / "METADATA").is_file()
    assert "CI: stage tests passed" in proc.stderr


def test_no_tests_collected_fails_ci(tmp_path: Path) -> None:
    root = _project(tmp_path, requires="", with_test=False)
    proc, _ = _ci(root, tmp_path, "tests")
    assert proc.returncode == 5
    assert "CI: no tests collected" in proc.stderr


@pytest.mark.parametrize("stage", ["test", ""])
def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path: Path, stage: str) -> None:
    root = _project(tmp_path, requires="")
    proc, marker = _ci(root, tmp_path, "tests", stage)
    assert proc.returncode == 2 and "unknown stage" in proc.stderr
    assert not marker.exists()
