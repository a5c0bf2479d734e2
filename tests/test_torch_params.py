"""`DataParallel(partition="params")` in one process (issue 43): which parameters form the units
(the blocks of every ModuleList, the tied head in the root, names the module lacks refused);
during a slot at most the root and one unit are gathered, in the forward and in the backward;
the module outside a step is refused by name, and inside `full_parameters()` it gives the bits
of the replicated module; `.grad` is None and the gradient shard holds the replicated run's
`.grad` bits; a unit run out of order
or a parameter used outside its unit is refused by name and the next step works; the options
params mode does not run with are refused. Skips without torch."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpi4py import MPI  # noqa: E402

from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel  # noqa: E402
from alpha_mpi.torch.units import UnitPlan  # noqa: E402

from lm_common import BLOCK, VOCAB, CausalLM, batch, token_pair  # noqa: E402

SLOTS = 2


def lm(layers=3):
    torch.manual_seed(0)
    return CausalLM(VOCAB, BLOCK, d=32, layers=layers, heads=2, dropout=0.1)


def trainable(m):
    return [p for p in m.parameters() if p.requires_grad]


def names(model, idx):
    params = trainable(model)
    by_id = {id(p): k for k, p in model.named_parameters()}
    return sorted(by_id[id(params[i])] for i in idx)


def test_default_units_are_the_blocks_and_the_tied_head_is_in_the_root():
    model = lm()
    plan = UnitPlan.of(model, trainable(model))
    assert [u.name for u in plan.units] == ["blocks.0", "blocks.1", "blocks.2"]
    assert names(model, plan.root) == ["ln.bias", "ln.weight", "pos.weight", "tok.weight"]
    for u in plan.units:
        assert all(k.startswith(u.name + ".") for k in names(model, u.members))


def test_named_units_with_a_tie_across_them_put_the_weight_in_the_root():
    model = lm(layers=1)
    plan = UnitPlan.of(model, trainable(model), units=["tok", "head", "blocks.0", model.ln])
    assert [u.name for u in plan.units] == ["blocks.0", "ln"]  # tok and head: only the tied weight
    assert names(model, plan.root) == ["pos.weight", "tok.weight"]


def test_children_are_the_units_without_a_module_list():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    plan = UnitPlan.of(net, trainable(net))
    assert [u.name for u in plan.units] == ["0", "2"] and plan.root == ()


@pytest.mark.parametrize(
    "units,code",
    [
        (["blocks.0", "blocks.9"], "torch-units-unknown"),
        ([torch.nn.Linear(2, 2)], "torch-units-unknown"),
        (["blocks", "blocks.0"], "usage"),
        ("blocks", "usage"),
    ],
)
def test_units_the_module_does_not_have_are_refused_by_name(units, code):
    model = lm()
    with pytest.raises(Refusal) as e:
        UnitPlan.of(model, trainable(model), units=units)
    assert e.value.code == code


def test_units_in_another_mode_and_unsupported_options_are_refused():
    with pytest.raises(Refusal) as e:
        DataParallel(lm(), MPI.COMM_SELF, slots=SLOTS, partition="state", units=["blocks.0"])
    assert e.value.code == "usage"
    # bucket_mb, audit_slots and realization as in grads mode (its reduce-scatter combine),
    # named as params mode's; audit_digests: no rank holds a replica of the parameters
    for kw in ({"audit_slots": 1}, {"bucket_mb": 1.0}, {"audit_digests": 5}, {"realization": "halving"}):
        with pytest.raises(Refusal) as e:
            DataParallel(lm(), MPI.COMM_SELF, slots=SLOTS, partition="params", **kw)
        why = str(e.value)
        assert e.value.code == "options-conflict" and next(iter(kw)) in why and "params" in why, kw
    DataParallel(lm(), MPI.COMM_SELF, slots=SLOTS, partition="params", realization="scatter").free()


def u64(t):
    return t.detach().numpy().view(np.uint32 if t.dtype == torch.float32 else np.uint64)


def pair(partition, steps=2):
    model = lm()
    dp = DataParallel(model, MPI.COMM_SELF, slots=SLOTS, seed=1, partition=partition)
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-2)
    for _ in range(steps):
        dp.step(*batch(dp.steps * 8, 8), token_pair)
        if dp.updates < steps:
            opt.step()
            opt.zero_grad()
    return model, dp, opt


def test_grad_after_a_step_and_the_module_in_full_parameters_give_the_replicated_bits():
    ref, rdp, _ = pair("none")
    model, dp, _ = pair("params")
    # .grad is None (the combine is the reduce-scatter of grads mode); the one rank's shard is
    # the whole flat gradient, the bits of none's .grad
    assert all(q.grad is None for q in trainable(model))
    flat = torch.cat([p.grad.reshape(-1) for p in trainable(ref)])
    assert np.array_equal(u64(flat), u64(dp.grads.flat))
    x, _ = batch(40, 4)
    with pytest.raises(Refusal) as e:
        model(x)
    assert e.value.code == "torch-params-sharded"
    with pytest.raises(Refusal) as e:
        model.blocks[0](torch.zeros(1, 2, 32))
    assert e.value.code == "torch-params-sharded"
    ref.eval()
    model.eval()
    with torch.no_grad(), dp.full_parameters():
        want, got = ref(x)[0], model(x)[0]
        assert {k: v.shape for k, v in model.state_dict().items()} == {
            k: v.shape for k, v in ref.state_dict().items()
        }
        for (k, v), (_, w) in zip(ref.state_dict().items(), model.state_dict().items()):
            assert np.array_equal(u64(v), u64(w)), k
    assert np.array_equal(u64(want), u64(got))
    assert all(torch.isnan(p).all() for p in model.parameters())  # placeholders again
    with pytest.raises(Refusal):
        model(x)
    rdp.free()
    dp.free()


def test_a_slot_holds_the_root_and_at_most_one_unit_forward_and_backward():
    model = lm(layers=3)
    dp = DataParallel(model, MPI.COMM_SELF, slots=SLOTS, seed=1, partition="params")
    units = dp.shards.gathers.shards.plan.units
    seen = []

    def gathered():
        return [j for j, u in enumerate(units) if not torch.isnan(dp.params[u.members[0]]).all()]

    def after(module, args, out):
        seen.append(("F", gathered()))
        out.register_hook(lambda g: seen.append(("B", gathered())))

    for blk in model.blocks:
        blk.register_forward_hook(after)
    dp.step(*batch(0, 8), token_pair)
    # a block output's gradient arrives before that block's backward: the unit after it is held
    want = [("F", [0]), ("F", [1]), ("F", [2]), ("B", [2]), ("B", [2]), ("B", [1])]
    assert seen == want * SLOTS, seen
    assert gathered() == []
    m = dp.memory()
    assert m["params"] == dp.shards.gathers.shards.shard.numel() * 4
    dp.free()


class Reorder(torch.nn.Module):
    """Its blocks run in list order or (reverse=True) backwards; `outside`: a block's weight
    used by the module's own forward, outside that block."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.reverse, self.outside = False, False

    def forward(self, x):
        for blk in reversed(self.layers) if self.reverse else self.layers:
            x = torch.tanh(blk(x))
        if self.outside:
            x = x @ self.layers[0].weight
        return x.sum(1)


