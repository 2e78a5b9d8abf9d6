"""Points where a caller may watch or wrap a running campaign (faults, tracing).

A :class:`RunHooks` value has two points, both empty by default:

- ``on_append(n)``: called after the n-th durable journal append of this run;
- ``wrap_measure(measure)``: returns the function that measures a cell
  (``measure(cell_index, ...) -> row``) in its place, e.g. one that arms a timer first.

:func:`fleetsieve_bayes.campaign.runner.run_campaign` takes them as an argument;
:func:`installed` sets the ones a run gets when it is passed none (what
:mod:`fleetsieve_bayes.testing.faults` does around the command line). Nothing
in the package installs any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

__all__ = ["RunHooks", "NO_HOOKS", "installed", "current"]

# A function that measures one cell: ``measure(cell_index, ...) -> row``.
Measure = Callable[..., dict[str, Any]]


class RunHooks(NamedTuple):
    on_append: Callable[[int], None] | None = None
    wrap_measure: Callable[[Measure], Measure] | None = None

    def wrap(self, measure: Measure) -> Measure:
        """``measure`` through ``wrap_measure`` (itself when there is none)."""
        return measure if self.wrap_measure is None else self.wrap_measure(measure)


NO_HOOKS = RunHooks()
_current: list[RunHooks] = [NO_HOOKS]


def current() -> RunHooks:
    """The hooks a run passed none gets."""
    return _current[-1]


@contextlib.contextmanager
def installed(hooks: RunHooks) -> Iterator[None]:
    """Runs started inside the block, and passed no hooks, get ``hooks``."""
    _current.append(hooks)
    try:
        yield
    finally:
        _current.pop()
