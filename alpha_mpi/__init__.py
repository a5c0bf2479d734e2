"""alpha_mpi: reductions across MPI ranks as declared binary64 expression trees.

Layers (each depends only on those above it): model -> planning -> kernel -> execution ->
learning -> tools. Importing the package loads only the pure layers; names from the execution
and learning layers are resolved on first use, so planning works without MPI initialised.
"""

from ._lazy import lazy_attributes as _lazy_attributes
from .model import (  # noqa: F401
    Branch,
    DeliverTo,
    Layout,
    Leaf,
    OrderedMembers,
    ParticipantGroup,
    ReplicateAll,
    hierarchy,
    pairwise,
    star,
)
from .planning import plan, plan_assembly, simulate  # noqa: F401
from .refusals import Refusal  # noqa: F401

__version__ = "0.2.0"

# name -> module (relative) for the layers that need MPI or the compiled kernel.
_LAZY = {
    "combine": ".execution",
    "Combiner": ".execution",
    "assemble": ".execution",
    "Assembler": ".execution",
    "Allreducer": ".execution",
    "allreduce": ".execution",
    "reduce_scatter": ".execution",
    "abort_on_exception": ".execution",
    "Preemption": ".learning",
    "NumericalContract": ".numerics",
    "contract_for_plan": ".numerics",
    "numerical_compatibility": ".numerics",
    "compute_identity": ".kernel",
    "environment": ".tools.environment",
}


#: The public names: the eager ones above, then the lazy ones (`dir(alpha_mpi)` lists both).
__all__ = [
    "Branch",
    "DeliverTo",
    "Layout",
    "Leaf",
    "OrderedMembers",
    "ParticipantGroup",
    "ReplicateAll",
    "hierarchy",
    "pairwise",
    "star",
    "plan",
    "plan_assembly",
    "simulate",
    "Refusal",
    *_LAZY,
]


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())
