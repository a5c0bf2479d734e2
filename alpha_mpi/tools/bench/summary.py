"""The summary of an MPI algorithm sweep of `alpha-mpi bench allreduce`, and the merge of its
runs into one document per rank count. It reads the files it is given, nothing else.

    alpha-mpi bench summary SWEEP.json ...                  # the summary, on stdout
    alpha-mpi bench summary --merge SWEEP.json RUN.json ...  # the runs of one p into one document
    python -m alpha_mpi.tools.bench.summary ...              # the same, without MPI

A RUN.json is what `alpha-mpi bench allreduce --json` writes: one run, one forced MPICH
algorithm (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM; `auto` is MPICH's own selection). A SWEEP.json
holds the runs of one rank count keyed by algorithm, each run's document unchanged:

    {"benchmark": "allreduce-sweep", "p": 2, "runs": {"auto": {...}, "ring": {...}, ...}}

--merge adds the given runs (or sweeps) to SWEEP.json, replacing a run of the same algorithm
and keeping the others when the file exists already; every run must be at the same p.

The summary, per rank count p and size: MPI_Allreduce with MPICH's default selection (the run
whose forced algorithm is `auto`), the best forced algorithm, and alpha_mpi's realizations.
Ratios are taken within one run (alpha_mpi and the MPI algorithm it is compared with were
interleaved iteration by iteration), so load on a shared machine hits both alike: auto/default
from the `auto` run, auto/best from the run of the fastest algorithm at that size. Then the
targets, each with its worst case.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

from ...refusals import Refusal
from .._args import check_output
from .._args import path as path_arg
from .allreduce_report import human
from .results import read_json, write_json

nan = float("nan")
SWEEP = "allreduce-sweep"
EXIT_USAGE = 2


def load_runs(paths) -> list:
    """The allreduce run documents in `paths` (runs, and the runs of sweeps), each with `_path`
    naming where it came from. Other documents are passed over."""
    runs = []
    for path in paths:
        doc = read_json(path)
        if not isinstance(doc, dict):
            raise Refusal("bench-document-invalid", f"{path}: a {type(doc).__name__}, not a JSON object")
        if doc.get("benchmark") == SWEEP:
            if not isinstance(doc.get("runs"), dict):
                raise Refusal("bench-document-invalid", f"{path}: a sweep document without its `runs` object")
            for alg, run in doc["runs"].items():
                runs.append(_run(run, f"{path}[{alg}]"))
        elif doc.get("benchmark") == "allreduce":
            runs.append(_run(doc, path))
    return runs


def _run(doc, where: str) -> dict:
    """A run document with the fields the summary and --merge read at the top, or a refusal."""
    ok = (
        isinstance(doc, dict)
        and isinstance(doc.get("machine"), dict)
        and isinstance(doc["machine"].get("p"), int)
        and isinstance(doc.get("config"), dict)
        and isinstance(doc["config"].get("mpi_allreduce_algorithm"), str)
        and isinstance(doc.get("results"), list)
        and all(isinstance(r, dict) for r in doc["results"])
    )
    if not ok:
        raise Refusal(
            "bench-document-invalid",
            f"{where}: not an allreduce run (machine.p, config.mpi_allreduce_algorithm and results are needed)",
        )
    return {**doc, "_path": where}


def merge(runs, into=None) -> dict:
    """One sweep document of `runs` (all at one p), added to the sweep `into` where given: a run
    replaces the one of the same algorithm. Raises ValueError for runs at different p."""
    p = {r["machine"]["p"] for r in runs} | ({into["p"]} if into else set())
    if len(p) != 1:
        raise ValueError(f"runs at different rank counts {sorted(p)}: one sweep document per p")
    out = dict(into["runs"]) if into else {}
    for run in runs:
        out[run["config"]["mpi_allreduce_algorithm"]] = {k: v for k, v in run.items() if k != "_path"}
    return {"benchmark": SWEEP, "p": p.pop(), "runs": dict(sorted(out.items()))}


def _rows(doc):
    out = defaultdict(dict)
    for r in doc["results"]:
        key = r["requested"] if r["requested"] in ("auto", "tree", "scatter") else r["realization"]
        out[r["bytes"]][key] = r
    return out


def summarize(runs) -> str:
    """The summary's text of the runs `load_runs` read."""
    lines = []
    by_p = defaultdict(dict)
    for doc in runs:
        by_p[doc["machine"]["p"]][doc["config"]["mpi_allreduce_algorithm"]] = doc
    targets = defaultdict(list)  # name -> [(p, bytes, value)]
    for p in sorted(by_p):
        algs = by_p[p]
        rows = {alg: _rows(doc) for alg, doc in algs.items()}
        base = algs.get("auto") or next(iter(algs.values()))
        m = base["machine"]
        lines.append(
            f"# p={p}  host={m['hostname']} cpu={m['cpu']!r} cores={m['cores']} mpi={m['mpi']!r}"
            + ("  OVERSUBSCRIBED" if m.get("oversubscribed") else "")
        )
        lines.append(
            f"# algorithms run: {', '.join(sorted(algs))}; times are t_max [us] ({base['config']['stat']} per rank)"
        )
        lines.append(
            f"#{'bytes':>9s} {'MPI default':>12s} {'MPI best':>12s} {'(algorithm)':<27s}{'auto':>11s} {'(choice)':<10s}"
            f"{'tree':>11s}{'scatter':>11s}{'auto/default':>13s}{'auto/best':>11s}"
        )
        base_rows = rows.get("auto") or rows[next(iter(rows))]
        for size in sorted(base_rows):
            br = base_rows[size]
            mpi_default = br.get("MPI_Allreduce", {}).get("t_max_us")
            best_alg, best_t = None, None
            for alg, rs in rows.items():
                t = rs.get(size, {}).get("MPI_Allreduce", {}).get("t_max_us")
                if t is not None and (best_t is None or t < best_t):
                    best_alg, best_t = alg, t
            auto = br.get("auto", {})
            ratio_default = auto.get("ratio")
            in_best = rows[best_alg][size].get("auto", {}) if best_alg else {}
            ratio_best = in_best.get("ratio")
            lines.append(
                f"{size:>10d} {mpi_default or float('nan'):>12.1f} {best_t or float('nan'):>12.1f} {best_alg or '-':<27s}"
                f"{auto.get('t_max_us', float('nan')):>11.1f} {('(' + str(auto.get('chosen')) + ')'):<10s}"
                f"{br.get('tree', {}).get('t_max_us', nan):>11.1f}{br.get('scatter', {}).get('t_max_us', nan):>11.1f}"
                f"{ratio_default if ratio_default is not None else nan:>13.2f}"
                f"{ratio_best if ratio_best is not None else nan:>11.2f}"
            )
            if ratio_default is not None:
                if 16 << 20 <= size <= 64 << 20:
                    targets["<= 0.5x MPI_Allreduce default at 16-64 MiB"].append((p, size, ratio_default))
                if size == 1 << 20:
                    targets["<= 0.9x MPI_Allreduce default at 1 MiB"].append((p, size, ratio_default))
                if size <= 64 << 10:
                    targets["<= 1.0x MPI_Allreduce default at 8 B - 64 KiB"].append((p, size, ratio_default))
            if ratio_best is not None and 16 << 20 <= size <= 64 << 20:
                targets["<= 0.8x MPICH best-tuned at 16-64 MiB"].append((p, size, ratio_best))
        model = base.get("model")
        if model and model.get("ratio") is not None:
            lines.append(
                f"# memory-bandwidth model at {human(model['bytes'])}B p={p}: copy {model['copy_in'] * 1e6:.0f} + add "
                f"{model['add'] * 1e6:.0f} + copy {model['copy_out'] * 1e6:.0f} = {model['total'] * 1e6:.0f} us; scatter "
                f"{model.get('bandwidth_t_max_us', model.get('scatter_t_max_us')):.0f} us = {model['ratio']:.2f}x model"
            )
            if p == 2:
                targets["<= 1.15x memory-bandwidth model at 64 MiB p=2"].append(
                    (p, model["bytes"], model["ratio"])
                )
        bad = [doc["_path"] for doc in algs.values() if not doc.get("bits_ok", False)]
        lines.append(
            "# bits: "
            + (
                "every alpha_mpi result equal to the oracle and to each other, every iteration"
                if not bad
                else f"MISMATCH in {bad}"
            )
        )
        lines.append("")
    if targets:
        lines.append("# targets (worst case over the sizes and rank counts measured):")
        for name, vals in targets.items():
            limit = float(name.split("x")[0].replace("<=", "").strip())
            p, size, worst = max(vals, key=lambda v: v[2])
            ok = all(v[2] <= limit for v in vals)
            met = sum(1 for v in vals if v[2] <= limit)
            lines.append(
                f"#   {name}: {'MET' if ok else 'MISSED'} (worst {worst:.2f} at {human(size)}B p={p}; "
                f"{met}/{len(vals)} points within)"
            )
    return "\n".join(lines)


