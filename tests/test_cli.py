"""The `alpha-mpi` command line as a new user meets it: the help, one exit-code table for every
command, quiet training, the memory and progress lines, the checkpoint table, the plan's
topology line, CLI-worded advice, and imports that run one way (cli -> tools)."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alpha_mpi import cli
from alpha_mpi.refusals import ADVICE, CLI_ADVICE, Refusal, cli_advice
from alpha_mpi.tools import _args

from conftest import alpha_command, printed_digest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--hidden", "8", "--slots", "4", "--batch", "32"]


def alpha(*args, env=None, limit=120):
    """`python -m alpha_mpi ARGS` in a fresh process (one rank, no mpiexec needed)."""
    return alpha_command(*args, limit=limit, env=None if env is None else {**os.environ, **env})


def main(capsys, *args):
    """cli.main in this process: (status, stdout, stderr); argparse's SystemExit becomes a status."""
    try:
        status = cli.main(list(args))
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


# ------------------------------------------------------------------------------------ help
def test_top_level_help_lists_every_command_on_one_line_with_examples_and_exit_codes(capsys):
    status, out, _ = main(capsys, "--help")
    assert status == 0
    for name, (_, help_text) in cli.COMMANDS.items():
        assert re.search(rf"^  {name} +{re.escape(help_text)}$", out, re.M), (name, out)
    assert "examples:" in out
    for code, meaning in _args.EXIT_CODES:
        assert re.search(rf"^ +{code}  {re.escape(meaning)}$", out, re.M), code


@pytest.mark.parametrize(
    "command", [["plan"], ["train"], ["checkpoint"], ["checkpoint", "verify"], ["checkpoint", "inspect"]]
)
def test_every_command_help_ends_with_examples(capsys, command):
    status, out, _ = main(capsys, *command, "--help")
    assert status == 0
    examples = out.split("examples:\n", 1)[1]
    assert all(
        line.startswith("  alpha-mpi ") or "alpha-mpi " in line for line in examples.splitlines() if line
    )


def test_train_help_says_which_rank_counts_give_the_same_digest(capsys):
    _, out, _ = main(capsys, "train", "--help")
    text = " ".join(out.split())
    assert "divides the slots" not in text
    assert "any P from 1 to --slots" in text
    assert "0: quiet" in text and "ALPHA_MPI_TIMEOUT or 300" in text  # the real default bound


def test_any_rank_count_up_to_the_slots_gives_the_same_digest_as_one():
    """What the help promises: 3 ranks do not divide 5 slots, and give one rank's bits."""
    from conftest import mpiexec

    if mpiexec() is None:
        pytest.skip("no mpiexec")
    args = ["--hidden", "8", "--slots", "5", "--batch", "40", "--steps", "3", "--log-every", "0"]
    one = alpha("train", *args)
    three = alpha_command("train", *args, n=3, limit=200)
    assert one.returncode == three.returncode == 0, three.stderr
    assert printed_digest(one.stdout) == printed_digest(three.stdout)


# ------------------------------------------------------------------------------ exit codes
def test_exit_codes_are_the_ones_the_library_uses():
    from alpha_mpi.execution.abort import ABORT_STATUS
    from alpha_mpi.learning import PREEMPTED

    assert _args.EXIT_ABORTED == ABORT_STATUS and _args.EXIT_PREEMPTED == PREEMPTED
    codes = [c for c, _ in _args.EXIT_CODES]
    assert codes == sorted(set(codes)) and {0, 1, 2, 3, 70, 98, 99, 130, 141} == set(codes)
    page = (ROOT / "docs" / "exit-codes.md").read_text()
    table = page.split("# Exit codes", 1)[1].split("\n#", 1)[0]
    assert [int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)] == codes


