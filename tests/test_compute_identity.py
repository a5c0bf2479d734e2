"""The compute identity (issue 32): the data form (alpha_mpi.model.compute), the live reading
(alpha_mpi.kernel.compute_identity), the learner's contract, and checkpoints that record it.

On one host the BLAS thread count (threadpoolctl, changed in-process) is a real difference of
identity: a slot computed by a model that calls BLAS has other bits under it (compute_models.py
shows it in `test_the_blas_model_s_bits_follow_the_identity`, so the refusals below guard a real
difference). Kernels (OPENBLAS_CORETYPE) are set before numpy is imported: the launcher tests
(test_compute_identity_launch.py) do that.
"""

import hashlib
import json

import numpy as np
import pytest
import threadpoolctl
from ckpt_tools import comm_self, edit_root
from compute_models import BlasModel, FixedModel

from alpha_mpi import kernel
from alpha_mpi.checkpoint import open_checkpoint
from alpha_mpi.learning import MLP, BlasMLP, DataParallelLearner, check_model, slice_batch
from alpha_mpi.learning.compute_check import compute_spec
from alpha_mpi.model import ReplicateAll, build
from alpha_mpi.model.compute import COMPARED, FIELDS, RECORDED, ComputeIdentity, MachineIndependent
from alpha_mpi.numerics import NumericalContract, contract_for_plan, numerical_compatibility
from alpha_mpi.planning import plan
from alpha_mpi.refusals import Refusal

HASWELL = {"machine": "x86_64", "numpy.version": "2.4.6", "blas.kernel": "Haswell", "cpu": "Xeon A"}


def threads(n):
    return threadpoolctl.threadpool_limits(n, user_api="blas")


# ------------------------------------------------------------------------------ the data form
def test_an_identity_names_its_fields_in_one_order_and_refuses_others():
    a = ComputeIdentity.of(HASWELL)
    assert [k for k, _ in a.fields] == ["machine", "numpy.version", "blas.kernel", "cpu"]
    assert set(COMPARED).isdisjoint(RECORDED) and set(FIELDS) == set(COMPARED) | set(RECORDED)
    for bad in ({"blas.kernal": "Haswell"}, {"machine": 64}, {"machine": ""}, {"machine": "x" * 201}):
        with pytest.raises(Refusal) as e:
            ComputeIdentity.of(bad)
        assert e.value.code == "numerical-contract-invalid"
    with pytest.raises(Refusal):
        ComputeIdentity((("cpu", "a"), ("machine", "b")))  # out of FIELDS order


def test_the_digest_covers_what_changes_bits_and_not_what_is_only_recorded():
    a = ComputeIdentity.of(HASWELL)
    other_cpu = ComputeIdentity.of({**HASWELL, "cpu": "Xeon B", "kernel.isa": "avx2"})
    other_kernel = ComputeIdentity.of({**HASWELL, "blas.kernel": "Sandybridge"})
    assert a.digest == other_cpu.digest and a.differences(other_cpu) == []
    assert a.digest != other_kernel.digest
    assert a.differences(other_kernel) == [("blas.kernel", "Haswell", "Sandybridge")]
    lacking = ComputeIdentity.of({k: v for k, v in HASWELL.items() if k != "blas.kernel"})
    assert a.differences(lacking) == [("blas.kernel", "Haswell", "absent")]
    assert a.compared().get("cpu") is None and "cpu" not in a.describe()


def test_a_contract_holds_the_compared_fields_and_keeps_its_digest_without_them():
    p = plan(build("pairwise", 4, 1), ReplicateAll(), 5, size=1)
    bare = contract_for_plan(p, optimizer="adam")
    assert "compute" not in bare.to_dict()  # every contract without one keeps its digest
    ident = ComputeIdentity.of(HASWELL)
    c = contract_for_plan(p, optimizer="adam", compute=ident)
    assert c.compute == ident.compared() and c.digest != bare.digest
    assert NumericalContract.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    other = contract_for_plan(
        p, optimizer="adam", compute=ComputeIdentity.of({**HASWELL, "blas.kernel": "Zen"})
    )
    assert other.digest != c.digest
    numerical_compatibility(c, other)  # not compared there: by name, at start and on resume
    free = contract_for_plan(p, optimizer="adam", compute=MachineIndependent("model"))
    assert NumericalContract.from_dict(free.to_dict()) == free and "declared by the model" in free.describe()
    for bad in ({"kind": "compute-identity"}, {"kind": "machine-independent", "declared_by": "me"}, []):
        with pytest.raises(Refusal) as e:
            NumericalContract.from_dict({**bare.to_dict(), "compute": bad})
        assert e.value.code == "numerical-contract-invalid"


