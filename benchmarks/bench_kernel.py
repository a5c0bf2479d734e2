"""Kernel benchmarks: fused k-input add vs copy bandwidth, C Adam vs numpy Adam.

    python benchmarks/bench_kernel.py [--sizes 1e6 1e7] [--ks 2 4 8] [--repeat 5]

Prints `#`-headed tables, side by side in one run:
  1. fused k-input add (the star chain ((x0+x1)+x2)+..., one sweep) in GB/s, counting
     (k+1)*8*n bytes (k reads, one write), next to np.copyto's 2*8*n bytes, and the
     ratio (target >= 0.9: the fused pass runs at memory speed);
  2. one Adam step: C single pass (separate next-state buffers), C in place with a
     check pass then a commit pass, and a numpy expression in the same evaluation order;
     the bits of all three are compared and printed; speedup target >= 3x numpy.

OPENBLAS_* / OMP_* / MKL_* environment variables do not matter here: these are
element-wise operations, no BLAS is called, and the kernel is single-threaded.
Timings are best-of-`repeat` wall times (time.perf_counter) after one warm-up call.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from alpha_mpi import kernel as K


def best(*fns, repeat):
    """Best-of-`repeat` wall time of each function, run in alternation (so drift and
    other load on a shared machine hit all of them alike)."""
    for fn in fns:
        fn()  # warm-up (page faults, caches)
    t = [float("inf")] * len(fns)
    for _ in range(repeat):
        for j, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            t[j] = min(t[j], time.perf_counter() - t0)
    return t if len(fns) > 1 else t[0]


def bench_add(sizes, ks, repeat):
    print("# fused k-input add (star chain, one sweep) vs np.copyto")
    print("# (tree_GB/s: a balanced tree over the same k inputs, the general block-stack path;")
    print("#  ws_MB: bytes the fused pass touches; at 1e6 the copy's 16 MB may sit in cache)")
    print(f"# {'n':>10} {'k':>3} {'ws_MB':>6} {'fused_GB/s':>11} {'copy_GB/s':>10} {'ratio':>6} {'tree_GB/s':>10}")
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        src = rng.standard_normal(n)
        dst = np.empty(n)
        for k in ks:
            xs = [rng.standard_normal(n) for _ in range(k)]
            out = np.empty(n)
            # a balanced tree over the same inputs (general block-stack path)
            prog = np.array(balanced_program(list(range(k))), dtype=np.int32)
            t, t_copy, tt = best(
                lambda: K.fold(out, xs), lambda: np.copyto(dst, src), lambda: K.tree_eval(out, xs, prog),
                repeat=repeat,
            )
            bw = (k + 1) * 8 * n / t / 1e9
            copy_bw = 2 * 8 * n / t_copy / 1e9
            tbw = (k + 1) * 8 * n / tt / 1e9
            rows.append((n, k, bw, copy_bw, bw / copy_bw, tbw))
            print(f"  {n:>10} {k:>3} {(k + 1) * 8 * n / 1e6:>6.0f} {bw:>11.2f} {copy_bw:>10.2f} {bw / copy_bw:>6.2f} {tbw:>10.2f}")
    return rows


def balanced_program(slots):
    if len(slots) == 1:
        return [slots[0]]
    h = len(slots) // 2
    return balanced_program(slots[:h]) + balanced_program(slots[h:]) + [K.OP_ADD]


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


def bench_adam(sizes, repeat):
    print("# Adam step: C single pass (out-of-place) | C in place, check+commit | numpy expression")
    print(f"# {'n':>10} {'c_ms':>8} {'c2pass_ms':>10} {'numpy_ms':>9} {'speedup':>8} {'1pass/2pass':>11} {'bits':>10}")
    rng = np.random.default_rng(1)
    hp = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, b1t=0.9**3, b2t=0.999**3)
    rows = []
    for n in sizes:
        p = rng.standard_normal(n)
        m = rng.standard_normal(n) * 1e-3
        v = np.abs(rng.standard_normal(n)) * 1e-6
        g = rng.standard_normal(n) * 1e-2
        outs = [np.empty(n) for _ in range(3)]
        s = [p.copy(), m.copy(), v.copy()]
        res = {}
        # (in place the state keeps moving; the timing does not depend on the values)
        t_c, t_2, t_np = best(
            lambda: K.adam_step(p, m, v, g, *outs, **hp),
            lambda: K.adam_step_inplace_checked(*s, g, **hp),
            lambda: res.__setitem__("np", numpy_adam(p, m, v, g, **hp)),
            repeat=repeat,
        )
        K.adam_step(p, m, v, g, *outs, **hp)
        same = all(np.array_equal(a.view(np.uint64), b.view(np.uint64)) for a, b in zip(outs, res["np"]))
        rows.append((n, t_c, t_2, t_np, same))
        print(f"  {n:>10} {t_c * 1e3:>8.2f} {t_2 * 1e3:>10.2f} {t_np * 1e3:>9.2f} {t_np / t_c:>7.2f}x"
              f" {t_2 / t_c:>10.2f}x {'identical' if same else 'DIFFERENT':>10}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="element counts")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8], help="inputs of the fused add")
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions (best is kept)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes]
    info = K.build_info()
    print(f"# alpha_mpi kernel {info['build_id'][:12]} {info['compiler']} {' '.join(info['flags'])}")
    print(f"# machine {platform.machine()} {platform.processor() or ''} numpy {np.__version__}")
    K.fpenv_check()
    add_rows = bench_add(sizes, args.ks, args.repeat)
    adam_rows = bench_adam(sizes, args.repeat)
    worst_ratio = min(r[4] for r in add_rows)
    worst_speed = min(r[3] / r[1] for r in adam_rows)
    print(f"# summary: fused add >= {worst_ratio:.2f}x copy bandwidth (target 0.9); "
          f"C Adam >= {worst_speed:.2f}x numpy (target 3); bits "
          f"{'identical' if all(r[4] for r in adam_rows) else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
