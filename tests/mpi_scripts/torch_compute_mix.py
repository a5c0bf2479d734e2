"""Ranks of different ATen CPU capabilities (issue 32 item 3), under any MPI: each rank sets
ATEN_CPU_CAPABILITY from its rank (CAPABILITIES="avx2,default": rank r takes entry r mod 2) BEFORE
torch is imported, reading the rank from the launcher's environment (MPICH: PMI_RANK; Open MPI:
OMPI_COMM_WORLD_RANK). Prints one line per rank and case: `rank R CASE code=CODE ...`.

    python torch_compute_mix.py start    a dropout MLP with AdamW: compute-mismatch at construction,
                                         naming torch.capability
    python torch_compute_mix.py promise  machine_independent=True with audit_slots=1: the audit
                                         finds the promise false, blames no rank
"""

import sys

from by_rank import say, set_from_rank

set_from_rank("ATEN_CPU_CAPABILITY", "CAPABILITIES", "avx2,default")

import numpy as np  # noqa: E402
import torch  # noqa: E402  (after ATEN_CPU_CAPABILITY, on purpose)
from mpi4py import MPI  # noqa: E402

from alpha_mpi.execution.transport import set_abort_at_exit  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

set_abort_at_exit(False)  # the cases refuse on purpose; the script reports and exits 0


world = MPI.COMM_WORLD
size = world.Get_size()
# The data from numpy's generator (uniform from its bits): torch.randn's vectorized kernels give
# other bits under another ATen capability, so each rank would hold another batch (batch-mismatch).
rng = np.random.default_rng(1)
X = torch.from_numpy(rng.random((32, 20), dtype=np.float32) * 2 - 1)
Y = torch.from_numpy(rng.integers(0, 4, 32))


def report(case, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 4)
    )
    try:
        dp = DataParallel(model, world, slots=size, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            dp.step(X, Y, torch.nn.CrossEntropyLoss(reduction="sum"))
            opt.step()
            opt.zero_grad()
        say(case, f"code=none digest={dp.state_digest(opt)}")
    except Refusal as e:
        ctx = e.context
        say(
            case,
            f"code={e.code} field={ctx.get('field')} ranks={list(ctx.get('ranks', []))} "
            f"promise={ctx.get('promise')} hosts={'hosts' in ctx} "
            f"capability={torch.backends.cpu.get_cpu_capability()} message={e.message}",
        )


case = sys.argv[1]
if case == "start":
    report(case)
elif case == "promise":
    report(case, machine_independent=True, audit_slots=1)
else:
    raise SystemExit(f"unknown case {case!r}")
