"""The same bits on every machine (issue 32, Done when): `alpha-mpi train --steps 50` on 2 ranks
prints one state digest under every OpenBLAS kernel (`OPENBLAS_CORETYPE` stands in for a CPU
type) and every ISA path of alpha_mpi's own kernels (`ALPHA_MPI_ISA`), and under a mix of them
across the ranks. The negative control shows the comparison can see a CPU difference: the same
model computed with numpy/BLAS (`BlasMLP`) prints another digest under another OpenBLAS kernel.

The per-rank environment goes through `sh -c` choosing by the launcher's rank variable
(MPICH's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK), so the same test runs under either
launcher; with MPICH it is what `mpiexec -n 1 -env OPENBLAS_CORETYPE Haswell ... : -n 1 -env
OPENBLAS_CORETYPE Sandybridge ...` does. Each launch runs under a hard `timeout`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLES, mpiexec, needs_mpiexec, printed_digests

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = needs_mpiexec

TRAIN = ["-m", "alpha_mpi", "train", "--steps", "50", "--log-every", "0"]

# OpenBLAS kernels and the CPU features they need (an absent one would die of SIGILL).
CORETYPES = {"Sandybridge": {"avx"}, "Haswell": {"avx2", "fma"}, "SkylakeX": {"avx512f", "avx512bw"}}


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def coretype(name: str) -> str:
    """`name` if this CPU can run that OpenBLAS kernel, else skip the test saying which."""
    missing = CORETYPES[name] - cpu_flags()
    if missing:
        pytest.skip(f"OPENBLAS_CORETYPE={name} needs {sorted(missing)}, which this CPU lacks")
    return name


def train_digest(per_rank: list, args=TRAIN, extra_env=None) -> str:
    """Run `python ARGS` on len(per_rank) ranks, rank r with the environment per_rank[r]
    (a dict); the state digest it printed."""
    n = len(per_rank)
    choose = " ".join(
        f'[ "$r" = {r} ] && export {" ".join(f"{k}={v}" for k, v in env.items())};'
        for r, env in enumerate(per_rank)
        if env
    )
    # each rank says what it runs under, so a launcher without the rank variable (every rank
    # "0", the mix silently not made) fails here instead of passing a comparison of equals
    said = 'echo "rank $r: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} ALPHA_MPI_ISA=${ALPHA_MPI_ISA:-}" >&2;'
    script = f'r=${{PMI_RANK:-${{OMPI_COMM_WORLD_RANK:-x}}}}; {choose} {said} exec "$0" "$@"'
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **(extra_env or {})}
    for k in ("OPENBLAS_CORETYPE", "ALPHA_MPI_ISA"):
        env.pop(k, None)
    cmd = ["timeout", "-k", "5", "400", mpiexec(), "-n", str(n), "sh", "-c", script, sys.executable, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, f"{per_rank}: {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    ran = set(re.findall(r"^rank (\S+): OPENBLAS_CORETYPE=(\S*) ALPHA_MPI_ISA=(\S*)$", r.stderr, re.M))
    want = {
        (str(i), e.get("OPENBLAS_CORETYPE", ""), e.get("ALPHA_MPI_ISA", "")) for i, e in enumerate(per_rank)
    }
    assert ran == want, (ran, want)
    digests = printed_digests(r.stdout)
    assert len(digests) == 1, r.stdout[-2000:]
    return digests[0]


@pytest.fixture(scope="module")
def reference():
    """The digest with each rank on this CPU's defaults."""
    return train_digest([{}, {}])


@pytest.mark.parametrize("kernel", sorted(CORETYPES))
def test_one_digest_under_every_openblas_kernel(reference, kernel):
    k = coretype(kernel)
    assert train_digest([{"OPENBLAS_CORETYPE": k}, {"OPENBLAS_CORETYPE": k}]) == reference


@pytest.mark.parametrize("mix", [("Haswell", "Sandybridge"), ("SkylakeX", "Haswell")])
def test_one_digest_when_the_ranks_mix_openblas_kernels(reference, mix):
    per_rank = [{"OPENBLAS_CORETYPE": coretype(k)} for k in mix]
    assert train_digest(per_rank) == reference


def test_one_digest_when_the_ranks_mix_isa_paths(reference):
    """alpha_mpi's own kernels on the generic C loops on one rank and the fastest path on the
    other (the vector width differs, the bits do not)."""
    assert train_digest([{"ALPHA_MPI_ISA": "generic"}, {}]) == reference
    assert train_digest([{"ALPHA_MPI_ISA": "sse2"}, {"ALPHA_MPI_ISA": "sse2"}]) == reference


def test_a_users_model_on_alpha_mpi_ops_prints_one_digest_across_kernels():
    """examples/numpy_ops_softmax.py (softmax regression on alpha_mpi.ops, `--model`): the same
    digest on the defaults, under one other kernel, and with the kernels mixed across ranks."""
    args = [
        "-m",
        "alpha_mpi",
        "train",
        "--steps",
        "30",
        "--log-every",
        "0",
        "--model",
        "numpy_ops_softmax:factory",
    ]
    path = {"PYTHONPATH": os.pathsep.join(p for p in (EXAMPLES, os.environ.get("PYTHONPATH")) if p)}
    one = train_digest([{}, {}], args, path)
    k = coretype("Sandybridge")
    assert train_digest([{"OPENBLAS_CORETYPE": k}, {"OPENBLAS_CORETYPE": k}], args, path) == one
    assert (
        train_digest([{"OPENBLAS_CORETYPE": k}, {"OPENBLAS_CORETYPE": coretype("Haswell")}], args, path)
        == one
    )


def test_negative_control_a_blas_model_prints_another_digest_under_another_kernel():
    """BlasMLP (the same maths through numpy and BLAS) on one rank under two OpenBLAS kernels:
    two digests, so the equalities above are not a comparison that cannot fail."""
    args = ["-m", "alpha_mpi", "train", "--steps", "20", "--log-every", "0", "--model", "blas_mlp:factory"]
    path = {
        "PYTHONPATH": os.pathsep.join(
            p for p in (os.path.join(HERE, "mpi_scripts"), os.environ.get("PYTHONPATH")) if p
        )
    }
    kernels = [coretype("Sandybridge"), coretype("Haswell")]
    digests = {k: train_digest([{"OPENBLAS_CORETYPE": k}], args, path) for k in kernels}
    assert len(set(digests.values())) == 2, digests
