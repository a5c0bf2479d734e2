"""`alpha-mpi bench torch`: step time of alpha_mpi.torch.DataParallel vs torch DDP (gloo).

Every learner trains the same module (torch_models.py: the digits CNN of examples/torch_cnn.py,
an MLP, or a 5.3M-parameter transformer encoder) from the same initial weights with
torch.optim.Adam (`--optimizer adamw`: AdamW) on the same global batches, in one job,
interleaved in blocks, one intra-op thread per rank for all. A timed step is everything a training step does, data loading
included (a DataLoader over the data set, `--workers` worker processes):

- `DDP (gloo)`: this rank's 1/p of the global batch, one forward and backward with gloo's
  bucketed allreduce overlapping the backward, opt.step();
- `slots=S`: the global batch loaded on every rank, `dp.step` (one forward and backward per
  owned slot, the ordered combine, the rounding into .grad), opt.step();
- `slots=S local`: `SlotSampler` + `dp.step_local`: a rank loads only its slots;
- `slots=S buckets`: as local, with `bucket_mb` (the combine overlaps the last backward);
- `slots=S state`: as `slots=S` with `partition="state"`: the Adam state sharded, its update on
  this rank's shard, the updated parameters assembled by selection (alpha_mpi.torch.sharding);
- `slots=S grads`: as `state` with `partition="grads"`: the combine a reduce-scatter, each rank
  holding its shard of the gradient (alpha_mpi.torch.shard_grads);
- `slots=S params`: as `slots=S` with `partition="params"`: the parameters sharded between
  steps too, each unit (transformer block) gathered by selection for its forward and backward,
  the update on this rank's shard with nothing assembled after it (alpha_mpi.torch.shard_params);
- `DDP (gloo) + ZeroRedundancyOptimizer(Adam)`, beside the state row: DDP's step with torch's
  own sharded optimizer over the same class (its shards broadcast by gloo after the update):
  the ZeRO-1 baseline the state row is measured against (issue 43: state <= 1.10x it, AdamW);
- `torch alone K x N`: plain torch, K = S/p forwards and backwards of N = B/S samples, no
  combine, no optimizer: what a slot count's passes cost by themselves on this model.

The rows of one slot count must end with the same parameters (the bits do not depend on the
data path or the buckets): the digests are compared and a mismatch exits 1. Step time is the
slowest rank's; ratios are of medians against DDP (< 1: alpha_mpi is faster).

DDP's ranks come from the MPI environment: rank 0 picks a free localhost port and sends it to
the others with a buffer broadcast (harness bookkeeping, no data), then
`init_process_group("gloo", tcp://127.0.0.1:PORT)`.
"""

from __future__ import annotations

import contextlib
import socket
import statistics

from ...refusals import Refusal
from .._args import at_least, path
from .baseline import init_gloo
from .harness import RankParser, check_outputs, interleaved_steps
from .results import write_json

PATHS = ("step", "local", "buckets", "state", "grads", "params")
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}  # --optimizer: torch.optim's class names
# The issue-25 targets, printed beside the ratios: (model, slots per rank) -> ratio to DDP.
TARGETS = {("transformer", 1): 1.05, ("transformer", 4): 1.25, ("cnn", 4): 1.3}


def slot_counts(text: str, size: int) -> list[int]:
    """`--slots`: a comma list of counts, each an int or a multiple of the rank count (p, 4p)."""
    out = []
    for word in text.split(","):
        w = word.strip()
        try:
            k = (int(w[:-1] or 1) * size) if w.endswith("p") else int(w)
        except ValueError:
            raise Refusal("usage", f"--slots takes counts like 8 or 4p, comma separated; got {word!r}")
        if k < size:
            raise Refusal("usage", f"--slots {w} = {k} is fewer than the {size} ranks")
        out.append(k)
    return out


def _parser(rank):
    p = RankParser(rank, prog="alpha-mpi bench torch", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("cnn", "mlp", "transformer"), default="cnn")
    p.add_argument("--steps", type=at_least(1), default=40, help="timed steps per learner (default 40)")
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--block", type=at_least(1), default=5, help="steps per interleaved block (default 5)")
    p.add_argument(
        "--slots", default="p,4p", help="slot counts, ints or multiples of the rank count (default p,4p)"
    )
    p.add_argument(
        "--paths",
        default="step,local,buckets,state,grads,params",
        help="alpha_mpi rows: step (global batch), local (SlotSampler + step_local), buckets "
        "(local with bucket_mb), state, grads, params (step with that partition); all but step for "
        "the first slot count only (default all)",
    )
    p.add_argument("--bucket-mb", type=float, default=8.0, help="bucket_mb of the buckets row (default 8)")
    p.add_argument("--batch", type=at_least(1), default=128, help="global batch (default 128)")
    p.add_argument("--workers", type=at_least(0), default=0, help="DataLoader workers (default 0)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--optimizer",
        choices=tuple(OPTIMIZERS),
        default="adam",
        help="every row's torch optimizer (default adam)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the modules run (cuda: GPU rank %% device count, DDP over NCCL; default cpu)",
    )
    p.add_argument("--json", type=path, default=None)
    return p


