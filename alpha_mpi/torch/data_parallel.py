"""`DataParallel`: a torch module's gradients combined over a declared slot tree.

Every rank calls `step(X, y, loss_fn)` with the same global batch (or `step_local` with its
share): each owned slot's forward and backward alone, its gradient widened exactly to binary64,
one combine over the slot tree, `.grad = Σ g / Σ mass` normalised once and rounded once, the same
on every rank; the user's optimizer then runs on identical gradients (the protocol, stage by
stage: alpha_mpi.torch.step). Buffers (BatchNorm's running statistics) are refused by name
(`torch-buffers-refused`) unless `buffers="slot-mean"` (the rule: alpha_mpi.torch.buffers).

This module builds the parts once, with explicit data, and holds the public API: the step's
protocol (step.py: `TrainingStep`), the payload's layout (payload.py: `PayloadLayout`), one
slot's pass (slot_pass.py: `SlotPass`), the combine (combine.py: `StepCombine`, one Allreducer
or the buckets of overlap.py), the buffers' rule (buffers.py: `StepBuffers`), `.grad`
(gradients.py: `GradientWriter`), the state checkpoints carry (state.py: `ModuleState`) and their
view (checkpointing.py: `Checkpoints`, `TorchCheckpointView`). Apart from it too: what it checks
about the module before building anything (module_check.py) and that every rank built the same
one (same_module.py), the declared loss and mass (losses.py), what the ranks must agree on in a
step (step_agreement.py), whether the ranks' slots are one global batch's cut (slot_cut.py), the
rules around each slot (slot_rules.py: precision, generators), a GradScaler (scaling.py), a
module on a device (devices.py), the contract and the parameter digest (contract_and_digest.py),
the two conversion sites (convert.py), torch's environment (_env.py).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

from .. import kernel
from ..learning.audit import audit_words, build_checks, check_options, slot_owners
from ..learning.rng import slot_seed
from ..model import ReplicateAll, build
from ..model.deprecation import deprecated_order_id
from ..planning import plan
from ..refusals import Refusal
from ._env import fix_environment, require_torch
from .buffers import StepBuffers
from .checkpointing import CheckpointContext, Checkpoints
from .combine import StepCombine
from .contract_and_digest import (
    BUFFER_SLOT_MEAN_V1,
    ROUND_ONCE_V1,
    parameter_digest,
    torch_compute,
    torch_contract,
)
from .devices import contract_environment
from .gradients import UNUSED_RULES, GradientWriter
from .module_check import BUFFER_RULES, check_module
from .overlap import check_bucket_mb
from .partition_modes import partition_mode
from .payload import PayloadLayout
from .same_module import check_same_module, take_rank0_values
from .sharding import ShardContext, ShardLayout
from .slot_cut import given_share, given_slots, given_whole
from .slot_pass import SlotPass
from .slot_rules import precision
from .state import ModuleState
from .step import StepRequest, TrainingStep
from .step_agreement import MAX_SLOTS, BatchNotes

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
__all__ = [
    "DataParallel",
    "torch_contract",
    "parameter_digest",
    "BUFFER_RULES",
    "UNUSED_RULES",
    "ROUND_ONCE_V1",
    "BUFFER_SLOT_MEAN_V1",
]


def _default_topology() -> str:
    """The learners' default topology (DataParallelLearner's), so both follow one default."""
    from ..learning.learner import DataParallelLearner

    return inspect.signature(DataParallelLearner.__init__).parameters["topology"].default


class DataParallel:
    """Data-parallel training of `module` over `comm` with a declared slot tree.

    Arguments:
        module: a torch.nn.Module whose trainable parameters are all float32 or all float64 and
            all on the CPU or all on one CUDA device (`torch-module-unsupported` otherwise). On
            CUDA the slot passes run there (deterministic algorithms on; the device is in the
            contract) and each slot's gradients cross to the host in one copy for the combine;
            the rounded `.grad` goes back in one copy per step (alpha_mpi.torch.devices). Construction copies rank 0's
            parameters (and buffers) to every rank, exactly, through the same kind of tree
            combine (adding -0.0 is exact), so ranks need not seed alike.
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
            (`replica-diverged`).
        bucket_mb: combine in buckets of about this many MiB while the last owned slot's
            backward runs (alpha_mpi.torch.overlap); None: one combine after the slots.
        autocast: the forward's precision, in the contract: None (float32/float64), or
            torch.bfloat16 / torch.float16 (CPU and CUDA): the step runs each slot's forward and
            loss under `torch.autocast(device, dtype)` (alpha_mpi.torch.slot_rules); an autocast
            the caller enters around the step must be this one (`torch-autocast-refused`).
        machine_independent: the caller's promise that the slots' results do not depend on the
            compute identity (torch's version, ATen CPU capability, backends, threads, device;
            numpy's BLAS; alpha_mpi.model.compute), recorded in the contract. Without it ranks
            whose identities differ are refused here on every rank (`compute-mismatch`, naming
            the ranks and the field) and a checkpoint of another identity is refused on restore
            (`compute-changed`). No torch setting makes CPU results the same across capabilities
            (docs/same-bits.md), so promise it only for a module whose arithmetic is exact.
        partition: where the optimizer state lives (alpha_mpi.torch.partition_modes): "none" (default:
            every rank holds it all) or "state" (ZeRO-1: each rank holds and updates its shard,
            the updated parameters assembled to every rank); the same bits in every mode. Build
            the optimizer with `dp.optimizer(cls, groups, **kw)`; an unknown name is refused
            (`torch-partition-unknown`), and so is changing `dp.partition` afterwards.

    Construction checks that every rank holds the same architecture (`torch-module-mismatch`,
    alpha_mpi.torch.same_module) and computes alike (`compute-mismatch`), then copies rank 0's
    parameters and buffers (floating and integer) to every rank. A module compiled by
    torch.compile is refused (`torch-compile-refused`, alpha_mpi.torch.module_check). Every step
    then checks that the module's trainable parameters are still those it was built with
    (`torch-module-changed`) and carries what the ranks must agree on in its payload (seed,
    training flags, accumulate, the global batch: alpha_mpi.torch.step_agreement).

    Attributes: `my_slots`, `steps` (combined steps), `contract`, `layout_order_id`, `conversions`
    (the conversion sites: `WidenBinary32@contribution`, `RoundBinary64@gradient` for float32),
    `params` (the trainable parameters in order), `n` (their element count), `stop_agreed`,
    `registered` (the objects whose state checkpoints carry: `register`, `scheduler=`),
    `partition` (the mode's name), `shards` (the shard layout and the sharded optimizers:
    alpha_mpi.torch.sharding.ShardContext).
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
        audit_digests: int = 0,
        fault_hook: FaultHook | None = None,
        bucket_mb: float | None = None,
        autocast: torch.dtype | str | None = None,
        machine_independent: bool = False,
        partition: str = "none",
    ) -> None:
        # Every check this rank makes alone (the arguments, the module, the plan, the contract,
        # the audit's options) runs first; its outcome travels in the first agreement round
        # (check_same_module), so a rank that refuses is named on every rank at once (its own
        # code there, `peer-refused` elsewhere) and no rank is left waiting for it or pairs its
        # next DataParallel with this one (issue 36).
        local = None
        try:
            kernel.fpenv_check()
            self._partition = partition_mode(partition)
            check_bucket_mb(bucket_mb, audit_slots, fault_hook)
            parts = check_module(module, buffers)
            self.module, self.comm, self.timeout = module, comm, timeout
            self.size, self.rank = comm.Get_size(), comm.Get_rank()
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < self.size:
                raise Refusal(
                    "placement-invalid",
                    f"{slots!r} slots on {self.size} ranks leaves ranks without a contribution; "
                    "use slots >= ranks",
                )
            if slots > MAX_SLOTS:  # the agreement words' sums stay exact below it (step_agreement.py)
                raise Refusal("placement-invalid", f"{slots} slots; DataParallel takes at most {MAX_SLOTS}")
            slot_seed(seed, 0, 0)  # refuses a seed that is not an int >= 0
            self.slots, self.seed, self.preemption = slots, int(seed), preemption
            self.topology = _default_topology() if topology is None else topology
            self.params, self.dtype = parts.params, parts.dtype
            self.device = self.params[0].device
            self.precision = precision(autocast, self.device, self.dtype)
            self.notes = BatchNotes()  # what a SlotSampler's batches belong to (step_agreement.py)
            if self.device.type == "cuda":  # deterministic cuBLAS needs it before its first call
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            self.env = fix_environment(threads)
            settings = contract_environment(self.env, self.device)
            self.compute = torch_compute(settings, machine_independent)
            self.compute_identity = self.compute.identity
            # Sized by this rank's module: nothing travels before the architectures are compared.
            self.payload = PayloadLayout.of(parts.params, parts.float_buffers, slots)
            self.n = self.payload.n
            self.tree = build(self.topology, slots, self.size)
            self.plan = plan(self.tree, ReplicateAll(), self.payload.layout, size=self.size)
            self.my_slots = self.plan.slots_of(self.rank)
            self.layout_order_id = self.plan.layout_order_id  # what the contract and the frames name
            self.contract = torch_contract(
                self.layout_order_id, self.dtype, settings, buffers, self.precision.name, self.compute.spec
            )
            self.grads = GradientWriter(self.params, list(self.payload.offsets), self.dtype, unused)
            check_options((audit_slots, audit_digests, "state"), slots, self.size)
            # With audit_slots the combine carries the audit's words after the agreement words
            # (learning/audit.py): the same tree over a longer payload, every coordinate's bits
            # as before; the contract names the layout without them (an audited run and an
            # unaudited one are one contract, and their checkpoints one kind).
            words = audit_words(audit_slots, slot_owners(self.plan, self.size), self.size)
            combine_plan = self.plan
            if words:
                self.payload = PayloadLayout.of(parts.params, parts.float_buffers, slots, audit=words)
                combine_plan = plan(self.tree, ReplicateAll(), self.payload.layout, size=self.size)
        except Exception as e:  # it travels to every rank, then is re-raised here
            local = e
        # Every rank must hold the same architecture before any payload sized by it travels, and
        # compute alike (or be promised not to need to): `compute-mismatch` on every rank.
        check_same_module(module, comm, timeout, local)
        self.compute.agree(comm, what="building the DataParallel", timeout=timeout)
        self.conversions = (
            (("WidenBinary32", "contribution"), ("RoundBinary64", "gradient"))
            if self.dtype == torch.float32
            else (("KeepFormat", "contribution"),)
        )
        cd = self.contract.digest
        self.combine = StepCombine(
            comm,
            self.tree,
            combine_plan,
            self.payload,
            self.params,
            bucket_mb=bucket_mb,
            timeout=timeout,
            contract=cd,
            realization=realization,
        )
        self.realization = self.combine.realization
        self.state = ModuleState(module, parts, self.seed)
        self.buffers = StepBuffers(parts.float_buffers, parts.other_buffers, buffers, slots)
        self.slot_pass = SlotPass(
            module,
            self.params,
            self.payload,
            self.buffers,
            self.precision,
            device=self.device,
            dtype=self.dtype,
            seed=self.seed,
            buckets=self.combine.buckets,
            fault_hook=fault_hook,
            rank=self.rank,
        )
        self.last_loss = float("nan")
        self.stop_agreed = False
        self._no_sync = 0  # depth of no_sync() contexts; > 0: steps accumulate
        self._after_no_sync = False  # the step right after a no_sync() block accumulates too (DDP)
        take_rank0_values(comm, self.state.tensors(), timeout, cd)  # every rank takes rank 0's
        self.audit, self.replicas = build_checks(
            comm,
            self.plan,
            (audit_slots, audit_digests, "state"),
            timeout=timeout,
            contract=cd,
            compute=self.compute,
        )
        self.stepper = TrainingStep(
            self.state,
            env=self.env,
            precision=self.precision,
            payload=self.payload,
            slot_pass=self.slot_pass,
            combine=self.combine,
            grads=self.grads,
            buffers=self.buffers,
            audit=self.audit,
            replicas=self.replicas,
            my_slots=self.my_slots,
            slots=slots,
        )
        layout = ShardLayout.of(self.payload.offsets, self.size)
        self.shards = ShardContext(comm, timeout, cd, module, self.params, layout, bindings={})
        context = CheckpointContext(
            comm,
            slots,
            timeout,
            self.layout_order_id,
            self.contract,
            self.compute_identity,
            shared=(self,),
            bindings=self.shards.bindings,
        )
        self.checkpoints = Checkpoints(self.state, context)

    @property
    def partition(self) -> str:
        """The partition mode's name (alpha_mpi.torch.partition_modes); fixed at construction."""
        return self._partition.name

    @partition.setter
    def partition(self, value: str) -> None:
        raise Refusal(
            "torch-partition-change",
            f"partition is {self._partition.name!r} for the life of this DataParallel (asked {value!r}); "
            "save, build a new DataParallel with the other partition, and restore into it",
        )

    def optimizer(self, cls: type, groups, **kw) -> torch.optim.Optimizer:
        """torch's optimizer `cls(groups, **kw)` for this DataParallel's partition mode: over the
        parameters with "none"; over this rank's shard of them with "state" (collective; the
        classes whose update on a shard is measured to keep the bits: AdamW, Adam, SGD; others
        `torch-optimizer-unsharded`), its step assembling the updated parameters on every rank
        (alpha_mpi.torch.shard_optimizer). `groups`: what torch takes, over the module's
        trainable parameters (all of them, each once, in a sharded mode)."""
        return self._partition.optimizer(self.shards, cls, groups, kw)

    def memory(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Bytes this rank holds by kind (params, grads, optimizer_state, buffers, accumulators)
        at rest and at the step's peak (alpha_mpi.torch.memory)."""
        from .memory import memory

        binding = self.shards.bindings.get(id(optimizer))
        return memory(self.params, self.module, self.grads, self.combine, optimizer, binding)

    @property
    def steps(self) -> int:
        """Combined steps (a restore sets it)."""
        return self.state.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.state.steps = value

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
    ) -> float:
        """Forward and backward for each owned slot of the global batch (X, y), one ordered
        combine, `.grad = Σ g / Σ mass` on every parameter of every rank. Returns the global
        batch's mean loss Σ loss / Σ mass (the same float on every rank).

        X, y: the same global batch on every rank (tensors or arrays sliceable on axis 0; X may
        be a mapping of them, a Hugging Face-style batch, with y None). Every rank's batch is
        digested (CRC-32) and compared in the step's payload: ranks given different batches
        are refused by name (`batch-mismatch`; another length: `slot-cut-mismatch`).
        loss_fn (alpha_mpi.torch.losses): `loss_fn(output, target)` returning the SUM of the
        slot's per-sample losses, declared so (a torch loss with reduction="sum",
        `alpha_mpi.torch.summed(fn)`, or `reduction="sum"` here; `torch-loss-undeclared`
        otherwise), its mass the slot's samples; or returning a pair `(loss_sum, mass)` (tokens,
        say); or `alpha_mpi.torch.ModuleLoss(mass=...)` for a module computing its own mean
        loss. A total mass of 0 is refused (`mass-zero`). `sizes`: slot
        sizes (default: the even cut of alpha_mpi.learning.slot_ranges). Each slot runs under
        torch's generators seeded from (seed, steps, slot) (alpha_mpi.torch.slot_rules).
        `accumulate`: add into `.grad` (see alpha_mpi.torch.gradients) instead of overwriting;
        None: True inside `no_sync()` and for the step right after it, else False. `stop`: this
        rank asks every rank to stop (also when the DataParallel's `preemption` was signalled);
        afterwards `stop_agreed` is True on every rank when any rank asked. `scaler`: a
        `torch.amp.GradScaler` (float16 autocast): each slot differentiates its loss times the
        scale, and an overflow sets every `.grad` to inf so `scaler.step(opt)` skips
        (alpha_mpi.torch.scaling).
        """
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
    ) -> float:
        """`step` on this rank's share of a global batch: (X, y) hold exactly the samples of
        `my_slots` of one global batch, in slot order (what `alpha_mpi.torch.SlotSampler`
        yields through a DataLoader). The result is the bits `step` gives on the global batch,
        on any rank count, while each rank reads only its share.

        Which global batch the share belongs to comes from the SlotSampler that yielded it (its
        note: the data set length, the global batch's length, epoch, place in the epoch and a
        digest of its sample indices, compared across ranks in the step's payload) or from
        `sizes` (one count per slot of the global batch); with neither, the step is refused
        (`slot-cut-mismatch`): a whole batch on every rank would train on duplicated data. The
        owned slots' sizes follow from len(y) under `step`'s even cut, or from `sizes`. With
        `audit_slots` a rank also needs the slots it recomputes, which its share lacks: use
        `step` or `step_slots` there. Returns the global batch's mean loss, as `step`.
        """
        from ..learning.slicing import slice_local

        sizes = None if sizes is None else list(sizes)

        def cut():
            if self.audit is not None:
                raise Refusal(
                    "options-conflict",
                    "step_local takes this rank's own slots only; with audit_slots a rank also "
                    "recomputes other ranks' slots: use step() with the global batch or step_slots()",
                )
            return slice_local(X, y, self.slots, self.my_slots, sizes)

        given = lambda: given_share(self.notes, sizes, self.slots)  # noqa: E731
        return self._step(StepRequest(cut, given, loss_fn, reduction, accumulate, stop, scaler))

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Steps inside (and the first step after) add into `.grad`, as DDP's no_sync pattern
        expects; each step still combines over the slot tree (that is what keeps the bits)."""
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1
            self._after_no_sync = self._no_sync == 0

    def step_slots(
        self,
        batch: Mapping[int, tuple[Sliceable, _Y]],
        loss_fn: Callable[[torch.Tensor, _Y], torch.Tensor],
        *,
        reduction: str | None = None,
        accumulate: bool | None = None,
        stop: bool = False,
        scaler: object | None = None,
    ) -> float:
        """`step` for a batch already cut: {slot: (X_s, y_s)} for exactly `needed_slots`."""
        return self._step(
            StepRequest(lambda: batch, given_slots, loss_fn, reduction, accumulate, stop, scaler)
        )

    # the step (alpha_mpi.torch.step) ------------------------------------------------------------
    def _step(self, req: StepRequest) -> float:
        """The step of `req` (alpha_mpi.torch.step), with `accumulate` and the stop request
        resolved here and the stop flag agreed afterwards."""
        accumulate = self._accumulates(req.accumulate)
        asked = bool(req.stop) or bool(self.preemption is not None and self.preemption.requested)
        self.last_loss, self.stop_agreed = self.stepper.run(req, accumulate, asked)
        if self.stop_agreed and self.preemption is not None:
            self.preemption.agreed = True
        return self.last_loss

    def _accumulates(self, accumulate: bool | None) -> bool:
        """`accumulate` as given, or (None) True inside `no_sync()` and for the step right after."""
        if accumulate is None:
            accumulate = self._no_sync > 0 or self._after_no_sync
        if self._no_sync == 0:
            self._after_no_sync = False
        return accumulate

    # checkpoints (alpha_mpi.torch.checkpointing) ------------------------------------------------
    def register(self, name: str, obj) -> None:
        """Carry `obj.state_dict()` in every checkpoint under `name` and `obj.load_state_dict`
        it on restore (an LR scheduler, a sampler, a gradient scaler ...)."""
        self.state.register(name, obj)

    def save(
        self,
        directory: str,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        config: Mapping[str, object] | None = None,
        scheduler: object | None = None,
    ) -> str:
        """Publish the parameters, buffers, `optimizer`'s state and every registered object's
        state (`scheduler`: registered as "scheduler") at step `steps` under `directory`
        (collective); the CLI's checkpoint format, restorable on any rank count."""
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
        """Load a checkpoint saved on any rank count into the module, `optimizer` (built over
        the module's parameters with the saved hyperparameters) and the registered objects
        (`scheduler`: registered as "scheduler"); sets `steps`. `adopt_lr`: continue with the
        optimizer's present learning rate (see alpha_mpi.torch.checkpointing).
        `accept_compute_change`: restore although the checkpoint was computed under another
        compute identity (`compute-changed` otherwise; recorded). Returns the step directory, or None with
        `missing_ok` when there is none. Collective."""
        return self.checkpoints.restore(
            directory,
            optimizer,
            config=config,
            scheduler=scheduler,
            adopt_lr=adopt_lr,
            adopt_contract=adopt_contract,
            missing_ok=missing_ok,
            accept_compute_change=accept_compute_change,
        )

    def state_digest(self, optimizer: torch.optim.Optimizer | None = None) -> str:
        """The digest of the whole state (STATE_COVERS, and the buffers): parameters, buffers,
        `optimizer`'s state, the step, registered objects and the seed; `digest()` is the
        parameters' alone. The same on every rank and rank count (every rank holds it all)."""
        return self.checkpoints.state_digest(optimizer)

    def digest(self) -> str:
        """parameter_digest(module): sha256 of the parameters as binary64."""
        return parameter_digest(self.module)

    def free(self) -> None:
        """Free the combine's (and sharded optimizers') requests and give their tags back (local)."""
        self.combine.free()
        for binding in self.shards.bindings.values():
            binding.free()
