"""Partition modes of DataParallelLearner: where parameters, optimizer state and reduced
gradients live on each rank, and how a step updates and gathers them (layer 5).

Every mode gives the bits of `none`: each coordinate goes through the same tree and the same
kernel formula; only where it is computed and stored changes.

    mode    parameters held   optimizer state   the gradient arrives          after the update
    none    whole vector      whole vector      whole, at every rank          the proposal is kept
    state   whole vector      own range         whole, at every rank          ranges assembled
    grads   whole vector      own range         own chunk (reduce-scatter)    ranges assembled
    params  own range         own range         own chunk (reduce-scatter)    ranges assembled for
                                                                              the next forward pass

The public keyword stays a string; `partition_mode(name)` reads it once (and refuses a name it
does not know) and the learner builds that mode's holder once. After construction nothing asks
which mode runs: the holder answers (`Replicated` for none, `ShardedState` for state and grads,
`ShardedParams` for params), and the gradient combine it holds (`WholeGradient`,
`ScatteredGradient`) says how the gradient arrives. `state` and `grads` keep the same arrays and
differ only in that combine, so they share one holder class that holds a different combine.

Each holder offers the same members, which the learner's step reads top to bottom:
`params` (what this rank holds), `params_range` / `state_range` (the coordinates `params` and the
optimizer's arrays cover; what the checkpoint writes and reads), `next` (the proposed update,
kept apart so a refused step applies nothing), `full_params()`, `forward_done()`, `updating()`,
`install(failure)`, `whole(values)`, `replicated(arrays)`, `load_params(values)`, `nbytes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from ..execution import Allreducer, Assembler, choose_realization
from ..model import ReplicateAll, pairwise
from ..planning import plan
from ..planning.assembly import plan_assembly
from ..planning.realize import realize
from ..refusals import Refusal

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..planning import Plan

__all__ = [
    "Coordinates",
    "WholeGradient",
    "ScatteredGradient",
    "Assembly",
    "Replicated",
    "ShardedState",
    "ShardedParams",
    "PartitionMode",
    "partition_mode",
    "MODES",
]

Range = tuple[int, int]


@dataclass(frozen=True)
class Coordinates:
    """Which coordinates each rank owns in the partitioned modes: the reduce-scatter chunks of
    the payload (n gradient words, then mass, loss and stop), clipped to the n parameters.

    The reduce-scatter realization (halving where the tree's top is rank-partitioned, at any p,
    else scatter) fixes the chunks, and so each rank's range; halving at p != 2^k leaves some
    ranks no chunk (they hold no range: `own` is (0, 0)). Every mode computes them: `none` too
    writes only its own range of a checkpoint."""

    n: int
    size: int
    rank: int
    rs_realization: str
    chunks: tuple[Range, ...]  # rank -> [lo, hi) of the payload (n + 3 words)
    ranges: tuple[tuple[int, int, int], ...]  # (rank, a, b) for every rank holding parameters
    own: Range  # this rank's [a, b) of the parameters

    @classmethod
    def of(cls, combine_plan: Plan, n: int, rank: int) -> Coordinates:
        rs_realization, _ = choose_realization(combine_plan, "auto", "reduce-scatter")
        chunks = tuple(realize(combine_plan, rs_realization, mode="reduce-scatter").chunks)
        ranges = tuple(
            (r, min(lo, n), min(hi, n)) for r, (lo, hi) in enumerate(chunks) if min(hi, n) > min(lo, n)
        )
        own = next(((a, b) for r, a, b in ranges if r == rank), (0, 0))
        return cls(n, combine_plan.size, rank, rs_realization, chunks, ranges, own)

    @property
    def chunk(self) -> Range:
        """This rank's reduce-scatter chunk of the payload."""
        return self.chunks[self.rank]


class WholeGradient:
    """The whole payload combined to every rank (`none`, `state`); the realization (tree or
    scatter) is chosen by size. `run` answers the numerator over `used` (the coordinates this
    rank updates: all of them, or its own range) and the mass, loss and stop words; `extra`,
    the combined words after stop (the audit's, where it runs: alpha_mpi.learning.audit)."""

    def __init__(
        self, comm: MPI.Comm, combine_plan: Plan, n: int, used: Range, *, timeout: float | None, contract: str
    ) -> None:
        self.n, self.used = n, used
        self.reducer = Allreducer(comm, combine_plan, timeout=timeout, contract=contract)
        self.reduced = np.empty(combine_plan.layout.total)
        self.extra = self.reduced[n + 3 :]
        self.realization = self.reducer.realization

    def run(self, payloads: Mapping[int, np.ndarray]) -> tuple[np.ndarray, float, float, float]:
        n, (a, b) = self.n, self.used
        self.reducer.run(payloads, out=self.reduced)
        return self.reduced[a:b], self.reduced[n], self.reduced[n + 1], self.reduced[n + 2]


