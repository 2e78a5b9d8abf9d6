"""The strategy registry: the one list of strategy names.

Each name maps to ``(family module, builder)``; the family module is imported
only when the strategy is built, so listing names (the CLI's ``--strategy``
choices) needs no JAX. To add a strategy: write ``build_x(ctx) -> Select`` in
a family module of this package (or a new one) and add one line here.
"""

from __future__ import annotations

import importlib

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.strategies.base import Strategy, StrategyContext
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.settings import DEFAULT_SETTINGS, DecisionSettings

__all__ = ["REGISTRY", "STRATEGY_NAMES", "make_strategy"]

# ``run --strategy`` names (the first is the default), all sharing the initial
# design, the model, the allocator and the stopping rule.
REGISTRY: dict[str, tuple[str, str]] = {
    "fleetsieve": ("gap", "build_fleetsieve"),
    "random": ("naive", "build_random"),
    "grid": ("naive", "build_grid"),
    "max-uncertainty": ("uncertainty", "build_max_uncertainty"),
    "shared-uncertainty": ("uncertainty", "build_shared_uncertainty"),
    "targeted": ("targeted", "build_targeted"),
    "voi": ("gap", "build_voi"),
    "constrained-bo": ("bo", "build_constrained_bo"),
}
STRATEGY_NAMES: tuple[str, ...] = tuple(REGISTRY)


def make_strategy(
    name: str,
    grid: CellGrid,
    problem: AllocationProblem,
    settings: DecisionSettings = DEFAULT_SETTINGS,
    *,
    seed: int = 0,
    n_fantasies: int = 16,
) -> Strategy:
    """The named strategy for one campaign (see each family module), reading the
    campaign's credible level, repeatability and interval rules from ``settings``.

    ``seed`` only seeds a fallback generator for a state without
    ``rng``/``key``; the loop's per-round ``state.rng``/``state.key`` are used
    otherwise.

    Raises:
        InputError: unknown ``name`` (the message lists the known names).
    """
    if name not in REGISTRY:
        raise InputError(f"--strategy: unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}")
    family, builder = REGISTRY[name]
    module = importlib.import_module(f"{__package__}.{family}")
    ctx = StrategyContext(
        grid, problem, settings.credible_level, settings.repeatability, seed, n_fantasies, settings.rules
    )
    return Strategy(name=name, select=getattr(module, builder)(ctx))
