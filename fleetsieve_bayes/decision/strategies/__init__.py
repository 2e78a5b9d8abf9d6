"""The strategy seam: which unmeasured cell to measure next (the paper's Appendix B).

One module per strategy family, each exposing builders with one interface
(:mod:`.base`): ``build(ctx: StrategyContext) -> Select``.

- :mod:`.gap` — ``fleetsieve`` (expected gap reduction, the default), ``voi``;
- :mod:`.naive` — ``random``, ``grid``;
- :mod:`.uncertainty` — ``max-uncertainty``, ``shared-uncertainty``;
- :mod:`.targeted` — ``targeted``;
- :mod:`.bo` — ``constrained-bo``.

:mod:`.registry` is the only list of names; :func:`make_strategy` builds one,
and each has an object (``Fleetsieve()``, ``Random()``, …) that
``run_campaign(strategy=...)`` accepts as well as the name.
"""

from fleetsieve_bayes.decision.strategies.base import (
    RoundState,
    Strategy,
    StrategyContext,
    select_cell,
)
from fleetsieve_bayes.decision.strategies.naive import grid_order
from fleetsieve_bayes.decision.strategies.registry import (
    REGISTRY,
    STRATEGY_NAMES,
    ConstrainedBO,
    Fleetsieve,
    GridOrder,
    MaxUncertainty,
    NamedStrategy,
    Random,
    SharedUncertainty,
    Targeted,
    ValueOfInformation,
    make_strategy,
)
from fleetsieve_bayes.decision.strategies.uncertainty import interval_widths

__all__ = [
    "REGISTRY",
    "STRATEGY_NAMES",
    "RoundState",
    "Strategy",
    "StrategyContext",
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
    "select_cell",
    "grid_order",
    "interval_widths",
]
