"""Workload classes from a production request log.

:func:`read_logs` reads the log (Azure 2023/2024, BurstGPT, Mooncake JSONL, or a
CSV with named columns), :func:`classify` splits it into classes (by service,
then k-means in log-length space), and :func:`write_outputs` writes per class a
replay trace, its demand and length distributions, a campaign skeleton and the
figures. ``fleetsieve-bayes classes`` is these three calls.
"""

from fleetsieve_bayes.workloads.classes import (
    Classification,
    ClassSummary,
    adjusted_rand_index,
    assign,
    classify,
)
from fleetsieve_bayes.workloads.logs import RequestLog, read_log, read_logs
from fleetsieve_bayes.workloads.output import summary, write_outputs

__all__ = [
    "RequestLog",
    "read_log",
    "read_logs",
    "Classification",
    "ClassSummary",
    "classify",
    "assign",
    "adjusted_rand_index",
    "summary",
    "write_outputs",
]
