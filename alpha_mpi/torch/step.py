"""One step of a `DataParallel`, stage by stage: `TrainingStep`.

Protocol of one `step(X, y, loss_fn)` (every rank calls it, with the same global batch):

1. The batch is cut into `slots` contiguous windows (alpha_mpi.learning.slicing); this rank takes
   the slots it owns in the tree (`my_slots`).
2. For each owned slot, separately, under torch's generators seeded from (seed, step, slot) and
   the declared precision (autocast or none): the slot's declared loss and mass
   (alpha_mpi.torch.losses: `loss_fn(module(X_s), y_s)` a sum over samples, a `(loss_sum, mass)`
   pair, or a `ModuleLoss`, the module's own mean over its mass), then `torch.autograd.grad`
   (the slot's own backward into fresh tensors; nothing accumulates across slots). Fixed
   intra-op threads and deterministic algorithms (set at construction, checked every step, named
   in the contract), so a slot's gradient has the same bits on whichever rank runs it.
3. The slot's payload: its gradients (float32 widened exactly to binary64 by
   `kernel.widen_binary32`, the `WidenBinary32@contribution` site; float64 copied as is; a
   module's mean times its mass in binary64), the buffers in `slot-mean` mode, the sample count,
   the mass and the loss sum, and the words the ranks must agree on (alpha_mpi.torch.step_agreement).
4. One combine over the slot tree (alpha_mpi.execution.Allreducer; no MPI collective); every rank
   checks the agreement words, the cut and (audit_slots) the audit's words on the combined
   payload alike; then
   `g = numerator / mass` once in binary64, then for float32 one `kernel.round_binary64` into each
   parameter's `.grad` (the `RoundBinary64@gradient` site; added to the `.grad` held with
   `accumulate`; None for a parameter no slot used). Every rank holds the same `.grad`. Inside
   `no_sync()` nothing is written: the numerator and mass are carried to the update, the step
   after the block, which divides their sums once (alpha_mpi.torch.accumulation). With
   partition="grads" the combine is a reduce-scatter of the same tree and these words are this
   rank's shard (the mode's parts: alpha_mpi.torch.shard_combine, shard_grads).
5. The user's optimizer (`opt.step()`) runs on identical gradients and identical state on every
   rank, so the parameters stay identical.

A non-finite gradient, buffer or loss is refused on every rank; `.grad` is cleared (None) and the
buffers keep their step-start values, so an `opt.step()` after a refusal changes nothing.

Apart from data_parallel.py (which builds the parts and holds the public API) because this is the
step's protocol alone: `TrainingStep.run` reads top to bottom, each stage a named call, over
parts passed to its constructor (the state, state.py; the step's plan, step_plan.py; `.grad`,
gradients.py; the buffers, buffers.py; the accumulation, accumulation.py) and the parts it builds
from them: the slot pass (slot_pass.py), the combine (combine.py) and the audit's checks
(alpha_mpi.learning.audit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..learning.audit import build_checks
from ..refusals import Refusal
from ._env import check_environment
from .accumulation import CARRY, OVERWRITE, Accumulation
from .buffers import StepBuffers
from .combine import StepCombine
from .gradients import GradientWriter
from .losses import loss_reduction
from .module_check import check_parameters
from .scaling import ShardedGradScaler, loss_scale
from .slot_cut import Given, check_batch, check_cut
from .slot_pass import SlotCall, SlotPass
from .slot_rules import step_rng
from .state import ModuleState
from .step_agreement import WORDS, StepFacts, check_combined, step_facts

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..learning.audit import FaultHook, SlotAudit
    from ..learning.replicas import ReplicaDigests
    from .gather_schedule import GatherSchedule
    from .step_plan import StepPlan

__all__ = ["TrainingStep", "StepRequest", "SlotsDone"]


@dataclass(frozen=True)
class StepRequest:
    """One call of `step`, `step_local` or `step_slots`: `cut()` gives the {slot: data} batch
    this rank needs, `given()` how the global batch was given (slot_cut.Given), then the loss
    and the step's options as the caller passed them."""

    cut: Callable[[], Mapping]
    given: Callable[[], Given]
    loss_fn: Any
    reduction: str | None
    accumulate: bool | None
    stop: bool
    scaler: Any


