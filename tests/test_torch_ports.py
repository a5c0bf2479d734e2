"""A DDP script ported without surprises (issue 44), one process: accumulation under no_sync()
as the exact token mean of the accumulated batch (its declared formula bit for bit, and plain
torch's gradient), `dp.updates`, the step's value, `dp.clip_grad_norm_` (its block grid against
an independent pairwise oracle, torch's coefficient), a hand-set learning rate resumed without
adopt_lr, and the repeated-epoch warning. Skips without torch."""

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import (  # noqa: E402
    DataParallel,
    RepeatedEpochWarning,
    SlotSampler,
    StepValue,
    clipping,  # noqa: E402
)

from lm_common import IGNORE, batch, lm, rel, token_mean_grad, token_pair  # noqa: E402
from torch_common import comm_self  # noqa: E402

SLOTS = 4


def u32(t):
    return t.detach().contiguous().view(torch.int32).numpy()


def micro_batches():
    """Two micro-batches whose real tokens differ (padding), so the mean of means is not the
    token mean of the concatenated batch."""
    (x0, y0), (x1, y1) = batch(0, 12), batch(40, 12)
    assert int((y0 != IGNORE).sum()) != int((y1 != IGNORE).sum())
    return (x0, y0), (x1, y1)


def test_no_sync_accumulation_is_plain_torchs_token_mean_of_the_whole_batch():
    (x0, y0), (x1, y1) = micro_batches()
    model = lm(dropout=0.0)
    ref = lm(dropout=0.0)
    ref.load_state_dict(model.state_dict())
    X, Y = torch.cat([x0, x1]), torch.cat([y0, y1])
    want = token_mean_grad(
        ref,
        lambda m: torch.nn.functional.cross_entropy(m(X)[0].flatten(0, 1), Y.flatten(), ignore_index=IGNORE),
    )
    dp = DataParallel(model, comm_self(), slots=SLOTS)
    # DDP's loop with `/ accum` deleted: no_sync for the first micro-batch, the update after
    with dp.no_sync():
        dp.step(x0, y0, token_pair)
    assert all(p.grad is None for p in model.parameters())  # carried, not written
    dp.step(x1, y1, token_pair)
    got = [p.grad for p in model.parameters()]
    for g, w in zip(got, want):
        assert rel([g], [w]) <= 1e-5
    # v1 (each call's mean added) is what the port silently trained on: far from it
    dp2 = DataParallel(lm(dropout=0.0), comm_self(), slots=SLOTS)
    dp2.module.load_state_dict(model.state_dict())
    dp2.step(x0, y0, token_pair)
    dp2.step(x1, y1, token_pair, accumulate=True)
    assert rel([p.grad for p in dp2.params], want) > 0.3
    assert (dp.steps, dp.updates) == (2, 1)


def test_no_sync_accumulation_is_its_declared_formula_bit_for_bit():
    (x0, y0), (x1, y1) = micro_batches()
    x2, y2 = batch(70, 8)
    parts = [(x0, y0), (x1, y1), (x2, y2)]
    single = DataParallel(lm(dropout=0.1), comm_self(), slots=SLOTS, seed=3)
    sums = []
    for xp, yp in parts:  # each call's combined numerator and mass alone (the same steps, seeds)
        single.step(xp, yp, token_pair)
        red = single.combine.reduced
        sums.append((red[: single.n].copy(), red[single.payload.mass_at]))
    N = (sums[0][0] + sums[1][0]) + sums[2][0]
    M = (sums[0][1] + sums[1][1]) + sums[2][1]
    want = torch.from_numpy(N / M).float()  # RoundBinary64: nearest-even
    model = lm(dropout=0.1)
    dp = DataParallel(model, comm_self(), slots=SLOTS, seed=3)
    with dp.no_sync():
        dp.step(*parts[0], token_pair)
        dp.step(*parts[1], token_pair)
    dp.step(*parts[2], token_pair)
    flat = torch.cat([p.grad.reshape(-1) for p in dp.params])
    assert np.array_equal(u32(flat), u32(want))
    # v1's sum of the calls' means gives other bits: the test can tell
    mean_of_means = sum(torch.from_numpy(n / m) for n, m in sums).float()
    assert not np.array_equal(u32(mean_of_means), u32(want))
    assert (dp.steps, dp.updates) == (3, 1)
    dp.step(*parts[0], token_pair)  # outside the block: overwrites, one update more
    assert (dp.steps, dp.updates) == (4, 2)


