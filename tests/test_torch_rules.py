"""The rules of issue 20 in one process (COMM_SELF), each against a value computed another way:
the slot generators (the caller's stream untouched, slots independent), the declared-sum loss
(what is accepted, what is refused), autocast refused, accumulation as the documented formula
(RoundBinary64(WidenBinary32(.grad) + g), checked bit for bit against separate steps), the
checkpointed scheduler and registered state (refusals, adopt_lr), a changed module named as
such on restore, Preemption, and abort_on_exception letting SystemExit through. The 1/2/4-rank
bits are tests/test_torch_scripts.py's."""

import functools
import os
import signal
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from alpha_mpi import Preemption, abort_on_exception  # noqa: E402
from alpha_mpi.learning import slot_generator, slot_seed  # noqa: E402
from alpha_mpi.refusals import Refusal  # noqa: E402
from alpha_mpi.torch import DataParallel, parameter_digest, summed  # noqa: E402
from alpha_mpi.torch.checkpointing import decode_state, encode_state  # noqa: E402

F = torch.nn.functional
from conftest import alpha_command  # noqa: E402
from torch_common import SUM, Fussy, comm_self, one_thread  # noqa: E402,F401 (one_thread: autouse)


def mlp(p=0.0, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(p), torch.nn.Linear(8, 3)
    )


def batch(n=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def u32(t):
    return t.detach().numpy().view(np.uint32).copy()


def test_slot_generators_depend_on_seed_step_slot_alone_and_the_callers_stream_is_untouched():
    a = slot_generator(1, 2, 3).random(4)
    assert np.array_equal(a, slot_generator(1, 2, 3).random(4))
    others = [slot_generator(*k).random(4) for k in ((0, 2, 3), (1, 0, 3), (1, 2, 0))]
    assert all(not np.array_equal(a, o) for o in others)
    assert 0 <= slot_seed(1, 2, 3) < 2**63 and slot_seed(1, 2, 3) != slot_seed(1, 2, 4)
    with pytest.raises(Refusal) as e:
        slot_seed(-1, 0, 0)
    assert e.value.code == "usage"
    dp = DataParallel(mlp(0.5), comm_self(), slots=4)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    dp.step(*batch(), SUM)
    assert torch.equal(torch.get_rng_state(), before)  # the step drew from its own generators only


def test_a_refused_step_leaves_the_callers_stream_unchanged():
    # The caller's state is saved once per step (not per slot): a refusal after some slots have
    # reseeded the CPU generator, or at the combine after all of them, must still restore it.
    calls = []

    def second_slot_bad(out, t):
        calls.append(1)
        loss = F.cross_entropy(out, t, reduction="sum")
        return loss if len(calls) % 4 != 2 else loss.detach()  # slot 1 of each step: no graph

    X, y = batch()
    bad_X = X.clone()
    bad_X[-1, 0] = float("nan")  # the last slot's loss is NaN: refused at the combine
    for data, fn, code in [
        ((X, y), summed(second_slot_bad), "torch-loss-invalid"),
        ((bad_X, y), SUM, None),
    ]:
        dp = DataParallel(mlp(0.5), comm_self(), slots=4)
        torch.manual_seed(77)
        before = torch.get_rng_state()
        expect = torch.rand(5)
        torch.set_rng_state(before)
        with pytest.raises(Refusal) as e:
            dp.step(*data, fn)
        if code is not None:
            assert e.value.code == code
        assert torch.equal(torch.get_rng_state(), before)
        assert torch.equal(torch.rand(5), expect)  # the caller's next draw is the one it would have had
        assert dp.steps == 0 and all(p.grad is None for p in dp.params)


def test_the_slot_masks_differ_between_slots_and_steps():
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, x):
            seen.append(torch.rand(3))
            return self.lin(x)

    dp = DataParallel(Probe(), comm_self(), slots=3)
    for _ in range(2):
        dp.step(*batch(), SUM)
    assert len({tuple(t.tolist()) for t in seen}) == 6  # 2 steps x 3 slots: six different draws
    for i, (t, s) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]):
        torch.manual_seed(slot_seed(0, t, s))
        assert torch.equal(seen[i], torch.rand(3)), (t, s)


