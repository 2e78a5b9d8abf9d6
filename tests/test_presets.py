"""Inference presets: parsed with the campaign file's validator, one line per error."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.presets import InferencePreset, list_presets, load_preset


def test_shipped_presets_load():
    assert {"default", "fast", "svi"} <= set(list_presets())
    fast = load_preset("fast")
    assert fast == InferencePreset(
        name="fast", method="nuts", chains=2, chain_method="parallel", warmup=800, samples=250,
        target_accept=0.9, max_tree_depth=8, dense_mass=True,
    )
    assert fast.n_draws == 500
    assert load_preset("svi").n_draws == 400


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('method = "hmc"\n', "method: must be \"nuts\" or \"svi\""),
        ('method = "nuts"\n[nuts]\nchians = 2\n', "[nuts]: unknown key 'chians' (did you mean 'chains'?)"),
        ('method = "nuts"\nnust = 1\n', "top level: unknown key 'nust'"),
        ('method = "nuts"\n[nuts]\nchains = 0\n', "[nuts] chains: must be >= 1"),
        ('method = "nuts"\n[nuts]\nchains = 2.5\n', "[nuts] chains: expected an integer"),
        ('method = "nuts"\n[nuts]\ntarget_accept = 1.0\n', "[nuts] target_accept: must be < 1"),
        ('method = "nuts"\n[nuts]\ndense_mass = "yes"\n', "[nuts] dense_mass: expected true or false"),
        ('method = "nuts"\n[nuts]\nchain_method = "threads"\n', "[nuts] chain_method: must be one of"),
        ('method = "svi"\n[svi]\nguide = "AutoFoo"\n', "[svi] guide: must be one of"),
        ('method = "svi"\n[svi]\noptimizer = "nope"\n', "[svi] optimizer: 'nope' is not an optax optimizer"),
        ('method = "svi"\n[svi]\nsteps = 1000\nwarm_steps = 300\n', "[svi] steps: must be a multiple"),
        ('method = "svi"\n[svi]\nlearning_rate = -0.1\n', "[svi] learning_rate: must be > 0"),
        ('method = "nuts"\n[nuts\n', "cannot read inference preset"),
        ('method = "nuts"\n[nuts]\nadaptation = "stan"\n', "[nuts] adaptation: must be one of windowed, pooled"),
        ('method = "nuts"\n[nuts]\nadaptation = "pooled"\nwarmup = 42\n', "[nuts] warmup: must be a multiple of 4"),
    ],
)
def test_bad_preset_is_one_line_naming_file_and_field(tmp_path: Path, text: str, needle: str):
    p = tmp_path / "mine.toml"
    p.write_text(text)
    with pytest.raises(InputError) as err:
        load_preset(p)
    msg = str(err.value)
    assert "\n" not in msg and str(p) in msg and needle in msg, msg


def test_unknown_preset_name_suggests_a_shipped_one():
    with pytest.raises(InputError, match="did you mean 'fast'"):
        load_preset("fats")


def test_ints_for_floats_are_accepted(tmp_path: Path):
    p = tmp_path / "p.toml"
    p.write_text('method = "svi"\n[svi]\nlearning_rate = 1\nsteps = 600\nwarm_steps = 300\n')
    preset = load_preset(p)
    assert preset.learning_rate == 1.0 and isinstance(preset.learning_rate, float)
    assert preset.name == "p" and preset.steps == 600
