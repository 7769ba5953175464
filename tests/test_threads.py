"""Thread-count invariance of the OpenMP port, with every parallel region forced parallel."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import contracts
from conformance import cli
from conformance.backend import Backend
from conformance.backends import BACKENDS
from conformance.profiles import chosen
from conformance.tools import threads

PROFILE = chosen()


# CI runs this check under AddressSanitizer (`nox -s sanitize -- --step threads`); unsanitized, it is
# the nightly's.
@pytest.mark.nightly
def test_every_cpp_kernel_is_bit_identical_at_1_2_3_and_all_threads(tmp_path):
    report = tmp_path / "threads.json"
    done = subprocess.run([sys.executable, "-m", "conformance", "threads", "--profile", PROFILE, "--report", str(report)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["forced"], "the preload shim was not active: parallel regions ran with their serial thresholds"
    assert set(data["kernels"]) == set(contracts.SPECS)
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


def test_the_shim_builds_and_counts_nothing_outside_the_extension():
    lib = threads.build_shim()
    try:
        code = "import ctypes, torch; torch.ones(1 << 20).sum(); m = ctypes.CDLL(None); print(m.specdiff_parallel_regions())"
        done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "LD_PRELOAD": str(lib)}, capture_output=True, text=True)
    finally:
        shutil.rmtree(lib.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"  # torch's own regions are left alone
    assert torch.get_num_threads() >= 1


def _private(lib):
    st = lib.parent.stat()
    return stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid() and lib.read_bytes()[:4] == b"\x7fELF"


def test_a_library_planted_where_the_shim_used_to_be_cached_is_never_loaded(tmp_path, monkeypatch):
    # The old cache: <tmp>/specdiff-shim-<sha256(cc, source)[:16]>/libspecdiff_force_parallel.so, used if present.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    key = hashlib.sha256((cc + "\0" + threads.SHIM).encode()).hexdigest()[:16]
    planted = tmp_path / f"specdiff-shim-{key}"
    planted.mkdir(mode=0o777)
    (planted / "libspecdiff_force_parallel.so").write_bytes(b"planted")
    lib = threads.build_shim()
    assert lib.parent != planted and lib.parent.parent == tmp_path
    assert _private(lib), oct(lib.parent.stat().st_mode)
    assert (planted / "libspecdiff_force_parallel.so").read_bytes() == b"planted"


def test_every_build_is_fresh_and_private_and_removed_after_the_run(monkeypatch):
    first, second = threads.build_shim(), threads.build_shim()
    try:
        assert first.parent != second.parent and _private(first) and _private(second)
    finally:
        shutil.rmtree(first.parent)
        shutil.rmtree(second.parent)
    seen = []
    run = subprocess.run

    def child(argv, **kw):  # the re-executed child: see its preload, and that the library exists while it runs
        if argv[0] != sys.executable:
            return run(argv, **kw)  # the compiler
        lib = Path(kw["env"]["LD_PRELOAD"].split()[-1])
        seen.append((lib, lib.exists()))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.delenv("SPECDIFF_FORCE_PARALLEL", raising=False)
    monkeypatch.setattr(threads.subprocess, "run", child)
    ns = argparse.Namespace(no_force=False, threads=None, profile="dev", report="r.json", kernel=None, max_examples=None,
                            junit=None, replay=None)
    assert threads.cmd(ns) == 0
    (lib, existed), = seen
    assert existed and not lib.parent.exists()


@pytest.mark.parametrize("value", ["0", "a,b", "5000", "", "1,,2", "-1", "2.5"])
def test_a_bad_thread_list_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["threads", "--threads", value])
    assert e.value.code == 2
    assert "argument --threads" in capsys.readouterr().err
