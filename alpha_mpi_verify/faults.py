"""Fault injection for the audit: the hook objects of `alpha_mpi.tools.bench.faults`, written
once there (`alpha-mpi bench audit --inject` draws them too), re-exported for the tests and jobs
that inject faults (`BitFlip`, `CarriedFlip`, `Faults`; that module's docstring says how)."""

from alpha_mpi.tools.bench.faults import BitFlip, CarriedFlip, Faults

__all__ = ["BitFlip", "CarriedFlip", "Faults"]
