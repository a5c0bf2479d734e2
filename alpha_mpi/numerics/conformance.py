"""Conformance suites and evidence: now `alpha_mpi.numerics.evidence` (and the conversion site
`alpha_mpi.numerics.conversion`); these names stay importable from here."""

from .conversion import convert_contribution
from .evidence import SUITES, ConformanceSuite, kernel_tree, measure_evidence, oracle_convert, suite

__all__ = [
    "ConformanceSuite",
    "SUITES",
    "suite",
    "measure_evidence",
    "convert_contribution",
    "kernel_tree",
    "oracle_convert",
]
