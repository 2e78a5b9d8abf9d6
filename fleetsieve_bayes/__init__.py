"""fleetsieve-bayes: decision-critical profiling for SLO-aware LLM fleet configuration.

The public interface (each name is imported when first used, so ``import
fleetsieve_bayes`` is cheap)::

    import fleetsieve_bayes as fsb

    campaign = fsb.load_campaign("examples/h100_31b_fp8/campaign.toml")
    result = fsb.run_campaign(campaign, out="runs/h100")   # a CampaignResult
    result.status, result.gpu_seconds, result.allocation["chat"].tp

    state = fsb.init(campaign, seed=0)                      # or the round by hand
    settings = fsb.DecisionSettings.from_campaign(campaign)
    while not state.done:
        state, out = fsb.step(state, settings)
        if out.chosen is not None:
            state = fsb.measure(state, out.chosen)
"""

from fleetsieve_bayes.exports import lazy_exports
from fleetsieve_bayes.numerics import use_float64

use_float64()  # before any JAX computation: docs/method.md, "Reproducibility"

__version__ = "0.1.0"

_OWNERS = {
    # campaigns
    "Campaign": "fleetsieve_bayes.campaign.config",
    "load_campaign": "fleetsieve_bayes.campaign.config",
    "run_campaign": "fleetsieve_bayes.campaign.runner",
    "CampaignResult": "fleetsieve_bayes.campaign.outputs",
    "Placement": "fleetsieve_bayes.campaign.outputs",
    "RunHooks": "fleetsieve_bayes.campaign.hooks",
    # the round
    "DecisionSettings": "fleetsieve_bayes.settings",
    "IntervalRules": "fleetsieve_bayes.settings",
    "CampaignState": "fleetsieve_bayes.round",
    "RoundOutcome": "fleetsieve_bayes.round",
    "step": "fleetsieve_bayes.round",
    "record": "fleetsieve_bayes.round",
    "init": "fleetsieve_bayes.api",
    "measure": "fleetsieve_bayes.api",
    "allocation_of": "fleetsieve_bayes.api",
    # the parts
    "fit": "fleetsieve_bayes.model.inference",
    "Posterior": "fleetsieve_bayes.model.inference",
    "load_card": "fleetsieve_bayes.model.priors",
    "load_preset": "fleetsieve_bayes.model.presets",
    "CellGrid": "fleetsieve_bayes.allocation.problem",
    "AllocationProblem": "fleetsieve_bayes.allocation.problem",
    "Allocation": "fleetsieve_bayes.allocation.problem",
    "allocate_milp": "fleetsieve_bayes.allocation.milp",
    "allocate_jax": "fleetsieve_bayes.allocation.batched",
    "certify": "fleetsieve_bayes.decision.certificate",
    "Certificate": "fleetsieve_bayes.decision.certificate",
    "attempt_certification": "fleetsieve_bayes.decision.attempt",
    "read_table": "fleetsieve_bayes.table",
    "InputError": "fleetsieve_bayes.errors",
    # families of objects
    "strategies": "fleetsieve_bayes.decision.strategies",
    "backends": "fleetsieve_bayes.backends",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
