"""`.grad` in `partition="grads"` (ZeRO-2) and `"params"` (ZeRO-3): this rank's shard of the
combined gradient, `ShardGradients`, its clipping and its memory; the modes' step parts
(`grads_parts`).

What a rank holds after a step in these modes (alpha_mpi.torch.partition_modes):
- every parameter's `.grad` is None: no rank holds a whole gradient;
- the combined gradient of its shard (sharding.ShardLayout: the flat parameter vector's
  grid-aligned range [a, b) of this rank) in one tensor of the parameters' dtype and device,
  `dp.grads.flat`; the sharded optimizer (`dp.optimizer`) sees each piece of it as the `.grad` of
  its shard tensors. A piece is present exactly where the parameter's `.grad` would be a tensor
  in `partition="none"` (a gradient this step, or held for accumulation, or `unused="zeros"`),
  else absent (its shard tensors' `.grad` None, as torch skips a None `.grad`).

The rules are gradients.GradientWriter's, coordinate by coordinate on the shard: g = numerator /
mass in binary64, added to a held gradient (WidenBinary32) with `accumulate`, one RoundBinary64.
So the shard holds the bits that coordinate of `.grad` holds in `none`, on every rank count.

Clipping (`clip`): each rank's block sums of squares over its shard (the shard begins on the
grid, so these are the whole gradient's blocks: clipping.block_sums), assembled by selection to
every rank (each block's word from the one rank that holds it), then clipping's norm and torch's
coefficient: the bits of `dp.clip_grad_norm_` in `none`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..refusals import Refusal
from ._env import require_torch
from .accumulation import Accumulation
from .clipping import BLOCK, block_sums, coefficient, norm_of_blocks
from .convert import from64, into64
from .gradients import UNUSED_RULES
from .shard_combine import ShardedCombine

if TYPE_CHECKING:
    from .sharding import Piece, ShardContext, ShardLayout

torch = require_torch()

__all__ = ["ShardGradients", "StepParts", "grads_parts", "grads_memory"]


@dataclass(frozen=True)
class StepParts:
    """What a partition mode gives the step: the `.grad` writer, the no_sync() accumulation (over
    the gradient words this rank holds) and the combine's class (StepCombine's signature)."""

    grads: object
    accumulation: Accumulation
    combine: object


class ShardGradients:
    """This rank's shard of the combined gradient (see the module): `flat` over [a, b) of the
    flat parameter vector, each of the shard's `pieces` present or absent."""

    def __init__(self, params: list, shards: ShardLayout, rank: int, dtype, unused: str) -> None:
        if unused not in UNUSED_RULES:
            raise Refusal("usage", f"unused must be one of {', '.join(UNUSED_RULES)}, got {unused!r}")
        self.params, self.shards, self.unused = params, shards, unused
        self.a, self.b = shards.own(rank)
        m = self.b - self.a
        self.pieces = shards.pieces(rank)
        self.where = {p.start: j for j, p in enumerate(self.pieces)}
        device = params[0].device if params else torch.device("cpu")
        self.flat = torch.zeros(m, dtype=dtype, device=device)
        self.present = [False] * len(self.pieces)
        self.g = np.empty(m)  # the step's binary64 gradient shard (write_mean)
        self._prev = np.empty(m)
        self._blocks = None  # clipping's assembly of the block sums, built at the first clip
        # the loss scale the gradient held here carries (step.py sets it, a ShardedGradScaler's
        # unscaling clears it, and a sharded opt.step() refuses a scaled one: shard_step.py)
        self.scale = 1.0

    def _range(self, piece: Piece) -> tuple[int, int]:
        s = piece.start - self.a
        return s, s + piece.size

    def write_mean(self, numerator: np.ndarray, mass: float, used: np.ndarray, accumulate: bool) -> None:
        """The shard from g = numerator / mass (`g`), normalised once in binary64."""
        np.divide(numerator, mass, out=self.g)
        held = [accumulate and h for h in self.present]
        if any(held):
            into64(self._prev, self.flat)
        for piece, h in zip(self.pieces, held):
            if h:
                s, e = self._range(piece)
                self.g[s:e] += self._prev[s:e]
        from64(self.flat, self.g)  # RoundBinary64@gradient for float32, one call
        zeros = self.unused == "zeros"
        self.present = [bool(used[p.index]) or h or zeros for p, h in zip(self.pieces, held)]

    def clear(self) -> None:
        """No gradient (a refused step; `zero_grad()`): every piece absent."""
        self.present = [False] * len(self.pieces)
        self.scale = 1.0

    def overflow(self) -> None:
        """A scaled gradient overflowed in some slot (scaling.py): every piece +inf (the shard
        only: no parameter's whole `.grad` is made)."""
        self.flat.fill_(math.inf)
        self.present = [True] * len(self.pieces)

    def held(self) -> list:
        """The gradient tensors this rank holds (what a ShardedGradScaler unscales): the shard."""
        return [self.flat] if any(self.present) else []

    def zero(self, set_to_none: bool = True) -> None:
        """`optimizer.zero_grad(set_to_none)` on the shard."""
        self.scale = 1.0
        if set_to_none:
            self.clear()
        else:
            self.flat.zero_()

    def piece_grad(self, piece: Piece):
        """The `.grad` of the shard tensor of `piece`: its range of `flat`, or None if absent."""
        j = self.where[piece.start]
        if not self.present[j]:
            return None
        s, e = self._range(piece)
        return self.flat[s:e]

    def clip(self, ctx: ShardContext, max_norm: float):
        """`dp.clip_grad_norm_(max_norm)` on the shards (collective): the norm of every rank's
        block sums, assembled by selection; the present pieces multiplied by the coefficient."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise Refusal("usage", f"max_norm must be a number > 0, got {max_norm!r}")
        x = np.zeros(self.b - self.a)
        for piece, h in zip(self.pieces, self.present):
            if h:
                s, e = self._range(piece)
                into64(x[s:e], self.flat[s:e])
        nblocks = -(-self.shards.n // BLOCK)
        total = 0.0
        if nblocks:
            pieces = {}
            if x.size:  # an empty shard (a small module on many ranks) holds no block
                mine = block_sums(x, self.a)
                pieces = {(self.a // BLOCK, self.a // BLOCK + mine.size): mine}
            total = norm_of_blocks(self._assembler(ctx, nblocks).run(pieces, out=np.empty(nblocks)))
        coef = coefficient(total, float(max_norm))
        with torch.no_grad():
            self.flat.mul_(coef.to(self.flat.device, self.flat.dtype))  # absent pieces are never read
        return torch.tensor(total, dtype=torch.float32)

    def _assembler(self, ctx: ShardContext, nblocks: int):
        if self._blocks is None:
            from ..execution import Assembler
            from ..planning.assembly import plan_assembly

            ranges = [(r, a // BLOCK, -(-b // BLOCK)) for r, a, b in self.shards.ranges()]
            self._blocks = Assembler(
                ctx.comm,
                plan_assembly(ranges, nblocks, self.shards.size),
                timeout=ctx.timeout,
                contract=ctx.contract,
            )
        return self._blocks

    def free(self) -> None:
        """Free clipping's assembly (local)."""
        if self._blocks is not None:
            self._blocks.free()


