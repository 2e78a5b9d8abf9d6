"""The strategy registry is the only list of names; every family exposes one interface."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import numpy as np

from fleetsieve_bayes.allocation.objective import objective_json
from fleetsieve_bayes.allocation.problem import Allocation
from fleetsieve_bayes.cli import build_parser
from fleetsieve_bayes.decision import design
from fleetsieve_bayes.decision.strategies import REGISTRY, STRATEGY_NAMES, StrategyContext


def test_cli_choices_are_the_registry():
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # noqa: SLF001 - argparse has no public accessor
    choices = next(a.choices for a in run._actions if a.dest == "strategy")
    assert tuple(choices) == STRATEGY_NAMES == tuple(REGISTRY)
    assert STRATEGY_NAMES[0] == "fleetsieve"
    assert design.STRATEGY_NAMES is STRATEGY_NAMES  # a re-export, not a second list


def test_every_builder_has_the_same_interface():
    for name, (family, builder) in REGISTRY.items():
        module = importlib.import_module(f"fleetsieve_bayes.decision.strategies.{family}")
        fn = getattr(module, builder)
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == ["ctx"], name
        assert params[0].annotation in (StrategyContext, "StrategyContext"), name


def test_listing_names_does_not_import_jax():
    code = (
        "import sys; from fleetsieve_bayes.decision.strategies import STRATEGY_NAMES; "
        "import fleetsieve_bayes.cli as c; c.build_parser(); print('jax' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_objective_json_rounds_to_significant_digits():
    a = Allocation("feasible", np.array([0]), np.array([2]), np.array([13.192]), 1.0993333333e-9, 13.19200000004, 8)
    assert objective_json(a, digits=9) == {"min_fulfillment": 1.09933333e-9, "goodput_rps": 13.192, "gpus_used": 8}
    assert objective_json(a, with_feasible=True)["feasible"] is True
