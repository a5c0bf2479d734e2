"""Allreduce by a declared tree, realized by the tree schedule or the scatter schedule (layer 4).

Both realizations evaluate every coordinate in the declared order, so they give the same bits and
share one order id; they differ in where coordinates are computed and what moves:

- "tree" (execution/combiner.py): the payload travels up the placed tree and back down. Fewest
  messages and hops per rank: the latency realization for small payloads.
- "scatter" (execution/scatter.py): coordinates cut into one chunk per rank, each chunk's whole
  tree evaluated at its owner, chunks gathered: every rank moves 2(p-1)/p of the vector: the
  bandwidth realization for large payloads.

"auto" picks by payload size: scatter from `crossover_bytes` up (argument, else the environment
variable ALPHA_MPI_CROSSOVER_BYTES, else p * DEFAULT_CROSSOVER_BYTES_PER_RANK, measured on the
development machine with `alpha-mpi bench allreduce`: the tree and scatter realizations cost the
same at about 64 KiB per rank, i.e. 128 KiB at p = 2 and 256 KiB at p = 4). Every rank must
choose the same: the choice depends only on the layout, p and the crossover, so give every rank
the same environment. A rank that runs the other realization is refused by name (its frames name
another plan identity), or times out with peer-timeout.
"""

from __future__ import annotations

import os

from ..model.delivery import ReplicateAll
from ..planning import Plan, plan as make_plan
from ..planning.scatter_plan import ReduceScatter, ScatterPlan, plan_scatter
from ..refusals import PlanRefusal, Refusal
from .combiner import Combiner, _cached_comm, _infer_layout
from .scatter import ScatterCombiner
from .transport import library_comm

# Payload bytes per rank from which "auto" uses the scatter realization: the crossover is
# p * DEFAULT_CROSSOVER_BYTES_PER_RANK. Measured with benchmarks/sweep_allreduce.sh (MPICH
# 5.0.2, 2-core KVM guest): tree and scatter break even at 64-128 KiB for p = 2 and at 128-256
# KiB for p = 4 (see README "Benchmarks"). Override per call (crossover_bytes=, absolute bytes)
# or per job (ALPHA_MPI_CROSSOVER_BYTES, absolute bytes).
DEFAULT_CROSSOVER_BYTES_PER_RANK = 64 * 1024

REALIZATIONS = ("auto", "tree", "scatter")


def default_crossover(size: int) -> int:
    """The built-in crossover for `size` ranks (bytes of payload)."""
    return max(1, int(size)) * DEFAULT_CROSSOVER_BYTES_PER_RANK


def crossover_from_env(crossover_bytes=None, size: int = 2) -> int:
    """The crossover in payload bytes: the argument, else ALPHA_MPI_CROSSOVER_BYTES, else the
    built-in default for `size` ranks."""
    if crossover_bytes is not None:
        value, source = crossover_bytes, "crossover_bytes"
    else:
        value, source = os.environ.get("ALPHA_MPI_CROSSOVER_BYTES"), "ALPHA_MPI_CROSSOVER_BYTES"
        if value in (None, ""):
            return default_crossover(size)
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise Refusal("usage", f"{source} must be a byte count, got {value!r}") from None
    if out < 0:
        raise Refusal("usage", f"{source} must be >= 0, got {out}")
    return out


def choose_realization(payload_bytes: int, realization: str = "auto", crossover_bytes=None, size: int = 2) -> str:
    """'tree' or 'scatter' for a payload of `payload_bytes` on `size` ranks."""
    if realization not in REALIZATIONS:
        raise Refusal("usage", f"realization must be one of {', '.join(REALIZATIONS)}, got {realization!r}")
    if realization != "auto":
        return realization
    return "scatter" if payload_bytes >= crossover_from_env(crossover_bytes, size) else "tree"


