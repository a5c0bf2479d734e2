"""Run the commands of the manual's marked samples and write their output in place (issue 32).

    python tools/doc_samples.py                  # rewrite every marked sample in README.md, docs/*.md
    python tools/doc_samples.py --check          # exit 1 when a sample's output is stale
    python tools/doc_samples.py --check --without torch     # the samples that need no torch
    python tools/doc_samples.py --check --only-needs torch  # the torch ones (run with torch installed)

A sample is a fenced ```text block whose lines starting `$ ` are commands, each followed by its
output, right after a marker comment; the tool writes one caption line below it:

    <!-- doc-sample: holds=every-machine -->          or  holds=this-machine [needs=torch]
    ```text
    $ mpiexec -n 2 alpha-mpi train --steps 50 | grep digest
    state digest (params, optimizer, step, rng): 3f...
    ```
    *Output of the commands above ... (the caption: which machines the digests hold on)*

Each command runs with bash in the repository root, the interpreter's directory first on PATH
(`python`, `mpiexec`, `alpha-mpi` of this environment), one BLAS/OpenMP thread
(OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=1, as tests/run-all.sh), the built-in
cost model calibration (ALPHA_MPI_CALIBRATION unset: the quickstart prints the model's
estimates), and `/tmp/` in a command replaced by a fresh directory of this run (a checkpoint
directory never carries over).
A command that exits non-zero fails the run. Identical commands run once per invocation.

`holds=every-machine`: the output is the same on every machine (the combine, pure planning, a
machine-independent model): `--check` always compares it. `holds=this-machine`: it depends on the
compute identity (a model computed with BLAS or torch) or the MPI library; the tool records the
machine key it was produced under (`machine=`: the compute identity's digest, with torch's fields
for `needs=torch`, and the MPI library's version line) and `--check` compares it only on a machine
with the same key, saying so where it skips. Development tool: nothing in the package imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- doc-sample: (?P<attrs>[^>]*?) -->$")
CAPTION = "*Output of the commands above"
LIMIT = 600  # seconds a command may run


@dataclass
class Sample:
    """One marked block: its file, the line of its marker, its attributes, its commands."""

    path: Path
    start: int  # index of the marker line
    end: int  # index just past the caption line (or the closing fence when there is none yet)
    attrs: dict
    commands: list


def attributes(text: str) -> dict:
    out = {}
    for word in text.split():
        key, _, value = word.partition("=")
        out[key] = value
    if out.get("holds") not in ("every-machine", "this-machine"):
        raise SystemExit(f"doc-sample marker {text!r}: holds must be every-machine or this-machine")
    return out


def find(path: Path) -> list[Sample]:
    lines = path.read_text().split("\n")
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "```text":
            raise SystemExit(f"{path}:{i + 1}: a doc-sample marker must be followed by a ```text block")
        close = next(j for j in range(i + 2, len(lines)) if lines[j] == "```")
        commands = [x[2:] for x in lines[i + 2 : close] if x.startswith("$ ")]
        if not commands:
            raise SystemExit(f"{path}:{i + 1}: the sample holds no `$ ` command")
        end = close + 1
        if end < len(lines) and lines[end].startswith(CAPTION):
            end += 1
        found.append(Sample(path, i, end, attributes(m.group("attrs")), commands))
    return found


def environment() -> dict:
    bindir = os.path.dirname(sys.executable)
    # The built-in cost model calibration: a sample that prints the model's estimates
    # (quickstart's realization line) then reads the same numbers on every machine.
    here = {k: v for k, v in os.environ.items() if k != "ALPHA_MPI_CALIBRATION"}
    return {
        **here,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def machine_key(torch: bool) -> str:
    """The compute identity's digest and the MPI library's version line, hashed: what a
    this-machine sample's output depends on."""
    code = (
        "import alpha_mpi; e = alpha_mpi.environment(torch=%r); print(e['compute']['digest']); "
        "print(e['mpi']['library'])" % torch
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment(), check=True
    )
    return hashlib.sha256(r.stdout.encode()).hexdigest()[:16]


