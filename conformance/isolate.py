"""A backend that kills the process is reported as that backend's ``crash``, with its case saved.

``python -m conformance run`` supervises itself: it runs the suite in a child process (the same
command line) whose runner records, before every launch, the case (``runner.INFLIGHT``) and the
backend about to run it, and which rewrites its report after every kernel. When the child dies of
a signal (a segfault, an abort from a sanitizer, the OOM killer), the supervisor saves that case
under the failures directory, reports the backend as ``crash`` on that kernel with the replay
command, and starts a new child on the kernels not yet run. The final report and JUnit file merge
every child's. ``--no-isolate`` runs in-process (as tests calling ``cli.main`` do).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import contracts
from conformance import casefile, runner, suite
from conformance.backends import ORACLE
from conformance.findings import Expected

CHILD = "SPECDIFF_RUN_CHILD"  # the child's scratch directory: its report, flight recorder and skip list


def child_dir() -> Path | None:
    d = os.environ.get(CHILD)
    return Path(d) if d else None


def start_child_recording() -> Path:
    """In the child: turns the flight recorder on; returns where to write the report."""
    import faulthandler

    d = child_dir()
    assert d is not None
    faulthandler.enable()  # the Python stack of a crash, on stderr, above the supervisor's report
    runner.INFLIGHT = d / "inflight.safetensors"
    return d / "report.json"


def claim(kernel: str) -> bool:
    """In a child: whether this child runs ``kernel``. Every child of a run (side by side under
    ``--jobs``, or started again after a crash) takes each kernel once: the first to create its
    claim runs it, and a kernel claimed by a child that crashed is not run again."""
    d = child_dir()
    assert d is not None
    try:
        os.close(os.open(d.parent / "claims" / kernel, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def unloadable() -> dict[str, str]:
    """In the child: backends an earlier child died loading (backend -> why), left out of this run."""
    d = child_dir()
    f = d.parent / "unloadable" if d is not None else None
    if f is None or not f.exists():
        return {}
    return dict(line.split(" ", 1) for line in f.read_text().splitlines() if " " in line)


def load_engine_backend(name: str) -> None:
    """In the child: loads an engine backend before any case, marked, so that a crash while loading it
    (a CPU build the processor cannot run: SIGILL) is that backend's, not a kernel's."""
    import contracts
    from conformance.backends import BACKENDS

    d = child_dir()
    marker = d / "loading" if d is not None else None
    if marker is not None:
        marker.write_text(name)
    try:
        backend = BACKENDS[name]
        if backend.unavailable() is None:
            for spec in contracts.SPECS.values():
                if backend.applies(spec) and backend.resolve(spec) is not None:
                    break
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def supervise(argv: list[str], report_path: str, junit_path: str | None, require: bool,
              known: Sequence[Expected] = (), jobs: int = 1) -> int:
    """Runs ``python -m conformance <argv>`` in children until every kernel ran or crashed: ``jobs``
    children side by side, each taking the next kernel not yet claimed, and a new child in place
    of one that died. An engine backend's crash on a kernel where ``known`` lists an out-of-bounds
    access of that backend (an "asan" finding) is that defect showing itself without a sanitizer:
    reported, expected, not failed."""
    merged: dict[str, Any] = {}
    kernels: dict[str, dict[str, Any]] = {}
    coverage: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    found: list[dict[str, Any]] = []
    crashed: list[str] = []
    unloadable: dict[str, str] = {}
    codes: list[int] = []
    lock = threading.Lock()

    def lane(d: Path) -> None:
        nonlocal merged
        while True:
            for f in ("report.json", "inflight.safetensors", "inflight.backend", "loading"):
                (d / f).unlink(missing_ok=True)
            env = {**os.environ, CHILD: str(d), **({suite.LANES: str(jobs)} if jobs > 1 else {})}
            rc = subprocess.run([sys.executable, "-m", "conformance", *argv], env=env).returncode
            part = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else {}
            with lock:
                merged = part or merged  # the last child's machine, profile and seed
                kernels.update(part.get("kernels", {}))
                coverage.update(part.get("coverage", {}))
                seconds.update(part.get("seconds", {}))
                found.extend(part.get("findings", []))
                if rc >= 0:
                    codes.append(rc)
                    return
                if (d / "loading").exists():  # died loading a backend, before any case: no kernel is to blame
                    backend = (d / "loading").read_text().strip()
                    why = f"killed the process ({_signal_name(rc)}) while loading, before any case"
                    if backend not in unloadable:
                        print(f"\n  {backend}: cannot load: {why}; the other backends go on\n", flush=True)
                        unloadable[backend] = why
                        with open(d.parent / "unloadable", "a") as f:
                            f.write(f"{backend} {why}\n")
                    codes.append(1)
                    continue
                kernel = _crash(d, rc, part, known, kernels, codes)
                crashed.append(kernel)
                if kernel == "?":
                    return  # nothing to skip: a second child would crash the same way

    with tempfile.TemporaryDirectory(prefix="specdiff-run-") as tmp:
        (Path(tmp) / "claims").mkdir()
        lanes = [Path(tmp) / f"child-{i}" for i in range(max(1, jobs))]
        threads = [threading.Thread(target=lane, args=(d,)) for d in lanes]
        for d, th in zip(lanes, threads):
            d.mkdir()
            th.start()
        for th in threads:
            th.join()
    merged["kernels"], merged["coverage"], merged["seconds"] = kernels, coverage, seconds
    if found:
        merged["findings"] = found
    if crashed:
        merged["crashed"] = crashed
    if unloadable:
        merged["unloadable"] = unloadable
    merged.pop("running", None)
    order = [k for k in contracts.SPECS if k in kernels] + [k for k in kernels if k not in contracts.SPECS]
    backends = list(dict.fromkeys(b for k in order for b in kernels[k]))
    if jobs > 1:  # the children printed their kernels' lines; the table is the whole run's
        print("\nthe whole run, every child merged:\n" + suite.summary({k: kernels[k] for k in order}, backends,
                                                                      {k: coverage[k] for k in order if k in coverage}))
    elif crashed:  # each child's table holds its own kernels: the whole run's, crashes included, once more
        print("\nthe whole run, every child merged:\n" + suite.table({k: kernels[k] for k in order}, backends))
    if crashed:
        unexpected = [f"{k}/{b} (crash)" for k in crashed for b, e in kernels.get(k, {}).items() if e["status"] == "crash" and "expected" not in e]
        if unexpected:
            print(f"FAILED: {', '.join(unexpected)}")
    path = suite.write_report(report_path, merged)
    print(f"\nreport (every child merged): {path}")
    if junit_path:
        print(f"junit: {suite.write_junit(junit_path, kernels, coverage, seconds, require)}")
    return next((c for c in codes if c), 0)


def _crash(d: Path, rc: int, part: dict[str, Any], known: Sequence[Expected], kernels: dict[str, dict[str, Any]],
           codes: list[int]) -> str:
    """Records a child's death on a case: its case saved, the backend's entry a ``crash`` (expected
    where ``known`` lists an out-of-bounds access there); returns the kernel."""
    backend = (d / "inflight.backend").read_text().strip() if (d / "inflight.backend").exists() else "?"
    case = casefile.load_case(d / "inflight.safetensors") if (d / "inflight.safetensors").exists() else None
    kernel = case.kernel if case is not None else part.get("running", "?")
    saved = casefile.save_failure(case, casefile.FAILURES_DIR / f"{kernel}.{backend}.crash.safetensors",
                                  {"backends": [backend]}) if case is not None else None
    pair = list(dict.fromkeys([ORACLE, backend]))  # replay compares two backends at least
    replay = casefile.replay_command(saved) + "".join(f" --backend {shlex.quote(b)}" for b in pair) if saved else casefile.NOT_SAVED
    message = f"{kernel}: backend '{backend}' killed the process ({_signal_name(rc)}) on a case\n  replay: {replay}"
    listed = next((e for e in known if (e.kernel, e.backend) == (kernel, backend) and e.out_of_bounds), None)
    entry = {"status": "crash", "examples": 0, "failures": 1, "message": message}
    if listed is not None:
        entry["expected"] = listed.id
        message += f"\n  expected: {listed.id}, {listed.rule} (an out-of-bounds access; the sanitize session sees it)"
    else:
        codes.append(1)
    print(f"\n  {kernel}: CRASH of {backend} ({_signal_name(rc)}); going on with the kernels not yet run\n  {message}\n", flush=True)
    kernels[kernel] = {**kernels.get(kernel, {}), backend: {**entry, "message": message}}
    return kernel
