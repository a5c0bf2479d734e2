"""`python -m alpha_mpi.tools.bench allreduce` under mpiexec: the table, the JSON, the plot, the exit statuses.

Single-process test: it launches its own `mpiexec -n 2` under a hard `timeout`.
"""

import importlib.util
import json
import os

import pytest

from alpha_mpi.tools.bench.allreduce_args import parse_size, parse_sizes
from alpha_mpi.tools.bench.baseline import gloo_available

from conftest import needs_mpiexec, run_mpi

HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def launch(*args, n=2, limit=120, cwd=None):
    """`alpha-mpi bench ARGS` (as python -m alpha_mpi.tools.bench) on `n` ranks, one BLAS thread each."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return run_mpi(n, "-m", "alpha_mpi.tools.bench", *args, limit=limit, env=env, cwd=cwd)[0]


@needs_mpiexec
def test_allreduce_table_and_json(tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    r = launch(
        "allreduce", "--sizes", "8,64K", "--iters", "3", "--json", str(out), "--plot", str(png), cwd=tmp_path
    )
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# alpha_mpi allreduce benchmark")
    machine = next(line for line in lines if line.startswith("# machine:"))
    for key in ("host=", "cpu=", "cores=", "mpi=", "p=2"):
        assert key in machine, machine
    header = next(
        line for line in lines if line.startswith("#") and "bytes" in line and "realization" in line
    )
    for col in (
        "t_min[us]",
        "t_avg[us]",
        "t_max[us]",
        "algbw[GB/s]",
        "busbw[GB/s]",
        "ratio",
        "/floor",
        "iters",
        "warmup",
        "bits",
    ):
        assert col in header
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    doc = json.loads(out.read_text())
    gloo = doc["config"]["gloo"]  # a gloo row per size wherever torch imports, none elsewhere
    assert gloo == gloo_available()
    # MPI_Allreduce, the floor, (gloo,) auto and the five realizations (pairwise on 2 ranks) per size
    per_size = 8 + gloo
    assert len(rows) == 2 * per_size
    assert {row[0] for row in rows} == {"8", "65536"}
    names = [row[1] for row in rows]
    for name in ("MPI_Allreduce", "floor", "butterfly", "halving", "replicate", "tree", "scatter"):
        assert names.count(name) == 2, names
    assert names.count("gloo") == 2 * gloo
    assert "auto(butterfly)" in names
    for row in rows:
        assert row[-3:-1] == ["3", "3"], row  # --iters 3, the default 3 warm-up iterations
        if row[1] == "MPI_Allreduce":
            assert float(row[-5]) == 1.0
        elif row[1] == "floor":
            assert float(row[-4]) == 1.0 and row[-1] == "-"  # timed, its bits never used
        elif row[1] != "gloo":
            assert row[-1] == "ok", row
    assert doc["machine"]["p"] == 2 and doc["bits_ok"] is True and doc["benchmark"] == "allreduce"
    assert not any(line.startswith("# target") for line in lines) and "targets" not in doc  # no --targets
    assert doc["config"]["realizations"] == ["auto", "butterfly", "halving", "replicate", "tree", "scatter"]
    res = doc["results"]
    assert len(res) == 2 * per_size
    for r_ in res:  # the ratio to the floor is t_max over the floor's t_max at that size
        floor = next(f for f in res if f["realization"] == "floor" and f["bytes"] == r_["bytes"])
        assert r_["ratio_floor"] == pytest.approx(r_["t_max_us"] / floor["t_max_us"])
    for r_ in res:
        assert r_["t_min_us"] <= r_["t_avg_us"] <= r_["t_max_us"]
        # the spread of single iterations holds every rank's mean
        assert r_["t_iter_min_us"] <= r_["t_min_us"] and r_["t_max_us"] <= r_["t_iter_max_us"]
        assert r_["busbw_GBs"] == pytest.approx(r_["algbw_GBs"])  # 2(p-1)/p = 1 at p = 2
        assert (r_["iters"], r_["warmup"]) == (3, 3)
    assert {r_["chosen"] for r_ in res if r_["requested"] == "auto"} <= {"butterfly", "halving"}
    # only rank 0 prints the table
    assert r.stdout.count("# machine:") == 1
    if HAVE_MATPLOTLIB:
        assert f"# plot written to {png}" in r.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "# plot skipped: matplotlib is not installed" in r.stdout and not png.exists()


SMALL = ["allreduce", "--sizes", "8,2M", "--iters", "4", "--min-iters", "2", "--warmup", "1"]
SMALL += ["--realizations", "auto,tree", "--no-gloo"]


@needs_mpiexec
def test_allreduce_csv_has_a_header_line_and_a_row_per_variant_and_size(tmp_path):
    """`--format csv`: stdout is CSV as it is (no '#' lines), with the JSON rows' fields as
    columns, the iterations (fewer above 1 MiB) and the warm-up among them; no targets."""
    import csv

    out = tmp_path / "out.json"
    r = launch(*SMALL, "--format", "csv", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "#" not in r.stdout and "target" not in r.stdout + r.stderr, r.stdout
    rows = list(csv.DictReader(r.stdout.splitlines()))
    doc = json.loads(out.read_text())
    assert len(rows) == len(doc["results"]) == 2 * 4  # MPI_Allreduce, floor, auto, tree per size
    for row, want in zip(rows, doc["results"]):
        assert row["realization"] == want["realization"] and int(row["bytes"]) == want["bytes"]
        assert float(row["t_max_us"]) == want["t_max_us"] and float(row["ratio_floor"]) == want["ratio_floor"]
        # 8 B: --iters; 2 MiB: iters * 1 MiB / size = 2 (at least --min-iters)
        assert (int(row["iters"]), int(row["warmup"])) == ((4, 1) if want["bytes"] == 8 else (2, 1)), row
        assert row["bits_ok"] == ("True" if want["chosen"] else "")
    for size in ("8", str(2 << 20)):
        names = sorted(row["realization"] for row in rows if row["bytes"] == size)
        assert len(names) == 4, names
        assert {"MPI_Allreduce", "floor", "tree"} <= set(names) and sum(
            n.startswith("auto(") for n in names
        ) == 1


@needs_mpiexec
def test_allreduce_json_on_stdout_and_targets_only_when_asked():
    """`--format json`: stdout is the document --json writes, nothing else; `--targets` adds the
    development targets (to the document, and as '#' notes on stderr)."""
    r = launch(*SMALL, "--format", "json", "--targets")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["benchmark"] == "allreduce" and doc["bits_ok"] is True and doc["config"]["warmup"] == 1
    assert {(row["bytes"], row["iters"], row["warmup"]) for row in doc["results"]} == {
        (8, 4, 1),
        (2 << 20, 2, 1),
    }
    assert doc["targets"] and all(t.startswith("# target ") for t in doc["targets"]), doc.get("targets")
    assert r.stderr.count("# target ") == len(doc["targets"])


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_reduce_scatter_table_against_reduce_scatter_block_and_reduce_then_scatter(tmp_path, n):
    """On 3 ranks 64 KiB does not split in equal chunks: the bits are still checked chunk by chunk."""
    out = tmp_path / "rs.json"
    r = launch("allreduce", "--reduce-scatter", "--sizes", "8,64K", "--iters", "2", "--json", str(out), n=n)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# alpha_mpi reduce-scatter benchmark")
    header = next(line for line in lines if line.startswith("#") and "realization" in line)
    assert "/root" in header and "/floor" not in header
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    names = [row[1] for row in rows]
    for name in ("MPI_Reduce_scatter_block", "MPI_Reduce+Scatter", "scatter"):
        assert names.count(name) == 2, names
    assert all(row[-1] == "ok" for row in rows if not row[1].startswith("MPI_")), rows
    doc = json.loads(out.read_text())
    assert (
        doc["benchmark"] == "reduce-scatter" and doc["config"]["mode"] == "reduce-scatter" and doc["bits_ok"]
    )
    assert {r_["requested"] for r_ in doc["results"]} >= {"auto", "scatter", "MPI_Reduce_scatter_block"}
    assert "MPI_Allreduce" not in names and "floor" not in names


@needs_mpiexec
def test_unknown_command_exits_2_on_every_rank():
    r = launch("nonsense", limit=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("unknown command 'nonsense'") == 1  # printed on rank 0 only


@needs_mpiexec
@pytest.mark.parametrize(
    "flag,value", [("--plot", "/dev/null/x.png"), ("--json", "."), ("--plot", "x.txt/y.png")]
)
def test_an_output_path_rank_0_cannot_write_is_refused_on_every_rank_before_the_run(tmp_path, flag, value):
    """Checked on rank 0 (which writes the outputs) before anything is timed; the verdict travels
    to every rank, so each refuses by name and the job ends 3 (never a traceback after the run)."""
    (tmp_path / "x.txt").write_text("a file, not a folder")
    r = launch(*SMALL, flag, value, "--format", "csv", cwd=tmp_path, limit=90)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "t_max_us" not in r.stdout, r.stdout + r.stderr
    assert "(rank 0): error [output-unwritable] " + flag in r.stderr, r.stderr
    assert "(rank 1): error [output-unwritable] " + flag in r.stderr and "(rank 0 writes it)" in r.stderr


@needs_mpiexec
def test_bad_option_exits_2():
    r = launch("allreduce", "--sizes", "12", limit=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("not a positive multiple of 8") == 1


def test_size_parsing():
    assert parse_size("8") == 8 and parse_size("1K") == 1024 and parse_size("64M") == 64 << 20
    assert parse_size("2MiB") == 2 << 20
    assert parse_sizes("8,1K,1M,64M") == [8, 1024, 1 << 20, 64 << 20]
    assert parse_sizes("8:64") == [8, 16, 32, 64]


def test_a_missing_command_module_is_reported_not_fatal(monkeypatch, capsys):
    import alpha_mpi.tools.bench as bench

    monkeypatch.setitem(bench.COMMANDS, "ghost", ("alpha_mpi.tools.bench.no_such_module", "absent"))
    assert bench.run(["ghost"]) == 2
    assert "not available in this installation" in capsys.readouterr().err
