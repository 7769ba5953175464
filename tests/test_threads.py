"""Thread-count invariance of the OpenMP port, with every parallel region forced parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from conformance import kernels, threads
from conformance.backends import BACKENDS, Backend

PROFILE = os.environ.get("SPECDIFF_PROFILE", "dev")


def test_every_cpp_kernel_is_bit_identical_at_1_2_3_and_all_threads(tmp_path):
    report = tmp_path / "threads.json"
    done = subprocess.run([sys.executable, "-m", "conformance", "threads", "--profile", PROFILE, "--report", str(report)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["forced"], "the preload shim was not active: parallel regions ran with their serial thresholds"
    assert set(data["kernels"]) == set(kernels.SPECS)
    for name, e in data["kernels"].items():
        assert e["status"] == "pass" and e["examples"] > 0, (name, e)
        assert e["parallel_regions"] > 0, f"{name}: no OpenMP region ran from cpu_impl._C"
    assert data["threads"][:3] == [1, 2, 3]


def test_a_thread_dependent_port_is_caught(monkeypatch):
    """A port whose result depends on the team size (a per-thread chunking, a race) disagrees
    with itself across thread counts; the check names the kernel, the counts and the cell."""
    from cpu_impl import _C

    real = BACKENDS["cpu"]

    class Drifting:
        def __init__(self, spec):
            self.k = real.resolve(spec)

        def __getitem__(self, grid):
            def launch(**kw):
                self.k[grid](**kw)
                out = kw["output_ptr"]
                if out.numel():
                    out[0] = float(_C.max_threads()) if out.dtype.is_floating_point else _C.max_threads()
            return launch

    monkeypatch.setitem(BACKENDS, "cpu", Backend("cpu", Drifting, real.device, real.mode))
    e = threads.check_kernel("expand_kernel", [1, 2], max_examples=30)
    assert e["status"] == "fail", e
    assert "expand_kernel: output 'output_ptr' differs between 1 OpenMP thread and 2 OpenMP threads at flat element 0" in e["message"]


def test_the_shim_builds_and_counts_nothing_outside_the_extension(tmp_path):
    lib = threads.build_shim(tmp_path)
    code = "import ctypes, torch; torch.ones(1 << 20).sum(); m = ctypes.CDLL(None); print(m.specdiff_parallel_regions())"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LD_PRELOAD": str(lib)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"  # torch's own regions are left alone
    assert torch.get_num_threads() >= 1
