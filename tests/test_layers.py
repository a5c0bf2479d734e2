"""The layers of DESIGN.md hold, read from the package's own imports (ast, no import is run).

Layers, each depending only on those above it:

    1 model      alpha_mpi.model, refusals, oracle (the independent oracle: no planner, no kernel),
                 _lazy (the facades' first-use loader, importing nothing of the package),
                 _record (frozen records defined without generated code: the start-up budget),
                 _sha256 (the identities' sha256 without OpenSSL: the start-up budget)
    2 planning   alpha_mpi.planning
    3 kernel     alpha_mpi.kernel (the package: api, dense, updates, buffers, env, compiled, build
                 and the compiled _alpha_kernel), numerics, ops (the dense kernels for models)
    4 execution  alpha_mpi.execution, arrays
    5 learning   alpha_mpi.learning, checkpoint, torch
    6 tools      alpha_mpi.tools (the commands and tools.bench), cli, __main__

`alpha_mpi` itself is a facade: at import time it loads only layers 1 and 2 (the other names are
resolved on first use, which no ast can see), so importing it counts as layer 2. The
verification package `alpha_mpi_verify` sits beside the product: it may import any of it, and
nothing in the product imports it.

Every import counts, also one deferred inside a function: a deferred import is still a
dependency, and a circle through one is still a circle. The one deliberate exception is listed
in DEFERRED_UPWARD with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "alpha_mpi"
VERIFY = ROOT / "alpha_mpi_verify"

LAYER_NAMES = {1: "model", 2: "planning", 3: "kernel", 4: "execution", 5: "learning", 6: "tools"}

# Longest prefix wins; a module must fall under one of these (or the root facade).
LAYERS = {
    "alpha_mpi.model": 1,
    "alpha_mpi.refusals": 1,
    "alpha_mpi.oracle": 1,
    "alpha_mpi._lazy": 1,
    "alpha_mpi._record": 1,
    "alpha_mpi._sha256": 1,
    "alpha_mpi.planning": 2,
    "alpha_mpi.kernel": 3,
    "alpha_mpi.numerics": 3,
    "alpha_mpi.ops": 3,  # the dense kernels with allocation, for users' models
    "alpha_mpi.execution": 4,
    "alpha_mpi.arrays": 4,  # decomposition-independent array reductions over a communicator
    "alpha_mpi.learning": 5,
    "alpha_mpi.checkpoint": 5,
    "alpha_mpi.torch": 5,
    "alpha_mpi.tools": 6,
    "alpha_mpi.cli": 6,
    "alpha_mpi.__main__": 6,
}
FACADE = "alpha_mpi"
FACADE_LAYER = 2

#: (importer, imported) -> why this one upward dependency is deliberate. Only deferred imports
#: (inside a function) may be listed; each is excluded from the circle check as well.
DEFERRED_UPWARD: dict = {}

#: importer module -> why its upward import is known and left to the owner of that file (xfail).
KNOWN_VIOLATIONS: dict = {}

#: a module of a known circle -> why the circle is left to the owner of those files (xfail).
KNOWN_CIRCLES: dict = {}


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources():
    out = {}
    for base in (PACKAGE, VERIFY):
        for path in sorted(base.rglob("*.py")):
            out[_module_name(path, base)] = path
    return out


SOURCES = _sources()


def _resolve(importer: str, is_package: bool, node) -> list:
    """Absolute names an import statement depends on (submodules where the name is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = importer.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module
    names = []
    for a in node.names:
        sub = f"{mod}.{a.name}"
        names.append(sub if sub in SOURCES or sub == "alpha_mpi.kernel._alpha_kernel" else mod)
    return names


def imports_of(module: str) -> list:
    """[(imported module, line, deferred)] for the alpha_mpi / alpha_mpi_verify imports of one module."""
    path = SOURCES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out = []

    def visit(node, deferred):
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in _resolve(module, is_package, child):
                    if name.split(".")[0] in ("alpha_mpi", "alpha_mpi_verify"):
                        out.append((name, child.lineno, deferred))
            visit(child, inner)

    visit(tree, False)
    return out


def layer_of(module: str):
    if module == FACADE:
        return FACADE_LAYER
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, layer)
    return None if best is None else best[1]


PRODUCT = sorted(m for m in SOURCES if m.split(".")[0] == "alpha_mpi")


def _param(module):
    reason = KNOWN_VIOLATIONS.get(module)
    marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
    return pytest.param(module, marks=marks, id=module)


