"""torch's own optimizer over this rank's shard of the parameters: `ShardedOptimizer` (ZeRO-1).

`DataParallel(..., partition="state").optimizer(torch.optim.AdamW, groups, **kw)` returns a
torch.optim.AdamW whose param groups are the caller's groups (same order, same settings), each
holding this rank's pieces of that group's parameters: 1-d views into the parameters' own
storage (alpha_mpi.torch.sharding.ShardLayout). A piece is one parameter's part of the shard, so
a shard spanning parameters of groups with different settings is split per group. LR
schedulers, `param_groups`, hand-set rates and `state_dict()` (this rank's shard) are torch's.

Around torch's `step()` (its pre hook, and the guard that is the instance's `step`,
alpha_mpi.torch.shard_step):
- before: each piece's `.grad` is the matching view of its parameter's `.grad` (every rank holds
  the whole combined gradient in `state` mode: nothing is copied), or in `grads` mode its range
  of the rank's gradient shard (alpha_mpi.torch.shard_grads);
- after: the updated shards are assembled to every rank by selection (alpha_mpi.execution's
  Assembler: each coordinate from exactly the rank that updated it, widened exactly to binary64
  and narrowed back, so no bit moves), and every parameter holds the step's values again; an
  update that raised on one rank is refused on every rank (`torch-optimizer-failed`), every
  rank's shard put back as it was.
`zero_grad()` also clears the parameters' `.grad` (what DataParallel accumulates into).

Sharding must not change the update. It does not for the classes in `SHARD_SAFE`, whose update
is elementwise and measured (tests/test_torch_sharding.py: torch 2.13's for-loop, foreach and
fused implementations on a whole tensor and on views cut at arbitrary offsets, under the ATen
capabilities `default` and `avx2`, give the same bits), with the settings each entry refuses:
fused SGD with momentum gives other bits on cut views under AVX2 (measured), and `capturable`
/ `differentiable` are not measured. Any other class, a subclass included (it may override the
update), is refused by name (`torch-optimizer-unsharded`) on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..refusals import Refusal
from ._env import require_torch
from .convert import pack, unpack
from .shard_step import GuardedStep
from .sharding import ShardContext, ShardLayout

torch = require_torch()

__all__ = ["ShardSafe", "SHARD_SAFE", "ShardedOptimizer", "normalize_groups"]


def _adam_refuses(group: dict) -> str | None:
    for key in ("capturable", "differentiable"):
        if group.get(key):
            return f"{key}=True (not measured on shards)"
    return None


def _sgd_refuses(group: dict) -> str | None:
    if group.get("fused"):
        return "fused=True (its vectorized momentum update gives other bits on shards cut at other offsets)"
    if group.get("differentiable"):
        return "differentiable=True (not measured on shards)"
    return None


@dataclass(frozen=True)
class ShardSafe:
    """An optimizer class whose update of a shard gives the whole tensor's bits (tested): its
    per-parameter scalar state (0-d tensors, e.g. Adam's `step`), the per-coordinate state it
    may hold, and the group settings for which that is not measured (`refuses(group)`: why)."""

    cls: type
    scalars: tuple[str, ...]
    vectors: tuple[str, ...]
    refuses: Callable[[dict], str | None]


SHARD_SAFE = {
    s.cls: s
    for s in (
        ShardSafe(torch.optim.AdamW, ("step",), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"), _adam_refuses),
        ShardSafe(torch.optim.Adam, ("step",), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"), _adam_refuses),
        ShardSafe(torch.optim.SGD, (), ("momentum_buffer",), _sgd_refuses),
    )
}


def normalize_groups(groups, params: list) -> tuple[list[dict], list[list[int]]]:
    """torch's `params` argument (tensors, or dicts with `params` and settings) as a list of
    group dicts, and each group's parameter indices in `params`; they must hold exactly the
    module's trainable parameters, each once (`torch-optimizer-state`)."""
    if isinstance(groups, torch.Tensor):
        groups = [groups]
    items = list(groups)
    if items and all(isinstance(g, dict) for g in items):
        dicts = [dict(g) for g in items]
    elif items and not any(isinstance(g, dict) for g in items):
        dicts = [{"params": items}]
    else:
        raise Refusal(
            "usage",
            "optimizer groups are parameters or dicts with 'params' (as torch takes them), not a mix or nothing",
        )
    where = {id(p): i for i, p in enumerate(params)}
    seen: set[int] = set()
    indices = []
    for g in dicts:
        ps = g.get("params")
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps or [])
        idx = []
        for p in ps:
            i = where.get(id(p))
            if i is None or i in seen:
                raise Refusal(
                    "torch-optimizer-state",
                    "the optimizer's groups must hold exactly the module's trainable parameters, "
                    f"each once: {'a parameter outside them' if i is None else 'parameter %d twice' % i}",
                )
            seen.add(i)
            idx.append(i)
        g["params"] = ps
        indices.append(idx)
    if len(seen) != len(params):
        missing = sorted(set(range(len(params))) - seen)
        raise Refusal(
            "torch-optimizer-state",
            f"the optimizer's groups leave out trainable parameters {missing[:8]} (by position); "
            "every trainable parameter must be in one group in a sharded mode",
        )
    return dicts, indices


