"""pytest hooks of the benchmark suites: options, machine info, the roofline fixture, markers.

The machinery (input sizes, thread control, roofline, timing, re-validation) is in harness.py.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import Roofline, cores, cpu_info, full_sweep, gpu_name, llc_bytes, loadavg, roofline_now


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specdiff benchmarks")
    group.addoption("--full", action="store_true", default=False, help="run the full sweep (slow)")
    group.addoption("--bench-threads", default=None, help="comma-separated OpenMP thread counts for scaling sweeps")
    group.addoption("--bench-only", default=None, help="a gate.json: run only the benchmarks it gates")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gate: a result the regression gate compares with the saved baseline")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = config.getoption("--bench-only")
    if not only:
        return
    keep = set(json.loads(Path(only).read_text())["gated"])
    chosen = [i for i in items if i.name in keep]
    dropped = [i for i in items if i.name not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = chosen


class Progress:
    """One line per finished benchmark on long sweeps: how many are done, time spent, time left
    (from the mean so far)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.total = 0
        self.done = 0
        self.start = 0.0

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        import time

        self.total = len(session.items)
        self.start = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        import time

        if report.when != "teardown" or not self.total:
            return
        self.done += 1
        spent = time.monotonic() - self.start
        left = spent / self.done * (self.total - self.done)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"  [{self.done}/{self.total}] {spent / 60:.1f} min spent, ~{left / 60:.1f} min left")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not session.config.getoption("collectonly"):
        session.config.pluginmanager.register(Progress(session.config), "specdiff-progress")


@pytest.fixture(scope="session")
def roofline() -> Roofline:
    return roofline_now()


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    info = cpu_info()
    r = roofline_now()
    machine_info["specdiff"] = {
        "cpu_model": info.get("Model name", platform.processor()),
        "cores": cores(),
        "sockets": info.get("Socket(s)"),
        "llc_bytes": llc_bytes(),
        "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "gpu": gpu_name(),
        "torch": torch.__version__,
        "sweep": "full" if full_sweep(config) else "quick",
        "roofline": {"read_gbps": r.read_gbps, "copy_gbps": r.copy_gbps, "bytes": r.bytes, **r.detail},
        "loadavg_start": loadavg(),
    }


def pytest_report_header(config: pytest.Config) -> list[str]:
    r = roofline_now()
    info = cpu_info()
    return [
        f"specdiff bench: {'full' if full_sweep(config) else 'quick'} sweep; {info.get('Model name', '?')}, "
        f"{cores()} cores, LLC {llc_bytes() >> 20} MiB, GPU: {gpu_name() or 'none'}",
        f"roofline: read {r.read_gbps:.1f} GB/s, copy {r.copy_gbps:.1f} GB/s ({r.detail})",
    ]


