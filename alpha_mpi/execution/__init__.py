"""Execution layer: runs plans over mpi4py with identity-checked frames (point-to-point only)."""

from .assembly import Assembler, assemble  # noqa: F401
from .combiner import Combiner, combine  # noqa: F401
from .allreduce import Allreducer, allreduce, reduce_scatter  # noqa: F401
from .scatter import ScatterCombiner  # noqa: F401
