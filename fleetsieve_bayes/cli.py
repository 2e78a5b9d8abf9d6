"""The ``fleetsieve-bayes`` command line.

Each subcommand lives in its own module under :mod:`fleetsieve_bayes.commands`
and exposes ``register(subparsers)`` (adds its parser and sets ``func``).
Bad input raises :class:`~fleetsieve_bayes.errors.InputError`; here it becomes
one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence

from fleetsieve_bayes import interrupts
from fleetsieve_bayes.errors import EnvironmentProblem, InputError, MeasurementError

# Subcommand modules, in the order `--help` lists them.
_COMMANDS = (
    "run", "allocate", "measure", "ingest", "classes", "priors", "diagnose", "status", "report",
    "plan", "verify",
)
# Subcommands that compile JAX programs worth keeping on disk (a campaign's sampler,
# allocator and acquisition kernel).
_COMPILING = ("run",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetsieve-bayes",
        description="Decision-critical profiling for SLO-aware LLM fleet configuration.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"fleetsieve_bayes.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fleetsieve_bayes.commands.{name}":
                continue  # not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # ArviZ announces its next major version on import once a day; a command's
    # stderr is for its own messages.
    warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in _COMPILING:
        # Compiled programs persist across invocations (a resume after a kill
        # recompiles nothing); a library caller chooses for itself.
        from fleetsieve_bayes.jax_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        with interrupts.recording():
            return int(args.func(args) or 0)
    except (InputError, EnvironmentProblem, MeasurementError) as exc:
        print(f"fleetsieve-bayes {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        # The environment (a read-only or full disk, a vanished directory), not the input.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"fleetsieve-bayes {args.command}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EnvironmentProblem.exit_code
    except KeyboardInterrupt:
        print(f"fleetsieve-bayes {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
