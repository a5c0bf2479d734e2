"""When `partition="params"` gathers and frees each unit: `GatherSchedule`.

A gather is collective (every rank gives its pieces, every rank receives the unit), so every
rank must run the same gathers in the same order, whatever its slots and its data do. The
schedule is fixed per slot turn (`events`, the same list on every rank):

    R           the root (alpha_mpi.torch.units), kept until the turn ends
    F0 .. Fk-1  each unit before its forward (the previous one freed first)
    Bk-2 .. B0  each unit again for its backward, in reverse (the last unit stays gathered
                from its forward into its backward: one gather fewer)

A step runs `turns` turns on every rank: the most slots any rank owns. A rank runs one turn
per owned slot, its slot's forward and backward driving the cursor, then the turns it has no
slot for with nothing computed (their gathers only: the ranks owning more slots need its
pieces). What drives the cursor:
- a unit's forward pre-hook asks for its F event (its B event once the cursor is past the last
  unit's forward: a recomputation inside the backward, activation checkpointing);
- torch's saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`) pack any tensor
  saved for backward that views a gathered unit's storage as a reference (parameter, size,
  stride, offset), and the unpack asks for the unit's B event and views its fresh storage;
- the turn's end runs every event left (a unit that did not run, or whose backward needed no
  parameter values, is gathered and freed all the same).
Asking for an event the cursor has passed (a unit run twice, or out of the list's order, or
a parameter reused after its unit's backward) is refused, `torch-units-order`. Outside a
step (and outside `full_parameters()`), running the module or a unit is refused,
`torch-params-sharded`: its parameters are placeholders.

Failures: a rank's refusal or exception (its own, or a peer's named by a gather) does not
stop its gathers: the remaining events of every turn still run, carrying the refusal in
their frames (nothing installed), so no rank waits for another; the step's combine then
names it on every rank (alpha_mpi.torch.step) and the next step starts afresh.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..refusals import Refusal
from ._env import require_torch
from .shard_params import ParamShards

torch = require_torch()

__all__ = ["GatherSchedule"]


@dataclass(frozen=True)
class _Saved:
    """A tensor saved for backward that views parameter `index`'s gathered storage."""

    index: int
    size: tuple
    stride: tuple
    offset: int


