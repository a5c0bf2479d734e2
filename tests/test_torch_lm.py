"""Language models in one process (COMM_SELF), issue 34 items 1-3: a declared mass (a loss
returning `(loss_sum, tokens)` over padded sequences), a module computing its own mean loss
(`ModuleLoss`: nanoGPT's `model(x, y)`, a Hugging Face-style `model(**batch)`), autocast
declared at construction. Each step's `.grad` is compared with plain torch's token-mean gradient
over the whole global batch (within 1e-5 relative), and with one slot bit for bit where the rule
says the scaling is exact. The 1/2/4-rank digests are tests/test_torch_lm_mpi.py's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, ModuleLoss, SlotSampler, parameter_digest  # noqa: E402

from lm_common import (  # noqa: E402
    DATA,
    IGNORE,
    HFStyle,
    batch,
    hf_batch,
    hf_tokens,
    lm,
    rel,
    token_mean_grad,
    token_pair,
)
from torch_common import comm_self, one_thread  # noqa: E402,F401 (one_thread: autouse)

F = torch.nn.functional
TOKENS = ModuleLoss(mass=lambda x, y: (y != IGNORE).sum())


def grads(dp):
    return [p.grad.detach().clone() for p in dp.params]


def plain_token_mean(x, y):
    def loss_of(model):
        logits, _ = model(x)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)

    return loss_of


@pytest.mark.parametrize("form", ["pair", "module"])
def test_the_step_gradient_is_the_token_mean_over_the_padded_global_batch(form):
    x, y = batch()
    assert 0 < int((y == IGNORE).sum()) < y.numel() // 2  # padded, unevenly across the slots
    want = token_mean_grad(lm(dropout=0.0), plain_token_mean(x, y))
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=6)
    loss = dp.step(x, y, token_pair if form == "pair" else TOKENS)
    assert rel(grads(dp), want) < 1e-5
    with torch.no_grad():
        plain = float(plain_token_mean(x, y)(lm(dropout=0.0)))
    assert abs(loss - plain) < 1e-5 * plain  # the step's loss: Σ loss / Σ tokens


def test_a_sample_count_mass_would_give_another_gradient():
    """The data make the mass visible: the same sums divided by the sample count instead of the
    token count are another gradient (so the test above could fail)."""
    x, y = batch()
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=6)
    dp.step(x, y, lambda o, t: token_pair(o, t)[0], reduction="sum")  # a sum, mass = samples
    want = token_mean_grad(lm(dropout=0.0), plain_token_mean(x, y))
    assert rel(grads(dp), want) > 1e-3


def test_a_module_mean_over_one_slot_is_exactly_plain_torchs_mean_gradient():
    """One slot: .grad = RoundBinary64((M * WidenBinary32(g_mean)) / M) is g_mean bit for bit,
    because M * g is exact for an integer M below 2^29 (losses.py)."""
    x, y = batch(n=8)
    model = lm(dropout=0.0)
    dp = DataParallel(model, comm_self(), slots=1)
    dp.step(x, y, ModuleLoss(mass=lambda a, b: (b != IGNORE).sum()))
    want = token_mean_grad(lm(dropout=0.0), lambda m: m(x, y)[1])
    for g, w in zip(grads(dp), want):
        assert np.array_equal(g.numpy().view(np.uint32), w.numpy().view(np.uint32))


def test_a_hugging_face_style_module_called_with_a_mapping_batch():
    b = hf_batch()
    want = token_mean_grad(HFStyle(dropout=0.0), lambda m: m(**b).loss)
    dp = DataParallel(HFStyle(dropout=0.0), comm_self(), slots=6)
    dp.step(b, None, ModuleLoss(mass=hf_tokens))
    assert rel(grads(dp), want) < 1e-5


def test_a_slot_of_padding_only_contributes_nothing_and_a_batch_of_padding_is_mass_zero():
    x, y = batch(n=12)
    y[:2] = IGNORE  # slot 0 of 6: nothing but padding (the module's mean over it is 0/0)
    dp = DataParallel(lm(), comm_self(), slots=6)
    assert np.isfinite(dp.step(x, y, TOKENS))
    y[:] = IGNORE
    for fn in (TOKENS, token_pair):
        with pytest.raises(Refusal) as e:
            dp.step(x, y, fn)
        assert e.value.code == "mass-zero" and all(p.grad is None for p in dp.params)
    assert np.isfinite(dp.step(*batch(n=12), TOKENS))  # the next step works


def test_what_a_loss_may_return():
    x, y = batch(n=12)
    dp = DataParallel(lm(), comm_self(), slots=3)
    assert np.isfinite(dp.step(x, y, lambda o, t: token_pair(o, t)))  # a pair needs no declaration
    for bad, code in [
        (lambda o, t: token_pair(o, t)[0], "torch-loss-undeclared"),  # a scalar says nothing
        (lambda o, t: (token_pair(o, t)[0], -1.0), "torch-loss-invalid"),  # a negative mass
        (lambda o, t: (token_pair(o, t)[0], float("nan")), "torch-loss-invalid"),
        (lambda o, t: (*token_pair(o, t), 1), "torch-loss-invalid"),  # three things
        (ModuleLoss(mass=lambda a, b: 1, pick=lambda out: out[0]), "torch-loss-invalid"),  # logits
    ]:
        with pytest.raises(Refusal) as e:
            dp.step(x, y, bad)
        assert e.value.code == code, bad
    for kw in ({"mass": 3}, {"mass": len, "reduction": "max"}, {"mass": len, "pick": 1}):
        with pytest.raises(Refusal) as e:
            ModuleLoss(**kw)
        assert e.value.code == "usage"


def test_step_local_without_a_sampler_batch_or_sizes_is_refused_and_with_one_works():
    x, y = batch(n=16)
    dp = DataParallel(lm(), comm_self(), slots=4)
    with pytest.raises(Refusal) as e:
        dp.step_local(x, y, token_pair)
    assert e.value.code == "slot-cut-mismatch"
    assert np.isfinite(dp.step_local(x, y, token_pair, sizes=[4, 4, 4, 4]))
    sampler = SlotSampler(DATA, dp, batch_size=16, seed=0)
    xs, ys = next(iter(torch.utils.data.DataLoader(DATA, batch_sampler=sampler)))
    assert np.isfinite(dp.step_local(xs, ys, token_pair))


# ------------------------------------------------------------------------------------ autocast
def bf16_run(steps=3, around=False, slots=4):
    model = lm()
    dp = DataParallel(model, comm_self(), slots=slots, autocast=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for t in range(steps):
        x, y = batch(start=t * 12, n=12)
        if around:  # the caller's own autocast, the declared one: accepted, the same bits
            with torch.autocast("cpu", dtype=torch.bfloat16):
                dp.step(x, y, TOKENS)
        else:
            dp.step(x, y, TOKENS)
        opt.step()
        opt.zero_grad()
    return parameter_digest(model), dp


def test_declared_cpu_bfloat16_autocast_runs_is_named_and_another_autocast_is_refused():
    d, dp = bf16_run()
    assert "autocast cpu bfloat16" in dp.contract.formulas[-1].expression
    assert d == bf16_run(around=True)[0]
    plain = DataParallel(lm(), comm_self(), slots=4)
    assert plain.contract.digest != dp.contract.digest
    x, y = batch(n=12)
    for model_dp, ctx in [
        (plain, torch.autocast("cpu", dtype=torch.bfloat16)),  # undeclared
        (dp, torch.autocast("cpu", dtype=torch.float16)),  # not the declared format
    ]:
        with pytest.raises(Refusal) as e, ctx:
            model_dp.step(x, y, TOKENS)
        assert e.value.code == "torch-autocast-refused"
        assert all(p.grad is None for p in model_dp.params)


def test_autocast_really_runs_in_bfloat16():
    """The declared autocast changes the bits (against the same run without it)."""
    got = []
    for autocast in (None, torch.bfloat16):
        dp = DataParallel(lm(), comm_self(), slots=4, autocast=autocast)
        dp.step(*batch(n=12), TOKENS)
        got.append(grads(dp))
    assert any(not torch.equal(a, b) for a, b in zip(*got))
    assert rel(got[1], got[0]) < 0.1  # the same gradient, in bfloat16's precision


def test_autocast_arguments_are_refused_by_name():
    for kw, model in [
        ({"autocast": "int8"}, lm()),
        ({"autocast": torch.bfloat16}, lm().double()),  # autocast casts float32 ops
    ]:
        with pytest.raises(Refusal) as e:
            DataParallel(model, comm_self(), slots=2, **kw)
        assert e.value.code == "usage"


# ------------------------------------------------------------------------- GradScaler, compile
def fp16_scaled(steps=3, init_scale=2.0**8):
    model = lm()
    dp = DataParallel(model, comm_self(), slots=4, autocast=torch.float16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    for t in range(steps):
        dp.step(*batch(start=t * 12, n=12), TOKENS, scaler=scaler)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return model, dp, scaler


def test_a_grad_scaler_scales_each_slot_and_its_step_unscales_exactly():
    """float16 autocast with a GradScaler: the step's .grad is S times the unscaled step's
    (a power of two: exact here), and scaler.step(opt) divides it back."""
    x, y = batch(n=12)
    dp = DataParallel(lm(), comm_self(), slots=4, autocast=torch.float16)
    dp.step(x, y, TOKENS)
    plain = grads(dp)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    dp2 = DataParallel(lm(), comm_self(), slots=4, autocast=torch.float16)
    dp2.step(x, y, TOKENS, scaler=scaler)
    scaled = grads(dp2)
    assert rel([g / 2.0**10 for g in scaled], plain) < 1e-2  # float16 rounds other products
    assert rel(scaled, plain) > 100  # the data make the scaling visible
    model, _, s = fp16_scaled()  # three clean steps: updated, the scale kept
    assert s.get_scale() == 2.0**8 and parameter_digest(model) != parameter_digest(lm())


def test_an_overflow_skips_the_update_and_backs_off_the_scale():
    model = lm()
    dp = DataParallel(model, comm_self(), slots=4, autocast=torch.float16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # S * a float16 gradient overflows
    before = parameter_digest(model)
    loss = dp.step(*batch(n=12), TOKENS, scaler=scaler)
    assert np.isfinite(loss) and all(torch.isinf(p.grad).all() for p in dp.params)
    scaler.step(opt)
    scaler.update()
    assert parameter_digest(model) == before and scaler.get_scale() == 2.0**119
    opt.zero_grad()
    with pytest.raises(Refusal) as e:  # no scaler with buckets
        DataParallel(lm(), comm_self(), slots=4, bucket_mb=1).step(*batch(n=12), TOKENS, scaler=scaler)
    assert e.value.code == "options-conflict"


def test_a_compiled_module_is_refused_by_name():
    for compiled in (torch.compile(lm()), lm()):
        if not hasattr(compiled, "_orig_mod"):
            compiled.compile()
        with pytest.raises(Refusal) as e:
            DataParallel(compiled, comm_self(), slots=2)
        assert e.value.code == "torch-compile-refused"
    model = lm()
    dp = DataParallel(model, comm_self(), slots=2)
    model.compile()  # after construction: refused at the next step
    with pytest.raises(Refusal) as e:
        dp.step(*batch(n=4), TOKENS)
    assert e.value.code == "torch-compile-refused"
