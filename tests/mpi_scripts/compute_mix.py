"""Ranks of different BLAS kernels, under any MPI: each rank sets OPENBLAS_CORETYPE from its rank
(CORETYPES="Haswell,Sandybridge": rank r takes entry r mod 2) BEFORE numpy is imported, reading the
rank from the launcher's environment (MPICH: PMI_RANK; Open MPI: OMPI_COMM_WORLD_RANK), since no MPMD
flag is the same in both. Prints one line per rank and case: `rank R CASE code=CODE field=... ...`.

    python compute_mix.py start    a BLAS model: compute-mismatch naming blas.kernel, at start
    python compute_mix.py audit    the same with audit_slots=1
    python compute_mix.py promise  a false machine_independent promise, audited: compute-mismatch,
                                   no rank or host blamed
    python compute_mix.py fixed    a machine-independent model trains; prints its digest
"""

import os
import sys

from by_rank import say, set_from_rank

set_from_rank("OPENBLAS_CORETYPE", "CORETYPES", "Haswell,Sandybridge")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import numpy as np  # noqa: E402  (after OPENBLAS_CORETYPE, on purpose)
from compute_models import BlasModel, FixedModel  # noqa: E402
from mpi4py import MPI  # noqa: E402

from alpha_mpi.execution.transport import set_abort_at_exit  # noqa: E402
from alpha_mpi.learning import DataParallelLearner, digest, slice_batch  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402

set_abort_at_exit(False)  # the cases refuse on purpose; the script reports and exits 0


world = MPI.COMM_WORLD
size = world.Get_size()
rng = np.random.default_rng(9)
X, Y = rng.standard_normal((80, 6)), rng.integers(0, 3, 80)


def train(lr, steps):
    for _ in range(steps):
        lr.train_step({s: slice_batch(X, Y, lr.slots, [s])[s] for s in lr.needed_slots})


def report(case, build):
    try:
        lr = build()
        train(lr, 3)
        say(case, f"code=none digest={digest(lr.final_params())}")
    except Refusal as e:
        ctx = e.context
        say(
            case,
            f"code={e.code} field={ctx.get('field')} ranks={list(ctx.get('ranks', []))} "
            f"promise={ctx.get('promise')} hosts={'hosts' in ctx} kernel={os.environ['OPENBLAS_CORETYPE']} "
            f"message={e.message}",
        )


case = sys.argv[1]
if case in ("start", "audit"):
    report(
        case,
        lambda: DataParallelLearner(world, BlasModel(6, 3), slots=size, audit_slots=int(case == "audit")),
    )
elif case == "promise":
    report(
        case,
        lambda: DataParallelLearner(
            world, BlasModel(6, 3), slots=size, machine_independent=True, audit_slots=1
        ),
    )
elif case == "fixed":
    report(case, lambda: DataParallelLearner(world, FixedModel(6, 3), slots=size))
else:
    raise SystemExit(f"unknown case {case!r}")
