"""The jobs/ scripts under bash 4.2's rules, without Slurm (issue 45 item 9).

Under `set -u`, bash before 4.4 (the system bash of RHEL/CentOS 7 clusters) calls `"${A[@]}"` of
an array without elements an unbound variable and stops the script; 4.4 and later expand it to
nothing. So every expansion of an array that can be empty (`read -r -a EXTRA <<< "${ALPHA_X:-}"`)
must be guarded: `${A[@]+"${A[@]}"}` (or `${A[*]-}` inside a string).

- The static check reads each script: which arrays can be empty (filled by `read -a` from a
  string that may be blank, or `A=()`, and never given a literal word unconditionally), and
  whether each of their expansions is guarded. It fails on the scripts as they were (EXTRA,
  PYTEST_ARGS bare), whatever bash runs the tests.
- The runs start each script with every optional argument list empty (ALPHA_TRAIN_ARGS,
  ALPHA_BENCH_ARGS unset, ALPHA_PYTEST_ARGS blank) under the scripts' own `set -u`, with
  stand-ins for srun and mpiexec that record the argument vector they were given: the guard must
  add no argument (not even an empty one), and a non-empty list must pass through word by word.
  `ALPHA_TEST_BASH=/path/to/bash-4.2` runs them under that bash as well.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

JOBS = Path(ROOT) / "jobs"
SCRIPTS = ["train.sbatch", "bench.sbatch", "mpirun-train.sh", "conformance.sbatch"]
BASHES = ["bash"] + [b for b in [os.environ.get("ALPHA_TEST_BASH")] if b]


# ------------------------------------------------------------------------------- the static check
def _strip_expansions(text: str) -> str:
    """`text` without its parameter expansions (`${...}`, nested ones too, and `$NAME`)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("${", i):
            depth, i = 1, i + 2
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
        elif text[i] == "$":
            m = re.match(r"\$(\w+|.)", text[i:])
            i += len(m.group(0)) if m else 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _has_literal_word(text: str) -> bool:
    return bool(_strip_expansions(text).replace('"', "").replace("'", "").split())


def _code_lines(script: str) -> list:
    return [line for line in script.splitlines() if not line.lstrip().startswith("#")]


def possibly_empty_arrays(script: str) -> set:
    """The arrays of `script` that can be empty where they are expanded: filled by `read -a`
    from a string without a literal word, or by `A=()`, and never given a literal word by an
    assignment or an unconditional `A+=(...)`."""
    filled, nonempty = set(), set()
    for line in _code_lines(script):
        for m in re.finditer(r"read\s+(?:-\w+\s+)*-a\s+(\w+)\s*<<<\s*(.*)$", line):
            filled.add(m.group(1))
            if _has_literal_word(m.group(2)):
                nonempty.add(m.group(1))
        m = re.match(r"\s*(?:\w+\)\s*)?(\w+)(\+?)=\((.*)\)\s*(?:;;)?\s*$", line)
        if m:
            filled.add(m.group(1))
            if _has_literal_word(m.group(3)):
                nonempty.add(m.group(1))
    return filled - nonempty


GUARDED = r"\$\{{{a}\[[@*]\][-+:][^{{}}]*(?:\$\{{{a}\[[@*]\]\}}[^{{}}]*)?\}}"


