"""`DataParallel`: a torch module's gradients combined over a declared slot tree.

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
   checks the agreement words and the cut on the combined payload alike; then
   `g = numerator / mass` once in binary64, then for float32 one `kernel.round_binary64` into each
   parameter's `.grad` (the `RoundBinary64@gradient` site; added to the `.grad` held with
   `accumulate`; None for a parameter no slot used). Every rank holds the same `.grad`.
5. The user's optimizer (`opt.step()`) runs on identical gradients and identical state on every
   rank, so the parameters stay identical.

Buffers (e.g. BatchNorm's running_mean, running_var, num_batches_tracked): refused by name
(`torch-buffers-refused`) unless `buffers="slot-mean"`, whose rule is: every slot's forward starts
from the step's buffers; a floating buffer's new value is the mean over all slots of the values
each slot's forward left, Σ_s b_s / S, the sum evaluated by the same slot tree in binary64 (float32
widened exactly), one true division by S, then rounded once to the buffer's dtype; an integer
buffer (a counter) takes the value the slot forwards left, which is the same for every slot.
With `buffers="slot-mean"` the result does not depend on the rank count either (the rule is over
slots), but it is not what one forward over the whole batch would give.

A non-finite gradient, buffer or loss is refused on every rank; `.grad` is cleared (None) and the
buffers keep their step-start values, so an `opt.step()` after a refusal changes nothing.

This module holds the step; apart from it: what it checks about the module before building
anything (module_check.py) and that every rank built the same one (same_module.py), one slot's
pass and the payload layout (slot_pass.py), the declared loss and mass (losses.py), what the
ranks must agree on in a step (step_agreement.py), whether the ranks' slots are one global
batch's cut (slot_cut.py), the rules around each slot (slot_rules.py: precision, generators),
a GradScaler (scaling.py), the buckets (overlap.py), a module on a device (devices.py), the
contract and the parameter digest (contract_and_digest.py), the two conversion sites
(convert.py), `.grad` (gradients.py), the checkpoint view (checkpointing.py).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .. import kernel
from ..execution import Allreducer
from ..learning.audit import build_checks, check_options
from ..learning.rng import slot_seed
from ..model import ReplicateAll, build
from ..model.deprecation import deprecated_order_id
from ..planning import plan
from ..refusals import Refusal
from ._env import check_environment, fix_environment, require_torch
from .checkpointing import CheckpointMethods
from .contract_and_digest import (
    BUFFER_SLOT_MEAN_V1,
    ROUND_ONCE_V1,
    parameter_digest,
    torch_compute,
    torch_contract,
)
from .convert import from64 as _from64
from .devices import contract_environment
from .gradients import UNUSED_RULES, GradientWriter
from .losses import loss_reduction
from .module_check import BUFFER_RULES, check_module, check_parameters
from .overlap import Buckets, check_bucket_mb
from .same_module import check_same_module, take_rank0_values
from .scaling import loss_scale, mark_overflow
from .slot_cut import check_batch, check_cut, given_share, given_slots, given_whole
from .slot_pass import SlotCall, SlotPasses
from .slot_rules import precision, step_rng
from .step_agreement import FIELDS, MAX_SLOTS, WORDS, BatchNotes, check_combined, check_table, step_facts

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


class DataParallel(CheckpointMethods, SlotPasses):
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
            (the rule in the module docstring).
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
    `registered` (the objects whose state checkpoints carry: `register`, `scheduler=`).
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
    ) -> None:
        # Every check this rank makes alone (the arguments, the module, the plan, the contract,
        # the audit's options) runs first; its outcome travels in the first agreement round
        # (check_same_module), so a rank that refuses is named on every rank at once (its own
        # code there, `peer-refused` elsewhere) and no rank is left waiting for it or pairs its
        # next DataParallel with this one (issue 36).
        local = None
        try:
            kernel.fpenv_check()
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
            self.buffer_rule = buffers
            self.float_buffers, self.other_buffers = parts.float_buffers, parts.other_buffers
            self.device = self.params[0].device
            self.precision = precision(autocast, self.device, self.dtype)
            self.notes = BatchNotes()  # what a SlotSampler's batches belong to (step_agreement.py)
            if self.device.type == "cuda":  # deterministic cuBLAS needs it before its first call
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            self.env = fix_environment(threads)
            self.compute = torch_compute(contract_environment(self), machine_independent)
            self.compute_identity = self.compute.identity
            # Sized by this rank's module: nothing travels before the architectures are compared.
            self.layout = self._lay_out(slots)
            self.tree = build(self.topology, slots, self.size)
            self.plan = plan(self.tree, ReplicateAll(), self.layout, size=self.size)
            self.my_slots = self.plan.slots_of(self.rank)
            self.layout_order_id = self.plan.layout_order_id  # what the contract and the frames name
            self.contract = torch_contract(
                self.layout_order_id,
                self.dtype,
                contract_environment(self),
                buffers,
                self.precision.name,
                self.compute.spec,
            )
            self.grads = GradientWriter(self.params, self.offsets, self.dtype, unused)
            check_options((audit_slots, audit_digests, "state"), slots, self.size)
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
        self.reducer, self.buckets = None, None
        if bucket_mb is None:
            self.reducer = Allreducer(
                comm, self.plan, timeout=timeout, contract=self.contract.digest, realization=realization
            )
            self.realization = self.reducer.realization
        else:
            self.buckets = Buckets(
                comm,
                self.tree,
                self.params,
                self.offsets,
                self.layout.total,
                bucket_mb=bucket_mb,
                timeout=timeout,
                contract=self.contract.digest,
                realization=realization,
            )
            self.realization = self.buckets.reducers[0].realization
        self.payloads = {s: np.zeros(self.layout.total) for s in self.my_slots}
        self.reduced = np.empty(self.layout.total)
        self._g = np.empty(self.n)
        # A module on a device: each slot's gradients cross to the host in one copy, into this.
        self._host = (
            None if self.device.type == "cpu" else torch.empty(self.n, dtype=self.dtype, pin_memory=True)
        )
        self._b = np.empty(self.nb)
        self.steps = 0
        self.last_loss = float("nan")
        self.stop_agreed = False
        self._no_sync = 0  # depth of no_sync() contexts; > 0: steps accumulate
        self._after_no_sync = False  # the step right after a no_sync() block accumulates too (DDP)
        self.registered: dict[str, object] = {}  # name -> object with state_dict/load_state_dict
        # Every rank takes rank 0's values (same_module.py).
        take_rank0_values(comm, self._state_tensors(), timeout, self.contract.digest)
        self.fault_hook = fault_hook
        opts, cd = (audit_slots, audit_digests, "state"), self.contract.digest
        self.audit, self.replicas = build_checks(
            comm,
            self.plan,
            opts,
            timeout=timeout,
            contract=cd,
            agree_words=len(FIELDS),
            compute=self.compute,
        )
        self._audit_buf = np.zeros(self.layout.total) if self.audit is not None else None

    @property
    def needed_slots(self) -> list[int]:
        """`my_slots`, then (audit_slots) the slots this rank recomputes this step."""
        from ..learning.audit import needed_slots

        return needed_slots(self.audit, self.my_slots, self.steps)

    # ------------------------------------------------------------------------------------------
    def _state_tensors(self):
        """What every rank holds alike: the parameters, the floating buffers and the integer
        ones (counters): taken from rank 0 at construction, compared by the replica digests."""
        return [p.data for p in self.params] + [b for _, b in self.float_buffers + self.other_buffers]

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
        return self._step(cut, loss_fn, reduction, accumulate, stop, given, scaler)

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
                    "usage",
                    "step_local takes this rank's own slots only; with audit_slots a rank also "
                    "recomputes other ranks' slots: use step() with the global batch or step_slots()",
                )
            return slice_local(X, y, self.slots, self.my_slots, sizes)

        given = lambda: given_share(self.notes, sizes, self.slots)  # noqa: E731
        return self._step(cut, loss_fn, reduction, accumulate, stop, given, scaler)

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
        return self._step(lambda: batch, loss_fn, reduction, accumulate, stop, given_slots, scaler)

    def _step(self, cut, loss_fn, reduction, accumulate, stop, given, scaler=None) -> float:
        """The step over `cut()` (the {slot: data} batch). What this rank refuses of its own
        inputs (the cut, the loss declaration, the environment, a slot's loss) travels as a
        flag in the step's exchange, so every rank refuses (`peer-refused` naming this rank)
        instead of waiting for it; the next step works. `given()`: how the global batch was
        given, a `Given` (what the ranks must agree on about it, and its cut)."""
        if accumulate is None:
            accumulate = self._no_sync > 0 or self._after_no_sync
        if self._no_sync == 0:
            self._after_no_sync = False
        asked = bool(stop) or bool(self.preemption is not None and self.preemption.requested)
        n, failure, facts, length, rule = self.n, None, None, 0, None
        start = (
            [b.detach().clone() for _, b in self.float_buffers + self.other_buffers]
            if self.buffer_rule == "slot-mean"
            else None
        )
        bk = self.buckets
        try:
            if self.replicas is not None and self.replicas.due(self.steps):
                self.replicas.check(self.steps, [t.detach().cpu().numpy() for t in self._state_tensors()])
            if bk is not None:
                bk.begin(self.payloads, self.reduced)
            # The caller's generators are saved and restored once per step, not per slot.
            with step_rng() as devices, bk.walk() if bk is not None else contextlib.nullcontext():
                refused, batch, call = None, None, None
                try:
                    g = given()  # first: step_local takes its sampler note whatever follows
                    length, rule = g.length, g.rule
                    scale = loss_scale(scaler, buckets=bk is not None)
                    facts = step_facts(
                        seed=self.seed,
                        module=self.module,
                        accumulate=accumulate,
                        loss_scale=scale,
                        source=g.source,
                        sizes=g.sizes,
                        note=g.note,
                        length=g.length,
                        digest=g.digest(),
                    )
                    declared = loss_reduction(loss_fn, reduction)
                    self.precision.check_around()
                    check_environment(self.env)
                    check_parameters(self.module, self.params)
                    batch = check_batch(cut(), self.needed_slots)
                    words = np.empty(WORDS)
                    facts.words(words)
                    call = SlotCall(
                        loss_fn, declared, start, devices, words, None if scale is None else scaler
                    )
                    last = self.my_slots[-1] if bk is not None else None
                    for i, s in enumerate(self.my_slots):
                        self._slot(s, batch[s], call, armed=s == last)
                        self.payloads[s][self.stop_at] = 1.0 if (asked and i == 0) else 0.0
                except Refusal as e:
                    refused = e
                except Exception as e:  # the user's module, loss or data: flagged all the same
                    refused = Refusal("torch-slot-failed", f"{type(e).__name__}: {str(e)[:300]}")
                    failure = e
                if self.audit is not None:  # before the combine: a mismatch combines nothing
                    # The settings are compared first: a rank that differs by them is named for
                    # that, never as a faulty host (step_agreement.py).
                    agree = (
                        None
                        if facts is None
                        else (np.array(facts.values, float), lambda t: check_table(t, facts))
                    )
                    self.audit.check(
                        self.steps,
                        self.payloads,
                        lambda s, o: self._slot(s, batch[s], call, o),
                        self._audit_buf,
                        refused,
                        words=self.stop_at,
                        agree=agree,
                    )
            if bk is not None:
                red = bk.finish(refused)
            elif refused is None:
                red = self.reducer.run(self.payloads, out=self.reduced)
            else:
                red = self.reducer.executor.execute(None, self.reduced, local=refused)
            # Every check reads combined words only, so every rank gives the same verdict.
            check_combined(red[self.agree_at :], self.slots, facts)
            check_cut(red[self.sizes_at : self.mass_at], length, rule)
            mass = red[self.mass_at]
            if not mass > 0.0:
                raise Refusal(
                    "mass-zero",
                    f"the step's slots declared a total mass of {mass!r} (every item ignored or "
                    "padding?); there is nothing to divide the gradient by; nothing was applied",
                )
            if red[self.inf_at] > 0:  # a GradScaler's scaled gradient overflowed (scaling.py)
                mark_overflow(self.params)
            else:
                np.divide(red[:n], mass, out=self._g)  # normalised once, after the combine
                self.grads.write(self._g, red[self.used_at : self.sizes_at] > 0, accumulate)
            if self.nb:
                np.divide(red[n : n + self.nb], float(self.slots), out=self._b)
                with torch.no_grad():
                    for (_, t), (a, b) in zip(self.float_buffers, self.buffer_offsets):
                        _from64(t, self._b[a - n : b - n])
            loss_mean = float(red[self.loss_at] / mass)
        except Exception as e:
            for p in self.params:
                p.grad = None
            self._restore_buffers(start)
            if failure is not None and getattr(e, "code", None) == "torch-slot-failed":
                raise failure from e  # this rank's own exception, once every rank has refused
            raise
        self.steps += 1
        self.last_loss = loss_mean
        self.stop_agreed = bool(red[self.stop_at] > 0)
        if self.stop_agreed and self.preemption is not None:
            self.preemption.agreed = True
        return loss_mean

    def digest(self) -> str:
        """parameter_digest(module): sha256 of the parameters as binary64."""
        return parameter_digest(self.module)

    def free(self) -> None:
        """Free the combine's requests and give its tags back (local)."""
        if self.reducer is not None:
            self.reducer.free()
        if self.buckets is not None:
            self.buckets.free()
