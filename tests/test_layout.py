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
    from conformance.runner import _explainer

    assert callable(_explainer(spec)), spec.explain


def test_the_readme_layout_table_names_what_the_tree_has():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| layer | what it is |"):].split("\n\n", 1)[0]
    named = {p for row in table.splitlines()[2:] for p in re.findall(r"`([\w./-]+/(?:[\w.]+)?)`", row.split("|")[1])}
    assert named >= {"contracts/", "reference/", "triton_impl/", "conformance/", "conformance/tools/", "compositions/"}
    assert [p for p in sorted(named) if not (ROOT / p).exists()] == []
    # Every package of the tree is in the table.
    packages = {f"{p.parent.relative_to(ROOT)}/" for p in ROOT.glob("*/__init__.py")} | {"conformance/tools/"}
    assert packages <= named | {"tests/", "benchmarks/"}, packages - named
