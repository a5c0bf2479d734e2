"""Summarize `alpha-mpi bench allreduce --json` runs (benchmarks/sweep_allreduce.sh):

    python -m alpha_mpi.tools.bench.summary benchmarks/results/allreduce-p*.json

Per rank count p and size: MPI_Allreduce with MPICH's default selection (the run whose forced
algorithm is `auto`), the best forced algorithm, and alpha_mpi's realizations. Ratios are taken
within one run (alpha_mpi and the MPI algorithm it is compared with were interleaved iteration by
iteration), so load on a shared machine hits both alike: auto/default from the `auto` run,
auto/best from the run of the fastest algorithm at that size. Then the targets, each with its
worst case.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

nan = float("nan")


def _load(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("benchmark") == "allreduce":
            doc["_path"] = path
            runs.append(doc)
    return runs


def _rows(doc):
    out = defaultdict(dict)
    for r in doc["results"]:
        key = r["requested"] if r["requested"] in ("auto", "tree", "scatter") else r["realization"]
        out[r["bytes"]][key] = r
    return out


def human(nbytes: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f}{unit}"
    return str(nbytes)


def summarize(runs) -> str:
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


def main(argv=None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m alpha_mpi.tools.bench.summary RESULT.json ...", file=sys.stderr)
        return 2
    runs = _load(paths)
    if not runs:
        print("no allreduce benchmark results in the given files", file=sys.stderr)
        return 2
    print(summarize(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
