"""Model layer (layer 1): trees, coverage, topologies, delivery, payload layouts and numerical
contracts as data. Pure Python: no MPI, no numpy, no kernel."""

from .contract import NumericalContract, contract_for_plan, numerical_compatibility
from .coverage import Coverage, OrderedMembers, ParticipantGroup, check_coverage  # noqa: F401
from .delivery import DeliverTo, Delivery, ReduceScatter, ReplicateAll  # noqa: F401
from .layout import Layout, LayoutLike  # noqa: F401
from .operations import CombineOrder, Formula
from .profile import KeepFormat, Profile, RoundBinary64, WidenBinary32
from .relation import BitIdentical, BoundedDifference, ConformanceEvidence, Tolerance, Unchecked
from .topology import (  # noqa: F401
    Owners,
    Slots,
    block_owners,
    build,
    classify,
    hierarchy,
    pairwise,
    parse_topology,
    star,
)
from .tree import Branch, Leaf, Node, expression, leaf_sequence, postorder  # noqa: F401

__all__ = [
    "LayoutLike",
    "Delivery",
    "Coverage",
    "Slots",
    "Owners",
    "OrderedMembers",
    "ParticipantGroup",
    "check_coverage",
    "DeliverTo",
    "ReduceScatter",
    "ReplicateAll",
    "Layout",
    "block_owners",
    "build",
    "classify",
    "hierarchy",
    "pairwise",
    "parse_topology",
    "star",
    "Branch",
    "Leaf",
    "Node",
    "expression",
    "leaf_sequence",
    "postorder",
    "NumericalContract",
    "contract_for_plan",
    "numerical_compatibility",
    "CombineOrder",
    "Formula",
    "KeepFormat",
    "Profile",
    "RoundBinary64",
    "WidenBinary32",
    "BitIdentical",
    "BoundedDifference",
    "ConformanceEvidence",
    "Tolerance",
    "Unchecked",
]
