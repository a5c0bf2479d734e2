"""The parameters of `DataParallel(..., partition="params")` (ZeRO-3 / FSDP): `ParamShards`.

Between steps a rank holds only its shard of the flat parameter vector (the parameters end to
end in `DataParallel.params` order; the shard is `ShardLayout`'s, the one "state" uses, aligned
to the 512 grid) in one tensor, `shard`, of the parameters' dtype and device. Every parameter
keeps its shape, dtype and device but its `.data` is a placeholder: one NaN element expanded
to its shape (no storage of its own), so shapes, `.grad` assignment and optimizers' bookkeeping
see the parameter as it is, and writing into it fails loudly.

A `Gather` assembles a group of parameters (a unit, the root or all of them:
alpha_mpi.torch.units) by selection: each coordinate comes from exactly the rank whose shard
holds it, widened exactly to binary64 and narrowed back (no bit moves), through the one engine
(alpha_mpi.execution.Assembler: point-to-point sends it scheduled, no MPI collective). Each
parameter of the group then gets fresh storage (`p.data = t`), freed by putting the placeholder
back. Swapping `.data`, not resizing storage, means no tensor ever sees freed memory: a saved
view that was not re-packed keeps its storage alive (memory, never wrong bits).

The optimizer (`dp.optimizer`, collective) is torch's over views of `shard` (the allow-list and
group splitting of alpha_mpi.torch.shard_optimizer): its step updates the shard in place, and
nothing is assembled after it: the next gathers read the shard. `.grad` is None: the combine is
the reduce-scatter of "grads" (alpha_mpi.torch.shard_grads), so a rank holds its shard of the
combined gradient over the same range as its shard of the parameters, and each piece takes its
range of it as `.grad` before the update (ShardedOptimizer.before_step, `zero_grad` clearing it).

`full_parameters()` (collective) gathers every parameter for a while (inference, `eval()`,
`state_dict()`); checkpoints and digests run inside it, a restore writing the shard back.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..refusals import Refusal
from ._env import require_torch
from .convert import from64, into64
from .shard_optimizer import ShardedOptimizer
from .units import UnitPlan

torch = require_torch()

__all__ = ["ParamShards", "Gather", "ParamsOptimizer"]


class Gather:
    """The parameters `members` (indices, flat order) of `shards` assembled by selection: the
    group's vector is their ranges end to end; each rank gives the pieces of its shard in it."""

    def __init__(self, shards: ParamShards, members) -> None:
        from ..execution import Assembler
        from ..planning.assembly import plan_assembly

        self.shards, self.members = shards, tuple(members)
        lay = shards.layout
        pieces: list[list[int]] = []  # [owner, start, stop, flat start], merged where contiguous
        self.starts, u = [], 0
        for i in self.members:
            s, e = lay.offsets[i]
            self.starts.append(u)
            for r, (a, b) in enumerate(lay.bounds):
                lo, hi = max(s, a), min(e, b)
                if hi <= lo:
                    continue
                last = pieces[-1] if pieces else None
                if last and last[0] == r and last[2] == u + lo - s and last[3] + last[2] - last[1] == lo:
                    last[2] = u + hi - s
                else:
                    pieces.append([r, u + lo - s, u + hi - s, lo])
            u += e - s
        self.n = u
        self.mine = [(ua, ub, fa) for r, ua, ub, fa in pieces if r == shards.rank]
        self.assembler = Assembler(
            shards.comm,
            plan_assembly([(r, ua, ub) for r, ua, ub, _ in pieces], self.n, lay.size),
            timeout=shards.timeout,
            contract=shards.contract,
        )

    def run(self, refused: Refusal | None = None, install: bool = True) -> None:
        """Collective: assemble the group; `install`: every member takes fresh storage holding its
        values. `refused`: this rank's refusal, carried in the frames (nothing is read or
        installed; every rank the frames reach names it: Assembler.run)."""
        a = self.shards.own[0]
        mine = {}
        if refused is None:
            for ua, ub, fa in self.mine:
                v = np.empty(ub - ua)
                into64(v, self.shards.shard[fa - a : fa - a + ub - ua])
                mine[(ua, ub)] = v
        out = np.empty(self.n)
        self.assembler.run(mine, out=out, refused=refused)
        if install and refused is None:
            params = self.shards.params
            for i, u in zip(self.members, self.starts):
                p = params[i]
                t = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                from64(t, out[u : u + p.numel()])
                p.data = t

    def release(self) -> None:
        """Every member back to its placeholder (its gathered storage freed)."""
        self.shards.release(self.members)

    def nbytes(self) -> int:
        """Bytes of the members' gathered storage."""
        return sum(self.shards.params[i].numel() * self.shards.itemsize for i in self.members)

    def free(self) -> None:
        self.assembler.free()


