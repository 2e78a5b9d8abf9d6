"""From posterior to decision: the interval and table rules, credible bounds, the certificate, the certification attempt, the initial design, batch planning, the acquisition kernel and the strategies."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "rule_bounds": "fleetsieve_bayes.decision.bounds",
    "conservative_table": "fleetsieve_bayes.decision.bounds",
    "optimistic_table": "fleetsieve_bayes.decision.bounds",
    "certify": "fleetsieve_bayes.decision.certificate",
    "Certificate": "fleetsieve_bayes.decision.certificate",
    "attempt_certification": "fleetsieve_bayes.decision.attempt",
    "CertificationAttempt": "fleetsieve_bayes.decision.attempt",
    "initial_design": "fleetsieve_bayes.decision.design",
    "believe": "fleetsieve_bayes.decision.batch",
    "plan_batch": "fleetsieve_bayes.decision.batch",
    "strategies": "fleetsieve_bayes.decision.strategies",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