class _Pairs:
    """The data set: (X[i], y[i]) per index, as a user's map-style Dataset."""

    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.X[i], self.y[i]


def _batches(torch, ds, batches_of, workers):
    """Endless (X, y) batches: epoch e's index lists from `batches_of(e)`, through a DataLoader."""
    epoch = 0
    while True:
        yield from torch.utils.data.DataLoader(ds, batch_sampler=batches_of(epoch), num_workers=workers)
        epoch += 1


def cmd(comm, argv) -> int:
    """Run the benchmark (every rank); rank 0 prints the table, the ratios and the digests."""
    from ...torch import DataParallel, SlotSampler, parameter_digest, require_torch

    torch = require_torch()
    from .torch_models import DATA, LOSSES, MODELS

    rank, size = comm.Get_rank(), comm.Get_size()
    a = _parser(rank).parse_args(argv)
    check_outputs(comm, [("--json", a.json, True)])
    counts = slot_counts(a.slots, size)
    paths = [w.strip() for w in a.paths.split(",")]
    if not set(paths) <= set(PATHS) or not paths:
        raise Refusal("usage", f"--paths takes {', '.join(PATHS)}, comma separated; got {a.paths!r}")
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise Refusal("usage", "--device cuda: torch sees no CUDA device here")
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    X, y = DATA[a.model]()
    ds = _Pairs(X, y)
    make = MODELS[a.model]
    summed, mean = LOSSES[a.model]  # declared sum (or (sum, tokens) pair), DDP's mean
    rows, models, steps, shards = {}, {}, {}, {}

    def fresh():
        torch.manual_seed(0)
        return make().to(device)

    # The global batches of every row: SlotSampler's epochs (one permutation per epoch).
    dist = init_gloo(comm, "nccl" if a.device == "cuda" else "gloo")
    ddp_name = "DDP (nccl)" if a.device == "cuda" else "DDP (gloo)"
    theirs = fresh()
    ddp = torch.nn.parallel.DistributedDataParallel(
        theirs, device_ids=None if a.device == "cpu" else [device]
    )
    cls = getattr(torch.optim, OPTIMIZERS[a.optimizer])
    opt_d = cls(theirs.parameters(), lr=a.lr)
    for i, slots in enumerate(counts):
        for kind in paths if i == 0 else ["step"]:
            name = f"slots={slots}" + ("" if kind == "step" else f" {kind}")
            m = fresh()
            dp = DataParallel(
                m,
                comm,
                slots=slots,
                bucket_mb=a.bucket_mb if kind == "buckets" else None,
                partition=kind if kind in ("state", "grads", "params") else "none",
            )
            opt = dp.optimizer(cls, m.parameters(), lr=a.lr)
            sampler = SlotSampler(ds, dp, batch_size=a.batch, seed=0)
            if kind in ("step", "state", "grads", "params"):
                data = _batches(torch, ds, lambda e, s=sampler: list(s.global_batches(e)), a.workers)
            else:

                def local(e, s=sampler):
                    s.set_epoch(e)
                    return s

                data = _batches(torch, ds, local, a.workers)
            step_fn = dp.step if kind in ("step", "state", "grads", "params") else dp.step_local
            shards[name] = dp
            rows[name] = (data, step_fn, opt)
            models[name], steps[name] = m, 0
        if i == 0:

            def share(e, s=sampler):  # DDP's contiguous 1/p of each global batch
                return [b[rank * len(b) // size : (rank + 1) * len(b) // size] for b in s.global_batches(e)]

            rows[ddp_name] = (_batches(torch, ds, share, a.workers), ddp, opt_d)
            models[ddp_name], steps[ddp_name] = theirs, 0
            if "state" in paths:  # torch's ZeRO-1 on the same model and batches, beside the state row
                from torch.distributed.optim import ZeroRedundancyOptimizer

                zero_name = f"{ddp_name} + ZeroRedundancyOptimizer({cls.__name__})"
                zm = fresh()
                zddp = torch.nn.parallel.DistributedDataParallel(
                    zm, device_ids=None if a.device == "cpu" else [device]
                )
                zopt = ZeroRedundancyOptimizer(zm.parameters(), optimizer_class=cls, lr=a.lr)
                rows[zero_name] = (_batches(torch, ds, share, a.workers), zddp, zopt)
                models[zero_name], steps[zero_name] = zm, 0
    # DDP first in the table: it is the reference every ratio is against.
    order = [ddp_name] + [k for k in rows if k != ddp_name]

    def one(name):
        data, step_fn, opt = rows[name]
        Xb, yb = next(data)
        if isinstance(step_fn, torch.nn.parallel.DistributedDataParallel):
            mean(step_fn(Xb.to(device)), yb.to(device)).backward()
        else:
            step_fn(Xb, yb, summed)
        opt.step()
        opt.zero_grad()
        if a.device == "cuda":
            torch.cuda.synchronize()  # the step's time includes its kernels
        steps[name] += 1

    learners = {name: (lambda name=name: one(name)) for name in order}
    # What the per-slot passes cost alone: S/p forwards and backwards of B/S samples, plain torch,
    # no combine and no optimizer, on this rank's data: the floor under each slot count's row.
    probe = fresh()
    Xp, yp = X[: a.batch // size].to(device), y[: a.batch // size].to(device)
    for slots in counts:
        k, b = slots // size, a.batch // slots

        def passes(k=k, b=b):
            for j in range(k):
                loss = summed(probe(Xp[j * b : (j + 1) * b]), yp[j * b : (j + 1) * b])
                loss = loss[0] if isinstance(loss, tuple) else loss
                torch.autograd.grad(loss, list(probe.parameters()))
            if a.device == "cuda":
                torch.cuda.synchronize()

        name = f"torch alone {k} x {b}"
        if name not in learners:
            learners[name] = passes
            order.append(name)
    times = interleaved_steps(comm, learners, warmup=a.warmup, count=a.steps, block=a.block)
    digests = {}
    for name in [k for k in order if k in models]:  # a params row's are gathered for it (collective)
        with shards[name].full_parameters() if name in shards else contextlib.nullcontext():
            digests[name] = parameter_digest(models[name])
    dist.destroy_process_group()
    mismatch = _bits_check(digests)
    agreeing = _agreement_cost(dp, X[: a.batch], y[: a.batch])
    held = _memory(comm, torch, fresh, X[: a.batch], y[: a.batch], summed, a.lr)
    held += [_zero_memory(rows[k][2]) for k in rows if "ZeroRedundancyOptimizer" in k]
    if rank == 0:
        _report(a, size, torch, models, times, digests, mismatch, order, agreeing)
        for line in held:
            print(line)
    return 1 if mismatch else 0


def _memory(comm, torch, fresh, Xb, yb, summed, lr) -> list[str]:
    """dp.memory() of one AdamW step in each partition mode, rank 0's (alpha_mpi.torch.memory),
    and the sharded optimizer state against the whole (p = 1's) one. Collective."""
    from ...torch import DataParallel
    from ...torch.partition_modes import MODES

    size, mib, held = comm.Get_size(), 2.0**-20, {}
    for mode in MODES:
        m = fresh()
        dp = DataParallel(m, comm, slots=size, partition=mode)
        opt = dp.optimizer(torch.optim.AdamW, m.parameters(), lr=lr)
        dp.step(Xb, yb, summed)
        opt.step()
        held[mode] = dp.memory(opt)
        dp.free()
    lines = []
    for mode, h in held.items():
        kinds = ", ".join(
            f"{k} {v * mib:.2f}" for k, v in h.items() if k not in ("at_rest", "peak", "params_peak")
        )
        lines.append(
            f"# memory partition={mode} (rank 0, MiB): {kinds}; at rest {h['at_rest'] * mib:.2f}, "
            f"step's peak {h['peak'] * mib:.2f} (activations not counted)"
        )
    whole = held["none"]["optimizer_state"]
    if "params" in held:
        lines.append(
            f"# parameters at rest partition=params / none on {size} ranks: "
            f"{held['params']['params'] / held['none']['params']:.3f}"
            + ("  (target <= 0.35 at p = 4)" if size == 4 else "")
            + f"; within a step {held['params']['params_peak'] / held['none']['params']:.3f} (root + largest unit)"
        )
    for mode, h in held.items():
        if mode != "none" and whole:
            lines.append(
                f"# optimizer state partition={mode} / none on {size} ranks: {h['optimizer_state'] / whole:.3f}"
                + ("  (target <= 0.30 at p = 4)" if size == 4 else "")
            )
    for mode in ("grads", "params"):  # what sharding the gradient saves (params combines as grads)
        for kind in ("grads", "accumulators", "peak"):
            if mode in held and held["none"][kind]:
                lines.append(
                    f"# {kind} partition={mode} / none on {size} ranks: {held[mode][kind] / held['none'][kind]:.3f}"
                )
    return lines


def _zero_memory(zopt) -> str:
    """The optimizer state torch's ZeroRedundancyOptimizer holds on this rank (rank 0's printed),
    counted as dp.memory() counts it: the state tensors' bytes."""
    held = {id(v): v for st in zopt.optim.state.values() for v in st.values() if hasattr(v, "element_size")}
    mib = sum(v.numel() * v.element_size() for v in held.values()) * 2.0**-20
    return f"# memory ZeroRedundancyOptimizer (rank 0, MiB): optimizer_state {mib:.2f}"


def _agreement_cost(dp, Xb, yb, repeat: int = 20) -> float:
    """Seconds a step spends on what the ranks must agree on, besides its payload words: this
    rank's facts (training flags, the CRC-32 of a `step` global batch) and the parameter check
    (alpha_mpi.torch.step_agreement, module_check.check_parameters)."""
    import time

    import numpy as np

    from ...torch.module_check import check_parameters
    from ...torch.step_agreement import WORDS, content_digest, step_facts

    words = np.empty(WORDS)
    t0 = time.perf_counter()
    for _ in range(repeat):
        facts = step_facts(
            seed=dp.seed,
            module=dp.module,
            accumulate=False,
            loss_scale=None,
            source="step",
            sizes=None,
            note=None,
            length=len(yb),
            digest=content_digest(Xb, yb),
        )
        facts.words(words)
        check_parameters(dp.module, dp.params)
    return (time.perf_counter() - t0) / repeat


def _bits_check(digests: dict) -> list[str]:
    """Rows of one slot count whose digests differ (they must not: same tree, same data)."""
    by_count: dict[str, set] = {}
    for name, d in digests.items():
        if name.startswith("slots="):
            by_count.setdefault(name.split()[0], set()).add(d)
    return [k for k, ds in by_count.items() if len(ds) > 1]


def _report(a, size, torch, models, times, digests, mismatch, order, agreeing) -> None:
    n = sum(q.numel() for q in models[order[0]].parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med[order[0]]
    print(
        f"# alpha-mpi bench torch on {socket.gethostname()}, {size} ranks, {a.model} ({n} parameters, "
        f"float32), global batch {a.batch}, {OPTIMIZERS[a.optimizer]}, {a.workers} loader workers, "
        f"torch {torch.__version__}, 1 thread per rank, {a.steps} timed steps per row, on {a.device}"
    )
    w = max(24, *(len(k) for k in order))  # the names' column: 24, or the longest row's name
    print(f"{'# row':{w + 4}s}median ms      min ms      max ms   / DDP   target")
    for k in order:
        v = times[k]
        per_rank = int(k.split()[0][6:]) // size if k.startswith("slots=") else 0
        target = TARGETS.get((a.model, per_rank)) if k.startswith("slots=") and " " not in k else None
        print(
            f"  {k:{w}s} {1e3 * med[k]:11.3f} {1e3 * min(v):11.3f} {1e3 * max(v):11.3f}"
            f" {med[k] / ref:7.3f}   {'<= %.2f' % target if target else ''}"
        )
    first = next((k for k in order if k.startswith("slots=")), None)
    for kind, target in (
        ("local", "  (target <= 1.02)"),
        ("buckets", ""),
        ("state", "  (target <= 1.05)"),
        ("grads", "  (target <= 1.10)"),
        ("params", "  (target <= 1.30 at p = 2)"),
    ):
        k = f"{first} {kind}" if first else None
        if k in med:
            print(f"# {k} / {first}: {med[k] / med[first]:.3f}{target}")
    zero = next((k for k in order if "ZeroRedundancyOptimizer" in k), None)
    if zero and f"{first} state" in med:
        target = "target <= 1.10" if a.optimizer == "adamw" else "the target, <= 1.10, is --optimizer adamw's"
        print(f"# {first} state / {zero}: {med[f'{first} state'] / med[zero]:.3f}  ({target})")
    print("# (torch alone K x N: K forwards and backwards of N samples each, no combine, no optimizer)")
    from ...torch.step_agreement import WORDS

    if first:
        print(
            f"# agreement (what the ranks must share, alpha_mpi.torch.step_agreement): {WORDS} payload words "
            f"per slot, and {1e6 * agreeing:.0f} us of work per step (facts, the global batch's CRC-32, "
            f"the parameter check) = {agreeing / med[first]:.2%} of the {first} step"
        )
    for k in digests:
        print(f"# digest {k} (params) after {len(times[k]) + a.warmup} steps: {digests[k]}")
    print("# (each slot count's rows end with the same bits on every rank count; DDP's depend on it)")
    for k in mismatch:
        print(f"!! BITS MISMATCH: the rows of {k} ended with different parameters")
    if a.json:
        doc = {"ranks": size, "model": a.model, "parameters": n, "median_s": med, "digests": digests}
        write_json(a.json, {**doc, "samples": times})