def test_a_loss_must_be_a_declared_sum():
    dp = DataParallel(mlp(), comm_self(), slots=2)
    X, y = batch()
    lam = lambda o, t: F.cross_entropy(o, t, reduction="sum")  # noqa: E731
    for bad, code in [
        (lambda o, t: F.cross_entropy(o, t), "torch-loss-undeclared"),  # a mean, and says nothing
        (lam, "torch-loss-undeclared"),  # a sum, but says nothing either
        (functools.partial(F.cross_entropy, reduction="mean"), "torch-loss-invalid"),
        (torch.nn.CrossEntropyLoss(), "torch-loss-invalid"),
    ]:
        with pytest.raises(Refusal) as e:
            dp.step(X, y, bad)
        assert e.value.code == code
    with pytest.raises(Refusal) as e:
        dp.step(X, y, lam, reduction="mean")
    assert e.value.code == "torch-loss-invalid"
    assert dp.steps == 0
    ref = DataParallel(mlp(), comm_self(), slots=2)
    want = ref.step(X, y, SUM)
    for ok in (summed(lam), functools.partial(F.cross_entropy, reduction="sum")):
        assert dp.step(X, y, ok) == want
    assert dp.step(X, y, lam, reduction="sum") == want


def test_autocast_around_the_step_or_inside_the_module_is_refused_and_the_next_step_works():
    net = mlp()
    dp = DataParallel(net, comm_self(), slots=2)
    X, y = batch()
    with pytest.raises(Refusal) as e, torch.autocast("cpu", dtype=torch.bfloat16):
        dp.step(X, y, SUM)
    assert e.value.code == "torch-autocast-refused"

    def half_loss(o, t):
        return F.cross_entropy(o.bfloat16(), t, reduction="sum")

    with pytest.raises(Refusal) as e:
        dp.step(X, y, summed(half_loss))
    assert e.value.code == "torch-autocast-refused" and all(p.grad is None for p in net.parameters())
    dp.step(X, y, SUM)
    assert all(p.grad is not None for p in net.parameters())


def test_accumulation_is_the_documented_formula_bit_for_bit():
    X, y = batch(36)
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    single = DataParallel(mlp(), comm_self(), slots=3)
    gs, sums = [], []
    for xp, yp in parts:  # each call's binary64 gradient Σg/Σn alone (the same steps, generators)
        single.step(xp, yp, SUM)
        gs.append(
            [
                torch.from_numpy(single.grads.g[a:b].copy()).view(p.shape)
                for p, (a, b) in zip(single.params, single.payload.offsets)
            ]
        )
        red = single.combine.reduced
        sums.append((red[: single.n].copy(), red[single.payload.mass_at]))
    flag = [g.float() for g in gs[0]]
    for g in gs[1:]:
        flag = [(w.double() + gi).float() for w, gi in zip(flag, g)]  # RoundBinary64(Widen(held) + g)
    assert not all(np.array_equal(u32(w), u32(sum(g).float())) for w, g in zip(flag, zip(*gs)))
    # no_sync (v2): the micro-steps' sums carried, divided once: (N_1 + N_2 + N_3) / (M_1 + M_2 + M_3)
    g64 = ((sums[0][0] + sums[1][0]) + sums[2][0]) / ((sums[0][1] + sums[1][1]) + sums[2][1])
    carried = [
        torch.from_numpy(g64[a:b]).view(p.shape).float()
        for p, (a, b) in zip(single.params, single.payload.offsets)
    ]
    for style, want in (("flag", flag), ("no_sync", carried)):
        dp = DataParallel(mlp(), comm_self(), slots=3)
        if style == "flag":
            for k, (xp, yp) in enumerate(parts):
                dp.step(xp, yp, SUM, accumulate=k > 0)
        else:
            with dp.no_sync():
                dp.step(*parts[0], SUM)
                dp.step(*parts[1], SUM)
            dp.step(*parts[2], SUM)  # the update: the carried sums and its own, divided once
        for p, w in zip(dp.params, want):
            assert np.array_equal(u32(p.grad), u32(w)), style
        dp.step(*parts[0], SUM)  # no longer accumulating: overwrites (step 3: another generator)
        alone = DataParallel(mlp(), comm_self(), slots=3)
        alone.steps = 3
        alone.params[0].data.copy_(dp.params[0].data)
        alone.step(*parts[0], SUM)
        assert np.array_equal(u32(dp.params[0].grad), u32(alone.params[0].grad))
    dp.params[0].grad_dtype = None  # torch then allows a .grad of another dtype
    dp.params[0].grad = torch.zeros(8, 6, dtype=torch.float64)
    with pytest.raises(Refusal) as e:
        dp.step(*parts[0], SUM, accumulate=True)
    assert e.value.code == "usage"


