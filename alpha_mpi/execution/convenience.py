"""The convenience calls `allreduce`, `combine`, `reduce_scatter`: an executor cached per call site.

Each call finds (or builds, collectively, on first use) an Allreducer for its arguments, so a
loop re-plans nothing. The cache is safe under one rank's mistake:
- It lives on the communicator's Endpoint (endpoint.py: an MPI attribute of the communicator,
  never keyed by handle: a freed communicator's handle may be reused by another, on some ranks
  and not others), in the endpoint's "calls" stream: one tag block that the cached executors
  share, since the calls run one at a time in program order.
- It is keyed only on what every rank must pass the same (tree, layout= when given, delivery,
  realization, mode, coverage, segment), never on the contributions: a rank that passes a list
  or a wrong length finds the same executor as its peers, and its mistake is refused inside the
  run, flagged to every rank (`contribution-shape` there, `peer-refused` elsewhere), where it
  once built an executor alone (a lone collective Dup: a timeout, then a hang).
- Without layout= the payload size is each call's. The executor is built for the first call's
  size (a bare array's size too, so that rank builds with its peers and is refused in the run
  by name) and a call of another size runs it once, refused on that rank and flagged to every
  rank, never written past a buffer. Every rank of such a run then says the size of its call in
  one verdict round (Sizes): all the same → every rank builds (or takes back) the executor of
  that size and runs the call again; different → every rank refuses `contribution-size-mismatch`
  naming who passed what, and the next call works (every rank completed both rounds). A change
  of size costs that refused run, the round and, the first time, a build; a steady size costs
  nothing (the executor's own size check). Keying executors on each call's size instead would
  send a rank whose size alone changed to build while its peers ran.
- Each cached executor has its sequence, agreed when built and carried in every frame, so a
  frame of another executor (a rank that passed other arguments) is refused by name.
- A call that failed in a way that may leave its messages on the stream's tags (a peer that
  never came, ranks out of step) makes every later call refuse `combiner-broken` until
  `reset(comm)` on every rank: a retry never reads a stale message, never hangs. Ranks that
  all took part in the build and asked for different executors (a first call whose sizes or
  trees differ) are refused `executor-identity-mismatch` on every rank and leave nothing behind:
  the next call works.
"""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING

import numpy as np

from ..model.delivery import ReplicateAll
from ..planning import Plan
from ..planning.program import Program
from ..planning.realize import REDUCE_SCATTER, as_tree_plan
from ..refusals import PlanRefusal, Refusal
from .allreducer import Allreducer
from .endpoint import Endpoint, Stream
from .engine_bind import Chunk
from .frames import FLAG_REFUSED
from .sizes import Sizes

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..model.coverage import Coverage
    from ..model.delivery import DeliverTo
    from ..model.layout import LayoutLike
    from ..model.tree import Node
    from .contributions import Contributions


# The named tuples here are collections.namedtuple, not typing.NamedTuple: under `from __future__
# import annotations` typing compiles every field's annotation string (a ForwardRef each), 19 in
# this module and engine_bind's Chunk, ~1 ms of a program's first reduction (docs/performance.md).


class CacheKey(namedtuple("CacheKey", "tree layout delivery realization mode coverage segment")):
    """What a cached executor is found by: only arguments every rank must pass the same. `tree`:
    the tree's placed identity, or the plan's identity; `layout`: the layout= given (its key),
    None when inferred from the first call; `delivery`, `realization`, `mode`, `coverage` (its
    key), `segment` (int or None)."""

    __slots__ = ()


# Refusals after which messages of the failed call may still be on the stream's tags (a peer
# that never came, a frame of another executor): later calls would read them, so the stream
# refuses until every rank resets it. A refused input (flagged, every rank completed) is not one.
_LEAVES_MESSAGES = ("peer-timeout", "peer-failed", "executor-identity-mismatch")
STREAM = "calls"


def _stream(comm, timeout=None) -> Stream:
    """The convenience calls' stream on `comm` (its cache: `state`, CacheKey -> Allreducer)."""
    ep = Endpoint.of(comm, timeout)
    st = ep.stream(STREAM, timeout=timeout, drop=_forget)
    if st.broken is not None and ep.pending_reset is not None:
        # the call broke on a peer's reset: reset with it (which drops this stream), then go on
        ep.settle(timeout=timeout)
        st = ep.stream(STREAM, timeout=timeout, drop=_forget)
    if st.broken is not None:
        raise Refusal(
            "combiner-broken",
            f"an earlier convenience call on this communicator failed [{st.broken}] and its messages may "
            "still be in flight; call alpha_mpi.execution.reset(comm) on every rank, then call again",
        )
    return st


