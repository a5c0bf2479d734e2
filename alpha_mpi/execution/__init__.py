"""Execution layer: runs realizations of declared trees over mpi4py (point-to-point only).

One executor (engine.Engine) runs every realization's program; frames.py owns headers,
transport.py owns waits, bounds and the debug log.
"""

from .abort import abort_on_exception  # noqa: F401
from .allreduce import (  # noqa: F401
    REALIZATIONS,
    Allreducer,
    Chunk,
    Combiner,
    ScatterCombiner,
    allreduce,
    choose_realization,
    combine,
    reduce_scatter,
)
from .assembly import Assembler, assemble  # noqa: F401
from .contract_combiner import ContractCombiner  # noqa: F401
from .engine import Engine  # noqa: F401

__all__ = [
    "Allreducer",
    "Combiner",
    "ScatterCombiner",
    "Chunk",
    "Engine",
    "Assembler",
    "ContractCombiner",
    "allreduce",
    "combine",
    "reduce_scatter",
    "assemble",
    "choose_realization",
    "REALIZATIONS",
    "abort_on_exception",
]
