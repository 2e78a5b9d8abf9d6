"""Judging decisions against ground truth: synthetic fleets and regret against the oracle."""
