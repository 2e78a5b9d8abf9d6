"""The persistent compilation cache: one folder per host CPU and jaxlib, programs that
load from it in a later process, and a stderr free of XLA's AVX-512 false alarm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jaxlib

from fleetsieve_bayes.jax_cache import host_key, loader_false_alarm

REPO = Path(__file__).resolve().parent.parent

# A program slow enough to compile (≥ 1 s) that the cache keeps it, and its compile time.
_PROGRAM = """
import os, sys, time
{enable}
import jax, jax.numpy as jnp
def g(x):
    for i in range({steps}):
        x = jnp.tanh(x @ x.T * (i + 1)) + jnp.cumsum(x, axis=0)
    return x.sum()
t = time.perf_counter()
jax.jit(g).lower(jnp.ones((16, 16))).compile()
print(time.perf_counter() - t)
"""


def _program(enable: str, steps: int = 120) -> str:
    return _PROGRAM.format(enable=enable, steps=steps)


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "FLEETSIEVE_JAX_CACHE")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), full.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_host_key_names_jaxlib_and_is_stable() -> None:
    key = host_key()
    assert key.startswith(f"jaxlib-{jaxlib.__version__}-cpu-")
    assert key == host_key()


def test_the_probe_agrees_with_what_a_real_cache_load_logs(tmp_path: Path) -> None:
    """JAX's own cache, no package code: the second process loads what the first stored,
    and logs the loader's mismatch line exactly where the probe says it would."""
    plain = _program((
        "import jax\n"
        f"jax.config.update('jax_compilation_cache_dir', {str(tmp_path / 'raw')!r})\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)"
    ), steps=2)
    _run(plain, {})
    second = _run(plain, {})
    assert ("cpu_aot_loader" in second.stderr) == loader_false_alarm()


def test_a_cached_program_loads_quietly_from_the_host_folder(tmp_path: Path) -> None:
    enable = "from fleetsieve_bayes.jax_cache import enable_compilation_cache\nprint(enable_compilation_cache())"
    code = _program(enable)
    env = {"FLEETSIEVE_JAX_CACHE": str(tmp_path / "cache")}
    first = _run(code, env)
    second = _run(code, env)
    folder = Path(first.stdout.split()[0])
    assert folder == tmp_path / "cache" / host_key()
    assert any(folder.iterdir())
    assert second.stderr == ""
    # The second process loaded the program instead of compiling it again.
    assert float(second.stdout.split()[1]) < 0.5 * float(first.stdout.split()[1])


def test_a_cache_dir_given_to_jax_itself_is_kept_and_quiet(tmp_path: Path) -> None:
    enable = "from fleetsieve_bayes.jax_cache import enable_compilation_cache\nprint(enable_compilation_cache())"
    code = _program(enable, steps=2)  # every program is kept: any will do
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jaxown"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    _run(code, env)
    second = _run(code, env)
    assert Path(second.stdout.split()[0]) == tmp_path / "jaxown"
    assert second.stderr == ""


def test_off_means_no_cache_and_the_full_log(tmp_path: Path) -> None:
    enable = "from fleetsieve_bayes.jax_cache import enable_compilation_cache\nprint(enable_compilation_cache())"
    done = _run(_program(enable, steps=2), {"FLEETSIEVE_JAX_CACHE": "off", "HOME": str(tmp_path)})
    assert done.stdout.split()[0] == "None"
    assert not (tmp_path / ".cache").exists()