class Allreducer:
    """Combine by `tree` repeatedly on `comm` with the realization chosen for the payload size.

    Build it on every rank (collectively: it duplicates the communicator). `tree` is a tree
    (Node) or a tree Plan; `layout` a Layout or an element count (taken from the Plan if None).
    `.realization` says which realization runs, `.plan` its plan, `.order_id` the declared order
    (the same for both realizations). `run(contributions, out=None)` returns the combined payload
    where delivery reaches this rank, else None (`out` is then left as it was).
    """

    def __init__(self, comm, tree, layout=None, delivery=None, realization: str = "auto", crossover_bytes=None, *,
                 timeout=None, contract: str = "", segment=None, depth=None, coverage=None, dup: bool = True):
        size = comm.Get_size()
        if isinstance(tree, Plan):
            tree_plan = tree
            if tree_plan.size != size:
                raise PlanRefusal("plan-rank-mismatch", f"plan is for {tree_plan.size} ranks, communicator has {size}")
            if delivery is not None and delivery != tree_plan.delivery:
                raise PlanRefusal("plan-rank-mismatch", f"delivery {delivery!r} differs from the plan's {tree_plan.delivery!r}")
        else:
            if layout is None:
                raise Refusal("contribution-shape", "Allreducer needs a layout (a Layout or an element count) with a tree")
            tree_plan = make_plan(tree, ReplicateAll() if delivery is None else delivery, layout, size=size, coverage=coverage)
        if isinstance(tree_plan.delivery, ReduceScatter):  # pragma: no cover - plan() refuses it
            raise PlanRefusal("plan-rank-mismatch", "use reduce_scatter() / ScatterCombiner for ReduceScatter")
        self.tree_plan = tree_plan
        self.order_id = tree_plan.order_id
        self.crossover_bytes = crossover_from_env(crossover_bytes, size)
        self.realization = choose_realization(tree_plan.layout.nbytes, realization, self.crossover_bytes, size)
        self.comm = library_comm(comm) if dup else comm
        self._owns_comm = dup
        if self.realization == "tree":
            self.plan = tree_plan
            self.executor = Combiner(self.comm, tree_plan, timeout=timeout, contract=contract, dup=False)
        else:
            self.plan = plan_scatter(tree_plan, segment=segment)
            self.executor = ScatterCombiner(self.comm, self.plan, timeout=timeout, contract=contract, dup=False, depth=depth)

    @property
    def identity(self) -> str:
        return self.plan.identity

    @property
    def broken(self):
        return self.executor.broken

    def run(self, contributions, out=None):
        return self.executor.run(contributions, out=out)

    __call__ = run

    def free(self) -> None:
        """Free the persistent requests (and the duplicated communicator, if this made one)."""
        self.executor.free()
        if self._owns_comm:
            self._owns_comm = False
            self.comm.Free()


_CACHE: dict = {}


def _tree_plan(comm, tree, contributions, delivery, layout, coverage):
    if isinstance(tree, Plan):
        return tree
    if layout is None:
        layout = _infer_layout(contributions)
    return make_plan(tree, delivery, layout, size=comm.Get_size(), coverage=coverage)


def allreduce(comm, tree, contributions, delivery=None, *, layout=None, out=None, realization: str = "auto",
              crossover_bytes=None, timeout=None, segment=None, coverage=None):
    """Combine `contributions` (slot -> float64 array, or (numerator, mass) tuple) by `tree`
    (a Node or a tree Plan) with the realization chosen by payload size (see the module
    docstring). Returns the combined payload where delivery reaches this rank, else None.
    Executors are cached per communicator, plan and realization (no re-planning in loops)."""
    tp = _tree_plan(comm, tree, contributions, delivery, layout, coverage)
    crossover = crossover_from_env(crossover_bytes, tp.size)
    chosen = choose_realization(tp.layout.nbytes, realization, crossover, tp.size)
    key = ("allreduce", comm.py2f(), tp.identity, chosen, segment)
    a = _CACHE.get(key)
    if a is None or a.broken is not None:
        a = _CACHE[key] = Allreducer(_cached_comm(comm), tp, realization=chosen, timeout=timeout, segment=segment, dup=False)
    return a.run(contributions, out=out)


def reduce_scatter(comm, tree, contributions, *, layout=None, out=None, timeout=None, segment=None, coverage=None):
    """Reduce by `tree` and keep chunk c of the result at rank c only (the scatter realization
    without its gather). Returns (start, stop, values of coordinates start..stop-1) on every
    rank; chunks are contiguous, in rank order, sizes differing by at most one (possibly empty
    when the payload has fewer coordinates than ranks). `out`: an array of the chunk's length
    or of the whole payload (then the chunk is written at out[start:stop]). A non-finite
    combine is refused on every rank."""
    if isinstance(tree, ScatterPlan):
        sp = tree
    else:
        if isinstance(tree, Plan):
            base = tree
        else:
            if layout is None:
                layout = _infer_layout(contributions)
            base = make_plan(tree, None, layout, size=comm.Get_size(), coverage=coverage)
        sp = plan_scatter(base, ReduceScatter(), segment=segment)
    if not isinstance(sp.delivery, ReduceScatter):
        raise PlanRefusal("plan-rank-mismatch", "reduce_scatter() needs a plan made with ReduceScatter()")
    if sp.size != comm.Get_size():
        raise PlanRefusal("plan-rank-mismatch", f"plan is for {sp.size} ranks, communicator has {comm.Get_size()}")
    key = ("reduce-scatter", comm.py2f(), sp.identity)
    c = _CACHE.get(key)
    if c is None or c.broken is not None:
        c = _CACHE[key] = ScatterCombiner(_cached_comm(comm), sp, timeout=timeout, dup=False)
    return c.reduce_scatter_run(contributions, out=out)


__all__ = ["Allreducer", "allreduce", "reduce_scatter", "choose_realization", "default_crossover",
           "DEFAULT_CROSSOVER_BYTES_PER_RANK", "ReduceScatter"]
