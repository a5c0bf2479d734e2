"""`DataParallel`: a torch module's gradients combined over a declared slot tree.

Protocol of one `step(X, y, loss_fn)` (every rank calls it, with the same global batch):

1. The batch is cut into `slots` contiguous windows (alpha_mpi.learning.slicing); this rank takes
   the slots it owns in the tree (`my_slots`).
2. For each owned slot, separately: `loss = loss_fn(module(X_s), y_s)` (the SUM of the slot's
   per-sample losses), then `torch.autograd.grad(loss, params)` (the slot's own backward into
   fresh tensors; nothing accumulates across slots). Fixed intra-op threads and
   deterministic algorithms (set at construction, checked every step, named in the contract), so
   a slot's gradient has the same bits on whichever rank runs it.
3. The slot's payload: its gradients (float32 widened exactly to binary64 by
   `kernel.widen_binary32`, the `WidenBinary32@contribution` site; float64 copied as is), the
   buffers in `slot-mean` mode, the sample count (mass) and the loss sum.
4. One combine over the slot tree (alpha_mpi.execution.Allreducer; no MPI collective), then
   `g = numerator / mass` once in binary64, then for float32 one `kernel.round_binary64` into each
   parameter's `.grad` (the `RoundBinary64@gradient` site). Every rank holds the same `.grad`.
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
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np

from .. import kernel
from ..execution import Allreducer
from ..model import Layout, ReplicateAll, build, star
from ..planning import plan
from ..refusals import Refusal
from ._env import check_environment, fix_environment, require_torch
from .convert import from64 as _from64
from .convert import into64 as _into64

torch = require_torch()

__all__ = ["DataParallel", "torch_contract", "parameter_digest", "BUFFER_RULES"]

BUFFER_RULES = ("refuse", "slot-mean")

#: The round-once site of float32 models, as the contract names it (an operation: the profile's
#: conversion sites are contribution sites).
ROUND_ONCE_V1 = (
    "g32=RoundBinary64@gradient(g) (kernel.round_binary64, nearest-even, binary64->binary32), "
    "once per step per coordinate, into each parameter's .grad"
)
BUFFER_SLOT_MEAN_V1 = (
    "every slot's forward starts from the step's buffers; floating buffer b="
    "RoundBinary64@buffer((sum over slots in the combine order of WidenBinary32(b_s))/S); "
    "integer buffer b=b_s (equal for every slot)"
)


def _default_topology() -> str:
    """The learners' default topology (DataParallelLearner's), so both follow one default."""
    from ..learning.learner import DataParallelLearner

    return inspect.signature(DataParallelLearner.__init__).parameters["topology"].default


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def torch_contract(order_id: str, dtype, env: dict, buffers: str = "refuse"):
    """The NumericalContract of a DataParallel: combine order, normalise-once, the conversions.

    profile: binary64 (KeepFormat) for float64 modules; for float32 modules binary64 and binary32
    with `WidenBinary32@contribution`, and the operation `round-binary64-once-v1` naming the
    `RoundBinary64@gradient` site. operations: the combine's order id, `normalize-once`, the
    round-once site (float32), the buffer rule (slot-mean), and `torch-slot-gradient-v1`: the
    per-slot forward/backward with the torch version, threads and deterministic flag.
    """
    from ..numerics import BitIdentical, CombineOrder, Formula, NumericalContract, Profile, WidenBinary32

    f32 = dtype == torch.float32
    profile = (
        Profile(("binary64", "binary32"), conversions=(WidenBinary32("contribution"),)) if f32 else Profile()
    )
    ops = [CombineOrder(order_id), Formula.named("normalize-once")]
    if f32:
        ops.append(Formula("round-binary64-once-v1", ROUND_ONCE_V1))
    if buffers == "slot-mean":
        ops.append(Formula("buffers-slot-mean-v1", BUFFER_SLOT_MEAN_V1))
    ops.append(
        Formula(
            "torch-slot-gradient-v1",
            "per slot: loss=loss_fn(module(X_s),y_s) (a sum); g_s=torch.autograd.grad(loss, params); "
            f"torch {env['torch']}; "
            f"set_num_threads({env['threads']}); use_deterministic_algorithms({env['deterministic']}); "
            f"parameters {_dtype_name(dtype)}",
        )
    )
    return NumericalContract(profile, tuple(ops), BitIdentical())


def parameter_digest(module) -> str:
    """sha256 of the module's trainable parameters in order, widened exactly to little-endian
    binary64 (the same form as alpha_mpi.learning.digest): compare runs by this."""
    h = hashlib.sha256()
    for p in module.parameters():
        if p.requires_grad:
            h.update(np.ascontiguousarray(p.detach().cpu().numpy().reshape(-1), dtype="<f8").tobytes())
    return h.hexdigest()


class DataParallel:
    """Data-parallel training of `module` over `comm` with a declared slot tree.

    Arguments:
        module: a torch.nn.Module on the CPU whose trainable parameters are all float32 or all
            float64 (`torch-module-unsupported` otherwise). Construction copies rank 0's
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

    Attributes: `my_slots`, `steps` (combined steps), `contract`, `order_id`, `conversions`
    (the conversion sites: `WidenBinary32@contribution`, `RoundBinary64@gradient` for float32),
    `params` (the trainable parameters in order), `n` (their element count).
    """

    def __init__(
        self,
        module,
        comm,
        *,
        slots: int,
        topology: str | None = None,
        threads: int = 1,
        buffers: str = "refuse",
        timeout=None,
        realization: str = "auto",
    ):
        kernel.fpenv_check()
        if not isinstance(module, torch.nn.Module):
            raise Refusal(
                "torch-module-unsupported",
                f"DataParallel needs a torch.nn.Module, got {type(module).__name__}",
            )
        if buffers not in BUFFER_RULES:
            raise Refusal("usage", f"buffers must be one of {', '.join(BUFFER_RULES)}, got {buffers!r}")
        self.module, self.comm, self.timeout = module, comm, timeout
        self.size, self.rank = comm.Get_size(), comm.Get_rank()
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < self.size:
            raise Refusal(
                "placement-invalid",
                f"{slots!r} slots on {self.size} ranks leaves ranks without a contribution; "
                "use slots >= ranks",
            )
        self.slots = slots
        self.topology = _default_topology() if topology is None else topology
        self.params = [p for p in module.parameters() if p.requires_grad]
        names = {id(p): k for k, p in module.named_parameters()}
        if not self.params:
            raise Refusal("torch-module-unsupported", f"{type(module).__name__} has no trainable parameters")
        dtypes = sorted({_dtype_name(p.dtype) for p in self.params})
        if len(dtypes) != 1 or dtypes[0] not in ("float32", "float64"):
            raise Refusal(
                "torch-module-unsupported",
                f"trainable parameters have dtypes {dtypes}; use one of float32, float64 "
                "(module.float() or module.double())",
            )
        off_cpu = [names.get(id(p), "?") for p in self.params if p.device.type != "cpu"]
        if off_cpu:
            raise Refusal("torch-module-unsupported", f"parameters {off_cpu[:4]} are not on the CPU")
        self.dtype = self.params[0].dtype
        named_buffers = list(module.named_buffers())
        if named_buffers and buffers == "refuse":
            raise Refusal(
                "torch-buffers-refused",
                f"{type(module).__name__} has buffers "
                f"{[k for k, _ in named_buffers][:6]}{' ...' if len(named_buffers) > 6 else ''}; "
                "their per-slot updates have no rank-count-independent meaning unless a rule is chosen",
                buffers=[k for k, _ in named_buffers],
            )
        self.buffer_rule = buffers
        self.float_buffers = [(k, b) for k, b in named_buffers if b.is_floating_point()]
        self.other_buffers = [(k, b) for k, b in named_buffers if not b.is_floating_point()]
        for k, b in named_buffers:
            if b.device.type != "cpu" or not b.is_contiguous():
                raise Refusal("torch-module-unsupported", f"buffer {k} must be a contiguous CPU tensor")
        self.env = fix_environment(threads)
        # Offsets of each parameter and each floating buffer in the flat binary64 payload.
        self.offsets, off = [], 0
        for p in self.params:
            self.offsets.append((off, off + p.numel()))
            off += p.numel()
        n = self.n = off
        self.buffer_offsets, boff = [], n
        for _, b in self.float_buffers:
            self.buffer_offsets.append((boff, boff + b.numel()))
            boff += b.numel()
        self.nb = boff - n
        comps = [("numerator", n)] + ([("buffers", self.nb)] if self.nb else []) + [("mass", 1), ("loss", 1)]
        self.layout = Layout(*comps)
        self.mass_at, self.loss_at = boff, boff + 1
        self.tree = build(self.topology, slots, self.size)
        self.plan = plan(self.tree, ReplicateAll(), self.layout, size=self.size)
        self.my_slots = self.plan.slots_of(self.rank)
        self.order_id = self.plan.order_id
        self.contract = torch_contract(self.order_id, self.dtype, self.env, buffers)
        self.conversions = (
            (("WidenBinary32", "contribution"), ("RoundBinary64", "gradient"))
            if self.dtype == torch.float32
            else (("KeepFormat", "contribution"),)
        )
        self.reducer = Allreducer(
            comm, self.plan, timeout=timeout, contract=self.contract.digest, realization=realization
        )
        self.realization = self.reducer.realization
        self.payloads = {s: np.zeros(self.layout.total) for s in self.my_slots}
        self.reduced = np.empty(self.layout.total)
        self._g = np.empty(n)
        # .grad of every parameter: views of one flat buffer, written once per step.
        self._grad_flat = torch.empty(n, dtype=self.dtype)
        self._grad_views = [
            self._grad_flat[a:b].view(p.shape) for p, (a, b) in zip(self.params, self.offsets)
        ]
        self._zeros = [torch.zeros(p.numel(), dtype=self.dtype) for p in self.params]  # unused parameters
        self._b = np.empty(self.nb)
        self.steps = 0
        self.last_loss = float("nan")
        self._sync_from_rank0()

    # ------------------------------------------------------------------------------------------
    def _state_tensors(self):
        return [p.data for p in self.params] + [b for _, b in self.float_buffers]

    def _sync_from_rank0(self) -> None:
        """Every rank takes rank 0's parameters and floating buffers, bit for bit: a star combine
        over one slot per rank in which ranks != 0 contribute -0.0 (x + -0.0 == x exactly)."""
        if self.size == 1:
            return
        tensors = self._state_tensors()
        total = sum(t.numel() for t in tensors)
        p = plan(star(range(self.size), self.size), ReplicateAll(), total, size=self.size)
        bc = Allreducer(self.comm, p, timeout=self.timeout, contract=self.contract.digest)
        mine = np.full(total, -0.0)
        if self.rank == 0:
            off = 0
            for t in tensors:
                _into64(mine[off : off + t.numel()], t)
                off += t.numel()
        out = bc.run({self.rank: mine}, out=np.empty(total))
        # Kept, not freed: a freed communicator's handle may be reused by the next one, and the
        # executors cache per-communicator facts by handle (execution/combiner.py
        # polls_before_yield), which would then differ between ranks.
        self._bcast = bc
        off = 0
        with torch.no_grad():
            for t in tensors:
                _from64(t, out[off : off + t.numel()])
                off += t.numel()

    def step(self, X, y, loss_fn, *, sizes=None) -> float:
        """Forward and backward for each owned slot of the global batch (X, y), one ordered
        combine, `.grad = Σ g / Σ n` on every parameter of every rank. Returns the global
        batch's mean loss Σ loss / Σ n (the same float on every rank).

        X, y: the same global batch on every rank (tensors or arrays sliceable on axis 0).
        loss_fn(output, target): a scalar tensor, the SUM of the slot's per-sample losses
        (e.g. torch.nn.CrossEntropyLoss(reduction="sum")). `sizes`: slot sizes (default: the
        even cut of alpha_mpi.learning.slot_ranges).
        """
        from ..learning.slicing import slice_batch

        return self.step_slots(slice_batch(X, y, self.slots, self.my_slots, sizes), loss_fn)

    def step_slots(self, batch: dict, loss_fn) -> float:
        """`step` for a batch already cut: {slot: (X_s, y_s)} for exactly `my_slots`."""
        reduction = getattr(loss_fn, "reduction", "sum")
        if reduction != "sum":
            raise Refusal(
                "torch-loss-invalid",
                f"{type(loss_fn).__name__} has reduction={reduction!r}; the slot loss must be a sum",
            )
        missing = [s for s in self.my_slots if s not in batch]
        if missing or len(batch) != len(self.my_slots):
            raise Refusal(
                "contribution-missing", f"batch holds slots {sorted(batch)}, this rank owns {self.my_slots}"
            )
        check_environment(self.env)
        n = self.n
        start = (
            [b.detach().clone() for _, b in self.float_buffers + self.other_buffers]
            if self.buffer_rule == "slot-mean"
            else None
        )
        try:
            for s in self.my_slots:
                Xs, ys = batch[s]
                buf = self.payloads[s]
                if start is not None:
                    with torch.no_grad():
                        for (_, b), b0 in zip(self.float_buffers + self.other_buffers, start):
                            b.copy_(b0)
                loss = loss_fn(self.module(Xs), ys)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
                    raise Refusal(
                        "torch-loss-invalid",
                        f"loss_fn returned {type(loss).__name__} "
                        f"{tuple(getattr(loss, 'shape', ()))}; it must return a scalar tensor with a graph",
                    )
                # The slot's gradient: the backward of its own loss alone (fresh tensors, nothing
                # accumulated), flattened in parameter order and widened in one call.
                grads = torch.autograd.grad(loss, self.params, allow_unused=True)
                flat = torch.cat([g.reshape(-1) if g is not None else z for g, z in zip(grads, self._zeros)])
                _into64(buf[:n], flat)
                for (_, t), (a, b) in zip(self.float_buffers, self.buffer_offsets):
                    _into64(buf[a:b], t)
                buf[self.mass_at] = float(len(ys))
                buf[self.loss_at] = float(loss.detach())  # float32 -> Python float: exact
            red = self.reducer.run(self.payloads, out=self.reduced)
            np.divide(red[:n], red[self.mass_at], out=self._g)  # normalised once, after the combine
            _from64(self._grad_flat, self._g)  # RoundBinary64@gradient for float32, one call
            for p, view in zip(self.params, self._grad_views):
                p.grad = view
            if self.nb:
                np.divide(red[n : n + self.nb], float(self.slots), out=self._b)
                with torch.no_grad():
                    for (_, t), (a, b) in zip(self.float_buffers, self.buffer_offsets):
                        _from64(t, self._b[a - n : b - n])
            loss_mean = float(red[self.loss_at] / red[self.mass_at])
        except Exception:
            for p in self.params:
                p.grad = None
            if start is not None:
                with torch.no_grad():
                    for (_, b), b0 in zip(self.float_buffers + self.other_buffers, start):
                        b.copy_(b0)
            raise
        self.steps += 1
        self.last_loss = loss_mean
        return loss_mean

    def digest(self) -> str:
        """parameter_digest(module): sha256 of the parameters as binary64."""
        return parameter_digest(self.module)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: str, optimizer=None, *, config=None) -> str:
        """Publish the parameters, buffers and `optimizer`'s state at step `steps` under
        `directory` (collective); the CLI's checkpoint format, restorable on any rank count."""
        from ..learning.checkpoints import save

        return save(self._view(optimizer), directory, config=config)

    def restore(
        self,
        directory: str,
        optimizer=None,
        *,
        config=None,
        adopt_contract: bool = False,
        missing_ok: bool = False,
    ):
        """Load a checkpoint saved on any rank count into the module and `optimizer` (built
        over the module's parameters with the saved hyperparameters); sets `steps`. Returns
        the step directory, or None with `missing_ok` when there is none. Collective."""
        from ..learning.checkpoints import restore

        return restore(
            self._view(optimizer),
            directory,
            config=config,
            adopt_contract=adopt_contract,
            missing_ok=missing_ok,
        )

    def _view(self, optimizer):
        from .checkpointing import TorchCheckpointView

        views = self.__dict__.setdefault("_views", {})
        v = views.get(id(optimizer))
        if v is None:
            v = views[id(optimizer)] = TorchCheckpointView(self, optimizer)
        return v

    def free(self) -> None:
        """Free the combine's communicator and requests (collective)."""
        self.reducer.free()
