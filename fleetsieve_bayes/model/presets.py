"""Inference presets (TOML): NUTS and SVI settings, parsed like the campaign file.

Presets live under ``inference/`` (``default``, ``fast``, ``svi``) and are
referenced by name or path from the campaign's ``[model] inference``. They
are validated with the campaign file's validator
(:class:`fleetsieve_bayes.validation.Validator`): an unknown key is an
error with a did-you-mean hint, every value is checked by type and range, and
every error is one line naming the file and the field.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.validation import Validator

__all__ = ["InferencePreset", "load_preset", "list_presets", "parse_preset", "GUIDES", "CHAIN_METHODS", "ADAPTATIONS"]

GUIDES = (
    "AutoNormal",
    "AutoMultivariateNormal",
    "AutoDiagonalNormal",
    "AutoLowRankMultivariateNormal",
)
CHAIN_METHODS = ("vectorized", "sequential", "parallel")
# NUTS warm-up schemes (see fleetsieve_bayes.model.inference): "windowed" is
# NumPyro's (Stan's) per-chain windows; "pooled" tunes the step size under a
# fixed mass in two halves, the second half's mass estimated from every
# chain's first-half draws together.
ADAPTATIONS = ("windowed", "pooled")


class InferencePreset(NamedTuple):
    """A validated inference preset."""

    name: str
    method: str  # "nuts" | "svi"
    chains: int = 2
    chain_method: str = "vectorized"
    warmup: int = 500
    samples: int = 500
    target_accept: float = 0.9
    max_tree_depth: int = 8
    dense_mass: bool = True
    guide: str = "AutoMultivariateNormal"
    optimizer: str = "adam"
    learning_rate: float = 0.01
    steps: int = 4000
    warm_steps: int = 500
    draws: int = 400
    adaptation: str = "windowed"

    @property
    def n_draws(self) -> int:
        """Posterior draws per fit (fixed per preset)."""
        return self.chains * self.samples if self.method == "nuts" else self.draws


_SECTIONS = {
    "nuts": ("chains", "chain_method", "warmup", "samples", "target_accept", "max_tree_depth", "dense_mass", "adaptation"),
    "svi": ("guide", "optimizer", "learning_rate", "steps", "warm_steps", "draws"),
}


def list_presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in data_dir("inference").glob("*.toml"))


def _preset_path(name_or_path: str | Path) -> Path:
    s = str(name_or_path)
    p = Path(s)
    if not (p.suffix == ".toml" or "/" in s):
        p = data_dir("inference") / f"{s}.toml"
        if not p.is_file():
            names = list_presets()
            close = difflib.get_close_matches(s, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"inference preset {s!r} not found{hint}; shipped: {', '.join(names)}")
    if not p.is_file():
        raise InputError(f"{p}: inference preset not found")
    return p


def load_preset(name_or_path: str | Path) -> InferencePreset:
    """Load an inference preset by name (``inference/<name>.toml``) or path.

    Raises:
        InputError: not found, bad TOML, unknown key (did-you-mean), bad value.
    """
    p = _preset_path(name_or_path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{p}: cannot read inference preset: {exc}") from None
    return parse_preset(raw, p)


def _value(v: Validator, where: str, key: str, value: Any) -> Any:
    """One setting, checked against the type (and range) of its default."""
    default = getattr(InferencePreset(name="", method="nuts"), key)
    if isinstance(default, bool):
        return v.boolean(where, value)
    if isinstance(default, int):
        return v.integer(where, value, lo=1)
    if isinstance(default, float):
        hi_open = key == "target_accept"
        return v.number(where, value, lo=0.0, lo_open=True, hi=1.0 if hi_open else None, hi_open=hi_open)
    return v.string(where, value)


def parse_preset(raw: dict[str, Any], path: Path) -> InferencePreset:
    """Validate an already-parsed preset mapping; ``path`` names it in errors."""
    import optax

    v = Validator(path)
    v.check_keys("top level", raw, {"method", *_SECTIONS})
    method = raw.get("method")
    if method not in _SECTIONS:
        raise v.fail("method", f'must be "nuts" or "svi", got {method!r}')
    table = v.table(f"[{method}]", raw.get(method, {}))
    v.check_keys(f"[{method}]", table, set(_SECTIONS[method]))
    values = {key: _value(v, f"[{method}] {key}", key, value) for key, value in table.items()}
    preset = InferencePreset(name=path.stem, method=method, **values)
    if preset.chain_method not in CHAIN_METHODS:
        raise v.fail("[nuts] chain_method", f"must be one of {', '.join(CHAIN_METHODS)}")
    if preset.adaptation not in ADAPTATIONS:
        raise v.fail("[nuts] adaptation", f"must be one of {', '.join(ADAPTATIONS)}")
    if preset.adaptation == "pooled" and (preset.warmup % 4 or preset.warmup < 40):
        raise v.fail("[nuts] warmup", 'must be a multiple of 4, at least 40, with adaptation = "pooled" (two halves)')
    if preset.guide not in GUIDES:
        raise v.fail("[svi] guide", f"must be one of {', '.join(GUIDES)}")
    if not hasattr(optax, preset.optimizer):
        raise v.fail("[svi] optimizer", f"{preset.optimizer!r} is not an optax optimizer")
    if method == "svi" and preset.steps % preset.warm_steps:
        raise v.fail("[svi] steps", "must be a multiple of 'warm_steps'")
    return preset
