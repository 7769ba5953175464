"""The layout is the architecture: who may import whom, checked on the source (README, "Layout")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import contracts

ROOT = Path(__file__).resolve().parent.parent
OURS = {"contracts", "reference", "triton_impl", "cpu_impl", "conformance", "compositions"}
# A package may import, of specdiff, only these (itself included).
ALLOWED = {
    "contracts": {"contracts"},  # the contract is data: it depends on nothing it judges
    "reference": {"contracts", "reference"},  # the oracle states semantics; the harness applies the contract
    "triton_impl": {"triton_impl"},
    "cpu_impl": {"contracts", "cpu_impl"},  # the launchers read the contract to validate a launch
}


def imported(path: Path) -> set[str]:
    """The top-level packages of specdiff a module imports, at any depth (late imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_its_layer_may(package):
    wrong = {str(p.relative_to(ROOT)): sorted(imported(p) - ALLOWED[package]) for p in sorted((ROOT / package).rglob("*.py"))}
    assert not {k: v for k, v in wrong.items() if v}, f"{package} imports outside its layer"


def test_the_harness_core_imports_none_of_its_tools():
    # The tools (conformance/tools/) build on the core; the CLI loads them by name.
    core = [p for p in sorted((ROOT / "conformance").rglob("*.py")) if "tools" not in p.relative_to(ROOT).parts]
    offenders = []
    for p in core:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{p.relative_to(ROOT)}: {n}" for n in names if n.startswith("conformance.tools")]
    assert not offenders


def test_the_layout_checks_see_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from conformance.runner import run_case\n    import reference.gumbel\n")
    assert imported(bad) == {"conformance", "reference"}


@pytest.mark.parametrize("spec", [s for s in contracts.SPECS.values() if isinstance(s.explain, str)], ids=lambda s: s.name)
def test_an_explanation_named_by_a_contract_exists(spec):
    from conformance.runner import explainer

    assert callable(explainer(spec)), spec.explain


def test_the_readme_layout_table_names_what_the_tree_has():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| layer | what it is |"):].split("\n\n", 1)[0]
    named = {p for row in table.splitlines()[2:] for p in re.findall(r"`([\w./-]+/(?:[\w.]+)?)`", row.split("|")[1])}
    assert named >= {"contracts/", "reference/", "triton_impl/", "conformance/", "conformance/tools/", "compositions/"}
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []
    # Every package of the tree is in the table.
    packages = {f"{p.parent.relative_to(ROOT)}/" for p in ROOT.glob("*/__init__.py")} | {"conformance/tools/"}
    assert packages <= named | {"tests/", "benchmarks/"}, packages - named


# -- import circles and private names --------------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in sorted(OURS) for p in sorted((ROOT / package).rglob("*.py"))}


def _known(name: str) -> str | None:
    """The project module ``name`` is, or the nearest package holding it; None outside the project."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <module> import ...`` (relative imports resolved against ``module``)."""
    if node.level == 0:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _imported_by_name(call: ast.Call) -> set[str | None]:
    """The modules ``importlib.import_module(...)`` loads: a literal name, or every module of the package an
    f-string starts with (``f"conformance.tools.{tool}"``); nothing for a name built otherwise."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name != "import_module" or not call.args:
        return set()
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {_known(arg.value)}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        if prefix.endswith("."):
            return {m for m in MODULES if m.startswith(prefix) and "." not in m[len(prefix):]}
    return set()


def imports_of(module: str, tree: ast.AST) -> set[str]:
    """The project modules ``module`` imports, at module level or inside a function: ``from conformance
    import runner`` is conformance.runner, ``from conformance.runner import Case`` is conformance.runner,
    and ``importlib.import_module`` by name counts as well."""
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_known(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else _known(base) for a in node.names}
        elif isinstance(node, ast.Call):
            found |= _imported_by_name(node)
    return {m for m in found if m is not None and m != module}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of two modules or more (Tarjan's groups)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in (g for g in groups if len(g) > 1):
        start = min(group)
        paths, seen = [[start]], {start}
        while paths:  # breadth first, inside the group: the shortest way back to start
            path = paths.pop(0)
            nxt = sorted(w for w in graph[path[-1]] if w in group)
            if start in nxt:
                out.append([*path, start])
                break
            for w in nxt:
                if w not in seen:
                    seen.add(w)
                    paths.append([*path, w])
    return sorted(out)


def import_graph() -> dict[str, set[str]]:
    return {m: imports_of(m, ast.parse(p.read_text(), str(p))) for m, p in MODULES.items()}


def test_no_module_imports_itself_through_others():
    # A circle makes a module's import order matter and its half-built state visible to the other.
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    tree = ast.parse("from conformance import runner, backends\nimport conformance.engine.source\n"
                     "def f():\n    from .isolate import child_dir\n    importlib.import_module('contracts.spec')\n")
    assert imports_of("conformance.cli", tree) == {"conformance.runner", "conformance.backends",
                                                    "conformance.engine.source", "conformance.isolate", "contracts.spec"}


# Names that stay private-looking across modules: a native extension keeps the conventional name
# ``_C`` (as torch._C), and a kernel keeps vLLM's own name, by which every backend resolves it.
PRIVATE_BY_CONVENTION = {"_C", *contracts.SPECS}


def private_uses(rel: Path, source: str) -> list[str]:
    """Private names (one leading underscore) the module at ``rel`` (below the root) takes from another
    project module: imported by name, or read as an attribute of a project module it imported."""
    module = _module_name(ROOT / rel) if rel.parts[0] in OURS else rel.stem
    tree = ast.parse(source, str(rel))
    modules: dict[str, str] = {}  # a local name bound to a project module -> that module
    out = []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__") and name not in PRIVATE_BY_CONVENTION

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _known(a.name) == a.name:
                    modules[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.level or _known(node.module or "")):
            base = _base(module, node) if node.level else node.module or ""
            for a in node.names:
                if f"{base}.{a.name}" in MODULES:
                    modules[a.asname or a.name] = f"{base}.{a.name}"
                if private(a.name) and _known(base) != module:
                    out.append(f"{rel}:{node.lineno}: from {base} import {a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            dotted, v = [], node.value
            while isinstance(v, ast.Attribute):
                dotted.insert(0, v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in modules:
                target = ".".join([modules[v.id], *dotted])
                if target in MODULES and target != module:
                    out.append(f"{rel}:{node.lineno}: {target}.{node.attr}")
    return out


def test_no_module_takes_a_private_name_from_another():
    # What another module uses is public: renaming a private name must never break a distant importer.
    files = [p for d in sorted(OURS | {"tests", "benchmarks"}) for p in sorted((ROOT / d).rglob("*.py"))]
    found = [use for p in files for use in private_uses(p.relative_to(ROOT), p.read_text())]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_private_check_sees_a_private_use():
    source = ("from conformance import runner\nfrom cpu_impl import _C\nfrom conformance.backends import _x\n"
              "def f():\n    from conformance.runner import _own\n    return runner._y\n")
    assert private_uses(Path("tests/probe.py"), source) == [
        "tests/probe.py:3: from conformance.backends import _x", "tests/probe.py:5: from conformance.runner import _own",
        "tests/probe.py:6: conformance.runner._y"]
    # A module's own private names are its own business.
    assert private_uses(Path("conformance/runner.py"), "from conformance.runner import _own\n") == []


# -- a family is its own files (docs/adding-a-family.md) ---------------------------------------------
@pytest.mark.parametrize("family", sorted(contracts.FAMILIES))
def test_a_family_is_found_by_its_files_alone(family):
    from conformance import strategies
    from conformance.tools import mutants
    from cpu_impl import _C

    # The contracts package, the C++ extension and the catalogue each found it without a list naming it.
    assert f"{family}.py" in {p.name for p in (ROOT / "contracts").glob("*.py")}
    assert getattr(_C, family).__doc__, f"csrc/{family}.cpp registers no cpu_impl._C.{family} (SPECDIFF_FAMILY)"
    assert f"SPECDIFF_FAMILY({family}," in (ROOT / "csrc" / f"{family}.cpp").read_text()
    module = strategies.family_module(family)
    own = {s.name for s in contracts.FAMILIES[family]}
    assert all(set(c.kernels) <= own for c in getattr(module, "CLASSES", ())), "a family's state classes name its own kernels"
    faults = ROOT / "conformance" / "strategies" / f"{family}.toml"
    assert not faults.exists() or faults in mutants.CATALOGUE


def test_no_list_of_families_is_left_to_edit():
    # What a new family used to edit: the contracts' list, the C++ module's, the coverage classes'.
    assert "register_" not in re.sub(r"register_(launcher|exception_translator)", "", (ROOT / "csrc" / "module.cpp").read_text())
    assert "from contracts import" not in (ROOT / "contracts" / "__init__.py").read_text()
    assert "StateClass(" not in (ROOT / "conformance" / "coverage.py").read_text().split("class StateClass")[1]
