"""A sharded optimizer's `step()` that fails alike on every rank: `GuardedStep`.

In a sharded mode `opt.step()` is collective: each rank updates its shard, then the updated
shards are assembled to every rank (alpha_mpi.torch.shard_optimizer). Should torch raise on one
rank inside its update (an allocation that fails there, a setting that rank alone changed, a
hook of the caller's), that rank would never reach the assembly and every other rank would wait
there until the peer bound (`peer-timeout`, the assembler broken for good). Instead, per step:

1. this rank keeps its shard as it is: the pieces' values and the optimizer's state of them
   (clones, for the update's duration: `memory()`'s peak counts them, `kept_bytes`);
2. torch's own `step()` runs (its pre hook points each piece's `.grad` at its parameter's);
3. the assembly runs on every rank. A rank whose update raised sends no values, only the flag
   of its refusal, `torch-optimizer-failed`; its frames reach every rank because each owner
   sends its piece to every other rank. Where some rank's shard is empty (a small model on
   many ranks) that rank sends nothing, so one verdict round carries every rank's outcome
   first, and the assembly runs only when no rank failed;
4. when any rank failed, every rank puts back what it kept, so the parameters and the optimizer
   state are on every rank exactly as before the step (the step counts, too): `opt.step()`
   again, once the cause is gone, gives the bits of a run that never failed. Then every rank
   raises: the failing rank its own exception (its `__cause__` the refusal, as a slot's
   failure is raised: alpha_mpi.torch.step), every other rank `peer-refused` naming it.

The guard is the instance's `step` (as torch's LR schedulers wrap it, and over which they wrap
theirs): a bound method, so a scheduler built afterwards wraps it like torch's own.
"""

from __future__ import annotations

import copy
import types

from ..refusals import Refusal
from ._env import require_torch

torch = require_torch()

__all__ = ["GuardedStep", "Kept"]


class Kept:
    """What one rank's shard held before an update: the pieces' `values` (clones, flat order)
    and the optimizer's `state` of each piece that had any (clones of its tensors, copies of
    the rest), put back by `restore` after a failed step."""

    def __init__(self, views: list, optimizer) -> None:
        self.views, self.optimizer = views, optimizer
        self.values = [v.detach().clone() for v in views]
        self.state = {}
        for v in views:
            st = optimizer.state.get(v)
            if st:
                self.state[v] = {
                    k: x.detach().clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x)
                    for k, x in st.items()
                }

    def restore(self) -> None:
        """The shard as it was kept: values copied back in place (the parameters' storage), the
        optimizer's state of each piece replaced by the kept clones (or dropped: none before)."""
        with torch.no_grad():
            for v, kept in zip(self.views, self.values):
                v.copy_(kept)
        for v in self.views:
            if v in self.state:
                self.optimizer.state[v] = self.state[v]
            else:
                self.optimizer.state.pop(v, None)


class GuardedStep:
    """The step of one ShardedOptimizer (`binding`): torch's own step, then the assembly, a
    local failure flagged to every rank and the shards put back (the module says how).
    `install()` makes it the optimizer's `step`."""

    def __init__(self, binding) -> None:  # a shard_optimizer.ShardedOptimizer (it imports this)
        self.binding = binding
        ctx = binding.ctx
        self.comm, self.timeout = ctx.comm, ctx.timeout
        # Every rank sends its piece to every other: a flag in its frames reaches them all.
        self.flag_reaches_all = all(b > a for a, b in binding.layout.bounds)
        self.plain = None

    def install(self) -> None:
        """Replace the optimizer's bound `step` by this guard (a bound method too)."""
        opt = self.binding.optimizer
        self.plain = opt.step  # torch's, with its hooks (the pre hook: before_step)
        guard = self

        def step(optimizer, *args, **kwargs):
            """torch's step over this rank's shard, then the shards assembled to every rank; a
            failure on any rank refused on every rank, the state as before (shard_step.py)."""
            return guard.run(args, kwargs)

        opt.step = types.MethodType(step, opt)

    def kept_bytes(self) -> int:
        """Bytes a step keeps while it runs: the shard's values and the optimizer's state of it."""
        b = self.binding
        tensors = list(b.views) + [
            x for v in b.views for x in b.optimizer.state.get(v, {}).values() if isinstance(x, torch.Tensor)
        ]
        return sum(t.numel() * t.element_size() for t in tensors)

    def run(self, args, kwargs):
        """One guarded step (returns what torch's step returns)."""
        b = self.binding
        kept, failure, out = None, None, None
        try:
            scale = b.ctx.grads.scale
            if scale != 1.0:  # flagged to every rank below, like any failure of the update
                raise Refusal(
                    "usage",
                    f"the gradient is still multiplied by the loss scale {scale!r} (the step took "
                    "scaler=): update with scaler.step(opt), which unscales it and skips after an "
                    "overflow, not opt.step()",
                )
            kept = Kept(b.views, b.optimizer)
            out = self.plain(*args, **kwargs)
        except Exception as e:  # travels to every rank below, then raised here
            failure = e
        refused = None
        if failure is not None:
            refused = Refusal(
                "torch-optimizer-failed",
                f"rank {self.comm.Get_rank()}: {type(failure).__name__}: {str(failure)[:300]}; "
                "every rank put its shard back as it was before the step",
            )
        try:
            if not self.flag_reaches_all:
                from ..execution.endpoint import Endpoint

                Endpoint.of(self.comm, self.timeout).agree(
                    refused, "the sharded optimizer's step", timeout=self.timeout
                )
            b.assemble(refused)
        except Exception as e:
            if kept is not None:
                kept.restore()
            if failure is not None and getattr(e, "code", None) == "torch-optimizer-failed":
                raise failure from e
            raise
        return out
