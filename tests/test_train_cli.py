"""The main job from the installed command: rank-count independence, resume on another rank count,
partitioned modes resuming into others, preemption (exit 99 after a checkpoint), refusals."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from conftest import mpiexec, needs_mpiexec, printed_digest, run_mpi

pytestmark = needs_mpiexec
SMALL = ["--hidden", "48", "--log-every", "1000"]


def train(n, *args, limit=180):
    r, _ = run_mpi(n, "-m", "alpha_mpi", "train", *SMALL, *args, limit=limit)
    return r, printed_digest(r.stdout, required=False)


def test_same_digest_on_1_2_4_ranks():
    digests = {n: train(n, "--steps", "12")[1] for n in (1, 2, 4)}
    assert None not in digests.values() and len(set(digests.values())) == 1, digests


def test_resume_on_other_rank_counts_and_modes_matches_uninterrupted(tmp_path):
    _, want = train(4, "--steps", "40")
    base = tmp_path / "base"
    r, _ = train(
        4, "--steps", "20", "--checkpoint-dir", str(base), "--checkpoint-every", "20", "--partition", "grads"
    )
    assert r.returncode == 0, r.stderr
    for n, mode in ((2, "none"), (1, "params"), (3, "state")):
        d = tmp_path / f"r{n}"
        subprocess.run(["cp", "-r", str(base), str(d)], check=True)
        r, got = train(n, "--steps", "40", "--checkpoint-dir", str(d), "--resume", "--partition", mode)
        assert "# resumed from" in r.stdout and got == want, (n, mode, r.stdout[-500:], r.stderr[-2000:])
    # Resuming a finished run does nothing more and reports the same digest.
    r, got = train(2, "--steps", "20", "--checkpoint-dir", str(base), "--resume")
    assert r.returncode == 0 and got is not None


def test_sigusr1_saves_a_checkpoint_and_exits_99(tmp_path):
    ck = tmp_path / "ck"
    cmd = [
        mpiexec(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "alpha_mpi",
        "train",
        *SMALL,
        "--steps",
        "100000",
        "--checkpoint-dir",
        str(ck),
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (ck.exists() or time.monotonic() > deadline):  # the trainer made its directory: it runs
            time.sleep(0.2)
        time.sleep(2)
        p.send_signal(signal.SIGUSR1)  # hydra forwards it to every rank, as srun and Slurm do
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 99, (out[-800:], err[-2000:])
    assert "stopped by signal" in out
    r = subprocess.run(
        [sys.executable, "-m", "alpha_mpi", "checkpoint", "verify", str(ck)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_train_refusals_exit_3_with_a_code(tmp_path):
    r, _ = train(2, "--steps", "2", "--topology", "ring")
    assert r.returncode == 3 and "[topology-invalid]" in r.stderr
    r, _ = train(4, "--steps", "2", "--slots", "2")
    assert r.returncode == 3 and "[placement-invalid]" in r.stderr
    advice = r.stderr.split("what to do:", 1)[1].splitlines()[0]
    assert "--slots" in advice and "mpiexec -n" in advice and "owners" not in advice, advice
    bad = tmp_path / "bad.npz"
    import numpy as np

    np.savez(bad, X=np.ones((10, 3)), labels=np.zeros(10))
    r, _ = train(1, "--steps", "2", "--data", str(bad))
    assert r.returncode == 3 and "[data-invalid]" in r.stderr


def test_user_data_and_json_result(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 5))
    y = (X[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    out = tmp_path / "r.json"
    r, d = train(
        2,
        "--steps",
        "40",
        "--lr",
        "0.01",
        "--data",
        str(tmp_path / "d.npz"),
        "--batch",
        "64",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["digest"] == d and res["accuracy"] > 0.85, res["accuracy"]


def test_memory_line_in_params_mode_counts_this_ranks_shard(tmp_path):
    out = tmp_path / "r.json"
    r, _ = train(2, "--steps", "1", "--partition", "params", "--json", str(out))
    assert r.returncode == 0, r.stderr
    n = int(re.search(r", (\d+) parameters,", r.stdout).group(1))
    mem = json.loads(out.read_text())["memory"]  # rank 0's
    shard = mem["params"] // 8
    assert mem["params"] == 8 * shard and abs(shard - n / 2) <= 2, (n, mem)  # half the vector, not 2x
    assert mem["optimizer_state"] == 2 * mem["params"]  # Adam's m and v over the shard
    # the proposed shard and optimizer state, and the full vector assembled for the forward pass
    assert mem["update_buffers"] == mem["params"] + mem["optimizer_state"] + 8 * n
    chunk = mem["gradients"] // 8 - 4 * (n + 3)  # 4 slot sums, then this rank's reduced chunk
    assert abs(chunk - (n + 3) / 2) <= 1, (n, mem)
    assert f"params {mem['params'] / 2**20:.2f} MiB" in r.stdout


RANK_MODELS = """
import numpy as np
from mpi4py import MPI

