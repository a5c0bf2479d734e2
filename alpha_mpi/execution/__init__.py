"""Execution layer: runs realizations of declared trees over mpi4py (point-to-point only).

One executor (engine.Engine) runs every realization's program, its rounds in C (csrc/round/native.c,
built by the MPI's own mpicc at first use: native.py); endpoint.py holds alpha_mpi's state on
each user communicator (its one duplicate, executor numbering, tags, the build agreement) and
verdict.py the one round in which every rank learns every rank's word; frames.py owns headers,
waits.py waits and their bounds, abort.py how a failed job ends, log.py the debug log;
allreducer.py holds the executors by plan kind, convenience.py the cached calls
allreduce()/combine()/reduce_scatter().
"""

from .mpi_library import require_mpi

require_mpi()  # first: no MPI library is a named refusal, not mpi4py's bare RuntimeError

from .abort import abort_on_exception, set_abort_at_exit  # noqa: E402,F401
from .allreducer import (  # noqa: E402,F401
    REALIZATIONS,
    Allreducer,
    Chunk,
    Combiner,
    ScatterCombiner,
    choose_realization,
)
from .assembly import Assembler, assemble  # noqa: E402,F401
from .contract_combiner import ContractCombiner  # noqa: E402,F401
from .convenience import allreduce, combine, reduce_scatter, reset  # noqa: E402,F401
from .endpoint import Endpoint  # noqa: E402,F401
from .engine import Engine  # noqa: E402,F401

__all__ = [
    "Allreducer",
    "Combiner",
    "ScatterCombiner",
    "Chunk",
    "Endpoint",
    "Engine",
    "Assembler",
    "ContractCombiner",
    "allreduce",
    "combine",
    "reduce_scatter",
    "reset",
    "assemble",
    "choose_realization",
    "REALIZATIONS",
    "abort_on_exception",
    "set_abort_at_exit",
]