@pytest.mark.parametrize(
    "args,needle",
    [
        ([], "usage: alpha-mpi"),
        (["frobnicate"], "[usage] unknown command"),
        (["plan", "--slots", "0"], "--slots: must be >= 1"),
        (["plan", "--ranks", "0"], "--ranks: must be >= 1"),
        (["plan", "--elements", "0"], "--elements: must be >= 1"),
        (["plan", "--deliver-to", "-1"], "--deliver-to: must be >= 0"),
        (["plan", "--realization", "ring"], "invalid choice"),
        (["checkpoint"], "required: ACTION"),
        (["train", "--log-every", "-1"], "--log-every: must be >= 0"),
        (["train", "--batch", "4", "--slots", "8"], "--batch 4 is smaller than --slots 8"),
    ],
)
def test_usage_errors_exit_2_with_a_sentence(capsys, args, needle):
    status, out, err = main(capsys, *args)
    assert status == _args.EXIT_USAGE == 2 and needle in out + err, (status, out, err)
    assert "Traceback" not in err


def test_a_library_refusal_coded_usage_exits_2_with_cli_advice(tmp_path):
    r = alpha("train", *TINY, "--steps", "1", env={"ALPHA_MPI_TIMEOUT": "soon"})
    assert r.returncode == 2 and "[usage]" in r.stderr and "ALPHA_MPI_TIMEOUT" in r.stderr, r.stderr
    assert "what to do: see `alpha-mpi train --help`" in r.stderr


def test_library_refusals_exit_3_by_code(capsys, tmp_path):
    status, _, err = main(capsys, "plan", "--topology", "ring")
    assert status == _args.EXIT_REFUSAL == 3 and "[topology-invalid]" in err
    status, _, err = main(capsys, "checkpoint", "inspect", str(tmp_path / "none"))
    assert status == 3 and "[checkpoint-missing]" in err


class _PipeStream:
    """sys.stderr on a pipe's write end, recording what goes through its write()."""

    def __init__(self, fd):
        self.fd, self.calls = fd, []

    def write(self, s):
        self.calls.append(s)
        return len(s)

    def flush(self):
        pass

    def fileno(self):
        return self.fd


def test_a_refusal_is_one_write_so_two_ranks_reports_never_share_a_line(monkeypatch, tmp_path):
    """Under mpiexec every rank refuses at once into the launcher's pipes; print's two writes
    (the text, then the newline) let another rank's report land on the same line (issue 36
    item 9). The report and its newline go out in one write(2)."""
    r, w = os.pipe()
    writes, real = [], os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real(fd, data))
    monkeypatch.setattr(sys, "stderr", _PipeStream(w))
    assert cli.main(["checkpoint", "inspect", str(tmp_path / "none")]) == 3
    stream = sys.stderr
    monkeypatch.undo()
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read()
    assert stream.calls == [] and writes == [got], (stream.calls, writes)
    assert got.startswith(b"alpha-mpi: error [checkpoint-missing]") and got.count(b"\n") == 2, got
    assert got.endswith(b"\n") and b"\n  what to do: " in got


