"""The command line under bad input: every input of the adversarial round's list is named (usage
error 2 or refusal 3), and a fuzz over the commands' options (hypothesis) never ends in a
traceback or an exit status other than 0, 2 or 3.

The fuzz runs `alpha_mpi.cli.main` in this process (one rank, MPI as a singleton) so that it can
afford many examples; the listed inputs also run as real commands under a hard timeout.

Hypothesis runs derandomized by default (the profile in conftest.py): the same examples on every
run. Every failure a randomized run (HYPOTHESIS_PROFILE=random) has found is kept below as an
explicit `@example`, so each stays tested whatever the draw.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from alpha_mpi.cli import main

FUZZ_MODELS = """
from alpha_mpi.learning import MLP


def good(inputs, classes):
    return MLP(inputs, 4, classes)


def one_argument(inputs):
    return MLP(inputs, 4, 3)


def keyword_only(*, inputs, classes):
    return MLP(inputs, 4, classes)


def not_a_model(inputs, classes):
    return object()
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad and good inputs on disk, by name; the folder is also the fuzz's working directory."""
    d = tmp_path_factory.mktemp("fuzz")
    (d / "fuzz_models.py").write_text(FUZZ_MODELS)
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "truncated.json").write_text('{"benchmark": "allreduce", "machine": {')
    (d / "list.json").write_text("[1, 2, 3]")
    rows = {"benchmark": "allreduce", "machine": {"p": 2}, "config": {"mpi_allreduce_algorithm": "auto"}}
    (d / "rows.json").write_text(json.dumps({**rows, "results": [{"bytes": 8}]}))
    (d / "sweep.json").write_text(json.dumps({"benchmark": "allreduce-sweep", "runs": 3}))
    (d / "calibration.json").write_text(json.dumps({"alpha": -1, "beta": "x", "gamma": None}))
    np.savez(d / "bad.npz", X=np.ones((10, 3)), labels=np.zeros(10))
    np.savez(d / "nan.npz", X=np.full((10, 3), np.nan), y=np.zeros(10, dtype=np.int64))
    (d / "plain.txt").write_text("not a checkpoint\n")
    os.mkfifo(d / "fifo")
    return d


PATHS = ["", " ", "/dev/null/x", "/dev/full", "/dev/null", "deep.json", "truncated.json", "list.json",
         "rows.json", "sweep.json", "calibration.json", "bad.npz", "nan.npz", "plain.txt", "fifo", "."]  # fmt: skip
INTS = ["0", "-1", "1", "3", "1e12", "1000000000000", "10" * 40, "x", "", "nan", "0x10", "2.5"]
REALS = ["0", "-1", "nan", "inf", "1e308", "1e-320", "x", "", "0.5"]
TOPOLOGIES = [
    "pairwise",
    "star",
    "star:1",
    "star:-1",
    "star:99",
    "hierarchy:0",
    "hierarchy:2",
    "ring",
    "",
    "x:y:z",
]

