"""The report of `alpha-mpi bench allreduce`: the '#'-headed table (OSU/IMB style), the rows of
the JSON document, the CSV, the memory-bandwidth model line, the development targets and the
plot. No MPI here: the summary of a sweep (summary.py) and the plot read documents with it.

Every printed row is formatted from its JSON row, so the table, the CSV and the JSON always
agree. `--format` chooses one output object (FORMATS) once; the loop hands it the preamble, each
row and each note, and it alone decides what stdout carries.
"""

from __future__ import annotations

import csv
import io
import json
import sys

TITLE = "# alpha_mpi allreduce benchmark: declared-order binary64 sum vs MPI_Allreduce (OSU/IMB style)"
RS_TITLE = (
    "# alpha_mpi reduce-scatter benchmark: declared-order binary64 sum, rank r ends with chunk r, vs "
    "MPI_Reduce_scatter_block and MPI_Reduce + MPI_Scatter"
)
#: per mode: the reference (the `ratio` column), the second baseline (the column after it) and
#: the JSON field of the ratio to that second baseline
REFERENCES = {
    "allreduce": ("MPI_Allreduce", "floor", "ratio_floor"),
    "reduce-scatter": ("MPI_Reduce_scatter_block", "MPI_Reduce+Scatter", "ratio_root"),
}
SECOND_COLUMN = {"ratio_floor": "/floor", "ratio_root": "/root"}


#: Issue 33's targets at p = 2 (docs/performance.md): (name, bytes, numerator row, denominator
#: row, the most the ratio may be). Rows: "auto", "floor", "MPI_Allreduce", "named" (the
#: realization auto chose, asked for by name), "allreduce()" (the convenience call, --functional).
TARGETS = (
    ("auto / floor", 8, "auto", "floor", 1.25),
    ("auto / floor", 1024, "auto", "floor", 1.25),
    ("auto / MPI_Allreduce", 8, "auto", "MPI_Allreduce", 1.3),  # the stretch target
    ("auto / MPI_Allreduce", 64 << 10, "auto", "MPI_Allreduce", 0.75),
    ("auto / MPI_Allreduce", 1 << 20, "auto", "MPI_Allreduce", 0.8),
    ("auto / MPI_Allreduce", 16 << 20, "auto", "MPI_Allreduce", 0.65),
    ("auto / MPI_Allreduce", 64 << 20, "auto", "MPI_Allreduce", 0.45),
    ("auto / named", None, "auto", "named", 1.1),
    ("allreduce() / Allreducer", None, "allreduce()", "auto", 1.1),
    ("auto+crc / auto", None, "auto+crc", "auto", 1.1),  # the payload check as the default
)


def targets(results: list) -> list:
    """'#' lines: each target of TARGETS the rows measured (sizes not run are left out), its
    ratio and whether it is met (t_max against t_max, one interleaved run). The project's
    development targets, not a verdict on a user's machine: printed only with --targets."""
    by = {}
    for r in results:
        name = r["realization"]
        key = "auto" if r["requested"] == "auto" else name
        by[(r["bytes"], key)] = r
        if r["requested"] == "auto":
            by[(r["bytes"], "_chosen")] = r["chosen"]
    sizes = sorted({r["bytes"] for r in results})
    lines = []
    for label, size, num, den, most in TARGETS:
        for b in sizes if size is None else [size]:
            top = by.get((b, num))
            bottom = by.get((b, by.get((b, "_chosen")) if den == "named" else den))
            if top is None or bottom is None or bottom is top:
                continue
            ratio = top["t_max_us"] / bottom["t_max_us"]
            shown = label if den != "named" else f"auto / {bottom['realization']} by name"
            verdict = "met" if ratio <= most else "MISSED"
            lines.append(f"# target {shown:<34s} {human(b):>5s}: {ratio:5.2f} (<= {most:g}) {verdict}")
    return lines


def header(mode: str = "allreduce") -> str:
    """The table's column line; the column after `ratio` is the ratio to the floor (allreduce)
    or to MPI_Reduce + MPI_Scatter (reduce-scatter)."""
    second = SECOND_COLUMN[REFERENCES[mode][2]]
    return (
        f"#{'bytes':>11s}  {'realization':<25s}{'t_min[us]':>11s}{'t_avg[us]':>11s}{'t_max[us]':>11s}"
        f"{'algbw[GB/s]':>13s}{'busbw[GB/s]':>13s}{'ratio':>8s}{second:>8s}{'iters':>7s}{'warmup':>7s}  bits"
    )


HEADER = header()
#: what the shaded band of the plot spans, by the fields a document has
BAND = {
    "t_iter_min_us": "fastest to slowest single iteration on any rank",
    "t_min_us": "fastest to slowest rank",
}


def human(nbytes: int) -> str:
    """8 -> '8', 1024 -> '1K', 64 MiB -> '64M' (exact multiples only)."""
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= f and nbytes % f == 0:
            return f"{nbytes // f}{unit}"
    return str(nbytes)


