"""The pull-request gate: the deep Hypothesis profile where files changed, the CI profile elsewhere.

``python -m conformance gate BASE_REF`` lists the files that differ from the merge base of
``BASE_REF`` and ``HEAD`` (committed, staged, unstaged and untracked), maps them to kernels, then
runs ``conformance run --profile nightly`` on the kernels touched and ``--profile ci`` on the rest,
each with a JSON and a JUnit report. A file touches a kernel family when

- its name carries the family's stem (``csrc/rejection.cpp``, ``triton_impl/eagle.py``,
  ``tests/test_slot_mapping.py``, ``benchmarks/test_bench_rejection.py``: one name, every layer);
- it is a C++ header that the family's ``csrc/<family>.cpp`` includes, or a Python module that
  one of the family's files imports (``contracts/_checks.py``, ``csrc/metadata.h``);
- it is shared by every kernel: the harness core, the build (:data:`EVERYTHING`).

Documentation and the harness's other tools touch nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import contracts
from conformance.arguments import output_dir
from conformance.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
# Files whose change puts every kernel under the deep profile.
EVERYTHING = (
    "contracts/spec.py", "conformance/runner.py", "conformance/case.py", "conformance/casefile.py", "conformance/backend.py",
    "conformance/backends.py", "conformance/strategies/__init__.py",
    "contracts/__init__.py", "cpu_impl/launcher.py", "cpu_impl/__init__.py", "csrc/common.h", "csrc/module.cpp",
    "csrc/launch.h", "csrc/launch.cpp",
    "triton_impl/__init__.py", "reference/__init__.py", "setup.py", "pyproject.toml", "constraints.txt",
)
LAYERS = ("contracts", "conformance/strategies", "reference", "triton_impl", "cpu_impl", "csrc", "tests", "benchmarks")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def changed_files(base: str) -> list[str]:
    merge_base = _git("merge-base", base, "HEAD").strip()
    files = set(_git("diff", "--name-only", merge_base).split())
    files |= set(_git("ls-files", "--others", "--exclude-standard").split())
    return sorted(files)


def family_files(family: str) -> list[Path]:
    out = []
    for layer in LAYERS:
        d = ROOT / layer
        if d.is_dir():
            out += [p for p in d.iterdir() if p.is_file() and family in p.stem]
    return out


def _references(path: str) -> re.Pattern[str]:
    """How a family file would name ``path``: an #include of a header, an import of a module."""
    p = Path(path)
    if p.suffix in (".h", ".hpp"):
        return re.compile(rf'#include\s+"{re.escape(p.name)}"')
    module = ".".join(p.with_suffix("").parts)
    return re.compile(rf"\b(import|from)\s+{re.escape(module)}\b|\bfrom\s+{re.escape(str(p.parent).replace('/', '.'))}\s+import\s+[^\n]*\b{re.escape(p.stem)}\b")


def kernels_touched(files: list[str]) -> dict[str, list[str]]:
    """Kernel name -> the changed files that put it under the deep profile."""
    families = {spec.family for spec in contracts.SPECS.values()}
    hit: dict[str, set[str]] = {f: set() for f in families}
    sources = {f: [(p, p.read_text(errors="replace")) for p in family_files(f)] for f in families}
    for path in files:
        if path in EVERYTHING:
            for f in families:
                hit[f].add(path)
            continue
        stem = Path(path).stem
        named = [f for f in families if f in stem]
        for f in named:
            hit[f].add(path)
        if named or not path.endswith((".py", ".h", ".hpp", ".cpp")):
            continue
        pattern = _references(path)
        for f, texts in sources.items():
            if any(pattern.search(text) for p, text in texts if str(p.relative_to(ROOT)) != path):
                hit[f].add(path)
    return {name: sorted(hit[spec.family]) for name, spec in contracts.SPECS.items() if hit[spec.family]}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gate", help="nightly profile on the kernels whose files changed since BASE_REF, ci profile on the rest")
    p.add_argument("base", metavar="BASE_REF", help="the branch or commit to compare with (e.g. origin/main)")
    p.add_argument("--deep", default="nightly", choices=PROFILES, help="profile for the changed kernels")
    p.add_argument("--rest", default="ci", choices=PROFILES, help="profile for the other kernels")
    p.add_argument("--quick", action="store_true",
                   help="only the changed kernels, at the ci profile: the check to run before a commit (the rest stay as CI left them)")
    p.add_argument("--dry-run", action="store_true", help="only print which kernels get which profile")
    p.add_argument("--reports", default="reports", type=output_dir)
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    from conformance.tools.mutants import source_tree

    source_tree("gate")
    try:
        files = changed_files(ns.base)
    except subprocess.CalledProcessError as e:
        print(f"gate: cannot compare with {ns.base!r}: {e.stderr.strip()}")
        return 2
    touched = kernels_touched(files)
    rest = [] if ns.quick else [k for k in contracts.SPECS if k not in touched]
    if ns.quick:
        ns.deep = "ci"
    print(f"gate: {len(files)} files changed since {ns.base}")
    for k, why in touched.items():
        print(f"  {ns.deep:<8} {k}  ({', '.join(why[:4])}{', ...' if len(why) > 4 else ''})")
    for k in rest:
        print(f"  {ns.rest:<8} {k}")
    if ns.dry_run:
        return 0
    rc = 0
    for profile, names, tag in ((ns.deep, list(touched), "changed"), (ns.rest, rest, "unchanged")):
        if not names:
            continue
        args = [sys.executable, "-m", "conformance", "run", "--profile", profile, "--jobs", "auto", *[a for k in names for a in ("--kernel", k)],
                "--report", f"{ns.reports}/gate-{tag}.json", "--junit", f"{ns.reports}/gate-{tag}.xml"]
        print(f"\n$ {' '.join(args[1:])}", flush=True)
        rc |= subprocess.run(args).returncode
    print("\ngate: " + ("FAILED" if rc else "passed"))
    return 1 if rc else 0
