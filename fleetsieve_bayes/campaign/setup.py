"""Starting or resuming a campaign directory: inputs resolved, header written or checked.

:func:`resolve` loads the prior card, the inference preset, the strategy and the
seed tables before the directory is touched, and fingerprints every decision
input. :func:`begin` writes the header and the seeded (or reused) rows of a new
campaign, or checks a resumed one's header against the inputs, naming what
changed. Both drivers start here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.fingerprint import (
    campaign_inputs,
    fingerprint,
    mismatch,
    reuse_refusal,
)
from fleetsieve_bayes.campaign.journal import (
    JOURNAL_NAME,
    LOCK_NAME,
    Cell,
    Header,
    Journal,
    MeasurementRecord,
)
from fleetsieve_bayes.campaign.outputs import write_measurements
from fleetsieve_bayes.campaign.records import cell_of, plain_row
from fleetsieve_bayes.campaign.windows import window_rows
from fleetsieve_bayes.decision.strategies import STRATEGY_NAMES, Strategy, make_strategy
from fleetsieve_bayes.deploy.production import PRODUCTION_PHASE, production_inputs
from fleetsieve_bayes.errors import EnvironmentProblem, InputError
from fleetsieve_bayes.settings import DecisionSettings

__all__ = [
    "CampaignSetup",
    "SeedRow",
    "resolve",
    "build_strategy",
    "prepare_out",
    "undo_fresh_files",
    "begin",
]

# (cell, row, source) of a row measured before the campaign (a seed table, a reused directory).
SeedRow = tuple[Cell, dict[str, Any], str]


class CampaignSetup(NamedTuple):
    """A campaign's inputs, resolved before its directory is touched.

    ``strategy``: the strategy's name or an object (a
    :class:`~fleetsieve_bayes.decision.strategies.Strategy`, or one with
    ``name`` and ``build(grid, problem, settings, seed)``); ``strategy_name``
    is what the journal and ``result.json`` record.
    """

    campaign: Campaign
    settings: DecisionSettings
    card: Any
    preset: Any
    strategy: Any
    strategy_name: str
    seed: int
    fingerprint: dict[str, str]
    inputs: dict[str, Any]
    seed_rows: list[SeedRow]
    reuse: Path | None
    production: tuple[Path, ...] = ()  # run --production: verify reports


def _field_error(campaign: Campaign, field: str, exc: InputError) -> InputError:
    return InputError(f"{campaign.path}: {field}: {exc}")


def _strategy_name(strategy: Any) -> str:
    if isinstance(strategy, str):
        if strategy not in STRATEGY_NAMES:
            raise InputError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGY_NAMES)}")
        return strategy
    name = getattr(strategy, "name", None)
    if not isinstance(name, str) or not name:
        raise InputError(f"strategy {strategy!r}: expected a name or an object with a `name`")
    return name


def _card(campaign: Campaign, prior: Any) -> tuple[Any, Path | None]:
    """The prior card (object) and the file it was read from (None: an edited object)."""
    from fleetsieve_bayes.model.priors import card_path, load_card

    if prior is None or isinstance(prior, (str, Path)):
        try:
            path = card_path(campaign.family if prior is None else prior)
            return load_card(path), path
        except InputError as exc:
            field = "[model] family" if prior is None else "prior"
            raise _field_error(campaign, field, exc) from None
    path = Path(getattr(prior, "path", "") or "")
    same = path.is_file() and load_card(path) == prior
    return prior, path if same else None


def resolve(
    campaign: Campaign,
    strategy: Any = "fleetsieve",
    seed: int = 0,
    reuse: Path | None = None,
    *,
    prior: Any = None,
    preset: Any = None,
) -> CampaignSetup:
    """Load the prior card, preset and seed tables; fingerprint every decision input.

    ``prior`` / ``preset``: a name, a path or an object, instead of the campaign's
    ``[model] family`` / ``[model] inference``.

    Raises:
        InputError: naming the campaign file and field (family, inference,
            seed_tables) or the strategy.
    """
    from fleetsieve_bayes.campaign.fingerprint import object_digest
    from fleetsieve_bayes.model.inference import load_preset

    name = _strategy_name(strategy)
    card, card_file = _card(campaign, prior)
    _check_gpu_axis(campaign, card)
    _check_roles(campaign, card)
    if preset is None or isinstance(preset, (str, Path)):
        try:
            preset = load_preset(campaign.inference if preset is None else preset)
        except InputError as exc:
            raise _field_error(campaign, "[model] inference", exc) from None
    _check_certify_inference(campaign)
    digest = fingerprint(campaign, card_file=card_file, preset=preset, strategy=name, seed=seed)
    if card_file is None:
        digest["prior_card"] = object_digest(dataclasses.asdict(card))
    return CampaignSetup(
        campaign=campaign,
        settings=DecisionSettings.from_campaign(campaign),
        card=card,
        preset=preset,
        strategy=strategy,
        strategy_name=name,
        seed=seed,
        fingerprint=digest,
        inputs=campaign_inputs(campaign),
        seed_rows=_seed_table_rows(campaign),
        reuse=reuse,
    )


def _check_certify_inference(campaign: Campaign) -> None:
    """``[model] certify_inference`` names a preset that loads and samples with NUTS."""
    from fleetsieve_bayes.model.inference import load_preset

    try:
        certifying = load_preset(campaign.certify_inference)
    except InputError as exc:
        raise _field_error(campaign, "[model] certify_inference", exc) from None
    if certifying.method != "nuts":
        raise _field_error(
            campaign, "[model] certify_inference",
            InputError(f"the certifying fit needs a NUTS preset, {campaign.certify_inference!r} is {certifying.method!r}"),
        )


def _check_gpu_axis(campaign: Campaign, card: Any) -> None:
    """A campaign of several pools needs a card whose ``[gpu_axis]`` covers every pool's GPU.

    Raises:
        InputError: naming the campaign file and ``[model] family`` or the pool's ``gpu``.
    """
    from fleetsieve_bayes.model.gpu_axis import axis_from_card

    if len(campaign.pools) < 2:
        return
    axis = axis_from_card(card)
    if axis is None:
        raise InputError(
            f"{campaign.path}: [model] family: the prior card {campaign.family} has no [gpu_axis] section, which "
            f"a fleet of {len(campaign.pools)} GPU types needs (write one with `priors derive --also-gpus`)"
        )
    on_axis = {g.lower() for g in axis.gpus}
    for j, p in enumerate(campaign.pools):
        if p.gpu.lower() not in on_axis:
            raise InputError(
                f"{campaign.path}: [[fleet.pools]] #{j + 1} gpu: {p.gpu!r} is not on the prior card's GPU axis "
                f"({', '.join(axis.gpus)}); add a row for it to the card's [gpu_axis] (`priors derive --also-gpus`)"
            )


def _check_roles(campaign: Campaign, card: Any) -> None:
    """A catalogue with a disaggregated configuration or engine limits needs a card with ``[roles]``.

    Raises:
        InputError: naming the campaign file and ``[model] family``, and how to add the section.
    """
    from fleetsieve_bayes.model.roles import missing_roles_message, needs_roles

    if needs_roles(campaign.configs) and not card.has_roles:
        raise InputError(f"{campaign.path}: [model] family: {missing_roles_message(campaign.family)}")


def build_strategy(setup: CampaignSetup, grid: CellGrid, problem: Any) -> Strategy:
    """The campaign's strategy for its grid: by name from the registry, or the object's own."""
    s = setup.strategy
    if isinstance(s, str):
        return make_strategy(s, grid, problem, setup.settings, seed=setup.seed)
    if isinstance(s, Strategy):
        return s
    return s.build(grid, problem, setup.settings, setup.seed)


def _seed_table_rows(campaign: Campaign) -> list[SeedRow]:
    """Rows of ``[measurement] seed_tables`` for the campaign's workloads, validated, first table first."""
    from fleetsieve_bayes.configs import table_for_campaign
    from fleetsieve_bayes.table import read_table

    out: list[SeedRow] = []
    names = set(campaign.workload_names)
    for i, path in enumerate(campaign.measurement.seed_tables):
        try:
            df = read_table(path)
            df = table_for_campaign(df, campaign.configs, str(path), str(campaign.path))
        except InputError as exc:
            raise _field_error(campaign, f"[measurement] seed_tables[{i}]", exc) from None
        for line, r in enumerate(df.to_dict(orient="records"), start=2):
            if r["workload"] not in names:
                continue
            row = plain_row({k: (None if v is pd.NA else v) for k, v in r.items()})
            gpu = str(r.get("gpu") or "") if campaign.pool_names and len(campaign.pool_names) > 1 else ""
            conf = str(r["config"]) if campaign.configs is not None else int(r["tp"])
            out.append((Cell(str(r["workload"]), conf, str(r["load"]), gpu), row, f"seed table {path} line {line}"))
    return out


