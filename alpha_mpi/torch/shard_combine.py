"""The step's combine in `partition="grads"` (ZeRO-2): `ShardedCombine`, a reduce-scatter over the
slot tree, each rank ending with its shard of the combined gradient and the combined tail words.

The declared expression is the slot tree's, exactly as in `partition="none"`
(alpha_mpi.torch.combine); only where its values are held changes:

1. Folded as slots finish (`SlotFold`, pure numpy): the tree's maximal subtrees whose slots this
   rank alone owns (planning.operands: what every realization evaluates before communicating)
   are evaluated in postorder while the slots run, left operand first, one binary64 addition per
   branch and coordinate. A slot's payload is written into one scratch vector by the slot pass,
   copied into a buffer, and each branch whose two operands are ready is added at once and its
   right operand's buffer freed. The buffers alive at once are the postorder stack (the pending
   left operands along one path) plus the finished subtrees' values: for the pairwise tree with
   contiguous slots, log2 k + 1 for k slots per rank forming one subtree, O(log k) in general.
2. One reduce-scatter: the same tree with each of those subtrees collapsed into one leaf (the
   same branches above them, the same owners, so the same additions in the same order), by the
   `scatter` realization, whose chunks are an even cut of the payload (scatter.chunk_bounds).

The reduce-scatter payload (`ScatterLayout`) gives rank r exactly its shard of the gradient
(sharding.ShardLayout: grid-aligned, what the optimizer updates and clipping sums) and the tail
words every rank needs: p regions of W = M + T words; region r holds rank r's shard of the
gradient words padded with +0 to M (the largest shard), then a copy of the payload's T words
after the gradient (buffers, used, sizes, mass, loss, inf, stop, agreement words). Every copy of
a word goes through the same tree, so each copy is that word's combined bits; the padding adds
+0 to +0. Rank r's chunk is its region: `reader` reads the combined shard and tail from it with
the PayloadLayout's names, so the step reads it as it reads the whole payload.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..execution import Allreducer
from ..model import ReplicateAll
from ..model.tree import Branch, Leaf, Node, postorder
from ..planning import plan
from ..planning.operands import operands
from ..refusals import Refusal
from .payload import PayloadLayout
from .sharding import ShardLayout

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["ScatterLayout", "ChunkReader", "SlotFold", "collapse", "ShardedCombine"]

_ADD = -1  # a postfix token: add the two values on top of the stack (left below right)


@dataclass(frozen=True)
class ScatterLayout:
    """The reduce-scatter payload of a standard payload `payload` (n gradient words, `total`
    words in all) over the shards `bounds`: p regions of `width` = M + T words."""

    n: int
    total: int
    bounds: tuple[tuple[int, int], ...]
    shard_width: int  # M: the largest shard
    width: int  # W = M + T

    @classmethod
    def of(cls, payload: PayloadLayout, shards: ShardLayout) -> ScatterLayout:
        m = max((b - a for a, b in shards.bounds), default=0)
        return cls(payload.n, payload.total, shards.bounds, m, m + payload.total - payload.n)

    @property
    def size(self) -> int:
        return len(self.bounds)

    @property
    def words(self) -> int:
        """The reduce-scatter payload's length, p · W."""
        return self.size * self.width

    def scatter(self, src: np.ndarray, dst: np.ndarray) -> None:
        """The standard payload `src` into the regions of `dst` (its padding left as it is: +0)."""
        n, m, w = self.n, self.shard_width, self.width
        for r, (a, b) in enumerate(self.bounds):
            at = r * w
            dst[at : at + b - a] = src[a:b]
            dst[at + m : at + w] = src[n:]