# ------------------------------------------------------------------------------ the live reading
def test_the_live_identity_reads_numpy_and_its_blas_and_follows_the_thread_count():
    with threads(1):
        one = kernel.compute_identity()
    with threads(2):
        two = kernel.compute_identity()
    import numpy

    assert one.get("numpy.version") == numpy.__version__
    for f in ("machine", "numpy.simd", "blas.library", "blas.kernel", "cpu", "kernel.isa", "kernel.build"):
        assert one.get(f), f
    assert one.get("kernel.isa") == kernel.isa_path()
    assert one.get("torch.version") is None  # torch's fields only when asked for
    assert (one.get("blas.threads"), two.get("blas.threads")) == ("1", "2")
    assert one.differences(two) == [("blas.threads", "1", "2")] and one.digest != two.digest


def test_an_isa_path_this_cpu_lacks_is_recorded_by_the_identity_and_stays_refused(monkeypatch):
    """The identity is read before the learner's first agreement: it records a bad ALPHA_MPI_ISA
    instead of raising it on one rank alone, and the kernel still refuses it at the next reading
    (MLP.init, inside the agreement: tests/test_dense_mpi.py), not only at the first."""
    from alpha_mpi.kernel import dense

    before = kernel.isa_path()
    monkeypatch.setenv(dense.ISA_ENV, "avx1024")
    monkeypatch.setattr(dense, "_env_read", False)  # as in a fresh process
    try:
        assert kernel.compute_identity().get("kernel.isa").startswith("unavailable")
        for _ in range(2):
            with pytest.raises(Refusal) as e:
                kernel.isa_path()
            assert e.value.code == "kernel-isa-unavailable" and "ALPHA_MPI_ISA=avx1024" in e.value.message
    finally:
        monkeypatch.undo()
        kernel.select_isa_path(before)
    assert kernel.compute_identity().get("kernel.isa") == before


def test_the_blas_model_s_bits_follow_the_identity():
    """The refusals below guard a real difference: under 1 and 2 BLAS threads one slot of
    BlasModel has other bits, while FixedModel's are the same."""
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    for model, differs in ((BlasModel(5, 3), True), (FixedModel(5, 3), False)):
        p, out = model.init(0), []
        for n in (1, 2):
            g = np.empty(model.n_params)
            with threads(n):
                model.loss_and_grad_sum(p, X, y, g)
            out.append(g.view(np.uint64).copy())
        assert (not np.array_equal(*out)) == differs, type(model).__name__


# ------------------------------------------------------------------------------ the learner
def test_the_learner_s_contract_names_what_its_slots_depend_on():
    ident = kernel.compute_identity()
    # The built-in MLP computes with the fixed-order kernels and says so; BlasMLP, the same
    # model on numpy/BLAS, depends on the machine and is compared.
    assert compute_spec(ident, MLP(4, 3, 2)) == MachineIndependent("model")
    assert compute_spec(ident, BlasMLP(4, 3, 2)) == ident.compared()
    assert compute_spec(ident, FixedModel(4, 2)) == MachineIndependent("model")
    assert compute_spec(ident, BlasModel(4, 2), True) == MachineIndependent("caller")
    with pytest.raises(Refusal) as e:
        compute_spec(ident, BlasModel(4, 2), "yes")
    assert e.value.code == "usage"
    for model, spec in (
        (BlasModel(4, 2), ident.compared()),
        (FixedModel(4, 2), MachineIndependent("model")),
    ):
        lr = DataParallelLearner(comm_self(), model, slots=2)
        assert lr.contract.compute == spec and lr.compute_identity.digest == ident.digest
    lr = DataParallelLearner(comm_self(), BlasModel(4, 2), slots=2, machine_independent=True)
    assert lr.contract.compute == MachineIndependent("caller")
    with pytest.raises(Refusal) as e:
        DataParallelLearner(comm_self(), BlasModel(4, 2, machine_independent="yes"), slots=2)
    assert e.value.code == "model-protocol" and "machine_independent" in e.value.message
    check_model(FixedModel(4, 2))


# ------------------------------------------------------------------------------ checkpoints
def data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((40, 6)), rng.integers(0, 3, 40)


def trained(model, steps=3, **kw):
    X, y = data()
    lr = DataParallelLearner(comm_self(), model, slots=4, **kw)
    for _ in range(steps):
        lr.train_step(slice_batch(X, y, 4, lr.my_slots))
    return lr


def bits(lr):
    return lr.final_params().view(np.uint64).copy()