class ScatteredGradient:
    """Reduced gradients exist only at their owner (`grads`, `params`): the reduce-scatter
    realization of the same tree without its gather, then the words after the numerator (mass,
    loss, stop, and the audit's where it runs: `extra` after `run`) from the rank whose chunk
    holds them to all: one rank holds each word and the others add zeros (exact), so any tree
    gives these bits."""

    def __init__(
        self, comm: MPI.Comm, combine_plan: Plan, coords: Coordinates, *, timeout: float | None, contract: str
    ) -> None:
        self.n, self.rank = coords.n, coords.rank
        self.reducer = Allreducer(
            comm,
            combine_plan,
            realization=coords.rs_realization,
            mode="reduce-scatter",
            timeout=timeout,
            contract=contract,
        )
        lo, hi = coords.chunk
        self.reduced = np.empty(hi - lo)
        size = coords.size
        self.tail = combine_plan.layout.total - self.n  # mass, loss, stop, then the audit's words
        self.scalars = Allreducer(
            comm,
            plan(pairwise(range(size), size), ReplicateAll(), self.tail, size=size),
            timeout=timeout,
            contract=contract,
        )
        self.extra = np.zeros(self.tail - 3)
        self.realization = self.reducer.realization + " (reduce-scatter)"

    def run(self, payloads: Mapping[int, np.ndarray]) -> tuple[np.ndarray, float, float, float]:
        n = self.n
        lo, hi, chunk = self.reducer.reduce_scatter_run(payloads, out=self.reduced)
        words = np.zeros(self.tail)
        for i in range(n, n + self.tail):  # mass, loss, stop, ...: wherever the chunking put them
            if lo <= i < hi:
                words[i - n] = chunk[i - lo]
        tail = self.scalars.run({self.rank: words})
        mass, loss, stops = tail[:3]
        self.extra = tail[3:]
        return chunk[: max(0, min(hi, n) - lo)], mass, loss, stops


class Assembly:
    """The whole vector from every rank's range, by selection (no arithmetic): each word from
    exactly the rank that owns it. A rank's refusal rides on its assembly frames (the engine's
    refusal flag), so every rank learns it in the same exchange."""

    def __init__(self, comm: MPI.Comm, coords: Coordinates, *, timeout: float | None, contract: str) -> None:
        self.n, self.own = coords.n, coords.own
        self.assembler = Assembler(
            comm,
            plan_assembly(list(coords.ranges), coords.n, coords.size),
            timeout=timeout,
            contract=contract,
        )

    def run(
        self, values: np.ndarray, out: np.ndarray | None = None, refused: Exception | None = None
    ) -> np.ndarray:
        """`values` is this rank's range (none where the reduce-scatter left it no chunk)."""
        a, b = self.own
        mine = {self.own: values} if b > a else {}
        return self.assembler.run(mine, out=np.empty(self.n) if out is None else out, refused=refused)


class Replicated:
    """`none`: every rank holds and updates all parameters and all optimizer state, from the
    gradient combined to every rank. Every rank proposes the identical update, so a refusal is
    raised alike everywhere without an exchange."""

    def __init__(self, gradient: WholeGradient, start: np.ndarray) -> None:
        n = start.shape[0]
        self.name, self.gradient = "none", gradient
        self.params, self.next = start, np.empty(n)
        self.params_range = self.state_range = (0, n)

    def full_params(self) -> np.ndarray:
        return self.params

    def forward_done(self) -> None:
        """Nothing to drop: the parameters are held whole."""

    def updating(self) -> np.ndarray:
        return self.params

    def install(self, failure: Exception | None) -> None:
        if failure is not None:  # every rank proposed the same update from the same values
            raise failure
        self.params, self.next = self.next, self.params

    def whole(self, values: np.ndarray) -> np.ndarray:
        return values

    def replicated(self, state_arrays: Iterable[np.ndarray]) -> list[np.ndarray]:
        return [self.params, *state_arrays]

    def load_params(self, values: np.ndarray) -> None:
        self.params[...] = values

    @property
    def nbytes(self) -> int:
        return self.params.nbytes + self.next.nbytes


class ShardedState:
    """`state` and `grads`: every rank holds the whole parameter vector but optimizer state for
    its own range only, updates that range, and the whole vector is assembled by selection after
    each step. The two modes differ only in the gradient combine held here (`WholeGradient` over
    the own range, or `ScatteredGradient`)."""

    def __init__(
        self, name: str, gradient: WholeGradient | ScatteredGradient, gather: Assembly, start: np.ndarray
    ) -> None:
        (a, b), n = gather.own, start.shape[0]
        self.name, self.gradient, self.gather = name, gradient, gather
        self.params, self.next, self._full_next = start, np.empty(b - a), np.empty(n)
        self.params_range, self.state_range = (0, n), (a, b)

    def full_params(self) -> np.ndarray:
        return self.params

    def forward_done(self) -> None:
        """Nothing to drop: the parameters are held whole."""

    def updating(self) -> np.ndarray:
        a, b = self.state_range
        return self.params[a:b]

    def install(self, failure: Exception | None) -> None:
        # A rank that refused its update sends no values: its refusal rides on its assembly frames,
        # so it raises its own and every other rank `peer-refused` naming it; none applies the step.
        full_next = self.gather.run(self.next, out=self._full_next, refused=failure)
        self.params, self._full_next = full_next, self.params

    def whole(self, values: np.ndarray) -> np.ndarray:
        return self.gather.run(values)

    def replicated(self, state_arrays: Iterable[np.ndarray]) -> list[np.ndarray]:
        return [self.params]  # each optimizer-state range is held by one rank only

    def load_params(self, values: np.ndarray) -> None:
        self.params[...] = values

    @property
    def nbytes(self) -> int:
        return self.params.nbytes + self.next.nbytes + self._full_next.nbytes


