"""The Python interface on the shipped H100 grid: a whole campaign, then the round by hand.

Run: python examples/python_api.py [CAMPAIGN [OUT_DIR]]   (default: examples/h100_31b_fp8)
"""

import sys
import tempfile
from pathlib import Path

import fleetsieve_bayes as fsb

shipped = Path(__file__).resolve().parent / "h100_31b_fp8" / "campaign.toml"
campaign = fsb.load_campaign(sys.argv[1] if len(sys.argv) > 1 else shipped)
out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp()) / "run"
result = fsb.run_campaign(campaign, out=out, strategy=fsb.strategies.Fleetsieve(), seed=0)
print(result.status, result.gpu_seconds, "GPU-s;", {w: p.replicas for w, p in result.allocation.items()})

state = fsb.init(campaign, seed=0)  # the same decision, one round at a time
settings = fsb.DecisionSettings.from_campaign(campaign)
while not state.done:
    state, step = fsb.step(state, settings)
    if step.chosen is not None:
        state = fsb.measure(state, step.chosen, repeat=step.repeat)
print(state.status, state.gpu_seconds, "GPU-s;", {w: p.replicas for w, p in fsb.allocation_of(state).items()})
