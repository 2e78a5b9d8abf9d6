"""Judging decisions against ground truth: synthetic fleets and regret against the oracle."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "evaluate_run": "fleetsieve_bayes.evaluation.regret",
    "make_oracle": "fleetsieve_bayes.evaluation.regret",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