@dataclass
class SlotsDone:
    """What the slot stage of one step leaves for the stages after it: how the batch was given
    (`length`, `rule`: what the combined cut must match), the step's `facts` (what the ranks
    compare), the cut `batch` and the slots' shared `call` (the audit recomputes with them), and
    this rank's `refused` (flagged in the combine) with the user's own exception behind it
    (`failure`, raised on this rank once every rank refused)."""

    length: int = 0
    rule: Any = None
    facts: StepFacts | None = None
    batch: Mapping | None = field(default=None, repr=False)
    call: SlotCall | None = None
    refused: Refusal | None = None
    failure: Exception | None = None


def slot_failure(e: Exception) -> tuple[Refusal, Exception | None]:
    """What a rank flags when its slots fail: a Refusal as it is; any other exception (the
    user's module, loss or data) as `torch-slot-failed`, with the exception kept to raise on
    this rank once every rank has refused."""
    if isinstance(e, Refusal):
        return e, None
    return Refusal("torch-slot-failed", f"{type(e).__name__}: {str(e)[:300]}"), e


class TrainingStep:
    """The step of one DataParallel over its parts: the `state` (module, parameters, seed, steps),
    the step's `plan` (StepPlan: torch's settings `env`, checked every step, the declared
    `precision`, the `payload` layout, the tree, this rank's `my_slots`, the slot count, the
    contract and the compute check), the `grads` writer, the `buffers` and the `accumulation`
    (no_sync()). It builds, collectively over `comm`, the audit's `audit` and `replicas` from
    `checks` (audit_slots, audit_digests; None where not asked for), its `combine` (the
    partition mode's class, StepCombine's signature, with `bucket_mb`, `timeout`,
    `realization`) and its `slot_pass` (with the audit's `fault_hook`)."""

    def __init__(
        self,
        state: ModuleState,
        plan: StepPlan,
        comm: MPI.Comm,
        *,
        grads: GradientWriter,
        buffers: StepBuffers,
        accumulation: Accumulation,
        checks: tuple[int, int],
        bucket_mb: float | None,
        timeout: float | None,
        realization: str,
        fault_hook: FaultHook | None,
        combine: Callable = StepCombine,
        turns: GatherSchedule | None = None,
        sharded: str | None = None,
    ) -> None:
        self.state, self.env, self.precision, self.payload = state, plan.env, plan.precision, plan.payload
        self.grads, self.buffers, self.accumulation = grads, buffers, accumulation
        self.my_slots, self.slots = plan.my_slots, plan.slots
        self.turns = turns  # partition="params": the units' gathers around each slot
        self.sharded = (
            sharded  # the mode's name where it shards the optimizer: ShardedGradScaler only (scaling.py)
        )
        audit, replicas = build_checks(
            comm,
            plan.plan,
            (*checks, "state"),
            timeout=timeout,
            contract=plan.contract.digest,
            compute=plan.compute,
        )
        self.audit: SlotAudit | None = audit
        self.replicas: ReplicaDigests | None = replicas  # type: ignore[assignment]
        self._audit_buf = np.zeros(plan.payload.total) if audit is not None else None
        self.combine = combine(
            comm,
            plan.tree,
            plan.combine_plan,
            plan.payload,
            state.params,
            bucket_mb=bucket_mb,
            timeout=timeout,
            contract=plan.contract.digest,
            realization=realization,
        )
        self.slot_pass = SlotPass(
            state.module,
            state.params,
            plan.payload,
            buffers,
            plan.precision,
            device=state.params[0].device,
            dtype=state.dtype,
            seed=state.seed,
            buckets=self.combine.buckets,
            fault_hook=fault_hook,
            rank=comm.Get_rank(),
        )

    @property
    def needed_slots(self) -> list[int]:
        """`my_slots`, then (audit_slots) the slots this rank recomputes this step."""
        from ..learning.audit import needed_slots

        return needed_slots(self.audit, self.my_slots, self.state.steps)

    def run(self, req: StepRequest, mode: int, asked: bool) -> tuple[float, bool]:
        """The step of `req` (`mode`: overwrite `.grad`, add into it, or carry the sums to the
        update, alpha_mpi.torch.accumulation; `asked`: this rank asks every rank to stop).
        Returns the global batch's mean loss and whether any rank asked to stop. What this
        rank refuses of its own inputs (the cut, the loss declaration, the environment, a slot's
        loss) travels as a flag in the step's combine, so every rank refuses (`peer-refused`
        naming this rank) instead of waiting for it; `.grad` is cleared, the buffers keep their
        step-start values, and the next step works."""
        start = self.buffers.snapshot()
        done = None
        try:
            self._compare_replicas()
            # The caller's generators are saved and restored once per step, not per slot.
            with step_rng() as devices, self.combine.around_slots():
                done = self._run_slots(req, mode, asked, start, devices)
                self._audit_slots(done)  # this rank's digests, carried by the combine
            red = self.combine.finish(done.refused)
            loss = self._apply(red, done, mode)
        except Exception as e:
            self._undo(start)
            if (
                done is not None
                and done.failure is not None
                and getattr(e, "code", None) == "torch-slot-failed"
            ):
                raise done.failure from e  # this rank's own exception, once every rank has refused
            raise
        self.state.steps += 1
        return loss, bool(red[self.combine.reader.stop_at] > 0)

    def _compare_replicas(self) -> None:
        """Every `audit_digests` steps, before the forward: the state's digests compared."""
        if self.replicas is not None and self.replicas.due(self.state.steps):
            self.replicas.check(self.state.steps, [t.detach().cpu().numpy() for t in self.state.tensors()])

    def _run_slots(self, req: StepRequest, mode: int, asked: bool, start, devices) -> SlotsDone:
        """This rank's checks of its inputs, then each owned slot's pass into its payload (the
        first also carries `asked`, this rank's stop). A refusal (or the user's exception) is
        kept in the result, for the combine to flag."""
        done = SlotsDone()
        buckets = self.combine.buckets
        try:
            g = req.given()  # first: step_local takes its sampler note whatever follows
            done.length, done.rule = g.length, g.rule
            scale = loss_scale(req.scaler, buckets=buckets is not None, sharded=self.sharded)
            if isinstance(req.scaler, ShardedGradScaler):
                req.scaler.note_step(None)  # until this step settles (a refused one never does)
            done.facts = step_facts(
                seed=self.state.seed,
                module=self.state.module,
                accumulate=mode,
                loss_scale=scale,
                source=g.source,
                sizes=g.sizes,
                note=g.note,
                length=g.length,
                digest=g.digest(),
            )
            declared = loss_reduction(req.loss_fn, req.reduction)
            self.precision.check_around()
            check_environment(self.env)
            check_parameters(self.state.module, self.state.params)
            done.batch = check_batch(req.cut(), self.needed_slots)
            words = np.empty(WORDS)
            done.facts.words(words)
            scaler = None if scale is None else req.scaler
            done.call = SlotCall(self.state.steps, req.loss_fn, declared, start, devices, words, scaler)
            last = self.my_slots[-1] if buckets is not None else None
            stop_at = self.payload.stop_at
            for i, s in enumerate(self.my_slots):
                buf = self.combine.slot_buffer(s)
                with self.turns.slot() if self.turns is not None else contextlib.nullcontext():
                    self.slot_pass.run(s, done.batch[s], done.call, buf, armed=s == last)
                buf[stop_at] = 1.0 if (asked and i == 0) else 0.0
                self.combine.slot_done(s)
        except Exception as e:  # a refusal, or the user's module, loss or data: flagged all the same
            done.refused, done.failure = slot_failure(e)
        if self.turns is not None:  # the turns this rank has no slot for: their gathers only
            done.refused = self.turns.finish(done.refused) or done.refused
        return done

    def _audit_slots(self, done: SlotsDone) -> None:
        """With audit_slots: the audited slots this rank owns digested, those it audits
        recomputed and digested, the words written into its first slot's payload for the
        combine (alpha_mpi.learning.audit). Not when this rank refused its slots: the combine
        flags that refusal and every rank raises it instead."""
        if self.audit is None or done.refused is not None:
            return
        carrier = self.combine.payloads[self.my_slots[0]]
        try:  # an audited slot recomputed here runs the user's module: its failure is flagged
            self.audit.contribute(
                self.state.steps,
                self.combine.payloads,
                self._recompute(done),
                self._audit_buf,
                carrier[self.payload.audit_at :],
                words=self.payload.stop_at,
                at=self.payload.audit_at,  # where the carried words are read back after a mismatch
                tamper=getattr(self.slot_pass.fault_hook, "carried", None),
            )
        except Exception as e:  # like a slot's own (_run_slots), not a wait at the combine
            done.refused, done.failure = slot_failure(e)

    def _recompute(self, done: SlotsDone):
        """What the audit's auditors and referees run: slot s's pass into `out`."""
        return lambda s, out: self.slot_pass.run(s, done.batch[s], done.call, out)

    def _apply(self, red: np.ndarray, done: SlotsDone, mode: int) -> float:
        """The combined payload's checks (the agreement words, the cut, the audit's words, the
        mass: combined words only, so every rank gives the same verdict), then `.grad` and the buffers; returns the
        global batch's mean loss."""
        lay = self.combine.reader  # the combined payload's words by name (the shard's, in `grads`)
        check_combined(lay.agreement(red), self.slots, done.facts)
        check_cut(lay.sizes(red), done.length, done.rule)
        if self.audit is not None:  # after the settings (a rank that differs by them is never
            # called a faulty host, step_agreement.py), before anything is written; a mismatch's
            # referees recompute under the step's generators, the caller's restored after
            words = lay.audit(red)
            with step_rng() if words.any() else contextlib.nullcontext():
                self.audit.settle(
                    self.state.steps, words, self._recompute(done), self._audit_buf, words=lay.stop_at
                )
        mass = red[lay.mass_at]
        if not mass > 0.0:
            raise Refusal(
                "mass-zero",
                f"the step's slots declared a total mass of {mass!r} (every item ignored or "
                "padding?); there is nothing to divide the gradient by; nothing was applied",
            )
        sums = (lay.gradient(red), mass, lay.used(red), bool(red[lay.inf_at] > 0))
        if mode == CARRY:  # inside no_sync(): nothing into .grad until the update
            self.accumulation.carry(*sums)
        else:
            numerator, total, used, inf = self.accumulation.settle(*sums)
            scaler = done.call.scaler if done.call is not None else None
            if isinstance(scaler, ShardedGradScaler):
                scaler.note_step(inf)  # the flag every rank has: what its unscaling records
            if inf:  # a GradScaler's scaled gradient overflowed (scaling.py)
                self.grads.overflow()
            else:
                self.grads.write_mean(numerator, total, used, mode != OVERWRITE)
            self.grads.scale = 1.0 if scaler is None else float(scaler.get_scale())
            self.state.updates += 1
        self.buffers.write_mean(lay.buffers(red))
        return float(red[lay.loss_at] / mass)

    def _undo(self, start) -> None:
        """A refused step: `.grad` cleared (an `opt.step()` changes nothing), buffers as at its start."""
        self.grads.clear()
        self.buffers.restore(start)
