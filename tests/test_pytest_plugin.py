"""The pytest view of conformance (conformance/pytest_plugin.py): a planted fault fails its kernel x
backend test, the table and report come from the run, and --shard splits the tests without loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conformance import pytest_plugin
from conformance.backend import Backend
from conformance.backends import BACKENDS

ROOT = Path(__file__).resolve().parent.parent


def test_a_planted_fault_fails_its_kernel_and_backend(monkeypatch):
    real = BACKENDS["reference"]
    wrong = Backend("planted", lambda spec: (lambda **kw: kw["output_ptr"].fill_(3)) if spec.name == "expand_kernel" else None,
                    real.device, lambda: "planted", gridless=True)
    monkeypatch.setitem(BACKENDS, "planted", wrong)
    result = pytest_plugin.check("expand_kernel", "planted")
    why = pytest_plugin.verdict(result)
    assert result["backends"]["planted"]["status"] == "fail" and why and "expand_kernel x planted: fail" in why, why
    assert pytest_plugin.verdict(pytest_plugin.check("expand_kernel", "cpu")) is None


def _collected(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "--collect-only", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_shards_cover_every_conformance_test_once():
    whole = _collected()
    shares = [_collected(f"--shard={k}/3") for k in (1, 2, 3)]
    assert sorted(sum(shares, [])) == sorted(whole) and all(shares), [len(s) for s in shares]


def test_the_run_prints_the_table_and_writes_the_report(tmp_path):
    report = tmp_path / "conformance.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-k", "expand_kernel",
                           f"--conformance-report={report}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "conformance (kernel x backend)" in done.stdout and "expand_kernel" in done.stdout
    got = json.loads(report.read_text())
    assert set(got["kernels"]["expand_kernel"]) >= {"reference", "triton", "cpu"} and got["schema"] == 2
    assert all(e["status"] == "pass" for e in got["kernels"]["expand_kernel"].values())


WRONG_CPU = '''
from dataclasses import replace
from conformance.backends import BACKENDS

real = BACKENDS["cpu"]


def resolve(spec):
    kernel = real.resolve(spec)
    if spec.name != "expand_kernel":
        return kernel

    class OffByOne:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kernel[grid](*args, **kwargs)
                (kwargs["output_ptr"] if "output_ptr" in kwargs else args[0]).add_(1)
            return launch

    return OffByOne()


BACKENDS["cpu"] = replace(real, resolve=resolve)
'''


def test_a_failing_kernel_prints_its_verdict_once(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(WRONG_CPU)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "SPECDIFF_FAILURES": str(tmp_path / "failures")}
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_conformance.py", "-q", "-k", "expand_kernel-cpu", "-p", "no:cacheprovider",
                           f"--conformance-report={tmp_path / 'r.json'}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    # Once in its failure's section; the short summary (-ra) names it again, as for any test.
    failures = done.stdout.split("short test summary info")[0]
    assert failures.count("expand_kernel x cpu: fail") == 1, done.stdout[-4000:]
