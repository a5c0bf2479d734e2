"""`alpha-mpi bench allreduce`: declared-order allreduce against MPI_Allreduce, OSU/IMB style.

    mpiexec -n 2 python -m alpha_mpi.tools.bench allreduce [--sizes 8,1K,1M,64M] [--iters 100]
        [--warmup 3] [--realizations auto,butterfly,halving,...] [--topology pairwise|star|hierarchy:K]
        [--format table|csv|json] [--targets] [--json out.json] [--plot out.png]

For each size, in one run and interleaved iteration by iteration (so that drift and other load
on a shared machine hit every variant alike): MPI_Allreduce (the reference; baseline.py), torch
gloo all_reduce where torch is importable, and alpha_mpi's realizations of one declared tree
(`auto` shows which one it chose; a realization that cannot realize the tree on this many ranks
is skipped with a note). Every iteration is preceded by a Barrier; the timed region is
the combine call alone. Per rank the statistic (mean by default, --stat median on a noisy
machine) of the iterations is taken; t_min / t_avg / t_max are the minimum / mean / maximum of
that over ranks, algbw = bytes / t_max, busbw = algbw * 2(p-1)/p, ratio = t_max / t_max of
MPI_Allreduce (< 1: faster); iters and warmup the timed and untimed iterations at that size.
--format csv prints the rows as CSV and --format json the whole document instead of the table
(notes then go to stderr); --targets adds the project's development targets. The JSON rows
also hold the fastest and the slowest single iteration of any rank (t_iter_min_us,
t_iter_max_us): the spread that --plot shades above its panel of ratios to MPI_Allreduce.

The options are in allreduce_args.py, the variants timed in allreduce_variants.py, the table,
JSON rows and plot in allreduce_report.py; this module holds the measurement loop.

Bits are checked on every iteration, outside the timed region: every alpha_mpi result must equal,
on every rank, the first result of the first realization, which was checked against the other
realizations and against the independent oracle (alpha_mpi.oracle) on the first --oracle
coordinates. A mismatch marks the row and makes the command exit 1.

At --model-size (default 64 MiB) a memory-bandwidth model line is printed: the measured time of
copy + add + copy for this rank's share (np.copyto of the (p-1)/p*n coordinates a rank receives,
the kernel's fused add of the p pieces of its chunk, np.copyto of the (p-1)/p*n coordinates it
gathers), run on all ranks at once, and the ratio of the best bandwidth realization (halving or
scatter) to it.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

from ... import oracle
from ...model import build
from ...planning import plan
from ...planning.cost import load_calibration
from ...planning.realizations.scatter import DEFAULT_SEGMENT
from ...planning.realize import REALIZATIONS, applicable
from ...planning.validate import MAX_NODES
from ...refusals import Refusal
from . import baseline
from .allreduce_args import DEFAULT_REALIZATIONS, DEFAULT_REDUCE_SCATTER, iterations, make_parser
from .allreduce_report import FORMATS, finish_model, plot, preamble, result_row, targets
from .allreduce_variants import (
    AlphaVariant,
    BaselineVariant,
    CheckedVariant,
    FunctionalVariant,
    bandwidth_model,
    owned_slots,
    slot_values,
)
from .floor import Floor
from .harness import check_outputs, machine_info, memory_refusal, statistic, timed
from .results import write_json


def _configure(comm, argv):
    """Parse and check the options; returns (args, tree, realizations to run, config)."""
    rank, p = comm.Get_rank(), comm.Get_size()
    parser = make_parser(rank)
    args = parser.parse_args(argv)
    mode = "reduce-scatter" if args.reduce_scatter else "allreduce"
    if args.realizations is None:
        args.realizations = DEFAULT_REDUCE_SCATTER if args.reduce_scatter else DEFAULT_REALIZATIONS
    reals = [r.strip() for r in args.realizations.split(",") if r.strip()]
    bad = [r for r in reals if r not in ("auto",) + REALIZATIONS]
    if bad or not reals:
        parser.error(f"--realizations takes auto, {', '.join(REALIZATIONS)}; got {args.realizations!r}")
    if args.reduce_scatter and args.functional:
        parser.error("--functional times allreduce(); it does not combine with --reduce-scatter")
    if args.iters < 1 or args.min_iters < 1 or args.warmup < 0 or args.slots_per_rank < 1:
        parser.error("--iters, --min-iters and --slots-per-rank must be >= 1, --warmup >= 0")
    if args.spin:
        os.environ["ALPHA_MPI_SPIN"] = "1"
    # this rank's slots at the largest size, and about six more vectors (outputs, baselines)
    too_big = memory_refusal(max(args.sizes) * (args.slots_per_rank + 6), f"--sizes {max(args.sizes)}")
    if too_big is not None:
        parser.error(too_big.message)
    if p * args.slots_per_rank > MAX_NODES // 2:  # a binary tree of k leaves has 2k - 1 nodes
        parser.error(
            f"--slots-per-rank {args.slots_per_rank} on {p} ranks: more than {MAX_NODES // 2} leaves"
        )
    try:
        tree = build(args.topology, range(p * args.slots_per_rank), p)
    except Refusal as e:
        parser.error(f"--topology {args.topology}: [{e.code}] {e.message}")
    gloo = (not args.no_gloo) and baseline.gloo_available()
    args.cal = load_calibration(args.calibration)
    why = applicable(plan(tree, None, 1, size=p), mode)
    skipped = [r for r in reals if r != "auto" and why[r] is not None]
    reals = [r for r in reals if r == "auto" or why[r] is None]
    config = {
        "mode": mode,
        "topology": args.topology,
        "slots_per_rank": args.slots_per_rank,
        "realizations": reals,
        "skipped": {r: why[r] for r in skipped},
        "calibration": args.cal.to_dict(),
        "segment": args.segment or DEFAULT_SEGMENT,
        "stat": args.stat,
        "iters": args.iters,
        "min_iters": args.min_iters,
        "warmup": args.warmup,
        "mpi_allreduce_algorithm": baseline.mpi_algorithm(),
        "spin": bool(os.environ.get("ALPHA_MPI_SPIN", "") not in ("", "0")),
        "gloo": gloo,
        "timer": "time.perf_counter, Barrier before every iteration",
    }
    return args, tree, reals, config


def _variants(comm, tree, n, reals, args, gloo, mine, mode):
    """The baselines (the reference first, then the second the table compares with: the floor,
    or MPI_Reduce + MPI_Scatter) and alpha_mpi's variants at n elements."""
    send = np.zeros(n)
    for v in mine.values():  # the baselines sum this rank's slots first, as one contribution
        send += v
    if mode == "reduce-scatter":
        block = -(-n // comm.Get_size())
        base = [
            BaselineVariant(baseline.MpiReduceScatterBlock(comm, send, block)),
            BaselineVariant(baseline.MpiReduceThenScatter(comm, send, block)),
        ]
    else:
        base = [
            BaselineVariant(baseline.MpiAllreduce(comm, send, np.empty(n))),
            BaselineVariant(Floor(comm, send, np.empty(n))),
        ]
        if gloo:
            base.append(BaselineVariant(baseline.GlooAllreduce(comm, send, np.empty(n))))
    alphas = [AlphaVariant(comm, tree, n, r, args, mine, mode=mode) for r in reals]
    if args.functional:
        alphas.append(FunctionalVariant(comm, tree, n, args, mine))
    if args.payload_check and mode == "allreduce":
        alphas.append(CheckedVariant(comm, tree, n, args, mine))
    return base, alphas


def _declared(comm, tree, n, args, mine, want_head) -> tuple:
    """The declared tree's whole result (tree realization, untimed) and whether its head equals
    the oracle's: what every variant's bits are compared with."""
    a = AlphaVariant(comm, tree, n, "tree", args, mine)
    a.run()
    a.close()
    full = a.out.view(np.uint64).copy()
    h = min(len(full), len(want_head))
    return full, bool(np.array_equal(full[:h], want_head[:h]))


def _prime(alphas, reference, full, head_ok) -> tuple:
    """Every alpha_mpi variant once, each compared with its part of the declared result `full`
    (checked against the oracle's head); then the reference once. Returns (bits ok, the
    reference's result equal to the declared tree's)."""
    ok = head_ok
    for a in alphas:
        a.run()
        a.ref = full[a.lo : a.hi]
        ok &= bool(np.array_equal(a.out.view(np.uint64), a.ref))
    reference.run()
    got = reference.impl.recv.view(np.uint64)
    lo = getattr(reference.impl, "lo", 0)  # where its result sits in the whole vector
    want = full[lo : lo + got.size]
    return ok, bool(got.size == want.size and np.array_equal(got, want))


def _time(comm, variants, warmup: int, iters: int) -> None:
    """Interleaved iteration by iteration, each call after a Barrier; bits checked untimed. The
    order rotates every iteration, so no variant keeps one place: `auto`, always first after
    the MPI_Allreduce baseline, measured 1.13-1.26x the realization it chose asked for by name,
    though both build the same Program and run the same engine code per call (nothing of the
    choice remains after construction); a fixed place is the one difference left."""
    k = len(variants)
    for it in range(warmup + iters):
        for v in variants[it % k :] + variants[: it % k]:
            v.refill()
            dt, _ = timed(comm, v.run)
            if it >= warmup:
                v.times.append(dt)
            v.check()


def _gather(comm, variants, how: str):
    """On rank 0: per variant (each rank's statistic, (fastest, slowest) single iteration of any
    rank); None elsewhere. Harness bookkeeping with a buffer Gather, never pickles."""
    k = len(variants)
    mine = np.array(
        [statistic(v.times, how) for v in variants]
        + [min(v.times, default=np.nan) for v in variants]
        + [max(v.times, default=np.nan) for v in variants]
    )
    everyone = np.empty((comm.Get_size(), 3 * k)) if comm.Get_rank() == 0 else None
    comm.Gather(mine, everyone, root=0)
    if everyone is None:
        return None
    return [
        (everyone[:, j].tolist(), (float(everyone[:, k + j].min()), float(everyone[:, 2 * k + j].max())))
        for j in range(k)
    ]


def _all_agree(comm, ok: bool) -> bool:
    verdict, worst = np.array([1.0 if ok else 0.0]), np.empty(1)
    comm.Allreduce(verdict, worst, op=MPI.MIN)  # harness bookkeeping through a buffer
    return bool(worst[0] == 1.0)


def cmd(comm, argv) -> int:
    rank, p = comm.Get_rank(), comm.Get_size()
    args, tree, reals, config = _configure(comm, argv)
    check_outputs(comm, [("--json", args.json, True), ("--plot", args.plot, False)])
    out = sys.stdout
    say = (lambda s="": (print(s, file=out), out.flush())) if rank == 0 else (lambda s="": None)
    report = FORMATS[args.format](config["mode"], say)
    info = machine_info(comm)
    report.begin(preamble(info, config, args))

    slots = p * args.slots_per_rank
    nmax = max(args.sizes) // 8
    mine_full = {s: slot_values(s, nmax, args.oracle) for s in owned_slots(tree, rank)}
    hm = min(nmax, args.oracle)
    heads = {s: slot_values(s, hm, args.oracle).tolist() for s in range(slots)}
    want_head = np.array(oracle.evaluate(tree, heads)).view(np.uint64)

    results, model, all_ok = [], None, True
    for size in args.sizes:
        n = size // 8
        mine = {s: v[:n] for s, v in mine_full.items()}
        base, alphas = _variants(comm, tree, n, reals, args, config["gloo"], mine, config["mode"])
        variants = base + alphas
        ok, mpi_same = _prime(alphas, base[0], *_declared(comm, tree, n, args, mine, want_head))
        iters = iterations(size, args)
        _time(comm, variants, args.warmup, iters)
        gathered = _gather(comm, variants, args.stat)
        size_ok = _all_agree(comm, ok and all(a.ok for a in alphas))
        all_ok &= size_ok
        if (
            size == args.model_size
            and config["mode"] == "allreduce"
            and any(a.chosen in ("scatter", "halving") for a in alphas)
        ):
            model = bandwidth_model(comm, n, max(3, min(iters, 10)), args.stat)
        for v in variants:
            v.close()
        if rank == 0:
            t_ref, t_second = max(gathered[0][0]), max(gathered[1][0])
            for v, (ts, spread) in zip(variants, gathered):
                row = result_row(
                    v,
                    size,
                    p,
                    ts,
                    spread,
                    (t_ref, t_second),
                    (iters, args.warmup),
                    size_ok,
                    mpi_same,
                    config["mode"],
                )
                results.append(row)
                report.row(row)
    if model is not None and rank == 0:
        line = finish_model(model, results, p)
        if line:
            report.note(line)
    goals = targets(results) if args.targets and rank == 0 and config["mode"] == "allreduce" else []
    if goals and p != 2:
        report.note(f"# issue 33 set these targets for p = 2; at p = {p} they only indicate")
    for line in goals:
        report.note(line)
    if not all_ok and rank == 0:
        report.note("# BITS MISMATCH: an alpha_mpi realization disagreed with another or with the oracle")
    if rank == 0:
        doc = {"benchmark": config["mode"], "machine": info, "config": config, "results": results}
        doc.update(model=model, bits_ok=all_ok)
        if args.targets:
            doc["targets"] = goals
        if args.json:
            write_json(args.json, doc)
        report.end(doc)
        if args.plot:
            report.note(plot(doc, args.plot))
    return 0 if all_ok else 1