class ChunkReader:
    """A rank's combined region read with the PayloadLayout's names: the gradient words are its
    shard (`m` words), the words after them sit at the region's M instead of the payload's n."""

    def __init__(self, payload: PayloadLayout, m: int, shard_width: int) -> None:
        self.payload, self.m, self.base = payload, m, shard_width
        shift = shard_width - payload.n
        self.shift = shift
        self.mass_at, self.loss_at = payload.mass_at + shift, payload.loss_at + shift
        self.inf_at, self.stop_at = payload.inf_at + shift, payload.stop_at + shift

    def gradient(self, red: np.ndarray) -> np.ndarray:
        return red[: self.m]

    def buffers(self, red: np.ndarray) -> np.ndarray:
        return red[self.base : self.payload.used_at + self.shift]

    def used(self, red: np.ndarray) -> np.ndarray:
        lay, s = self.payload, self.shift
        return red[lay.used_at + s : lay.sizes_at + s] > 0

    def sizes(self, red: np.ndarray) -> np.ndarray:
        lay, s = self.payload, self.shift
        return red[lay.sizes_at + s : lay.mass_at + s]

    def agreement(self, red: np.ndarray) -> np.ndarray:
        lay, s = self.payload, self.shift
        return red[lay.agree_at + s : lay.audit_at + s]

    def audit(self, red: np.ndarray) -> np.ndarray:
        return red[self.payload.audit_at + self.shift :]


def collapse(tree: Node) -> tuple[Node, list]:
    """The tree with each maximal single-owner subtree (planning.operands) replaced by one leaf
    whose slot is the operand's index, and the operands: the same branches, owners and order
    above them."""
    ops = operands(tree)
    leaf_of = {id(o.node): Leaf(o.index, o.owner) for o in ops}
    built: dict[int, Node] = {}
    for node in postorder(tree):  # iterative: a long chain is deep
        if id(node) in leaf_of:
            built[id(node)] = leaf_of[id(node)]
        elif isinstance(node, Branch) and id(node.left) in built and id(node.right) in built:
            built[id(node)] = Branch(built[id(node.left)], built[id(node.right)], node.owner)
    return built[id(tree)], ops


def _postfix(node: Node) -> list[int]:
    return [n.slot if isinstance(n, Leaf) else _ADD for n in postorder(node)]


class SlotFold:
    """This rank's operand subtrees (`ops`, in tree order) evaluated in postorder as slots
    finish, in buffers of `words` binary64 words from `scatter` (a copy of a standard payload
    into a buffer). Slots are folded in the order the subtrees read them; a slot that finishes
    early waits in a buffer of its own. `values` maps each finished subtree's index to its
    value; `peak` is the most buffers alive at once so far, `planned` that count for slots
    finishing in order (what `memory()` reports)."""

    def __init__(self, ops: list, words: int, scatter) -> None:
        self.ops, self.words, self.scatter = ops, words, scatter
        self.programs = [_postfix(o.node) for o in ops]
        self.planned = self._simulate()
        self.peak = 0
        self.begin()

    def _simulate(self) -> int:
        live = most = 0
        for prog in self.programs:
            depth = 0
            for tok in prog:
                depth += 1 if tok != _ADD else -1
                most = max(most, live + depth)
            live += 1
        return most

    def begin(self) -> None:
        """A new step: nothing folded yet."""
        self.values: dict[int, np.ndarray] = {}
        self.stack: list[np.ndarray] = []
        self.early: dict[int, np.ndarray] = {}
        self.op, self.at = 0, 0

    def end(self) -> None:
        """Drop every buffer (what the step held is freed at its end)."""
        self.begin()

    @property
    def done(self) -> bool:
        return self.op == len(self.programs)

    def _alive(self) -> int:
        return len(self.values) + len(self.stack) + len(self.early)

    def push(self, slot: int, payload: np.ndarray) -> None:
        """Slot `slot`'s standard payload is final: fold it (and whatever it unblocks)."""
        buf = np.zeros(self.words)  # the padding must be +0
        self.scatter(payload, buf)
        self.early[slot] = buf
        self.peak = max(self.peak, self._alive())
        while not self.done:
            prog = self.programs[self.op]
            tok = prog[self.at]
            if tok == _ADD:
                right = self.stack.pop()
                left = self.stack[-1]
                np.add(left, right, out=left)  # left ⊕ right: IEEE addition, bit for bit either way
            elif tok in self.early:
                self.stack.append(self.early.pop(tok))
            else:
                return  # waiting for slot `tok`
            self.at += 1
            if self.at == len(prog):
                self.values[self.ops[self.op].index] = self.stack.pop()
                self.op, self.at = self.op + 1, 0


