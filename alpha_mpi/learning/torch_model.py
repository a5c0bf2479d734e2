"""`ModuleModel`: a torch module as an `alpha_mpi.learning.Model` (binary64, the C optimizers),
and the torch settings a slot's bits depend on (threads, deterministic algorithms).

Lives in the learning layer and imports only the third-party `torch`, so that
`alpha_mpi.learning.model_from_spec` can wrap a module without importing `alpha_mpi.torch`
(which builds on alpha_mpi.learning); `alpha_mpi.torch` re-exports it.

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
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ..refusals import Refusal

__all__ = [
    "ModuleModel",
    "summed_cross_entropy",
    "require_torch",
    "fix_environment",
    "environment",
    "check_environment",
]


def require_torch() -> ModuleType:
    """The `torch` module, or a `torch-unavailable` refusal naming the extra to install."""
    try:
        import torch
    except ImportError as e:
        raise Refusal(
            "torch-unavailable", f"alpha_mpi.torch needs PyTorch, which does not import here: {e}"
        ) from None
    return torch


def fix_environment(threads: int) -> dict:
    """Set torch's intra-op threads to `threads` and deterministic algorithms on; return the
    settings, as the contract records them. A slot's forward and backward then compute the same
    bits on whichever rank runs them (same shapes, same threads, same kernels)."""
    torch = require_torch()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise Refusal("usage", f"threads must be an int >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    return environment()


def environment() -> dict:
    """torch's live settings that a slot's bits depend on."""
    torch = require_torch()
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
    }


def check_environment(expected: dict) -> None:
    """Refuse (`torch-environment-changed`) when the live settings differ from `expected`."""
    live = environment()
    diff = [f"{k}: contract {expected[k]!r}, now {live[k]!r}" for k in expected if live.get(k) != expected[k]]
    if diff:
        raise Refusal(
            "torch-environment-changed",
            "torch settings changed since DataParallel fixed them: " + "; ".join(diff),
        )


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
    forward (X as float64, y as int64) and one backward of the summed loss, the gradients written
    into grad_out. `predict(params, X)`: argmax of the logits. Modules with buffers (BatchNorm
    running statistics) are refused by name (`torch-buffers-refused`): the protocol carries
    parameters only; use `alpha_mpi.torch.DataParallel(buffers="slot-mean")` for them.
    """

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
        Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))
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
            return (
                self.module(torch.from_numpy(np.ascontiguousarray(X, dtype=np.float64))).argmax(dim=1).numpy()
            )
