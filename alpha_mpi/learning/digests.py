"""The digests runs are compared by: the state digest (the whole learner state) and the
parameters digest.

- `state_digest(arrays, scalars)`: sha256 over a domain tag, then each named float64 array
  (name, length, little-endian binary64 bytes) in name order, then the scalars as canonical JSON
  (floats written exactly, by repr). A learner's `state_digest()` passes its whole state: the
  parameters, every optimizer array (Adam's m and v, SGD's momentum), and the scalars a resume
  needs — the step, the optimizer's carried scalars (b1^t, b2^t, its step count), the seed the
  slots' random numbers and the data order are drawn from (with the step, their position). Two
  runs print the same state digest only when a resume from either would continue alike: a run
  whose Adam moments were corrupted does not print the clean run's digest.
  `STATE_COVERS` names what it covers, as `alpha-mpi train` prints it:
  `state digest (params, optimizer, step, rng): <hex>`.
- `digest(params)`: sha256 of the parameters alone as little-endian binary64, what `alpha-mpi
  train` printed as its `state digest:` up to 0.2 (`train()`'s result keeps it as
  `params_digest`; tests and tools that compare final parameters use it).

Both are the same on every rank, rank count and partition mode that computes the same state.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import numpy as np

__all__ = ["digest", "state_digest", "STATE_COVERS"]

STATE_COVERS = "params, optimizer, step, rng"
"""What the state digest covers, as the printed line names it."""
_TAG = b"alpha-mpi/state-digest/v1\0"


def digest(params: np.ndarray) -> str:
    """sha256 of the parameters as little-endian binary64 (the parameters only; see
    `state_digest` for the whole state)."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f8").tobytes()).hexdigest()


def _exact(v):
    if isinstance(v, float):
        return {"float": repr(v)}  # exact, and not JSON's own float formatting
    if isinstance(v, Mapping):
        return {str(k): _exact(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_exact(x) for x in v]
    return v


def state_digest(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, object]) -> str:
    """sha256 (hex) of named float64 arrays (in name order) and JSON scalars: see the module."""
    h = hashlib.sha256(_TAG)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype="<f8").reshape(-1)
        h.update(f"{name}\0{a.size}\0".encode())
        h.update(a.tobytes())
    h.update(json.dumps(_exact(dict(scalars)), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()
