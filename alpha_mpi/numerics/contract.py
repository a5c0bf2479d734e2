"""Removed in 0.2: `alpha_mpi.numerics.contract` was 0.1's re-export of names that moved.

Importing it raises ImportError naming where they went, instead of a bare ModuleNotFoundError.
"""

raise ImportError(
    "alpha_mpi.numerics.contract is gone (0.2): import the contract data (NumericalContract, "
    "contract_for_plan, numerical_compatibility, Profile, CombineOrder, BitIdentical, ...) from "
    "alpha_mpi.model (alpha_mpi.model.contract, .profile, .operations, .relation) or alpha_mpi.numerics, "
    "and authorize, claim_equal, check_live_profile, check_evidence, kernel_build_id from alpha_mpi.numerics "
    "(alpha_mpi.numerics.authorization, .evidence)"
)
