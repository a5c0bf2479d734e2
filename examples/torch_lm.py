"""A small causal transformer language model on a character corpus (a frozen copy of three pages
of this repository's docs), trained as language models are trained, ported from a DDP script (docs/pytorch.md,
"Porting a DDP script"): padded sequences and a mean over the real tokens, AdamW, a cosine
schedule, gradient accumulation (`--accum`), gradient clipping (`--clip`), a SlotSampler
DataLoader, checkpoint and resume on another rank count.

    mpiexec -n 1 python -m mpi4py examples/torch_lm.py            # one `digest:` on 1, 2 and 4 ranks
    mpiexec -n 4 python -m mpi4py examples/torch_lm.py
    mpiexec -n 4 python -m mpi4py examples/torch_lm.py --stop-after 10 --checkpoint-dir /tmp/lm
    mpiexec -n 2 python -m mpi4py examples/torch_lm.py --resume --checkpoint-dir /tmp/lm   # same digest
    mpiexec -n 2 python -m mpi4py examples/torch_lm.py --autocast bfloat16    # CPU bf16: one digest too
    mpiexec -n 2 python -m mpi4py examples/torch_lm.py --accum 2             # DDP's no_sync, ported
    mpiexec -n 8 python -m mpi4py examples/torch_lm.py --device cuda          # one GPU per rank
    mpiexec -n 4 python -m mpi4py examples/torch_lm.py --partition state      # ZeRO-1: the same digest
    mpiexec -n 4 python -m mpi4py examples/torch_lm.py --partition grads      # ZeRO-2: the same digest
    mpiexec -n 4 python -m mpi4py examples/torch_lm.py --partition grads --autocast float16  # loss scaling
    (--partition takes every mode of alpha_mpi.torch.partition_modes.MODES: the same digest in each)

The model computes its own loss, nanoGPT-style: `logits, loss = model(x, y)` with
`F.cross_entropy(..., ignore_index=-100)`, the mean over the tokens whose label is not -100.
`ModuleLoss(mass=...)` tells the step that mass (the real tokens of the slot), so the combine
adds mass x gradient and divides once by the global batch's real tokens: the gradient of the
token mean over the whole global batch, whatever the rank count, whatever the padding (a DDP
script averages the ranks' means instead, which weighs a rank's tokens by its padding).
`--loss pair` does the same with a loss function returning `(loss_sum, tokens)`.

`--accum k` runs DDP's accumulation: k − 1 batches under `dp.no_sync()`, then the update, whose
`.grad` is the token mean over all k batches (no `/ accum`: the step divides once). `--steps`
counts updates (`dp.updates`: what the schedule follows); `dp.steps` counts batches (what
`set_epoch` follows). `dp.clip_grad_norm_(--clip)` clips after the step, before `opt.step()`.

Nothing is downloaded: the corpus is examples/data/corpus.txt, a frozen copy of docs/concepts.md,
docs/same-bits.md and docs/design.md as of 2026-12-07. It is a copy, not the live pages, because the
digests the manual prints must not move when the manual is edited. `--corpus PATH` trains on
another UTF-8 text file instead (the same file on every rank: the digest follows its bytes).
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F
from mpi4py import MPI

from alpha_mpi.torch import DataParallel, ModuleLoss, ShardedGradScaler, SlotSampler
from alpha_mpi.torch.partition_modes import MODES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = -100  # the label of a padded position (torch's and Hugging Face's ignore_index)


CORPUS = os.path.join(ROOT, "examples", "data", "corpus.txt")


def corpus(path: str = CORPUS) -> str:
    """The training text: the frozen corpus unless another file is named."""
    with open(path, encoding="utf-8") as f:
        return f.read()


class Chars(torch.utils.data.Dataset):
    """`count` training sequences of `block` characters: sample i starts at a fixed place of the
    corpus and holds between block/2 and block real characters (a fixed function of i), the rest
    padding: inputs 0, labels -100. (x, y): y is x shifted by one character."""

    def __init__(self, text: str, block: int, count: int):
        self.vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(self.vocab)}
        self.ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block, self.count = block, count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        start = (i * 7919) % (len(self.ids) - self.block - 1)
        x = self.ids[start : start + self.block].clone()
        y = self.ids[start + 1 : start + self.block + 1].clone()
        real = self.block // 2 + (i * 31) % (self.block // 2 + 1)
        x[real:], y[real:] = 0, IGNORE
        return x, y


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, with dropout."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d), torch.nn.Dropout(dropout)
        )

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CausalLM(torch.nn.Module):
    """nanoGPT's shape, small: token and position embeddings, `layers` blocks, a final norm and a
    head tied to the token embedding. `model(x, y)` -> (logits, mean loss over labels != -100)."""

    def __init__(self, vocab: int, block: int, d: int = 64, layers: int = 2, heads: int = 4, dropout=0.1):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(block, d)
        self.drop = torch.nn.Dropout(dropout)
        self.blocks = torch.nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as nanoGPT
        for m in self.modules():  # nanoGPT's initialisation
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                torch.nn.init.zeros_(m.bias)

    def forward(self, x, targets=None):
        h = self.drop(self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device)))
        for blk in self.blocks:
            h = blk(h)
        logits = self.head(self.ln(h))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
        return logits, loss


def tokens(x, y):
    """The mass of a slot: its real (not padded) tokens."""
    return (y != IGNORE).sum()


def summed_tokens(out, y):
    """`--loss pair`: (the sum of the token losses, the real tokens), for a model returning logits."""
    logits = out[0] if isinstance(out, tuple) else out
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE, reduction="sum")
    return loss, tokens(None, y)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default=CORPUS, help="UTF-8 text to train on (default: the frozen copy)")
    p.add_argument("--steps", type=int, default=24, help="optimizer updates")
    p.add_argument("--accum", type=int, default=1, help="batches per update (no_sync for all but the last)")
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    p.add_argument("--slots", type=int, default=8, help="the slot tree (>= the largest rank count)")
    p.add_argument("--batch", type=int, default=32, help="global batch, sequences")
    p.add_argument("--block", type=int, default=32, help="characters per sequence")
    p.add_argument("--sequences", type=int, default=512, help="sequences per epoch")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss", choices=("module", "pair"), default="module")
    p.add_argument("--autocast", choices=("none", "bfloat16", "float16"), default="none")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--partition",
        choices=MODES,  # every mode this alpha_mpi has: the same digest in each
        default="none",
        help="where the training state lives: none (replicated), state (sharded AdamW state), ...",
    )
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--stop-after", type=int, default=0, help="save and stop after this step")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--log-every", type=int, default=8)
    return p


def device_for(comm, kind: str) -> torch.device:
    """One GPU per rank: the rank among those of its node (MPI.COMM_TYPE_SHARED), as torchrun's
    LOCAL_RANK, picks the device."""
    if kind == "cpu":
        return torch.device("cpu")
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def main(argv=None) -> str:
    """Train as the command line says; returns the digest it prints."""
    a = parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    say = print if comm.Get_rank() == 0 else (lambda *x, **k: None)
    torch.set_num_threads(1)
    device = device_for(comm, a.device)
    ds = Chars(corpus(a.corpus), a.block, a.sequences)
    torch.manual_seed(a.seed)  # rank 0's initial weights are copied to every rank anyway
    model = CausalLM(len(ds.vocab), a.block, a.d, a.layers).to(device)
    autocast = None if a.autocast == "none" else getattr(torch, a.autocast)
    dp = DataParallel(model, comm, slots=a.slots, seed=a.seed, autocast=autocast, partition=a.partition)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    # torch's AdamW over the groups (with --partition state, over this rank's shard of them)
    opt = dp.optimizer(
        torch.optim.AdamW,
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=a.lr,
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.steps, eta_min=a.lr / 10)
    # float16 scales each slot's loss; ShardedGradScaler is torch's GradScaler for every partition
    scaler = ShardedGradScaler(device.type) if a.autocast == "float16" else None
    sampler = SlotSampler(ds, dp, batch_size=a.batch, shuffle=True, seed=a.seed)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=a.workers)
    loss_fn = ModuleLoss(mass=tokens) if a.loss == "module" else summed_tokens
    if a.resume and a.checkpoint_dir:
        where = dp.restore(a.checkpoint_dir, opt, scheduler=sched, missing_ok=True)
        if where:
            say(f"# resumed from {where} at step {dp.updates} ({dp.steps} batches)")
    say(
        f"# {dp.n} parameters, vocabulary {len(ds.vocab)}, {a.slots} slots on {comm.Get_size()} ranks, "
        f"batch {a.batch} x {a.block} characters x {a.accum} per update, autocast {a.autocast}, "
        f"partition {a.partition}, on {device}"
    )
    while dp.updates < a.steps:
        # The epoch and the batch to go on from: the same on every rank count, after a resume too.
        sampler.set_epoch(*divmod(dp.steps, sampler.steps_per_epoch))
        for x, y in loader:
            if (dp.steps + 1) % a.accum:  # not the last batch of the update: carry its sums
                with dp.no_sync():
                    dp.step_local(x, y, loss_fn, scaler=scaler)
                continue
            loss = dp.step_local(x, y, loss_fn, scaler=scaler)  # the token mean over the update's batches
            if scaler is not None:
                scaler.unscale_(opt)  # clip the unscaled gradient
            if a.clip:
                dp.clip_grad_norm_(a.clip)  # after the step: it wrote .grad
            if scaler is not None:
                scaler.step(opt)  # skipped on every rank after an overflow
                scaler.update()
            else:
                opt.step()
            opt.zero_grad()
            sched.step()
            if dp.updates % a.log_every == 0:
                say(f"step {dp.updates:4d}  loss {loss:.5f}  ({loss / math.log(2):.3f} bits/char)")
            if a.stop_after and dp.updates == a.stop_after and a.checkpoint_dir:
                dp.save(a.checkpoint_dir, opt, scheduler=sched)
                say(f"# stopped after step {dp.updates}, checkpoint saved in {a.checkpoint_dir}")
                return dp.digest()  # collective: partition='params' gathers the shards
            if dp.updates == a.steps:
                break
    digest = dp.digest()  # parameter_digest(model) of the whole parameters, in every mode
    say(f"digest: {digest}")
    return digest


if __name__ == "__main__":
    main()
