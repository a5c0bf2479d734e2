"""Numerical contracts: the data now lives in the model layer (`alpha_mpi.model.contract`,
`.profile`, `.operations`, `.relation`), authorization next to the kernel
(`alpha_mpi.numerics.authorization`). Every name this module had stays importable from here;
the authorization names load the kernel on first use.
"""

from ..model.contract import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Contract,
    NumericalContract,
    as_contract,
    contract_for_plan,
    numerical_compatibility,
)
from ..model.operations import CombineOrder, Formula
from ..model.profile import (
    CONVERSIONS,
    EXCEPTIONAL,
    FORMATS,
    ROUNDINGS,
    SITE_SEQUENCES,
    SITES,
    SUBNORMALS,
    ContractRefusal,
    Conversion,
    KeepFormat,
    Profile,
    RoundBinary64,
    WidenBinary32,
)
from ..model.relation import (
    DEFAULT_SUITE,
    RELATIONS,
    BitIdentical,
    BoundedDifference,
    ConformanceEvidence,
    Tolerance,
    Unchecked,
)

_as_contract = as_contract

# Loaded on first use (they need the kernel): see numerics/authorization.py.
_AUTHORIZE = "EXECUTABLE kernel_build_id check_live_profile check_evidence authorize claim_equal".split()

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "DEFAULT_SUITE",
    "ROUNDINGS",
    "SUBNORMALS",
    "EXCEPTIONAL",
    "FORMATS",
    "SITES",
    "CONVERSIONS",
    "SITE_SEQUENCES",
    "RELATIONS",
    "ContractRefusal",
    "Conversion",
    "KeepFormat",
    "WidenBinary32",
    "RoundBinary64",
    "Profile",
    "CombineOrder",
    "Formula",
    "BitIdentical",
    "Unchecked",
    "Tolerance",
    "ConformanceEvidence",
    "BoundedDifference",
    "NumericalContract",
    "Contract",
    "numerical_compatibility",
    "contract_for_plan",
    *_AUTHORIZE,
]


def __getattr__(name):
    if name in _AUTHORIZE:
        import importlib

        return getattr(importlib.import_module(".authorization", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
