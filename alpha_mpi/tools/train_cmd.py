"""`alpha-mpi train`: data-parallel training whose every combine follows a declared order."""

from __future__ import annotations

from ._args import EXIT_PREEMPTED, EXIT_SDC, check_output, int_option, path, real, subparser, write_output

EXAMPLES = (
    "mpiexec -n 4 alpha-mpi train         # 200 Adam steps of the built-in synthetic task",
    "mpiexec -n 2 alpha-mpi train --steps 50 --partition params --log-every 0",
    "mpiexec -n 4 alpha-mpi train --checkpoint-dir ckpt --checkpoint-every 20",
    "mpiexec -n 2 alpha-mpi train --checkpoint-dir ckpt --resume --steps 400",
    "mpiexec -n 4 alpha-mpi train --audit-slots 1 --audit-digests 10 --checkpoint-dir ckpt   # exit 98 on SDC",
    "mpiexec -n 2 alpha-mpi train --checkpoint-dir ckpt --replay 100:200   # recompute, compare, write nothing",
    "alpha-mpi train --data mine.npz --model mymodels:make --json result.json   # your data and model",
    "mpiexec -n 2 alpha-mpi train --json run.json --plot loss.png   # per-step losses and a training curve",
)


def parser():
    p = subparser(
        "train",
        "Data-parallel training (the built-in numpy MLP or --model; summed softmax cross-entropy) with "
        "declared-order gradient combines. Run under mpiexec -n P with any P from 1 to --slots: the same "
        "options give the same state digest on every such P (the tree is over the slots, not the ranks), "
        "and in every --partition mode.",
        EXAMPLES,
    )
    int_option(p, "--steps", 200, "total optimizer steps", lo=0)
    int_option(
        p,
        "--slots",
        8,
        "logical micro-batch shards per step; the tree is over these, and at most this many ranks",
    )
    int_option(p, "--batch", 256, "samples per step, cut into slots")
    from ..learning.optim import OPTIMIZERS  # one class per optimizer: its name, its default lr

    p.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="adam", help="(default adam)")
    lrs = ", ".join(f"{cls.default_lr:g} for {name}" for name, cls in OPTIMIZERS.items())
    p.add_argument("--lr", type=real(0.0), default=None, help=f"learning rate (default {lrs})")
    p.add_argument(
        "--weight-decay",
        type=real(0.0, lo_open=False),
        default=None,
        help="AdamW's decoupled weight decay, torch.optim.AdamW's order: p*(1-lr*wd), then the Adam "
        "step (default 0.01, torch's; adamw only)",
    )
    p.add_argument(
        "--momentum",
        type=real(0.0, 1.0, lo_open=False),
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
    int_option(p, "--seed", 0, "seed of the parameters, the synthetic task and the sample order", lo=0)
    int_option(p, "--hidden", 700, "hidden units of the built-in MLP; 700 makes about 1e5 parameters")
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
        "--data",
        type=path,
        default=None,
        help="an .npz with X (n, d) and y (n,) instead of the synthetic task",
    )
    int_option(
        p,
        "--log-every",
        10,
        "print a progress line every N steps and after the last; 0: quiet (no progress lines; "
        "the start-up lines, the final summary and the digest are still printed)",
        lo=0,
    )
    p.add_argument(
        "--timeout",
        type=real(0.0),
        default=None,
        help="seconds a rank waits for a peer (default ALPHA_MPI_TIMEOUT or 300)",
    )
    p.add_argument(
        "--checkpoint-dir",
        type=path,
        default=None,
        help="save sharded checkpoints here (always the final state; one trainer per directory, locked)",
    )
    int_option(
        p,
        "--checkpoint-every",
        0,
        "also save every N steps (0: only the final state and on a stop signal)",
        lo=0,
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from --checkpoint-dir: the step `latest` names; the newest step that verifies when "
        "`latest` is missing; step 0 (said loudly) when the directory holds no step",
    )
    p.add_argument(
        "--resume-from",
        type=path,
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
        "--adopt-weight-decay",
        action="store_true",
        help="resume with this --weight-decay although the checkpoint was saved with another; recorded",
    )
    p.add_argument(
        "--adopt-contract",
        action="store_true",
        help="resume even if the checkpoint's numerical contract differs; the adoption is recorded in later checkpoints",
    )
    p.add_argument(
        "--accept-compute-change",
        action="store_true",
        help="resume even if the checkpoint was computed under another compute identity (numpy's BLAS "
        "kernel, threads, ...: `alpha-mpi env`); recorded in later checkpoints",
    )
    int_option(
        p,
        "--audit-slots",
        0,
        "recompute K slots per step on another rank and compare digests before applying the step "
        "(K = --slots: every slot); a mismatch stops with sdc-detected, exit 98",
        lo=0,
    )
    int_option(
        p,
        "--audit-digests",
        0,
        "every N steps compare digests of the replicated parameters (and optimizer state) across "
        "ranks; a minority stops with replica-diverged, exit 98 (0: never)",
        lo=0,
    )
    p.add_argument(
        "--replay",
        default=None,
        metavar="A:B",
        help="with --checkpoint-dir: resume from step A, recompute to step B, compare every byte with "
        "the stored step B and write nothing ('bits match', rc 0; else replay-mismatch); the learning "
        "rates are the run's, read from step B (--adopt-lr resumes included), not --lr",
    )
    p.add_argument(
        "--json",
        type=path,
        default=None,
        help="write the result to this file (rank 0): digest, final loss, accuracy, timings, the "
        "per-step `history` of losses, and `audit` (what an audited run checked)",
    )
    p.add_argument(
        "--plot",
        type=path,
        default=None,
        metavar="PNG",
        help="draw the loss per step into this PNG at the end (rank 0; needs matplotlib: "
        "pip install 'alpha_mpi[plot]')",
    )
    return p