class ShardedCombine:
    """The combine of one DataParallel in `partition="grads"` (built on every rank, collectively),
    with StepCombine's members: `slot_buffer(s)` / `slot_done(s)` around each slot pass,
    `around_slots()`, `finish(refused)` (this rank's region: its combined gradient shard and the
    tail, read by `reader`), `realization`, `buckets` (None), `free()`."""

    def __init__(
        self,
        comm: MPI.Comm,
        tree: Node,
        combine_plan,
        layout: PayloadLayout,
        params: list,
        *,
        shards: ShardLayout,
        bucket_mb: float | None,
        timeout: float | None,
        contract: str,
        realization: str,
    ) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.payload, self.buckets = layout, None
        self.scatter_layout = sl = ScatterLayout.of(layout, shards)
        a, b = shards.own(self.rank)
        self.reader = ChunkReader(layout, b - a, sl.shard_width)
        top, ops = collapse(tree)
        mine = [o for o in ops if o.owner == self.rank]
        self.fold = SlotFold(mine, sl.words, sl.scatter)
        self.reduced = np.empty(sl.width)
        self.scratch: np.ndarray | None = None
        self.reducer = None
        self.realization = "local (one rank)"
        if len(ops) > 1:
            # The chunks are scatter's even cut of p·W words: region r is rank r's chunk.
            self.reducer = Allreducer(
                comm,
                plan(top, ReplicateAll(), sl.words, size=self.size),
                realization="scatter",
                mode="reduce-scatter",
                timeout=timeout,
                contract=contract,
            )
            self.realization = "scatter (reduce-scatter, slots folded as they finish)"
            w = sl.width
            if tuple(self.reducer.plan.chunks[self.rank]) != (self.rank * w, (self.rank + 1) * w):
                raise Refusal("internal-error", f"reduce-scatter chunk {self.reducer.plan.chunks[self.rank]}")

    def slot_buffer(self, s: int) -> np.ndarray:
        """Where slot `s`'s pass writes its standard payload (one scratch vector per step)."""
        if self.scratch is None:
            self.scratch = np.zeros(self.payload.total)
        return self.scratch

    def slot_done(self, s: int) -> None:
        """Slot `s`'s payload is final: folded into the subtrees."""
        self.fold.push(s, self.scratch)

    @contextlib.contextmanager
    def around_slots(self) -> Iterator[None]:
        """Around the slot passes: a new fold; whatever escapes them drops its buffers."""
        self.fold.begin()
        try:
            yield
        except BaseException:
            self.fold.end()
            self.scratch = None
            raise

    def finish(self, refused: Refusal | None) -> np.ndarray:
        """This rank's combined region (its shard of the gradient, then the tail), after its
        slots (`refused`: this rank's refusal, flagged to every rank, which all raise it)."""
        self.scratch = None
        try:
            if refused is None and not self.fold.done:
                refused = Refusal("internal-error", "a slot of this rank was not folded before the combine")
            if self.reducer is None:
                if refused is not None:
                    raise refused
                np.copyto(self.reduced, self.fold.values[0])
                return self.reduced
            if refused is None:
                return self.reducer.run(self.fold.values, out=self.reduced)
            return self.reducer.prepared.run_checked(None, self.reduced, refused=refused)
        finally:
            self.fold.end()

    def peak_bytes(self) -> int:
        """The binary64 bytes a step holds at its peak beyond `reduced`: the scratch payload and
        the fold's buffers (slots finishing in order)."""
        return 8 * self.payload.total + 8 * self.scatter_layout.words * self.fold.planned

    def free(self) -> None:
        """Free the combine's requests and give its tags back (local)."""
        if self.reducer is not None:
            self.reducer.free()
