"""Removed in 0.2: `alpha_mpi.numerics.conformance` was 0.1's re-export of the evidence names.

Importing it raises ImportError naming where the names went.
"""

raise ImportError(
    "alpha_mpi.numerics.conformance is gone (0.2): import ConformanceSuite, SUITES, suite, "
    "measure_evidence, kernel_tree and oracle_convert from alpha_mpi.numerics.evidence, and "
    "convert_contribution from alpha_mpi.numerics.conversion (all but kernel_tree, oracle_convert "
    "and suite also from alpha_mpi.numerics)"
)
