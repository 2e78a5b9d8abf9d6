"""Shared fixtures. Every test reads the package's own data (fleetsieve_bayes.resources)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


# Compiled programs persist across tests and test runs, as they do across
# `fleetsieve-bayes run` invocations (fleetsieve_bayes.jax_cache): a campaign's
# sampler, allocator and acquisition kernel compile once, whether a test runs
# them in this process or in a `run` subprocess, instead of once per test.
# FLEETSIEVE_JAX_CACHE picks the folder (or "off"), as for the command line.
from fleetsieve_bayes.jax_cache import enable_compilation_cache  # noqa: E402

enable_compilation_cache()

# ArviZ writes a once-a-day stamp on its first import of the day through a temporary
# file of one fixed name, which two test workers importing it together race on
# (fleetsieve_bayes.arviz_import): the controller writes today's stamp before any worker starts.
from fleetsieve_bayes.arviz_import import seed_daily_stamp  # noqa: E402

seed_daily_stamp()


# CI runs must be reproducible: hypothesis explores a fixed set of examples
# there (CI=true), and random ones on developers' machines.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() == "true":
    settings.load_profile("ci")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name the shuffled order (pytest-randomly's seed) even under -q, so a failure that
    depends on the order can be repeated."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"test order: pytest -p randomly --randomly-seed={seed} repeats it")


# The report, status, plan and verify tests read directories that `run` wrote
# (tests/campaign_dirs.py): one real campaign per session, in a folder the xdist
# workers share (the parent of a worker's base temporary folder), made on first use.
@pytest.fixture(scope="session", autouse=True)
def _campaign_runs_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    import campaign_dirs

    base = tmp_path_factory.getbasetemp()
    campaign_dirs.set_root((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "campaign-runs")


@pytest.fixture(scope="session")
def shipped_runs() -> object:
    """:class:`campaign_dirs.Runs`: the shipped campaign at "point", killed after round 2 and finished."""
    import campaign_dirs

    return campaign_dirs.shipped_runs()
