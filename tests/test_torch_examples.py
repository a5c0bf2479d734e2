"""The torch examples and `alpha-mpi bench torch` run as a user runs them (mpiexec subprocesses):
one digest on 1, 2 and 4 ranks, a resume 4 -> 2 equal to the uninterrupted run, torch DDP's
digest different across rank counts, and `alpha-mpi train --model` with an nn.Module factory.
Skips cleanly without torch (and the examples without scikit-learn)."""

import re

import pytest

pytest.importorskip("torch")

from conftest import printed_digest, run_example  # noqa: E402


def _run(n, args, timeout=300):
    return run_example(n, args, limit=timeout)


def _digest(out, label="digest"):  # the examples print `digest:`, the command `state digest:`
    return printed_digest(out, label)


def test_cnn_example_prints_one_digest_on_1_2_4_ranks_and_across_a_resume_4_to_2(tmp_path):
    pytest.importorskip("sklearn")
    args = ["torch_cnn.py", "--steps", "8"]
    d = {n: _digest(_run(n, args)) for n in (1, 2, 4)}
    assert len(set(d.values())) == 1, d
    ck = str(tmp_path / "ck")
    out = _run(4, args + ["--stop-after", "4", "--checkpoint-dir", ck])
    assert "stopped after step 4" in out
    out = _run(2, args + ["--resume", "--checkpoint-dir", ck])
    assert "resumed from" in out and _digest(out) == d[1]


def test_mlp_example_prints_one_digest_on_1_and_4_ranks():
    pytest.importorskip("sklearn")
    args = ["torch_mlp.py", "--steps", "8"]
    assert _digest(_run(1, args)) == _digest(_run(4, args))


def test_ddp_gives_another_digest_on_another_rank_count():
    pytest.importorskip("sklearn")
    args = ["torch_mlp.py", "--steps", "8", "--ddp"]
    one, two = _digest(_run(1, args), "ddp digest"), _digest(_run(2, args), "ddp digest")
    assert one != two


def test_train_cli_with_an_nn_module_factory_partitions_and_resume(tmp_path):
    cli = ["-m", "alpha_mpi", "train", "--model", "torch_mlp:factory", "--steps", "8", "--slots", "4"]
    cli += ["--batch", "32", "--log-every", "100"]
    one = _digest(_run(1, cli), "state digest")
    assert _digest(_run(2, cli + ["--partition", "grads"]), "state digest") == one
    ck = str(tmp_path / "ck")
    half = list(cli)
    half[half.index("8")] = "4"
    _run(2, half + ["--checkpoint-dir", ck, "--checkpoint-every", "4", "--partition", "params"])
    assert _digest(_run(1, cli + ["--checkpoint-dir", ck, "--resume"]), "state digest") == one


def test_bench_torch_times_every_row_interleaved_and_the_rows_of_one_slot_count_agree():
    args = ["-m", "alpha_mpi", "bench", "torch", "--steps", "2", "--warmup", "1", "--block", "1"]
    out = _run(2, args + ["--model", "mlp", "--slots", "p,3", "--optimizer", "adamw"])
    zero = "DDP \\(gloo\\) \\+ ZeroRedundancyOptimizer\\(AdamW\\)"  # torch's ZeRO-1, beside state (issue 43)
    for row in (
        "DDP \\(gloo\\)",
        "slots=2",
        "slots=2 local",
        "slots=2 buckets",
        "slots=2 state",
        "slots=2 grads",
        "slots=2 params",
        zero,
        "slots=3",
    ):
        assert re.search(rf"^  {row} +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+", out, re.M), (row, out)
    assert re.search(rf"^# slots=2 state / {zero}: [0-9.]+  \(target <= 1.10\)", out, re.M), out
    assert re.search(
        r"^# memory ZeroRedundancyOptimizer \(rank 0, MiB\): optimizer_state [0-9.]+", out, re.M
    ), out
    assert re.search(r"slots=2 local / slots=2: [0-9.]+", out), out
    two = {
        _digest(out, f"digest slots=2{k}") for k in ("", " local", " buckets", " state", " grads", " params")
    }
    assert len(two) == 1 and _digest(out, "digest slots=3") not in two, out
    assert "BITS MISMATCH" not in out
    for mode in ("none", "state", "grads", "params"):  # dp.memory() per partition mode (issue 43)
        assert re.search(rf"^# memory partition={mode} \(rank 0, MiB\): params [0-9.]+, grads", out, re.M), (
            out
        )
    ratio = re.search(r"^# optimizer state partition=state / none on 2 ranks: ([0-9.]+)", out, re.M)
    assert ratio and 0.4 <= float(ratio.group(1)) <= 0.6, out  # half, to a block of the grid
    held = re.search(r"^# parameters at rest partition=params / none on 2 ranks: ([0-9.]+)", out, re.M)
    assert held and 0.4 <= float(held.group(1)) <= 0.6, out


def test_lm_example_every_partition_mode_gives_the_one_rank_digest_on_2_and_4_ranks():
    """`--partition` takes every mode alpha_mpi.torch.partition_modes registers (a new mode
    joins this test by itself): each, on 2 and on 4 ranks, ends with the digest of the
    replicated run on 1 rank (AdamW groups, the cosine schedule, clipping, SlotSampler)."""
    from alpha_mpi.torch.partition_modes import MODES

    args = ["torch_lm.py", "--steps", "4", "--sequences", "128", "--log-every", "4"]
    one = _digest(_run(1, args))
    got = {(mode, n): _digest(_run(n, args + ["--partition", mode])) for mode in MODES for n in (2, 4)}
    assert all(d == one for d in got.values()), (one, got)
    other = _digest(_run(1, args + ["--seed", "1"]))
    assert other != one  # the digest says which run it was


def test_dataloader_example_one_digest_on_1_and_2_ranks_each_reading_its_half():
    one = _run(1, ["torch_dataloader.py"])
    two = _run(2, ["torch_dataloader.py", "--workers", "2", "--bucket-mb", "0.01"])
    assert _digest(one) == _digest(two)
    assert "rank 0 read 4000 samples" in one
    half = _run(2, ["torch_dataloader.py", "--epochs", "1"])
    assert re.search(r"rank 0 read 1000 samples", half) and re.search(r"rank 1 read 1000 samples", half), half


def test_lm_example_one_digest_on_1_2_4_ranks_and_across_a_resume_4_to_2(tmp_path):
    """examples/torch_lm.py as docs/pytorch.md runs it: padded character sequences, the model's
    own token-mean loss with its token mass, AdamW, a cosine schedule, accumulation over 2
    batches under no_sync, clipping, SlotSampler: one digest on 1 and 2 ranks (there with the
    AdamW state sharded, `--partition state`), and a run stopped at 4 ranks (sharded) and
    resumed at 2 (not) ends with it too; `--partition grads` on 2 as well (five launches: torch's
    start-up is most of the time)."""
    args = ["torch_lm.py", "--steps", "8", "--accum", "2", "--sequences", "256", "--log-every", "4"]
    one, two = _digest(_run(1, args)), _digest(_run(2, args + ["--partition", "state"]))
    assert one == two == _digest(_run(2, args + ["--partition", "grads"]))  # ZeRO-2 too
    ck = str(tmp_path / "ck")
    out = _run(4, args + ["--stop-after", "4", "--checkpoint-dir", ck, "--partition", "state"])
    assert "stopped after step 4" in out
    out = _run(2, args + ["--resume", "--checkpoint-dir", ck])
    assert "resumed from" in out and _digest(out) == one
