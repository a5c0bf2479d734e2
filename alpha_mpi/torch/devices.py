"""A module on a device (CUDA): what crosses between the device and the host, and the contract's
name for the device.

Apart from data_parallel.py because it is the one place the step touches device memory:

- `to_device((X_s, y_s), device)`: a slot's tensors (and a mapping batch's) go to the module's
  device (other values, such as a list of strings a loss reads, stay as they are).
- `host_gradients(grads, params, host, out64)`: a slot's gradients, laid end to end on the
  device, cross to the host in one copy into the pinned tensor `host`, then widen exactly into
  the payload (WidenBinary32 on the CPU, in the kernel: the conversions and the combine never run
  on the device). A parameter without a gradient contributes zeros there (its `used` word says so).
- `contract_environment(env, device)`: the torch settings the contract names, with the device's name,
  capability and CUDA version where the module is not on the CPU: another GPU's kernels may give
  other bits, so ranks on other devices are another contract and refuse each other at build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._env import require_torch
from .convert import into64

if TYPE_CHECKING:
    import numpy as np
    import torch
else:
    torch = require_torch()

__all__ = ["to_device", "host_gradients", "contract_environment"]


def _moved(v, device):
    if isinstance(v, torch.Tensor):
        return v.to(device, non_blocking=True)
    if isinstance(v, Mapping):
        return {k: _moved(x, device) for k, x in v.items()}
    return v


def to_device(data: tuple, device) -> tuple:
    """(X_s, y_s) with every torch tensor (also the values of a mapping batch) on `device` (no
    copy where it is there already)."""
    if device.type == "cpu":
        return data
    return tuple(_moved(v, device) for v in data)


def host_gradients(grads, params, host, out64: np.ndarray, scale: float = 1.0) -> None:
    """out64 = scale ⊗ WidenBinary32 of the slot's gradients (zeros for a None), through one
    device-to-host copy into the pinned `host` tensor (the scaling in binary64, on the host)."""
    flat = torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
    )
    host.copy_(flat)  # synchronous: the payload is read right after
    into64(out64, host)
    if scale != 1.0:
        out64 *= scale


def contract_environment(settings: dict, device) -> dict:
    """`settings` (fix_environment's), plus `device` (name, capability, CUDA version) for a
    module off the CPU."""
    env = dict(settings)
    if device.type == "cuda":
        i = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(i)
        env["device"] = f"cuda {torch.cuda.get_device_name(i)} sm_{major}{minor} CUDA {torch.version.cuda}"
    return env