def _merge_into(target: str, paths) -> int:
    runs = load_runs(paths)
    into = None
    if os.path.exists(target):
        into = read_json(target)
        if (
            not isinstance(into, dict)
            or into.get("benchmark") != SWEEP
            or not isinstance(into.get("runs"), dict)
            or not isinstance(into.get("p"), int)
        ):
            print(
                f"alpha-mpi bench summary: error: {target} is not a sweep document ({SWEEP}); not overwritten",
                file=sys.stderr,
            )
            return EXIT_USAGE
    if not runs:
        return _no_runs()
    try:
        doc = merge(runs, into)
    except ValueError as e:
        print(f"alpha-mpi bench summary: error: --merge: {e}", file=sys.stderr)
        return EXIT_USAGE
    write_json(target, doc, "--merge")
    print(f"{target}: p={doc['p']}, runs {', '.join(doc['runs'])}")
    return 0


def _no_runs() -> int:
    print(
        "alpha-mpi bench summary: error: no allreduce benchmark results in the given files", file=sys.stderr
    )
    return EXIT_USAGE


def main(argv=None) -> int:
    """`python -m alpha_mpi.tools.bench.summary [--merge SWEEP.json] FILE.json ...`"""
    parser = argparse.ArgumentParser(
        prog="alpha-mpi bench summary", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    parser.add_argument("files", nargs="+", type=path_arg, metavar="FILE.json", help="run or sweep documents")
    parser.add_argument(
        "--merge", type=path_arg, metavar="SWEEP.json", help="merge the runs into this sweep document"
    )
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.merge:
        check_output(a.merge, "--merge", make_folder=True)
        return _merge_into(a.merge, a.files)
    runs = load_runs(a.files)
    if not runs:
        return _no_runs()
    try:
        text = summarize(runs)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a row without the fields a run has
        raise Refusal(
            "bench-document-invalid",
            f"{', '.join(a.files)}: a result row lacks or mistypes a field ({type(e).__name__}: {e})",
        )
    print(text)
    return 0


def cmd(comm, argv) -> int:
    """`alpha-mpi bench summary`: rank 0 reads and writes; every rank returns its status."""
    import numpy as np

    status = np.array([main(argv) if comm.Get_rank() == 0 else 0], dtype=np.int32)
    comm.Bcast(status, root=0)  # harness bookkeeping: the same exit status on every rank
    return int(status[0])


if __name__ == "__main__":
    sys.exit(main())