def preamble(info: dict, config: dict, args) -> list:
    """The '#' lines above the table: machine, configuration, skipped realizations, columns."""
    gloo = config["gloo"]
    mode = config.get("mode", "allreduce")
    ref, second, _ = REFERENCES[mode]
    lines = [
        TITLE if mode == "allreduce" else RS_TITLE,
        f"# machine: host={info['hostname']} cpu={info['cpu']!r} cores={info['cores']} mpi={info['mpi']!r} "
        f"p={info['p']}" + ("  (OVERSUBSCRIBED: more ranks than cores)" if info["oversubscribed"] else ""),
        f"# MPI_Allreduce algorithm: {config['mpi_allreduce_algorithm']} (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM)   "
        f"topology={args.topology} slots/rank={args.slots_per_rank} calibration={args.cal.source!r} "
        f"segment={config['segment']} stat={args.stat} spin={'on' if config['spin'] else 'off'}"
        f"{'' if gloo else '   gloo: skipped (torch not importable)' if not args.no_gloo else ''}",
    ]
    lines += [f"# skipped {r}: {reason}" for r, reason in config["skipped"].items()]
    lines.append(
        "# t_* = min/avg/max over ranks of each rank's per-iteration "
        + args.stat
        + f"; algbw = bytes/t_max; busbw = algbw*2(p-1)/p; ratio = t_max / t_max({ref}); "
        + f"{SECOND_COLUMN[REFERENCES[mode][2]]} = t_max / t_max({second}); "
        + "iters / warmup = timed / untimed iterations of each variant at that size"
    )
    if mode == "allreduce":
        lines.append(
            "# floor = a bare mpi4py recursive-doubling exchange (persistent requests, np.add, no headers, "
            "no checks): the fastest this design could be in Python; auto's /floor is the price of its checks"
        )
    lines.append(header(mode))
    return lines


def result_row(
    v,
    size: int,
    p: int,
    ts,
    spread,
    t_refs,
    counts: tuple,
    size_ok: bool,
    mpi_same: bool,
    mode: str = "allreduce",
):
    """The JSON row of one variant at one size. `ts`: each rank's statistic; `spread`: the
    fastest and the slowest single iteration over all ranks; `t_refs`: the t_max of the
    reference and of the second baseline of `mode` (REFERENCES); `counts`: the timed and the
    untimed (warm-up) iterations at this size."""
    iters, warmup = counts
    ref, _, second_key = REFERENCES[mode]
    t_ref, t_second = t_refs
    tmin, tavg, tmax = min(ts), sum(ts) / len(ts), max(ts)
    algbw = size / tmax / 1e9
    alpha = v.chosen is not None
    return {
        "bytes": size,
        "realization": v.name,
        "requested": v.requested,
        "chosen": v.chosen,
        "t_min_us": tmin * 1e6,
        "t_avg_us": tavg * 1e6,
        "t_max_us": tmax * 1e6,
        "t_iter_min_us": spread[0] * 1e6,
        "t_iter_max_us": spread[1] * 1e6,
        "algbw_GBs": algbw,
        "busbw_GBs": algbw * 2 * (p - 1) / p if p > 1 else 0.0,
        "ratio": tmax / t_ref,
        second_key: tmax / t_second,
        "iters": iters,
        "warmup": warmup,
        "bits_ok": size_ok if alpha else None,
        "bits_equal_declared": mpi_same if v.name == ref else None,
    }


def table_line(r: dict) -> str:
    """One row of the table, from its JSON row."""
    if r["chosen"] is not None:
        bits = "ok" if r["bits_ok"] else "MISMATCH"
    else:
        bits = "=tree" if r.get("bits_equal_declared") else "-"
    second = next((r[k] for k in SECOND_COLUMN if k in r), float("nan"))  # older documents lack it
    counts = "".join(f"{r.get(k, '-')!s:>7s}" for k in ("iters", "warmup"))  # older: no warmup
    return (
        f"{r['bytes']:>12d}  {r['realization']:<25s}{r['t_min_us']:>11.2f}{r['t_avg_us']:>11.2f}"
        f"{r['t_max_us']:>11.2f}{r['algbw_GBs']:>13.3f}{r['busbw_GBs']:>13.3f}{r['ratio']:>8.2f}"
        f"{second:>8.2f}{counts}  {bits}"
    )


#: The CSV's columns, in order: the JSON row's fields (the second ratio's name depends on the mode).
CSV_COLUMNS = (
    "bytes",
    "realization",
    "requested",
    "chosen",
    "iters",
    "warmup",
    "t_min_us",
    "t_avg_us",
    "t_max_us",
    "t_iter_min_us",
    "t_iter_max_us",
    "algbw_GBs",
    "busbw_GBs",
    "ratio",
    "{second}",
    "bits_ok",
    "bits_equal_declared",
)


def csv_columns(mode: str = "allreduce") -> list:
    return [c.replace("{second}", REFERENCES[mode][2]) for c in CSV_COLUMNS]


