"""`DataParallel`: a torch module's gradients combined over a declared slot tree.

Every rank calls `step(X, y, loss_fn)` with the same global batch (or `step_local` with its
share): each owned slot's forward and backward alone, its gradient widened exactly to binary64,
one combine over the slot tree, `.grad = Σ g / Σ mass` normalised once and rounded once, the same
on every rank; the user's optimizer then runs on identical gradients (the protocol, stage by
stage: alpha_mpi.torch.step). Buffers (BatchNorm's running statistics) are refused by name
(`torch-buffers-refused`) unless `buffers="slot-mean"` (the rule: alpha_mpi.torch.buffers).

This module builds the parts once, with explicit data, and holds the public API. The parts:
step_plan.py, step.py, slot_pass.py, combine.py, payload.py, accumulation.py (no_sync()),
clipping.py, step_value.py, buffers.py, gradients.py (`.grad`), the partition modes
(partition_modes.py, sharding.py, shard_*.py), state.py and checkpointing.py, module_check.py,
same_module.py, losses.py, step_agreement.py, slot_cut.py, slot_rules.py, scaling.py,
devices.py, contract_and_digest.py, convert.py, _env.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

from .. import kernel
from ..learning.audit import check_options
from ..learning.rng import slot_seed
from ..model.deprecation import deprecated_order_id
from ._env import require_torch
from .buffers import StepBuffers
from .checkpointing import CheckpointContext, Checkpoints
from .contract_and_digest import BUFFER_SLOT_MEAN_V1, ROUND_ONCE_V1, parameter_digest, torch_contract
from .gradients import UNUSED_RULES
from .module_check import BUFFER_RULES, check_module
from .overlap import check_bucket_mb
from .partition_modes import partition_mode
from .same_module import check_same_module, take_rank0_values
from .sharding import ShardContext, ShardLayout
from .slot_cut import given_share, given_slots, given_whole, local_cut
from .state import ModuleState
from .step import StepRequest, TrainingStep
from .step_agreement import BatchNotes
from .step_plan import StepPlan
from .step_value import StepValue

if TYPE_CHECKING:
    import torch
    from mpi4py import MPI

    from ..learning.audit import FaultHook
    from ..learning.preemption import Preemption
    from ..learning.slicing import Sliceable
else:
    torch = require_torch()

_Y = TypeVar("_Y", bound="Sliceable")  # the targets: loss_fn gets slices of y, of y's own type

# torch_contract, parameter_digest and the rule texts are defined in contract_and_digest.py,
# BUFFER_RULES in module_check.py; re-exported here, where they were first.
__all__ = ["DataParallel", "torch_contract", "parameter_digest", "BUFFER_RULES", "UNUSED_RULES"]
__all__ += ["ROUND_ONCE_V1", "BUFFER_SLOT_MEAN_V1"]


class DataParallel:
    """Data-parallel training of `module` over `comm` with a declared slot tree.

    Arguments:
        module: a torch.nn.Module whose trainable parameters are all float32 or all float64 and
            all on the CPU or all on one CUDA device (`torch-module-unsupported` otherwise). On
            CUDA the slot passes run there (deterministic algorithms on; the device is in the
            contract) and each slot's gradients cross to the host in one copy for the combine;
            the rounded `.grad` goes back in one copy per step (alpha_mpi.torch.devices).
        comm: an mpi4py communicator; collective: build on every rank.
        slots: logical micro-batch shards per step (>= ranks). The tree is over slots: any rank
            count that places the same tree gives the same bits.
        topology: the slot tree (default: DataParallelLearner's default).
        threads: torch intra-op threads, set here with deterministic algorithms (default 1).
        buffers: "refuse" (default: a module with buffers is refused by name) or "slot-mean"
            (the rule: alpha_mpi.torch.buffers).
        timeout: seconds a rank waits for a peer (default ALPHA_MPI_TIMEOUT).
        seed: the random-number seed of the slots: slot s of step t runs under torch's
            generators seeded from (seed, t, s), so dropout and every random op give the same
            bits on any rank count (alpha_mpi.torch.slot_rules).
        unused: `.grad` of a parameter no slot gave a gradient in a step: "none" (default: it
            keeps None, as DDP leaves it) or "zeros" (alpha_mpi.torch.gradients).
        preemption: an `alpha_mpi.Preemption`; its signal flag travels in every step's combine
            and sets its `agreed` (and `stop_agreed`) on every rank after the same step.
        audit_slots, audit_digests, fault_hook: as DataParallelLearner's (docs/audit.md): K slots
            a step recomputed on another rank before the combine (`sdc-detected`, `.grad` left
            None; `step_slots` batches hold `needed_slots`); every N steps, before the forward,
            the digests of the parameters and the buffers (floating and integer) compared
            (`replica-diverged`): by default (None) every 100 steps on more than one rank
            (alpha_mpi.torch.step_plan.DIGESTS_EVERY), 0 turns it off.
        bucket_mb: combine in buckets of about this many MiB while the last owned slot's
            backward runs (alpha_mpi.torch.overlap); None: one combine after the slots.
        autocast: the forward's precision, in the contract: None (float32/float64), or
            torch.bfloat16 / torch.float16 (CPU and CUDA): the step runs each slot's forward and
            loss under `torch.autocast(device, dtype)` (alpha_mpi.torch.slot_rules); an autocast
            the caller enters around the step must be this one (`torch-autocast-refused`).
        machine_independent: the caller's promise that the slots' results do not depend on the
            compute identity (torch's version, ATen capability, backends, threads, device, BLAS:
            alpha_mpi.model.compute), recorded in the contract. Without it ranks whose identities
            differ are refused on every rank (`compute-mismatch`), and so is a checkpoint of
            another identity (`compute-changed`). No torch setting makes CPU results the same
            across capabilities (docs/same-bits.md): promise it only for exact arithmetic.
        partition: where the state lives (alpha_mpi.torch.partition_modes): "none" (default),
            "state" (ZeRO-1: optimizer state sharded, `dp.optimizer`), "grads" (ZeRO-2: gradient
            too, `.grad` None: shard_grads.py) or "params" (ZeRO-3: parameters too, gathered per
            unit of `units`: units.py); the same bits in every mode.

    Construction checks that every rank holds the same architecture (`torch-module-mismatch`,
    alpha_mpi.torch.same_module) and computes alike (`compute-mismatch`), then copies rank 0's
    parameters and buffers (floating and integer) to every rank, exactly (a tree combine adding
    -0.0), so ranks need not seed alike. A module compiled by
    torch.compile is refused (`torch-compile-refused`, alpha_mpi.torch.module_check). Every step
    then checks that the module's trainable parameters are still those it was built with
    (`torch-module-changed`) and carries what the ranks must agree on in its payload (seed,
    training flags, accumulate, the global batch: alpha_mpi.torch.step_agreement).

    Attributes: `my_slots`, `steps` (combined calls), `updates` (optimizer updates), `contract`,
    `layout_order_id`, `conversions` (`WidenBinary32@contribution`, `RoundBinary64@gradient`
    for float32), `params` (trainable, in order), `n` (their element count), `stop_agreed`,
    `registered` (what checkpoints carry), `partition`, `shards` (sharding.ShardContext), `grads`.
    """

    order_id = deprecated_order_id("DataParallel")

    def __init__(
        self,
        module: torch.nn.Module,
        comm: MPI.Comm,
        *,
        slots: int,
        topology: str | None = None,
        threads: int = 1,
        buffers: str = "refuse",
        timeout: float | None = None,
        realization: str = "auto",
        seed: int = 0,
        unused: str = "none",
        preemption: Preemption | None = None,
        audit_slots: int = 0,
        audit_digests: int | None = None,
        fault_hook: FaultHook | None = None,
        bucket_mb: float | None = None,
        autocast: torch.dtype | str | None = None,
        machine_independent: bool = False,
        partition: str = "none",
        units: list | None = None,
    ) -> None:
        # Every check this rank makes alone runs first; its outcome travels in the first agreement
        # round (check_same_module): a refusal is named on every rank at once, none waits (issue 36).
        local = None
        try:
            kernel.fpenv_check()
            mode = partition_mode(partition)
            extra = {"bucket_mb": bucket_mb, "audit_slots": audit_slots, "realization": realization}
            check_bucket_mb(bucket_mb, audit_slots, fault_hook)
            parts = check_module(module, buffers)
            self.module, self.comm, self.timeout = module, comm, timeout
            self.size, self.rank = comm.Get_size(), comm.Get_rank()
            slot_seed(seed, 0, 0)  # refuses a seed that is not an int >= 0
            self.seed, self.preemption = int(seed), preemption
            self.params, self.dtype = parts.params, parts.dtype
            self.device = self.params[0].device
            self.notes = BatchNotes()  # what a SlotSampler's batches belong to (step_agreement.py)
            # Sized by this rank's module: nothing travels before the architectures are compared.
            sp = StepPlan.of(
                parts,
                self.size,
                self.rank,
                slots=slots,
                topology=topology,
                threads=threads,
                autocast=autocast,
                machine_independent=machine_independent,
                buffers=buffers,
                audit_slots=audit_slots,
            )
            self.precision, self.env, self.compute = sp.precision, sp.env, sp.compute
            self.compute_identity = self.compute.identity
            self.slots, self.topology, self.tree, self.plan = sp.slots, sp.topology, sp.tree, sp.plan
            self.payload, self.n, self.my_slots = sp.payload, sp.payload.n, sp.my_slots
            self.layout_order_id, self.contract = sp.layout_order_id, sp.contract
            self.conversions = sp.conversions
            layout = ShardLayout.of(self.payload.offsets, self.size)  # the mode's .grad, no_sync(), combine:
            mine = mode.parts(self.params, sp.payload, layout, self.rank, self.dtype, unused, **extra)
            self.grads, self.accumulation = mine.grads, mine.accumulation
            audit_digests = mode.replica_digests(audit_digests, self.size)
            check_options((audit_slots, audit_digests, "state"), slots, self.size)
            units = mode.plan_units(module, self.params, units, audit_slots=audit_slots, bucket_mb=bucket_mb)
        except Exception as e:  # it travels to every rank, then is re-raised here
            local = e
        # Every rank must hold the same architecture before any payload sized by it travels, and
        # compute alike (or be promised not to need to): `compute-mismatch` on every rank.
        check_same_module(module, comm, timeout, local)
        self.compute.agree(comm, what="building the DataParallel", timeout=timeout)
        cd = self.contract.digest
        self.state = ModuleState(module, parts, self.seed)
        self.buffers = StepBuffers(parts.float_buffers, parts.other_buffers, buffers, slots)
        self.last_loss = StepValue(float("nan"))
        self.stop_agreed = False
        take_rank0_values(comm, self.state.tensors(), timeout, cd)  # every rank takes rank 0's
        self.shards = ShardContext.of(
            comm, timeout, cd, module, self.params, mode, units, sp, layout, self.grads
        )
        self.stepper = TrainingStep(
            self.state,
            sp,
            comm,
            grads=self.grads,
            buffers=self.buffers,
            accumulation=self.accumulation,
            checks=(audit_slots, audit_digests),
            bucket_mb=bucket_mb,
            timeout=timeout,
            realization=realization,
            fault_hook=fault_hook,
            combine=mine.combine,
            turns=self.shards.gathers,
            sharded=mode.name if mode.shards_state else None,
        )
        self.audit, self.replicas = self.stepper.audit, self.stepper.replicas
        self.combine, self.slot_pass = self.stepper.combine, self.stepper.slot_pass
        self.realization = self.combine.realization
        ids = (self.layout_order_id, self.contract, self.compute_identity)  # what a checkpoint is of
        context = CheckpointContext(comm, slots, timeout, *ids, shared=(self,), bindings=self.shards.bindings)
        self.checkpoints = Checkpoints(self.state, context)

    @property
    def partition(self) -> str:
        """The partition mode's name; setting it is refused (`torch-partition-change`)."""
        return self.shards.partition

    @partition.setter
    def partition(self, value: str) -> None:
        self.shards.refuse_change(value)

    def optimizer(self, cls: type, groups, **kw) -> torch.optim.Optimizer:
        """torch's optimizer `cls(groups, **kw)` (groups as torch takes them): over the parameters
        with "none"; collective in "state" and "grads", over this rank's shard (AdamW, Adam, SGD,
        else `torch-optimizer-unsharded`), its step assembling the parameters (shard_optimizer.py)."""
        return self.shards.optimizer(cls, groups, kw)

    def full_parameters(self) -> contextlib.AbstractContextManager[None]:
        """Collective: every parameter whole in the block (params mode gathers, then frees them)."""
        return self.shards.whole()

    def memory(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Bytes this rank holds by kind (params, grads, optimizer_state, buffers, accumulators)
        at rest and at the step's peak (alpha_mpi.torch.memory)."""
        return self.shards.memory(self.grads, self.combine, self.accumulation, optimizer)

    @property
    def steps(self) -> int:
        """Combined calls, micro-steps included, one batch each: what `set_epoch` follows."""
        return self.state.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.state.steps = value

    @property
    def updates(self) -> int:
        """Optimizer updates, the combined calls outside `no_sync()` (saved and restored): what
        an LR schedule and the loop's end follow. Without no_sync() it equals `steps`."""
        return self.state.updates

    @updates.setter
    def updates(self, value: int) -> None:
        self.state.updates = value

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """torch's `clip_grad_norm_(params, max_norm)` after the step, before `opt.step()`: the
        global L2 norm of `.grad` in binary64 over a fixed block grid, torch's coefficient in
        float32 (alpha_mpi.torch.clipping), the same bits on every rank count; returns the norm.
        Before the step it clips nothing (the step writes `.grad`); inside no_sync() it is
        refused (`accumulation-pending`). The same bits in every partition mode."""
        self.accumulation.refuse_pending("clip_grad_norm_")
        return self.shards.clip_grad_norm_(max_norm)

    @property
    def registered(self) -> dict[str, object]:
        """The objects whose state checkpoints carry, by name (`register`, `scheduler=`)."""
        return self.state.registered

    @property
    def needed_slots(self) -> list[int]:
        """`my_slots`, then (audit_slots) the slots this rank recomputes this step."""
        return self.stepper.needed_slots

    # the step's entries ---------------------------------------------------------------------
    def step(
        self,
        X: Sliceable,
        y: _Y,
        loss_fn: Callable[[torch.Tensor, _Y], torch.Tensor],
        *,
        sizes: Iterable[int] | None = None,
        reduction: str | None = None,
        accumulate: bool | None = None,
        stop: bool = False,
        scaler: object | None = None,
    ) -> StepValue:
        """Forward and backward for each owned slot of the global batch (X, y), one ordered
        combine, `.grad = Σ g / Σ mass` on every rank. Returns Σ loss / Σ mass, the same on
        every rank: a float with `.item()` (step_value.py; `.backward()` on it is refused).

        X, y: the same global batch on every rank (sliceable on axis 0; X may be a mapping, a
        Hugging Face-style batch, with y None), digested and compared in the step's payload
        (`batch-mismatch`; another length: `slot-cut-mismatch`). loss_fn (losses.py): the SUM
        of the slot's per-sample losses, declared so (reduction="sum" on a torch loss or here,
        `alpha_mpi.torch.summed(fn)`; else `torch-loss-undeclared`), its mass the samples; or a
        pair `(loss_sum, mass)` (tokens); or `ModuleLoss(mass=...)` for a module's own mean
        loss. A total mass of 0 is refused (`mass-zero`). `sizes`: slot sizes (default: the
        even cut, alpha_mpi.learning.slot_ranges). Slot s runs under torch's generators seeded
        from (seed, steps, s) (slot_rules.py). `accumulate`: add this call's mean into `.grad`
        instead of overwriting; None: True for the step right after a `no_sync()` block (the
        update, dividing the block's carried sums with its own: accumulation.py), else False;
        inside the block every step carries. `stop`: this rank asks every rank to stop (so does
        a signalled `preemption`); then `stop_agreed` is True on every rank. `scaler`: a
        `torch.amp.GradScaler` (float16, partition="none"): each slot differentiates its loss
        times the scale; an overflow sets every `.grad` to inf so `scaler.step(opt)` skips."""
        from ..learning.slicing import slice_batch

        sizes = None if sizes is None else list(sizes)
        cut = lambda: slice_batch(X, y, self.slots, self.needed_slots, sizes)  # noqa: E731
        given = lambda: given_whole(X, y, sizes, self.slots)  # noqa: E731
        return self._step(StepRequest(cut, given, loss_fn, reduction, accumulate, stop, scaler))

    def step_local(
        self,
        X: Sliceable,
        y: _Y,
        loss_fn: Callable[[torch.Tensor, _Y], torch.Tensor],
        *,
        sizes: Iterable[int] | None = None,
        reduction: str | None = None,
        accumulate: bool | None = None,
        stop: bool = False,
        scaler: object | None = None,
    ) -> StepValue:
        """`step` on this rank's share of a global batch: (X, y) hold exactly the samples of
        `my_slots`, in slot order (what `alpha_mpi.torch.SlotSampler` yields through a
        DataLoader); the bits `step` gives on the global batch, on any rank count.

        Which global batch the share belongs to comes from the SlotSampler's note (data set and
        batch length, epoch, place, a digest of the indices; compared in the step's payload) or
        from `sizes` (one count per slot); with neither it is refused (`slot-cut-mismatch`: a
        whole batch on every rank would train on duplicated data). With `audit_slots` a rank
        also needs slots its share lacks: use `step` or `step_slots`. Returns as `step`.
        """
        sizes = None if sizes is None else list(sizes)
        cut = lambda: local_cut(X, y, self.slots, self.my_slots, sizes, self.audit)  # noqa: E731
        given = lambda: given_share(self.notes, sizes, self.slots)  # noqa: E731
        return self._step(StepRequest(cut, given, loss_fn, reduction, accumulate, stop, scaler))

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """DDP's accumulation pattern: the steps inside combine, carry their sums and write no
        `.grad`; the first step after the block is the update, `.grad = Σ gradients / Σ mass`
        over every micro-step's batch (the exact token mean; accumulation.py)."""
        return self.accumulation.no_sync()

    def step_slots(
        self,
        batch: Mapping[int, tuple[Sliceable, _Y]],
        loss_fn: Callable[[torch.Tensor, _Y], torch.Tensor],
        *,
        reduction: str | None = None,
        accumulate: bool | None = None,
        stop: bool = False,
        scaler: object | None = None,
    ) -> StepValue:
        """`step` for a batch already cut: {slot: (X_s, y_s)} for exactly `needed_slots`."""
        return self._step(
            StepRequest(lambda: batch, given_slots, loss_fn, reduction, accumulate, stop, scaler)
        )

    # the step (alpha_mpi.torch.step) ------------------------------------------------------------
    def _step(self, req: StepRequest) -> StepValue:
        """The step of `req` (step.py), with what it does with `.grad` (overwrite, add, carry:
        accumulation.py) and the stop request resolved here, the stop flag agreed after."""
        mode = self.accumulation.mode(req.accumulate)
        asked = bool(req.stop) or bool(self.preemption is not None and self.preemption.requested)
        loss, self.stop_agreed = self.stepper.run(req, mode, asked)
        if self.stop_agreed and self.preemption is not None:
            self.preemption.agreed = True
        self.last_loss = StepValue(loss)
        return self.last_loss

    # checkpoints (alpha_mpi.torch.checkpointing) ------------------------------------------------
    def register(self, name: str, obj) -> None:
        """Carry `obj.state_dict()` in checkpoints under `name`, loaded on restore (a scheduler...)."""
        self.state.register(name, obj)

    def save(
        self,
        directory: str,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: Mapping[str, object] | None = None,
        scheduler: object | None = None,
    ) -> str:
        """Publish the parameters, buffers, `optimizer`'s state (each rank its shard) and the
        registered objects' (`scheduler=`) under `directory` (collective), restorable on any rank
        count; refused inside no_sync() and before its update (`accumulation-pending`)."""
        self.accumulation.refuse_pending("save")
        with self.shards.whole():
            return self.checkpoints.save(directory, optimizer, config=config, scheduler=scheduler)

    def restore(
        self,
        directory: str,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: Mapping[str, object] | None = None,
        scheduler: object | None = None,
        adopt_contract: bool = False,
        adopt_lr: bool = False,
        missing_ok: bool = False,
        accept_compute_change: bool = False,
    ) -> str | None:
        """Load a checkpoint saved on any rank count and partition mode into the module,
        `optimizer` (with the saved hyperparameters) and the registered objects (`scheduler`:
        registered as "scheduler"); sets `steps` and `updates`, restores each group's saved `lr`
        and prints it (rank 0). `adopt_lr`: keep the optimizer's rate where a scheduler's
        `initial_lr` differs (a hand-set rate needs none: checkpointing.py). Refused inside
        no_sync() (`accumulation-pending`). `accept_compute_change`: restore another compute
        identity's checkpoint (else `compute-changed`; recorded). Returns the step directory,
        or None with `missing_ok` when there is none. Collective."""
        self.accumulation.refuse_pending("restore")
        kw = dict(config=config, scheduler=scheduler, adopt_lr=adopt_lr, adopt_contract=adopt_contract)
        kw.update(missing_ok=missing_ok, accept_compute_change=accept_compute_change)
        with self.shards.whole(writeback=True):  # params mode: the shard takes what is restored
            return self.checkpoints.restore(directory, optimizer, **kw)

    def state_digest(self, optimizer: torch.optim.Optimizer | None = None) -> str:
        """The digest of the whole state (parameters, buffers, `optimizer`'s state, the step,
        registered objects, the seed), the same on every rank count and mode (collective)."""
        with self.shards.whole():
            return self.checkpoints.state_digest(optimizer)

    def digest(self) -> str:
        """parameter_digest(module): sha256 of the parameters as binary64 (collective in params mode)."""
        with self.shards.whole():
            return parameter_digest(self.module)

    def free(self) -> None:
        """Free the combine's (and sharded optimizers') requests and give their tags back (local)."""
        self.combine.free()
        self.shards.free()
