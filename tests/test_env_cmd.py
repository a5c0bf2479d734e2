"""`alpha-mpi env` and `alpha_mpi.environment()` (issue 32 item 5): the MPI library, mpi4py,
numpy and its BLAS kernel and threads, torch where installed, the kernel's ISA path, the
calibration in use; `alpha-mpi train` names the compute identity in its start-up lines."""

import json
import os

import alpha_mpi
from alpha_mpi import kernel

from conftest import ROOT, alpha_command, needs_mpiexec


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


# ------------------------------------------- can this CPU run the BLAS kernel? (issue 45 item 8)
# Flags as /proc/cpuinfo lists them: an AVX2-only x86-64 (AMD EPYC Zen 2) and an AVX-512 Xeon.
AVX2_ONLY = "fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 avx avx2 bmi1 bmi2 sse4a".split()
AVX512 = AVX2_ONLY + "avx512f avx512dq avx512cd avx512bw avx512vl".split()


def cpuinfo_file(tmp_path, flags, key="flags"):
    """A /proc/cpuinfo of two processors, the first with `flags` under `key`."""
    path = tmp_path / "cpuinfo"
    one = f"processor\t: 0\nmodel name\t: a CPU\n{key}\t\t: {' '.join(flags)}\n\n"
    path.write_text(one + one.replace("processor\t: 0", "processor\t: 1"))
    return path


def test_a_kernel_needing_instructions_the_cpu_lacks_is_named_with_what_it_lacks():
    from alpha_mpi.tools.cpu_support import kernel_check

    bad = kernel_check("SkylakeX", frozenset(AVX2_ONLY))
    assert bad["verdict"] == "missing"
    assert bad["missing"] == ["avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"]
    assert kernel_check("SkylakeX", frozenset(AVX512))["verdict"] == "ok"
    assert kernel_check("Haswell", frozenset(AVX2_ONLY)) == {
        "kernel": "Haswell",
        "needs": ["avx2", "fma"],
        "missing": [],
        "verdict": "ok",
    }
    assert kernel_check("Sandybridge", frozenset(AVX2_ONLY))["verdict"] == "ok"
    assert kernel_check("Haswell", frozenset("sse2 avx".split()))["missing"] == ["avx2", "fma"]
    assert kernel_check("Cooperlake", frozenset(AVX512))["missing"] == ["avx512_bf16"]
    # two BLAS libraries: both must run
    assert kernel_check("Haswell + SkylakeX", frozenset(AVX2_ONLY))["verdict"] == "missing"
    assert kernel_check("NEOVERSEV1", frozenset("fp asimd".split()))["missing"] == ["sve"]
    # what the table does not know, or no flags, is said to be unchecked, never "ok"
    assert kernel_check("SomeFutureCore", frozenset(AVX512))["verdict"] == "unchecked"
    assert kernel_check("SkylakeX", None)["verdict"] == "unchecked"
    assert kernel_check("none", frozenset(AVX512))["verdict"] == "unchecked"


def test_cpu_flags_are_read_from_a_cpuinfo_file(tmp_path):
    from alpha_mpi.tools.cpu_support import cpu_flags

    assert cpu_flags(str(cpuinfo_file(tmp_path, AVX2_ONLY))) == frozenset(AVX2_ONLY)
    arm = tmp_path / "arm"
    arm.mkdir()
    assert cpu_flags(str(cpuinfo_file(arm, ["fp", "asimd", "sve"], key="Features"))) == {"fp", "asimd", "sve"}
    assert cpu_flags(str(tmp_path / "absent")) is None and cpu_flags(str(tmp_path)) is None
    os.mkfifo(tmp_path / "fifo")
    assert cpu_flags(str(tmp_path / "fifo")) is None  # not opened: it would wait for a writer


def test_environment_checks_the_kernel_in_use_against_the_cpuinfo_it_is_given(tmp_path):
    kernel_name = alpha_mpi.environment(torch=False)["compute"]["fields"]["blas.kernel"]
    if kernel_name.lower() not in ("haswell", "zen", "skylakex", "sandybridge", "cooperlake"):
        import pytest

        pytest.skip(f"numpy's BLAS kernel here is {kernel_name!r}, not one of OpenBLAS's x86-64 kernels")
    none = cpuinfo_file(tmp_path, ["fpu", "sse", "sse2"])  # a CPU that runs none of them
    got = alpha_mpi.environment(torch=False, cpuinfo=str(none))["cpu_check"]
    assert got["cpuinfo"] == str(none) and got["blas"]["kernel"] == kernel_name
    assert got["blas"]["verdict"] == "missing" and "avx" in " ".join(got["blas"]["missing"])


def test_env_says_when_a_forced_kernel_needs_instructions_the_cpu_lacks(tmp_path):
    """OPENBLAS_CORETYPE=SkylakeX imports fine on any x86-64 CPU and the identity reads
    'kernel SkylakeX'; the first matrix product on an AVX2-only CPU dies of SIGILL. `env` names
    it, whatever CPU runs the test: the CPU is a /proc/cpuinfo copy given with --cpuinfo."""
    import platform

    import pytest

    if platform.machine() != "x86_64":
        pytest.skip("OpenBLAS's SkylakeX and Haswell kernels are x86-64's")
    avx2 = cpuinfo_file(tmp_path, AVX2_ONLY)
    forced = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX")
    r = alpha_command("env", "--no-torch", "--cpuinfo", str(avx2), env=forced, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("blas check"))
    assert "WARNING: kernel SkylakeX needs avx512bw, avx512cd, avx512dq, avx512f, avx512vl" in line, line
    assert f"which the CPU of {avx2} lacks" in line and "Illegal instruction" in line, line
    r = alpha_command("env", "--json", "--no-torch", "--cpuinfo", str(avx2), env=forced, cwd=ROOT)
    assert json.loads(r.stdout)["cpu_check"]["blas"]["verdict"] == "missing"
    r = alpha_command(
        "env", "--no-torch", "--cpuinfo", str(avx2), env=dict(forced, OPENBLAS_CORETYPE="Haswell"), cwd=ROOT
    )
    assert "blas check         kernel Haswell runs on the CPU of" in r.stdout, r.stdout
    r = alpha_command("env", "--no-torch", "--cpuinfo", str(tmp_path / "absent"), cwd=ROOT)
    assert r.returncode == 2 and "--cpuinfo" in r.stderr and "Traceback" not in r.stderr, r.stderr


@needs_mpiexec
def test_under_mpiexec_every_rank_whose_cpu_cannot_run_its_kernel_says_so():
    """Rank 0 prints the table; a rank on another node has its own CPU, so it warns itself."""
    import platform

    import pytest

    if platform.machine() != "x86_64":
        pytest.skip("OpenBLAS's SkylakeX kernel is x86-64's")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        avx2 = cpuinfo_file(Path(d), AVX2_ONLY)
        forced = dict(os.environ, OPENBLAS_CORETYPE="SkylakeX", OPENBLAS_NUM_THREADS="1")
        r = alpha_command("env", "--no-torch", "--cpuinfo", str(avx2), n=2, env=forced, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("blas check         WARNING: kernel SkylakeX needs") == 1, r.stdout
    assert r.stderr.count("alpha-mpi env (rank 1): WARNING: kernel SkylakeX needs avx512bw") == 1, r.stderr
