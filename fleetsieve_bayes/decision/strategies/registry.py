"""The strategy registry: the one list of strategy names.

Each name maps to ``(family module, builder)``; the family module is imported
only when the strategy is built, so listing names (the CLI's ``--strategy``
choices) needs no JAX. To add a strategy: write ``build_x(ctx) -> Select`` in
a family module of this package (or a new one) and add one line here.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.strategies.base import Strategy, StrategyContext
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.settings import DEFAULT_SETTINGS, DecisionSettings

__all__ = [
    "REGISTRY",
    "STRATEGY_NAMES",
    "make_strategy",
    "NamedStrategy",
    "Fleetsieve",
    "Random",
    "GridOrder",
    "MaxUncertainty",
    "SharedUncertainty",
    "Targeted",
    "ValueOfInformation",
    "ConstrainedBO",
]

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


class NamedStrategy(NamedTuple):
    """A registered strategy as an object: what ``run_campaign(strategy=...)`` and
    :func:`fleetsieve_bayes.api.init` accept besides its name. Any object with a ``name``
    and this ``build`` method is accepted too (a strategy of your own)."""

    name: str
    n_fantasies: int = 16

    def build(self, grid: CellGrid, problem: AllocationProblem, settings: DecisionSettings, seed: int) -> Strategy:
        """The strategy for one campaign's grid, problem and settings."""
        return make_strategy(self.name, grid, problem, settings, seed=seed, n_fantasies=self.n_fantasies)


def Fleetsieve(n_fantasies: int = 16) -> NamedStrategy:  # noqa: N802 (reads as the object it is)
    """Expected gap reduction, with the regret fallback after a failed certification attempt."""
    return NamedStrategy("fleetsieve", n_fantasies)


def Random() -> NamedStrategy:  # noqa: N802
    """Uniform random order over the unmeasured cells."""
    return NamedStrategy("random")


def GridOrder() -> NamedStrategy:  # noqa: N802
    """The grid's own order (class, TP, load)."""
    return NamedStrategy("grid")


def MaxUncertainty() -> NamedStrategy:  # noqa: N802
    """The widest credible interval."""
    return NamedStrategy("max-uncertainty")


def SharedUncertainty() -> NamedStrategy:  # noqa: N802
    """The widest interval, shared across classes."""
    return NamedStrategy("shared-uncertainty")


def Targeted() -> NamedStrategy:  # noqa: N802
    """The cells the decision uses."""
    return NamedStrategy("targeted")


def ValueOfInformation(n_fantasies: int = 16) -> NamedStrategy:  # noqa: N802
    """Expected improvement of the conservative objective per GPU-second."""
    return NamedStrategy("voi", n_fantasies)


def ConstrainedBO() -> NamedStrategy:  # noqa: N802
    """Constrained Bayesian optimisation on independent surrogates."""
    return NamedStrategy("constrained-bo")
