"""User-facing errors.

Every problem with the user's input (a campaign file, a table, a trace, a
result file, a server that never becomes healthy) is raised as an
:class:`InputError` whose message names the file, field, row or cell. The CLI
prints that one line and exits 2; an :class:`EnvironmentProblem` (a read-only
or full disk) exits 1; nothing else ever reaches the user as
a traceback.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: the message is one line that names the file/field/cell."""

    exit_code = 2


class EnvironmentProblem(Exception):
    """The environment, not the input, is at fault (a read-only or full disk…): one line, exit 1."""

    exit_code = 1


class MeasurementError(Exception):
    """A measurement backend could not produce a row for a cell.

    Backends classify failures they can explain (start-up OOM, timeouts, death
    mid-run) as *observations* instead; this is for failures of the harness
    itself, after which the campaign stops with everything recorded kept.
    """

    exit_code = 3