def test_pending_accumulation_refuses_save_restore_and_clipping(tmp_path):
    model = lm()
    dp = DataParallel(model, comm_self(), slots=SLOTS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batch(0, 8)
    with dp.no_sync():
        dp.step(x, y, token_pair)
        for call in (
            lambda: dp.save(str(tmp_path / "ck"), opt),
            lambda: dp.restore(str(tmp_path / "ck"), opt, missing_ok=True),
            lambda: dp.clip_grad_norm_(1.0),
        ):
            with pytest.raises(Refusal) as e:
                call()
            assert e.value.code == "accumulation-pending" and "inside no_sync()" in str(e.value)
    with pytest.raises(Refusal) as e:  # the block ended, the update has not run
        dp.save(str(tmp_path / "ck"), opt)
    assert e.value.code == "accumulation-pending" and "after a no_sync() block" in str(e.value)
    dp.step(x, y, token_pair)
    opt.step()
    dp.save(str(tmp_path / "ck"), opt)
    assert (dp.steps, dp.updates) == (2, 1)


def test_updates_are_saved_and_restored(tmp_path):
    model = lm()
    dp = DataParallel(model, comm_self(), slots=SLOTS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for t in range(3):
        with dp.no_sync():
            dp.step(*batch(t * 16, 8), token_pair)
        dp.step(*batch(t * 16 + 8, 8), token_pair)
        opt.step()
        opt.zero_grad()
    assert (dp.steps, dp.updates) == (6, 3)
    dp.save(str(tmp_path / "ck"), opt)
    other = lm(seed=5)
    dp2 = DataParallel(other, comm_self(), slots=SLOTS)
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-3)
    dp2.restore(str(tmp_path / "ck"), opt2)
    assert (dp2.steps, dp2.updates) == (6, 3)
    assert dp2.state_digest(opt2) == dp.state_digest(opt)


def test_the_steps_value_works_as_a_float_and_as_a_loss_tensor():
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=SLOTS)
    x, y = batch(0, 8)
    loss = dp.step(x, y, token_pair)
    with torch.no_grad():
        s, m = token_pair(model(x), y)
    assert isinstance(loss, StepValue) and isinstance(loss, float)
    assert abs(loss.item() - float(s) / float(m)) < 1e-5
    assert type(loss.item()) is float and float(loss) == loss.item()
    assert loss * 2 == 2 * loss.item() and loss + 1 > 1 and -loss < 0
    assert f"{loss:.4f}" == f"{loss.item():.4f}" and math.isfinite(loss)
    assert loss.detach() is loss
    with pytest.raises(Refusal) as e:
        loss.backward()
    assert e.value.code == "torch-backward-refused" and "already ran" in str(e.value)
    assert dp.last_loss is loss


# clipping -------------------------------------------------------------------------------------
def _pairwise_oracle(xs):
    """Pairwise sum of a list of Python floats whose length is a power of two (recursive)."""
    if len(xs) == 1:
        return xs[0]
    h = len(xs) // 2
    return _pairwise_oracle(xs[:h]) + _pairwise_oracle(xs[h:])


def _norm_oracle(flat, block):
    """The grid's norm, written independently: pure Python, blocks of `block`, padded with 0."""
    vals = [float(v) * float(v) for v in flat]
    nb = -(-len(vals) // block)
    sums = []
    for b in range(nb):
        chunk = vals[b * block : (b + 1) * block]
        sums.append(_pairwise_oracle(chunk + [0.0] * (block - len(chunk))))
    width = 1 << (nb - 1).bit_length()
    return math.sqrt(_pairwise_oracle(sums + [0.0] * (width - nb)))


def test_the_clipping_norm_is_the_block_grids_pairwise_sum(monkeypatch):
    monkeypatch.setattr(clipping, "BLOCK", 8)  # a small grid, so the oracle runs in Python
    rng = np.random.default_rng(1)
    flat = (rng.standard_normal(83) * np.exp(rng.uniform(-12, 12, 83))).astype(np.float32).astype(np.float64)
    want = _norm_oracle(flat, 8)
    got = clipping.norm_of_blocks(clipping.block_sums(flat))
    assert np.float64(got).view(np.uint64) == np.float64(want).view(np.uint64)
    sequential = math.sqrt(sum(float(v) * float(v) for v in flat))
    assert sequential != want  # the data tells the orders apart
    # shards cut on the grid give the same block sums, whatever the cut
    for cut in (8, 40, 80):
        parts = np.concatenate([clipping.block_sums(flat[:cut]), clipping.block_sums(flat[cut:], cut)])
        assert np.array_equal(parts.view(np.uint64), clipping.block_sums(flat).view(np.uint64))
    with pytest.raises(Refusal) as e:
        clipping.block_sums(flat[3:], 3)
    assert e.value.code == "usage"


def test_clip_grad_norm_is_torchs_formula_and_refuses_a_bad_max_norm():
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=SLOTS)
    dp.step(*batch(0, 8), token_pair)
    twin = lm(dropout=0.0)
    twin.load_state_dict(model.state_dict())
    for p, q in zip(twin.parameters(), model.parameters()):
        p.grad = None if q.grad is None else q.grad.clone()
    norm = dp.clip_grad_norm_(0.05)
    tnorm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05)
    assert norm.dtype == torch.float32 and norm.dim() == 0
    assert abs(float(norm) - float(tnorm)) <= 1e-6 * float(tnorm) and float(norm) > 0.05  # it clipped
    if float(norm) == float(tnorm):  # the same float32 norm: torch's coefficient, bit for bit
        for p, q in zip(twin.parameters(), model.parameters()):
            assert np.array_equal(u32(p.grad), u32(q.grad))
    clipped = torch.cat([p.grad.reshape(-1).double() for p in dp.params]).norm()
    assert abs(float(clipped) - 0.05) < 1e-6
    for bad in (0, -1.0, "1", True):
        with pytest.raises(Refusal) as e:
            dp.clip_grad_norm_(bad)
        assert e.value.code == "usage"


