"""The allreduce benchmark's report without MPI: the plot (two panels: time with the spread of
single iterations, ratio to MPI_Allreduce with a line at 1.0), the summary of the recorded sweep
and the merge of runs into one sweep document per rank count."""

import json
import os

import pytest

from alpha_mpi.tools.bench import summary
from alpha_mpi.tools.bench.allreduce_report import figure, plot, table_line
from alpha_mpi.tools.bench.results import to_json

from conftest import ROOT

RESULTS = os.path.join(ROOT, "benchmarks", "results")
SWEEPS = [os.path.join(RESULTS, f"mpich-sweep-p{p}.json") for p in (2, 4)]


def synthetic_doc():
    """A document as `bench allreduce --json` writes it, at p = 2, three sizes, three variants."""
    rows = []
    for size in (8, 1024, 1 << 20):
        t_ref = 10.0 + size / 1e3
        for name, requested, chosen, factor in (
            ("MPI_Allreduce", "MPI_Allreduce", None, 1.0),
            ("auto(butterfly)", "auto", "butterfly", 2.0 if size < 1024 else 0.8),
            ("halving", "halving", "halving", 3.0 if size < 1024 else 0.7),
        ):
            t = t_ref * factor
            rows.append(
                {
                    "bytes": size,
                    "realization": name,
                    "requested": requested,
                    "chosen": chosen,
                    "t_min_us": 0.9 * t,
                    "t_avg_us": 0.95 * t,
                    "t_max_us": t,
                    "t_iter_min_us": 0.5 * t,
                    "t_iter_max_us": 2.0 * t,
                    "algbw_GBs": size / t / 1e3,
                    "busbw_GBs": size / t / 1e3,
                    "ratio": factor,
                    "iters": 3,
                    "bits_ok": True if chosen else None,
                    "bits_equal_declared": True if chosen is None else None,
                }
            )
    return {
        "benchmark": "allreduce",
        "machine": {"p": 2},
        "config": {"mpi_allreduce_algorithm": "auto", "stat": "mean"},
        "results": rows,
        "model": None,
        "bits_ok": True,
    }


def _check_figure(fig, series):
    assert len(fig.axes) == 2
    times, ratios = fig.axes
    assert len(times.get_lines()) == series  # every variant's t_max
    assert len(times.collections) == series  # and its shaded min-max spread
    one = [ln for ln in ratios.get_lines() if list(ln.get_ydata()) == [1.0, 1.0]]
    assert len(one) == 1, "no line at ratio 1.0"
    assert len(ratios.get_lines()) == series  # every variant but MPI_Allreduce, and the line at 1.0
    assert ratios.get_yscale() == "log" and times.get_xscale() == "log"


def test_plot_has_a_time_panel_with_the_spread_and_a_ratio_panel(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install alpha_mpi[plot])")
    doc = synthetic_doc()
    _check_figure(figure(doc), series=3)
    out = tmp_path / "allreduce.png"
    assert plot(doc, str(out)) == f"# plot written to {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_a_recorded_run_shades_the_spread_over_ranks(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install alpha_mpi[plot])")
    with open(SWEEPS[0]) as f:
        run = json.load(f)["runs"]["auto"]  # recorded before t_iter_min_us: the band is t_min..t_max
    assert "t_iter_min_us" not in run["results"][0]
    fig = figure(run)
    _check_figure(fig, series=4)  # MPI_Allreduce, auto, tree, scatter
    assert "fastest to slowest rank" in fig.axes[0].get_title()


def test_plot_without_matplotlib_says_so(monkeypatch, tmp_path):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    out = tmp_path / "x.png"
    assert plot(synthetic_doc(), str(out)).startswith("# plot skipped: matplotlib is not installed")
    assert not out.exists()


