"""`alpha-mpi bench kernel`: the C kernel alone: fused add vs copy, C Adam vs numpy, dense products vs 1-thread BLAS.

    alpha-mpi bench kernel [--sizes 1e6,1e7] [--ks 2,4,8] [--repeat 5]
                           [--model-shape 32,128,700,10] [--json out.json]

Prints `#`-headed tables, side by side in one run (rank 0 measures; under mpiexec the other
ranks wait, so the figures are one process's):
  1. fused k-input add (the star chain ((x0+x1)+x2)+..., one sweep) in GB/s, counting
     (k+1)*8*n bytes (k reads, one write), next to np.copyto's 2*8*n bytes, and the ratio
     (target >= 0.9: the fused pass runs at memory speed); tree_GB/s is a balanced tree over the
     same k inputs (the general block-stack path);
  2. one Adam step: C single pass (separate next-state buffers), C in place with a check pass
     then a commit pass, and a numpy expression in the same evaluation order; the bits of the
     C single pass and numpy are compared and printed; speedup target >= 3x numpy;
  3. the dense products of the embedded model's forward and backward pass at its shapes
     (`--model-shape` samples per slot, inputs, hidden, classes; default 256 / 8 slots = 32
     samples, 128 -> 700 -> 10): alpha_mpi's fixed-order kernel on this CPU's ISA path against
     np.matmul on one BLAS thread (threadpoolctl), in microseconds, and their throughput ratio
     blas_us / fixed_us (target >= 0.5); `paths` says whether every ISA path this CPU runs gave
     the same bits (it must).

Tables 1 and 2 call no BLAS (element-wise operations); table 3's reference runs with one BLAS
thread, as the kernel runs on one. Timings are best-of-`repeat` wall times (time.perf_counter)
after one warm-up call (table 3: best of at least 200 calls, each a few microseconds), the
variants run in alternation so that drift hits all of them alike. Exit 1 when the C and numpy
Adam bits differ, or two ISA paths give different product bits (as `bench allreduce` exits 1 on
a BITS MISMATCH).
"""

from __future__ import annotations

import argparse
import platform
import time
from functools import partial

import numpy as np

from ... import kernel
from ...refusals import Refusal
from .._args import path
from .harness import RankParser, check_outputs, memory_refusal
from .results import write_json

MAX_KS = 64  # inputs of one fused add


def _counts(text: str, lo: int, what: str) -> list:
    """'1e6,1e7' -> [1000000, 10000000]: integers >= lo, written as integers or exact floats."""
    out = []
    for item in text.split(","):
        try:
            v = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"cannot read {what} {item!r} (examples: 1000, 1e6)")
        if not (v.is_integer() and lo <= v <= 2**40):
            raise argparse.ArgumentTypeError(f"{what} must be whole numbers >= {lo}, got {item!r}")
        out.append(int(v))
    return out


def best(*fns, repeat: int) -> list:
    """Best-of-`repeat` wall time of each function, run in alternation."""
    for fn in fns:
        fn()  # warm-up (page faults, caches)
    t = [float("inf")] * len(fns)
    for _ in range(repeat):
        for j, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            t[j] = min(t[j], time.perf_counter() - t0)
    return t


def balanced_program(slots: list) -> list:
    """The postfix program of a balanced tree over `slots` (the kernel's tree_eval input)."""
    if len(slots) == 1:
        return [slots[0]]
    h = len(slots) // 2
    return balanced_program(slots[:h]) + balanced_program(slots[h:]) + [kernel.OP_ADD]


