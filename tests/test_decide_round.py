"""The stopping rule is one pure function of the round's facts."""

from __future__ import annotations

import pytest

from fleetsieve_bayes.round import RoundDecision, RoundFacts, decide_round


@pytest.mark.parametrize(
    ("facts", "decision"),
    [
        (RoundFacts(3, "certified-feasible", 5, None), RoundDecision("certified-feasible", False, "conservative")),
        (RoundFacts(3, "certified-feasible", 0, 1), RoundDecision("certified-feasible", False, "conservative")),
        (RoundFacts(1, "certified-infeasible", 5, None), RoundDecision("certified-infeasible", False, None)),
        (RoundFacts(9, "undecided", 0, None), RoundDecision("exhausted", False, "measured-only")),
        (RoundFacts(9, "undecided", 0, 3), RoundDecision("exhausted", False, "measured-only")),
        (RoundFacts(4, "undecided", 2, 3), RoundDecision("undecided", False, "conservative")),
        (RoundFacts(3, "undecided", 2, 3), RoundDecision("undecided", True, None)),
        (RoundFacts(1, "undecided", 7, None), RoundDecision("undecided", True, None)),
    ],
    ids=["feasible", "feasible-beats-limits", "infeasible", "exhausted", "exhausted-before-max-rounds",
         "out-of-rounds", "last-allowed-round-acquires", "acquire"],
)
def test_decide_round(facts: RoundFacts, decision: RoundDecision) -> None:
    assert decide_round(facts) == decision
