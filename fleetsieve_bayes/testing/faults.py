"""Run the command line with kill hooks installed: the kill-everywhere tests' way of
stopping a real campaign at a chosen instant, from inside, with no cleanup.

Usage::

    python -m fleetsieve_bayes.testing.faults --kill-after-append N -- run CAMPAIGN --out DIR ...
    python -m fleetsieve_bayes.testing.faults --kill-in-measurement SECONDS -- run CAMPAIGN ...

``--kill-after-append N``: SIGKILL the process right after its N-th durable
journal append (the journal's ``on_append`` point). ``--kill-in-measurement S``:
SIGKILL it S seconds after its first measurement starts (the measurement's
wrapper point; a replay with ``delay_s`` makes a measurement last that long).
Both work for one cell at a time and for a pool (local executor). The hooks
reach the run through :func:`fleetsieve_bayes.campaign.hooks.installed`; the
package itself never installs any.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fleetsieve_bayes.campaign.hooks import Measure, RunHooks, installed

__all__ = ["kill_hooks", "main"]


def _kill_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_hooks(after_append: int | None = None, in_measurement_s: float | None = None) -> RunHooks:
    """Hooks that SIGKILL this process after its ``after_append``-th journal append, and/or
    ``in_measurement_s`` seconds into its first measurement."""
    on_append: Callable[[int], None] | None = None
    wrap: Callable[[Measure], Measure] | None = None
    if after_append is not None:

        def on_append(n: int) -> None:
            if n >= after_append:
                _kill_now()

    if in_measurement_s is not None:
        armed = threading.Event()

        def wrap(measure: Measure) -> Measure:
            def measure_then_die(*args: Any, **kwargs: Any) -> dict[str, Any]:
                if not armed.is_set():
                    armed.set()
                    timer = threading.Timer(in_measurement_s, _kill_now)
                    timer.daemon = True
                    timer.start()
                return measure(*args, **kwargs)

            return measure_then_die

    return RunHooks(on_append=on_append, wrap_measure=wrap)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m fleetsieve_bayes.testing.faults [HOOKS] -- COMMAND ARGS", file=sys.stderr)
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m fleetsieve_bayes.testing.faults")
    p.add_argument("--kill-after-append", type=int, default=None, metavar="N")
    p.add_argument("--kill-in-measurement", type=float, default=None, metavar="SECONDS")
    args = p.parse_args(argv[:cut])
    from fleetsieve_bayes.cli import main as cli_main

    with installed(kill_hooks(args.kill_after_append, args.kill_in_measurement)):
        return cli_main(argv[cut + 1 :])


if __name__ == "__main__":
    sys.exit(main())
