"""`alpha-mpi train --optimizer adamw --weight-decay WD` (issue 44 item 7): one digest on 1, 2 and 4
ranks and in every partition mode; the decay is in the bits; a resume with another weight decay
refused by name (exit 3) unless `--adopt-weight-decay` (recorded); the usage errors (exit 2) name
what to do, an unknown optimizer the known ones."""

from __future__ import annotations

import pytest

from alpha_mpi.checkpoint import open_checkpoint

from conftest import alpha_command, printed_digest


def cli(*args, n=None):
    r = alpha_command("train", "--hidden", "8", "--log-every", "1000", "--steps", "4", *args, n=n, limit=300)
    return r, printed_digest(r.stdout, required=False)


def test_adamw_from_the_command_gives_one_digest_on_1_2_4_ranks_and_every_partition_mode():
    r, want = cli("--optimizer", "adamw", "--weight-decay", "0.1", n=1)
    assert r.returncode == 0 and want, r.stderr
    assert "adamw lr 0.002 weight decay 0.1" in r.stdout
    for n, mode in ((2, "none"), (2, "state"), (4, "grads"), (4, "params")):
        r, got = cli("--optimizer", "adamw", "--weight-decay", "0.1", "--partition", mode, n=n)
        assert r.returncode == 0 and got == want, (n, mode, r.stderr[-800:])
    # the decay is in the bits: torch's default 0.01, and Adam, end elsewhere
    _, default = cli("--optimizer", "adamw", n=1)
    _, adam = cli(n=1)
    assert len({want, default, adam}) == 3


def test_a_resume_with_another_weight_decay_is_refused_unless_adopted_and_then_recorded(tmp_path):
    ck = str(tmp_path / "ck")
    r, _ = cli("--optimizer", "adamw", "--weight-decay", "0.1", "--checkpoint-dir", ck)
    assert r.returncode == 0, r.stderr
    more = ("--optimizer", "adamw", "--steps", "6", "--checkpoint-dir", ck, "--resume")
    r, _ = cli(*more, "--weight-decay", "0.05", n=2)
    assert r.returncode == 3 and "[checkpoint-config-mismatch] weight_decay: saved 0.1, now 0.05" in r.stderr
    assert "--adopt-weight-decay" in r.stderr
    r, _ = cli(*more, n=2)  # without --weight-decay: AdamW's default 0.01 is another decay too
    assert r.returncode == 3 and "weight_decay: saved 0.1, now 0.01" in r.stderr, r.stderr
    r, _ = cli(*more, "--weight-decay", "0.05", "--adopt-weight-decay", n=2)
    assert r.returncode == 0 and "# resumed from" in r.stdout, r.stderr
    m = open_checkpoint(ck).manifest
    assert {"at_step": 4, "field": "weight_decay", "from": 0.1, "to": 0.05} in m["resume_history"]
    assert m["config"]["weight_decay"] == 0.05 and m["scalars"]["optimizer_hyper"]["weight_decay"] == 0.05


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--optimizer", "adamx"], "invalid choice: 'adamx' (choose from "),
        (["--optimizer", "adam", "--weight-decay", "0.1"], "--optimizer adam takes none (use adamw)"),
        (["--optimizer", "sgd", "--weight-decay", "0.1"], "--optimizer sgd takes none (use adamw)"),
        (["--optimizer", "adamw", "--weight-decay", "-0.1"], "--weight-decay"),
        (["--optimizer", "adamw", "--weight-decay", "nan"], "--weight-decay"),
    ],
)
def test_optimizer_usage_errors_exit_2_and_say_what_to_do(args, needle, tmp_path):
    r = alpha_command("train", *args, cwd=str(tmp_path))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    if "adamx" in args:  # the known optimizers are named (quoted or not, by Python's version)
        assert all(name in r.stderr.split("choose from ")[1] for name in ("adam", "adamw", "sgd"))
