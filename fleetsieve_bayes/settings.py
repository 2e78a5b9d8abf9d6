"""The decision's settings, as one value every layer may read.

:class:`DecisionSettings` carries what a campaign file sets for the decision
(ε, credible level, repeatability, the interval rules, risk, the round limit)
from the campaign to the bounds, the certificate, the certification attempt,
the batch planner and the strategies, instead of the same keywords forwarded
at every call. :class:`IntervalRules` (margins and knee guard, with the
evidence for their defaults) is one part of it. This module imports nothing
of the package: it sits at the bottom layer (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "MODEL_MARGIN",
    "SUCCESS_MARGIN",
    "KNEE_GUARD",
    "IntervalRules",
    "DEFAULT_RULES",
    "SLO_ATTAINMENT_POINT",
    "MAX_WINDOWS_PER_CELL",
    "CERTIFY_INFERENCE",
    "UNCERTIFIED_ANSWERS",
    "UNCERTIFIED_ANSWER",
    "ANSWER_CONFIDENCE",
    "PROBABLE_CONFIDENCES",
    "ALTERNATIVES",
    "DecisionSettings",
    "DEFAULT_SETTINGS",
]


# Model discrepancy of the tails (natural-log units): an unmeasured cell's TTFT
# and completion intervals are widened by ×/÷ e^MODEL_MARGIN (≈ 10.5 %) beyond
# the posterior predictive. Why: the posterior is calibrated *on average*
# (simulated-fleet coverage 0.89 at 90 %), but the curves are smooth shapes and
# real ones are not; the misses concentrate exactly where decisions are made —
# the last load below a sharp knee, whose neighbour above was measured deep in
# overload. There the model's lower bound lands a few percent above a truth
# sitting just under its SLO, the optimistic table rules the cell out, the gap
# closes and the certificate is false (suite fleet c037: TTFT 1.273 s against
# an SLO of 1.28 s, 90 % interval [1.39, 5.7] s). With the margin such a cell
# stays in the optimistic table until it is measured. Throughput and success
# are not widened: their misses are not decision-relevant on the suite.
MODEL_MARGIN = 0.1

# ... and of success, on the failure probability 1 − s (natural-log units): an
# unmeasured cell's failure probability interval is widened ×/÷ e^0.7 (≈ 2).
# Why: a serving run's failures come in bursts (timeouts behind one long
# prefill, a restarted worker), so the failure rate of one cell varies between
# runs far beyond binomial noise — the paper's repeats of chat TP4@C96 gave
# ≈ 0.99 four times and 0.943 once, and on the shipped grid success is not
# even monotone in the load (chat TP4: 0.999, 0.992, 0.995 at C64/C96/C128).
# The model's smooth logistic curve with one noise scale cannot know that;
# without this its 90 % intervals hold 0.82 of the left-out successes. A
# measured cell is not widened (its own measurement decides), and near 0 or 1
# the widening is multiplicative on what is left, so 1.0 stays 1.0.
SUCCESS_MARGIN = 0.7


# Load steps beneath a measured cell (same class and TP) that the model alone
# cannot rule out on its tails (rule 3). Why: the model's curves are smooth, a
# real knee is not, and a cell measured deep in overload drags the fitted knee
# below the last load that still meets the SLO. Without the guard, uniform
# random measurement fools the certificate exactly there (suite fleet c032: the
# only chat cell within SLO, TP4@C20 at TTFT 0.546 s against 0.547 s, is ruled
# out by the model once TP4@C22 is measured at 3.5 s; P(ε-optimal) 0.99). One
# step is enough: if the cell beneath a measured one is measured and fails
# too, the guard moves down with it; a cell further down is dominated by an
# admissible one above it (same class and TP, less throughput).
KNEE_GUARD = 1


class IntervalRules(NamedTuple):
    """A campaign's settings of the interval rules (:mod:`fleetsieve_bayes.decision.intervals`),
    carried as one value from the campaign file to the bounds, the certificate and the
    acquisition kernel."""

    tail_margin: float = MODEL_MARGIN
    success_margin: float = SUCCESS_MARGIN
    knee_guard: int = KNEE_GUARD


# The rules a campaign gets when its file names none.
DEFAULT_RULES = IntervalRules()

# How a cell's SLO attainment is read: "point" (its measured tails against the
# SLO) or a quantile q in (0, 1) of the attainment over measurement windows.
SLO_ATTAINMENT_POINT = "point"
# At most this many measurement windows of one cell: a cap, not the rule. Below it another
# window is measured only where it is worth more per GPU-second than the best new cell
# (decision.strategies.gap.worth_a_window). At 3 every wrong decision of the noisy suite
# (6 of 40, docs/results.md "Profiling cost on the noisy suite") ended with the cell to
# repeat at the cap, 4 of those cells truly admissible; the suite's tables hold 5 windows.
MAX_WINDOWS_PER_CELL = 5
# The certifying posterior's NUTS preset (fleetsieve_bayes/data/presets/certify.toml).
CERTIFY_INFERENCE = "certify"
# What a campaign at an attainment level answers when it ends without a certificate
# (undecided or exhausted); decision.bounds.best_estimate_table. A measured cell is
# admitted where the posterior probability that its attainment reaches its level is
# at least a confidence c (a cell never measured: only by its lower bound, as in the
# conservative table):
#   "credible"       c by the cell's level, ANSWER_CONFIDENCE below;
#   "best-estimate"  c = 0.5 (the posterior median attainment reaches the level);
#   a number c in [0.5, 1);
#   "probable"       of the answers at each c of PROBABLE_CONFIDENCES and the conservative
#                    one, the one the posterior finds most likely ε-optimal at the level
#                    (the joint check's P(ε-optimal), decision.joint_check.answer_chances);
#   "conservative"   attainment lower bounds, as a certificate reads them.
# The default is credible: on the finished campaigns of the noisy suite at level 0.5
# it is correct on more fleets than best-estimate, probable and conservative, and at
# level 0.9 it is best-estimate, as good as probable and better than conservative there
# (docs/results.md, "Uncertified answers by rule"). probable trusts the posterior's own
# odds, and at level 0.5 they favour answers that truly miss.
UNCERTIFIED_ANSWERS = ("credible", "best-estimate", "probable", "conservative")
UNCERTIFIED_ANSWER = "credible"
# "credible": the confidence c at each level, (level, c) points joined linearly and
# flat beyond the ends: 0.8 at level 0.5 and below, 0.5 (the median) at 0.8 and above.
# At level 0.5 a measured cell whose posterior median attainment reaches the level
# often truly misses it (of 14 uncertified fleets the median answer is correct on 5,
# c = 0.8 on 9); at 0.9 the posterior errs the other way and the median answer is
# among the best (of 12: 7, c = 0.8 on 6; docs/results.md, "Uncertified answers by
# rule": correct answers by c at both levels). Levels between 0.5 and 0.8 are
# interpolated, not measured.
ANSWER_CONFIDENCE = ((0.5, 0.8), (0.8, 0.5))
# "probable": the confidences whose answers it weighs (with the conservative answer),
# most cautious first; of answers equally likely to be ε-optimal the more cautious one.
PROBABLE_CONFIDENCES = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)
# Ranked fleets a finished campaign lists beside its answer (result.json's alternatives).
ALTERNATIVES = 5


class DecisionSettings(NamedTuple):
    """Everything the decision reads from the campaign file besides the fleet itself.

    Attributes:
        epsilon: the certificate's tolerance on each continuous stage (``[stopping] epsilon``).
        credible_level: central credible level of every interval (``[stopping] credible_level``).
        repeatability: relative band around a measured value (``[model] repeatability``).
        rules: tail and success margins and the knee guard (``[model]``).
        risk: a certified state needs the joint check's probability ≥ 1 − risk.
        max_rounds: acquisitions before the campaign stops undecided (None: no limit).
        slo_attainment: ``"point"`` or an attainment level q in (0, 1), one
            for all classes or a tuple with one per class (see
            :data:`SLO_ATTAINMENT_POINT`; :mod:`fleetsieve_bayes.decision.intervals`, rule 5).
        max_windows_per_cell: measurement windows of one cell at most.
        certify_inference: the certifying fit's NUTS preset, a shipped preset's
            name or a path (``[model] certify_inference``; default ``"certify"``).
        uncertified_answer: at an attainment level, the allocation an undecided or
            exhausted campaign answers with (:data:`UNCERTIFIED_ANSWERS`, or a
            confidence in [0.5, 1); ``[stopping] uncertified_answer``).
        alternatives: ranked fleets a finished campaign lists beside its answer
            (``[stopping] alternatives``; 0: none; :mod:`fleetsieve_bayes.decision.alternatives`).
    """

    epsilon: float = 0.05
    credible_level: float = 0.9
    repeatability: float = 0.0
    rules: IntervalRules = DEFAULT_RULES
    risk: float = 0.05
    max_rounds: int | None = None
    slo_attainment: float | str | tuple[float, ...] = SLO_ATTAINMENT_POINT
    max_windows_per_cell: int = MAX_WINDOWS_PER_CELL
    certify_inference: str = CERTIFY_INFERENCE
    uncertified_answer: str | float = UNCERTIFIED_ANSWER
    alternatives: int = ALTERNATIVES

    @classmethod
    def from_campaign(cls, campaign: Any) -> DecisionSettings:
        """The settings of a loaded campaign (:class:`fleetsieve_bayes.campaign.config.Campaign`)."""
        return cls(
            epsilon=float(campaign.epsilon),
            credible_level=float(campaign.credible_level),
            repeatability=float(campaign.repeatability),
            rules=IntervalRules(
                float(campaign.tail_margin), float(campaign.success_margin), int(campaign.knee_guard)
            ),
            risk=float(campaign.risk),
            max_rounds=campaign.max_rounds,
            slo_attainment=(
                campaign.slo_levels() if hasattr(campaign, "slo_levels")
                else getattr(campaign, "slo_attainment", SLO_ATTAINMENT_POINT)
            ),
            max_windows_per_cell=int(getattr(campaign, "max_windows_per_cell", MAX_WINDOWS_PER_CELL)),
            certify_inference=str(getattr(campaign, "certify_inference", CERTIFY_INFERENCE)),
            uncertified_answer=getattr(campaign, "uncertified_answer", UNCERTIFIED_ANSWER),
            alternatives=int(getattr(campaign, "alternatives", ALTERNATIVES)),
        )


# The settings of a campaign file that sets none of them.
DEFAULT_SETTINGS = DecisionSettings()