def test_a_unit_out_of_order_or_a_parameter_outside_its_unit_is_refused_and_the_next_step_works():
    net = Reorder()
    dp = DataParallel(net, MPI.COMM_SELF, slots=SLOTS, partition="params")
    X, y = torch.randn(8, 4), torch.randn(8)
    loss = torch.nn.MSELoss(reduction="sum")
    for flag in ("reverse", "outside"):
        setattr(net, flag, True)
        with pytest.raises(Refusal) as e:
            dp.step(X, y, loss)
        assert e.value.code == "torch-units-order", flag
        setattr(net, flag, False)
        assert not any(dp.grads.present) and all(p.grad is None for p in net.parameters())
        dp.step(X, y, loss)
        assert all(dp.grads.present) and torch.isfinite(dp.grads.flat).all()
        assert all(p.grad is None for p in net.parameters())
    dp.free()


def test_bf16_autocast_gives_the_bits_of_none():
    """autocast casts each gathered weight (its cached bf16 copy is what the backward saves):
    the same bits as the replicated module, which a float32 run does not give."""

    def digest(partition, autocast):
        model = lm(layers=2)
        dp = DataParallel(model, MPI.COMM_SELF, slots=SLOTS, seed=1, partition=partition, autocast=autocast)
        opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-2)
        for _ in range(2):
            dp.step(*batch(dp.steps * 8, 8), token_pair)
            opt.step()
            opt.zero_grad()
        d = dp.state_digest(opt)
        dp.free()
        return d

    want = digest("none", torch.bfloat16)
    assert digest("params", torch.bfloat16) == want
    assert digest("params", None) != want