def unguarded_expansions(script: str) -> list:
    """(line number, text) of every bare expansion (`"${A[@]}"`, `${A[*]}`, `$A`, `${A}`) of a
    possibly empty array A of `script`."""
    found = []
    arrays = possibly_empty_arrays(script)
    for no, line in enumerate(script.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for a in arrays:
            rest = re.sub(GUARDED.format(a=re.escape(a)), "", line)
            bare = rf"\$\{{{a}\[[@*]\]\}}|\$\{{{a}\}}|\${a}(?![\w\[])"
            if re.search(bare, rest):
                found.append((no, line.strip()))
    return found


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_possibly_empty_array_expansion_is_guarded(name):
    script = (JOBS / name).read_text()
    assert re.search(r"^set -\w*u", script, re.M), f"{name} does not run under set -u"
    assert not unguarded_expansions(script), (
        f'{name}: unguarded under bash 4.2\'s set -u (use ${{A[@]+"${{A[@]}}"}}): {unguarded_expansions(script)}'
    )


def test_the_guard_check_tells_empty_arrays_and_bare_expansions_apart():
    """The check itself: on the scripts, the arrays a blank variable empties are found and the
    launcher and command arrays (which always hold a literal word) are not; a bare expansion is
    named, every guarded form is not."""
    got = {name: possibly_empty_arrays((JOBS / name).read_text()) for name in SCRIPTS}
    assert got == {
        "train.sbatch": {"EXTRA"},
        "bench.sbatch": {"EXTRA"},
        "mpirun-train.sh": {"EXTRA"},
        "conformance.sbatch": {"PYTEST_ARGS"},
    }
    head = 'set -u\nread -r -a E <<< "${X:-}"\nread -r -a L <<< "${M:-mpiexec} -n $NP"\nC=()\n'
    assert possibly_empty_arrays(head) == {"E", "C"}
    assert possibly_empty_arrays(head + "C+=(--x)\n") == {"E"}
    assert possibly_empty_arrays(head + '[ -n "$Y" ] && C+=(--x)\n') == {"E", "C"}  # conditional
    for bare in ('cmd "${E[@]}"', "cmd ${E[@]}", 'echo "${E[*]}"', "cmd $E", 'A+=("${E[@]}")', 'x "${C[@]}"'):
        assert unguarded_expansions(head + bare + "\n"), bare
    for guarded in ('cmd ${E[@]+"${E[@]}"}', 'echo "${E[*]-}"', 'A+=(${E[@]+"${E[@]}"})', '"${L[@]}" x'):
        assert not unguarded_expansions(head + guarded + "\n"), guarded


# ----------------------------------------------------------------------------------------- the runs
LAUNCHER = """#!/bin/bash
# A stand-in for srun / mpiexec: records its argument vector (NUL-separated), writes the file a
# --json names (bench.sbatch checks it), exits 0.
printf '%s\\0' "$@" > "{record}"
prev=
for a in "$@"; do [ "$prev" = --json ] && echo '{{}}' > "$a"; prev=$a; done
exit 0
"""


def run_script(tmp_path, bash, name, launcher, **env):
    """`bash jobs/NAME` as Slurm's batch shell (or a user) would start it, with the stand-in
    launcher (`srun` on PATH, or ALPHA_MPIEXEC); returns (CompletedProcess, the launcher's argv)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    record = tmp_path / "argv"
    for tool in ("srun", "fake-mpiexec"):
        (bin_ / tool).write_text(LAUNCHER.format(record=record))
        (bin_ / tool).chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ALPHA_", "SLURM_"))}
    env = dict(
        keep,
        PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}",
        SLURM_JOB_ID="4711",
        ALPHA_NP="2",
        ALPHA_LAUNCHER=launcher,
        ALPHA_MPIEXEC=str(bin_ / "fake-mpiexec"),
        **env,
    )
    r = subprocess.run(
        ["timeout", "-k", "5", "60", bash, str(JOBS / name)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    argv = record.read_bytes().split(b"\0")[:-1] if record.exists() else None
    return r, None if argv is None else [a.decode() for a in argv]


def _launch_words(launcher):
    return ["--mpi=pmi2", "--ntasks=2"] if launcher == "srun" else ["-n", "2"]


@pytest.mark.parametrize("bash", BASHES)
@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
@pytest.mark.parametrize("extra", [None, "--seed 5  --log-every 0"])
def test_train_sbatch_with_and_without_extra_arguments(tmp_path, bash, launcher, extra):
    ck = tmp_path / "run" / "ck"
    env = {"ALPHA_TRAIN_CMD": "trainer", "ALPHA_CKPT_DIR": str(ck)}
    if extra is not None:
        env["ALPHA_TRAIN_ARGS"] = extra
    r, argv = run_script(tmp_path, bash, "train.sbatch", launcher, **env)
    assert r.returncode == 0 and "unbound variable" not in r.stderr, r.stdout + r.stderr
    want = [
        "trainer",
        "--steps",
        "1000",
        "--checkpoint-dir",
        str(ck),
        "--checkpoint-every",
        "100",
        "--resume",
    ]
    assert argv == _launch_words(launcher) + want + (extra or "").split(), argv


@pytest.mark.parametrize("bash", BASHES)
@pytest.mark.parametrize("extra", [None, "--sizes 8,1K"])
def test_mpirun_train_with_and_without_extra_arguments(tmp_path, bash, extra):
    ck = tmp_path / "ck"
    env = {"ALPHA_TRAIN_CMD": "trainer", "ALPHA_CKPT_DIR": str(ck), "ALPHA_STEPS": "7"}
    if extra is not None:
        env["ALPHA_TRAIN_ARGS"] = extra
    r, argv = run_script(tmp_path, bash, "mpirun-train.sh", "mpiexec", **env)
    assert r.returncode == 0 and "unbound variable" not in r.stderr, r.stdout + r.stderr
    want = ["trainer", "--steps", "7", "--checkpoint-dir", str(ck), "--checkpoint-every", "100", "--resume"]
    assert argv == ["-n", "2"] + want + (extra or "").split(), argv


@pytest.mark.parametrize("bash", BASHES)
@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
@pytest.mark.parametrize("extra", [None, "--sizes 8 --iters 3"])
def test_bench_sbatch_with_and_without_extra_arguments(tmp_path, bash, launcher, extra):
    out = tmp_path / "out"
    env = {"ALPHA_BENCH_CMD": "bench allreduce", "ALPHA_OUT": str(out)}
    if extra is not None:
        env["ALPHA_BENCH_ARGS"] = extra
    r, argv = run_script(tmp_path, bash, "bench.sbatch", launcher, **env)
    assert r.returncode == 0 and "unbound variable" not in r.stderr, r.stdout + r.stderr
    want = ["bench", "allreduce", "--json", str(out / "bench.json")] + (extra or "").split()
    assert argv == _launch_words(launcher) + want, argv


@pytest.mark.parametrize("bash", BASHES)
@pytest.mark.parametrize("args", [" ", "-m mpi -x"])
def test_conformance_sbatch_with_blank_and_given_pytest_arguments(tmp_path, bash, args):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    r, argv = run_script(
        tmp_path,
        bash,
        "conformance.sbatch",
        "mpiexec",
        ALPHA_REPO=str(repo),
        ALPHA_CONFORMANCE="mpi",
        ALPHA_PYTEST_ARGS=args,
    )
    assert r.returncode == 0 and "unbound variable" not in r.stderr, r.stdout + r.stderr
    want = ["python", "-m", "pytest", "-p", "no:cacheprovider", "--with-mpi", *args.split(), "tests/"]
    assert argv == ["-n", "2"] + want, argv
