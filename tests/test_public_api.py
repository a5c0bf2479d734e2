"""The public surface: `__all__` on the public modules, docstrings on their names, the names that
moved still importable where they were, and the verification hook outside the product API."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import alpha_mpi
from alpha_mpi import kernel

# Modules whose every `__all__` name must resolve and carry a docstring (classes and functions).
DOCUMENTED = [
    "alpha_mpi.model",
    "alpha_mpi.model.contract",
    "alpha_mpi.model.profile",
    "alpha_mpi.model.operations",
    "alpha_mpi.model.relation",
    "alpha_mpi.model.formulas",
    "alpha_mpi.model.tree",
    "alpha_mpi.model.topology",
    "alpha_mpi.model.coverage",
    "alpha_mpi.model.delivery",
    "alpha_mpi.model.layout",
    "alpha_mpi.numerics.authorization",
    "alpha_mpi.numerics.evidence",
    "alpha_mpi.numerics.conversion",
    "alpha_mpi.numerics.oracle_check",
    "alpha_mpi.refusals",
    "alpha_mpi.oracle",
    "alpha_mpi.kernel",
    "alpha_mpi.kernel.env",
    "alpha_mpi.kernel.dense",
    "alpha_mpi.ops",
    "alpha_mpi.planning",
    "alpha_mpi.execution",
    "alpha_mpi.learning",
    "alpha_mpi.arrays",
    "alpha_mpi.checkpoint",
]


# The entry points users call: every parameter and every function's return is annotated (the
# package ships py.typed, so a type checker reads these).
TYPED = ["alpha_mpi", *DOCUMENTED]


def _unannotated(obj) -> list:
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        if (
            init is None
            or not inspect.isfunction(init)
            or hasattr(obj, "__dataclass_fields__")  # generated from the annotated fields
            or getattr(obj, "_is_protocol", False)  # typing.Protocol puts its own __init__ there
        ):
            return []
        sig, where, need_return = inspect.signature(init), f"{obj.__name__}.__init__", False
    elif inspect.isfunction(obj):
        sig, where, need_return = inspect.signature(obj), obj.__name__, True
    else:
        return []
    missing = [
        f"{where}({p})" for p, v in sig.parameters.items() if p != "self" and v.annotation is inspect._empty
    ]
    if need_return and sig.return_annotation is inspect._empty:
        missing.append(f"{where} -> ?")
    return missing


@pytest.mark.parametrize("name", TYPED)
def test_public_entry_points_are_annotated(name):
    module = importlib.import_module(name)
    missing = [m for n in module.__all__ for m in _unannotated(getattr(module, n))]
    assert not missing, f"{name}: no type annotation on {missing}"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_public_modules_declare_and_document_their_names(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    assert isinstance(getattr(module, "__all__", None), (list, tuple)), f"{name} has no __all__"
    undocumented = []
    for n in module.__all__:
        obj = getattr(module, n)  # every name resolves
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (obj.__doc__ or "").strip():
            undocumented.append(n)
    assert not undocumented, f"{name}: no docstring on {undocumented}"


def test_dir_of_the_package_shows_the_lazy_names():
    names = dir(alpha_mpi)
    for n in (
        "combine",
        "Combiner",
        "allreduce",
        "Allreducer",
        "reduce_scatter",
        "assemble",
        "NumericalContract",
        "contract_for_plan",
        "numerical_compatibility",
        "plan",
        "star",
        "Layout",
        "Refusal",
    ):
        assert n in names and n in alpha_mpi.__all__, n


def test_numerics_lists_its_lazy_names_too():
    import alpha_mpi.numerics as numerics

    for n in ("authorize", "claim_equal", "measure_evidence", "SUITES", "OracleMismatch"):
        assert n in dir(numerics) and n in numerics.__all__, n


def test_the_contract_combiner_left_numerics_and_the_old_name_says_where():
    import alpha_mpi.execution as execution
    import alpha_mpi.numerics as numerics

    assert "ContractCombiner" in execution.__all__ and "ContractCombiner" not in numerics.__all__
    with pytest.raises(
        AttributeError, match=r"alpha_mpi\.numerics\.ContractCombiner moved to alpha_mpi\.execution"
    ):
        _ = numerics.ContractCombiner
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("alpha_mpi.numerics.execute")


def test_names_that_moved_are_importable_where_they_live():
    import alpha_mpi.model.contract as model_contract
    import alpha_mpi.model.formulas as formulas
    import alpha_mpi.numerics as numerics
    import alpha_mpi.numerics.authorization as authorization
    import alpha_mpi.numerics.evidence as evidence

    for name in ("NumericalContract", "contract_for_plan", "numerical_compatibility"):
        assert getattr(alpha_mpi, name) is getattr(numerics, name) is getattr(model_contract, name)
    for name in ("authorize", "claim_equal", "check_live_profile"):
        assert getattr(authorization, name) is getattr(numerics, name)
    for name in ("SUITES", "measure_evidence", "ConformanceSuite", "kernel_build_id"):
        assert getattr(evidence, name) is getattr(numerics, name)
    assert authorization.EXECUTABLE["subnormals"] == "preserved" and callable(authorization.check_evidence)
    assert numerics.DEFAULT_SUITE in numerics.SUITES and len(numerics.kernel_build_id()) == 64
    assert "adam-v1" in formulas.FORMULAS and formulas.assignments(formulas.ADAM_V1)


def test_contracts_and_the_model_import_without_numpy_or_the_kernel():
    code = (
        "import sys, alpha_mpi.model, alpha_mpi.numerics;"
        "from alpha_mpi.numerics import NumericalContract, numerical_compatibility;"
        "heavy = ('numpy', 'alpha_mpi.kernel', 'alpha_mpi.kernel._alpha_kernel', 'mpi4py');"
        "bad = [m for m in heavy if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"loaded at import: {out.stdout.strip()}"


def test_the_product_has_no_test_only_api():
    assert not hasattr(kernel, "set_ftz_daz_for_tests")
    assert not [n for n in kernel.__all__ if "test" in n or "ftz" in n]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("alpha_mpi.mutants")


@pytest.mark.skipif(
    kernel.fpenv_state()["arch"] not in ("x86_64", "aarch64"), reason="no FTZ/DAZ control here"
)
def test_the_verification_hook_switches_ftz_and_restores_it():
    from alpha_mpi import Refusal
    from alpha_mpi_verify.fpenv import ftz_daz

    assert kernel.fpenv_check()["on_profile"]
    with ftz_daz(ftz=True, daz=False):
        assert kernel.fpenv_state()["ftz"]
        with pytest.raises(Refusal) as e:
            kernel.fpenv_check()
        assert e.value.code == "fp-environment-off-profile"
    assert kernel.fpenv_check()["on_profile"]


def test_importing_the_package_loads_no_layer_and_lazy_names_beat_their_submodules():
    # Start-up (issue 42): `import alpha_mpi` loads nothing but the first-use loader; a lazy
    # name whose module has the same name (planning.realize, planning.simulate) stays the
    # function even when the module was imported first (the import system binds the module).
    code = (
        "import sys, types, alpha_mpi;"
        "loaded = sorted(m for m in sys.modules if m.startswith('alpha_mpi'));"
        "import alpha_mpi.planning.realize, alpha_mpi.planning.simulate;"
        "from alpha_mpi.planning import realize, simulate;"
        "import alpha_mpi.planning as pl;"
        "ok = isinstance(realize, types.FunctionType) and isinstance(simulate, types.FunctionType);"
        "ok = ok and pl.realize is realize and sys.modules['alpha_mpi.planning.realize'].realize is realize;"
        "print(','.join(loaded), ok)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["alpha_mpi,alpha_mpi._lazy", "True"], out.stdout


def test_the_kernels_lazy_names_are_those_of_its_modules():
    # alpha_mpi.kernel lists its names statically (they load on first use): a name added to
    # api.py or dense.py must be added to its table too.
    import alpha_mpi.kernel.api as api
    import alpha_mpi.kernel.dense as dense

    assert kernel.__all__ == [*api.__all__, *dense.__all__]
    assert all(getattr(kernel, n) is getattr(api if n in api.__all__ else dense, n) for n in kernel.__all__)
