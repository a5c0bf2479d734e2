"""`ModuleModel`: a torch module as an `alpha_mpi.learning.Model` (binary64, the C optimizers).

Lives in alpha_mpi.torch with torch's environment code (alpha_mpi.torch._env); the learning
layer reaches it in one place only, `alpha_mpi.learning.model_from_spec` wrapping a factory's
`nn.Module` when a learner is built (a deferred import): alpha_mpi.torch builds on
alpha_mpi.learning, and no learning module imports alpha_mpi.torch when it is imported or in a
step.

    learner = DataParallelLearner(comm, ModuleModel(net), slots=8, optimizer="adam", partition="grads")

The module is converted to float64 (`module.double()`), so its parameters are exactly the
learner's binary64 vector and no conversion site is needed: the learner's contract (KeepFormat,
the combine order, normalise-once, adam-v1 / sgd-momentum-v1) describes the whole update, every
partition mode (optimizer state, gradients, parameters sharded) applies, and checkpoints are the
CLI's. This is what `alpha-mpi train --model module:factory` uses when the factory returns an
`nn.Module`. The loss is summed cross-entropy over the slot's samples unless `loss_fn` is given
(a callable (logits, target) -> the slot's loss SUM).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..refusals import Refusal
from ._env import check_environment, fix_environment, require_torch

__all__ = ["ModuleModel", "summed_cross_entropy"]

if TYPE_CHECKING:
    import torch
else:
    torch = require_torch()


def summed_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Σ_i cross-entropy of sample i (reduction='sum')."""
    return torch.nn.functional.cross_entropy(logits, target, reduction="sum")


summed_cross_entropy.reduction = "sum"  # type: ignore[attr-defined]  # declared: DataParallel reads it


class ModuleModel:
    """A float64 view of `module` satisfying `alpha_mpi.learning.Model`.

    `init(seed)`: with torch's RNG forked and seeded by `seed`, every submodule's
    `reset_parameters()` runs, and the parameters are returned as one vector (the same on every
    rank). `loss_and_grad_sum(params, X, y, grad_out)`: the params are copied into the module, one
    forward (X as float64, or as int64 where X holds integers: token ids for `nn.Embedding`; y as
    int64) and one backward of the summed loss, the gradients written
    into grad_out. `predict(params, X)`: argmax of the logits. Modules with buffers (BatchNorm
    running statistics) are refused by name (`torch-buffers-refused`): the protocol carries
    parameters only; use `alpha_mpi.torch.DataParallel(buffers="slot-mean")` for them.
    """

    #: Its slots compute with torch: the learner's compute identity then holds torch's fields
    #: (alpha_mpi.learning.compute_check.uses_torch reads this, never importing alpha_mpi.torch).
    uses_torch = True

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        threads: int = 1,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise Refusal(
                "model-protocol", f"ModuleModel needs a torch.nn.Module, got {type(module).__name__}"
            )
        bufs = [k for k, _ in module.named_buffers()]
        if bufs:
            raise Refusal(
                "torch-buffers-refused",
                f"{type(module).__name__} has buffers {bufs[:6]}; the Model protocol carries parameters only",
                buffers=bufs,
            )
        self.module = module.double()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        if not self.params:
            raise Refusal("torch-module-unsupported", f"{type(module).__name__} has no trainable parameters")
        off_cpu = [i for i, p in enumerate(self.params) if p.device.type != "cpu"]
        if off_cpu:
            raise Refusal("torch-module-unsupported", f"parameters {off_cpu[:4]} are not on the CPU")
        self.offsets, off = [], 0
        for p in self.params:
            self.offsets.append((off, off + p.numel()))
            off += p.numel()
        self.n_params = off
        self.loss_fn = summed_cross_entropy if loss_fn is None else loss_fn
        self.env = fix_environment(threads)

    @staticmethod
    def _inputs(X: np.ndarray) -> torch.Tensor:
        """X as the module takes it: integers stay integers (int64, what nn.Embedding indexes
        with), anything else binary64 like the parameters."""
        X = np.asarray(X)
        kind = np.int64 if X.dtype.kind in "iu" else np.float64
        return torch.from_numpy(np.ascontiguousarray(X, dtype=kind))

    def _load(self, params: np.ndarray) -> None:
        with torch.no_grad():
            for p, (a, b) in zip(self.params, self.offsets):
                p.copy_(torch.from_numpy(params[a:b]).view(p.shape))

    def init(self, seed: int) -> np.ndarray:
        """Seeded initial parameters (reset_parameters of every submodule) as a float64 vector."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            with torch.no_grad():
                for m in self.module.modules():
                    reset = getattr(m, "reset_parameters", None)
                    if callable(reset):
                        reset()
        out = np.empty(self.n_params)
        for p, (a, b) in zip(self.params, self.offsets):
            out[a:b] = p.detach().numpy().reshape(-1)
        return out

    def loss_and_grad_sum(
        self,
        params: np.ndarray,
        X: np.ndarray,
        y: np.ndarray,
        grad_out: np.ndarray,
        rng: np.random.Generator | None = None,
    ) -> float:
        """Write Σ_i ∇loss_i of the slot into grad_out; return Σ_i loss_i (one forward, one
        backward). With `rng` (the slot's generator, which the learner passes), the forward and
        backward run under torch's generator forked and seeded from one draw of it, so dropout
        gives the same bits on whichever rank runs the slot."""
        check_environment(self.env)
        self._load(params)
        for p in self.params:
            p.grad = None
        Xt = self._inputs(X)
        yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
        with torch.random.fork_rng(devices=[]):
            if rng is not None:
                torch.manual_seed(int(rng.integers(0, 2**63)))
            loss = self.loss_fn(self.module(Xt), yt)
            loss.backward()
        for p, (a, b) in zip(self.params, self.offsets):
            if p.grad is None:
                grad_out[a:b] = 0.0
            else:
                grad_out[a:b] = p.grad.detach().numpy().reshape(-1)
        return float(loss.detach())

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Labels: argmax of the module's logits."""
        self._load(params)
        with torch.no_grad():
            return self.module(self._inputs(X)).argmax(dim=1).numpy()
