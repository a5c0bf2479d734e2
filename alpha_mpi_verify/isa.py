"""Instruction sets: build, run and compare the ISA drivers (csrc/verify/conformance_driver.c,
csrc/verify/train_driver.c).

Used by tests/test_isa_conformance.py; also usable on its own from a source checkout (it
builds csrc/ of the repository this package sits in):

    python -m alpha_mpi_verify.isa [WORKDIR]
    python -m alpha_mpi_verify.isa --train [STEPS [HIDDEN [BATCH [SLOTS]]]]

prints a JSON report: the kernel build_id (sha256 of the C sources and flags), the
targets, and per output section the number of elements whose bits differ (NaNs compared
by class: any NaN equals any NaN, because x86-64 and AArch64 produce different default
NaN payloads and signs).

Whole training steps (`run_train_conformance`, issue 32): the product's learner (what
`alpha-mpi train` builds, on COMM_SELF) trains STEPS steps of the embedded MLP on x86-64 and
writes the case it trained on (its initial parameters and every slot's samples); the train
driver, built for x86-64 and for AArch64 (under qemu), runs the same steps from that case on
every ISA path its CPU offers; the final parameters, Adam moments and per-step losses of the
product, of x86-64 and of AArch64 must be the same bits. Negative control: the AArch64 driver
built with fused multiply-add contraction ends elsewhere.

The flags come from alpha_mpi/kernel/build.py (BASE_CFLAGS), the one place they live.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from alpha_mpi.kernel.build import BASE_CFLAGS, build_id

__all__ = [
    "N_DEFAULT",
    "APT_PACKAGES",
    "toolchain",
    "base_cflags",
    "kernel_build_id",
    "build_commands",
    "build_all",
    "run_driver",
    "read_sections",
    "compare",
    "run_conformance",
    "training_case",
    "run_train_conformance",
]

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
DRIVER = CSRC / "verify" / "conformance_driver.c"
TRAIN_DRIVER = CSRC / "verify" / "train_driver.c"
KERNEL = CSRC / "kernel" / "alpha_kernel.c"
DENSE = CSRC / "kernel" / "dense.c"
FRAME = CSRC / "kernel" / "frame.c"  # CRC32C and the header patch (the instruction paths differ by ISA)
MAGIC = b"AKCONF01"
N_DEFAULT = 1 << 20  # >= 1e6 elements per function

CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = ("qemu-aarch64", "qemu-aarch64-static")
APT_PACKAGES = ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "qemu-user")


def base_cflags() -> list:
    """The kernel's compile flags (alpha_mpi/kernel/build.py BASE_CFLAGS)."""
    return list(BASE_CFLAGS)


def kernel_build_id(flags) -> str:
    """sha256 of the kernel sources and `flags`: the build id evidence names."""
    return build_id(flags)


