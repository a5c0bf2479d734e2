"""Numerical contracts (DESIGN.md "Numerical contracts"): profile, operations, relation.

Where each part lives:

- the contract as data (profile, operations, relation, digest, to_dict/from_dict,
  numerical_compatibility, contract_for_plan): `alpha_mpi.model` (contract.py, profile.py,
  operations.py, relation.py, formulas.py), layer 1;
- authorization with conformance evidence, next to the kernel (layer 3): `authorization.py`
  (authorize, claim_equal, check_live_profile), `evidence.py` (suites, measure_evidence),
  `conversion.py` (the conversion site), `oracle_check.py` (comparing with the oracle);
- the contract-checked combine (layer 4, needs mpi4py): `alpha_mpi.execution.ContractCombiner`
  (was `alpha_mpi.numerics.execute` in 0.1; the old name says where it went).

This package re-exports all of them. Pure to import: the data names load eagerly and need
neither numpy, the compiled kernel nor MPI; the others load on first use.

    c = contract_for_plan(plan, optimizer="adam-v1")   # BitIdentical, FiniteOrRefuse
    authorize(c, plan=plan)                            # refuses what may not execute here
    Combiner(comm, plan, contract=c.digest)            # every frame names the contract
    numerical_compatibility(c, NumericalContract.from_dict(saved), theirs_name="the checkpoint")
"""

from .._lazy import lazy_attributes as _lazy_attributes
from ..model.contract import Contract, NumericalContract, contract_for_plan, numerical_compatibility
from ..model.formulas import ADAM_V1, ADAMW_V1, FORMULAS, NORMALIZE_ONCE, SGD_MOMENTUM_V1
from ..model.operations import CombineOrder, Formula
from ..model.profile import ContractRefusal, Conversion, KeepFormat, Profile, RoundBinary64, WidenBinary32
from ..model.relation import (
    DEFAULT_SUITE,
    BitIdentical,
    BoundedDifference,
    ConformanceEvidence,
    Tolerance,
    Unchecked,
)

_LAZY = {
    "authorize": ".authorization",
    "claim_equal": ".authorization",
    "check_live_profile": ".authorization",
    "kernel_build_id": ".evidence",
    "measure_evidence": ".evidence",
    "SUITES": ".evidence",
    "ConformanceSuite": ".evidence",
    "convert_contribution": ".conversion",
    "OracleMismatch": ".oracle_check",
    "check_against_oracle": ".oracle_check",
    "compare": ".oracle_check",
    "ulp_distance": ".oracle_check",
}

__all__ = [
    "NumericalContract",
    "Contract",
    "Profile",
    "Conversion",
    "KeepFormat",
    "WidenBinary32",
    "RoundBinary64",
    "CombineOrder",
    "Formula",
    "BitIdentical",
    "BoundedDifference",
    "Unchecked",
    "Tolerance",
    "ConformanceEvidence",
    "ContractRefusal",
    "DEFAULT_SUITE",
    "ADAM_V1",
    "ADAMW_V1",
    "SGD_MOMENTUM_V1",
    "NORMALIZE_ONCE",
    "FORMULAS",
    "contract_for_plan",
    "numerical_compatibility",
    *_LAZY,
]


#: 0.1 names that left this package: asking for one raises an error that says where it went.
_MOVED = {"ContractCombiner": "alpha_mpi.execution.ContractCombiner"}

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals(), moved=_MOVED)