def _train(dp, opt, sched, steps, X, y):
    while dp.steps < steps:
        dp.step(X, y, SUM)
        opt.step()
        opt.zero_grad()
        sched.step()


def _setup(lr=0.05, p=0.3):
    net = mlp(p)
    dp = DataParallel(net, comm_self(), slots=3)
    opt = torch.optim.AdamW(net.parameters(), lr=lr)
    return net, dp, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)


def test_scheduler_state_is_checkpointed_and_its_absence_or_another_lr_is_refused(tmp_path):
    X, y = batch()
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 6, X, y)
    want = parameter_digest(net)
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 3, X, y)
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    net, dp, opt, sched = _setup()
    with pytest.raises(Refusal) as e:
        dp.restore(str(tmp_path / "ck"), opt)  # the scheduler's state would be lost
    assert e.value.code == "checkpoint-config-mismatch" and "scheduler" in e.value.message
    dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005) and sched.last_epoch == 3
    _train(dp, opt, sched, 6, X, y)
    assert parameter_digest(net) == want
    net, dp, opt, sched = _setup(lr=0.01)
    with pytest.raises(Refusal) as e:
        dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert e.value.code == "checkpoint-config-mismatch" and "adopt_lr=True" in e.value.message
    dp.restore(str(tmp_path / "ck"), opt, scheduler=sched, adopt_lr=True)
    assert opt.param_groups[0]["lr"] == 0.01 and sched.base_lrs == [0.01] and sched.last_epoch == 3


def test_seals_catch_accidents_and_the_manifest_sha256_exposes_a_resealed_forgery(tmp_path):
    """Issue 36 item 10, the trust model (docs/checkpoints.md, "Trust"): the seal and the hashes
    catch accidents, not an adversary who can write the directory. The scheduler's saved gamma
    edited without re-sealing is refused (checkpoint-corrupt) and nothing changes; re-sealed, it
    restores as written (a seal is no signature, as documented), but the manifest sha256 that
    `alpha-mpi checkpoint verify` prints changes with it: a digest obtained over a trusted
    channel exposes the forgery."""
    from ckpt_tools import seal_root, step_dir

    from alpha_mpi.checkpoint import open_checkpoint
    from alpha_mpi.checkpoint.paths import MANIFEST

    X, y = batch()
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 3, X, y)
    root = str(tmp_path / "ck")
    dp.save(root, opt, scheduler=sched)
    trusted = open_checkpoint(root).manifest_sha256
    d = step_dir(root)
    body = open(os.path.join(d, MANIFEST), "rb").read()
    forged = body.replace(b'"gamma": 0.1', b'"gamma": 0.5', 1)
    assert forged != body
    open(os.path.join(d, MANIFEST), "wb").write(forged)  # an accident: not re-sealed
    net, dp, opt, sched = _setup()
    before = _everything(net, dp, opt, sched)
    with pytest.raises(Refusal) as e:
        dp.restore(root, opt, scheduler=sched)
    assert e.value.code == "checkpoint-corrupt" and _everything(net, dp, opt, sched) == before
    seal_root(d, forged)  # a forger with write access re-seals
    dp.restore(root, opt, scheduler=sched)
    assert sched.gamma == 0.5  # accepted: what the documentation says a seal cannot catch
    assert open_checkpoint(root).manifest_sha256 != trusted  # what it says to compare instead
    r = alpha_command("checkpoint", "verify", root)
    assert r.returncode == 0 and trusted not in r.stdout
    assert open_checkpoint(root).manifest_sha256 in r.stdout
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "checkpoints.md")).read()
    assert "seals catch accidents, not an adversary" in docs and "not a signature" in docs