def test_table_line_is_formatted_from_the_json_row():
    rows = synthetic_doc()["results"]
    mpi, auto = table_line(rows[0]).split(), table_line(rows[1]).split()
    # the column after `ratio` (the ratio to the floor) is nan for a document recorded before it
    # and its warm-up count is "-" (recorded before the column existed)
    assert (
        mpi[:2] == ["8", "MPI_Allreduce"]
        and mpi[-5:] == ["1.00", "nan", "3", "-", "=tree"]
        and len(mpi) == 12
    )
    assert auto[1] == "auto(butterfly)" and auto[4] == f"{rows[1]['t_max_us']:.2f}" and auto[-1] == "ok"
    rows[1]["warmup"] = 5
    assert table_line(rows[1]).split()[-3:] == ["3", "5", "ok"]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_each_format_prints_every_row_and_only_its_own_kind_of_text(fmt, capsys):
    """The output objects of --format: the table's '#' preamble and notes; CSV with a header
    line and the notes on stderr; JSON the whole document, the notes on stderr."""
    import csv

    from alpha_mpi.tools.bench.allreduce_report import FORMATS, csv_columns, header

    doc = synthetic_doc()
    for r in doc["results"]:
        r["warmup"] = 2
    said = []
    out = FORMATS[fmt]("allreduce", said.append)
    out.begin(["# a preamble line", header()])
    for r in doc["results"]:
        out.row(r)
    out.note("# a note")
    out.end(doc)
    err = capsys.readouterr().err
    if fmt == "table":
        assert said[:2] == ["# a preamble line", header()] and said[-1] == "# a note" and not err
        assert [line.split()[1] for line in said[2:-1]] == [r["realization"] for r in doc["results"]]
    elif fmt == "csv":
        got = list(csv.DictReader(said))
        assert list(got[0]) == csv_columns("allreduce") and len(got) == len(doc["results"])
        for row, r in zip(got, doc["results"]):
            assert float(row["t_max_us"]) == r["t_max_us"] and (row["iters"], row["warmup"]) == ("3", "2")
            assert row["chosen"] == (r["chosen"] or "") and row["ratio_floor"] == ""  # absent: empty
        assert err == "# a note\n"
    else:
        assert len(said) == 1 and json.loads(said[0]) == doc and err == "# a note\n"


def test_summary_of_the_recorded_sweeps_is_the_recorded_summary(capsys):
    assert summary.main(SWEEPS) == 0
    with open(os.path.join(RESULTS, "summary.txt")) as f:
        assert capsys.readouterr().out == f.read()


def test_merge_keeps_every_run_and_replaces_by_algorithm(tmp_path, capsys):
    with open(SWEEPS[0]) as f:
        sweep = json.load(f)
    paths = []
    for alg, run in sweep["runs"].items():
        path = tmp_path / f"run-{alg}.json"
        path.write_text(json.dumps(run))
        paths.append(str(path))
    target = tmp_path / "sweep.json"
    assert summary.main(["--merge", str(target), *paths[:2]]) == 0
    assert summary.main(["--merge", str(target), *paths[2:]]) == 0  # added to the first two
    merged = json.loads(target.read_text())
    assert merged == sweep  # lossless, keyed by algorithm
    assert target.read_text() == to_json(sweep) + "\n"
    assert json.loads(to_json(sweep)) == sweep
    # a run of another rank count does not belong in this document
    with open(SWEEPS[1]) as f:
        other = json.load(f)["runs"]["auto"]
    (tmp_path / "p4.json").write_text(json.dumps(other))
    capsys.readouterr()
    assert summary.main(["--merge", str(target), str(tmp_path / "p4.json")]) == 2
    assert "different rank counts" in capsys.readouterr().err
    assert json.loads(target.read_text()) == sweep  # left as it was


def test_summary_needs_files_and_reads_only_them(tmp_path, capsys):
    assert summary.main([]) == 2
    other = tmp_path / "other.json"
    other.write_text('{"benchmark": "dot"}')
    assert summary.main([str(other)]) == 2
    assert "no allreduce benchmark results" in capsys.readouterr().err


def test_the_issue_33_target_lines_compare_the_rows_of_one_run():
    """`targets`: each target the run measured, its ratio of t_max and met / MISSED; auto
    against the realization it chose by name; sizes and rows not run are left out."""
    from alpha_mpi.tools.bench.allreduce_report import targets

    def row(size, name, requested, chosen, t):
        return {"bytes": size, "realization": name, "requested": requested, "chosen": chosen, "t_max_us": t}

    results = [
        row(8, "MPI_Allreduce", "MPI_Allreduce", None, 4.0),
        row(8, "floor", "floor", None, 5.0),
        row(8, "auto(butterfly)", "auto", "butterfly", 6.0),
        row(8, "butterfly", "butterfly", "butterfly", 5.0),
        row(1 << 20, "MPI_Allreduce", "MPI_Allreduce", None, 100.0),
        row(1 << 20, "auto(halving)", "auto", "halving", 79.0),
        row(1 << 20, "halving", "halving", "halving", 80.0),
    ]
    got = targets(results)
    want = [
        ("auto / floor", "8", 1.2, "met"),
        ("auto / MPI_Allreduce", "8", 1.5, "MISSED"),
        ("auto / MPI_Allreduce", "1M", 0.79, "met"),
        ("auto / butterfly by name", "8", 1.2, "MISSED"),
        ("auto / halving by name", "1M", 0.99, "met"),
    ]
    assert len(got) == len(want), got
    for line, (label, size, ratio, verdict) in zip(got, want):
        assert line.startswith(f"# target {label}") and f" {size}:" in line, line
        assert f"{ratio:5.2f}" in line and line.endswith(verdict), line