def test_every_product_module_has_a_layer():
    unplaced = [m for m in PRODUCT if layer_of(m) is None]
    assert not unplaced, f"place these modules in LAYERS (DESIGN.md 'Layers'): {unplaced}"


@pytest.mark.parametrize("module", [_param(m) for m in PRODUCT])
def test_imports_run_only_down_the_layers(module):
    mine = layer_of(module)
    if mine is None:
        pytest.skip("not placed (see test_every_product_module_has_a_layer)")
    wrong = []
    for name, line, deferred in imports_of(module):
        if name.split(".")[0] == "alpha_mpi_verify":
            wrong.append(f"line {line}: {name} (the product never imports the verification package)")
            continue
        theirs = layer_of(name)
        if theirs is None or theirs <= mine:
            continue
        if deferred and (module, name) in DEFERRED_UPWARD:
            continue
        how = "deferred " if deferred else ""
        wrong.append(
            f"line {line}: {how}import of {name} ({LAYER_NAMES[theirs]}) from a {LAYER_NAMES[mine]} module"
        )
    assert not wrong, f"{module} imports up the layers:\n  " + "\n  ".join(wrong)


def test_the_facade_loads_only_the_pure_layers_at_import_time():
    eager = [(n, line) for n, line, deferred in imports_of(FACADE) if not deferred]
    above = [(n, line) for n, line in eager if (layer_of(n) or 99) > FACADE_LAYER]
    assert not above, f"alpha_mpi/__init__.py imports {above} at import time; resolve them lazily"


def test_the_oracle_shares_no_code_with_the_planner_or_the_kernel():
    used = [n for n, _, _ in imports_of("alpha_mpi.oracle")]
    assert all(layer_of(n) == 1 for n in used), f"alpha_mpi.oracle imports {used}"
    assert not [
        n for n in used if n.startswith(("alpha_mpi.planning", "alpha_mpi.kernel", "alpha_mpi.numerics"))
    ]


def _imports_torch(module: str) -> list:
    """Lines where `module` imports the third-party torch (import torch, from torch... import)."""
    path = SOURCES[module]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            out.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "torch"
        ):
            out.append(node.lineno)
    return out


def test_torch_code_lives_in_alpha_mpi_torch_and_learning_reaches_it_once():
    """torch's environment code and ModuleModel are alpha_mpi.torch's (issue 37 item 2): no
    learning module imports torch itself, and the one import of alpha_mpi.torch from the learning
    layer is model_from_spec's, deferred (a factory's nn.Module wrapped when a learner is built;
    never at import time or in a step)."""
    learning = [m for m in PRODUCT if m == "alpha_mpi.learning" or m.startswith("alpha_mpi.learning.")]
    torch_users = {m: lines for m in learning if (lines := _imports_torch(m))}
    assert not torch_users, f"learning modules import torch (move the code to alpha_mpi.torch): {torch_users}"
    back = sorted(
        (m, n, deferred)
        for m in learning
        for n, _, deferred in imports_of(m)
        if n == "alpha_mpi.torch" or n.startswith("alpha_mpi.torch.")
    )
    assert back == [("alpha_mpi.learning.protocol", "alpha_mpi.torch.module_model", True)], back


def test_deferred_exceptions_are_still_needed_and_deferred():
    for (importer, imported), _reason in DEFERRED_UPWARD.items():
        found = [deferred for n, _, deferred in imports_of(importer) if n == imported]
        assert found, f"{importer} no longer imports {imported}: remove it from DEFERRED_UPWARD"
        assert all(found), (
            f"{importer} imports {imported} at import time; only a deferred import may be excepted"
        )


def _graph():
    graph = {}
    for module in SOURCES:
        graph[module] = {
            n
            for n, _, _ in imports_of(module)
            if n in SOURCES and n != module and (module, n) not in DEFERRED_UPWARD
        }
    return graph


def _cycles(graph) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _cycle_params():
    graph = _graph()
    params = []
    for comp in _cycles(graph):
        reason = next((KNOWN_CIRCLES[m] for m in comp if m in KNOWN_CIRCLES), None)
        marks = [pytest.mark.xfail(reason=reason, strict=False)] if reason else []
        params.append(pytest.param(comp, marks=marks, id=" <-> ".join(comp)))
    return params or [pytest.param(None, id="none")]


@pytest.mark.parametrize("cycle", _cycle_params())
def test_no_import_circle(cycle):
    assert cycle is None, f"import circle (counting deferred imports): {' -> '.join(cycle)}"


def test_the_circle_finder_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