# Each command: the arguments that keep a valid run small, then the options the fuzz draws from.
TRAIN_BASE = ["train", "--hidden", "4", "--steps", "1", "--slots", "2", "--batch", "8", "--log-every", "0"]
TRAIN = {
    "--steps": ["0", "-1", "2", "1e12", "x", ""],
    "--batch": INTS,
    "--slots": INTS,
    "--hidden": INTS,
    "--seed": ["-1", "x", "10" * 40, "5"],
    "--lr": REALS,
    "--momentum": REALS + ["1", "0.99"],
    "--optimizer": ["adam", "sgd", "x"],
    "--topology": TOPOLOGIES,
    "--partition": ["none", "state", "grads", "params", "x"],
    "--timeout": REALS + ["soon"],
    "--model": [
        "",
        ":",
        "a:b:c",
        "nosuch_module:f",
        "fuzz_models:missing",
        "fuzz_models:one_argument",
        "fuzz_models:keyword_only",
        "fuzz_models:not_a_model",
        "fuzz_models:good",
    ],  # fmt: skip
    "--data": PATHS,
    "--json": PATHS + ["out.json"],
    "--plot": PATHS + ["out.png", "/dev/null/x.png"],
    "--checkpoint-dir": PATHS + ["ck", "/dev/null/ck", "plain.txt/ck"],
    "--checkpoint-every": ["0", "-1", "1", "x"],
    "--resume-from": PATHS,
    "--log-every": ["0", "-1", "1", "x"],
}
TRAIN_FLAGS = ["--resume", "--adopt-lr", "--adopt-contract"]
BENCH_TRAIN_BASE = [
    "bench",
    "train",
    "--hidden",
    "4",
    "--steps",
    "1",
    "--warmup",
    "0",
    "--slots",
    "2",
    "--batch",
    "8",
]
BENCH_TRAIN = {
    "--steps": ["0", "-1", "x", "1e12"],
    "--warmup": ["-1", "0", "x"],
    "--block": ["0", "-1", "1", "x"],
    "--slots": INTS,
    "--batch": INTS,
    "--hidden": INTS,
    "--topology": TOPOLOGIES,
    "--partition": ["none", "params", "x"],
    "--optimizer": ["sgd", "x"],
    "--json": PATHS + ["out.json"],
}
ALLREDUCE_BASE = [
    "bench",
    "allreduce",
    "--sizes",
    "8",
    "--iters",
    "1",
    "--warmup",
    "0",
    "--realizations",
    "tree",
]
ALLREDUCE = {
    "--sizes": ["", "0", "12", "-8", "8:4", "x", "8,16", "1K", "8:", "1e3", "1000G"],
    "--iters": ["0", "-1", "x", "2"],
    "--min-iters": ["0", "-1", "x"],
    "--warmup": ["-1", "x"],
    "--realizations": ["", "bogus", "auto", "tree,scatter", ",,"],
    "--topology": TOPOLOGIES,
    "--slots-per-rank": INTS,
    "--segment": ["0", "-1", "x", "1"],
    "--oracle": ["-1", "0", "x"],
    "--calibration": PATHS,
    "--stat": ["x", "median"],
    "--model-size": ["x", "0", "8"],
    "--json": PATHS + ["out.json"],
    "--plot": PATHS + ["out.png", "x.jpg", "/dev/null/x.png"],
    "--format": ["table", "csv", "json", "", "xml"],
}
KERNEL_BASE = ["bench", "kernel", "--sizes", "1000", "--ks", "2", "--repeat", "1", "--model-shape", "2,3,4,2"]
KERNEL = {
    "--sizes": ["", "0", "-1", "1.5", "1e12", "x", "1000,2000", ","],
    "--ks": ["", "0", "65", "x", "2,3"],
    "--repeat": ["0", "-1", "x", "2"],
    "--model-shape": ["", "0,1,1,1", "1,2,3", "x", "3,2,5,1", "1,1,1,4097"],
    "--json": PATHS + ["out.json"],
}
SUMMARY_FILES = PATHS


def run_cli(argv, cwd):
    """(exit status, stdout, stderr) of `alpha-mpi ARGV` in this process, in `cwd`."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)

    def hang(signum, frame):  # a blocked open or read fails the example instead of the suite
        raise Hung(f"alpha-mpi {' '.join(argv)} still running after {LIMIT} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(LIMIT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
                rc = e.code if isinstance(e.code, int) else 2
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old)
    return rc, out.getvalue(), err.getvalue()


class Hung(BaseException):
    """Raised by the alarm: a BaseException, so that the command's own handlers let it through."""


LIMIT = 60  # seconds one fuzzed command may take (the valid ones take well under one)


