"""Allreduce and reduce-scatter by a declared tree, by any realization of it (layer 4).

Every realization evaluates every coordinate in the declared order, so they all give the tree's
bits and share its order id; they differ in where coordinates are computed and what moves
(planning/realize.py). `auto` picks the applicable realization with the lowest α–β–γ estimate
(planning/cost.py): typically butterfly for small payloads and halving for large ones on a
pairwise tree over 2^k ranks; replicate, tree or scatter for other trees. The choice depends
only on the tree plan, the rank count and the calibration, so every rank makes the same one
(give every rank the same ALPHA_MPI_CALIBRATION).

The convenience calls (`allreduce`, `combine`, `reduce_scatter`) and their cache are in
convenience.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..model.delivery import ReduceScatter, ReplicateAll
from ..model.deprecation import deprecated_order_id
from ..planning import Plan
from ..planning.cost import choose, load_calibration
from ..planning.program import Program
from ..planning.realize import REALIZATIONS as NAMES
from ..planning.realize import applicable, as_tree_plan, realize
from ..refusals import PlanRefusal, Refusal
from .endpoint import Endpoint
from .engine import Engine
from .engine_bind import Chunk

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..model.coverage import Coverage
    from ..model.delivery import DeliverTo
    from ..model.layout import LayoutLike
    from ..model.tree import Node
    from ..planning.cost import Calibration
    from .contributions import Contributions
    from .endpoint import Stream

REALIZATIONS = ("auto",) + NAMES


def _check_realization(realization: str) -> None:
    if realization not in REALIZATIONS:
        raise Refusal("usage", f"realization must be one of {', '.join(REALIZATIONS)}, got {realization!r}")


def choose_realization(
    tp: Plan, realization: str = "auto", mode: str = "allreduce", calibration: Calibration | None = None
) -> tuple[str, dict[str, float]]:
    """(name, estimates {name: seconds}) for tree plan `tp`: `realization` itself if not auto
    (refused by name if inapplicable), else the applicable one with the lowest estimate."""
    _check_realization(realization)
    ok = [k for k, why in applicable(tp, mode).items() if why is None]
    cal = calibration if calibration is not None else load_calibration()
    best, est = choose(tp, ok, cal, mode)
    return (best if realization == "auto" else realization), est


class Allreducer:
    """Combine by `tree` repeatedly on `comm` with one realization of it. Build it on every rank
    (collectively: its build agreement is one verdict round; it duplicates nothing).

    `tree`: a tree (Node, with `layout`: a Layout or an element count) or a tree Plan.
    `realization`: "auto" (default), "tree", "scatter", "replicate", "butterfly", "halving";
    one that cannot realize this tree on this many ranks is refused (`realization-inapplicable`,
    naming the ones that apply). `mode="reduce-scatter"`: rank r ends with chunk r only.
    `.realization` says what runs, `.estimates` the model's seconds per applicable realization,
    `.plan` the Program, `.layout_order_id` the declared order bound to the layout (the same
    for every realization). `run(contributions, out=None, timeout=None)` returns the combined
    payload where delivery reaches this rank, else None; in reduce-scatter mode the values of
    this rank's chunk (`reduce_scatter_run` returns Chunk(start, stop, values)).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        tree: Node | Plan,
        layout: LayoutLike | None = None,
        delivery: ReplicateAll | DeliverTo | None = None,
        realization: str = "auto",
        *,
        timeout: float | None = None,
        contract: str = "",
        segment: int | None = None,
        coverage: Coverage | None = None,
        dup: bool = True,
        mode: str = "allreduce",
        calibration: Calibration | None = None,
        _stream: Stream | None = None,
    ) -> None:
        # The planning first: it may refuse on one rank only (a realization that does not
        # apply, a plan for another size). A rank whose planning refused takes part in the build
        # agreement of the executor its peers build, with its refusal (Endpoint.refuse_build),
        # so every rank refuses by name and no rank's next Allreducer pairs with another's.
        local = None
        try:
            self._plan(comm, tree, layout, delivery, realization, segment, coverage, mode, calibration)
        except Refusal as e:
            local = e
        self.executor = None
        if local is not None:
            Endpoint.of(comm, timeout).refuse_build(local, "Allreducer", timeout=timeout, stream=_stream)
        self.executor = Engine(
            comm, self.plan, timeout=timeout, contract=contract, dup=dup, what="Allreducer", stream=_stream
        )
        self.comm = self.executor.comm
        self.slots = self.executor.slots
        #: the executor's prepared run: every run of this Allreducer goes through it
        self.prepared = self.executor.prepare()

    def _plan(self, comm, tree, layout, delivery, realization, segment, coverage, mode, calibration) -> None:
        size = comm.Get_size()
        if isinstance(tree, Plan):
            if tree.size != size:
                raise PlanRefusal(
                    "plan-rank-mismatch", f"plan is for {tree.size} ranks, communicator has {size}"
                )
            if delivery is not None and delivery != tree.delivery:
                raise PlanRefusal(
                    "plan-delivery-mismatch",
                    f"delivery {delivery!r} differs from the plan's {tree.delivery!r}",
                )
        elif layout is None:
            raise Refusal(
                "layout-missing", "Allreducer needs a layout (a Layout or an element count) with a tree"
            )
        tp = as_tree_plan(
            tree, ReplicateAll() if delivery is None else delivery, layout, size=size, coverage=coverage
        )
        self.tree_plan = tp
        self.layout_order_id = tp.layout_order_id
        self.realization, self.estimates = choose_realization(tp, realization, mode, calibration)
        self.estimate = self.estimates.get(self.realization)
        self.plan = realize(tp, self.realization, mode=mode, segment=segment)

    @property
    def identity(self) -> str:
        return self.plan.identity

    order_id = deprecated_order_id("Allreducer")

    @property
    def broken(self) -> str | None:
        """The refusal code that broke the executor (None while it is usable)."""
        return self.executor.broken

    @property
    def step(self) -> int:
        return self.prepared.step

    def run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> np.ndarray | None:
        """Combine this rank's contributions once (see Engine.run): the combined payload where
        delivery reaches this rank, else None; in reduce-scatter mode this rank's chunk."""
        return self.prepared.run(contributions, out, timeout=timeout)

    __call__ = run

    def reduce_scatter_run(
        self, contributions: Contributions, out: np.ndarray | None = None, *, timeout: float | None = None
    ) -> Chunk:
        """Reduce-scatter mode only: Chunk(start, stop, values of coordinates start..stop-1)."""
        return self.prepared.reduce_scatter_run(contributions, out, timeout=timeout)

    def describe(self) -> str:
        est = ", ".join(
            f"{k} {v * 1e6:.1f} us" for k, v in sorted(self.estimates.items(), key=lambda kv: kv[1])
        )
        return f"realization {self.realization} (model estimates: {est})"

    def free(self) -> None:
        """Free the persistent requests and give the executor's tags back (local)."""
        if self.executor is not None:
            self.executor.free()


