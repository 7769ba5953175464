"""`python -m conformance compile`: the Triton kernels compiled for a GPU target without a GPU. The
whole run is `nox -s compile` (CI); here, that the command works and that it sees what only a
compiler sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compile_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the command sets it itself
    return subprocess.run([sys.executable, "-m", "conformance", "compile", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_kernel_compiles_for_hopper_at_each_drawn_specialization(tmp_path):
    report = tmp_path / "compile.json"
    done = compile_cli("--kernel", "expand_kernel", "--cases", "8", "--report", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(report.read_text())["kernels"]["expand_kernel"]
    assert result["status"] == "pass" and result["specializations"] >= 2  # float and int data at least


def test_a_bad_target_is_refused(tmp_path):
    done = compile_cli("--kernel", "expand_kernel", "--target", "cuda:hopper", "--report", str(tmp_path / "c.json"))
    assert done.returncode == 2 and "'cuda:hopper'" in done.stdout