def bench_add(sizes, ks, repeat, say) -> list:
    say("# fused k-input add (star chain, one sweep) vs np.copyto")
    say("# (tree_GB/s: a balanced tree over the same k inputs, the general block-stack path;")
    say("#  ws_MB: bytes the fused pass touches; at 1e6 the copy's 16 MB may sit in cache)")
    say(
        f"# {'n':>10} {'k':>3} {'ws_MB':>6} {'fused_GB/s':>11} {'copy_GB/s':>10} {'ratio':>6} {'tree_GB/s':>10}"
    )
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        src, dst = rng.standard_normal(n), np.empty(n)
        for k in ks:
            xs = [rng.standard_normal(n) for _ in range(k)]
            out = np.empty(n)
            prog = np.array(balanced_program(list(range(k))), dtype=np.int32)
            t, t_copy, tt = best(
                partial(kernel.fold, out, xs),
                partial(np.copyto, dst, src),
                partial(kernel.tree_eval, out, xs, prog),
                repeat=repeat,
            )
            bw, copy_bw, tbw = (k + 1) * 8 * n / t / 1e9, 2 * 8 * n / t_copy / 1e9, (k + 1) * 8 * n / tt / 1e9
            row = {
                "n": n,
                "k": k,
                "fused_GBs": bw,
                "copy_GBs": copy_bw,
                "ratio": bw / copy_bw,
                "tree_GBs": tbw,
            }
            rows.append(row)
            say(
                f"  {n:>10} {k:>3} {(k + 1) * 8 * n / 1e6:>6.0f} {bw:>11.2f} {copy_bw:>10.2f} "
                f"{bw / copy_bw:>6.2f} {tbw:>10.2f}"
            )
    return rows


def numpy_adam(p, m, v, g, lr, b1, b2, eps, b1t, b2t):
    """The kernel's order with numpy ufuncs (each op correctly rounded, no FMA)."""
    c1, c2, bc1, bc2 = 1.0 - b1, 1.0 - b2, 1.0 - b1t, 1.0 - b2t
    m1 = b1 * m + c1 * g
    v1 = b2 * v + c2 * (g * g)
    mhat = m1 / bc1
    vhat = v1 / bc2
    p1 = p - (lr * mhat) / (np.sqrt(vhat) + eps)
    if not (np.isfinite(p1).all() and np.isfinite(m1).all() and np.isfinite(v1).all()):
        raise FloatingPointError("non-finite")  # the same FiniteOrRefuse duty, in numpy
    return p1, m1, v1


def _store(into: dict, fn, *args, **kw) -> None:
    into["np"] = fn(*args, **kw)


def bench_adam(sizes, repeat, say) -> list:
    say("# Adam step: C single pass (out-of-place) | C in place, check+commit | numpy expression")
    say(
        f"# {'n':>10} {'c_ms':>8} {'c2pass_ms':>10} {'numpy_ms':>9} {'speedup':>8} {'1pass/2pass':>11} {'bits':>10}"
    )
    rng = np.random.default_rng(1)
    hp = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, b1t=0.9**3, b2t=0.999**3)
    rows = []
    for n in sizes:
        p, g = rng.standard_normal(n), rng.standard_normal(n) * 1e-2
        m, v = rng.standard_normal(n) * 1e-3, np.abs(rng.standard_normal(n)) * 1e-6
        outs = [np.empty(n) for _ in range(3)]
        s = [p.copy(), m.copy(), v.copy()]
        res = {}
        # (in place the state keeps moving; the timing does not depend on the values)
        t_c, t_2, t_np = best(
            partial(kernel.adam_step, p, m, v, g, *outs, **hp),
            partial(kernel.adam_step_inplace_checked, *s, g, **hp),
            partial(_store, res, numpy_adam, p, m, v, g, **hp),
            repeat=repeat,
        )
        kernel.adam_step(p, m, v, g, *outs, **hp)
        same = all(np.array_equal(a.view(np.uint64), b.view(np.uint64)) for a, b in zip(outs, res["np"]))
        rows.append({"n": n, "c_s": t_c, "c_two_pass_s": t_2, "numpy_s": t_np, "bits_identical": same})
        say(
            f"  {n:>10} {t_c * 1e3:>8.2f} {t_2 * 1e3:>10.2f} {t_np * 1e3:>9.2f} {t_np / t_c:>7.2f}x"
            f" {t_2 / t_c:>10.2f}x {'identical' if same else 'DIFFERENT':>10}"
        )
    return rows


