"""The API reference is whole (issue 37 item 6): every name in `__all__` of every public module has
its entry in docs/api.md, and the page's index is what tools/api_reference.py writes.

The tool reads the sources (no import), so `alpha_mpi.torch` is checked where torch is absent;
where a module imports here, its `__all__` as Python sees it must be what the tool read. The
strict docs build (.ci/docs.sh) then fails on any index link whose entry mkdocstrings did not
render."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
from test_public_api import DOCUMENTED

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    """A fresh copy of the tool (its parse cache is its own: one test's monkeypatch stays there)."""
    spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_reference"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["api_reference"]
    return module


def test_every_public_name_has_its_entry():
    tool = _tool()
    assert not tool.missing(tool.PAGE.read_text()), "run python tools/api_reference.py --check"


def test_the_index_is_what_the_tool_writes():
    tool = _tool()
    page = tool.PAGE.read_text()
    assert page == tool.render(page), "docs/api.md's index is stale: run python tools/api_reference.py"


def test_the_public_modules_are_the_documented_ones_and_torch():
    assert set(_tool().PUBLIC) >= {"alpha_mpi", "alpha_mpi.torch", *DOCUMENTED}


@pytest.mark.parametrize("name", _tool().PUBLIC)
def test_the_tool_reads_each_all_as_python_does(name):
    if name == "alpha_mpi.torch":
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    tool = _tool()
    assert tool.parse(name).all == list(module.__all__)
    for n in module.__all__:  # and finds the object where Python does
        obj = getattr(module, n)
        defined_in, there = tool.resolve(name, n)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__qualname__ == there:
            assert obj.__module__ == defined_in, n  # (not an alias: `Contract = NumericalContract`)


def test_the_names_issue_37_found_missing_are_there():
    page = _tool().PAGE.read_text().split("## Index of public names", 1)[1]
    for module, name in [
        ("alpha_mpi.learning", "train"),
        ("alpha_mpi.learning", "TrainConfig"),
        ("alpha_mpi.learning", "Model"),
        ("alpha_mpi.learning", "check_model"),
        ("alpha_mpi.learning", "slice_batch"),
        ("alpha_mpi.learning", "slot_generator"),
        ("alpha_mpi.learning", "SlotStream"),
        ("alpha_mpi.learning", "Preemption"),
        ("alpha_mpi", "abort_on_exception"),
        ("alpha_mpi.execution", "reset"),
        ("alpha_mpi.arrays", "sum"),
        ("alpha_mpi.torch", "summed"),
        ("alpha_mpi.torch", "ModuleModel"),
    ]:
        line = next(x for x in page.splitlines() if x.startswith(f"- `{module}`: "))
        assert f"[`{name}`][" in line, (module, name)


def test_a_directive_removed_or_a_name_added_is_found_missing(monkeypatch):
    """The checks above can fail: without the learning directive its names have no entry, and a
    name new in an `__all__` has none until a directive renders it."""
    tool = _tool()
    page = tool.PAGE.read_text()
    without = page.replace("::: alpha_mpi.learning\n", "")
    assert without != page
    gone = tool.missing(without)
    assert "alpha_mpi.learning.train" in gone and "alpha_mpi.learning.TrainConfig" in gone
    assert "alpha_mpi.Preemption" in gone  # a facade's re-export goes with its entry
    kernel = tool.parse("alpha_mpi.kernel")  # a facade: its names are rendered where defined
    monkeypatch.setattr(kernel, "all", [*kernel.all, "brand_new"])
    monkeypatch.setitem(kernel.imported, "brand_new", ("alpha_mpi.kernel.compiled", "brand_new"))
    assert tool.missing(page) == ["alpha_mpi.kernel.brand_new"]
    assert "`brand_new` (missing)" in tool.render(page)