def test_a_closed_output_pipe_ends_quietly_with_141():
    p = subprocess.Popen(
        [sys.executable, "-m", "alpha_mpi", "plan", "--slots", "2048", "--ranks", "512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.readline()
    p.stdout.close()  # the reader goes away, as `| head -1` does
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == _args.EXIT_BROKEN_PIPE and "Traceback" not in err, err


# ------------------------------------------------------------------------------- advice
def test_cli_advice_names_options_and_leaves_the_python_advice_alone():
    assert set(CLI_ADVICE) <= set(ADVICE)
    for code, text in CLI_ADVICE.items():
        assert "--" in text or "alpha-mpi" in text, code  # an option or a command to run
        assert not re.search(r"\w=\S|\w\(", text), code  # no keyword arguments, no calls
    assert "--slots" in cli_advice("placement-invalid") and "owners" not in cli_advice("placement-invalid")
    assert Refusal("placement-invalid", "x").advice == ADVICE["placement-invalid"]
    assert "owners" in ADVICE["placement-invalid"]  # the Python advice still speaks the Python API
    assert cli_advice("frame-checksum") == ADVICE["frame-checksum"]  # no CLI wording: the same
    assert (
        cli_advice("usage", "plan") == "see `alpha-mpi plan --help` for the options and the values they take"
    )


def test_advice_raised_through_the_python_api_names_no_command_line_options():
    api = [c for c in CLI_ADVICE if c.startswith("checkpoint-")]
    assert len(api) >= 10
    for code in api + ["data-invalid"]:
        assert "--" not in ADVICE[code], code  # restore(), arrays: what a Python caller can change
        assert "--" in cli_advice(code), code  # the command line names its options
    assert "binary32" not in ADVICE["dtype-invalid"].split(":")[0]  # an int64 array is not binary32


@pytest.mark.parametrize("damage", ["checkpoint-corrupt", "checkpoint-shard-missing"])
def test_the_advice_for_a_damaged_step_works_when_followed(tmp_path, damage):
    """Issue 36 item 11: the advice for a damaged latest step was `--resume-from
    DIR/step-NNNNNNNN`, and a user who kept their --checkpoint-dir then met checkpoint-exists
    (the damaged step collides with the resumed run's next save). The advice, filled in as
    printed (DIR the directory, the step before, NEWDIR a new one), reaches the bits of an
    uninterrupted run."""
    ck, args = tmp_path / "ck", [*TINY, "--log-every", "0", "--checkpoint-every", "2"]
    r = alpha("train", *args, "--steps", "4", "--checkpoint-dir", ck)
    assert r.returncode == 0, r.stderr
    shard = sorted((ck / "step-00000004" / "params").glob("*.safetensors"))[0]
    if damage == "checkpoint-corrupt":
        shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    else:
        shard.unlink()
    r = alpha("train", *args, "--steps", "6", "--checkpoint-dir", ck, "--resume")
    assert r.returncode == 3 and f"[{damage}]" in r.stderr, r.stderr
    advice = r.stderr.split("what to do: ")[1]
    said = re.search(r"--resume-from DIR/step-NNNNNNNN( --checkpoint-dir NEWDIR)?", advice)
    assert said, advice
    into = tmp_path / "new" if said.group(1) else ck  # without NEWDIR a user keeps the directory
    r = alpha("train", *args, "--steps", "6", "--resume-from", ck / "step-00000002", "--checkpoint-dir", into)
    assert r.returncode == 0, r.stderr
    clean = alpha("train", *TINY, "--log-every", "0", "--steps", "6")
    assert printed_digest(r.stdout) == printed_digest(clean.stdout)


def test_refusal_on_the_command_line_prints_the_cli_advice(capsys):
    status, _, err = main(capsys, "plan", "--slots", "4", "--ranks", "4", "--deliver-to", "7")
    assert status == 3 and "[delivery-target-not-owner]" in err
    assert f"what to do: {cli_advice('delivery-target-not-owner', 'plan')}" in err
    assert "DeliverTo must name" not in err.split("what to do:")[1]


# -------------------------------------------------------------------------------- train
def _json_run(tmp_path, *args):
    out = tmp_path / "r.json"
    r = alpha("train", *TINY, *args, "--json", str(out))
    assert r.returncode == 0, r.stderr
    return r.stdout, json.loads(out.read_text())


def test_log_every_0_is_quiet_but_keeps_the_summary_and_digest(tmp_path):
    loud, res_loud = _json_run(tmp_path, "--steps", "4", "--log-every", "2")
    quiet, res_quiet = _json_run(tmp_path, "--steps", "4", "--log-every", "0")
    assert len(re.findall(r"^step ", loud, re.M)) == 2
    assert not re.search(r"^step ", quiet, re.M)
    for needle in (
        "# alpha-mpi train:",
        "# memory per rank:",
        "final loss ",
        "state digest (params, optimizer, step, rng): ",
    ):
        assert needle in quiet, needle
    assert res_quiet["digest"] == res_loud["digest"]


def test_progress_lines_say_elapsed_and_the_interval_they_cover(tmp_path):
    out, _ = _json_run(tmp_path, "--steps", "5", "--log-every", "2")
    pattern = re.compile(
        r"^step +(\d+)/5  loss [\d.]+  elapsed +([\d.]+) s  \| steps (\d+)-(\d+): \d+ samples/s, "
        r"ms/step: compute [\d.]+ combine [\d.]+ update [\d.]+$",
        re.M,
    )
    lines = pattern.findall(out)
    assert [(int(s), int(a), int(b)) for s, _, a, b in lines] == [(2, 1, 2), (4, 3, 4), (5, 5, 5)], out
    elapsed = [float(e) for _, e, _, _ in lines]
    assert elapsed == sorted(elapsed)  # from the start of training, not per interval


def _n_params(out: str) -> int:
    return int(re.search(r"# alpha-mpi train: .*?, (\d+) parameters", out).group(1))


def _memory_line_numbers(out: str) -> dict:
    line = re.search(r"^# memory per rank: (.*)$", out, re.M).group(1)
    names = ("params", "optimizer state", "gradients", "update buffers", "total")
    return {k: float(re.search(rf"{k} ([\d.]+) MiB", line).group(1)) for k in names}


@pytest.mark.parametrize(
    "optimizer,extra,state_vectors",
    [("adam", [], 2), ("sgd", ["--momentum", "0.9"], 1), ("sgd", ["--momentum", "0"], 0)],
)
def test_memory_line_counts_the_arrays_by_what_they_are(tmp_path, optimizer, extra, state_vectors):
    out, res = _json_run(tmp_path, "--steps", "1", "--optimizer", optimizer, *extra)
    n, slots = _n_params(out), 4
    want = {  # one rank, partition none: every array is n long (payloads n + 3: mass, loss, stop)
        "params": 8 * n,
        "optimizer_state": 8 * n * state_vectors,
        "gradients": 8 * (n + 3) * (slots + 1),  # each slot's sum and the combined one
        "update_buffers": 8 * n * (1 + state_vectors),  # proposed parameters and optimizer state
    }
    want["total"] = sum(want.values())
    assert res["memory"] == want
    shown = _memory_line_numbers(out)
    for key, label in (("params", "params"), ("optimizer_state", "optimizer state"), ("total", "total")):
        assert shown[label] == round(want[key] / 2**20, 2), label


def test_memory_per_rank_against_the_learners_arrays():
    from mpi4py import MPI

    from alpha_mpi.learning import MLP, DataParallelLearner
    from alpha_mpi.learning.trainer import memory_line, memory_per_rank

    model = MLP(8, 16, 4)
    n = model.n_params
    got = {}
    for mode in ("none", "state"):
        lr = DataParallelLearner(MPI.COMM_SELF, model, slots=3, partition=mode)
        mem = got[mode] = memory_per_rank(lr)
        assert mem["params"] == lr.params.nbytes == 8 * n  # the parameters once, not twice
        assert mem["optimizer_state"] == lr.opt.m.nbytes + lr.opt.v.nbytes == 16 * n
        assert (
            mem["gradients"]
            == sum(p.nbytes for p in lr.payloads.values()) + lr.holder.gradient.reduced.nbytes
        )
        assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
        assert "params 0.00 MiB, optimizer state 0.00 MiB" in memory_line(mem)
    # `state` on one rank keeps the assembled full vector besides the proposed range: more update
    # buffers, named as such, and no more parameters or optimizer state than `none`.
    assert got["state"]["update_buffers"] == got["none"]["update_buffers"] + 8 * n
    assert got["state"]["params"] == got["none"]["params"]


# ---------------------------------------------------------------------------- checkpoint
@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck") / "ck"
    r = alpha("train", *TINY, "--steps", "2", "--log-every", "0", "--checkpoint-dir", str(root))
    assert r.returncode == 0, r.stderr
    return str(root)


def _value_columns(rows) -> set:
    """Where the value starts in each `  label  value` row (a label may hold single spaces)."""
    return {re.match(r"^  (.+?)  +(\S.*)$", row).start(2) for row in rows}


def test_checkpoint_inspect_prints_each_field_once_in_aligned_columns(capsys, checkpoint_dir):
    status, out, _ = main(capsys, "checkpoint", "inspect", checkpoint_dir)
    assert status == 0
    table, components = out.split("\ncomponents:\n")
    rows = table.splitlines()[1:]
    labels = [re.match(r"^  (.+?)  +\S", row).group(1) for row in rows]
    assert labels.count("step") == 1 and not any(lab.endswith(".step") for lab in labels), labels
    assert len(labels) == len(set(labels)), labels
    assert len(_value_columns(rows)) == 1, rows  # every value starts in one column
    assert re.search(r"^  step +2  \(saved on 1 ranks\)$", table, re.M)
    assert "  scalars.optimizer " in table and "  config.checkpoint_every " in table
    comp = components.strip("\n").splitlines()
    assert {row.split()[0] for row in comp} == {"params", "optimizer.m", "optimizer.v"}
    assert len({row.index(" values in ") for row in comp}) == 1  # lengths right-aligned in one column


def test_checkpoint_verify_table_is_aligned_too(capsys, checkpoint_dir):
    status, out, _ = main(capsys, "checkpoint", "verify", checkpoint_dir)
    assert status == 0
    rows = out.splitlines()[1:4]
    assert [re.match(r"^  (.+?)  +\S", row).group(1) for row in rows] == [
        "manifest sha256",
        "layout order id",
        "contract",
    ]
    assert len(_value_columns(rows)) == 1, rows


# --------------------------------------------------------------------------------- plan
def _topology_line(out: str) -> str:
    return next(line for line in out.splitlines() if re.search(r"\btopology ", line))


@pytest.mark.parametrize("extra", [[], ["--cost"]])
def test_plan_says_the_topology_asked_and_what_it_equals(capsys, extra):
    status, out, _ = main(capsys, "plan", "--slots", "3", "--topology", "hierarchy:2", *extra)
    assert status == 0
    line = _topology_line(out)
    assert re.search(r"topology +hierarchy:2 \(the same tree as star for 3 slots\)", line), line
    assert not re.search(r"topology +star\b", out)  # never the other name alone


def test_plan_topology_line_is_the_asked_one_when_it_names_the_shape(capsys):
    _, out, _ = main(capsys, "plan", "--slots", "8", "--topology", "hierarchy:2")
    assert re.search(r"topology +hierarchy:2   delivery", _topology_line(out))
    _, out, _ = main(capsys, "plan", "--slots", "4", "--topology", "star:1")
    assert re.search(r"topology +star:1   delivery", _topology_line(out))
    _, out, _ = main(capsys, "plan", "--slots", "3", "--topology", "hierarchy:2", "--format", "json")
    d = json.loads(out)
    assert d["topology"] == "star" and d["topology_asked"] == "hierarchy:2"


# ------------------------------------------------------------------------------ imports
def test_tools_never_import_cli_and_the_entry_point_is_cli_main():
    """Imports run one way: cli -> tools. Only `__main__` entry scripts may call cli.main."""
    back = []
    for path in sorted((ROOT / "alpha_mpi" / "tools").rglob("*.py")):
        if path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
                if any(re.fullmatch(r"(alpha_mpi\.|\.*)cli(\..*)?|\.+\.cli", n) for n in names):
                    back.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(a.name.startswith("alpha_mpi.cli") for a in node.names):
                back.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not back, back
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^alpha-mpi = "alpha_mpi\.cli:main"$', pyproject, re.M)
    assert callable(cli.main)


def test_train_options_are_the_config_fields():
    """train builds its TrainConfig from the options of the same names: none is left out."""
    from dataclasses import fields

    from alpha_mpi.learning import TrainConfig
    from alpha_mpi.tools.train_cmd import parser

    dests = {a.dest for a in parser()._actions}
    assert {f.name for f in fields(TrainConfig)} <= dests