class Checkpointed(torch.nn.Module):
    """Four units, each under torch.utils.checkpoint (non-reentrant) when `ac`: its forward runs
    again inside the backward."""

    def __init__(self, ac):
        super().__init__()
        torch.manual_seed(2)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.ac = ac

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for blk in self.layers:
            f = lambda h, blk=blk: torch.tanh(blk(h))  # noqa: E731
            x = checkpoint(f, x, use_reentrant=False) if self.ac else f(x)
        return x.sum(1)


def test_activation_checkpointing_of_units_gives_the_bits_of_none():
    def digest(partition, ac, steps=3):
        net = Checkpointed(ac)
        dp = DataParallel(net, MPI.COMM_SELF, slots=SLOTS, partition=partition)
        opt = dp.optimizer(torch.optim.AdamW, net.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        for _ in range(steps):
            X, y = torch.randn(8, 8, generator=g), torch.randn(8, generator=g)
            dp.step(X, y, torch.nn.MSELoss(reduction="sum"))
            opt.step()
            opt.zero_grad()
        d = dp.state_digest(opt)
        dp.free()
        return d

    want = digest("none", False)
    assert digest("params", True) == want
    assert digest("params", True, steps=2) != want


def test_the_step_peak_holds_o_log_slots_fold_buffers_as_grads_mode_does():
    """params combines with grads mode's reduce-scatter: between steps no per-slot payload; at
    the step's peak log2(slots) + 1 fold buffers beside the gathered root, largest unit and its
    assembly, one slot's gradients and the scratch payload (nothing assembled after the update)."""
    import math

    slots = 16
    model = lm(layers=2)
    dp = DataParallel(model, MPI.COMM_SELF, slots=slots, seed=1, partition="params")
    opt = dp.optimizer(torch.optim.AdamW, model.parameters(), lr=1e-3)
    dp.step(*batch(0, 32), token_pair)
    opt.step()
    m, n = dp.memory(opt), dp.n
    assert dp.combine.fold.planned == int(math.log2(slots)) + 1
    shards = dp.shards.gathers.shards
    unit = max(shards.units, key=lambda g: g.n)
    gathered = shards.root.nbytes() + unit.nbytes()
    widest = max(g.n + sum(ub - ua for ua, ub, _ in g.mine) for g in [shards.root, *shards.units])
    fold = 8 * dp.payload.total + 8 * dp.combine.scatter_layout.words * dp.combine.fold.planned
    assert m["grads"] == m["params"] == 4 * n and m["params_peak"] == 4 * n + gathered
    assert m["peak"] - m["at_rest"] == gathered + 8 * widest + 4 * n + fold
    none = DataParallel(lm(layers=2), MPI.COMM_SELF, slots=slots, partition="none")
    # none keeps one binary64 payload per owned slot between steps; params frees its fold
    assert none.memory()["accumulators"] > 8 * slots * n > m["accumulators"]
    none.free()
    dp.free()