def reset(comm: MPI.Comm, *, timeout: float | None = None) -> None:
    """After a failed call left `combiner-broken`: drop the convenience calls' executors on `comm`
    and their stream, and recover the communicator's endpoint (Endpoint.recover: the failed
    call's stale messages are drained on every rank, and the failure no longer aborts the job at
    exit). Collective: call it on every rank. The next call agrees a new stream. A rank that
    calls it while its peers run a call makes them join it (execution/recovery.py): they refuse
    that call, this rank refuses its reset (`executor-identity-mismatch`, once every rank has
    reset), and the next call works."""
    Endpoint.of(comm, timeout).recover(drop=(STREAM,), timeout=timeout)


def _forget(st: Stream) -> None:
    """The calls stream is dropped (a reset): free its executors."""
    _STEADY.clear()
    for a in st.state.values():
        a.free()
    st.state.clear()


# The steady calls last found: (endpoint, tree or None for `allreduce(comm, x)`, layout, stream,
# executor), newest last. A loop that repeats a plain call finds its executor here by identity
# instead of through the endpoint's streams, the tree's key and the cache (~0.4 us of a ~2 us
# call, measured); the endpoint is still looked up every call (a freed communicator has none).
# Entries are only ever what the cache held: every change of a stream's cache clears this list
# (_forget, the parking in _after_refusal), so an entry is never an executor the cache dropped.
_STEADY: list = []
_STEADY_MAX = 4  # a loop alternating the documented forms has four


def _remember_steady(ep, tree, layout, st, a) -> None:
    if len(_STEADY) >= _STEADY_MAX:
        del _STEADY[0]
    _STEADY.append((ep, tree, layout, st, a))


def cached_executors(comm: MPI.Comm) -> dict[CacheKey, Allreducer]:
    """A copy of the convenience calls' cache on `comm`: CacheKey -> Allreducer (for benchmarks
    and tests that time or inspect the executor a call used; changing it changes nothing)."""
    ep = Endpoint.existing(comm)
    st = None if ep is None else ep.streams.get(STREAM)
    return {} if st is None else dict(st.state)


def _tree_key(tree):
    if isinstance(tree, Plan):
        return ("plan", tree.identity)
    placed = getattr(tree, "_placed", None)
    return ("tree", placed) if placed is not None else ("object", id(tree))


class _Call(namedtuple("_Call", "comm tree delivery layout realization mode coverage segment timeout")):
    """What one convenience call builds its executor from (all but the contributions)."""

    __slots__ = ()

    def key(self) -> CacheKey:
        layout = self.layout
        return CacheKey(
            _tree_key(self.tree),
            None if layout is None else (layout.key() if hasattr(layout, "key") else layout),
            self.delivery,
            self.realization,
            self.mode,
            None if self.coverage is None else self.coverage.key(),
            self.segment,
        )

    @property
    def sized_per_call(self) -> bool:
        """Whether the payload size comes from each call: no layout= and no Plan (which carries
        its own), and a run whose refusal flag reaches every rank (every rank's result depends
        on every contribution), so that every rank enters the Sizes round after it alike."""
        return (
            self.layout is None
            and not isinstance(self.tree, Plan)
            and self.coverage is None
            and (self.delivery is None or isinstance(self.delivery, ReplicateAll))
        )

    def build(self, st: Stream, layout) -> Allreducer:
        """Build this call's executor for `layout` (collective); a failure that may leave
        messages on the stream's tags breaks the stream."""
        try:
            return Allreducer(
                self.comm,
                self.tree,
                layout,
                self.delivery,
                self.realization,
                timeout=self.timeout,
                segment=self.segment,
                coverage=self.coverage,
                mode=self.mode,
                _stream=st,
            )
        except Refusal as e:
            # Ranks that all finished the build round and differ (a first call's sizes, say) left
            # nothing on the channel: named on every rank, and the next call builds afresh.
            if e.code in _LEAVES_MESSAGES and e.context.get("in_flight", True):
                st.broken = e.code
            raise


def _cached(call: _Call, contributions):
    """(the stream, the cached Allreducer for these arguments, built collectively on first use)."""
    st = _stream(call.comm, call.timeout)
    a = st.state.get(call.key())
    if a is None:
        layout = call.layout
        if not isinstance(call.tree, Plan) and layout is None:
            try:
                layout = Sizes.infer(contributions)
            except Refusal as e:  # still takes part in the build, so every rank refuses
                Endpoint.of(call.comm).refuse_build(e, "allreduce()", timeout=call.timeout, stream=st)
        a = st.state[call.key()] = call.build(st, layout)
    return st, a