class ShardedOptimizer:
    """torch's optimizer over this rank's shard, bound to the DataParallel's parameters: its
    `optimizer`, the `layout`, the `pieces` (this rank's, in flat order) and their `views`, the
    `group_of` each piece, the `safe` entry of the class, and the Assembler that gives every
    rank the updated parameters."""

    def __init__(
        self,
        ctx: ShardContext,
        optimizer,
        safe: ShardSafe,
        views: list,
        group_of: list[int],
        group_params: list,
    ) -> None:
        from ..execution import Assembler
        from ..planning.assembly import plan_assembly

        self.ctx, self.optimizer, self.safe = ctx, optimizer, safe
        self.layout: ShardLayout = ctx.layout
        self.rank = ctx.comm.Get_rank()
        self.own = self.layout.own(self.rank)
        self.pieces = self.layout.pieces(self.rank)
        self.group_of, self.group_params = group_of, group_params  # each group's parameter indices
        self.views = views  # one per piece, in flat order (the optimizer holds them by group)
        self.params = ctx.params
        self.assembler = Assembler(
            ctx.comm,
            plan_assembly(self.layout.ranges(), self.layout.n, self.layout.size),
            timeout=ctx.timeout,
            contract=ctx.contract,
        )
        optimizer.register_step_pre_hook(lambda opt, args, kwargs: self.before_step())
        optimizer._alpha_mpi_shards = self  # what a ShardedGradScaler unscales (scaling.py)
        self.guard = GuardedStep(self)  # torch's step, then assemble(); a failure on every rank
        self.guard.install()
        plain_zero_grad = optimizer.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            """torch's zero_grad, then the step's `.grad` too (what DataParallel adds into: the
            parameters' in `state`, the shard in `grads`)."""
            plain_zero_grad(set_to_none)
            ctx.grads.zero(set_to_none)

        optimizer.zero_grad = zero_grad  # as torch's LR schedulers wrap `step` on the instance

    @classmethod
    def build(cls, ctx: ShardContext, opt_cls, groups, kw: dict, views=None) -> ShardedOptimizer:
        """Collective: checks on every rank (the class on the allow-list, the groups over the
        module's parameters, each group's settings), one verdict round so every rank refuses
        by name when any does, then the Assembler. `views(dicts, indices)`: the groups' shard
        tensors (default: views of the parameters' own storage; params mode: of its shard)."""
        from ..execution.endpoint import Endpoint

        local, built = None, None
        try:
            safe = SHARD_SAFE.get(opt_cls) if isinstance(opt_cls, type) else None
            if safe is None:
                raise Refusal(
                    "torch-optimizer-unsharded",
                    f"{getattr(opt_cls, '__name__', opt_cls)!r} is not on the list of optimizers whose "
                    f"update on a shard is measured to give the whole tensor's bits "
                    f"({', '.join(c.__name__ for c in SHARD_SAFE)}); sharded state needs one of them",
                )
            dicts, indices = normalize_groups(groups, ctx.params)
            built = _shard_groups(ctx, dicts, indices) if views is None else views(dicts, indices)
            optimizer = opt_cls(built[0], **kw)
            for g in optimizer.param_groups:
                why = safe.refuses(g)
                if why:
                    raise Refusal(
                        "torch-optimizer-unsharded",
                        f"{opt_cls.__name__} with {why}; build it without that setting in a sharded mode",
                    )
        except Exception as e:  # it travels to every rank, then is re-raised here
            local = e
        Endpoint.of(ctx.comm, ctx.timeout).agree(local, "building the sharded optimizer", timeout=ctx.timeout)
        return cls(ctx, optimizer, safe, built[1], built[2], indices)

    # around torch's step ----------------------------------------------------------------------
    def before_step(self) -> None:
        """Each piece's `.grad` from the step's writer (`ctx.grads`): in `state` the view of its
        parameter's `.grad`, in `grads` its range of the shard (None where absent)."""
        for piece, view in zip(self.pieces, self.views):
            view.grad = self.ctx.grads.piece_grad(piece)

    def assemble(self, refused: Refusal | None = None) -> None:
        """The updated shards to every rank by selection; every parameter takes the whole vector
        (exact: each value was a parameter's, widened then narrowed). `refused`: this rank's
        update failed; its flag goes instead of its values and every rank raises (shard_step.py)."""
        a, b = self.own
        mine = {(a, b): pack(self.views)} if b > a and refused is None else {}
        whole = self.assembler.run(mine, out=np.empty(self.layout.n), refused=refused)
        with torch.no_grad():
            unpack([p.data for p in self.params], whole)

    # what this rank holds ---------------------------------------------------------------------
    def state_bytes(self) -> int:
        """Bytes of the optimizer's state tensors on this rank (its shard's)."""
        return sum(
            v.numel() * v.element_size()
            for st in self.optimizer.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor)
        )

    def free(self) -> None:
        """Free the Assembler's requests (local)."""
        self.assembler.free()


def _shard_groups(ctx: ShardContext, dicts: list[dict], indices: list[list[int]]):
    """Each group's settings over views of this rank's pieces of its parameters (flat order);
    the views in flat order; each piece's group."""
    rank = ctx.comm.Get_rank()
    group = {i: k for k, idx in enumerate(indices) for i in idx}
    per = [[] for _ in dicts]
    views, group_of = [], []
    for piece in ctx.layout.pieces(rank):
        p = ctx.params[piece.index]
        if not p.is_contiguous():
            raise Refusal(
                "torch-module-unsupported",
                f"parameter {piece.index} is not contiguous; a sharded mode views its storage "
                "(make it contiguous before building DataParallel)",
            )
        view = p.data.view(-1)[piece.lo : piece.hi]
        per[group[piece.index]].append(view)
        views.append(view)
        group_of.append(group[piece.index])
    shard = [{**{k: v for k, v in g.items() if k != "params"}, "params": ps} for g, ps in zip(dicts, per)]
    return shard, views, group_of
