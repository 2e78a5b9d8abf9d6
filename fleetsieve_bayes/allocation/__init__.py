"""The exact fleet allocation: the problem, the MILP solver (python-mip/CBC) and the batched JAX allocator."""