_PARKED = 8  # executors of other sizes kept per call site (a loop over a few sizes builds once)


def _run(call: _Call, contributions, out, rs=False):
    st, a = _cached(call, contributions)
    try:
        return _run_on(st, a, contributions, out, call.timeout, rs)
    except Refusal as e:
        return _after_refusal(call, st, a, e, contributions, out, rs)


def _after_refusal(call: _Call, st: Stream, a: Allreducer, e: Refusal, contributions, out, rs):
    """A run refused: raise it, or (every rank's call of one new size) run the call again on the
    executor of that size."""
    if a.broken is not None or not a.executor.flags & FLAG_REFUSED:
        raise e
    if not call.sized_per_call:
        if e.code == "contribution-shape" and call.layout is None and not isinstance(call.tree, Plan):
            raise Refusal(
                e.code,
                f"{e.message} (with delivery to some ranks or a coverage, a convenience call keeps the "
                "payload size of its first call with this tree; pass layout= on every rank to combine "
                "another size)",
                **e.context,
            ) from None
        raise e
    layout = Sizes.agree(call.comm, contributions, Sizes.of_layout(a.tree_plan.layout), call.timeout)
    if layout is None:
        raise e from None
    # Every rank asks for `layout`: park the executor of the old size and run the call again on
    # the one of the new size (built by every rank together the first time).
    key = call.key()
    _STEADY.clear()  # the cache changes below
    parked = st.state.pop(key)
    st.state[key._replace(layout=("parked", parked.tree_plan.layout.key()))] = parked
    again = st.state.pop(key._replace(layout=("parked", layout.key())), None)
    if again is None:
        again = call.build(st, layout)
        old = [k for k in st.state if isinstance(k.layout, tuple) and k._replace(layout=None) == key]
        for k in old[: max(0, len(old) - _PARKED)]:
            st.state.pop(k).free()
    st.state[key] = again
    return _run_on(st, again, contributions, out, call.timeout, rs)


def _run_on(st, a, contributions, out, timeout, rs):
    try:
        if rs:
            return a.reduce_scatter_run(contributions, out=out, timeout=timeout)
        return a.run(contributions, out=out, timeout=timeout)
    except Refusal:
        if a.broken is not None:
            st.broken = a.broken
        raise


_NO_TREE = object()


def _plain_key(tree, layout: int | None = None) -> CacheKey:
    """The key of a call with every option but `layout` (None or an int) at its default (what
    _Call.key says for it). Kept per tree object and layout (a tree is immutable, so its key is
    too; building it is ~0.5 us of a call whose own cost is ~2 us), by identity, the tree held
    so that its id cannot be reused."""
    memo = id(tree) if layout is None else (id(tree), layout)
    got = _PLAIN_KEYS.get(memo)
    if got is not None and got[0] is tree:
        return got[1]
    if len(_PLAIN_KEYS) >= 64:  # a program that makes trees as it goes: keep the newest only
        _PLAIN_KEYS.clear()
    key = CacheKey(_tree_key(tree), layout, None, "auto", "allreduce", None, None)
    _PLAIN_KEYS[memo] = (tree, key)
    return key


_PLAIN_KEYS: dict = {}  # id(tree) or (id(tree), layout) -> (tree, its CacheKey)


def _bare_call(comm, tree, contributions):
    """`allreduce(comm, x)`: (pairwise(range(p)), {rank: x}); other calls pass through.

    Like MPI_Allreduce: one contribution per rank, combined over the pairwise tree of the p
    ranks, so the bits are the same on every run and MPI at that p (slots, not ranks, give the
    same bits across rank counts: docs/allreduce.md)."""
    if contributions is not _NO_TREE:
        return tree, contributions
    p = comm.Get_size()
    return _rank_tree(p), {comm.Get_rank(): tree}


_RANK_TREES: dict = {}  # p -> pairwise(range(p), p); the steady call reads it directly


def _rank_tree(p: int):
    """pairwise(range(p), p), made once per size (building it each call cost more than an
    8-byte round); a tree is immutable, and the same object keys the same cached executor."""
    tree = _RANK_TREES.get(p)
    if tree is None:
        from ..model import pairwise

        tree = _RANK_TREES[p] = pairwise(range(p), p)
    return tree


