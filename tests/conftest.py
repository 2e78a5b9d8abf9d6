"""Shared fixtures. Every test reads the package's own data (fleetsieve_bayes.resources)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


# CI runs must be reproducible: hypothesis explores a fixed set of examples
# there (CI=true), and random ones on developers' machines.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")
