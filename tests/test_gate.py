"""`nox -s gate -- BASE_REF`: changed files map to the kernels they can affect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import contracts
from conformance.tools import gate

ROOT = Path(__file__).resolve().parents[1]
REJECTION = {n for n, s in contracts.SPECS.items() if s.family == "rejection"}


def test_a_family_file_touches_its_family_only():
    assert set(gate.kernels_touched(["csrc/rejection.cpp"])) == REJECTION
    assert set(gate.kernels_touched(["tests/test_rejection.py"])) == REJECTION


def test_shared_files_touch_everything_and_docs_nothing():
    assert set(gate.kernels_touched(["contracts/spec.py"])) == set(contracts.SPECS)
    assert gate.kernels_touched(["README.md", "conformance/tools/mutants.toml"]) == {}


def test_a_helper_touches_the_families_that_use_it():
    touched = gate.kernels_touched(["contracts/_checks.py"])
    users = {s.family for n, s in contracts.SPECS.items() if n in touched}
    assert users and "rejection" not in users  # the metadata families import it, the rejection family does not


def test_numerics_touch_the_families_computing_with_them():
    touched = {contracts.SPECS[n].family for n in gate.kernels_touched(["contracts/numerics.py"])}
    assert {"mrv2", "topk_topp"} <= touched and "eagle" not in touched


def test_every_layer_the_gate_reads_exists():
    # A layer left behind by a move would silently stop mapping its files to kernels.
    assert all((gate.ROOT / layer).is_dir() for layer in gate.LAYERS)


def test_quick_runs_only_the_changed_kernels_at_the_ci_profile():
    done = subprocess.run([sys.executable, "-m", "conformance", "gate", "HEAD~1", "--quick", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert all(row[0] == "ci" and row[2].startswith("(") for row in listed), done.stdout  # each changed, none of the rest