def dense_products(samples: int, inputs: int, hidden: int, classes: int) -> list:
    """(name, kernel function, a's shape, b's shape, the numpy expression) of the five products
    of one slot's forward and backward pass through the embedded MLP."""
    s, d, h, c = samples, inputs, hidden, classes
    return [
        ("X.W1 (forward)", kernel.matmul, (s, d), (d, h), lambda a, b, o: np.matmul(a, b, out=o)),
        ("a1.W2 (forward)", kernel.matmul, (s, h), (h, c), lambda a, b, o: np.matmul(a, b, out=o)),
        ("a1^T.d (grad W2)", kernel.matmul_tn, (s, h), (s, c), lambda a, b, o: np.matmul(a.T, b, out=o)),
        ("d.W2^T (back)", kernel.matmul_nt, (s, c), (h, c), lambda a, b, o: np.matmul(a, b.T, out=o)),
        ("X^T.da1 (grad W1)", kernel.matmul_tn, (s, d), (s, h), lambda a, b, o: np.matmul(a.T, b, out=o)),
    ]


def bench_dense(shape, repeat, say) -> list:
    """Table 3: each product's fixed-order kernel vs np.matmul on one BLAS thread."""
    from threadpoolctl import threadpool_limits

    samples, inputs, hidden, classes = shape
    path = kernel.isa_path()
    say(
        f"# dense products of the embedded MLP ({samples} samples per slot, {inputs} -> {hidden} -> "
        f"{classes}): fixed-order kernel (path {path}) vs np.matmul on 1 BLAS thread"
    )
    say(
        f"# {'product':<18} {'m':>5} {'k':>5} {'n':>5} {'fixed_us':>9} {'blas_us':>8} {'ratio':>6} {'paths':>10}"
    )
    rng = np.random.default_rng(2)
    rows = []
    for name, fn, ashape, bshape, ref in dense_products(samples, inputs, hidden, classes):
        a, b = rng.standard_normal(ashape), rng.standard_normal(bshape)
        out, blas_out = np.empty(ref(a, b, None).shape), None
        blas_out = np.empty_like(out)
        m, n = out.shape
        k = ashape[0] if fn is kernel.matmul_tn else ashape[1]
        with threadpool_limits(limits=1, user_api="blas"):
            t_fixed, t_blas = best(
                partial(fn, out, a, b), partial(ref, a, b, blas_out), repeat=max(200, repeat)
            )
        bits = []
        for p in kernel.isa_paths():  # the same bits on every path (then back to the chosen one)
            kernel.select_isa_path(p)
            bits.append(fn(np.empty_like(out), a, b).view(np.uint64))
        kernel.select_isa_path(path)
        same = all(np.array_equal(bits[0], x) for x in bits)
        rows.append(
            {
                "product": name,
                "m": m,
                "k": k,
                "n": n,
                "fixed_s": t_fixed,
                "blas_s": t_blas,
                "ratio": t_blas / t_fixed,
                "paths_identical": same,
            }
        )
        say(
            f"  {name:<18} {m:>5} {k:>5} {n:>5} {t_fixed * 1e6:>9.1f} {t_blas * 1e6:>8.1f} "
            f"{t_blas / t_fixed:>6.2f} {'identical' if same else 'DIFFERENT':>10}"
        )
    return rows


