"""One rank's mistake in a DataParallel constructor's own checks (issue 36 item 1), over MPI.

Every check a rank makes alone (its arguments, its module, the plan, the contract, the audit's
options) runs before the constructor's first agreement round, and its outcome travels in that
round: the refusing rank raises its own code, every other rank `peer-refused` naming it, at once,
also when the DataParallel is the first alpha_mpi object on the communicator (its endpoint, the
library duplicate, is made in that round) and when a call came first. The next DataParallel on
the same communicator pairs correctly: one step gives the same parameters on every rank.
Before the fix the peers waited in a later round for the refusing rank's next DataParallel and
paired with it (`peer-timeout` there).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import agree  # noqa: E402

MISTAKES = {
    "bucket_mb": ({"bucket_mb": -1}, "usage"),
    "slots": ({"slots": 1}, "placement-invalid"),
    "seed": ({"seed": -3}, "usage"),
    "buffers": ({"buffers": "refuse"}, "torch-buffers-refused"),
    "topology": ({"topology": "no-such-topology"}, "topology-invalid"),
    "unused": ({"unused": "maybe"}, "usage"),
    "audit_slots": ({"audit_slots": 99}, "usage"),
    "autocast": ({"autocast": "int8"}, "usage"),
    "machine_independent": ({"machine_independent": "yes"}, "usage"),
}


def _module():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1)).double()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("channel", ["first object", "after a call"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_one_ranks_constructor_check_is_refused_on_every_rank_in_the_first_round(world, mistake, channel):
    from alpha_mpi import star
    from alpha_mpi.execution import allreduce

    size, rank, odd = world.Get_size(), world.Get_rank(), world.Get_size() - 1
    comm = world.Dup()
    if channel == "after a call":
        allreduce(comm, star(range(size), size), {rank: np.ones(3)}, timeout=30)
    kw, code = MISTAKES[mistake]
    args = {"slots": 2 * size, "buffers": "slot-mean", "timeout": 30, **(kw if rank == odd else {})}
    try:
        DataParallel(_module(), comm, **args)
        e = None
    except Refusal as err:
        e = err
    if rank == odd:
        ok = e is not None and e.code == code
    else:
        ok = e is not None and e.code == "peer-refused" and e.context == {"peer": odd, "peer_code": code}
    agree(world, ok, f"rank {rank}: {e!r}")
    # the next construction pairs: one step, the same parameters on every rank
    dp = DataParallel(_module(), comm, slots=2 * size, buffers="slot-mean", timeout=30)
    g = torch.Generator().manual_seed(1)
    X, y = (
        torch.randn(4 * size, 3, generator=g, dtype=torch.float64),
        torch.randn(4 * size, 1, generator=g, dtype=torch.float64),
    )
    dp.step(X, y, torch.nn.MSELoss(reduction="sum"))
    digests = world.allgather(dp.digest())  # test-side verdict
    agree(world, len(set(digests)) == 1, f"{digests}")
    dp.free()
    comm.Free()
