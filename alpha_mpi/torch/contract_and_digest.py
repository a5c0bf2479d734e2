"""What a DataParallel promises and how runs are compared: `torch_contract`, `parameter_digest`.

Apart from data_parallel.py because these are data, not the step: the NumericalContract a
DataParallel names in every frame and checkpoint (its operations spelled out as text), and the
digest two runs' parameters are compared by. Neither needs a communicator.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

from ..learning.rng import SLOT_RNG_RULE
from ..numerics import BitIdentical, CombineOrder, Formula, NumericalContract, Profile, WidenBinary32
from ._env import require_torch

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()

__all__ = ["torch_contract", "parameter_digest", "dtype_name", "ROUND_ONCE_V1", "BUFFER_SLOT_MEAN_V1"]

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


def torch_contract(
    layout_order_id: str,
    dtype: torch.dtype,
    env: dict,
    buffers: str = "refuse",
    precision: str = "no autocast",
) -> NumericalContract:
    """The NumericalContract of a DataParallel: combine order, normalise-once, the conversions.

    profile: binary64 (KeepFormat) for float64 modules; for float32 modules binary64 and binary32
    with `WidenBinary32@contribution`, and the operation `round-binary64-once-v1` naming the
    `RoundBinary64@gradient` site. operations: the combine's order id, `normalize-once`, the
    round-once site (float32), the buffer rule (slot-mean), and `torch-slot-gradient-v3`: the
    per-slot forward/backward (under the slot's generator) with its declared loss and mass, the
    forward's `precision` (Precision.name: no autocast, or the autocast device and format), the
    torch version, threads and deterministic flag,
    and the device where it is not the CPU (`env["device"]`: a GPU's kernels give other bits, so
    ranks or checkpoints on another kind of device are another contract).
    """
    f32 = dtype == torch.float32
    profile = (
        Profile(("binary64", "binary32"), conversions=(WidenBinary32("contribution"),)) if f32 else Profile()
    )
    ops = [CombineOrder(layout_order_id), Formula.named("normalize-once")]
    if f32:
        ops.append(Formula("round-binary64-once-v1", ROUND_ONCE_V1))
    if buffers == "slot-mean":
        ops.append(Formula("buffers-slot-mean-v1", BUFFER_SLOT_MEAN_V1))
    ops.append(
        Formula(
            "torch-slot-gradient-v3",
            "per slot: (loss, mass) declared: loss=loss_fn(module(X_s),y_s) a sum with mass len(y_s), "
            "or a (sum, mass) pair; g_s=torch.autograd.grad(loss, params); or a ModuleLoss mean m over "
            "mass M: loss=M*WidenBinary32(m), g_s=M*WidenBinary32(torch.autograd.grad(m, params)) in "
            f"binary64; all under torch.random.fork_rng with {SLOT_RNG_RULE}; {precision}; "
            f"torch {env['torch']}; "
            f"set_num_threads({env['threads']}); use_deterministic_algorithms({env['deterministic']}); "
            f"parameters {dtype_name(dtype)}" + (f"; on {env['device']}" if "device" in env else ""),
        )
    )
    return NumericalContract(profile, tuple(ops), BitIdentical())


def parameter_digest(module: torch.nn.Module) -> str:
    """sha256 of the module's trainable parameters in order, widened exactly to little-endian
    binary64 (the same form as alpha_mpi.learning.digest): compare runs by this."""
    h = hashlib.sha256()
    for p in module.parameters():
        if p.requires_grad:
            h.update(np.ascontiguousarray(p.detach().cpu().numpy().reshape(-1), dtype="<f8").tobytes())
    return h.hexdigest()
