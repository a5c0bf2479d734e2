"""torch's own clipping over a module whose gradient is sharded (issue 43 item 3): in
`partition="grads"` and `"params"` `.grad` is None, so `torch.nn.utils.clip_grad_norm_` would clip
nothing; it is refused by name (`torch-clip-sharded`), in every spelling torch exports, and the
advice works (value clipping on the shard gives `clip_grad_value_`'s bits in `"none"`). Over the
parameters of `"none"` and `"state"` (whole `.grad`), of no DataParallel, or of a freed one,
torch's functions run as they are. Skips without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.utils as utils  # noqa: E402
import torch.nn.utils.clip_grad as clip_grad  # noqa: E402
from mpi4py import MPI  # noqa: E402

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, clip_guard  # noqa: E402

from lm_common import BLOCK, VOCAB, CausalLM, batch, token_pair  # noqa: E402


def lm():
    torch.manual_seed(0)
    return CausalLM(VOCAB, BLOCK, d=32, layers=2, heads=2, dropout=0.1)


def u32(t):
    return t.detach().contiguous().numpy().view(np.uint32)


def stepped(partition):
    model = lm()
    dp = DataParallel(model, MPI.COMM_SELF, slots=2, seed=1, partition=partition)
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-2)
    dp.step(*batch(0, 8), token_pair)
    return model, dp, opt


@pytest.mark.parametrize("partition", ["grads", "params"])
@pytest.mark.parametrize(
    "call",
    [
        lambda ps: utils.clip_grad_norm_(ps, 1.0),
        lambda ps: clip_grad.clip_grad_norm_(ps, 1.0, norm_type=2.0),
        lambda ps: utils.clip_grad_norm(ps, 1.0),
        lambda ps: utils.clip_grad_value_(ps, 0.1),
        lambda ps: utils.clip_grads_with_norm_(ps, 1.0, torch.tensor(2.0)),
        lambda ps: utils.clip_grad_norm_(next(iter(ps)), 1.0),  # one tensor, as torch accepts
    ],
    ids=["norm_", "clip_grad.norm_", "norm", "value_", "with_norm_", "one-tensor"],
)
def test_torch_s_clipping_of_a_sharded_gradient_is_refused_by_name(partition, call):
    model, dp, _ = stepped(partition)
    with pytest.raises(Refusal) as e:
        call(model.parameters())
    assert e.value.code == "torch-clip-sharded"
    assert partition in str(e.value) and "dp." in str(e.value)
    # nothing changed: the shard is still the step's, and dp's own clipping runs
    before = u32(dp.grads.flat).copy()
    dp.clip_grad_norm_(1e9)
    assert np.array_equal(before, u32(dp.grads.flat))
    dp.free()


@pytest.mark.parametrize("partition", ["grads", "params"])
def test_value_clipping_on_the_shard_gives_clip_grad_value_s_bits_in_none(partition):
    ref, rdp, ropt = stepped("none")
    model, dp, opt = stepped(partition)
    flat = torch.cat([p.grad.reshape(-1) for p in ref.parameters() if p.requires_grad])
    v = float(flat.abs().median())  # half of the coordinates are clamped: a skipped clamp shows
    utils.clip_grad_value_(ref.parameters(), v)
    dp.grads.flat.clamp_(-v, v)
    ropt.step()
    opt.step()
    with torch.no_grad(), dp.full_parameters():
        for a, b in zip(ref.parameters(), model.parameters()):
            assert np.array_equal(u32(a), u32(b))
    rdp.free()
    dp.free()


@pytest.mark.parametrize("partition", ["none", "state"])
def test_whole_gradients_are_clipped_by_torch_as_ever(partition):
    clip_guard._install()  # the wrapper in place, as after any grads/params DataParallel
    model, dp, _ = stepped(partition)
    grads = [p.grad.clone() for p in model.parameters()]
    norm = utils.clip_grad_norm_(model.parameters(), 1e-3)
    # torch's own function on copies: the same norm and the same clipped bits
    copies = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for c, g in zip(copies, grads):
        c.grad = g
    want = utils.clip_grad_norm_.__alpha_mpi_wraps__(copies, 1e-3)
    assert u32(norm) == u32(want)
    assert norm > 1e-3  # the clip scaled every gradient
    for p, c in zip(model.parameters(), copies):
        assert np.array_equal(u32(p.grad), u32(c.grad))
    dp.free()


def test_a_freed_sharded_data_parallel_stops_refusing_and_other_parameters_never_were():
    model, dp, _ = stepped("grads")
    other = torch.nn.Linear(3, 2)
    other(torch.ones(1, 3)).sum().backward()
    assert float(utils.clip_grad_norm_(other.parameters(), 1.0)) > 0
    dp.free()
    again = DataParallel(model, MPI.COMM_SELF, slots=2, seed=1, partition="none")
    again.step(*batch(0, 8), token_pair)
    assert float(utils.clip_grad_norm_(model.parameters(), 1.0)) > 0
    again.free()