def test_registered_state_round_trips_exactly_or_is_refused_by_name(tmp_path):
    state = {"best": float("inf"), "t": (1, 0.1), "xs": [None, True, "a", 2**40], "nan": float("nan")}
    back = decode_state(encode_state(state))
    assert back["best"] == float("inf") and back["t"] == (1, 0.1) and back["xs"] == state["xs"]
    assert np.isnan(back["nan"])
    with pytest.raises(Refusal) as e:
        encode_state({"w": torch.ones(2)}, "counter")
    assert e.value.code == "torch-state-unsupported" and "counter.w" in e.value.message

    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, d):
            self.n = d["n"]

    net, dp, opt, sched = _setup()
    c = Counter()
    dp.register("counter", c)
    c.n = 7
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    net, dp, opt, sched = _setup()
    c2 = Counter()
    dp.register("counter", c2)
    dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert c2.n == 7
    with pytest.raises(Refusal) as e:
        dp.register("x", object())
    assert e.value.code == "usage"


def test_a_changed_module_is_named_on_restore_before_the_contract(tmp_path):
    _, dp, opt, _ = _setup()
    dp.save(str(tmp_path / "ck"), opt)
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))
    dp2 = DataParallel(other, comm_self(), slots=3)
    with pytest.raises(Refusal) as e:
        dp2.restore(str(tmp_path / "ck"), torch.optim.AdamW(other.parameters(), lr=0.05))
    assert e.value.code == "checkpoint-config-mismatch" and "model" in e.value.message, e.value
    assert "--" not in e.value.advice  # worded for the Python API; the command line words its own


def test_preemption_sets_the_flag_on_a_signal_and_the_step_agrees_on_it():
    X, y = batch()
    with Preemption() as pre:
        dp = DataParallel(mlp(), comm_self(), slots=2, preemption=pre)
        dp.step(X, y, SUM)
        assert not pre.requested and not pre.agreed and not dp.stop_agreed
        os.kill(os.getpid(), signal.SIGUSR1)
        assert pre.requested and not pre.agreed  # local only, until the next combine carries it
        dp.step(X, y, SUM)
        assert pre.agreed and dp.stop_agreed
        with pytest.raises(SystemExit) as e:
            pre.exit()
        assert e.value.code == 99
    assert signal.getsignal(signal.SIGUSR1) is not pre._handler  # the old handler is back


def test_abort_on_exception_lets_system_exit_through_and_restores_the_hook():
    old = sys.excepthook
    hook = abort_on_exception()
    assert sys.excepthook == hook._hook
    with pytest.raises(SystemExit), hook:
        raise SystemExit(99)  # an agreed exit (after a preemption checkpoint) is not a crash
    assert sys.excepthook is old


