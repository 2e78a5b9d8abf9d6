"""The exact fleet allocation: the problem, the lexicographic objective (stages, tolerance, gap weights, JSON), the MILP solver (python-mip/CBC) and the batched JAX allocator."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "CellGrid": "fleetsieve_bayes.allocation.problem",
    "AllocationProblem": "fleetsieve_bayes.allocation.problem",
    "Allocation": "fleetsieve_bayes.allocation.problem",
    "grid_from_table": "fleetsieve_bayes.allocation.problem",
    "values_from_table": "fleetsieve_bayes.allocation.problem",
    "allocation_to_json": "fleetsieve_bayes.allocation.problem",
    "allocate_milp": "fleetsieve_bayes.allocation.milp",
    "allocate_jax": "fleetsieve_bayes.allocation.batched",
    "make_jax_allocator": "fleetsieve_bayes.allocation.batched",
    "objective_json": "fleetsieve_bayes.allocation.objective",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)
