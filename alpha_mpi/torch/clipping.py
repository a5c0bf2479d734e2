"""Gradient clipping by the global L2 norm with the same bits on every rank count: `clip_grad_norm`.

torch's `clip_grad_norm_` sums squares in an order its kernels choose; sharded trainers sum each
shard's part and then the parts, so the norm (and every clipped gradient) changes with where the
shards begin. Here the norm is one declared expression over a FIXED BLOCK GRID of the flat
gradient, the parameters' order of `DataParallel.params` (the payload's `offsets`):

    block b = flat indices [b·BLOCK, (b+1)·BLOCK), BLOCK = 512, the last block padded with +0
    s_b = the pairwise sum of x_i² over the block in binary64: adjacent pairs (x_0² + x_1²),
          (x_2² + x_3²), ..., then adjacent pairs of those, up to one word (x_i widened exactly:
          a float32's square is exact in binary64)
    total_norm = sqrt(pairwise sum of s_0 .. s_{B-1}, padded with +0 to a power of two) (binary64)

Adding +0 to a sum of squares is exact, so the padding changes no bit. A rank holding a shard
whose start is a multiple of BLOCK computes its blocks' sums alone (`block_sums`); the blocks'
sums, gathered by position (one non-zero contribution per word: an exact sum in any order),
give every rank the same `norm_of_blocks`. Then torch's formula in float32:
`clip_coef = max_norm / (float32(total_norm) + 1e-6)`, clamped to 1.0, every gradient multiplied
by it in place (`coefficient`).
"""

from __future__ import annotations

import numpy as np

from ..refusals import Refusal
from ._env import require_torch
from .convert import into64
from .sharding import GRID

torch = require_torch()

__all__ = ["BLOCK", "block_sums", "norm_of_blocks", "coefficient", "clip_grad_norm", "CLIP_NORM_V1"]

BLOCK = GRID
"""Elements per block of the grid (a power of two): sharding's GRID, the one grid shards are cut
on, so a shard's block sums are the whole gradient's (why 512: sharding.GRID)."""

CLIP_NORM_V1 = (
    "total_norm=sqrt(pairwise over blocks of 512 flat elements (padded with +0 to a power of two) "
    "of the pairwise sum of WidenBinary32(g)^2 within the block) in binary64; "
    "clip_coef=min(float32(max_norm)/(float32(total_norm)+float32(1e-6)), 1) in float32; g*=clip_coef"
)
"""The clipping rule, named in docs and tests (it changes no bit of the combine's contract)."""


def _pairwise(x: np.ndarray) -> np.ndarray:
    """Pairwise sums along the last axis (its length a power of two): adjacent pairs, repeatedly."""
    while x.shape[-1] > 1:
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


def block_sums(flat: np.ndarray, start: int = 0) -> np.ndarray:
    """The grid's block sums of squares of `flat` (binary64 values of the flat gradient from
    index `start` on, a multiple of BLOCK; the last block may be short): one word per block."""
    if start % BLOCK:
        raise Refusal("usage", f"a shard for the clipping grid starts at a multiple of {BLOCK}, not {start}")
    nblocks = -(-flat.size // BLOCK)
    padded = np.zeros(nblocks * BLOCK)
    np.multiply(flat, flat, out=padded[: flat.size])
    return _pairwise(padded.reshape(nblocks, BLOCK)) if nblocks else np.zeros(0)


def norm_of_blocks(sums: np.ndarray) -> float:
    """The total L2 norm from every block's sum of squares, in block order (binary64)."""
    if sums.size == 0:
        return 0.0
    width = 1 << (sums.size - 1).bit_length()
    padded = np.zeros(width)
    padded[: sums.size] = sums
    return float(np.sqrt(_pairwise(padded)))


def coefficient(total_norm: float, max_norm: float):
    """torch's clip coefficient in float32: min(max_norm / (total_norm + 1e-6), 1), a 0-d tensor."""
    t = torch.tensor(total_norm, dtype=torch.float32)
    coef = max_norm / (t + 1e-6)  # torch's own expression (a Python float over a tensor)
    return torch.clamp(coef, max=1.0)


def clip_grad_norm(params: list, offsets, max_norm: float, n: int):
    """Clip the `.grad` of `params` (laid out at `offsets` in a flat vector of `n`) by their
    global L2 norm; returns the norm as torch's does (a float32 0-d tensor). A parameter
    without `.grad` counts as zeros and stays None."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise Refusal("usage", f"max_norm must be a number > 0, got {max_norm!r}")
    flat = np.zeros(n)
    grads = [p.grad for p in params]
    for g, (a, b) in zip(grads, offsets):
        if g is not None:
            into64(flat[a:b], g)
    total = norm_of_blocks(block_sums(flat))
    coef = coefficient(total, float(max_norm))
    with torch.no_grad():
        for g in grads:
            if g is not None:
                g.mul_(coef.to(g.device, g.dtype))
    return torch.tensor(total, dtype=torch.float32)
