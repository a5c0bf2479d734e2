"""Removed in 0.2: `alpha_mpi.numerics.formulas` was 0.1's re-export of `alpha_mpi.model.formulas`.

Importing it raises ImportError naming where the names went.
"""

raise ImportError(
    "alpha_mpi.numerics.formulas is gone (0.2): import ADAM_V1, SGD_MOMENTUM_V1, NORMALIZE_ONCE, "
    "FORMULAS, ALIASES and assignments from alpha_mpi.model.formulas"
)
