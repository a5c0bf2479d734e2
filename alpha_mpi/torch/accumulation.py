"""Gradient accumulation under `DataParallel.no_sync()`: `Accumulation`.

DDP's pattern runs k − 1 micro-batches inside `no_sync()` and one after it, then `opt.step()`.
What a user means by it is the gradient of the whole accumulated batch: Σ gradients / Σ mass
over every micro-batch's slots (the exact token mean with a token mass). So a step inside
`no_sync()` writes nothing into `.grad`: its combine's sums are carried, and the step after the
block (the update) divides the carried sums plus its own once and rounds once. The declared
expression over (slot, micro-step) (the formula `no-sync-accumulation-v2`, NO_SYNC_V2):

    N_m, M_m        micro-step m's combine over the slot tree: Σ_s g_{s,m}, Σ_s mass
    N = (((N_1 + N_2) + N_3) + ... + N_k)   binary64, micro-step order (M likewise)
    .grad = RoundBinary64@gradient(N / M)   (added to a held .grad as accumulate=True adds)

Every rank holds the same N_m after each combine (any rank count that places the same tree), so
N and `.grad` are the same bits on every rank count. v1 (before issue 44) added each call's own
mean into `.grad`, the sum of k means, k times the gradient a DDP script divides by `accum`.

Apart from the step because it is state that lives across steps: the `no_sync()` depth, the
carried sums and the flag that the step after the block is the update. A pending accumulation
is not in `.grad` nor in a checkpoint, so `save` and `restore` refuse it (`accumulation-pending`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from ..refusals import Refusal

__all__ = ["Accumulation", "NO_SYNC_V2", "OVERWRITE", "ADD", "CARRY"]

NO_SYNC_V2 = (
    "a step inside no_sync() writes no .grad: its combined numerator N_m and mass M_m are "
    "carried; the step after the block: N=(((N_1+N_2)+...)+N_k), M likewise, in binary64 in "
    "micro-step order, g=N/M once, then the round-once site (adding a held .grad as accumulate)"
)
"""The accumulation rule, as the contract names it (`no-sync-accumulation-v2`)."""

OVERWRITE, ADD, CARRY = 0, 1, 2
"""What a step does with its combined gradient (the `accumulate` agreement field's values)."""


class Accumulation:
    """The `no_sync()` state of one DataParallel over `n` gradient words and `k` parameters:
    the block's depth, the sums carried from its steps, and the pending update flag."""

    def __init__(self, n: int, k: int) -> None:
        self.n, self.k = n, k
        self.depth = 0  # nested no_sync() blocks; > 0: steps carry
        self.after = False  # the step right after a block is the update (and adds, as DDP)
        self.micro_steps = 0  # steps carried since the last update
        self.numerator: np.ndarray | None = None  # allocated at the first carried step
        self.used = np.zeros(k, dtype=bool)
        self.mass = 0.0
        self.inf = False

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Steps inside carry their sums to the step after the block (the update)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            self.after = self.depth == 0

    def mode(self, accumulate: bool | None) -> int:
        """What this step does: CARRY inside no_sync(); else `accumulate` as given (ADD /
        OVERWRITE), None meaning ADD for the step right after a block (DDP's pattern)."""
        if self.depth > 0:
            return CARRY
        after, self.after = self.after, False
        if accumulate is None:
            accumulate = after
        return ADD if accumulate else OVERWRITE

    @property
    def pending(self) -> bool:
        """Inside a no_sync() block, or sums carried and no update yet."""
        return self.depth > 0 or self.micro_steps > 0

    def carry(self, numerator: np.ndarray, mass: float, used: np.ndarray, inf: bool) -> None:
        """Add one micro-step's combined sums (micro-step order: N_1 first)."""
        if self.numerator is None:
            self.numerator = np.zeros(self.n)
        if self.micro_steps == 0:
            self.numerator[...] = numerator
            self.mass, self.inf = mass, inf
            self.used[...] = used
        else:
            self.numerator += numerator
            self.mass += mass
            self.inf |= inf
            self.used |= used
        self.micro_steps += 1

    def settle(self, numerator: np.ndarray, mass: float, used: np.ndarray, inf: bool):
        """The update's sums: the carried ones plus this step's (`numerator` is overwritten in
        place); returns (numerator, mass, used, inf) and clears the carried sums."""
        if self.micro_steps:
            numerator += self.numerator  # N_1..N_{k-1} + N_k: IEEE addition commutes exactly
            mass = self.mass + mass
            used, inf = self.used | used, self.inf or inf
        self.micro_steps = 0
        return numerator, mass, used, inf

    def refuse_pending(self, what: str) -> None:
        """`accumulation-pending` where sums are carried that `.grad` does not hold yet."""
        if self.pending:
            where = "inside no_sync()" if self.depth > 0 else "after a no_sync() block"
            raise Refusal(
                "accumulation-pending",
                f"{what} {where}: {self.micro_steps} micro-step(s) carry sums that are not in .grad "
                "and would not be in the checkpoint; call it after the update (the step after the block)",
            )