def prepare_out(out: Path) -> tuple[bool, bool]:
    """Create the campaign directory; whether this call created it, and its lock file.

    Raises:
        InputError: ``out`` (or a parent) is a file.
        EnvironmentProblem: it cannot be created (read-only file system, permissions).
    """
    for p in [out, *out.parents]:
        if p.exists() and not p.is_dir():
            where = "is a file" if p == out else f"is under {p}, which is a file"
            raise InputError(f"--out {out}: {where}, not a campaign directory")
    created = not out.exists()
    lock_created = not (out / LOCK_NAME).exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / LOCK_NAME, "a"):
            pass
    except OSError as exc:
        raise EnvironmentProblem(f"--out {out}: cannot write the campaign directory ({exc.strerror or exc})") from None
    return created, lock_created


def undo_fresh_files(out: Path, created: bool, lock_created: bool) -> None:
    """Remove what this run created when it fails before journaling anything."""
    journal = out / JOURNAL_NAME
    if journal.exists() and journal.stat().st_size > 0:
        return
    with contextlib.suppress(OSError):
        journal.unlink()
    if lock_created:
        with contextlib.suppress(OSError):
            (out / LOCK_NAME).unlink()
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


def _new_header(setup: CampaignSetup, grid: CellGrid, reused_from: dict[str, Any] | None) -> Header:
    c = setup.campaign
    return Header(
        campaign=c.name,
        strategy=setup.strategy_name,
        seed=setup.seed,
        cells=tuple(cell_of(grid, i) for i in range(grid.n_cells)),
        created_at=time.time(),
        campaign_file=str(c.path),
        gpus=c.gpus,
        epsilon=c.epsilon,
        credible_level=c.credible_level,
        workloads=tuple({"name": w.name, **w.to_json()} for w in c.workloads),
        fingerprint=setup.fingerprint,
        inputs=setup.inputs,
        reused_from=reused_from,
    )


