"""What a DataParallel trains and carries in checkpoints: `ModuleState`.

Apart from the step because it is the state that outlives a step: the module and its checked
parts (alpha_mpi.torch.module_check), the slots' seed, the count of combined steps and the
objects registered with the DataParallel (an LR scheduler, a sampler, a loss scaler ...). The
step reads and advances it; the checkpoint view (alpha_mpi.torch.checkpointing) reads and
installs it (saving, restoring and digesting it: checkpointing.Checkpoints); the replica
digests compare its tensors.

"""

from __future__ import annotations

from ..refusals import Refusal
from .module_check import ModuleParts

__all__ = ["ModuleState"]


class ModuleState:
    """The module, its checked `parts`, the slots' `seed`, the combined `steps`, the `updates`
    and the `registered` objects (name -> object with state_dict/load_state_dict)."""

    def __init__(self, module, parts: ModuleParts, seed: int) -> None:
        self.module, self.parts, self.seed = module, parts, seed
        self.params, self.dtype = parts.params, parts.dtype
        self.float_buffers, self.other_buffers = parts.float_buffers, parts.other_buffers
        self.n = sum(p.numel() for p in self.params)
        self.steps = 0  # combined calls (batches, the slots' generator seeds)
        self.updates = 0  # of them, the updates: every call outside no_sync() (accumulation.py)
        self.registered: dict[str, object] = {}

    def tensors(self) -> list:
        """What every rank holds alike: the parameters, the floating buffers and the integer
        ones (counters): taken from rank 0 at construction, compared by the replica digests."""
        return [p.data for p in self.params] + [b for _, b in self.float_buffers + self.other_buffers]

    def register(self, name: str, obj) -> None:
        """Carry `obj.state_dict()` in every checkpoint under `name` (DataParallel.register)."""
        if not isinstance(name, str) or not name:
            raise Refusal("usage", f"register() needs a non-empty name, got {name!r}")
        if not (
            callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
        ):
            raise Refusal(
                "usage", f"register({name!r}, ...) needs an object with state_dict() and load_state_dict()"
            )
        self.registered[name] = obj
