"""What a DataParallel promises and how runs are compared: `torch_contract`, `torch_compute`,
`parameter_digest`.

Apart from data_parallel.py because these are data, not the step: the NumericalContract a
DataParallel names in every frame and checkpoint (its operations spelled out as text, and the
compute identity its slots depend on), and the digest two runs' parameters are compared by
(the whole state's: `DataParallel.state_digest(optimizer)`, checkpointing.py). None needs a
communicator.

What torch's CPU results depend on (measured, benchmarks/torch_capability.py, docs/same-bits.md):
ATen's CPU capability (default, avx2, avx512) changes the bits of a dropout MLP and a small
transformer trained with AdamW under every setting tried (oneDNN on or off, 1 or 2 threads,
deterministic algorithms, MKL_CBWR=COMPATIBLE), so no switch makes them machine-independent:
the capability is a field of the compute identity, and ranks that differ in it are refused
(`compute-mismatch`) unless the caller promises machine independence.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from ..learning.compute_check import ComputeCheck, compute_spec
from ..learning.rng import SLOT_RNG_RULE
from ..model.compute import ComputeIdentity, MachineIndependent
from ..numerics import BitIdentical, CombineOrder, Formula, NumericalContract, Profile, WidenBinary32
from ._env import require_torch
from .accumulation import NO_SYNC_V2

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = [
    "torch_contract",
    "torch_compute",
    "parameter_digest",
    "dtype_name",
    "ROUND_ONCE_V1",
    "BUFFER_SLOT_MEAN_V1",
]

ROUND_ONCE_V1 = (
    "g32=RoundBinary64@gradient(g) (kernel.round_binary64, nearest-even, binary64->binary32), "
    "once per step per coordinate, into each parameter's .grad; accumulating: "
    "g32=RoundBinary64@gradient(WidenBinary32(g32_held)+g); a parameter no slot used: .grad None"
)
"""The round-once site of float32 models, as the contract names it (an operation: the profile's
conversion sites are contribution sites)."""
BUFFER_SLOT_MEAN_V1 = (
    "every slot's forward starts from the step's buffers; floating buffer b="
    "RoundBinary64@buffer((sum over slots in the combine order of WidenBinary32(b_s))/S); "
    "integer buffer b=b_s (equal for every slot)"
)
"""The `buffers="slot-mean"` rule, as the contract names it."""


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32"."""
    return str(dtype).replace("torch.", "")


def torch_compute(env: dict, machine_independent: bool = False) -> ComputeCheck:
    """The ComputeCheck of a DataParallel on this rank: the compute identity with torch's fields
    (read after `fix_environment` set the threads and deterministic algorithms; `env["device"]`
    where the module is not on the CPU), and what the contract says the slots depend on: the
    identity, or `MachineIndependent("caller")` with the caller's promise."""
    from .. import kernel

    identity = kernel.compute_identity(torch=True, device=env.get("device", "cpu"))
    return ComputeCheck(identity, compute_spec(identity, None, machine_independent))


def torch_contract(
    layout_order_id: str,
    dtype: torch.dtype,
    env: dict,
    buffers: str = "refuse",
    precision: str = "no autocast",
    compute: ComputeIdentity | MachineIndependent | None = None,
) -> NumericalContract:
    """The NumericalContract of a DataParallel: combine order, normalise-once, the conversions.

    profile: binary64 (KeepFormat) for float64 modules; for float32 modules binary64 and binary32
    with `WidenBinary32@contribution`, and the operation `round-binary64-once-v1` naming the
    `RoundBinary64@gradient` site. operations: the combine's order id, `normalize-once`, the
    round-once site (float32), the accumulation rule under no_sync() (`no-sync-accumulation-v2`:
    the micro-steps' sums carried to one division, alpha_mpi.torch.accumulation; v1, unnamed,
    added each call's mean), the buffer rule (slot-mean), and `torch-slot-gradient-v4`: the
    per-slot forward/backward (under the slot's generator, deterministic algorithms) with its
    declared loss and mass and the forward's `precision` (Precision.name: no autocast, or the
    autocast device and format). compute: what the slots' bits depend on
    (`torch_compute(env).spec`): the compute identity, whose torch fields name the version, ATen
    capability, backends, threads and device (a GPU's kernels give other bits, so ranks or
    checkpoints on another device differ in it), or the caller's promise. `env`
    (fix_environment's settings) is read by `torch_compute`; v2 wrote it into the formula, which
    made a promise of machine independence impossible to keep across torch builds.
    """
    f32 = dtype == torch.float32
    profile = (
        Profile(("binary64", "binary32"), conversions=(WidenBinary32("contribution"),)) if f32 else Profile()
    )
    ops = [CombineOrder(layout_order_id), Formula.named("normalize-once")]
    if f32:
        ops.append(Formula("round-binary64-once-v1", ROUND_ONCE_V1))
    ops.append(Formula("no-sync-accumulation-v2", NO_SYNC_V2))
    if buffers == "slot-mean":
        ops.append(Formula("buffers-slot-mean-v1", BUFFER_SLOT_MEAN_V1))
    ops.append(
        Formula(
            "torch-slot-gradient-v4",
            "per slot: (loss, mass) declared: loss=loss_fn(module(X_s),y_s) a sum with mass len(y_s), "
            "or a (sum, mass) pair; g_s=torch.autograd.grad(loss, params); or a ModuleLoss mean m over "
            "mass M: loss=M*WidenBinary32(m), g_s=M*WidenBinary32(torch.autograd.grad(m, params)) in "
            f"binary64; all under torch.random.fork_rng with {SLOT_RNG_RULE}; {precision}; "
            f"use_deterministic_algorithms(True); parameters {dtype_name(dtype)}; "
            "torch's version, threads, CPU capability, backends and device: the contract's compute identity",
        )
    )
    return NumericalContract(profile, tuple(ops), BitIdentical(), compute)


def parameter_digest(module: torch.nn.Module) -> str:
    """sha256 of the module's trainable parameters in order, widened exactly to little-endian
    binary64 (the same form as alpha_mpi.learning.digest): compare runs by this."""
    h = hashlib.sha256()
    for p in module.parameters():
        if p.requires_grad:
            h.update(np.ascontiguousarray(p.detach().cpu().numpy().reshape(-1), dtype="<f8").tobytes())
    return h.hexdigest()