class ShardedParams:
    """`params`: each rank holds its range of the parameters and of the optimizer state; the
    whole vector is assembled for the forward pass and dropped after it, and the step's update
    is assembled into a fresh vector that lives until the next forward pass."""

    def __init__(self, gradient: ScatteredGradient, gather: Assembly, start: np.ndarray) -> None:
        a, b = gather.own
        self.name, self.gradient, self.gather = "params", gradient, gather
        self.params, self.next = start[a:b].copy(), np.empty(b - a)
        self.params_range = self.state_range = (a, b)
        self._full: np.ndarray | None = None  # the assembled vector, between an update and a forward pass

    def full_params(self) -> np.ndarray:
        """The whole vector (assembled here unless the last update left it: every rank calls)."""
        if self._full is None:
            self._full = self.gather.run(self.params)
        return self._full

    def forward_done(self) -> None:
        self._full = None  # the assembled vector lives only for the forward/backward pass

    def updating(self) -> np.ndarray:
        return self.params

    def install(self, failure: Exception | None) -> None:
        # As ShardedState: a refusal rides on the assembly frames and no rank applies the step.
        self._full = self.gather.run(self.next, refused=failure)
        self.params, self.next = self.next, self.params

    def whole(self, values: np.ndarray) -> np.ndarray:
        return self.gather.run(values)

    def replicated(self, state_arrays: Iterable[np.ndarray]) -> list[np.ndarray]:
        return []  # never asked: ReplicaDigests refuses this mode (PartitionMode.replicated is None)

    def load_params(self, values: np.ndarray) -> None:
        self.params[...] = values
        self._full = None  # assembled again from the restored shards at the next forward pass

    @property
    def nbytes(self) -> int:
        # The assembled vector, alive from one step's update to the next forward pass, counts too.
        return self.params.nbytes + self.next.nbytes + 8 * self.gather.n


Holder = Union[Replicated, ShardedState, ShardedParams]  # (Union: the package supports Python 3.9)


@dataclass(frozen=True)
class PartitionMode:
    """One mode of the registry: its public name, what replica digests can compare under it
    (None: nothing is replicated), and how to build its holder (collective: it builds executors)."""

    name: str
    replicated: str | None
    build_holder: Callable[..., Holder]

    def build(
        self,
        comm: MPI.Comm,
        combine_plan: Plan,
        coords: Coordinates,
        start: np.ndarray,
        *,
        timeout: float | None,
        contract: str,
    ) -> Holder:
        return self.build_holder(comm, combine_plan, coords, start, timeout=timeout, contract=contract)


def _none(comm, combine_plan, coords, start, **wire) -> Holder:
    return Replicated(WholeGradient(comm, combine_plan, coords.n, (0, coords.n), **wire), start)


def _state(comm, combine_plan, coords, start, **wire) -> Holder:
    gradient = WholeGradient(comm, combine_plan, coords.n, coords.own, **wire)
    return ShardedState("state", gradient, Assembly(comm, coords, **wire), start)


def _grads(comm, combine_plan, coords, start, **wire) -> Holder:
    gradient = ScatteredGradient(comm, combine_plan, coords, **wire)
    return ShardedState("grads", gradient, Assembly(comm, coords, **wire), start)


def _params(comm, combine_plan, coords, start, **wire) -> Holder:
    gradient = ScatteredGradient(comm, combine_plan, coords, **wire)
    return ShardedParams(gradient, Assembly(comm, coords, **wire), start)


_REGISTRY = {
    m.name: m
    for m in (
        PartitionMode("none", "parameters and optimizer state", _none),
        PartitionMode("state", "parameters", _state),
        PartitionMode("grads", "parameters", _grads),
        PartitionMode("params", None, _params),
    )
}

MODES = tuple(_REGISTRY)  # the public names, in the order the docs list them


def partition_mode(name: str) -> PartitionMode:
    """The mode named `name` ("none", "state", "grads", "params"), or `usage` naming the modes."""
    mode = _REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        raise Refusal("usage", f"unknown partition {name!r}; use one of {', '.join(MODES)}")
    return mode