def options(table, flags=()):
    """A strategy of option lists drawn from `table` (flag -> values) and the bare `flags`."""
    pair = st.sampled_from(sorted(table)).flatmap(lambda k: st.tuples(st.just(k), st.sampled_from(table[k])))
    return st.tuples(
        st.lists(pair, max_size=4), st.lists(st.sampled_from(list(flags) or [""]), max_size=2 if flags else 0)
    ).map(lambda t: [x for k, v in t[0] for x in (k, v)] + [f for f in t[1] if f])


def named(rc, out, err, argv):
    assert rc in (0, 2, 3), (rc, argv, err[-3000:])
    assert "Traceback" not in out + err, (argv, err[-3000:])
    if rc == 3:  # a refusal says its code and what to do
        assert "error [" in err and "what to do:" in err, (argv, err[-2000:])
    if rc == 2:  # a usage error, or the help printed for a missing command
        assert "error" in err or "usage:" in out, (argv, err[-2000:])


FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def fresh(files, tmp_path_factory):
    """A new working directory holding copies of the inputs: a command that writes (--json,
    --merge, checkpoints) never changes what a later example reads."""
    cwd = tmp_path_factory.mktemp("run")
    for name in os.listdir(files):
        if name == "fifo":
            os.mkfifo(cwd / name)
        else:
            shutil.copy(files / name, cwd / name)
    return cwd


@FUZZ
@given(opts=options(TRAIN, TRAIN_FLAGS))
def test_fuzz_train(files, tmp_path_factory, opts):
    argv = TRAIN_BASE + opts
    named(*run_cli(argv, fresh(files, tmp_path_factory)), argv)


@FUZZ
@given(opts=options(BENCH_TRAIN))
def test_fuzz_bench_train(files, tmp_path_factory, opts):
    argv = BENCH_TRAIN_BASE + opts
    named(*run_cli(argv, fresh(files, tmp_path_factory)), argv)


@FUZZ
@given(opts=options(ALLREDUCE, ["--functional", "--no-gloo", "--spin", "--reduce-scatter", "--targets"]))
# found by hypothesis: a FileNotFoundError traceback, rc 1 (issue 45 item 7)
@example(opts=["--plot", "/nonexistent/x.png"])
def test_fuzz_bench_allreduce(files, tmp_path_factory, opts):
    argv = ALLREDUCE_BASE + opts
    named(*run_cli(argv, fresh(files, tmp_path_factory)), argv)
    os.environ.pop("ALPHA_MPI_SPIN", None)  # --spin sets it for the rest of the process


@FUZZ
@given(opts=options(KERNEL))
def test_fuzz_bench_kernel(files, tmp_path_factory, opts):
    argv = KERNEL_BASE + opts
    named(*run_cli(argv, fresh(files, tmp_path_factory)), argv)


@FUZZ
@given(
    paths=st.lists(st.sampled_from(SUMMARY_FILES), min_size=0, max_size=3),
    merge=st.sampled_from([None] + PATHS),
)
def test_fuzz_bench_summary(files, tmp_path_factory, paths, merge):
    argv = ["bench", "summary", *paths] + ([] if merge is None else ["--merge", merge])
    named(*run_cli(argv, fresh(files, tmp_path_factory)), argv)


@FUZZ
@given(
    action=st.sampled_from(["verify", "inspect", "bogus", ""]),
    target=st.sampled_from(PATHS),
    extra=st.lists(st.sampled_from(["--all", "--json", "--bogus"]), max_size=2),
)
def test_fuzz_checkpoint(files, action, target, extra):
    argv = ["checkpoint", action, target, *extra]
    named(*run_cli(argv, files), argv)


@FUZZ
@given(
    argv=st.lists(
        st.sampled_from(["", "-x", "--version", "--help", "nonsense", "bench", "train", "-h"]), max_size=3
    )
)
def test_fuzz_top_level(files, argv):
    if argv[:1] == ["train"] and "-h" not in argv and "--help" not in argv:
        return  # a full default training run; train's options are fuzzed above
    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] == "train" and not {"-h", "--help"} & set(argv):
        return
    named(*run_cli(argv, files), argv)


