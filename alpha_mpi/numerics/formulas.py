"""Formula ids and evaluation orders: moved to `alpha_mpi.model.formulas` (contracts are data);
this name stays importable."""

from ..model.formulas import ADAM_V1, ALIASES, FORMULAS, NORMALIZE_ONCE, SGD_MOMENTUM_V1, assignments

__all__ = ["ADAM_V1", "SGD_MOMENTUM_V1", "NORMALIZE_ONCE", "FORMULAS", "ALIASES", "assignments"]
