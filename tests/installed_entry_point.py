"""The ``fleetsieve-bayes`` console script that installing the package (the wheel, or an
editable install) puts beside the running interpreter.

Tests that exercise the entry point run this script, never ``python -m
fleetsieve_bayes`` in its place: a broken ``[project.scripts]`` entry must fail them.
In `.ci/run`'s wheel stage the interpreter is the fresh venv's ``bin/python``, so the
script looked for is the venv's own ``bin/fleetsieve-bayes``.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

SCRIPT = "fleetsieve-bayes"


def script_candidates() -> list[Path]:
    """Where the installed script can be: beside ``sys.executable`` (not resolved: a venv's
    ``python`` is a link into the base interpreter's folder), then the scripts folder of this
    interpreter's install scheme."""
    name = SCRIPT + (".exe" if os.name == "nt" else "")
    folders = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    return list(dict.fromkeys(folder / name for folder in folders))


def console_script() -> list[str]:
    """The command line that runs the installed ``fleetsieve-bayes`` script; fails the test
    (no fallback) when the install did not put it beside this interpreter."""
    for path in script_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return [str(path)]
    where = ", ".join(str(p) for p in script_candidates())
    pytest.fail(
        f"the console script {SCRIPT!r} is not installed for {sys.executable} (looked for {where}); "
        "install the package (pip install -e . or the wheel) into this interpreter's environment",
        pytrace=False,
    )