# ------------------------------------------------------------------- the listed inputs, as commands
LISTED = [
    (TRAIN_BASE + ["--model", "fuzz_models:one_argument"], 3, "[model-factory]"),
    (TRAIN_BASE + ["--model", "fuzz_models:keyword_only"], 3, "[model-factory]"),
    (TRAIN_BASE + ["--batch", "1e12"], 2, "--batch"),
    (TRAIN_BASE + ["--batch", "1000000000000"], 2, "samples"),
    (ALLREDUCE_BASE + ["--calibration", "deep.json"], 3, "[calibration-invalid]"),
    (["bench", "train", "--steps", "0"], 2, "--steps"),
    (["bench", "summary", "truncated.json"], 3, "[bench-document-invalid]"),
    (["bench", "summary", "deep.json"], 3, "[bench-document-invalid]"),
    (["bench", "summary", "rows.json"], 3, "[bench-document-invalid]"),
    (["bench", "summary", "fifo"], 3, "not a regular file"),
    (TRAIN_BASE + ["--json", "/dev/full"], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--json", "/dev/full"], 3, "[output-unwritable]"),
    (TRAIN_BASE + ["--checkpoint-dir", ""], 2, "--checkpoint-dir"),
    (["checkpoint", "verify", ""], 2, "empty"),
    (TRAIN_BASE + ["--data", "fifo"], 3, "[data-invalid]"),
    (TRAIN_BASE + ["--json", "fifo"], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--calibration", "fifo"], 3, "[calibration-invalid]"),
    (ALLREDUCE_BASE + ["--json", "fifo"], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--plot", "/dev/null/x.png"], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--plot", "/dev/full"], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--plot", "."], 3, "[output-unwritable]"),
    (ALLREDUCE_BASE + ["--json", "plain.txt/x.json"], 3, "[output-unwritable]"),
    (TRAIN_BASE + ["--plot", "/dev/null/x.png"], 3, "[output-unwritable]"),
    (["bench", "kernel", "--sizes", "1000", "--json", "/dev/full"], 3, "[output-unwritable]"),
    (["bench", "summary", "rows.json", "--merge", "fifo"], 3, "[output-unwritable]"),
    (["bench", "dot", "--lengths", "100", "--json", "."], 3, "[output-unwritable]"),
    (["bench", "calibrate", "--out", "fifo"], 3, "[output-unwritable]"),
    (["bench", "train", "--steps", "1", "--json", "plain.txt/x.json"], 3, "[output-unwritable]"),
]


@pytest.mark.parametrize("argv,rc,text", LISTED, ids=[" ".join(a[-2:]) or "empty" for a, _, _ in LISTED])
def test_the_listed_inputs_are_named_by_the_real_command(files, argv, rc, text):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(files), os.environ.get("PYTHONPATH")]))
    )
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=files,
        env=env,
    )
    assert r.returncode == rc and text in r.stderr and "Traceback" not in r.stderr, (
        argv,
        r.returncode,
        r.stderr,
    )


def test_a_deeply_nested_calibration_in_the_environment_is_refused_by_train(files):
    env = dict(os.environ, ALPHA_MPI_CALIBRATION=str(files / "deep.json"))
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", *TRAIN_BASE], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 3 and "[calibration-invalid]" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_fuzz_is_derandomized_and_keeps_no_database():
    """The profile conftest.py loads by default: the same examples on every run and in every
    checkout, none replayed from .hypothesis/ (where a stored failure made one checkout fail and
    a fresh clone pass). HYPOTHESIS_PROFILE=random draws anew, on demand."""
    if (os.environ.get("HYPOTHESIS_PROFILE") or "derandomized") != "derandomized":
        pytest.skip("HYPOTHESIS_PROFILE chose another profile for this run")
    for s in (settings.default, FUZZ):
        assert s.derandomize is True and s.database is None, s