def allreduce(
    comm: MPI.Comm,
    tree: Node | Plan | np.ndarray,
    contributions: Contributions = _NO_TREE,  # type: ignore[assignment]
    delivery: ReplicateAll | DeliverTo | None = None,
    *,
    layout: LayoutLike | None = None,
    out: np.ndarray | None = None,
    realization: str = "auto",
    timeout: float | None = None,
    segment: int | None = None,
    coverage: Coverage | None = None,
) -> np.ndarray | None:
    """Combine `contributions` (slot -> float64 array, or (numerator, mass) tuple) by `tree`
    (a Node or a tree Plan) with the chosen realization. Returns the combined payload where
    delivery reaches this rank, else None. Executors are cached (see the module docstring).
    Without `layout=` the payload size is each call's, alike on every rank (ranks that pass
    different sizes to one call: `contribution-size-mismatch` on every rank).

    `allreduce(comm, x)` (no tree): every rank passes one float64 array, combined over
    `pairwise(range(p))` with slot = rank (the same bits on every run and MPI at that p)."""
    plain_layout = layout is None or type(layout) is int
    if delivery is timeout is segment is coverage is None and realization == "auto" and plain_layout:
        # The steady loop: a plain call finds its Allreducer in the cache by the key its
        # arguments make (the tree's placement and an int layout=; every other part at its
        # default) and runs its prepared run; the arrays are bound by their geometry there,
        # whatever objects they are.
        ep = Endpoint.existing(comm)
        if ep is not None:
            bare = contributions is _NO_TREE
            given = None if bare else tree
            for entry in _STEADY:
                if entry[0] is ep and entry[1] is given and entry[2] == layout:
                    st, a = entry[3], entry[4]
                    break
            else:
                st = ep.streams.get(STREAM)
                a = None
                if st is not None:
                    a = st.state.get(_plain_key(_rank_tree(ep.size) if bare else tree, layout))
                    if a is not None:
                        _remember_steady(ep, given, layout, st, a)
            if a is not None and st.broken is None:
                if bare:
                    tree, contributions = _RANK_TREES[ep.size], {ep.rank: tree}
                try:
                    return a.prepared.run(contributions, out)  # Allreducer.run's body, one frame less
                except Refusal as e:
                    if a.broken is not None:
                        st.broken = a.broken
                    call = _Call(comm, tree, None, layout, "auto", "allreduce", None, None, None)
                    return _after_refusal(call, st, a, e, contributions, out, False)
    tree, contributions = _bare_call(comm, tree, contributions)
    call = _Call(comm, tree, delivery, layout, realization, "allreduce", coverage, segment, timeout)
    return _run(call, contributions, out)


def combine(
    comm: MPI.Comm,
    tree: Node | Plan,
    contributions: Contributions,
    delivery: ReplicateAll | DeliverTo | None = None,
    *,
    layout: LayoutLike | None = None,
    out: np.ndarray | None = None,
    timeout: float | None = None,
) -> np.ndarray | None:
    """Combine by the tree realization exactly as placed (see `allreduce` for the others)."""
    call = _Call(comm, tree, delivery, layout, "tree", "allreduce", None, None, timeout)
    return _run(call, contributions, out)


def reduce_scatter(
    comm: MPI.Comm,
    tree: Node | Plan | Program,
    contributions: Contributions,
    *,
    layout: LayoutLike | None = None,
    out: np.ndarray | None = None,
    timeout: float | None = None,
    segment: int | None = None,
    coverage: Coverage | None = None,
    realization: str = "auto",
) -> Chunk:
    """Reduce by `tree` and keep chunk r of the result at rank r only. Returns Chunk(start, stop,
    values of coordinates start..stop-1) on every rank (a chunk may be empty). `out`: an array
    of the chunk's length or of the whole payload (the chunk is then written at out[start:stop]).
    Realizations: halving (pairwise trees on 2^k ranks) or scatter (any tree)."""
    if isinstance(tree, Program):  # a reduce-scatter program from plan_scatter / realize
        if not tree.mode.scatters:
            raise PlanRefusal(
                "plan-delivery-mismatch", "reduce_scatter() needs a program made with ReduceScatter()"
            )
        segment, realization = tree.details.get("segment"), tree.realization
        tree = as_tree_plan(tree.tree, None, tree.layout, size=tree.size, coverage=tree.coverage)
    if realization not in ("auto",) + REDUCE_SCATTER:
        raise Refusal(
            "usage", f"reduce_scatter realizations are auto, {', '.join(REDUCE_SCATTER)}; got {realization!r}"
        )
    call = _Call(comm, tree, None, layout, realization, "reduce-scatter", coverage, segment, timeout)
    return _run(call, contributions, out, rs=True)


__all__ = ["allreduce", "combine", "reduce_scatter", "reset", "cached_executors", "CacheKey"]
