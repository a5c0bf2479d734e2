"""`alpha-mpi bench allreduce`: declared-order allreduce against MPI_Allreduce, OSU/IMB style.

    mpiexec -n 2 python -m alpha_mpi.tools.bench allreduce [--sizes 8,1K,1M,64M] [--iters 100]
        [--warmup 3] [--realizations auto,butterfly,halving,...] [--topology pairwise|star|hierarchy:K]
        [--json out.json] [--plot out.png]

For each size, in one run and interleaved iteration by iteration (so that drift and other load
on a shared machine hit every variant alike): MPI_Allreduce (the reference; baseline.py), torch
gloo all_reduce where torch is importable, and alpha_mpi's realizations of one declared tree
(`auto` shows which one it chose; a realization that cannot realize the tree on this many ranks
is skipped with a note). Every iteration is preceded by a Barrier; the timed region is
the combine call alone. Per rank the statistic (mean by default, --stat median on a noisy
machine) of the iterations is taken; t_min / t_avg / t_max are the minimum / mean / maximum of
that over ranks, algbw = bytes / t_max, busbw = algbw * 2(p-1)/p, ratio = t_max / t_max of
MPI_Allreduce (< 1: faster).

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

import argparse
import json
import os
import platform
import socket
import sys
import time

import numpy as np
from mpi4py import MPI as _MPI

LARGE = 1 << 20  # sizes above this run fewer iterations (iters * LARGE / size, at least --min-iters)
_SUFFIX = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}
DEFAULT_SIZES = [8 << i for i in range(24)]  # 8 B .. 64 MiB
SEED = 20240613


def parse_size(text: str) -> int:
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


def human(nbytes: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f}{unit}"
    return str(nbytes)


class _Parser(argparse.ArgumentParser):
    """argparse that prints on rank 0 only and exits with the same status on every rank."""

    def __init__(self, rank, **kw):
        self._rank = rank
        super().__init__(**kw)

    def _print_message(self, message, file=None):
        if self._rank == 0:
            super()._print_message(message, file)


def make_parser(rank: int) -> argparse.ArgumentParser:
    p = _Parser(
        rank,
        prog="alpha-mpi bench allreduce",
        description="Declared-order allreduce (every realization, auto) vs MPI_Allreduce, bits checked every iteration.",
        epilog="Run under mpiexec -n P. benchmarks/sweep_allreduce.sh runs it once per MPICH algorithm and rank count.",
    )
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=DEFAULT_SIZES,
        help="bytes, comma separated (8,1K,1M,64M) or A:B for powers of two (default 8:64M)",
    )
    p.add_argument("--iters", type=int, default=100, help="timed iterations up to 1 MiB (default 100)")
    p.add_argument(
        "--min-iters", type=int, default=10, help="timed iterations at least, for big sizes (default 10)"
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations per size (default 3)")
    p.add_argument(
        "--realizations",
        default="auto,butterfly,halving,replicate,tree,scatter",
        help="alpha_mpi realizations to run (default: auto and every one that applies)",
    )
    p.add_argument(
        "--topology", default="pairwise", help="pairwise | star | star:HUB | hierarchy:K (default pairwise)"
    )
    p.add_argument("--slots-per-rank", type=int, default=1, help="leaves per rank (default 1)")
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="α, β, γ for auto's cost model (default ALPHA_MPI_CALIBRATION or built-in; see bench calibrate)",
    )
    p.add_argument(
        "--segment", type=int, default=None, help="scatter segment length in elements (default: built-in)"
    )
    p.add_argument(
        "--stat", choices=("mean", "median", "min"), default="mean", help="per-rank statistic (default mean)"
    )
    p.add_argument(
        "--oracle", type=int, default=4096, help="coordinates checked against the oracle (default 4096)"
    )
    p.add_argument(
        "--model-size",
        type=parse_size,
        default=64 << 20,
        help="size of the memory-bandwidth model line (default 64M)",
    )
    p.add_argument("--no-gloo", action="store_true", help="skip torch gloo even where torch is importable")
    p.add_argument(
        "--functional",
        action="store_true",
        help="also time the convenience call allreduce(comm, tree, ...) (cached executor, no re-planning)",
    )
    p.add_argument(
        "--spin",
        action="store_true",
        help="ALPHA_MPI_SPIN=1: alpha_mpi's waits never sleep (dedicated cores only; wrong when oversubscribed)",
    )
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.add_argument(
        "--plot",
        metavar="PATH.png",
        help="plot t_max against size (needs matplotlib: pip install alpha_mpi[plot])",
    )
    return p


# ----------------------------------------------------------------------------------------------
def machine_info(comm) -> dict:
    from mpi4py import MPI

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    lib = MPI.Get_library_version().strip().splitlines()
    mpi = " ".join(lib[0].split())
    device = next((" ".join(line.split()) for line in lib if "Device" in line), "")
    cores = os.cpu_count() or 1
    p = comm.Get_size()
    import mpi4py

    return {
        "hostname": socket.gethostname(),
        "cpu": cpu,
        "cores": cores,
        "mpi": mpi + (f" ({device})" if device else ""),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "p": p,
        "oversubscribed": p > cores,
    }


def order_sensitive(rng, n):
    mant = 1.0 + rng.random(n)
    exps = rng.integers(-60, 61, n).astype(np.float64)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return sign * mant * np.exp2(exps)


def slot_values(slot: int, n: int, head: int) -> np.ndarray:
    """Deterministic order-sensitive values: the first `head` coordinates from their own stream,
    so that the oracle needs only those of every slot."""
    h = min(n, head)
    out = np.empty(n)
    out[:h] = order_sensitive(np.random.default_rng([SEED, slot, 0]), h)
    if n > h:
        out[h:] = order_sensitive(np.random.default_rng([SEED, slot, 1]), n - h)
    return out


class _Alpha:
    def __init__(self, comm, tree, n, realization, args, mine):
        from ...execution import Allreducer

        self.a = Allreducer(
            comm, tree, n, realization=realization, segment=args.segment, calibration=args.cal
        )
        self.requested = realization
        self.name = f"auto({self.a.realization})" if realization == "auto" else realization
        self.out = np.empty(n)
        self.mine = mine
        self.times = []
        self.ok = True
        self.ref = None

    def run(self):
        return self.a.run(self.mine, out=self.out)

    def refill(self):
        pass

    def check(self):
        if self.ref is not None and not np.array_equal(self.out.view(np.uint64), self.ref):
            self.ok = False

    def close(self):
        self.a.free()


class _Functional(_Alpha):
    """The convenience call `allreduce(comm, tree, contributions, out=)`: cached executor, no
    re-planning; its per-call cost against the persistent Allreducer is what this row shows."""

    def __init__(self, comm, tree, n, args, mine):
        super().__init__(comm, tree, n, "auto", args, mine)
        self.a.free()
        from ...execution import allreduce

        self.name = self.requested = "allreduce()"
        self._call = lambda: allreduce(comm, tree, self.mine, out=self.out)
        self._call()  # builds and caches the executor outside the timed region
        self.a = _cache_entry(comm, tree, n)

    def run(self):
        return self._call()

    def close(self):
        pass  # the cached executor stays for the next size of the same tree


def _cache_entry(comm, tree, n):
    import importlib

    mod = importlib.import_module("alpha_mpi.execution.allreduce")
    return next(
        a for k, a in mod._CACHE.items() if k[1] == tree._placed and k[2] == ("n", n) and k[5] == "allreduce"
    )


class _Base:
    def __init__(self, impl):
        self.impl = impl
        self.name = impl.name
        self.times = []
        self.ok = True
        self.run, self.refill = impl.run, impl.refill

    def check(self):
        pass

    def close(self):
        self.impl.close()


def _stat(times, how):
    if not times:
        return float("nan")
    if how == "median":
        return float(np.median(times))
    if how == "min":
        return float(min(times))
    return float(np.mean(times))


def bandwidth_model(comm, n: int, reps: int, how: str) -> dict:
    """copy + add + copy for this rank's share, timed on all ranks at once (max over ranks)."""
    from ... import kernel

    p = comm.Get_size()
    share = -(-n // p)
    inc = n - n // p if p > 1 else 0
    src, dst = np.random.rand(max(inc, 1)), np.random.rand(max(inc, 1))
    pieces = [np.random.rand(share) for _ in range(max(p, 2))]
    acc = np.random.rand(share)
    src2, dst2 = np.random.rand(max(inc, 1)), np.random.rand(max(inc, 1))
    rows = {"copy_in": [], "add": [], "copy_out": []}
    for rep in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        t1 = time.perf_counter()
        kernel.fold(acc, pieces)
        t2 = time.perf_counter()
        np.copyto(dst2, src2)
        t3 = time.perf_counter()
        if rep:
            rows["copy_in"].append(t1 - t0)
            rows["add"].append(t2 - t1)
            rows["copy_out"].append(t3 - t2)
    keys = sorted(rows)
    mine = np.array([_stat(rows[k], how) for k in keys])
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=_MPI.MAX)  # harness timing: buffers, never pickles
    out = dict(zip(keys, worst.tolist()))
    out["total"] = out["copy_in"] + out["add"] + out["copy_out"]
    out.update({"bytes": 8 * n, "p": p, "share_elements": share, "moved_elements": inc})
    return out