def toolchain():
    """Paths of the tools, or (None, reason) when something is missing."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return (
            None,
            f"the conformance pair is x86-64 native + AArch64 emulated; this host is {platform.machine()}",
        )
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if not cc:
        return None, "no native C compiler (gcc) on PATH"
    cross = shutil.which(CROSS_CC)
    qemu = next((q for q in map(shutil.which, QEMU) if q), None)
    missing = [name for name, path in ((CROSS_CC, cross), ("qemu-aarch64", qemu)) if not path]
    if missing:
        return None, (
            f"{' and '.join(missing)} not found; install the Debian packages {' '.join(APT_PACKAGES)}"
        )
    return {"cc": cc, "cross": cross, "qemu": qemu}, None


def with_contract(flags, mode):
    """`flags` with -ffp-contract set to `mode` (the FMA negative control uses `fast`)."""
    return [f for f in flags if not f.startswith("-ffp-contract")] + [f"-ffp-contract={mode}"]


def build_commands(tools, workdir, flags, driver=DRIVER, prefix=""):
    """name -> compile command of `driver` (the kernel's conformance driver, or the train
    driver with prefix "train_"). The same sources and flags everywhere; the negative
    controls change exactly one thing each."""
    src = [str(driver), str(KERNEL), str(DENSE), str(FRAME)]
    inc = [f"-I{CSRC / 'kernel'}", f"-I{CSRC / 'verify'}"]
    w = Path(workdir)
    return {
        "x86_64": [tools["cc"], *flags, *inc, *src, "-o", str(w / "drv_x86_64"), "-lm"],
        "aarch64": [tools["cross"], *flags, *inc, *src, "-static", "-o", str(w / "drv_aarch64"), "-lm"],
        # negative control 1: FMA contraction allowed (AArch64 has fmadd/fmla)
        "aarch64_fma": [
            tools["cross"],
            *with_contract(flags, "fast"),
            *inc,
            *src,
            "-static",
            "-o",
            str(w / "drv_aarch64_fma"),
            "-lm",
        ],
        # negative control 2: reciprocal-square-root route for Adam, decay after the step for
        # AdamW (driver-only macro)
        "x86_64_rsqrt": [
            tools["cc"],
            *flags,
            "-DAK_CONFORMANCE_RSQRT",
            *inc,
            *src,
            "-o",
            str(w / "drv_x86_64_rsqrt"),
            "-lm",
        ],
    }


def train_build_commands(tools, workdir, flags):
    """name -> compile command of the train driver: x86_64, aarch64 and the FMA control."""
    cmds = build_commands(tools, workdir, flags, TRAIN_DRIVER)
    w = Path(workdir)
    out = {}
    for name in ("x86_64", "aarch64", "aarch64_fma"):
        cmd = list(cmds[name])
        cmd[cmd.index("-o") + 1] = str(w / f"train_{name}")
        out[name] = cmd
    return out


def build_all(tools, workdir, flags, names=None, commands=None):
    """Compile the drivers `names` (default: all) in parallel; name -> executable path.
    `commands`: name -> command (default: build_commands, the kernel's driver)."""
    cmds = commands if commands is not None else build_commands(tools, workdir, flags)
    names = list(cmds) if names is None else names
    procs = {
        n: subprocess.Popen(cmds[n], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for n in names
    }
    for n, p in procs.items():
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            raise RuntimeError(f"building the {n} driver failed:\n{' '.join(cmds[n])}\n{out}")
    return {n: Path(cmds[n][cmds[n].index("-o") + 1]) for n in names}


def _execute(tools, name, cmd, timeout):
    """Run a driver's command line (an AArch64 one under qemu); its stderr, or RuntimeError."""
    if name.startswith("aarch64"):
        cmd = [tools["qemu"], *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr}")
    return r.stderr


def run_driver(tools, name, exe, workdir, n=N_DEFAULT, seed=20240601):
    """Run one driver (AArch64 ones under qemu) over n generated elements; its sections."""
    out = Path(workdir) / f"out_{name}.bin"
    _execute(tools, name, [str(exe), str(out), str(n), str(seed)], 600)
    try:
        return read_sections(out)
    finally:
        out.unlink()  # ~100 MB each; the arrays are in memory now


def read_sections(path):
    """name -> numpy array (uint64 for 8-byte, uint32 for 4-byte elements)."""
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a conformance output (magic {data[:8]!r})")
    pos, out = 8, {}
    while pos < len(data):
        name = data[pos : pos + 16].rstrip(b"\0").decode()
        count, elem = np.frombuffer(data, dtype="<u8", count=2, offset=pos + 16)
        pos += 32
        dt = {8: "<u8", 4: "<u4"}[int(elem)]
        out[name] = np.frombuffer(data, dtype=dt, count=int(count), offset=pos).copy()
        pos += int(count) * int(elem)
    return out


def _is_nan(bits):
    if bits.dtype == np.dtype("<u4"):
        return (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    return (bits & 0x7FF0000000000000 == 0x7FF0000000000000) & (bits & 0x000FFFFFFFFFFFFF != 0)


FLOAT_SECTIONS = {
    "exp",
    "log",
    "matmul",
    "matmul_tn",
    "matmul_nt",
    "matmul_narrow",
    "params",
    "losses",
    "add",
    "tree_eval",
    "fold",
    "chain_prog",
    "adam_p",
    "adam_m",
    "adam_v",
    "adamw_p",
    "adamw_m",
    "adamw_v",
    "sgd_p",
    "sgd_buf",
    "sgd0_p",
    "round_binary64",
    "widen_binary32",
}


def compare(a, b):
    """section -> {'elements', 'differ', 'nan'}; float sections compare NaNs by class,
    integer sections (statuses, indices) exactly."""
    if set(a) != set(b):
        raise ValueError(f"different sections: {sorted(set(a) ^ set(b))}")
    res = {}
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape:
            res[name] = {"elements": int(x.size), "differ": int(max(x.size, y.size)), "nan": 0}
            continue
        if name in FLOAT_SECTIONS:
            nx, ny = _is_nan(x), _is_nan(y)
            differ = (nx != ny) | ((x != y) & ~(nx & ny))
            res[name] = {"elements": int(x.size), "differ": int(differ.sum()), "nan": int((nx & ny).sum())}
        else:
            res[name] = {"elements": int(x.size), "differ": int((x != y).sum()), "nan": 0}
    return res


def _prepare(workdir, prefix):
    """(tools, workdir as a Path, flags), or (None, why the toolchain is missing, None)."""
    tools, why = toolchain()
    if tools is None:
        return None, why, None
    workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    return tools, workdir, base_cflags()


def run_conformance(workdir=None, n=N_DEFAULT):
    """Build all four drivers, run them, and compare. Returns a JSON-able report."""
    tools, workdir, flags = _prepare(workdir, "alpha_conf_")
    if tools is None:
        return {"skipped": workdir}
    exes = build_all(tools, workdir, flags)
    outs = {name: run_driver(tools, name, exe, workdir, n) for name, exe in exes.items()}
    return {
        "build_id": kernel_build_id(flags),
        "flags": flags,
        "n": n,
        "reference": "x86_64",
        "targets": {name: compare(outs["x86_64"], outs[name]) for name in exes if name != "x86_64"},
        "outputs": outs,
    }


# ----------------------------------------------------------------------------- training steps

TRAIN_SECTIONS = ("params", "adam_m", "adam_v", "losses")


def training_case(path, steps=10, hidden=32, batch=50, slots=6, seed=0, optimizer="adam", weight_decay=None):
    """Train `steps` steps with the product's learner on this machine (trainer.build, as
    `alpha-mpi train --hidden H --batch B --slots S --seed SEED --optimizer O --weight-decay WD`
    on one rank; `optimizer` "adam" or "adamw") and write the case it trained on to `path`
    (train_driver.c's input format: AKTRAIN1 for Adam, AKTRAIN2 with the weight decay for AdamW).
    Returns the product's final state as sections: name -> uint64 array (params, adam_m,
    adam_v, losses)."""
    from mpi4py import MPI

    from alpha_mpi.learning.trainer import TrainConfig, build

    if optimizer not in ("adam", "adamw"):
        raise ValueError(f"the train driver runs adam or adamw, not {optimizer!r}")
    cfg = TrainConfig(
        steps=steps,
        hidden=hidden,
        batch=batch,
        slots=slots,
        seed=seed,
        log_every=0,
        optimizer=optimizer,
        weight_decay=weight_decay,
    )
    data, model, learner, stream = build(MPI.COMM_SELF, cfg)
    opt = learner.opt
    adamw = optimizer == "adamw"
    with open(path, "wb") as f:
        f.write(b"AKTRAIN2" if adamw else b"AKTRAIN1")
        f.write(np.array([model.d, model.h, model.c, slots, steps], dtype="<i8").tobytes())
        scalars = [opt.lr, opt.b1, opt.b2, opt.eps] + ([opt.weight_decay] if adamw else [])
        f.write(np.array(scalars, dtype="<f8").tobytes())
        f.write(np.ascontiguousarray(learner.params, dtype="<f8").tobytes())
        for t in range(steps):
            for s in range(slots):
                idx = stream.indices(t, s)
                f.write(np.array([idx.size], dtype="<i8").tobytes())
                f.write(np.ascontiguousarray(data.X[idx], dtype="<f8").tobytes())
                f.write(np.ascontiguousarray(data.y[idx], dtype="<i8").tobytes())
    losses = []
    for t in range(steps):  # train()'s loop: every slot's samples, then the step
        batch_t = {}
        for s in learner.needed_slots:
            idx = stream.indices(t, s)
            batch_t[s] = (data.X[idx], data.y[idx])
        loss, _ = learner.train_step(batch_t)
        losses.append(loss)
    state = {"params": learner.params, "adam_m": opt.m, "adam_v": opt.v, "losses": np.array(losses)}
    return {k: np.ascontiguousarray(v, dtype="<f8").view("<u8").copy() for k, v in state.items()}


def run_train_driver(tools, name, exe, case, workdir):
    """Run one train driver on `case` (AArch64 ones under qemu): (sections, ISA paths run)."""
    out = Path(workdir) / f"train_out_{name}.bin"
    said = _execute(tools, name, [str(exe), str(case), str(out)], 900)
    paths = [int(w) for w in said.split() if w.isdigit()][1]  # "S steps on P ISA paths, D differ"
    return read_sections(out), paths


def run_train_conformance(
    workdir=None, steps=10, hidden=32, batch=50, slots=6, optimizer="adam", weight_decay=None
):
    """The product trains on x86-64 (with `optimizer`, "adam" or "adamw", and its
    `weight_decay`) and writes its case; the train drivers (x86_64, aarch64, aarch64_fma) run
    it. Returns a JSON-able report: per target the differing elements of each section against
    the product's state, the ISA paths each ran and how many of them differed."""
    tools, workdir, flags = _prepare(workdir, "alpha_train_conf_")
    if tools is None:
        return {"skipped": workdir}
    exes = build_all(tools, workdir, flags, commands=train_build_commands(tools, workdir, flags))
    case = workdir / "case.bin"
    product = training_case(case, steps, hidden, batch, slots, optimizer=optimizer, weight_decay=weight_decay)
    outs, paths = {}, {}
    for name, exe in exes.items():
        outs[name], paths[name] = run_train_driver(tools, name, exe, case, workdir)
    return {
        "build_id": kernel_build_id(flags),
        "case": {
            "steps": steps,
            "hidden": hidden,
            "batch": batch,
            "slots": slots,
            "optimizer": optimizer,
            "weight_decay": weight_decay,
        },
        "reference": "product (alpha_mpi's learner on x86-64)",
        "targets": {
            name: compare(product, {k: out[k] for k in TRAIN_SECTIONS}) for name, out in outs.items()
        },
        "paths": paths,
        "paths_differ": {name: int(out["paths_differ"][0]) for name, out in outs.items()},
        "fpenv_flags": {name: int(out["fpenv_flags"][0]) for name, out in outs.items()},
        "product": product,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--train":
        nums = [int(v) for v in sys.argv[2:]]
        rep = run_train_conformance(None, *nums)
        rep.pop("product", None)
    else:
        rep = run_conformance(sys.argv[1] if len(sys.argv) > 1 else None)
        rep.pop("outputs", None)
    print(json.dumps(rep, indent=1))
