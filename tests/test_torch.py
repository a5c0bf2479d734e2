"""alpha_mpi.torch in one process: the contract names both conversions, the gradient is the
declared tree's (checked against the independent oracle), buffers behave as documented, and
what is not supported is refused by name. Skips cleanly without torch."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import alpha_mpi.oracle as oracle  # noqa: E402
from alpha_mpi.learning import check_model  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, ModuleModel, parameter_digest  # noqa: E402

from torch_common import SUM, comm_self, one_thread  # noqa: E402,F401 (one_thread: autouse)


def mlp(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).to(dtype)


def batch(n=23, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g)


def bits32(t):
    return t.detach().numpy().reshape(-1).view(np.uint32)


def test_float32_contract_names_both_conversions_and_the_torch_settings():
    dp = DataParallel(mlp(), comm_self(), slots=4)
    c = dp.contract
    assert [x.kind for x in c.profile.conversions] == ["WidenBinary32"]
    assert c.profile.conversions[0].site == "contribution" and "binary32" in c.profile.formats
    ops = {op.formula_id: op.expression for op in c.formulas}
    assert "RoundBinary64@gradient" in ops["round-binary64-once-v1"]
    assert "normalize-once" in ops
    assert "use_deterministic_algorithms(True)" in ops["torch-slot-gradient-v4"]
    fields = dict(c.compute.fields)  # the settings are the compute identity's
    assert fields["torch.threads"] == "1" and fields["torch.version"] == torch.__version__
    assert dp.conversions == (("WidenBinary32", "contribution"), ("RoundBinary64", "gradient"))
    assert c.layout_order_ids == (dp.layout_order_id,)
    d64 = DataParallel(mlp(torch.float64), comm_self(), slots=4)
    assert [x.kind for x in d64.contract.profile.conversions] == ["KeepFormat"]
    assert "round-binary64-once-v1" not in {op.formula_id for op in d64.contract.formulas}
    assert d64.contract.digest != c.digest
    # The contract survives the checkpoint's round trip (to_dict / from_dict) with its digest.
    from alpha_mpi.numerics import NumericalContract

    assert NumericalContract.from_dict(c.to_dict()).digest == c.digest


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grad_is_the_declared_tree_of_widened_slot_gradients_normalised_once(dtype):
    """Independent oracle: per-slot gradients from a separate copy of the module, widened by
    the oracle, the declared tree evaluated in Python floats, one division, one narrowing."""
    net, ref = mlp(dtype), mlp(dtype)
    X, y = batch(dtype=dtype)
    dp = DataParallel(net, comm_self(), slots=5)
    loss = dp.step(X, y, SUM)
    from alpha_mpi.learning import slot_ranges

    leaves, mass, total = {}, 0.0, 0.0
    for s, (a, b) in enumerate(slot_ranges(len(y), 5)):
        ref.zero_grad()
        out = SUM(ref(X[a:b]), y[a:b])
        out.backward()
        g = torch.cat([p.grad.reshape(-1) for p in ref.parameters()]).numpy()
        leaves[s] = oracle.widen(g.view(np.uint32)) if dtype == torch.float32 else g.tolist()
        mass += float(b - a)
        total += float(out.detach())
    summed = oracle.evaluate(dp.tree, leaves)
    g64 = [v / mass for v in summed]
    got = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy()
    if dtype == torch.float32:
        assert np.array_equal(got.view(np.uint32), np.array(oracle.narrow(g64), dtype=np.uint32))
    else:
        assert np.array_equal(got.view(np.uint64), np.array(oracle.bits(g64), dtype=np.uint64))
    assert np.isfinite(loss) and abs(loss - total / mass) < 1e-5


def test_batchnorm_buffers_are_refused_by_name_unless_a_rule_is_chosen():
    net = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3))
    with pytest.raises(Refusal) as e:
        DataParallel(net, comm_self(), slots=4)
    assert e.value.code == "torch-buffers-refused"
    assert "1.running_mean" in e.value.context["buffers"]
    with pytest.raises(Refusal) as e:
        ModuleModel(net)
    assert e.value.code == "torch-buffers-refused"


def test_slot_mean_rule_every_slot_from_the_step_buffers_then_the_mean_over_slots():
    torch.manual_seed(3)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )
    ref = torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )
    ref.load_state_dict(net.state_dict())
    X, y = batch(24)
    dp = DataParallel(net, comm_self(), slots=4, buffers="slot-mean")
    assert "buffers-slot-mean-v1" in {op.formula_id for op in dp.contract.formulas}
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    per_slot = []
    for s in range(4):
        ref.load_state_dict(start)
        ref(X[6 * s : 6 * s + 6])
        per_slot.append(
            {k: v.clone() for k, v in ref.state_dict().items() if "running" in k or "tracked" in k}
        )
    dp.step(X, y, SUM)
    bn = net[1]
    for name in ("running_mean", "running_var"):
        leaves = {s: oracle.widen(per_slot[s][f"1.{name}"].numpy().view(np.uint32)) for s in range(4)}
        want = oracle.narrow([v / 4.0 for v in oracle.evaluate(dp.tree, leaves)])
        assert np.array_equal(bits32(getattr(bn, name)), np.array(want, dtype=np.uint32)), name
    assert int(bn.num_batches_tracked) == 1  # a counter: the value every slot's forward left


def test_a_step_a_nan_reaches_is_refused_and_leaves_nothing_to_apply():
    net = mlp()
    dp = DataParallel(net, comm_self(), slots=4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = parameter_digest(net)
    X, y = batch()
    X[20, 0] = float("nan")  # in the last slot
    with pytest.raises(Refusal) as e:
        dp.step(X, y, SUM)
    assert e.value.code.startswith("non-finite")
    assert all(p.grad is None for p in net.parameters())
    opt.step()
    assert parameter_digest(net) == before and dp.steps == 0


def test_unsupported_modules_losses_and_settings_are_refused_by_name():
    with pytest.raises(Refusal) as e:
        DataParallel(torch.nn.ReLU(), comm_self(), slots=2)
    assert e.value.code == "torch-module-unsupported"
    mixed = mlp()
    mixed[2].double()
    with pytest.raises(Refusal) as e:
        DataParallel(mixed, comm_self(), slots=2)
    assert e.value.code == "torch-module-unsupported" and "float32" in e.value.message
    dp = DataParallel(mlp(), comm_self(), slots=2)
    X, y = batch()
    with pytest.raises(Refusal) as e:
        dp.step(X, y, torch.nn.CrossEntropyLoss())  # a mean
    assert e.value.code == "torch-loss-invalid"
    with pytest.raises(Refusal) as e:
        dp.step(X, y, lambda out, t: out.sum(dim=1), reduction="sum")  # declared, but not a scalar
    assert e.value.code == "torch-loss-invalid"
    torch.set_num_threads(2)
    try:
        with pytest.raises(Refusal) as e:
            dp.step(X, y, SUM)
        assert e.value.code == "torch-environment-changed"
    finally:
        torch.set_num_threads(1)
    with pytest.raises(Refusal) as e:
        DataParallel(mlp(), comm_self(), slots=2, buffers="average")
    assert e.value.code == "usage"


def test_module_model_satisfies_the_protocol_and_reinitialises_from_the_seed():
    m = ModuleModel(mlp())
    X, y = batch(8)
    check_model(m, probe=(X.double().numpy(), y.numpy()))
    assert np.array_equal(m.init(4).view(np.uint64), ModuleModel(mlp(seed=9)).init(4).view(np.uint64))
    assert not np.array_equal(m.init(4), m.init(5))


def _loop(net, opt, dp, steps, X, y):
    for _ in range(steps):
        dp.step(X, y, SUM)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize(
    "make_opt", [lambda p: torch.optim.Adam(p, lr=1e-2), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)]
)
def test_save_restore_in_one_process_continues_with_the_same_bits(tmp_path, make_opt):
    X, y = batch(40)
    straight = mlp()
    dps, opts = DataParallel(straight, comm_self(), slots=4), make_opt(straight.parameters())
    _loop(straight, opts, dps, 8, X, y)
    first = mlp()
    dpf, optf = DataParallel(first, comm_self(), slots=4), make_opt(first.parameters())
    _loop(first, optf, dpf, 3, X, y)
    where = dpf.save(str(tmp_path / "ck"), optf)
    assert os.path.isdir(where)
    fresh = mlp(seed=42)  # other initial weights: all of them come from the checkpoint
    dpr, optr = DataParallel(fresh, comm_self(), slots=4), make_opt(fresh.parameters())
    dpr.restore(str(tmp_path / "ck"), optr)
    assert dpr.steps == 3
    _loop(fresh, optr, dpr, 5, X, y)
    assert parameter_digest(fresh) == parameter_digest(straight)
    other = mlp()
    dpo = DataParallel(other, comm_self(), slots=4)
    with pytest.raises(Refusal) as e:  # another optimizer class (Adam's after SGD) or momentum
        dpo.restore(str(tmp_path / "ck"), torch.optim.Adam(other.parameters(), lr=0.5, betas=(0.8, 0.9)))
    assert e.value.code == "checkpoint-config-mismatch"
    # another hand-set rate (no scheduler records one): restored to the saved rate, not refused
    hand = make_opt(other.parameters())
    hand.param_groups[0]["lr"] = 0.5
    dpo.restore(str(tmp_path / "ck"), hand)
    assert hand.param_groups[0]["lr"] == optf.param_groups[0]["lr"]


def test_a_parameter_the_loss_does_not_use_keeps_none_or_gets_zeros_when_asked():
    for unused in ("none", "zeros"):
        net = mlp()
        net.register_parameter("unused", torch.nn.Parameter(torch.ones(4)))
        dp = DataParallel(net, comm_self(), slots=3, unused=unused)
        X, y = batch(12)
        dp.step(X, y, SUM)
        if unused == "none":
            assert net.unused.grad is None  # as DDP(find_unused_parameters=True) leaves it
        else:
            assert torch.equal(net.unused.grad, torch.zeros(4))
        assert dp.n == sum(p.numel() for p in net.parameters())
        assert all(p.grad.shape == p.shape for p in net.parameters() if p is not net.unused)
    with pytest.raises(Refusal) as e:
        DataParallel(mlp(), comm_self(), slots=3, unused="zero")
    assert e.value.code == "usage"


def test_a_module_off_the_cpu_and_cuda_or_split_across_devices_is_refused_by_name():
    meta = torch.nn.Linear(3, 2, device="meta")
    with pytest.raises(Refusal) as e:
        DataParallel(meta, comm_self(), slots=2)
    assert e.value.code == "torch-module-unsupported" and "meta" in e.value.message
    split = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(Refusal) as e:
        DataParallel(split, comm_self(), slots=2)
    assert e.value.code == "torch-module-unsupported" and "not on cpu like the first" in e.value.message


def test_the_device_path_widens_one_host_copy_of_the_slots_gradients_exactly():
    """host_gradients (a module on CUDA) gives the payload the CPU path gives, word for word,
    a parameter without a gradient as zeros (run here on CPU tensors: the copy is the same call)."""
    from alpha_mpi.torch.devices import host_gradients, to_device

    m = mlp()
    params = list(m.parameters())
    X, y = batch()
    grads = list(torch.autograd.grad(SUM(m(X), y), params))
    grads[1] = None
    n = sum(p.numel() for p in params)
    want, got = np.empty(n), np.full(n, np.nan)
    off = 0
    for g, p in zip(grads, params):
        want[off : off + p.numel()] = 0.0 if g is None else g.detach().double().reshape(-1).numpy()
        off += p.numel()
    host_gradients(grads, params, torch.empty(n, dtype=torch.float32), got)
    assert np.array_equal(want.view(np.uint64), got.view(np.uint64))
    assert to_device((X, y), torch.device("cpu"))[0] is X