# ----------------------------------------------------------------------------------------------
def cmd(comm, argv) -> int:

    from ... import oracle
    from ...model import build
    from ...planning import plan
    from ...planning.cost import load_calibration
    from ...planning.gather import DEFAULT_SEGMENT
    from ...planning.realize import REALIZATIONS, applicable
    from . import baseline

    rank, p = comm.Get_rank(), comm.Get_size()
    parser = make_parser(rank)
    args = parser.parse_args(argv)
    reals = [r.strip() for r in args.realizations.split(",") if r.strip()]
    bad = [r for r in reals if r not in ("auto",) + REALIZATIONS]
    if bad or not reals:
        parser.error(f"--realizations takes auto, {', '.join(REALIZATIONS)}; got {args.realizations!r}")
    if args.iters < 1 or args.min_iters < 1 or args.warmup < 0 or args.slots_per_rank < 1:
        parser.error("--iters, --min-iters and --slots-per-rank must be >= 1, --warmup >= 0")
    if args.spin:
        os.environ["ALPHA_MPI_SPIN"] = "1"
    out = sys.stdout
    say = (lambda s="": (print(s, file=out), out.flush())) if rank == 0 else (lambda s="": None)

    info = machine_info(comm)
    slots = p * args.slots_per_rank
    try:
        tree = build(args.topology, range(slots), p)
    except Exception as e:
        parser.error(f"--topology: {e}")
    gloo = (not args.no_gloo) and baseline.gloo_available()
    args.cal = load_calibration(args.calibration)
    why = applicable(plan(tree, None, 1, size=p))
    skipped = [r for r in reals if r != "auto" and why[r] is not None]
    reals = [r for r in reals if r == "auto" or why[r] is None]
    config = {
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
    say("# alpha_mpi allreduce benchmark: declared-order binary64 sum vs MPI_Allreduce (OSU/IMB style)")
    say(
        f"# machine: host={info['hostname']} cpu={info['cpu']!r} cores={info['cores']} mpi={info['mpi']!r} p={p}"
        + ("  (OVERSUBSCRIBED: more ranks than cores)" if info["oversubscribed"] else "")
    )
    say(
        f"# MPI_Allreduce algorithm: {config['mpi_allreduce_algorithm']} (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM)   "
        f"topology={args.topology} slots/rank={args.slots_per_rank} calibration={args.cal.source!r} "
        f"segment={config['segment']} stat={args.stat} spin={'on' if config['spin'] else 'off'}"
        f"{'' if gloo else '   gloo: skipped (torch not importable)' if not args.no_gloo else ''}"
    )
    for r in skipped:
        say(f"# skipped {r}: {why[r]}")
    say(
        "# t_* = min/avg/max over ranks of each rank's per-iteration "
        + args.stat
        + "; algbw = bytes/t_max; busbw = algbw*2(p-1)/p; ratio = t_max / t_max(MPI_Allreduce)"
    )
    head = (
        f"#{'bytes':>11s}  {'realization':<15s}{'t_min[us]':>11s}{'t_avg[us]':>11s}{'t_max[us]':>11s}"
        f"{'algbw[GB/s]':>13s}{'busbw[GB/s]':>13s}{'ratio':>8s}  bits"
    )
    say(head)

    nmax = max(args.sizes) // 8
    mine_full = {s: slot_values(s, nmax, args.oracle) for s in range(slots) if tree_owner(tree, s) == rank}
    hm = min(nmax, args.oracle)
    heads = {s: slot_values(s, hm, args.oracle).tolist() for s in range(slots)}
    want_head = np.array(oracle.evaluate(tree, heads)).view(np.uint64)

    results, model = [], None
    all_ok = True
    for size in args.sizes:
        n = size // 8
        mine = {s: v[:n] for s, v in mine_full.items()}
        send = np.zeros(n)
        for v in mine.values():  # MPI_Allreduce sums this rank's slots first, as one contribution
            send += v
        variants = [_Base(baseline.MpiAllreduce(comm, send, np.empty(n)))]
        if gloo:
            variants.append(_Base(baseline.GlooAllreduce(comm, send, np.empty(n))))
        alphas = [_Alpha(comm, tree, n, r, args, mine) for r in reals]
        if args.functional:
            alphas.append(_Functional(comm, tree, n, args, mine))
        variants += alphas
        # Prime: every realization once, compared with each other and the oracle's head.
        ok = True
        for a in alphas:
            a.run()
        ref = alphas[0].out.view(np.uint64).copy()
        for a in alphas:
            a.ref = ref
            ok &= bool(np.array_equal(a.out.view(np.uint64), ref))
        h = min(n, hm)
        ok &= bool(np.array_equal(ref[:h], want_head[:h]))
        variants[0].run()
        mpi_same = bool(np.array_equal(variants[0].impl.recv.view(np.uint64), ref))
        iters = (
            args.iters
            if size <= LARGE
            else min(args.iters, max(args.min_iters, int(args.iters * LARGE / size)))
        )
        for it in range(args.warmup + iters):
            for v in variants:
                v.refill()
                comm.Barrier()
                t0 = time.perf_counter()
                v.run()
                dt = time.perf_counter() - t0
                if it >= args.warmup:
                    v.times.append(dt)
                v.check()
        # Harness bookkeeping with buffer collectives (never pickles): per-rank stats to rank 0,
        # and whether every rank's bits checked out.
        mine = np.array([_stat(v.times, args.stat) for v in variants])
        everyone = np.empty((p, len(variants))) if rank == 0 else None
        comm.Gather(mine, everyone, root=0)
        stats = everyone.tolist() if rank == 0 else None
        verdict = np.array([1.0 if (ok and all(a.ok for a in alphas)) else 0.0])
        worst_ok = np.empty(1)
        comm.Allreduce(verdict, worst_ok, op=_MPI.MIN)
        size_ok = bool(worst_ok[0] == 1.0)
        all_ok &= size_ok
        if size == args.model_size and any(a.a.realization in ("scatter", "halving") for a in alphas):
            model = bandwidth_model(comm, n, max(3, min(iters, 10)), args.stat)
        for v in variants:
            v.close()
        if rank == 0:
            per_variant = list(zip(*stats))
            t_ref = max(per_variant[0])
            for v, ts in zip(variants, per_variant):
                tmin, tavg, tmax = min(ts), sum(ts) / len(ts), max(ts)
                algbw = size / tmax / 1e9
                busbw = algbw * 2 * (p - 1) / p if p > 1 else 0.0
                ratio = tmax / t_ref
                if isinstance(v, _Alpha):
                    bits = "ok" if size_ok else "MISMATCH"
                else:
                    bits = "=tree" if (v.name == "MPI_Allreduce" and mpi_same) else "-"
                say(
                    f"{size:>12d}  {v.name:<15s}{tmin * 1e6:>11.2f}{tavg * 1e6:>11.2f}{tmax * 1e6:>11.2f}"
                    f"{algbw:>13.3f}{busbw:>13.3f}{ratio:>8.2f}  {bits}"
                )
                results.append(
                    {
                        "bytes": size,
                        "realization": v.name,
                        "requested": getattr(v, "requested", v.name),
                        "chosen": v.a.realization if isinstance(v, _Alpha) else None,
                        "t_min_us": tmin * 1e6,
                        "t_avg_us": tavg * 1e6,
                        "t_max_us": tmax * 1e6,
                        "algbw_GBs": algbw,
                        "busbw_GBs": busbw,
                        "ratio": ratio,
                        "iters": iters,
                        "bits_ok": size_ok if isinstance(v, _Alpha) else None,
                        "bits_equal_declared": mpi_same if v.name == "MPI_Allreduce" else None,
                    }
                )
    if model is not None and rank == 0:
        sc = [
            r for r in results if r["bytes"] == args.model_size and r.get("chosen") in ("scatter", "halving")
        ]
        best = min(sc, key=lambda r: r["t_max_us"]) if sc else None
        model["bandwidth_t_max_us"] = best["t_max_us"] if best else None
        model["bandwidth_realization"] = best["chosen"] if best else None
        model["ratio"] = (best["t_max_us"] / (model["total"] * 1e6)) if best else None
        say(
            f"# memory-bandwidth model at {human(args.model_size)}B p={p}: copy {model['copy_in'] * 1e6:.0f} us + "
            f"add {model['add'] * 1e6:.0f} us + copy {model['copy_out'] * 1e6:.0f} us = {model['total'] * 1e6:.0f} us "
            f"(np.copyto of {model['moved_elements']} + kernel add of {p} x {model['share_elements']} + np.copyto of "
            f"{model['moved_elements']} elements, all ranks at once); {best['realization']} {best['t_max_us']:.0f} us = "
            f"{model['ratio']:.2f} x model"
            if best
            else ""
        )
    if not all_ok:
        say("# BITS MISMATCH: an alpha_mpi realization disagreed with another or with the oracle")
    if rank == 0:
        doc = {
            "benchmark": "allreduce",
            "machine": info,
            "config": config,
            "results": results,
            "model": model,
            "bits_ok": all_ok,
        }
        if args.json:
            d = os.path.dirname(os.path.abspath(args.json))
            os.makedirs(d, exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
        if args.plot:
            _plot(doc, args.plot, say)
    return 0 if all_ok else 1


def tree_owner(tree, slot):
    from ...model.tree import leaf_sequence

    cache = tree_owner.__dict__.setdefault("_cache", {})
    m = cache.get(id(tree))
    if m is None:
        m = cache[id(tree)] = {leaf.slot: leaf.owner for leaf in leaf_sequence(tree)}
    return m[slot]


def _plot(doc, path, say):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say(f"# plot skipped: matplotlib is not installed (pip install 'alpha_mpi[plot]'); wanted {path}")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = []
    for r in doc["results"]:
        if r["requested"] not in names:
            names.append(r["requested"])
    for name in names:
        rows = [r for r in doc["results"] if r["requested"] == name]
        ax.plot([r["bytes"] for r in rows], [r["t_max_us"] for r in rows], marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes")
    ax.set_ylabel("t_max [us]")
    m = doc["machine"]
    ax.set_title(f"allreduce, p={m['p']}, MPI_Allreduce: {doc['config']['mpi_allreduce_algorithm']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    say(f"# plot written to {path}")