def _check_header(out: Path, header: Header, setup: CampaignSetup, grid: CellGrid, records: list[Any]) -> Any:
    """Refuse to resume a directory started with other decision inputs, naming what changed;
    a raised profiling budget is no change (:func:`~fleetsieve_bayes.campaign.budget.check_resume`):
    returns the ``budget`` record to append for it, else None."""
    from fleetsieve_bayes.campaign.budget import check_resume
    from fleetsieve_bayes.campaign.fingerprint import campaign_digest

    as_header, raised = check_resume(out, setup.campaign, records)
    what = mismatch(
        header.fingerprint,
        {**setup.fingerprint, "campaign": campaign_digest(as_header)},
        header.inputs,
        campaign_inputs(as_header),
        old_seed=header.seed,
        old_strategy=header.strategy,
    )
    if what is None and list(header.cells) != [cell_of(grid, c) for c in range(grid.n_cells)]:
        what = "candidate cells"
    if what is None and setup.reuse is not None:
        src = (header.reused_from or {}).get("directory")
        if src != str(setup.reuse.resolve()):
            what = f"measurements source ({src or 'none'} → {setup.reuse.resolve()})"
    if what is not None:
        raise InputError(
            f"{out}: this directory holds a campaign with other inputs — changed: {what}; "
            f"resume with the same inputs, or re-plan from its measurements with "
            f"--reuse-measurements {out} --out NEW_DIR"
        )
    return raised


