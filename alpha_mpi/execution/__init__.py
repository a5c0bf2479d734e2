"""Execution layer: runs realizations of declared trees over mpi4py (point-to-point only).

One executor (engine.Engine) runs every realization's program, its rounds in C (csrc/round/,
built by the MPI's own mpicc at first use: native.py); endpoint.py holds alpha_mpi's state on
each user communicator (its one duplicate, executor numbering, tags, the build agreement) and
verdict.py the one round in which every rank learns every rank's word; frames.py owns headers,
waits.py waits and their bounds, abort.py how a failed job ends, log.py the debug log;
allreducer.py holds the executors by plan kind, convenience.py the cached calls
allreduce()/combine()/reduce_scatter().
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes as _lazy_attributes
from .mpi_library import require_mpi

require_mpi()  # first: no MPI library is a named refusal, not mpi4py's bare RuntimeError

# Every name loads on first use: the arrays need the endpoint and the engine, not the
# combiners, the contract checks or the convenience calls.
_LAZY = {
    "abort_on_exception": ".abort",
    "set_abort_at_exit": ".abort",
    "REALIZATIONS": ".allreducer",
    "Allreducer": ".allreducer",
    "Chunk": ".allreducer",
    "Combiner": ".allreducer",
    "ScatterCombiner": ".allreducer",
    "choose_realization": ".allreducer",
    "Assembler": ".assembly",
    "assemble": ".assembly",
    "ContractCombiner": ".contract_combiner",
    "allreduce": ".convenience",
    "combine": ".convenience",
    "reduce_scatter": ".convenience",
    "reset": ".convenience",
    "Endpoint": ".endpoint",
    "Engine": ".engine",
}

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

__getattr__, __dir__ = _lazy_attributes(__name__, _LAZY, globals())

if TYPE_CHECKING:  # the names as static readers see them (the API reference, type checkers)
    from .abort import abort_on_exception, set_abort_at_exit  # noqa: F401
    from .allreducer import REALIZATIONS, Allreducer, Chunk, Combiner, ScatterCombiner, choose_realization  # noqa: F401
    from .assembly import Assembler, assemble  # noqa: F401
    from .contract_combiner import ContractCombiner  # noqa: F401
    from .convenience import allreduce, combine, reduce_scatter, reset  # noqa: F401
    from .endpoint import Endpoint  # noqa: F401
    from .engine import Engine  # noqa: F401
