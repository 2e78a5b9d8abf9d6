"""Shared fixtures. The shipped example lives in examples/; ../shared is optional."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_grid() -> Path:
    path = SHARED / "data" / "h100_31b_fp8_grid.csv"
    if not path.exists():
        pytest.skip("../shared is not present")
    return path


# CI runs must be reproducible: hypothesis explores a fixed set of examples
# there (CI=true), and random ones on developers' machines.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")
