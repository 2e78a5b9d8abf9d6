"""The exact fleet allocation: the problem, the lexicographic objective (stages, tolerance, gap weights, JSON), the MILP solver (python-mip/CBC) and the batched JAX allocator."""