def plot_history(path: str, result: dict) -> None:
    """The training curve of `result` (train()'s): loss per step, log scale (matplotlib's object
    API, no pyplot state, so no display is needed on a compute node)."""
    from matplotlib.figure import Figure

    hist = result["history"]
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([h["step"] for h in hist], [h["loss"] for h in hist], lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over the global batch)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"alpha-mpi train: state digest {result['digest'][:16]}", fontsize=9)
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as e:
        from ..refusals import Refusal

        raise Refusal("output-unwritable", f"--plot {path}: cannot write it: {e.strerror or e}")


def run(argv, fault_hook=None) -> int:
    """`alpha-mpi train ARGV`; `fault_hook` is for verification only (alpha_mpi_verify.faults)."""
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
    if a.replay is not None:
        if not a.checkpoint_dir or a.resume or a.resume_from:
            p.error("--replay A:B needs --checkpoint-dir and neither --resume nor --resume-from")
        try:
            a.replay = tuple(int(x) for x in a.replay.split(":"))
            ok = len(a.replay) == 2 and 0 <= a.replay[0] < a.replay[1]
        except ValueError:
            ok = False
        if not ok:
            p.error(f"--replay: expected A:B with integers 0 <= A < B, got {a.replay!r}")
    if a.batch < a.slots:
        p.error(f"--batch {a.batch} is smaller than --slots {a.slots}: every slot needs a sample")
    from ..learning.optim import OPTIMIZERS

    if a.weight_decay is not None and "weight_decay" not in OPTIMIZERS[a.optimizer].hyper:
        p.error(
            f"--weight-decay is AdamW's decoupled weight decay; --optimizer {a.optimizer} takes none (use adamw)"
        )
    import sys
    from dataclasses import fields

    from mpi4py import MPI

    from ..learning import TrainConfig, train
    from ..refusals import Refusal

    if a.plot:  # every rank: each refuses alike, before anything trains
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise Refusal("plot-unavailable", f"--plot {a.plot}: matplotlib is not installed")
    if MPI.COMM_WORLD.Get_rank() == 0:  # before training, not after it
        for flag in ("json", "plot"):
            if getattr(a, flag):
                check_output(getattr(a, flag), "--" + flag)
    if a.lr is None:
        a.lr = OPTIMIZERS[a.optimizer].default_lr
    # Every TrainConfig field is the option of the same name.
    cfg = TrainConfig(**{f.name: getattr(a, f.name) for f in fields(TrainConfig) if hasattr(a, f.name)})
    comm = MPI.COMM_WORLD
    if a.replay is not None:
        from ..learning.replay import replay

        replay(comm, cfg, *a.replay, out=lambda s: print(s, flush=True))
        return 0
    try:
        result = train(comm, cfg, out=lambda s: print(s, flush=True), fault_hook=fault_hook)
    except Refusal as e:
        if e.code not in ("sdc-detected", "sdc-undetermined", "replica-diverged"):
            raise
        from ..learning.audit import sdc_report

        if comm.Get_rank() == 0:  # every rank refused alike; one report
            print(sdc_report(e, a.checkpoint_dir, comm.Get_size()), file=sys.stderr, flush=True)
        return EXIT_SDC
    if a.json and comm.Get_rank() == 0:
        import json

        write_output(a.json, json.dumps(result, indent=2))  # a full disk: named, after the digest
    if a.plot and comm.Get_rank() == 0 and result["history"]:
        plot_history(a.plot, result)
        print(f"# training curve: {a.plot}", flush=True)
    return EXIT_PREEMPTED if result["preempted"] else 0
