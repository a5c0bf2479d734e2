"""`alpha-mpi bench audit`: step time of audited slots (K = 0, 1, S) and of replica digests every
10 steps, four learners in one job, interleaved in blocks (issue 24's overhead targets).

Every learner is the one `alpha-mpi train` builds (same model, data order and optimizer); only
`audit_slots` / `audit_digests` differ, so the bits of all four are the same (checked at the end:
a difference prints BITS MISMATCH and exits 1). The overhead of each against K = 0 is printed
with its target: K = 1 of S slots <= 1/S + 3 % of the step (p slots recomputed every p steps,
one per rank, two digests per rank, and the digests' differences carried by the step's own
combine, no exchange of their own); K = S is dual execution (about 2x
compute); digests every 10 steps <= 1 %. Needs >= 2 ranks (an auditor is another rank).

The overhead is of the MEAN step time: audit rounds come every m = ceil(p / K) steps, so step
times are bimodal and a median would hide the rounds. Blocks and step counts default to
multiples of 8, so every learner runs whole periods at p = 2, 4 and 8.

`--inject N` runs no timing: N random bit flips against the audit, reporting whom it named
(alpha_mpi/tools/bench/audit_inject.py).
"""

from __future__ import annotations

import functools
import socket
import statistics

from ...learning.slicing import stream_batch
from ...learning.trainer import TrainConfig, build, digest
from .harness import RankParser, interleaved_steps
from .results import write_json


def _batch(learner, stream, data) -> dict:
    return stream_batch(stream, learner.step, learner.needed_slots, data.X, data.y)


def _parser(rank):
    p = RankParser(rank, prog="alpha-mpi bench audit", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=64, help="timed steps per learner (default 64)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--block", type=int, default=8, help="steps per interleaved block (default 8)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=700)
    p.add_argument("--partition", choices=("none", "state", "grads"), default="none")
    p.add_argument("--json", default=None)
    p.add_argument(
        "--inject",
        type=int,
        default=0,
        metavar="N",
        help="instead of timing: N random bit flips against the audit, and whom it names (audit_inject.py)",
    )
    p.add_argument("--inject-seed", type=int, default=0, help="the faults' generator seed (default 0)")
    p.add_argument("--inject-steps", type=int, default=4, help="faults start at steps 0..N-1 (default 4)")
    p.add_argument(
        "--audit-slots", type=int, default=0, help="with --inject: K (default: --slots, every slot)"
    )
    return p


def cmd(comm, argv) -> int:
    """Run the benchmark (every rank); prints on rank 0; returns the exit status."""
    rank, size = comm.Get_rank(), comm.Get_size()
    a = _parser(rank).parse_args(argv)
    if size < 2:
        if rank == 0:
            print("alpha-mpi bench audit: error [usage] needs >= 2 ranks (run under mpiexec -n P, P >= 2)")
        return 2
    if a.inject:
        from .audit_inject import inject

        return inject(comm, a, print)
    variants = {"K=0": (0, 0), "K=1": (1, 0), f"K={a.slots}": (a.slots, 0), "digests/10": (0, 10)}
    learners, data, stream, n_params = {}, None, None, 0
    for name, (k, every) in variants.items():
        cfg = TrainConfig(
            slots=a.slots,
            batch=a.batch,
            hidden=a.hidden,
            partition=a.partition,
            seed=0,
            audit_slots=k,
            audit_digests=every,
        )
        data, model, learners[name], stream = build(comm, cfg)
        n_params = model.n_params
    steps = {k: v.train_step for k, v in learners.items()}
    inputs = {k: functools.partial(_batch, v, stream, data) for k, v in learners.items()}
    times = interleaved_steps(comm, steps, warmup=a.warmup, count=a.steps, block=a.block, inputs=inputs)
    digests = {k: digest(v.final_params()) for k, v in learners.items()}
    same = len(set(digests.values())) == 1
    if rank == 0:
        title = (
            f"# alpha-mpi bench audit on {socket.gethostname()}, {size} ranks, {n_params} parameters, "
            f"{a.slots} slots, batch {a.batch}, partition {a.partition}"
        )
        mean = {k: statistics.fmean(v) for k, v in times.items()}
        print(title)
        print("# learner              mean ms    median ms      min ms      max ms")
        for k, v in times.items():
            print(
                f"  {k:16s} {1e3 * mean[k]:11.3f} {1e3 * statistics.median(v):11.3f} "
                f"{1e3 * min(v):11.3f} {1e3 * max(v):11.3f}"
            )
        base = mean["K=0"]
        targets = {"K=1": 1 / a.slots + 0.03, "digests/10": 0.01}
        print("# variant        overhead vs K=0   target")
        for name in list(variants)[1:]:
            over = mean[name] / base - 1
            t = targets.get(name)
            print(
                f"  {name:14s} {100 * over:14.2f} %   "
                + (f"<= {100 * t:.1f} %" if t is not None else "(dual execution)")
            )
        print("# bits: " + ("identical in all four learners" if same else f"BITS MISMATCH {digests}"))
        if a.json:
            doc = {"ranks": size, "params": n_params, "mean_s": mean, "samples": times, "same_bits": same}
            write_json(a.json, doc)
    return 0 if same else 1
