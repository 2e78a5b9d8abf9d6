"""The statistical model: prior cards, the joint hierarchical model, inference (NUTS/SVI) and its diagnostics."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "fit": "fleetsieve_bayes.model.inference",
    "Posterior": "fleetsieve_bayes.model.inference",
    "PriorCard": "fleetsieve_bayes.model.priors",
    "load_card": "fleetsieve_bayes.model.priors",
    "InferencePreset": "fleetsieve_bayes.model.presets",
    "load_preset": "fleetsieve_bayes.model.presets",
    "fit_certifying": "fleetsieve_bayes.model.converged_fit",
    "Convergence": "fleetsieve_bayes.model.converged_fit",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