class Runner:
    """Runs commands (each once per invocation) in the repository root."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="doc-samples-")
        self.done: dict[str, str] = {}

    def run(self, command: str) -> str:
        if command not in self.done:
            real = command.replace("/tmp/", self.tmp + "/")
            r = subprocess.run(
                ["timeout", "-k", "5", str(LIMIT), "bash", "-o", "pipefail", "-c", real],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=environment(),
            )
            if r.returncode not in (0,):
                raise SystemExit(f"doc sample command failed ({r.returncode}): {command}\n{r.stderr[-2000:]}")
            self.done[command] = r.stdout.rstrip("\n")
        return self.done[command]


def caption(attrs: dict, path: Path) -> str:
    link = "same-bits.md" if path.parent.name == "docs" else "docs/same-bits.md"
    if attrs["holds"] == "every-machine":
        return (
            f"{CAPTION} (`python tools/doc_samples.py` runs them); it holds on every machine "
            f"([same bits on every machine]({link})).*"
        )
    return (
        f"{CAPTION} (`python tools/doc_samples.py` runs them) on one machine (key {attrs['machine']}: its compute "
        "identity and MPI library); its digests hold where both are the same (`alpha-mpi env`) "
        f"([same bits on every machine]({link})).*"
    )


def render(sample: Sample, runner: Runner, keys: dict) -> list[str]:
    attrs = dict(sample.attrs)
    if attrs["holds"] == "this-machine":
        attrs["machine"] = keys[attrs.get("needs") == "torch"]
    body = []
    for c in sample.commands:
        body.append(f"$ {c}")
        out = runner.run(c)
        if out:
            body += out.split("\n")
    marker = "<!-- doc-sample: " + " ".join(f"{k}={v}" for k, v in attrs.items()) + " -->"
    return [marker, "```text", *body, "```", caption(attrs, sample.path)]


def available(sample: Sample) -> bool:
    """What a sample needs (`needs=torch`) imports here."""
    import importlib.util

    needs = sample.attrs.get("needs")
    return needs is None or importlib.util.find_spec(needs) is not None


def selected(sample: Sample, a) -> bool:
    needs = sample.attrs.get("needs")
    if a.without and needs == a.without:
        return False
    return not (a.only_needs and needs != a.only_needs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--check", action="store_true", help="compare, write nothing; exit 1 when a sample is stale"
    )
    p.add_argument("--without", default=None, help="skip the samples that need this (torch)")
    p.add_argument("--only-needs", default=None, help="only the samples that need this (torch)")
    p.add_argument("files", nargs="*", type=Path, help="default: README.md and docs/*.md")
    a = p.parse_args(argv)
    files = [f.resolve() for f in a.files] or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    runner, keys, stale, skipped = Runner(), {}, [], []
    for path in files:
        samples = [s for s in find(path) if selected(s, a)]
        if not samples:
            continue
        lines = path.read_text().split("\n")
        for s in reversed(samples):  # from the bottom, so earlier line numbers stay right
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            where = f"{shown}:{s.start + 1}"
            if not available(s):
                skipped.append(f"{where} (needs {s.attrs['needs']}, which does not import here)")
                continue
            torch = s.attrs.get("needs") == "torch"
            if torch not in keys:
                keys[torch] = machine_key(torch)
            if a.check and s.attrs["holds"] == "this-machine" and s.attrs.get("machine") != keys[torch]:
                skipped.append(
                    f"{where} (produced on machine {s.attrs.get('machine')}; this is {keys[torch]})"
                )
                continue
            new = render(s, runner, keys)
            if lines[s.start : s.end] != new:
                stale.append(where)
                lines[s.start : s.end] = new
        if not a.check:
            path.write_text("\n".join(lines))
    for s in skipped:
        print(f"skipped: {s}")
    if a.check:
        for s in stale:
            print(f"stale: {s} (run python tools/doc_samples.py)")
        return 1 if stale else 0
    print(f"rewrote {len(stale)} sample(s)" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