def test_a_resume_under_another_identity_is_refused_by_name_and_leaves_the_learner_as_it_was(tmp_path):
    root = str(tmp_path / "ck")
    with threads(1):
        saved = trained(BlasModel(6, 3))
        saved.save(root)
    m = open_checkpoint(root).manifest
    assert m["compute"] == saved.compute_identity.to_dict() and m["compute_history"] == []
    assert m["contract"]["compute"]["fields"] == dict(saved.compute_identity.compared().fields)
    with threads(2):
        fresh = DataParallelLearner(comm_self(), BlasModel(6, 3), slots=4)
        before = bits(fresh)
        with pytest.raises(Refusal) as e:
            fresh.restore(root)
    assert e.value.code == "compute-changed" and e.value.context["fields"] == ["blas.threads"]
    assert "blas.threads: saved '1', now '2'" in e.value.message
    assert fresh.step == 0 and np.array_equal(bits(fresh), before)
    with threads(1):  # under the saved identity it resumes, with the saved bits
        again = DataParallelLearner(comm_self(), BlasModel(6, 3), slots=4)
        again.restore(root)
    assert again.step == 3 and np.array_equal(bits(again), bits(saved))


def test_an_accepted_change_resumes_and_is_recorded_in_later_manifests(tmp_path):
    root = str(tmp_path / "ck")
    with threads(1):
        trained(BlasModel(6, 3)).save(root)
    X, y = data()
    with threads(2):
        lr = DataParallelLearner(comm_self(), BlasModel(6, 3), slots=4)
        lr.restore(root, accept_compute_change=True)
        assert lr.step == 3
        lr.train_step(slice_batch(X, y, 4, lr.my_slots))
        lr.save(root)
    m = open_checkpoint(root).manifest
    assert m["step"] == 4 and m["compute"]["fields"]["blas.threads"] == "2"
    [h] = m["compute_history"]
    assert h["how"] == "accepted" and h["at_step"] == 3
    assert (h["from"]["blas.threads"], h["to"]["blas.threads"]) == ("1", "2")


def resumed_under_2_threads(model, root, saved):
    """Restore `root` under 2 BLAS threads with the saved bits, train a step and save it there;
    returns the one compute_history entry of that manifest."""
    X, y = data()
    with threads(2):
        lr = DataParallelLearner(comm_self(), model, slots=4)
        lr.restore(root)
        assert lr.step == 3 and np.array_equal(bits(lr), bits(saved))
        lr.train_step(slice_batch(X, y, 4, lr.my_slots))
        lr.save(root)
    [h] = open_checkpoint(root).manifest["compute_history"]
    return h


def test_a_machine_independent_model_resumes_under_any_identity_and_says_so(tmp_path):
    root = str(tmp_path / "ck")
    with threads(1):
        saved = trained(FixedModel(6, 3))
        saved.save(root)
    h = resumed_under_2_threads(FixedModel(6, 3), root, saved)
    assert h["how"] == "machine-independent" and h["at_step"] == 3


def pre_identity_form(m):
    """The root manifest as alpha_mpi wrote it before it recorded the compute identity: no
    `compute`, no `compute_history`, a contract without `compute` (its digest written out here)."""
    del m["compute"], m["compute_history"], m["contract"]["compute"]
    body = json.dumps(m["contract"], sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    m["contract_digest"] = hashlib.sha256(b"alpha-mpi/numerical-contract/v1\0" + body).hexdigest()


def test_a_manifest_without_an_identity_resumes_as_before_and_the_resume_is_recorded(tmp_path):
    root = str(tmp_path / "ck")
    with threads(1):
        saved = trained(BlasModel(6, 3))
        saved.save(root)
    edit_root(root, pre_identity_form)
    assert "compute" not in open_checkpoint(root).manifest
    open_checkpoint(root).verify()
    h = resumed_under_2_threads(BlasModel(6, 3), root, saved)  # identity unknown: resumed, recorded
    assert h["how"] == "unrecorded" and h["from"] is None and h["to"]["blas.threads"] == "2"


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["compute"]["fields"].update({"blas.kernel": "Zen"}),  # not the contract's
        lambda m: m["compute"]["fields"].update({"blas.kernal": "Zen"}),
        lambda m: m["compute"].update(kind="other"),
        lambda m: m.update(compute_history=[{"at_step": 1, "how": "guessed", "from": None, "to": {}}]),
        lambda m: m.update(compute_history=[{"at_step": 1, "how": "accepted", "from": None, "to": {}}]),
        lambda m: m.update(compute_history=[{"at_step": 99, "how": "unrecorded", "from": None, "to": {}}]),
        lambda m: m.update(compute_history={}),
    ],
)
def test_a_malformed_compute_record_is_refused_by_name(tmp_path, edit):
    root = str(tmp_path / "ck")
    trained(BlasModel(6, 3)).save(root)
    edit_root(root, edit)
    with pytest.raises(Refusal) as e:
        open_checkpoint(root)
    assert e.value.code == "checkpoint-manifest"
