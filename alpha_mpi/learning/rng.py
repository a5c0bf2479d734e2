"""Random numbers per slot: a generator state that depends only on (seed, step, slot).

A slot's forward and backward may draw random numbers (dropout, noise, a random crop). If they
drew from a process-wide generator, each rank's draws would depend on which slots it happened to
own before this one, so the bits would change with the rank count. Instead every slot starts from
a state derived from (seed, step, slot) alone, with numpy's SeedSequence (a well-kept hash of a
tuple of integers into well-mixed seeds): the same on whichever rank runs the slot.

- `slot_generator(seed, step, slot)`: a numpy Generator, what the numpy learner passes to a model
  as `rng=`.
- `slot_seed(seed, step, slot)`: a 63-bit integer for `torch.manual_seed`, what
  `alpha_mpi.torch.DataParallel` seeds torch's generators (CPU, and CUDA's where present) with
  inside `torch.random.fork_rng` around each slot.

The two draw different words of the same SeedSequence, so they are independent of each other.
"""

from __future__ import annotations

import numpy as np

from ..refusals import Refusal

__all__ = ["slot_generator", "slot_seed", "SLOT_RNG_RULE"]

SLOT_RNG_RULE = (
    "per slot: generator state from numpy SeedSequence([seed, step, slot]) "
    "(numpy: default_rng(SeedSequence); torch: manual_seed(generate_state(2, uint64)[1] >> 1))"
)
"""The per-slot random-number rule, as contracts and docs name it."""


def _entropy(seed: int, step: int, slot: int) -> np.random.SeedSequence:
    for name, v in (("seed", seed), ("step", step), ("slot", slot)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise Refusal("usage", f"the slot generator's {name} must be an int >= 0, got {v!r}")
    return np.random.SeedSequence([int(seed), int(step), int(slot)])


def slot_generator(seed: int, step: int, slot: int) -> np.random.Generator:
    """A numpy Generator whose state depends only on (seed, step, slot)."""
    return np.random.default_rng(_entropy(seed, step, slot))


def slot_seed(seed: int, step: int, slot: int) -> int:
    """A seed in [0, 2**63) for torch.manual_seed, a function of (seed, step, slot) alone."""
    return int(_entropy(seed, step, slot).generate_state(2, np.uint64)[1] >> np.uint64(1))
