"""The partition modes of `DataParallel(..., partition=...)`: where the optimizer state lives.

Every mode gives the bits of `none`: each coordinate goes through the same combine and the same
torch update; only where the optimizer state is held and updated changes.

    mode    parameters   .grad    optimizer state   after opt.step()           clip_grad_norm_
    none    whole        whole    whole             nothing to do              the whole .grad's
    state   whole        whole    own shard         the shards assembled by    the whole .grad's:
                                                    selection (ZeRO-1)         the same as none
    grads   whole        None;    own shard         the shards assembled by    the shard's block
                         the                        selection (ZeRO-2)         sums assembled by
                         shard's                                               selection: the
                         own                                                   same as none
    params  own shard    None;    own shard         nothing: the shard is      the shard's block
            (gathered    the                        the parameters (ZeRO-3;    sums, as in grads:
            per unit)    shard's                    shard_params.py)           the same as none
                         own

In `grads` and `params` the step's combine is a reduce-scatter over the slot tree (alpha_mpi.
torch.shard_combine: slots folded into their subtrees as they finish) and a rank holds only its
shard of the combined gradient (alpha_mpi.torch.shard_grads.ShardGradients, what the sharded
optimizer's shard tensors see as `.grad`); every parameter's `.grad` stays None. In `params` the
gradient's shard is the parameters' (one layout), and the parameters are gathered per unit for
each slot (alpha_mpi.torch.gather_schedule); its memory is grads_memory's with the shard and the
gathers counted (shard_params.ParamShards.memory).

The public keyword stays a string; `partition_mode(name)` reads it once (and refuses a name it
does not know, `torch-partition-unknown`). After construction nothing asks which mode runs: the
mode object builds the optimizer (alpha_mpi.torch.shard_optimizer where it shards) and clips.

Clipping: every rank holds the whole combined `.grad` in `none` and in `state` (ZeRO-1 shards
the optimizer's state only), so both clip by the same computation, `_clip_whole`: the whole
gradient's block sums on every rank (alpha_mpi.torch.clipping). A mode that shards `.grad` would
compute its shard's block sums alone (`block_sums(shard, start)`: shards begin on the grid that
clipping's blocks use, sharding.GRID) and combine the block sums by position, to the same bits:
`grads` and `params` do (`_clip_shard`). torch's own clipping over their parameters would clip
nothing (`.grad` is None): those modes mark the parameters (`shards_grads`) and it is refused by
name (alpha_mpi.torch.clip_guard).

Each mode also gives the step its parts (`parts`: the `.grad` writer, the accumulation, the
combine; alpha_mpi.torch.shard_grads.StepParts) and counts what a rank holds (`memory`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..refusals import Refusal
from .accumulation import Accumulation
from .clipping import clip_grad_norm
from .combine import StepCombine
from .gradients import GradientWriter
from .memory import memory
from .shard_grads import StepParts, grads_memory, grads_parts
from .shard_optimizer import ShardedOptimizer
from .sharding import ShardContext
from .step_plan import replica_digests

__all__ = ["PartitionMode", "partition_mode", "MODES"]


def _plain(ctx: ShardContext, cls, groups, kw):
    return cls(groups, **kw)


def _sharded(ctx: ShardContext, cls, groups, kw):
    binding = ShardedOptimizer.build(ctx, cls, groups, kw)
    ctx.bindings[id(binding.optimizer)] = binding
    return binding.optimizer


def _sharded_params(ctx: ShardContext, cls, groups, kw):
    from .shard_params import ParamsOptimizer

    binding = ParamsOptimizer.build_over(ctx, ctx.gathers.shards, cls, groups, kw)
    ctx.bindings[id(binding.optimizer)] = binding
    return binding.optimizer


def _clip_whole(ctx: ShardContext, max_norm: float):
    """Every rank holds the whole `.grad`: clip it whole, the same computation on every rank and
    in every mode that holds it so (the block sums of the whole flat gradient)."""
    return clip_grad_norm(ctx.params, ctx.layout.offsets, max_norm, ctx.layout.n)


def _clip_shard(ctx: ShardContext, max_norm: float):
    """Every rank holds its shard of the gradient: its block sums, assembled (shard_grads.py)."""
    return ctx.grads.clip(ctx, max_norm)


def _whole_parts(params, payload, shards, rank, dtype, unused, **options) -> StepParts:
    """Every rank holds the whole `.grad`: the writer of the parameters' `.grad`, the
    accumulation over every gradient word, the allreduce of the whole payload (the step's
    `options`, bucket_mb and the others, are the combine's and the audit's own)."""
    grads = GradientWriter(params, list(payload.offsets), dtype, unused)
    return StepParts(grads, Accumulation(payload.n, len(params)), StepCombine)


# params mode combines as grads does (its shard of the combined gradient), naming itself when it refuses
_params_parts = functools.partial(grads_parts, name="params")


@dataclass(frozen=True)
class PartitionMode:
    """One mode of the registry: its public name, whether the optimizer state is sharded, how
    `DataParallel.optimizer` builds the optimizer (collective where it shards), and how
    `DataParallel.clip_grad_norm_` clips the `.grad` a rank holds in it; `parts`, the step's
    parts in it, and `memory`, what a rank holds in it (alpha_mpi.torch.memory's kinds)."""

    name: str
    shards_state: bool
    build: Callable
    clip: Callable
    parts: Callable = _whole_parts
    memory: Callable = memory
    shards_params: bool = False
    shards_grads: bool = False  # .grad None, the shard in dp.grads: torch's clipping refused (clip_guard)

    def plan_units(self, module, params: list, units, **unsupported):
        """The units of params mode (alpha_mpi.torch.units; None in the other modes, where
        `units=` is refused), refusing the options params mode does not run with (local)."""
        if not self.shards_params:
            if units is not None:
                raise Refusal("usage", f"units= gathers parameters in partition='params', not {self.name!r}")
            return None
        from .units import UnitPlan

        for key, value in unsupported.items():
            if value:
                raise Refusal(
                    "options-conflict",
                    f"{key}={value!r} with partition='params' is not supported yet (its slots' "
                    "passes and gathers are not scheduled together); use partition='state' or drop it",
                )
        return UnitPlan.of(module, params, units)

    def replica_digests(self, audit_digests: int | None, size: int) -> int:
        """The replica digests' period (step_plan.replica_digests); in params mode no rank holds
        a replica of the parameters (disjoint shards): off by default, refused when asked for."""
        if not self.shards_params:
            return replica_digests(audit_digests, size)
        if audit_digests:
            raise Refusal(
                "options-conflict",
                f"audit_digests={audit_digests!r} with partition='params': every range of the "
                "parameters is held by one rank only, so no replica can be compared; use audit_slots "
                "in partition 'none' or 'state', or leave audit_digests out",
            )
        return 0

    def gathers(self, units, comm, timeout, contract: str, module, params: list, layout, plan):
        """Collective, params mode only (None otherwise): the shards and their schedule, as many
        turns a step as the most slots a rank of `plan` (the combine's plan) owns."""
        if units is None:
            return None
        from .gather_schedule import GatherSchedule
        from .shard_params import ParamShards

        shards = ParamShards(comm, timeout, contract, params, layout, units)
        turns = max(len(plan.slots_of(r)) for r in range(comm.Get_size()))
        return GatherSchedule(shards, module, turns)

    def optimizer(self, ctx: ShardContext, cls, groups, kw):
        """torch's optimizer `cls(groups, **kw)`: over the parameters (none), or over this rank's
        shard of them (alpha_mpi.torch.shard_optimizer)."""
        return self.build(ctx, cls, groups, kw)


_REGISTRY = {
    m.name: m
    for m in (
        PartitionMode("none", False, _plain, _clip_whole),
        PartitionMode("state", True, _sharded, _clip_whole),  # .grad whole: clipped as in none
        PartitionMode("grads", True, _sharded, _clip_shard, grads_parts, grads_memory, shards_grads=True),
        PartitionMode("params", True, _sharded_params, _clip_shard, _params_parts, grads_memory, True, True),
    )
}

MODES = tuple(_REGISTRY)  # the public names, in the order the docs list them


def partition_mode(name: str) -> PartitionMode:
    """The mode named `name` ("none", "state", "grads", "params"), or `torch-partition-unknown` naming the modes."""
    mode = _REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        raise Refusal(
            "torch-partition-unknown",
            f"DataParallel(partition={name!r}) is not a partition mode; use one of {', '.join(MODES)}",
        )
    return mode
