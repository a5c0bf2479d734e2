"""A non-editable install runs (issue 42 item 6): the wheel `pip wheel .` builds, installed into
a fresh venv whose site-packages is then made read-only, runs a distributed dot and the main
training job from a directory outside the source tree. The engine's C round is built at first
use from the sources the wheel ships (alpha_mpi/_csrc) into $XDG_CACHE_HOME, never beside the
package; the dot's bits equal the independent oracle's and the training digest the editable
install's.

The venv takes this interpreter's dependencies (numpy, mpi4py, cffi) through a `.pth` line naming
this environment's site-packages, and its MPI library through the library path, as a cluster's
MPI module provides it: only alpha_mpi comes from the wheel, and nothing is downloaded but the
build's own requirements (pip's build isolation).
"""

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from array_oracle import oracle_dot, sequential_sum

from conftest import ROOT, mpiexec, needs_mpiexec, order_sensitive, printed_digest

pytestmark = needs_mpiexec

#: What the build reads: the metadata, the two packages and csrc/ (the kernel, the round).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "alpha_mpi", "alpha_mpi_verify", "csrc")
LIMIT = 600  # seconds for the wheel build (the kernel at -O3 on a loaded 2-core machine)

# Each rank's block of a global vector of N (in a file DATA): the dot's tree crosses the blocks.
N = 1001
DOT = """
import sys
import numpy as np
from mpi4py import MPI
import alpha_mpi, alpha_mpi.execution.native as native
from alpha_mpi import arrays
comm = MPI.COMM_WORLD
x, y = np.load(sys.argv[1])
lo, hi = len(x) * comm.rank // comm.size, len(x) * (comm.rank + 1) // comm.size
r = arrays.dot(comm, x[lo:hi], y[lo:hi], lo, len(x))
every = np.zeros(comm.size) if comm.rank == 0 else None
comm.Gather(np.array([r]), every, root=0)  # the test's channel: rank 0 prints every rank's bits
if comm.rank == 0:
    for rank, v in enumerate(every):
        print(f"rank {rank} bits {v.view(np.uint64):016x}")
    print("package", alpha_mpi.__file__)
    print("sources", native.sources_root())
    print("module", native.Build().path)
"""


def _files(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _read_only(root: Path, on: bool) -> None:
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        p.chmod(mode & ~0o222 if on else mode | stat.S_IWUSR)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, its site-packages, a clean environment to run it in, the cache directory)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_alpha_kernel.c", "*.egg-info", "build")
    for name in BUILD_INPUTS:
        path = Path(ROOT) / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=skip)
        else:
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    r = subprocess.run(
        ["timeout", str(LIMIT), *pip, "wheel", "--no-deps", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    (wheel,) = dist.glob("alpha_mpi-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run(
        ["timeout", "300", *pip, "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"pip install of {wheel.name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (site / "_alpha_mpi_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    assert not (site / "csrc").exists() and (site / "alpha_mpi" / "_csrc" / "round").is_dir()
    shipped = {p.name for p in (site / "alpha_mpi" / "_csrc" / "round").iterdir()}
    assert {p.name for p in (Path(ROOT) / "csrc" / "round").iterdir()} <= shipped  # every file of the round

    # The MPI library too is this environment's, found as a cluster's MPI module is: on the
    # library path (mpi4py looks for the venv's own lib/ first, which this venv has not).
    libmpi = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mpi4py import MPI; from alpha_mpi.execution import native; print(native.loaded_libmpi())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cache = tmp / "xdg-cache"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ALPHA_MPI_NATIVE_CACHE")}
    env.update(XDG_CACHE_HOME=str(cache), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    if libmpi != "None":
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [os.path.dirname(libmpi), env.get("LD_LIBRARY_PATH")])
        )
    env.setdefault("ALPHA_MPI_TIMEOUT", "120")
    _read_only(site, True)
    # Root ignores the mode bits: the tests also compare the files with these.
    before = _files(site)
    try:
        yield venv, site, env, cache, before
    finally:
        _read_only(site, False)


def _run(installed, *argv, env=None, limit=300):
    """`mpiexec -n 2 ARGV` from a directory outside the source tree; its stdout."""
    cache = installed[3]
    elsewhere = cache.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    r = subprocess.run(
        ["timeout", "-k", "5", str(limit), mpiexec(), "-n", "2", *map(str, argv)],
        capture_output=True,
        text=True,
        env=installed[2] if env is None else env,
        cwd=elsewhere,
    )
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_wheel_dot_builds_the_round_from_package_data_outside_the_package(installed):
    venv, site, _, cache, before = installed
    x, y = order_sensitive(np.random.default_rng(42), 2 * N).reshape(2, N)
    want = oracle_dot(x, y)
    # The data makes the order observable: a left-to-right loop gives other bits.
    assert want != sequential_sum([float(a) * float(b) for a, b in zip(x, y)])
    data = cache.parent / "dot.npy"
    np.save(data, np.stack([x, y]))

    out = _run(installed, venv / "bin" / "python", "-c", DOT, data)
    lines = dict(
        line.split(" ", 1) for line in out.splitlines() if line.startswith(("package", "sources", "module"))
    )
    assert Path(lines["package"]).is_relative_to(site), out  # the wheel's, not the source tree's
    assert Path(lines["sources"]) == site / "alpha_mpi" / "_csrc", out
    module = Path(lines["module"])
    assert module.is_relative_to(cache / "alpha_mpi" / "native") and module.is_file(), out
    bits = f"{np.float64(want).view(np.uint64):016x}"
    got = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert got == [f"rank 0 bits {bits}", f"rank 1 bits {bits}"], out
    assert _files(site) == before


def test_wheel_training_digest_equals_the_editable_installs(installed):
    venv, site, _, _, before = installed
    wheel = printed_digest(_run(installed, venv / "bin" / "alpha-mpi", "train", "--steps", "50"))
    assert _files(site) == before
    # The editable install in this interpreter, with this environment's own cache.
    env = dict(os.environ, OMP_NUM_THREADS="1", ALPHA_MPI_TIMEOUT=os.environ.get("ALPHA_MPI_TIMEOUT", "120"))
    editable = printed_digest(
        _run(installed, sys.executable, "-m", "alpha_mpi", "train", "--steps", "50", env=env)
    )
    assert wheel == editable
