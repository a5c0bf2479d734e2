"""`alpha-mpi train`: data-parallel training whose every combine follows a declared order."""

from __future__ import annotations

from ..cli import subparser


def parser():
    p = subparser(
        "train",
        "Data-parallel training (numpy MLP, softmax cross-entropy) with declared-order gradient combines. "
        "Run under mpiexec; the same seed gives the same state digest on any rank count that divides the slots.",
    )
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps (default 200)")
    p.add_argument("--slots", type=int, default=8, help="logical micro-batch shards per step; the tree is over these (default 8)")
    p.add_argument("--batch", type=int, default=256, help="samples per step, cut into slots (default 256)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 2e-3 for adam, 0.05 for sgd)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9; 0 = plain SGD)")
    p.add_argument("--topology", default="hierarchy:2", help="star | hierarchy:K (default hierarchy:2)")
    p.add_argument("--partition", choices=("none", "state", "grads", "params"), default="none",
                   help="shard optimizer state, gradients or parameters (all bit-identical; default none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=700, help="hidden units (default 700: about 1e5 parameters)")
    p.add_argument("--data", default=None, help="an .npz with X (n, d) and y (n,) instead of the synthetic task")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--timeout", type=float, default=None, help="seconds a rank waits for a peer (default ALPHA_MPI_TIMEOUT or 30)")
    p.add_argument("--checkpoint-dir", default=None, help="save sharded checkpoints here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps (0: only on a stop signal)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--adopt-contract", action="store_true",
                   help="resume even if the checkpoint's numerical contract differs; the adoption is recorded in later checkpoints")
    p.add_argument("--json", default=None, help="write the result (digest, loss, accuracy, timings) to this file (rank 0)")
    return p


def run(argv) -> int:
    a = parser().parse_args(argv)
    from mpi4py import MPI

    from ..learning import PREEMPTED, TrainConfig, train
    from ..refusals import Refusal

    if a.steps < 0 or a.slots < 1 or a.batch < 1 or a.log_every < 1:
        raise Refusal("usage", "--steps >= 0, --slots >= 1, --batch >= 1 and --log-every >= 1 are required")
    if a.resume and not a.checkpoint_dir:
        raise Refusal("usage", "--resume needs --checkpoint-dir")
    lr = a.lr if a.lr is not None else (2e-3 if a.optimizer == "adam" else 0.05)
    cfg = TrainConfig(
        steps=a.steps, slots=a.slots, batch=a.batch, optimizer=a.optimizer, lr=lr, momentum=a.momentum,
        topology=a.topology, partition=a.partition, seed=a.seed, hidden=a.hidden, data=a.data,
        log_every=a.log_every, checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every,
        resume=a.resume, timeout=a.timeout, adopt_contract=a.adopt_contract,
    )
    comm = MPI.COMM_WORLD
    result = train(comm, cfg, out=lambda s: print(s, flush=True))
    if a.json and comm.Get_rank() == 0:
        import json

        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return PREEMPTED if result["preempted"] else 0
