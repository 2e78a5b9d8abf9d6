"""Run or resume one campaign in a directory: resolve its inputs, lock it, pick the driver.

Campaign directory:
    journal.jsonl     append-only record of every measurement and round
    measurements.csv  the measured rows (derived from the journal)
    posterior.nc      the latest posterior (ArviZ InferenceData)
    bounds.csv        the latest credible intervals of every cell
    warm_start/       the model state each round starts from (.npz)
    result.json       the final result

One cell at a time runs :mod:`fleetsieve_bayes.campaign.sequential`; a campaign
that sets ``[measurement] pool_gpus`` or ``executor = "ray"`` runs
:mod:`fleetsieve_bayes.campaign.parallel`. Both are loops over the round of
:mod:`fleetsieve_bayes.round`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends import Backend, make_backend, validate_backend
from fleetsieve_bayes.campaign import hooks as hook_points
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.hooks import RunHooks
from fleetsieve_bayes.campaign.journal import campaign_lock
from fleetsieve_bayes.campaign.outputs import CampaignResult
from fleetsieve_bayes.campaign.parallel import run_parallel
from fleetsieve_bayes.campaign.records import Event, no_events
from fleetsieve_bayes.campaign.sequential import run_sequential
from fleetsieve_bayes.campaign.setup import prepare_out, resolve, undo_fresh_files
from fleetsieve_bayes.errors import EnvironmentProblem, InputError

__all__ = ["run_campaign", "CampaignResult", "Event"]


def run_campaign(
    campaign: Campaign,
    out: Path | str,
    *,
    strategy: Any = "fleetsieve",
    seed: int = 0,
    prior: Any = None,
    preset: Any = None,
    on_event: Event | None = None,
    backend: Backend | None = None,
    reuse_measurements: Path | None = None,
    hooks: RunHooks | None = None,
) -> CampaignResult:
    """Run or resume ``campaign`` in directory ``out`` and write ``out/result.json``.

    Args:
        strategy: acquisition strategy: a name (see :mod:`fleetsieve_bayes.decision.strategies`),
            a :class:`~fleetsieve_bayes.decision.strategies.Strategy`, or an object with
            ``name`` and ``build(grid, problem, settings, seed)``.
        seed: seeds every round's randomness (NUTS, fantasies, random strategy).
        prior: the prior card (a name, a path or a loaded card) instead of ``[model] family``.
        preset: the inference preset (a name, a path or an object) instead of ``[model] inference``.
        on_event: progress callback ``(kind, info)``.
        backend: a measurement backend; by default the campaign's own.
        reuse_measurements: a finished or stopped campaign directory whose
            measurements seed this (new) decision; only demands, SLOs, floors,
            the budget and the stopping rule may differ from its campaign.
        hooks: points to watch or wrap the run (:mod:`fleetsieve_bayes.campaign.hooks`).

    Raises:
        InputError: bad campaign, a journal from another campaign (naming what
            changed), or a directory locked by another run.
        EnvironmentProblem: the directory cannot be written.
    """
    on_event = on_event or no_events
    hooks = hooks or hook_points.current()
    out = Path(out)
    reuse = None if reuse_measurements is None else Path(reuse_measurements)
    if backend is None:  # the backend this run builds: its own keys first, before any input is read
        validate_backend(campaign)
    setup = resolve(campaign, strategy, seed, reuse, prior=prior, preset=preset)
    if setup.reuse is not None and setup.reuse.resolve() == out.resolve():
        raise InputError(f"--reuse-measurements {setup.reuse}: that is --out itself; re-plan into a new --out")
    created, lock_created = prepare_out(out)
    try:
        with campaign_lock(out):
            own_backend = backend is None
            backend = backend or make_backend(campaign, out)
            try:
                if campaign.pool.parallel:  # several cells at once
                    return run_parallel(setup, out, backend, on_event, hooks, explicit_backend=not own_backend)
                return run_sequential(setup, out, backend, on_event, hooks)
            finally:
                if own_backend:
                    backend.close()
    except (InputError, EnvironmentProblem):
        undo_fresh_files(out, created, lock_created)
        raise
