"""The argument list of one replica's ``vllm serve``, from the campaign's server template."""

from __future__ import annotations

from collections.abc import Sequence

from fleetsieve_bayes.backends.server import render_command
from fleetsieve_bayes.errors import InputError

__all__ = ["replica_command"]


def replica_command(template: Sequence[str], extra_args: Sequence[str], *, model: str, tp: int, port: int) -> list[str]:
    """The argument list of one replica: ``template`` filled, then ``extra_args``.

    Raises:
        InputError: the template names a placeholder other than ``{model}``, ``{tp}``, ``{port}``.
    """
    try:
        return render_command(list(template), model=model, tp=tp, port=port) + list(extra_args)
    except ValueError as exc:
        raise InputError(f"[measurement] command: {exc}") from None