class Combiner(Engine):
    """The tree realization of a tree Plan, exactly as placed (reduce up, deliver down).
    `Combiner(comm, plan, *, timeout=None, contract="", dup=True)`, as Engine."""

    def _program_of(self, plan: object) -> Program:
        if not isinstance(plan, Plan):
            raise PlanRefusal(
                "plan-kind-mismatch", f"Combiner runs a tree Plan (alpha_mpi.plan), got {type(plan).__name__}"
            )
        self.tree_plan = plan
        return realize(plan, "tree")


class ScatterCombiner(Engine):
    """The scatter realization: a Program from `plan_scatter` (or realize(..., "scatter")).
    `ScatterCombiner(comm, program, *, timeout=None, contract="", dup=True)`, as Engine."""

    def _program_of(self, plan: object) -> Program:
        if not isinstance(plan, Program) or plan.realization != "scatter":
            what = getattr(plan, "realization", type(plan).__name__)
            raise PlanRefusal(
                "plan-kind-mismatch", f"ScatterCombiner runs a scatter program (plan_scatter), got {what}"
            )
        self.scatter_plan = plan
        return plan


__all__ = [
    "Allreducer",
    "Combiner",
    "ScatterCombiner",
    "choose_realization",
    "REALIZATIONS",
    "ReduceScatter",
    "Chunk",
]
