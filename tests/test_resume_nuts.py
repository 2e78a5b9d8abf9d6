"""Regression: a NUTS sampler state saved by one process resumes in another.

numpyro's ``sample_kernel`` reads settings that only its ``init_kernel`` sets;
a state loaded from ``warm_start/`` arrives in a process where init never ran
(``assert max_treedepth is not None`` before the fix). Two real processes: the
first fits cold and saves the state, the second loads it and fits warm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tiny_campaign import write_tiny

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import numpy as np

    from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
    from fleetsieve_bayes.decision.design import initial_design
    from fleetsieve_bayes.model import inference
    from fleetsieve_bayes.model.joint import model_data
    from fleetsieve_bayes.model.priors import load_card
    from fleetsieve_bayes.model.warm_start import load_warm_start, save_warm_start
    from fleetsieve_bayes.table import read_table

    mode, table, folder = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    df = read_table(table)
    grid = grid_from_table(df, ("chat", "code"))
    values = values_from_table(grid, df)
    measured = np.zeros(grid.n_cells, dtype=bool)
    measured[initial_design(grid)] = True
    card = load_card("dense-31b-fp8-h100")
    preset = inference.InferencePreset(
        name="tiny-nuts", method="nuts", chains=2, warmup=40, samples=40, max_tree_depth=4
    )
    if mode == "cold":
        post = inference.fit(grid, values, measured, card, preset, seed=1)
        save_warm_start(folder, post, round_no=1)
    else:
        warm = load_warm_start(folder, before_round=2)
        measured[0] = True
        post = inference.fit(grid, values, measured, card, preset, seed=2, warm_start=warm)
        objs = inference._nuts_kernel(model_data(grid, values, measured, None), card, preset)
        assert warm.state["key"] == objs.key, "the saved state was not reused"
        assert post.latent.shape == (80, grid.n_cells, 4)
        print("warm fit ok")
    """
)


def test_nuts_state_saved_by_one_process_resumes_in_another(tmp_path: Path) -> None:
    campaign = write_tiny(tmp_path / "c")
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    args = [str(campaign.parent / "grid.csv"), str(tmp_path / "warm_start")]
    cold = subprocess.run([sys.executable, str(script), "cold", *args], env=env, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert [p.suffix for p in (tmp_path / "warm_start").iterdir()] == [".npz"]
    warm = subprocess.run([sys.executable, str(script), "warm", *args], env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert warm.stdout.strip() == "warm fit ok"
