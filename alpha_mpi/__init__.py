"""alpha_mpi: reductions across MPI ranks as declared binary64 expression trees.

Layers (each depends only on those above it): model -> planning -> kernel -> execution ->
learning -> tools. Importing the package loads none of them: every name is resolved on first
use (a program pays for what it calls), and the names of the pure layers load without MPI, so
planning works without MPI initialised.
"""

from ._lazy import lazy_attributes as _lazy_attributes

__version__ = "0.2.0"

# name -> module (relative): the pure layers' names, then those that need MPI or the kernel.
_LAZY = {
    "Branch": ".model",
    "DeliverTo": ".model",
    "Layout": ".model",
    "Leaf": ".model",
    "OrderedMembers": ".model",
    "ParticipantGroup": ".model",
    "ReplicateAll": ".model",
    "hierarchy": ".model",
    "pairwise": ".model",
    "star": ".model",
    "plan": ".planning",
    "plan_assembly": ".planning",
    "simulate": ".planning",
    "Refusal": ".refusals",
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


#: The public names (`dir(alpha_mpi)` lists them).
__all__ = [*_LAZY]


__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())
