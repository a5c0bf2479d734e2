"""Language-model pieces the torch LM tests share (imported after `pytest.importorskip("torch")`):
examples/torch_lm.py's model and padded character data, a Hugging Face-style module called as
`model(**batch)` whose loss is the mean over the shifted labels that are not -100, the token
loss as a `(sum, mass)` pair, and plain torch's token-mean gradient to compare against."""

import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "examples"))
from torch_lm import IGNORE, CausalLM, Chars, corpus  # noqa: E402

BLOCK = 16
DATA = Chars(corpus(), BLOCK, 96)
VOCAB = len(DATA.vocab)


def batch(start=0, n=24):
    """(x, y) of samples start..start+n: padded sequences, labels -100 past each one's end."""
    xs, ys = zip(*(DATA[i] for i in range(start, start + n)))
    return torch.stack(xs), torch.stack(ys)


def lm(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return CausalLM(VOCAB, BLOCK, d=32, layers=1, heads=2, dropout=dropout)


def token_pair(out, y):
    """The slot's token losses summed, and its real tokens: a `(loss_sum, mass)` pair."""
    logits = out[0] if isinstance(out, tuple) else out
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum")
    return loss, (y != IGNORE).sum()


@dataclass
class Output:
    """What a Hugging Face model returns, in the part the step reads."""

    loss: torch.Tensor
    logits: torch.Tensor


class HFStyle(torch.nn.Module):
    """`model(input_ids=, attention_mask=, labels=)` -> Output(loss, logits); the loss is the mean
    over labels[:, 1:] != -100 of the next-token cross-entropy (Hugging Face's causal LM loss)."""

    def __init__(self, seed=0, dropout=0.1):
        super().__init__()
        self.lm = lm(seed, dropout)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits, _ = self.lm(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE)
        return Output(loss, logits)


def hf_batch(start=0, n=24):
    """A mapping batch: labels are the inputs with -100 at the padding (HF's convention)."""
    x, y = batch(start, n)
    labels = x.clone()
    labels[y == IGNORE] = IGNORE
    return {"input_ids": x, "attention_mask": (y != IGNORE).long(), "labels": labels}


def hf_tokens(b, _):
    """A Hugging Face causal LM's mass: the shifted labels that are not -100."""
    return (b["labels"][:, 1:] != IGNORE).sum()


def token_mean_grad(model, loss_of):
    """Plain torch: the gradient of `loss_of(model)` (a token mean over the whole batch)."""
    model.zero_grad()
    loss_of(model).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def rel(a, b):
    """max |a - b| / max |b| over every parameter."""
    num = max(float((x - y).abs().max()) for x, y in zip(a, b))
    return num / max(float(y.abs().max()) for y in b)
