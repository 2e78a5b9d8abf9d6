"""The statistical model: prior cards, the joint hierarchical model, inference (NUTS/SVI) and its diagnostics."""
