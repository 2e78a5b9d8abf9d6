"""Serving configurations: what one replica of a cell is (docs/contracts.md, "Configurations").

A campaign may declare a catalogue of configurations (``[[configs]]``). Each
is either

- **aggregated**: one engine on ``tp`` GPUs, or
- **disaggregated**: ``prefill = {tp, workers}`` and ``decode = {tp, workers}``,
  ``workers × tp`` GPUs per role,

with optional engine arguments under vLLM's names (``engine = {max_num_seqs =
256}``). A replica of a configuration uses :attr:`ServingConfig.gpus` GPUs. A
cell is then (class, configuration, load), with the GPU type when there are
pools.

Without a catalogue every TP degree of the table is its own aggregated
configuration (:func:`implicit_catalogue`), and everything reads, decides and
writes exactly as it did before catalogues existed.

Inside the package a resolved table's ``tp`` column holds the GPUs of one
replica of its row's configuration (:func:`resolve_configs`), so that
``duration_s × tp`` stays every row's GPU-seconds; what is written back out
names the configuration and gives ``tp`` only where it is an aggregated TP.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.errors import InputError

__all__ = [
    "KV_RECOMPUTE",
    "Role",
    "ServingConfig",
    "ENGINE_KEYS",
    "LAYOUT_KEYS",
    "parse_catalogue",
    "implicit_catalogue",
    "resolve_configs",
    "table_for_campaign",
    "config_index",
    "check_catalogue",
]

# The ``kv_connector`` of a disaggregated configuration that means no KV transfer: the decode
# worker recomputes the prompt (the campaign's ``[measurement] kv_connector``, plan's
# ``--kv-connector``).
KV_RECOMPUTE = "none"

# vLLM's engine arguments a configuration may set, by their EngineArgs names
# (vllm/engine/arg_utils.py, class EngineArgs; the CLI flag is the name with
# "_" as "-": max_num_seqs → --max-num-seqs). Parallelism is the layout's, not
# the engine's: see LAYOUT_KEYS.
ENGINE_KEYS: frozenset[str] = frozenset(
    {
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "gpu_memory_utilization",
        "block_size",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "max_num_partial_prefills",
        "max_long_partial_prefills",
        "long_prefill_token_threshold",
        "kv_cache_dtype",
        "swap_space",
        "cpu_offload_gb",
        "enforce_eager",
        "quantization",
        "dtype",
        "scheduling_policy",
        "async_scheduling",
        "num_gpu_blocks_override",
        "disable_custom_all_reduce",
        "enable_expert_parallel",
        "max_cudagraph_capture_size",
        "stream_interval",
        "preemption_mode",
        "max_logprobs",
        "disable_log_stats",
        "calculate_kv_scales",
    }
)
# Engine arguments a configuration's layout sets (tp and workers): naming them
# under `engine` would contradict the layout.
LAYOUT_KEYS: frozenset[str] = frozenset(
    {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "kv_transfer_config"}
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
_CONFIG_KEYS = {"name", "tp", "prefill", "decode", "engine"}
_ROLE_KEYS = {"tp", "workers"}


class Role(NamedTuple):
    """One role of a disaggregated replica: ``workers`` engines of ``tp`` GPUs each."""

    tp: int
    workers: int

    @property
    def gpus(self) -> int:
        return self.tp * self.workers


class ServingConfig(NamedTuple):
    """One serving configuration of the catalogue.

    ``tp`` is the TP of an aggregated configuration's one engine (None for a
    disaggregated one, whose ``prefill`` and ``decode`` roles are set).
    ``engine`` holds its engine arguments as sorted ``(name, value)`` pairs.
    """

    name: str
    tp: int | None = None
    prefill: Role | None = None
    decode: Role | None = None
    engine: tuple[tuple[str, Any], ...] = ()

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None

    @property
    def gpus(self) -> int:
        """GPUs of one replica: ``tp``, or ``Σ workers × tp`` over the roles."""
        if self.prefill is not None and self.decode is not None:
            return self.prefill.gpus + self.decode.gpus
        assert self.tp is not None
        return self.tp

    @property
    def engine_args(self) -> dict[str, Any]:
        return dict(self.engine)

    @property
    def layout(self) -> tuple[Any, ...]:
        """What makes two configurations the same: the layout and the engine arguments."""
        return (self.tp, self.prefill, self.decode, self.engine)

    def to_json(self) -> dict[str, Any]:
        """The catalogue entry as the journal header, the fingerprint and result.json record it."""
        out: dict[str, Any] = {"name": self.name, "gpus": self.gpus}
        if self.disaggregated:
            assert self.prefill is not None and self.decode is not None
            out["prefill"] = self.prefill._asdict()
            out["decode"] = self.decode._asdict()
        else:
            out["tp"] = self.tp
        if self.engine:
            out["engine"] = dict(self.engine)
        return out


def implicit_catalogue(tps: Iterable[int]) -> tuple[ServingConfig, ...]:
    """One aggregated configuration per TP degree, in increasing TP, named ``TP{n}``."""
    return tuple(ServingConfig(name=f"TP{int(t)}", tp=int(t)) for t in sorted({int(t) for t in tps}))


def _fail(source: str, where: str, msg: str) -> InputError:
    return InputError(f"{source}: {where}: {msg}")


def _positive_int(source: str, where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _fail(source, where, f"expected an integer >= 1, got {v!r}")
    return int(v)


def _role(source: str, where: str, v: Any) -> Role:
    if not isinstance(v, dict):
        raise _fail(source, where, f"expected a table {{tp, workers}}, got {v!r}")
    unknown = sorted(set(v) - _ROLE_KEYS)
    if unknown:
        raise _fail(source, f"{where}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(_ROLE_KEYS))}")
    if "tp" not in v:
        raise _fail(source, f"{where}.tp", "missing (the TP of each of the role's engines)")
    return Role(tp=_positive_int(source, f"{where}.tp", v["tp"]),
                workers=_positive_int(source, f"{where}.workers", v.get("workers", 1)))


def _engine(source: str, where: str, v: Any) -> tuple[tuple[str, Any], ...]:
    import difflib

    if not isinstance(v, dict):
        raise _fail(source, where, f"expected a table of vLLM engine arguments, got {v!r}")
    out = []
    for key, value in v.items():
        if key in LAYOUT_KEYS:
            raise _fail(source, f"{where}.{key}", "is set by the configuration's layout (tp, prefill, decode), "
                        "not under engine")
        if key not in ENGINE_KEYS:
            dashed = key.replace("-", "_")
            close = difflib.get_close_matches(dashed, sorted(ENGINE_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(source, f"{where}.{key}", f"vLLM has no engine argument {key!r}{hint}")
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(source, f"{where}.{key}", f"expected a finite value, got {value!r}")
        if not isinstance(value, (bool, int, float, str)):
            raise _fail(source, f"{where}.{key}", f"expected a number, a string or true/false, got {value!r}")
        if key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len") and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise _fail(source, f"{where}.{key}", f"expected an integer >= 1, got {value!r}")
        out.append((str(key), value))
    return tuple(sorted(out))


def _one_config(source: str, where: str, raw: Any) -> ServingConfig:
    if not isinstance(raw, dict):
        raise _fail(source, where, f"expected a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _CONFIG_KEYS)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(_CONFIG_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _fail(source, f"{where}.{unknown[0]}", f"unknown key{hint}; allowed: {', '.join(sorted(_CONFIG_KEYS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(source, f"{where}.name", f"expected a name of letters, digits and _ . + - (no spaces), got {name!r}")
    where = f"[[configs]] {name!r}"
    engine = _engine(source, f"{where} engine", raw.get("engine", {}))
    has_roles = "prefill" in raw or "decode" in raw
    if has_roles and "tp" in raw:
        raise _fail(source, where, "give either tp (aggregated) or prefill and decode (disaggregated), not both")
    if has_roles:
        for role in ("prefill", "decode"):
            if role not in raw:
                raise _fail(source, f"{where} {role}", "missing: a disaggregated configuration has both roles")
        return ServingConfig(name=name, prefill=_role(source, f"{where} prefill", raw["prefill"]),
                             decode=_role(source, f"{where} decode", raw["decode"]), engine=engine)
    if "tp" not in raw:
        raise _fail(source, where, "has no GPUs: give tp (aggregated) or prefill and decode (disaggregated)")
    return ServingConfig(name=name, tp=_positive_int(source, f"{where} tp", raw["tp"]), engine=engine)


def parse_catalogue(raw: Any, source: str) -> tuple[ServingConfig, ...]:
    """Validate a campaign's ``[[configs]]`` array.

    Raises:
        InputError: one line naming ``source`` and the entry: a missing or bad
            name, a configuration with no GPUs, an engine key vLLM does not have,
            two entries of one name, or two names for one layout.
    """
    if not isinstance(raw, list) or not raw:
        raise _fail(source, "[[configs]]", "expected a non-empty array of tables")
    configs = [_one_config(source, f"[[configs]] #{i + 1}", entry) for i, entry in enumerate(raw)]
    check_catalogue(configs, source)
    return tuple(configs)


def check_catalogue(configs: Sequence[ServingConfig], source: str) -> None:
    """Refuse two entries of one name (case-insensitive) or two names for one layout."""
    names: dict[str, str] = {}
    layouts: dict[tuple[Any, ...], str] = {}
    for c in configs:
        if c.name.lower() in names:
            raise _fail(source, f"[[configs]] {c.name!r}", f"the name is used twice (also {names[c.name.lower()]!r})")
        names[c.name.lower()] = c.name
        if c.layout in layouts:
            raise _fail(source, f"[[configs]] {c.name!r}",
                        f"is the same layout and engine arguments as {layouts[c.layout]!r}: two names for one layout")
        layouts[c.layout] = c.name


def config_index(configs: Sequence[ServingConfig]) -> dict[str, int]:
    """Name → position, case-insensitive."""
    return {c.name.lower(): i for i, c in enumerate(configs)}


def resolve_configs(df: pd.DataFrame, configs: Sequence[ServingConfig], source: str, row_offset: int = 0) -> pd.DataFrame:
    """A validated table's rows against the campaign's catalogue.

    Every row must name a catalogue entry in ``config``. A row that also gives
    ``tp`` must give its aggregated configuration's TP (a disaggregated row
    leaves it empty, or gives the replica's GPUs, as a journal's rows do). Returns a copy with ``config`` the entry's own spelling
    and ``tp`` the GPUs of one replica (so ``duration_s × tp`` is the row's
    GPU-seconds).

    Raises:
        InputError: one line naming ``source``, the row and the configuration.
    """
    if "config" not in df.columns:
        raise InputError(f"{source}: no 'config' column, but the campaign declares [[configs]]: every row must "
                         f"name its configuration")
    lookup = config_index(configs)
    names = df["config"].astype(str).str.strip().tolist()
    tps = df["tp"].to_numpy(np.int64)
    label = "line" if row_offset == 2 else "row"
    out_names, out_gpus = [], []
    for r, (name, tp) in enumerate(zip(names, tps, strict=True)):
        row = f"{label} {r + row_offset}"
        if name.lower() not in lookup:
            known = ", ".join(c.name for c in configs[:8]) + (", …" if len(configs) > 8 else "")
            raise InputError(f"{source}: {row}: config {name!r} is not in the campaign's [[configs]] ({known})")
        cfg = configs[lookup[name.lower()]]
        if tp != 0 and tp != cfg.gpus:
            want = f"tp {cfg.tp}" if cfg.tp is not None else f"an empty tp (it is disaggregated, {cfg.gpus} GPUs a replica)"
            raise InputError(f"{source}: {row}: config {cfg.name!r} has {want}, but the row says tp {int(tp)}")
        out_names.append(cfg.name)
        out_gpus.append(cfg.gpus)
    return df.assign(config=out_names, tp=np.asarray(out_gpus, np.int64))


def table_for_campaign(
    df: pd.DataFrame, configs: Sequence[ServingConfig] | None, source: str, campaign: str = "the campaign"
) -> pd.DataFrame:
    """A validated table read for a campaign: resolved against its catalogue (:func:`resolve_configs`),
    or, without one, as it is — unless its rows name configurations, which is refused in one line."""
    row_offset = 0 if str(source).lower().endswith(".parquet") else 2
    if configs is not None:
        return resolve_configs(df, configs, source, row_offset=row_offset)
    named = [i for i, c in enumerate(df["config"]) if str(c).strip()] if "config" in df.columns else []
    if named:  # the first row that names one, as resolve_configs names a row
        label, name = "line" if row_offset == 2 else "row", str(df["config"].iloc[named[0]]).strip()
        raise InputError(f"{source}: {label} {named[0] + row_offset}: config {name!r}: column 'config' names "
                         f"configurations, but {campaign} declares no [[configs]]")
    return df
