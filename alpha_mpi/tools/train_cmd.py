"""`alpha-mpi train`: data-parallel training whose every combine follows a declared order."""

from __future__ import annotations

import argparse
import math

from ..cli import subparser


def _at_least(lo: int):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}")
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v

    return parse


def _real(lo: float, hi: float = math.inf, lo_open: bool = True, hi_open: bool = True):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if not ok:
            span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be a finite number in {span}, got {text}")
        return v

    return parse


def parser():
    p = subparser(
        "train",
        "Data-parallel training (numpy MLP, softmax cross-entropy) with declared-order gradient combines. "
        "Run under mpiexec; the same seed gives the same state digest on any rank count that divides the slots.",
    )
    p.add_argument("--steps", type=_at_least(0), default=200, help="total optimizer steps (default 200)")
    p.add_argument(
        "--slots",
        type=_at_least(1),
        default=8,
        help="logical micro-batch shards per step; the tree is over these (default 8)",
    )
    p.add_argument(
        "--batch", type=_at_least(1), default=256, help="samples per step, cut into slots (default 256)"
    )
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument(
        "--lr", type=_real(0.0), default=None, help="learning rate (default 2e-3 for adam, 0.05 for sgd)"
    )
    p.add_argument(
        "--momentum",
        type=_real(0.0, 1.0, lo_open=False),
        default=0.9,
        help="SGD momentum in [0, 1) (default 0.9; 0 = plain SGD)",
    )
    p.add_argument(
        "--topology",
        default="pairwise",
        help="pairwise | star | star:HUB | hierarchy:K (default pairwise: a balanced tree over the slots)",
    )
    p.add_argument(
        "--partition",
        choices=("none", "state", "grads", "params"),
        default="none",
        help="shard optimizer state, gradients or parameters (all bit-identical; default none)",
    )
    p.add_argument("--seed", type=_at_least(0), default=0)
    p.add_argument(
        "--hidden", type=_at_least(1), default=700, help="hidden units (default 700: about 1e5 parameters)"
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FACTORY",
        help="your own model: MODULE importable from the working directory or PYTHONPATH, "
        "FACTORY(inputs, classes) returning an alpha_mpi.learning.Model or a torch.nn.Module "
        "((batch, inputs) -> (batch, classes) logits, summed cross-entropy, binary64); "
        "default: the built-in MLP (--hidden)",
    )
    p.add_argument(
        "--data", default=None, help="an .npz with X (n, d) and y (n,) instead of the synthetic task"
    )
    p.add_argument("--log-every", type=_at_least(1), default=10)
    p.add_argument(
        "--timeout",
        type=_real(0.0),
        default=None,
        help="seconds a rank waits for a peer (default ALPHA_MPI_TIMEOUT or 30)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save sharded checkpoints here (always the final state; one trainer per directory, locked)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=_at_least(0),
        default=0,
        help="also save every N steps (0: only the final state and on a stop signal)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from --checkpoint-dir: the step `latest` names; the newest step that verifies when "
        "`latest` is missing; step 0 (said loudly) when the directory holds no step",
    )
    p.add_argument(
        "--resume-from",
        default=None,
        metavar="PATH",
        help="continue from this step directory (or another checkpoint directory's latest); saves go to "
        "--checkpoint-dir, which must hold no newer step",
    )
    p.add_argument(
        "--adopt-lr",
        action="store_true",
        help="resume with this --lr although the checkpoint was saved with another; recorded in later checkpoints",
    )
    p.add_argument(
        "--adopt-contract",
        action="store_true",
        help="resume even if the checkpoint's numerical contract differs; the adoption is recorded in later checkpoints",
    )
    p.add_argument(
        "--json",
        default=None,
        help="write the result (digest, loss, accuracy, timings) to this file (rank 0)",
    )
    return p


def run(argv) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.resume and not a.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    if a.resume_from and not a.checkpoint_dir:
        p.error("--resume-from needs --checkpoint-dir (where the continued run saves)")
    if a.resume and a.resume_from:
        p.error("give --resume (continue in --checkpoint-dir) or --resume-from PATH, not both")
    if a.checkpoint_every and not a.checkpoint_dir:
        p.error("--checkpoint-every needs --checkpoint-dir")
    from mpi4py import MPI

    from ..learning import PREEMPTED, TrainConfig, train
    from ..refusals import Refusal

    if a.json and MPI.COMM_WORLD.Get_rank() == 0:
        _check_writable(a.json, Refusal)  # before training, not after it
    lr = a.lr if a.lr is not None else (2e-3 if a.optimizer == "adam" else 0.05)
    cfg = TrainConfig(
        steps=a.steps,
        slots=a.slots,
        batch=a.batch,
        optimizer=a.optimizer,
        lr=lr,
        momentum=a.momentum,
        topology=a.topology,
        partition=a.partition,
        seed=a.seed,
        hidden=a.hidden,
        data=a.data,
        log_every=a.log_every,
        checkpoint_dir=a.checkpoint_dir,
        checkpoint_every=a.checkpoint_every,
        resume=a.resume,
        timeout=a.timeout,
        adopt_contract=a.adopt_contract,
        resume_from=a.resume_from,
        adopt_lr=a.adopt_lr,
        model=a.model,
    )
    comm = MPI.COMM_WORLD
    result = train(comm, cfg, out=lambda s: print(s, flush=True))
    if a.json and comm.Get_rank() == 0:
        import json

        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return PREEMPTED if result["preempted"] else 0


def _check_writable(path: str, Refusal) -> None:
    import os

    d = os.path.dirname(os.path.abspath(path))
    if (
        os.path.isdir(path)
        or not os.path.isdir(d)
        or not os.access(d, os.W_OK | os.X_OK)
        or (os.path.exists(path) and not os.access(path, os.W_OK))
    ):
        raise Refusal(
            "output-unwritable",
            f"--json {path}: cannot write there (the directory {d} must exist and "
            f"be writable, and the path must not be a directory)",
        )
