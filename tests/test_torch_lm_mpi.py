"""Language models over MPI (issue 34 items 1-3): padded character sequences trained with a
`(loss_sum, tokens)` loss, with the model's own token mean (`ModuleLoss`, nanoGPT-style and a
Hugging Face-style `model(**batch)`), under declared CPU bfloat16 autocast, and with buckets
(the mass scaling inside the backward's hooks): each one digest on 1 rank, the whole world and
groups of 2 and 4 (dropout on, AdamW). Holds at any size >= 2; skips without torch."""

import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.torch import DataParallel, ModuleLoss, parameter_digest  # noqa: E402

from conftest import agree, groups  # noqa: E402
from lm_common import IGNORE, HFStyle, batch, hf_batch, hf_tokens, lm, token_pair  # noqa: E402

SLOTS = 8
TOKENS = ModuleLoss(mass=lambda x, y: (y != IGNORE).sum())

CASES = {
    "pair": dict(make=lm, loss=token_pair),
    "module": dict(make=lm, loss=TOKENS),
    "hf-mapping": dict(make=HFStyle, loss=ModuleLoss(mass=hf_tokens), mapping=True),
    "bf16-autocast": dict(make=lm, loss=token_pair, autocast=torch.bfloat16),
    "module-buckets": dict(make=lm, loss=TOKENS, bucket_mb=0.01),
    "fp16-grad-scaler": dict(make=lm, loss=TOKENS, autocast=torch.float16, scaled=True),
}


def train(comm, make, loss, mapping=False, autocast=None, bucket_mb=None, scaled=False, steps=4):
    torch.set_num_threads(1)
    model = make()
    dp = DataParallel(model, comm, slots=SLOTS, seed=2, timeout=60, autocast=autocast, bucket_mb=bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # A scale that overflows at step 0 (skipped, backed off to 2^12), then steps that train and
    # a growth (2^13 after two clean steps): on every rank alike.
    kw = dict(init_scale=2.0**24, backoff_factor=2.0**-12, growth_interval=2)
    scaler = torch.amp.GradScaler("cpu", **kw) if scaled else None
    for t in range(steps):
        if mapping:
            dp.step(hf_batch(t * 20, 20), None, loss)
        else:
            dp.step(*batch(t * 20, 20), loss, scaler=scaler)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad()
    dp.free()
    return parameter_digest(model) + (f" scale {scaler.get_scale()}" if scaled else "")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", list(CASES))
def test_one_digest_on_every_rank_count(world, case):
    from mpi4py import MPI

    kw = CASES[case]
    alone = train(MPI.COMM_SELF, **kw)
    if kw.get("scaled"):  # the overflow (back to 2^12), then a growth, happened
        agree(world, alone.endswith(f" scale {2.0**13}"), alone)
    for comm in [world, *groups(world)]:
        d = train(comm, **kw)
        agree(world, d == alone, f"{case} on {comm.Get_size()} ranks: {d[:12]} vs {alone[:12]}")


@pytest.mark.mpi(min_size=2)
def test_buckets_change_no_bits_of_a_module_mean(world):
    kw = dict(CASES["module"])
    agree(world, train(world, **kw) == train(world, **kw, bucket_mb=0.01), "buckets changed the bits")