# ------------------------------------------- restores are all or nothing (issue 36 items 5, 6)
def _everything(net, dp, opt, sched):
    """What a restore may change, as bits and values: parameters, optimizer state and groups,
    the scheduler, the steps."""
    state = {
        id(p): {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
        for p, s in opt.state.items()
    }
    return (
        [u32(p).tobytes() for p in net.parameters()],
        repr(sorted((i, sorted((k, repr(v)) for k, v in s.items())) for i, s in enumerate(state.values()))),
        repr([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
        repr(sched.state_dict()),
        dp.steps,
    )


def _two_groups(net, swap=False):
    first, second = list(net[0].parameters()), list(net[3].parameters())
    if swap:
        first, second = second, first
    return torch.optim.AdamW([{"params": first, "lr": 0.05}, {"params": second, "lr": 0.01}])


def test_param_groups_are_compared_by_membership(tmp_path):
    """Two groups of the same sizes and hyperparameters but with their parameters swapped would
    give every parameter the other group's learning rate: refused, learner untouched."""
    X, y = batch()
    net = mlp()
    dp = DataParallel(net, comm_self(), slots=3)
    opt = _two_groups(net)
    dp.step(X, y, SUM)
    opt.step()
    dp.save(str(tmp_path / "ck"), opt)
    net2 = mlp(seed=5)
    dp2 = DataParallel(net2, comm_self(), slots=3)
    swapped = _two_groups(net2, swap=True)
    for g in swapped.param_groups:  # same lrs in the same group order: only membership differs
        g["lr"], g["initial_lr"] = (0.05, 0.05) if g is swapped.param_groups[0] else (0.01, 0.01)
    sched = torch.optim.lr_scheduler.StepLR(swapped, 2)
    before = _everything(net2, dp2, swapped, sched)
    with pytest.raises(Refusal) as e:
        dp2.restore(str(tmp_path / "ck"), swapped)
    assert e.value.code == "checkpoint-config-mismatch" and "param groups" in e.value.message
    assert _everything(net2, dp2, swapped, sched) == before
    dp2.restore(str(tmp_path / "ck"), _two_groups(net2))  # the same membership restores
    assert [u32(p).tobytes() for p in net2.parameters()] == [u32(p).tobytes() for p in net.parameters()]


def test_a_scheduler_of_another_class_under_the_same_name_is_refused(tmp_path):
    X, y = batch()
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 3, X, y)
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)  # a StepLR
    net, dp, opt, _ = _setup()
    other = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    before = _everything(net, dp, opt, other)
    with pytest.raises(Refusal) as e:
        dp.restore(str(tmp_path / "ck"), opt, scheduler=other)
    assert e.value.code == "checkpoint-config-mismatch" and "StepLR" in e.value.message, e.value
    assert _everything(net, dp, opt, other) == before


def test_a_registered_object_that_refuses_its_state_leaves_the_learner_as_it_was(tmp_path):
    """Was: parameters and Adam state installed, steps 0, and a bare ValueError. Now a named
    refusal before anything is installed; the next restore works."""
    X, y = batch()
    net, dp, opt, sched = _setup()
    dp.register("fussy", Fussy(fail=False))
    dp.registered["fussy"].n = 7
    _train(dp, opt, sched, 3, X, y)
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 1, X, y)  # some state of its own to keep
    fussy = Fussy()
    dp.register("fussy", fussy)
    before = _everything(net, dp, opt, sched)
    with pytest.raises(Refusal) as e:
        dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert e.value.code == "checkpoint-config-mismatch" and "not my kind of state" in e.value.message
    assert _everything(net, dp, opt, sched) == before and fussy.n == 0
    fussy.fail = False
    dp.restore(str(tmp_path / "ck"), opt, scheduler=sched)
    assert fussy.n == 7 and dp.steps == 3 and sched.last_epoch == 3


def test_restore_without_latest_continues_from_the_newest_complete_step(tmp_path):
    X, y = batch()
    net, dp, opt, sched = _setup()
    _train(dp, opt, sched, 2, X, y)
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    _train(dp, opt, sched, 4, X, y)
    dp.save(str(tmp_path / "ck"), opt, scheduler=sched)
    want = parameter_digest(net)
    os.remove(tmp_path / "ck" / "latest")  # a first save killed before it moved latest
    net, dp, opt, sched = _setup()
    assert dp.restore(str(tmp_path / "ck"), opt, scheduler=sched, missing_ok=True).endswith("step-00000004")
    assert dp.steps == 4 and parameter_digest(net) == want
