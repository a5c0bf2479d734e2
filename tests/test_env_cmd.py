"""`alpha-mpi env` and `alpha_mpi.environment()` (issue 32 item 5): the MPI library, mpi4py,
numpy and its BLAS kernel and threads, torch where installed, the kernel's ISA path, the
calibration in use; `alpha-mpi train` names the compute identity in its start-up lines."""

import json
import os

import alpha_mpi
from alpha_mpi import kernel

from conftest import ROOT, alpha_command


def test_environment_reports_mpi_the_compute_identity_the_kernel_and_the_calibration(tmp_path, monkeypatch):
    from mpi4py import MPI

    env = alpha_mpi.environment(torch=False)
    json.dumps(env)  # JSON-able as it is
    assert env["alpha_mpi"] == alpha_mpi.__version__
    assert env["mpi"]["library"].split()[0] in MPI.Get_library_version() and env["mpi"]["mpi4py"]
    ident = kernel.compute_identity()
    assert env["compute"]["fields"] == dict(ident.fields) and env["compute"]["digest"] == ident.digest
    assert "blas.kernel" in env["compute"]["compared"] and "cpu" not in env["compute"]["compared"]
    assert env["kernel"]["isa_path"] == kernel.isa_path() and "-ffp-contract=off" in env["kernel"]["flags"]
    assert env["calibration"]["source"].startswith("built-in")
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"alpha": 1e-5, "beta": 1e-9, "gamma": 2e-9}))
    monkeypatch.setenv("ALPHA_MPI_CALIBRATION", str(cal))
    got = alpha_mpi.environment(torch=False)["calibration"]
    assert got["source"] == str(cal) and got["alpha"] == 1e-5


def test_the_env_command_prints_rows_and_json():
    r = alpha_command("env", "--no-torch", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for label in ("mpi", "numpy", "blas", "torch", "kernel", "calibration", "compute identity"):
        assert any(line.split()[0:2][0] == label.split()[0] for line in r.stdout.splitlines()), label
    assert "kernel " in r.stdout and "threads" in r.stdout
    r = alpha_command("env", "--json", "--no-torch", cwd=ROOT)
    env = json.loads(r.stdout)
    assert (
        env["ranks"] == {"size": 1, "classes": [0], "differing": ""}
        and "torch.version" not in env["compute"]["fields"]
    )


def test_train_names_the_compute_identity_at_start():
    r = alpha_command("train", "--steps", "1", "--hidden", "4", "--log-every", "0", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("# compute identity "))
    # the built-in model computes with alpha_mpi's fixed-order kernels: declared independent
    assert "(machine-independent (declared by the model); rank 0's)" in line and "blas.kernel " in line
    here = os.path.dirname(os.path.abspath(__file__))  # compute_models: a model that calls BLAS
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    r = alpha_command(
        "train", "--steps", "1", "--model", "compute_models:blas", "--log-every", "0", cwd=ROOT, env=env
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("# compute identity "))
    assert "(every rank matches it)" in line and "blas.kernel " in line
