"""Progress display for ``run``: quiet when not on a terminal or with ``--quiet``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TextIO


@contextlib.contextmanager
def make_progress(*, quiet: bool, stream: TextIO) -> Iterator[Any]:
    """Yield an ``on_event(kind, info)`` callback for :func:`fleetsieve_bayes.campaign.run_campaign`."""

    def on_event(kind: str, info: dict[str, Any]) -> None:
        if quiet or not stream.isatty():
            return
        if kind == "round":
            g = info["gap"]
            print(
                f"round {info['round']}: {info['certificate']}, gap r={g['min_fulfillment']:.3f} "
                f"goodput={g['goodput']:.3f}, {info['gpu_seconds']:.0f} GPU-s",
                file=stream,
            )
        elif kind == "measure-start":
            print(f"  measuring {info['label']} (~{info['expected_s']:.0f} s)", file=stream)

    yield on_event
