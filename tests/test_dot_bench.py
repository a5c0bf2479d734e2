"""`alpha-mpi bench dot` under mpiexec -n 2: both tables, the JSON, bits checked, exit statuses.

Single-process test: it launches its own `mpiexec -n 2` under a hard `timeout`. Speed is not
asserted (that belongs in the benchmark's output, not in tests).
"""

import json

from test_bench_cli import launch, needs_mpiexec

pytestmark = needs_mpiexec


def test_dot_tables_and_json(tmp_path):
    """Both tables and the JSON; the development target printed only with --targets."""
    out = tmp_path / "dot.json"
    r = launch(
        "dot",
        "--lengths",
        "1e2,3000",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--tiles",
        "37x53,7x9x11",
        "--json",
        str(out),
        "--targets",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# alpha-mpi bench dot: p = 2")
    data = json.loads(out.read_text())
    assert [c["L"] for c in data["calls"]] == [100, 3000]
    assert all(c["bits"] == "ok" and c["tree_checked"] for c in data["calls"])
    assert all(c["t_alpha"] > 0 and c["t_mpi"] > 0 for c in data["calls"])
    assert [k["L"] for k in data["kernel"]] == [100, 3000]
    # N-d tiles: every process grid of 2 ranks, bits equal to the whole tree, the summary sizes
    grids = [(t["shape"], t["grid"]) for t in data["tiles"]]
    assert sorted(grids) == [
        ("37x53", "1x2"),
        ("37x53", "2x1"),
        ("7x9x11", "1x1x2"),
        ("7x9x11", "1x2x1"),
        ("7x9x11", "2x1x1"),
    ]
    assert all(t["bits"] == "ok" and t["t_alpha"] > 0 and t["frame_kb"] > 0 for t in data["tiles"])
    rec = {t["grid"]: t["records"] for t in data["tiles"] if t["shape"] == "37x53"}
    assert rec["2x1"] <= 2 * 11 + 1 < 37 <= rec["1x2"], rec  # whole rows: one run; half rows: one per row
    assert any(line.lstrip().startswith("3000") for line in lines)
    target = [line for line in lines if line.startswith("# target arrays.dot")]  # issue 33, L = 100
    assert len(target) == 1 and target[0].split()[-1] in ("met", "MISSED"), target


def test_dot_prints_no_target_unless_asked(tmp_path):
    r = launch(
        "dot", "--lengths", "1e2", "--iters", "2", "--warmup", "0", "--no-tiles", "--no-kernel", cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# alpha-mpi bench dot" in r.stdout and "target" not in r.stdout, r.stdout


def test_dot_bad_option_exits_2_on_every_rank():
    r = launch("dot", "--lengths", "zero")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot read lengths" in r.stderr