class ParamShards:
    """This rank's shard of `params` (laid out by `layout`, gathered by the units of `plan`):
    built collectively after every rank holds rank 0's values, it copies its range into `shard`
    and releases every parameter to its placeholder."""

    def __init__(self, comm, timeout, contract: str, params: list, layout, plan: UnitPlan) -> None:
        self.comm, self.timeout, self.contract = comm, timeout, contract
        self.params, self.layout, self.plan = params, layout, plan
        self.rank = comm.Get_rank()
        self.own = layout.own(self.rank)
        p0 = params[0]
        self.itemsize = p0.element_size()
        a, b = self.own
        self.shard = torch.empty(b - a, dtype=p0.dtype, device=p0.device)
        self._write_back()
        # NaN: a placeholder read by mistake (outside its unit) makes the step's values
        # non-finite, refused by name, never silently other bits
        hole = torch.full((), float("nan"), dtype=p0.dtype, device=p0.device)
        self.hole = hole.untyped_storage().data_ptr()
        self.placeholders = [hole.expand(p.shape) for p in params]
        root_n, _ = plan.sizes(params)
        self.root = Gather(self, plan.root) if root_n else None
        self.units = [Gather(self, u.members) for u in plan.units]
        self.whole = Gather(self, range(len(params)))
        self.held_whole = False
        self.release(range(len(params)))

    def _write_back(self) -> None:
        """The shard takes this rank's range of the parameters' present values."""
        a = self.own[0]
        with torch.no_grad():
            for piece in self.layout.pieces(self.rank):
                src = self.params[piece.index].data.reshape(-1)[piece.lo : piece.hi]
                self.shard[piece.start - a : piece.start - a + piece.size].copy_(src)

    def release(self, members) -> None:
        for i in members:
            self.params[i].data = self.placeholders[i]

    @contextlib.contextmanager
    def full_parameters(self, writeback: bool = False):
        """Collective: every parameter gathered inside the block, released after it; with
        `writeback` the shard first takes the block's values (a restore)."""
        if self.held_whole:  # nested: the outer block holds them
            yield
            return
        self.whole.run()
        self.held_whole = True
        try:
            yield
            if writeback:
                self._write_back()
        finally:
            self.release(range(len(self.params)))
            self.held_whole = False

    def memory(self, base: dict) -> dict:
        """`base` (the mode's count, shard_grads.grads_memory: the gradient shard, the combine's
        accumulators; it counts each parameter whole) with what params mode holds: `params` at
        rest is the shard; the step's peak adds the root, the largest unit and that gather's
        binary64 vectors (its assembly, this rank's pieces) to base's slot phase (one slot's
        gradients and the fold's buffers; nothing is assembled after the update)."""
        out = dict(base)
        slot_phase = out["peak"] - out["at_rest"]
        out["params"] = self.shard.numel() * self.itemsize
        out["at_rest"] = sum(
            out[k] for k in ("params", "grads", "optimizer_state", "buffers", "accumulators")
        )
        groups = [g for g in [self.root, *self.units] if g is not None]
        largest = max(self.units, key=lambda g: g.n, default=self.root)
        gathered = (self.root.nbytes() if self.root is not None else 0) + (
            largest.nbytes() if largest is not self.root and largest is not None else 0
        )
        widest = max((g.n + sum(ub - ua for ua, ub, _ in g.mine) for g in groups), default=0)
        out["params_peak"] = out["params"] + gathered
        out["peak"] = out["at_rest"] + gathered + 8 * widest + slot_phase
        return out

    def free(self) -> None:
        for g in [self.root, *self.units, self.whole]:
            if g is not None:
                g.free()


class ParamsOptimizer(ShardedOptimizer):
    """torch's optimizer over views of `ParamShards.shard`: its update is the parameters' update
    (nothing to assemble after it: the next step's gathers read the shard)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        # No assembly follows the update, so no frame carries a rank's failed update: the
        # guarded step's agreement round does (shard_step.py), on every step.
        self.guard.flag_reaches_all = False

    def assemble(self, refused: Refusal | None = None) -> None:
        """Nothing to assemble: the next step's gathers read the shard (`refused` was agreed)."""
        return None

    @classmethod
    def build_over(cls, ctx, shards: ParamShards, opt_cls, groups, kw: dict) -> ParamsOptimizer:
        """Collective, as ShardedOptimizer.build (the allow-list, the groups, one verdict round),
        the pieces viewing the shard instead of the parameters' storage."""
        return cls.build(ctx, opt_cls, groups, kw, views=lambda dicts, idx: _shard_views(shards, dicts, idx))


def _shard_views(shards: ParamShards, dicts: list[dict], indices: list[list[int]]):
    """Each group's settings over views of the shard (one per piece, split per group)."""
    group = {i: k for k, idx in enumerate(indices) for i in idx}
    per = [[] for _ in dicts]
    views, group_of = [], []
    a = shards.own[0]
    for piece in shards.layout.pieces(shards.rank):
        view = shards.shard[piece.start - a : piece.start - a + piece.size]
        per[group[piece.index]].append(view)
        views.append(view)
        group_of.append(group[piece.index])
    shard = [{**{k: v for k, v in g.items() if k != "params"}, "params": ps} for g, ps in zip(dicts, per)]
    return shard, views, group_of