def grads_parts(
    params,
    payload,
    shards: ShardLayout,
    rank: int,
    dtype,
    unused: str,
    *,
    bucket_mb,
    audit_slots,
    realization,
    name: str = "grads",
):
    """partition="grads" (and "params": `name` is the mode that refuses): the shard's `.grad`
    (ShardGradients), the accumulation over the shard, the reduce-scatter combine
    (alpha_mpi.torch.shard_combine). Refused with `bucket_mb` (its buckets allreduce whole
    parameters while the backward runs), `audit_slots` (the audit compares each slot's whole
    payload) and a `realization` other than auto or scatter (the reduce-scatter is scatter's) by
    name (`options-conflict`)."""
    if realization not in ("auto", "scatter"):
        raise Refusal(
            "options-conflict",
            f'partition="{name}" reduce-scatters with the scatter realization (its chunks are the '
            f'shards); realization={realization!r} cannot: leave realization="auto"',
        )
    for key, value in (("bucket_mb", bucket_mb), ("audit_slots", audit_slots)):
        if value:
            raise Refusal(
                "options-conflict",
                f'partition="{name}" folds each slot into its subtree as it finishes and '
                f"reduce-scatters once; {key}={value!r} needs every slot's whole payload: "
                f'drop {key} or use partition="state"',
            )
    grads = ShardGradients(params, shards, rank, dtype, unused)
    accumulation = Accumulation(grads.b - grads.a, len(params))
    return StepParts(grads, accumulation, functools.partial(ShardedCombine, shards=shards))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def grads_memory(params, module, grads, combine, accumulation, optimizer=None, binding=None) -> dict:
    """memory.memory's kinds in partition="grads": `grads` the float32 shard; `accumulators` at
    rest the combined region, the shard's quotient and scratch and the carried sums; the peak the
    larger of the slot phase (one slot's gradient tensors, the scratch payload and the fold's
    buffers, alpha_mpi.torch.shard_combine) and the update (the assembled binary64 parameters and
    this rank's widened shard), the two never held at once."""
    carried = accumulation.numerator
    out = {
        "params": _nbytes(params),
        "grads": _nbytes([grads.flat]),
        "optimizer_state": 0,
        "buffers": _nbytes(module.buffers()),
        "accumulators": combine.reduced.nbytes
        + grads.g.nbytes
        + grads._prev.nbytes
        + (0 if carried is None else carried.nbytes),
    }
    if optimizer is not None:
        held = {
            id(v): v for st in optimizer.state.values() for v in st.values() if hasattr(v, "element_size")
        }
        out["optimizer_state"] = _nbytes(held.values())
    out["at_rest"] = sum(out.values())
    slots = out["params"] + combine.peak_bytes()
    update = 0
    if binding is not None:
        a, b = binding.own
        update = 8 * binding.layout.n + 8 * (b - a)
    out["peak"] = out["at_rest"] + max(slots, update)
    return out
