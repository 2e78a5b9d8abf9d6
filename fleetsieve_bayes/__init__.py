"""fleetsieve-bayes: decision-critical profiling for SLO-aware LLM fleet configuration."""

__version__ = "0.1.0"
