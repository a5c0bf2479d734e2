"""The API reference is whole: every name in `__all__` of every public module is rendered in
docs/api.md, and the page's generated index links each one to where it is documented.

docs/api.md is written by hand above its index (sections, prose and the `::: target` directives
mkdocstrings renders); this tool writes the index below the marker line: per public module,
every name of its `__all__`, linked to the anchor its object is rendered under. The links make
the strict docs build (.ci/docs.sh) fail when a public name has no entry: a directive that does
not render it, or an object mkdocstrings leaves out (a constant without a docstring).

Read from the sources with `ast`, imports nothing: `__all__` (a `*_LAZY` entry is the keys of
the lazy table), `from .x import name` and the lazy tables (name -> ".module") are followed to
the module that defines each name, so a name re-exported by a facade (`alpha_mpi.plan`) is
found where it is rendered (`alpha_mpi.planning.plan`). It runs without torch or MPI, so
`alpha_mpi.torch` is checked everywhere.

    python tools/api_reference.py            # rewrite the index of docs/api.md
    python tools/api_reference.py --check    # exit 1 when a name is missing or the index is stale
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
MARKER = "<!-- The index below is written by tools/api_reference.py: do not edit it by hand. -->"

# The public modules: the package, its facades and the modules users import from. Every name
# in their `__all__` must be rendered (tests/test_public_api.py checks they have docstrings).
PUBLIC = [
    "alpha_mpi",
    "alpha_mpi.model",
    "alpha_mpi.model.tree",
    "alpha_mpi.model.topology",
    "alpha_mpi.model.coverage",
    "alpha_mpi.model.delivery",
    "alpha_mpi.model.layout",
    "alpha_mpi.model.contract",
    "alpha_mpi.model.profile",
    "alpha_mpi.model.operations",
    "alpha_mpi.model.relation",
    "alpha_mpi.model.formulas",
    "alpha_mpi.planning",
    "alpha_mpi.kernel",
    "alpha_mpi.kernel.env",
    "alpha_mpi.kernel.dense",
    "alpha_mpi.ops",
    "alpha_mpi.numerics",
    "alpha_mpi.numerics.authorization",
    "alpha_mpi.numerics.evidence",
    "alpha_mpi.numerics.conversion",
    "alpha_mpi.numerics.oracle_check",
    "alpha_mpi.execution",
    "alpha_mpi.arrays",
    "alpha_mpi.learning",
    "alpha_mpi.checkpoint",
    "alpha_mpi.torch",
    "alpha_mpi.oracle",
    "alpha_mpi.refusals",
]


@dataclass
class Module:
    """What the sources say of one module: its `__all__`, the names it defines, where its
    imported and lazy names come from."""

    name: str
    is_package: bool
    all: list[str] | None = None
    defined: set[str] = field(default_factory=set)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # local -> (module, name)


def module_file(name: str) -> tuple[Path, bool] | None:
    base = ROOT.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def _absolute(module: Module, level: int, target: str | None) -> str:
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


_CACHE: dict[str, Module | None] = {}


def parse(name: str) -> Module | None:
    """The module `name` as its source says (None when it is not in the package)."""
    if name in _CACHE:
        return _CACHE[name]
    found = module_file(name)
    if found is None:
        _CACHE[name] = None
        return None
    path, is_package = found
    m = Module(name, is_package)
    body = ast.parse(path.read_text()).body
    lazy: dict[str, str] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            m.defined.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(m, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                m.imported[a.asname or a.name] = (source, a.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if not isinstance(t, ast.Name):
                    continue
                value = node.value
                if (
                    isinstance(value, ast.Dict)
                    and value.keys
                    and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys)
                    and all(
                        isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith(".")
                        for v in value.values
                    )
                ):  # a lazy table: name -> ".module"
                    lazy.update({k.value: v.value for k, v in zip(value.keys, value.values)})
                    continue
                if t.id == "__all__":
                    m.all = _names(value, lazy, m)
                else:
                    m.defined.add(t.id)
    for local, target in lazy.items():
        level = len(target) - len(target.lstrip("."))
        m.imported.setdefault(local, (_absolute(m, level, target.lstrip(".") or None), local))
    _CACHE[name] = m
    return m


def _names(node: ast.expr, lazy: dict[str, str], m: Module) -> list[str]:
    """The names an `__all__` value lists: a list of strings, `*_LAZY` (the lazy table's names),
    `list(X) + ...` where X is another module's `__all__` imported under a name. Any other form
    is refused, never read as empty."""
    if isinstance(node, (ast.List, ast.Tuple)):
        out: list[str] = []
        for e in node.elts:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Name) and e.value.id == "_LAZY":
                out.extend(lazy)
            else:
                raise SystemExit(f"{m.name}: cannot read __all__ element {ast.unparse(e)}")
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _names(node.left, lazy, m) + _names(node.right, lazy, m)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "tuple"):
        return _names(node.args[0], lazy, m)
    if isinstance(node, ast.Name) and m.imported.get(node.id, ("", ""))[1] == "__all__":
        other = parse(m.imported[node.id][0])
        if other is not None and other.all is not None:
            return list(other.all)
    raise SystemExit(f"{m.name}: cannot read __all__ = {ast.unparse(node)}")


def resolve(module: str, name: str, depth: int = 0) -> tuple[str, str]:
    """(the module that defines `name` as `module` exports it, the name there)."""
    m = parse(module)
    if m is None or depth > 20 or name in m.defined:
        return module, name
    if name in m.imported:  # the module's own binding first, as Python's `from M import name`
        return resolve(*m.imported[name], depth + 1)
    if parse(f"{module}.{name}") is not None:  # `from package import submodule`
        return f"{module}.{name}", ""
    return module, name


def directives(page: str) -> list[str]:
    """The `::: target` lines of the hand-written part of the page, in order."""
    head = page.split(MARKER, 1)[0]
    return [line[4:].strip() for line in head.splitlines() if line.startswith("::: ")]


def rendered(targets: list[str]) -> dict[tuple[str, str], str]:
    """Object (defining module, name) -> the anchor it is rendered under: a module's directive
    renders the names of its `__all__` (or, without one, its public definitions; mkdocs.yml
    shows names without a docstring too); an object's directive renders that object. The first
    rendering wins."""
    out: dict[tuple[str, str], str] = {}
    for target in targets:
        m = parse(target)
        if m is not None:
            names = m.all if m.all is not None else [n for n in m.defined if not n.startswith("_")]
            for n in names:
                if parse(f"{target}.{n}") is not None:
                    # A package's name that is also its submodule's (planning.simulate): griffe
                    # sees the submodule there and renders nothing; give the object a directive.
                    continue
                out.setdefault(resolve(target, n), f"{target}.{n}")
            out.setdefault((target, ""), target)
            continue
        module, _, name = target.rpartition(".")
        out.setdefault(resolve(module, name), target)
    return out


def public_names() -> list[tuple[str, str]]:
    """(public module, name) for every name of every public module's `__all__`."""
    out = []
    for module in PUBLIC:
        m = parse(module)
        if m is None or m.all is None:
            raise SystemExit(f"{module}: no module, or no __all__ in it")
        out.extend((module, n) for n in m.all)
    return out


def missing(page: str) -> list[str]:
    """The public names the page's directives do not render."""
    where = rendered(directives(page))
    return [f"{m}.{n}" for m, n in public_names() if resolve(m, n) not in where]


def index(page: str) -> str:
    """The generated index: per public module, each name linked to its rendered entry."""
    where = rendered(directives(page))
    lines = [
        "## Index of public names",
        "",
        "Every name in `__all__` of each public module, linked to its entry above (a re-exported",
        "name is documented where it is defined).",
        "",
    ]
    for module in PUBLIC:
        links = []
        for n in parse(module).all:
            anchor = where.get(resolve(module, n))
            links.append(f"[`{n}`][{anchor}]" if anchor else f"`{n}` (missing)")
        lines += [f"- `{module}`: " + ", ".join(links)]
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    head = page.split(MARKER, 1)[0].rstrip("\n")
    return f"{head}\n\n{MARKER}\n\n{index(page)}"


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    gone = missing(page)
    if gone:
        print(f"docs/api.md renders no entry for {len(gone)} public name(s): {', '.join(gone)}")
        return 1
    want = render(page)
    if "--check" in argv:
        if page != want:
            print("docs/api.md's index is stale: run python tools/api_reference.py")
            return 1
        print(f"docs/api.md: every public name rendered ({len(public_names())} in {len(PUBLIC)} modules)")
        return 0
    PAGE.write_text(want)
    print(f"wrote docs/api.md's index: {len(public_names())} names in {len(PUBLIC)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
