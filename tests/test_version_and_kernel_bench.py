"""One version number (pyproject.toml, alpha_mpi.__version__, `alpha-mpi --version`,
CITATION.cff), and `alpha-mpi bench kernel` (which replaced benchmarks/bench_kernel.py)."""

import json
import os
import re
import subprocess
import sys

import alpha_mpi

from conftest import ROOT


def alpha_mpi_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "alpha_mpi", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_one_version_everywhere():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)
    with open(os.path.join(ROOT, "CITATION.cff")) as f:
        citation = re.search(r"^version: (\S+)$", f.read(), re.M).group(1)
    r = alpha_mpi_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"alpha_mpi {alpha_mpi.__version__}", r
    assert pyproject == alpha_mpi.__version__ == citation == "0.2.0"


def test_bench_kernel_prints_the_three_tables_and_writes_json(tmp_path):
    out = tmp_path / "k.json"
    r = alpha_mpi_cli(
        "bench", "kernel", "--sizes", "1000,3e3", "--ks", "2,5", "--repeat", "1", "--model-shape", "4,5,6,3",
        "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# alpha_mpi kernel ") and "-ffp-contract=off" in lines[0]
    assert any(line.startswith("# fused k-input add") for line in lines)
    assert any(line.startswith("# Adam step") for line in lines)
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [(row[0], row[1]) for row in rows[:4]] == [
        ("1000", "2"),
        ("1000", "5"),
        ("3000", "2"),
        ("3000", "5"),
    ]
    assert [row[-1] for row in rows[4:6]] == ["identical", "identical"]  # C Adam and numpy, bit for bit
    # the dense products of one slot at --model-shape 4,5,6,3 (samples, inputs, hidden, classes)
    dense = next(i for i, line in enumerate(lines) if line.startswith("# dense products"))
    assert "4 samples per slot, 5 -> 6 -> 3" in lines[dense] and "path " in lines[dense]
    mkn = [tuple(int(v) for v in row[-7:-4]) for row in rows[6:]]
    assert mkn == [(4, 5, 6), (4, 6, 3), (6, 4, 3), (4, 3, 6), (5, 4, 6)]
    assert all(row[-1] == "identical" for row in rows[6:])  # every ISA path gave the same bits
    assert lines[-1].startswith("# summary:") and lines[-1].endswith("bits identical")
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "kernel" and doc["bits_ok"] is True
    assert [(a["n"], a["k"]) for a in doc["add"]] == [(1000, 2), (1000, 5), (3000, 2), (3000, 5)]
    assert all(a["fused_GBs"] > 0 and a["ratio"] == a["fused_GBs"] / a["copy_GBs"] for a in doc["add"])
    assert [a["n"] for a in doc["adam"]] == [1000, 3000]
    assert [d["product"] for d in doc["dense"]][0] == "X.W1 (forward)" and len(doc["dense"]) == 5
    assert all(d["paths_identical"] and d["ratio"] == d["blas_s"] / d["fixed_s"] for d in doc["dense"])
    assert doc["isa_path"] in ("avx512", "avx2", "sse2", "neon", "generic")
    assert not os.path.exists(os.path.join(ROOT, "benchmarks", "bench_kernel.py"))


def test_bench_kernel_refuses_bad_options():
    for args, text in [
        (["--sizes", "0"], "--sizes"),
        (["--sizes", "1.5"], "--sizes"),
        (["--ks", "x"], "--ks"),
        (["--repeat", "0"], "--repeat"),
        (["--json", ""], "--json"),
        (["--model-shape", "32,128,700"], "--model-shape"),
        (["--model-shape", "1,1,1,5000"], "--model-shape"),
    ]:
        r = alpha_mpi_cli("bench", "kernel", *args)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    r = alpha_mpi_cli("bench", "kernel", "--sizes", "1e12")
    assert r.returncode == 2 and "[usage]" in r.stderr and "GiB" in r.stderr, r.stderr
    r = alpha_mpi_cli("bench", "kernel", "--sizes", "1000", "--repeat", "1", "--json", "/dev/full")
    assert r.returncode == 3 and "[output-unwritable]" in r.stderr, r.stderr