# a hand-set learning rate -------------------------------------------------------------------
def _lr(it, base=3e-3, warmup=2, total=8):
    """nanoGPT's get_lr: linear warmup, then cosine to a tenth."""
    if it < warmup:
        return base * (it + 1) / warmup
    ratio = (it - warmup) / (total - warmup)
    return base / 10 + 0.5 * (1 + math.cos(math.pi * ratio)) * (base - base / 10)


def _hand_set(dp, opt, until):
    while dp.updates < until:
        for g in opt.param_groups:
            g["lr"] = _lr(dp.updates)
        with dp.no_sync():
            dp.step(*batch(dp.steps * 8 % 80, 8), token_pair)
        dp.step(*batch(dp.steps * 8 % 80, 8), token_pair)
        dp.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _fresh(seed=0):
    model = lm(seed)
    dp = DataParallel(model, comm_self(), slots=SLOTS, seed=1)
    return model, dp, torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)


def test_a_hand_set_lr_resumes_without_adopt_lr_to_the_uninterrupted_digest(tmp_path, capsys):
    model, dp, opt = _fresh()
    _hand_set(dp, opt, 6)
    want = dp.state_digest(opt)
    model, dp, opt = _fresh()
    _hand_set(dp, opt, 3)
    dp.save(str(tmp_path / "ck"), opt)
    saved_lr = opt.param_groups[0]["lr"]
    capsys.readouterr()
    model, dp, opt = _fresh(seed=7)  # built with another rate, as nanoGPT builds its optimizer
    dp.restore(str(tmp_path / "ck"), opt)
    assert f"lr [{saved_lr!r}]" in capsys.readouterr().out  # the saved rate, printed
    assert opt.param_groups[0]["lr"] == saved_lr and (dp.steps, dp.updates) == (6, 3)
    _hand_set(dp, opt, 6)
    assert dp.state_digest(opt) == want


def test_a_schedulers_other_initial_lr_is_still_refused(tmp_path):
    model, dp, opt = _fresh()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    dp.step(*batch(0, 8), token_pair)
    opt.step()
    sched.step()
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    model, dp, opt = _fresh()
    for g in opt.param_groups:
        g["lr"] = 1e-2
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    with pytest.raises(Refusal) as e:
        dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert e.value.code == "checkpoint-config-mismatch" and "initial_lr" in str(e.value)
    dp.restore(str(tmp_path / "ck"), opt, scheduler=sched, adopt_lr=True)
    assert opt.param_groups[0]["initial_lr"] == 1e-2


# the repeated epoch ---------------------------------------------------------------------------
def test_a_repeated_epoch_warns_naming_set_epoch():
    ds = list(range(40))
    dp = DataParallel(torch.nn.Linear(2, 2), comm_self(), slots=2)
    sampler = SlotSampler(ds, dp, batch_size=8, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = list(sampler)  # the first walk
        sampler.set_epoch(0)
        assert list(sampler) == first  # asked for again: no warning
        sampler.set_epoch(1, 2)  # a resume mid-epoch
        list(sampler)
        sampler.set_epoch(2)
        walked = list(sampler)
    with pytest.warns(RepeatedEpochWarning, match="set_epoch"):
        again = list(sampler)  # epoch 2 again, no set_epoch between
    assert again == walked
    sampler.set_epoch(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(sampler)


def test_an_overflow_in_a_micro_step_skips_the_whole_update():
    """float16 autocast with a GradScaler: a carried micro-step that overflowed makes the update
    an overflow (every .grad inf, scaler.step skips, the scale backs off) although the update's
    own micro-batch is finite (its scale lowered by hand between the two, for the test)."""
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=SLOTS, autocast=torch.float16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, backoff_factor=0.5, growth_interval=100)
    before = [p.detach().clone() for p in model.parameters()]
    with dp.no_sync():
        dp.step(*batch(0, 8), token_pair, scaler=scaler)
    assert all(p.grad is None for p in model.parameters())
    alone = DataParallel(lm(dropout=0.0), comm_self(), slots=SLOTS, autocast=torch.float16)
    alone.module.load_state_dict(model.state_dict())
    alone.steps = 1
    scaler._scale.fill_(2.0**8)  # finite for this batch (2^12 overflows it on examples/data/corpus.txt)
    alone.step(*batch(8, 8), token_pair, scaler=scaler)  # the update's batch alone: finite
    assert all(torch.isfinite(p.grad).all() for p in alone.params)
    dp.step(*batch(8, 8), token_pair, scaler=scaler)
    assert all(torch.isinf(p.grad).all() for p in model.parameters())
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() == 2.0**7 and dp.updates == 1