from alpha_mpi.learning import MLP


class RankGrad(MLP):
    def loss_and_grad_sum(self, params, X, y, grad_out):
        loss = super().loss_and_grad_sum(params, X, y, grad_out)
        if MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1:
            grad_out[0] = np.nextafter(grad_out[0], np.inf)
        return loss


class RankInit(MLP):
    def init(self, seed):
        last = MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1
        return super().init(seed + 1 if last else seed)


def rank_grad(inputs, classes):
    return RankGrad(inputs, 8, classes)


def rank_init(inputs, classes):
    return RankInit(inputs, 8, classes)


def healthy(inputs, classes):
    return MLP(inputs, 8, classes)
"""


def test_train_model_probe_refuses_rank_dependent_gradients_and_parameters(tmp_path):
    (tmp_path / "rank_models.py").write_text(RANK_MODELS)
    for n in (2, 5):
        for factory, code in (
            ("rank_grad", "model-rank-dependent"),
            ("rank_init", "initial-params-mismatch"),
        ):
            argv = ["-m", "alpha_mpi", "train", "--model", f"rank_models:{factory}", "--steps", "2", *SMALL]
            r, _ = run_mpi(n, *argv, cwd=tmp_path, limit=120)
            assert r.returncode == 3 and f"[{code}]" in r.stderr, (
                n,
                factory,
                r.stdout[-500:],
                r.stderr[-2000:],
            )
            assert f"rank {n - 1} differ" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r, _ = run_mpi(
        2, "-m", "alpha_mpi", "train", "--model", "rank_models:healthy", "--steps", "2", *SMALL, cwd=tmp_path
    )
    assert r.returncode == 0 and printed_digest(r.stdout), r.stderr[-2000:]


def test_json_history_and_plot_hold_every_step_on_any_rank_count(tmp_path):
    """--json holds the per-step losses (issue 37 item 8): one entry per step, the last the final
    loss, and the same bits on 1 and 3 ranks (each loss is the global batch's mean, combined in
    the declared order); --plot draws them into a PNG."""
    import numpy as np

    hist = {}
    for n in (1, 3):
        out, png = tmp_path / f"r{n}.json", tmp_path / f"loss{n}.png"
        r, d = train(n, "--steps", "7", "--json", str(out), "--plot", str(png))
        assert r.returncode == 0, r.stderr
        res = json.loads(out.read_text())
        h = res["history"]
        assert [e["step"] for e in h] == list(range(1, 8)) and h[-1]["loss"] == res["loss"], h
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"# training curve: {png}" in r.stdout
        hist[n] = np.array([e["loss"] for e in h])
    assert np.array_equal(hist[1].view(np.uint64), hist[3].view(np.uint64)), hist
    assert len(set(hist[1].tolist())) == 7  # a loss that moves: a wrong entry would show


def test_plot_without_matplotlib_is_refused_on_every_rank_before_training(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('blocked for the test')\n")
    env = dict(os.environ, PYTHONPATH=str(blocker) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r, _ = run_mpi(
        2, "-m", "alpha_mpi", "train", *SMALL, "--steps", "2", "--plot", str(tmp_path / "x.png"), env=env
    )
    assert r.returncode == 3 and r.stderr.count("[plot-unavailable]") == 2, r.stderr
    assert "pip install 'alpha_mpi[plot]'" in r.stderr and "state digest" not in r.stdout
