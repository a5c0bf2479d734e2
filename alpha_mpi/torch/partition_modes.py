"""The partition modes of `DataParallel(..., partition=...)`: where the optimizer state lives.

Every mode gives the bits of `none`: each coordinate goes through the same combine and the same
torch update; only where the optimizer state is held and updated changes.

    mode    parameters   .grad    optimizer state   after opt.step()
    none    whole        whole    whole             nothing to do
    state   whole        whole    own shard         the shards assembled by selection (ZeRO-1)

The public keyword stays a string; `partition_mode(name)` reads it once (and refuses a name it
does not know, `torch-partition-unknown`). After construction nothing asks which mode runs: the
mode object builds the optimizer (alpha_mpi.torch.shard_optimizer where it shards).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..refusals import Refusal
from .shard_optimizer import ShardedOptimizer
from .sharding import ShardContext

__all__ = ["PartitionMode", "partition_mode", "MODES"]


def _plain(ctx: ShardContext, cls, groups, kw):
    return cls(groups, **kw)


def _sharded(ctx: ShardContext, cls, groups, kw):
    binding = ShardedOptimizer.build(ctx, cls, groups, kw)
    ctx.bindings[id(binding.optimizer)] = binding
    return binding.optimizer


@dataclass(frozen=True)
class PartitionMode:
    """One mode of the registry: its public name, whether the optimizer state is sharded, and
    how `DataParallel.optimizer` builds the optimizer (collective where it shards)."""

    name: str
    shards_state: bool
    build: Callable

    def optimizer(self, ctx: ShardContext, cls, groups, kw):
        """torch's optimizer `cls(groups, **kw)`: over the parameters (none), or over this rank's
        shard of them (alpha_mpi.torch.shard_optimizer)."""
        return self.build(ctx, cls, groups, kw)


_REGISTRY = {
    m.name: m
    for m in (
        PartitionMode("none", False, _plain),
        PartitionMode("state", True, _sharded),
    )
}

MODES = tuple(_REGISTRY)  # the public names, in the order the docs list them


def partition_mode(name: str) -> PartitionMode:
    """The mode named `name` ("none", "state"), or `torch-partition-unknown` naming the modes."""
    mode = _REGISTRY.get(name) if isinstance(name, str) else None
    if mode is None:
        raise Refusal(
            "torch-partition-unknown",
            f"DataParallel(partition={name!r}) is not a partition mode; use one of {', '.join(MODES)}",
        )
    return mode