def _reused_rows(setup: CampaignSetup, grid: CellGrid) -> tuple[list[SeedRow], dict[str, Any]]:
    """Measurements of the ``--reuse-measurements`` directory, checked against this campaign."""
    from fleetsieve_bayes.campaign.directory import load_campaign_dir
    from fleetsieve_bayes.table import validate_table

    src = setup.reuse
    assert src is not None
    try:
        view = load_campaign_dir(src)
    except InputError as exc:
        raise InputError(f"--reuse-measurements: {exc}") from None
    why = reuse_refusal(view.header.fingerprint, setup.fingerprint, view.header.inputs, setup.inputs)
    if why is not None:
        raise InputError(f"--reuse-measurements {src}: cannot re-plan from that campaign: {why}")
    profiled = [r for r in view.measurements if r.phase != PRODUCTION_PHASE]  # production windows stay behind
    if profiled:
        validate_table(pd.DataFrame(window_rows(profiled)), source=f"{src / JOURNAL_NAME}")
    index = grid.index()
    rows = []
    seen: set[tuple[Cell, int]] = set()
    for r in profiled:
        if tuple(r.cell) not in index:
            raise InputError(f"--reuse-measurements {src}: cell {r.cell.label} is not a candidate of this campaign")
        if (r.cell, r.replicate) in seen:
            continue  # a window journaled twice there counts once
        seen.add((r.cell, r.replicate))
        rows.append((r.cell, {**r.row, "replicate": r.replicate}, f"reused from {src.resolve()}"))
    info = {
        "directory": str(src.resolve()),
        "fingerprint": view.header.fingerprint,
        "measurements": len(rows),
        "gpu_seconds": view.gpu_seconds,
    }
    return rows, info


def _check_seed_cells(setup: CampaignSetup, grid: CellGrid) -> None:
    index = grid.index()
    seen: dict[Cell, str] = {}
    where = f"{setup.campaign.path}: [measurement] seed_tables"
    for cell, _, source in setup.seed_rows:
        if tuple(cell) not in index:
            raise InputError(f"{where}: {source}: cell {cell.label} is not a candidate of this campaign")
        table = source.rsplit(" line ", 1)[0]  # a cell's windows (replicates) come from one table
        if cell in seen and seen[cell].rsplit(" line ", 1)[0] != table:
            raise InputError(f"{where}: {source}: cell {cell.label} is also in {seen[cell]}")
        seen.setdefault(cell, source)


def begin(setup: CampaignSetup, out: Path, journal: Journal, grid: CellGrid, on_event: Any) -> bool:
    """Write the header and seeded rows of a new campaign, or check and complete those of
    a resumed one; True when resuming."""
    _check_seed_cells(setup, grid)
    header = journal.header
    reused: list[SeedRow] = []
    # Read and checked before the header is written: a refused report leaves no campaign
    # behind, whose resumption would go on without the production windows.
    production = production_inputs(setup.production, set(grid.index())) if header is None and setup.production else []
    if header is None:
        reused_from = None
        if setup.reuse is not None:
            reused, reused_from = _reused_rows(setup, grid)
        from fleetsieve_bayes.campaign.budget import check_design

        check_design(setup.campaign, grid, {cell for cell, _, _ in [*reused, *setup.seed_rows]})
        journal.append(_new_header(setup, grid, reused_from))
    else:
        raised = _check_header(out, header, setup, grid, journal.records)
        if raised is not None:
            journal.append(raised)
        on_event("resume", {"measured": len(journal.measurements), "candidates": grid.n_cells})
        want = (header.reused_from or {}).get("measurements", 0)
        have = sum(1 for r in journal.measurements if (r.source or "").startswith("reused from"))
        if have < want:  # killed while copying them: finish the copy
            reused, _ = _reused_rows(setup._replace(reuse=Path(header.reused_from["directory"])), grid)
    if production:
        for cell, row, source in production:
            journal.append(
                MeasurementRecord(
                    seq=len(journal.measurements), round=0, phase=PRODUCTION_PHASE, cell=cell, row=dict(row),
                    gpu_seconds=0.0, started_at=time.time(), finished_at=time.time(), wall_s=0.0, source=source,
                )
            )
    # Each window once: a seed table's (or the reused directory's) replicate k of a cell is its window k.
    held = {(r.cell, r.replicate) for r in journal.measurements if r.phase != PRODUCTION_PHASE}
    for cell, row, source in [*reused, *setup.seed_rows]:
        replicate = int(row.get("replicate") or 0)
        if (cell, replicate) in held:
            continue
        held.add((cell, replicate))
        journal.append(
            MeasurementRecord(
                seq=len(journal.measurements), round=0, phase="seed", cell=cell, row=dict(row),
                gpu_seconds=0.0, started_at=time.time(), finished_at=time.time(), wall_s=0.0, source=source,
                replicate=replicate,
            )
        )
    if header is not None:
        # A run killed between a window's journal record and the rewrite of measurements.csv
        # left the file a window short: a resumed run that measures nothing more still
        # leaves it whole.
        write_measurements(out, journal)
    return header is not None
