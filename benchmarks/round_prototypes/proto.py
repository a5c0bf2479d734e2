"""Issue 33 item 3: the two ways to put the round in C, prototyped far enough to time them.

    mpiexec -n 2 python benchmarks/round_prototypes/proto.py [--iters N] [--sizes 8,1K,64K,1M]
        [--only VARIANT]

(a) `a-py-round`: Python drives the round (one Startall and one Testall poll of mpi4py persistent
    requests), one cffi call checks the received frame, evaluates with the finiteness check and
    (for the next round) patches the outgoing header; csrc-like code without MPI (proto_round.c).
(b) `b-c-loop`: one cffi call runs the whole program: it packs and patches, starts the
    persistent requests, polls them (MPI_Testall) under the spin count, checks, evaluates; built
    by the MPI's own mpicc on the communicator mpi4py made (MPI_Comm_f2c) (proto_native.c).
Beside them, interleaved iteration by iteration: MPI_Allreduce, the floor (floor.py), and the
engine as it was (Allreducer butterfly). p = 2 only (one butterfly round). Prints the median
(max over ranks) per variant and size. `--only V` runs one variant (for callgrind counts).
"""

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import cffi
import numpy as np
from mpi4py import MPI

HERE = Path(__file__).resolve().parent
COMMON = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-std=gnu11", f"-I{HERE}"]

CDEF_A = """
typedef struct {
    uint8_t *sframe, *rframe; double *spay, *rpay; const uint8_t *stmpl, *rexpect;
    size_t n; int me_left, split; uint64_t step;
} pr_round;
int pr_pack(pr_round *r, const double *x);
int pr_round_finish(pr_round *r, const double *x, double *out);
"""
CDEF_CG = """
void cg_toggle(void);
"""
SRC_CG = """
#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
CDEF_B = """
typedef struct pn_exec pn_exec;
pn_exec *pn_new(int fcomm, int peer, int tag, uint8_t *sframe, uint8_t *rframe, double *spay, double *rpay,
                const uint8_t *stmpl, const uint8_t *rexpect, size_t n, int me_left, int split);
int pn_run(pn_exec *e, const double *x, double *out);
void pn_free(pn_exec *e);
"""


def build(name, cdef, source, cc, outdir, text=None):
    """cffi API mode, compiled by `cc` directly (no setuptools): emit the module's C, compile."""
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, text if text is not None else f'#include "{source}"')
    c = outdir / f"{name}.c"
    ffi.emit_c_code(str(c))
    so = outdir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    inc = sysconfig.get_paths()["include"]
    subprocess.run([cc, *COMMON, f"-I{inc}", str(c), "-o", str(so)], check=True)
    return so


