"""alpha_mpi.torch: data-parallel training of any `torch.nn.Module` with the same bits on every
rank count that places the same slot tree (the optional extra: `pip install 'alpha_mpi[mpich,torch]'`).

    dp = alpha_mpi.torch.DataParallel(module, comm, slots=8)
    opt = torch.optim.Adam(module.parameters(), lr=1e-3)
    for X, y in batches:                       # the same global batch on every rank
        loss = dp.step(X, y, loss_fn)          # loss_fn: a declared SUM, a (sum, mass) pair,
                                               # or ModuleLoss(mass=...) for a module's own mean
        opt.step(); opt.zero_grad()
    dp.save("ckpt", opt)                       # resume on any rank count: dp.restore("ckpt", opt)

- `DataParallel`: per owned slot a separate forward and backward (fixed intra-op threads and
  deterministic algorithms, recorded in the contract); float32 gradients widened exactly to
  binary64 (WidenBinary32), combined over the slot tree, normalised once, rounded once to float32
  (RoundBinary64 at the `gradient` site) into each parameter's `.grad`; float64 gradients combine
  as they are. The user's torch optimizer then runs on identical gradients on every rank.
- `ModuleModel`: a float64 module as an `alpha_mpi.learning.Model`, for `DataParallelLearner`
  with the C Adam/SGD and partitioned optimizer state, gradients or parameters (and for
  `alpha-mpi train --model module:factory`).
"""

from ._env import environment, fix_environment, require_torch  # noqa: F401

require_torch()

from .data_parallel import (  # noqa: E402,F401
    BUFFER_RULES,
    UNUSED_RULES,
    DataParallel,
    parameter_digest,
    torch_contract,
)
from .losses import ModuleLoss, summed  # noqa: E402,F401
from .module_model import ModuleModel, summed_cross_entropy  # noqa: E402,F401
from .same_module import architecture_digest  # noqa: E402,F401
from .sampler import RepeatedEpochWarning, SlotSampler  # noqa: E402,F401
from .scaling import ShardedGradScaler  # noqa: E402,F401
from .step_value import StepValue  # noqa: E402,F401

__all__ = [
    "BUFFER_RULES",
    "UNUSED_RULES",
    "DataParallel",
    "architecture_digest",
    "ModuleLoss",
    "ModuleModel",
    "RepeatedEpochWarning",
    "ShardedGradScaler",
    "SlotSampler",
    "StepValue",
    "environment",
    "fix_environment",
    "parameter_digest",
    "require_torch",
    "summed",
    "summed_cross_entropy",
    "torch_contract",
]