class GatherSchedule:
    """The gathers of a params-mode step over `shards` (alpha_mpi.torch.shard_params), `turns`
    turns of `events` each, with hooks on the units and on `module` (the guard)."""

    def __init__(self, shards: ParamShards, module, turns: int) -> None:
        self.shards, self.turns = shards, turns
        units = shards.plan.units
        k = len(units)
        self.events = ([("R", -1)] if shards.root is not None else []) + [("F", j) for j in range(k)]
        self.events += [("B", j) for j in reversed(range(k - 1))]
        self.index = {e: i for i, e in enumerate(self.events)}
        if k:
            self.index[("B", k - 1)] = self.index[("F", k - 1)]
        self.backward_from = self.index[("F", k - 1)] if k else 0
        self.unit_of = {i: j for j, u in enumerate(units) for i in u.members}
        self.cursor, self.current, self.active, self.install = -1, None, False, True
        self.failure: Refusal | None = None
        self.done = 0  # turns run in this step
        self.storage: dict[int, int] = {}  # data_ptr of a gathered unit parameter -> its index
        self.hooks = [module.register_forward_pre_hook(self._guard)]
        for j, u in enumerate(units):
            self.hooks.append(u.module.register_forward_pre_hook(lambda m, a, j=j: self._forward(j)))

    # the cursor -----------------------------------------------------------------------------------
    def _gather(self, kind: str, j: int) -> None:
        g = self.shards.root if kind == "R" else self.shards.units[j]
        if self.failure is not None:  # draining: the frames carry this rank's refusal
            try:
                g.run(refused=self.failure, install=False)
            except Exception:
                pass
            return
        try:
            g.run(install=self.install)
        except Exception as e:  # a peer's refusal, or this rank's: drain from here on
            self.failure = e if isinstance(e, Refusal) else _slot_failed(e)
            raise
        if kind != "R":
            self.current = j
            if self.install:
                params = self.shards.params
                self.storage = {params[i].data.data_ptr(): i for i in g.members if params[i].numel()}

    def _free_current(self) -> None:
        if self.current is not None:
            self.shards.units[self.current].release()
            self.current, self.storage = None, {}

    def _advance(self, target: int) -> None:
        while self.cursor < target:
            self.cursor += 1
            kind, j = self.events[self.cursor]
            if kind != "R":
                self._free_current()
            self._gather(kind, j)

    def _need(self, kind: str, j: int) -> None:
        if self.failure is not None:
            raise self.failure
        at = self.index[(kind, j)]
        if at < self.cursor:
            name = self.shards.plan.units[j].name
            raise Refusal(
                "torch-units-order",
                f"unit {name!r} is needed for its {'forward' if kind == 'F' else 'backward'} after the "
                f"schedule passed it (at {self.events[self.cursor][0]}{self.events[self.cursor][1]}); "
                "units run once per forward, in the order of units=",
                unit=name,
            )
        self._advance(at)

    # hooks ----------------------------------------------------------------------------------------
    def _guard(self, module, args) -> None:
        if not self.active and not self.shards.held_whole:
            raise Refusal(
                "torch-params-sharded",
                "the module's parameters are sharded between steps (partition='params'); run it "
                "inside `with dp.full_parameters():` (inference, eval) or through dp.step",
            )

    def _forward(self, j: int) -> None:
        if not self.active:
            self._guard(None, None)
            return
        # Past the last unit's forward, a unit's forward is a recomputation inside the
        # backward (activation checkpointing): it needs the unit as its backward does.
        self._need("B" if self.cursor >= self.backward_from else "F", j)

    def _pack(self, t):
        if self.install and t.device == self.shards.shard.device:
            ptr = t.untyped_storage().data_ptr()
            i = self.storage.get(ptr)
            if i is not None:
                return _Saved(i, tuple(t.size()), tuple(t.stride()), t.storage_offset())
            if ptr == self.shards.hole:
                raise Refusal(
                    "torch-units-order",
                    "a parameter was used outside its unit's forward (it is not gathered there): "
                    "tie it to the units that use it, or give units= that hold their own parameters",
                )
        return t

    def _unpack(self, x):
        if not isinstance(x, _Saved):
            return x
        self._need("B", self.unit_of[x.index])
        return self.shards.params[x.index].data.as_strided(x.size, x.stride, x.offset)

    # turns ----------------------------------------------------------------------------------------
    def _turn(self, install: bool) -> None:
        self.cursor, self.current, self.active, self.install = -1, None, True, install
        if self.events and self.events[0][0] == "R":
            self._advance(0)

    def _end_turn(self) -> None:
        last = len(self.events) - 1
        try:
            while self.cursor < last:  # each event runs once, failed or not: no rank waits
                try:
                    self._advance(last)
                except Exception as e:
                    if self.failure is None:
                        self.failure = e if isinstance(e, Refusal) else _slot_failed(e)
        finally:
            self._free_current()
            if self.shards.root is not None:
                self.shards.root.release()
            self.active = False
            self.done += 1

    @contextlib.contextmanager
    def slot(self):
        """One owned slot's turn: its forward and backward run inside (collective)."""
        try:
            self._turn(install=True)
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        except BaseException as e:
            if self.failure is None:
                self.failure = e if isinstance(e, Refusal) else _slot_failed(e)
            raise
        finally:
            self._end_turn()

    def finish(self, refused: Exception | None) -> Refusal | None:
        """After this rank's slots: the turns it had no slot for (gathers only), carrying
        `refused` (this rank's refusal of its step) if any; returns the refusal the step ends
        with here (a peer's, named by a gather) and resets for the next step."""
        if self.failure is None and refused is not None:
            self.failure = refused if isinstance(refused, Refusal) else _slot_failed(refused)
        try:
            while self.done < self.turns:
                try:
                    self._turn(install=False)
                except Exception:
                    pass
                finally:
                    self._end_turn()
            return self.failure
        finally:
            self.failure, self.done = None, 0

    def remove(self) -> None:
        """Remove the hooks (local)."""
        for h in self.hooks:
            h.remove()


def _slot_failed(e: BaseException) -> Refusal:
    return Refusal("torch-slot-failed", f"{type(e).__name__}: {str(e)[:300]}")