def make_parser(rank: int) -> argparse.ArgumentParser:
    p = RankParser(rank, prog="alpha-mpi bench kernel", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument(
        "--sizes",
        type=lambda t: _counts(t, 1, "sizes"),
        default=[10**6, 10**7],
        help="element counts, comma separated (default 1e6,1e7)",
    )
    p.add_argument(
        "--ks",
        type=lambda t: _counts(t, 1, "ks"),
        default=[2, 4, 8],
        help="inputs of the fused add, comma separated (default 2,4,8)",
    )
    p.add_argument(
        "--repeat",
        type=lambda t: _counts(t, 1, "--repeat")[0],
        default=5,
        help="timed repetitions, the best kept (default 5)",
    )
    p.add_argument(
        "--model-shape",
        type=_model_shape,
        default=(32, 128, 700, 10),
        metavar="S,D,H,C",
        help="the dense products' shapes: samples per slot, inputs, hidden units, classes "
        "(default 32,128,700,10: alpha-mpi train's --batch 256 --slots 8 --hidden 700)",
    )
    p.add_argument("--json", type=path, metavar="PATH", help="write the rows as JSON")
    return p


def _model_shape(text: str) -> tuple:
    """'32,128,700,10' -> (32, 128, 700, 10): four whole numbers, each in 1 .. 4096."""
    values = _counts(text, 1, "--model-shape")
    if len(values) != 4 or max(values) > 4096:
        raise argparse.ArgumentTypeError(
            f"--model-shape is four whole numbers in 1..4096 (samples,inputs,hidden,classes), got {text!r}"
        )
    return tuple(values)


def _check_memory(sizes, ks) -> None:
    """Refuse sizes whose arrays (k inputs + 6 more vectors) would not fit in half the memory."""
    if max(ks) > MAX_KS:
        raise Refusal("usage", f"--ks: at most {MAX_KS} inputs per fused add, got {max(ks)}")
    refusal = memory_refusal(8 * max(sizes) * (max(ks) + 6), f"--sizes {max(sizes)} with --ks {max(ks)}")
    if refusal is not None:
        raise refusal


def cmd(comm, argv) -> int:
    """Run the kernel benchmark on rank 0; every rank returns its exit status."""
    rank = comm.Get_rank()
    a = make_parser(rank).parse_args(argv)
    check_outputs(comm, [("--json", a.json, True)])
    _check_memory(a.sizes, a.ks)
    status = np.zeros(1, dtype=np.int32)
    if rank == 0:
        status[0] = _run(a)
    comm.Bcast(status, root=0)  # harness bookkeeping: the same exit status on every rank
    return int(status[0])


def _run(a) -> int:
    def say(line):
        print(line, flush=True)

    info = kernel.build_info()
    say(f"# alpha_mpi kernel {info['build_id'][:12]} {info['compiler']} {' '.join(info['flags'])}")
    say(f"# machine {platform.machine()} {platform.processor() or ''} numpy {np.__version__}")
    kernel.fpenv_check()
    add_rows = bench_add(a.sizes, a.ks, a.repeat, say)
    adam_rows = bench_adam(a.sizes, a.repeat, say)
    dense_rows = bench_dense(a.model_shape, a.repeat, say)
    same = all(r["bits_identical"] for r in adam_rows) and all(r["paths_identical"] for r in dense_rows)
    worst_ratio = min(r["ratio"] for r in add_rows)
    worst_speed = min(r["numpy_s"] / r["c_s"] for r in adam_rows)
    worst_dense = min(r["ratio"] for r in dense_rows)
    say(
        f"# summary: fused add >= {worst_ratio:.2f}x copy bandwidth (target 0.9); "
        f"C Adam >= {worst_speed:.2f}x numpy (target 3); fixed-order products >= {worst_dense:.2f}x "
        f"1-thread BLAS (target 0.5); bits {'identical' if same else 'DIFFERENT'}"
    )
    if a.json:
        doc = {
            "benchmark": "kernel",
            "build": info,
            "isa_path": kernel.isa_path(),
            "add": add_rows,
            "adam": adam_rows,
            "dense": dense_rows,
            "bits_ok": same,
        }
        write_json(a.json, doc)
    return 0 if same else 1