def load(so):
    import importlib.util

    spec = importlib.util.spec_from_file_location(so.name.split(".")[0], so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def template(step=0):
    h = np.zeros(128, dtype=np.uint8)
    h[:8] = np.frombuffer(b"ALPHAMPI", dtype=np.uint8)
    h[16:56] = 7
    return h


class Framed:
    """Buffers of one p = 2 butterfly round with a 128-byte header (split at 64 KiB)."""

    def __init__(self, n):
        self.n, self.split = n, 8 * n >= 65536
        if self.split:
            self.sframe, self.rframe = np.zeros(128, np.uint8), np.zeros(128, np.uint8)
            self.rpay = np.zeros(n)
        else:
            self.sframe = np.zeros(128 + 8 * n, np.uint8)
            self.rframe = np.zeros(128 + 8 * n, np.uint8)
            self.rpay = self.rframe[128:].view(np.float64)
        self.tmpl = template()
        self.expect = template()


class ProtoA:
    name = "a-py-round"

    def __init__(self, comm, x, out, mod):
        ffi, lib = mod.ffi, mod.lib
        self.lib, self.ffi = lib, ffi
        f = self.f = Framed(x.size)
        peer = 1 - comm.Get_rank()
        r = self.r = ffi.new("pr_round *")
        keep = self.keep = []

        def p(arr, t):
            c = ffi.from_buffer(t, arr)
            keep.append(c)
            return c

        r.sframe, r.rframe = p(f.sframe, "uint8_t[]"), p(f.rframe, "uint8_t[]")
        spay = x if f.split else f.sframe[128:].view(np.float64)
        r.spay, r.rpay = p(spay, "double[]"), p(f.rpay, "double[]")
        r.stmpl, r.rexpect = p(f.tmpl, "uint8_t[]"), p(f.expect, "uint8_t[]")
        r.n, r.me_left, r.split = x.size, int(comm.Get_rank() == 0), int(f.split)
        self.xp, self.outp = p(x, "double[]"), p(out, "double[]")
        if f.split:
            self.reqs = [
                comm.Recv_init(f.rframe, source=peer, tag=10),
                comm.Recv_init(f.rpay, source=peer, tag=11),
                comm.Send_init(f.sframe, dest=peer, tag=10),
                comm.Send_init(x, dest=peer, tag=11),
            ]
        else:
            self.reqs = [
                comm.Recv_init(f.rframe, source=peer, tag=10),
                comm.Send_init(f.sframe, dest=peer, tag=10),
            ]
        self.out = out

    def run(self):
        lib, reqs = self.lib, self.reqs
        lib.pr_pack(self.r, self.xp)
        MPI.Prequest.Startall(reqs)
        polls = 0
        while not MPI.Request.Testall(reqs):  # the bounded wait: poll, then yield
            polls += 1
            if polls >= 200:
                os.sched_yield()
        if lib.pr_round_finish(self.r, self.xp, self.outp) < 0:
            raise RuntimeError("bad frame")
        return self.out

    def refill(self):
        pass

    def close(self):
        for q in self.reqs:
            q.Free()


class ProtoB:
    name = "b-c-loop"

    def __init__(self, comm, x, out, mod):
        ffi, lib = mod.ffi, mod.lib
        self.lib = lib
        f = self.f = Framed(x.size)
        keep = self.keep = []

        def p(arr, t):
            c = ffi.from_buffer(t, arr)
            keep.append(c)
            return c

        spay = x if f.split else f.sframe[128:].view(np.float64)
        self.e = lib.pn_new(
            comm.py2f(),
            1 - comm.Get_rank(),
            20,
            p(f.sframe, "uint8_t[]"),
            p(f.rframe, "uint8_t[]"),
            p(spay, "double[]"),
            p(f.rpay, "double[]"),
            p(f.tmpl, "uint8_t[]"),
            p(f.expect, "uint8_t[]"),
            x.size,
            int(comm.Get_rank() == 0),
            int(f.split),
        )
        self.xp, self.outp = p(x, "double[]"), p(out, "double[]")
        self.out = out

    def run(self):
        if self.lib.pn_run(self.e, self.xp, self.outp) < 0:
            raise RuntimeError("bad frame")
        return self.out

    def refill(self):
        pass

    def close(self):
        self.lib.pn_free(self.e)


class Engine:
    name = "engine-butterfly"

    def __init__(self, comm, x, out):
        from alpha_mpi import pairwise
        from alpha_mpi.execution import Allreducer

        self.a = Allreducer(comm, pairwise(range(2), [0, 1]), x.size, realization="butterfly")
        self.leaves = {comm.Get_rank(): x}
        self.out = out

    def run(self):
        return self.a.run(self.leaves, out=self.out)

    def refill(self):
        pass

    def close(self):
        self.a.free()


def parse_size(s):
    mult = {"K": 1024, "M": 1024 * 1024}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--sizes", default="8,1K,64K,1M")
    ap.add_argument("--only", default=None)
    ap.add_argument("--settle", type=float, default=0.0, help="rank 0 sleeps this long before each run")
    ap.add_argument("--build-dir", default=None, help="reuse the modules built there")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    assert comm.Get_size() == 2, "p = 2 only"
    from alpha_mpi.tools.bench.baseline import MpiAllreduce
    from alpha_mpi.tools.bench.floor import Floor

    tmp = Path(args.build_dir or tempfile.mkdtemp(prefix="proto")) if rank == 0 else None
    tmp = Path(comm.bcast(str(tmp) if tmp else None))
    if rank == 0 and not (tmp / f"_proto_cg{sysconfig.get_config_var('EXT_SUFFIX')}").exists():
        mpicc = str(Path(sys.executable).parent / "mpicc")
        build("_proto_a", CDEF_A, "proto_round.c", "cc", tmp)
        build("_proto_b", CDEF_B, "proto_native.c", mpicc, tmp)
        build("_proto_cg", CDEF_CG, None, "cc", tmp, SRC_CG)
    comm.Barrier()
    mod_a = load(tmp / f"_proto_a{sysconfig.get_config_var('EXT_SUFFIX')}")
    mod_b = load(tmp / f"_proto_b{sysconfig.get_config_var('EXT_SUFFIX')}")
    # --settle (under callgrind --collect-atstart=no): rank 0 collects inside run() only
    toggle = load(tmp / f"_proto_cg{sysconfig.get_config_var('EXT_SUFFIX')}").lib.cg_toggle
    collect = bool(args.settle) and rank == 0
    dup = comm.Dup()
    if rank == 0:
        version = MPI.Get_library_version().splitlines()[0].strip()
        print(f"# {version}  p=2  iters={args.iters}  median of each rank, max over ranks [us]")
        print(
            "%10s  %12s %12s %12s %12s %14s   a/floor  b/floor  b/MPI"
            % ("bytes", "MPI_Allreduce", "floor", "a-py-round", "b-c-loop", "engine-bfly")
        )
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        n = size // 8
        rng = np.random.default_rng(rank)
        x = rng.standard_normal(n)
        outs = {k: np.zeros(n) for k in ("mpi", "floor", "a", "b", "e")}
        make = {  # built now, in this iteration (x and outs bound as arguments)
            "mpi": lambda x, outs: MpiAllreduce(dup, x, outs["mpi"]),
            "floor": lambda x, outs: Floor(dup, x, outs["floor"]),
            "a": lambda x, outs: ProtoA(dup, x, outs["a"], mod_a),
            "b": lambda x, outs: ProtoB(dup, x, outs["b"], mod_b),
            "e": lambda x, outs: Engine(comm, x, outs["e"]),
        }
        variants = {k: f(x, outs) for k, f in make.items() if not args.only or k == args.only}
        times = {k: [] for k in variants}
        iters = args.iters if size <= 65536 else max(50, args.iters // 20)
        for it in range(iters + 20):
            for k, v in variants.items():
                v.refill()
                comm.Barrier()
                if args.settle and rank == 0:  # callgrind: the peer's frame is there at the first poll
                    time.sleep(args.settle)
                if collect and it >= 20:
                    toggle()
                t = time.perf_counter()
                v.run()
                dt = time.perf_counter() - t
                if collect and it >= 20:
                    toggle()
                if it >= 20:
                    times[k].append(dt)
        if not args.only:
            # the three frame exchanges give the tree's bits (x0 + x1, rank 0's left)
            assert np.array_equal(outs["a"].view(np.uint64), outs["e"].view(np.uint64))
            assert np.array_equal(outs["b"].view(np.uint64), outs["e"].view(np.uint64))
        med = {k: comm.allreduce(float(np.median(t)) * 1e6, op=MPI.MAX) for k, t in times.items()}
        if rank == 0 and not args.only:
            print(
                "%10d  %12.2f %12.2f %12.2f %12.2f %14.2f   %7.2f  %7.2f  %5.2f"
                % (
                    size,
                    med["mpi"],
                    med["floor"],
                    med["a"],
                    med["b"],
                    med["e"],
                    med["a"] / med["floor"],
                    med["b"] / med["floor"],
                    med["b"] / med["mpi"],
                )
            )
        elif rank == 0:
            print(f"{size} {args.only} {med[args.only]:.2f} us")
        for v in variants.values():
            v.close()
    dup.Free()


if __name__ == "__main__":
    main()