class TableOutput:
    """`--format table` (the default): the '#' preamble, one line a row as each size ends, and
    the notes ('#' lines) in the table."""

    def __init__(self, mode: str, say):
        self.mode, self.say = mode, say

    def begin(self, preamble_lines):
        for line in preamble_lines:
            self.say(line)

    def row(self, r: dict):
        self.say(table_line(r))

    def note(self, line: str):
        self.say(line)

    def end(self, doc: dict):
        pass


class CsvOutput(TableOutput):
    """`--format csv`: a header line of column names (CSV_COLUMNS), then one line a row; nothing
    else on stdout (the notes go to stderr), so the output reads as CSV as it is."""

    def begin(self, preamble_lines):
        self.say(self._line(csv_columns(self.mode)))

    def row(self, r: dict):
        self.say(self._line(["" if r.get(c) is None else r[c] for c in csv_columns(self.mode)]))

    def note(self, line: str):
        print(line, file=sys.stderr, flush=True)

    @staticmethod
    def _line(values) -> str:
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(values)
        return out.getvalue()


class JsonOutput(CsvOutput):
    """`--format json`: the whole document (as --json writes it) on stdout at the end; the notes
    go to stderr."""

    def begin(self, preamble_lines):
        pass

    def row(self, r: dict):
        pass

    def end(self, doc: dict):
        self.say(json.dumps(doc, indent=1))


FORMATS = {"table": TableOutput, "csv": CsvOutput, "json": JsonOutput}


def finish_model(model: dict, results: list, p: int) -> str:
    """Adds the best bandwidth realization (halving or scatter) at the model's size to `model`
    and returns the model's line ('' when no such realization ran)."""
    size = model["bytes"]
    sc = [r for r in results if r["bytes"] == size and r.get("chosen") in ("scatter", "halving")]
    best = min(sc, key=lambda r: r["t_max_us"]) if sc else None
    model["bandwidth_t_max_us"] = best["t_max_us"] if best else None
    model["bandwidth_realization"] = best["chosen"] if best else None
    model["ratio"] = (best["t_max_us"] / (model["total"] * 1e6)) if best else None
    if best is None:
        return ""
    return (
        f"# memory-bandwidth model at {human(size)}B p={p}: copy {model['copy_in'] * 1e6:.0f} us + "
        f"add {model['add'] * 1e6:.0f} us + copy {model['copy_out'] * 1e6:.0f} us = {model['total'] * 1e6:.0f} us "
        f"(np.copyto of {model['moved_elements']} + kernel add of {p} x {model['share_elements']} + np.copyto of "
        f"{model['moved_elements']} elements, all ranks at once); {best['realization']} {best['t_max_us']:.0f} us = "
        f"{model['ratio']:.2f} x model"
    )


def series(doc: dict) -> dict:
    """{requested name: its rows in size order}, in the order the variants ran."""
    out = {}
    for r in doc["results"]:
        out.setdefault(r["requested"], []).append(r)
    return out


def figure(doc: dict):
    """The plot of a document (matplotlib, no pyplot state): t_max against size with the spread
    shaded above, the ratio to MPI_Allreduce with a line at 1.0 below."""
    from matplotlib.figure import Figure  # optional: pip install alpha_mpi[plot]

    fig = Figure(figsize=(7.5, 7.5))
    ax, rx = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    band = next((k for k in BAND if all(k in r for r in doc["results"])), None)
    for name, rows in series(doc).items():
        x = [r["bytes"] for r in rows]
        (line,) = ax.plot(x, [r["t_max_us"] for r in rows], marker="o", ms=3, label=name)
        if band:
            hi = band.replace("min", "max")
            ax.fill_between(
                x, [r[band] for r in rows], [r[hi] for r in rows], color=line.get_color(), alpha=0.15
            )
        if name != "MPI_Allreduce":
            rx.plot(x, [r["ratio"] for r in rows], marker="o", ms=3, color=line.get_color(), label=name)
    rx.axhline(1.0, color="black", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    for a in (ax, rx):
        a.set_yscale("log")
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("t_max [us]")
    rx.set_ylabel("t_max / t_max(MPI_Allreduce)")
    rx.set_xlabel("bytes")
    m, c = doc["machine"], doc["config"]
    ax.set_title(
        f"allreduce, p={m['p']}, MPI_Allreduce: {c['mpi_allreduce_algorithm']}, stat={c['stat']}"
        + (f"\nshaded: {BAND[band]}" if band else ""),
        fontsize=10,
    )
    ax.legend(fontsize=8)
    rx.legend(fontsize=8, title="< 1: faster than MPI_Allreduce", title_fontsize=8)
    fig.tight_layout()
    return fig


def plot(doc: dict, path: str) -> str:
    """Write the plot of `doc` to `path`; returns the line to print."""
    try:
        fig = figure(doc)
    except ImportError:
        return f"# plot skipped: matplotlib is not installed (pip install 'alpha_mpi[plot]'); wanted {path}"
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as e:  # checked before the run; a disk that filled since is still named
        from ...refusals import Refusal

        raise Refusal("output-unwritable", f"--plot {path}: cannot write it: {e.strerror or e}")
    return f"# plot written to {path}"
