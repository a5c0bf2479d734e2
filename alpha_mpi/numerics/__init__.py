"""Numerical contracts (DESIGN.md "Numerical contracts"): profile, operations, relation.

Pure to import: the contract data, its digest, to_dict/from_dict and numerical_compatibility need
neither numpy, the compiled kernel nor MPI. `authorize` and `claim_equal` load the kernel when
called; conformance suites (`measure_evidence`, `SUITES`) and `ContractCombiner` (mpi4py) are
loaded on first use.

    c = contract_for_plan(plan, optimizer="adam-v1")   # BitIdentical, FiniteOrRefuse
    authorize(c, plan=plan)                            # refuses what may not execute here
    Combiner(comm, plan, contract=c.digest)            # every frame names the contract
    numerical_compatibility(c, NumericalContract.from_dict(saved), theirs_name="the checkpoint")
"""

from .contract import (  # noqa: F401
    DEFAULT_SUITE,
    BitIdentical,
    BoundedDifference,
    CombineOrder,
    ConformanceEvidence,
    Contract,
    ContractRefusal,
    Conversion,
    Formula,
    KeepFormat,
    NumericalContract,
    Profile,
    RoundBinary64,
    Tolerance,
    Unchecked,
    WidenBinary32,
    authorize,
    check_live_profile,
    claim_equal,
    contract_for_plan,
    kernel_build_id,
    numerical_compatibility,
)
from .formulas import ADAM_V1, FORMULAS, NORMALIZE_ONCE, SGD_MOMENTUM_V1  # noqa: F401

_LAZY = {
    "measure_evidence": ".conformance",
    "SUITES": ".conformance",
    "ConformanceSuite": ".conformance",
    "convert_contribution": ".conformance",
    "ContractCombiner": ".execute",
    "OracleMismatch": ".oracle_check",
    "check_against_oracle": ".oracle_check",
    "compare": ".oracle_check",
    "ulp_distance": ".oracle_check",
}


def __getattr__(name):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'alpha_mpi.numerics' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(target, __name__), name)
