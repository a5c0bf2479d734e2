"""The options of `alpha-mpi bench allreduce`: sizes in bytes, iteration counts, what to run."""

from __future__ import annotations

import argparse

from .._args import at_least, path
from .harness import RankParser

LARGE = 1 << 20  # sizes above this run fewer iterations (iters * LARGE / size, at least --min-iters)
_SUFFIX = {"": 1, "B": 1}
_SUFFIX.update({s + t: 1 << (10 * i) for i, s in enumerate("KMG", 1) for t in ("", "B", "IB")})
DEFAULT_SIZES = [8 << i for i in range(24)]  # 8 B .. 64 MiB
DEFAULT_REALIZATIONS = "auto,butterfly,halving,replicate,tree,scatter"
DEFAULT_REDUCE_SCATTER = "auto,halving,scatter"  # the realizations with a reduce-scatter form

#: the on/off options: (flag, help)
SWITCHES = (
    ("--no-gloo", "skip torch gloo even where torch is importable"),
    (
        "--functional",
        "also time the convenience call allreduce(comm, tree, ...) (cached executor, no re-planning)",
    ),
    (
        "--payload-check",
        "also time auto with ALPHA_MPI_PAYLOAD_CHECK=1 (the row auto+crc: a CRC32C of every payload, "
        "checked on arrival, and the flag round after each run): what the check costs",
    ),
    (
        "--reduce-scatter",
        "time the reduce-scatter (rank r ends with chunk r) against MPI_Reduce_scatter_block and the "
        "fixed-root MPI_Reduce + MPI_Scatter, instead of the allreduce",
    ),
    (
        "--spin",
        "ALPHA_MPI_SPIN=1: alpha_mpi's waits never sleep (dedicated cores only; wrong when oversubscribed)",
    ),
)


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '2MiB', '1G' -> bytes."""
    t = text.strip().upper()
    i = len(t)
    while i and not t[i - 1].isdigit():
        i -= 1
    num, suf = t[:i], t[i:]
    if not num or suf not in _SUFFIX:
        raise argparse.ArgumentTypeError(f"cannot read size {text!r} (examples: 8, 64K, 1M, 64M)")
    return int(num) * _SUFFIX[suf]


def parse_sizes(text: str) -> list:
    """'8,1K,1M,64M' or 'A:B' (powers of two from A to B) or a mix, in bytes (multiples of 8)."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        if ":" in item:
            lo, hi = (parse_size(x) for x in item.split(":", 1))
            v = lo
            while v <= hi:
                out.append(v)
                v *= 2
        else:
            out.append(parse_size(item))
    for v in out:
        if v < 8 or v % 8:
            raise argparse.ArgumentTypeError(
                f"size {v} B is not a positive multiple of 8 (binary64 coordinates)"
            )
    if not out:
        raise argparse.ArgumentTypeError("no sizes given")
    return out


def iterations(size: int, args) -> int:
    """Timed iterations at `size` bytes: --iters up to LARGE, then fewer, at least --min-iters."""
    if size <= LARGE:
        return args.iters
    return min(args.iters, max(args.min_iters, int(args.iters * LARGE / size)))


def make_parser(rank: int) -> argparse.ArgumentParser:
    p = RankParser(
        rank,
        prog="alpha-mpi bench allreduce",
        description="Declared-order allreduce (every realization, auto) vs MPI_Allreduce, bits checked every iteration.",
        epilog="Run under mpiexec -n P. In a source checkout, benchmarks/sweep_allreduce.sh runs it once per "
        "MPICH algorithm and rank count.",
    )
    add = p.add_argument
    add(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help="bytes, comma separated (8,1K,1M,64M) or A:B for powers of two (default 8:64M)",
    )
    add("--iters", type=at_least(1), default=100, help="timed iterations up to 1 MiB (default 100)")
    add(
        "--min-iters",
        type=at_least(1),
        default=10,
        help="timed iterations at least, for big sizes (default 10)",
    )
    add("--warmup", type=at_least(0), default=3, help="untimed iterations per size (default 3)")
    add(
        "--realizations",
        default=None,
        help=f"alpha_mpi realizations to run (default: auto and every one that applies: {DEFAULT_REALIZATIONS}; "
        f"with --reduce-scatter {DEFAULT_REDUCE_SCATTER})",
    )
    add("--topology", default="pairwise", help="pairwise | star | star:HUB | hierarchy:K (default pairwise)")
    add("--slots-per-rank", type=at_least(1), default=1, help="leaves per rank (default 1)")
    add(
        "--calibration",
        type=path,
        default=None,
        metavar="FILE",
        help="α, β, γ for auto's cost model (default ALPHA_MPI_CALIBRATION or built-in; see bench calibrate)",
    )
    add(
        "--segment",
        type=at_least(1),
        default=None,
        help="scatter segment length in elements (default: built-in)",
    )
    add("--stat", choices=("mean", "median", "min"), default="mean", help="per-rank statistic (default mean)")
    add(
        "--oracle",
        type=at_least(0),
        default=4096,
        help="coordinates checked against the oracle (default 4096)",
    )
    add(
        "--model-size",
        type=parse_size,
        default=64 << 20,
        help="size of the memory-bandwidth model line (default 64M)",
    )
    for flag, text in SWITCHES:
        add(flag, action="store_true", help=text)
    add(
        "--format",
        choices=("table", "csv", "json"),
        default="table",
        help="what stdout carries (rank 0): the '#'-headed table (default), CSV (a header line, then one "
        "line a row; notes go to stderr) or the JSON document --json writes",
    )
    add(
        "--targets",
        action="store_true",
        help="also print the project's development targets (docs/performance.md) and whether this run met "
        "them; they were set for p = 2 on the development machine",
    )
    add("--json", metavar="PATH", type=path, help="write the results as JSON (rank 0)")
    add(
        "--plot",
        type=path,
        metavar="PATH.png",
        help="plot t_max and the ratio to MPI_Allreduce against size, with the spread of single iterations "
        "(needs matplotlib: pip install alpha_mpi[plot])",
    )
    return p
