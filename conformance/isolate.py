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


def start_child_recording() -> tuple[Path, set[str]]:
    """In the child: turns the flight recorder on; returns (where to write the report, kernels to skip)."""
    import faulthandler

    d = child_dir()
    assert d is not None
    faulthandler.enable()  # the Python stack of a crash, on stderr, above the supervisor's report
    runner.INFLIGHT = d / "inflight.safetensors"
    skip = set((d / "skip").read_text().split()) if (d / "skip").exists() else set()
    return d / "report.json", skip


def unloadable() -> dict[str, str]:
    """In the child: backends an earlier child died loading (backend -> why), left out of this run."""
    d = child_dir()
    f = d / "unloadable" if d is not None else None
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
              known: Sequence[Expected] = ()) -> int:
    """Runs ``python -m conformance <argv>`` in children until every kernel ran or crashed. An engine
    backend's crash on a kernel where ``known`` lists an out-of-bounds access of that backend (an
    "asan" finding) is that defect showing itself without a sanitizer: reported, expected, not failed."""
    merged: dict[str, Any] = {}
    kernels: dict[str, dict[str, Any]] = {}
    coverage: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    crashed: list[str] = []
    unloadable: dict[str, str] = {}
    code = 0
    with tempfile.TemporaryDirectory(prefix="specdiff-run-") as tmp:
        d = Path(tmp)
        while True:
            for f in ("report.json", "inflight.safetensors", "inflight.backend", "loading"):
                (d / f).unlink(missing_ok=True)
            (d / "skip").write_text("\n".join([*kernels, *crashed]))
            rc = subprocess.run([sys.executable, "-m", "conformance", *argv], env={**os.environ, CHILD: tmp}).returncode
            part = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else {}
            merged = part or merged  # the last child's machine, profile and seed
            kernels.update(part.get("kernels", {}))
            coverage.update(part.get("coverage", {}))
            seconds.update(part.get("seconds", {}))
            if rc >= 0:
                code = code or rc
                break
            if (d / "loading").exists():  # died loading a backend, before any case: no kernel is to blame
                backend = (d / "loading").read_text().strip()
                why = f"killed the process ({_signal_name(rc)}) while loading, before any case"
                print(f"\n  {backend}: cannot load: {why}; the other backends go on\n", flush=True)
                unloadable[backend] = why
                code = 1
                with open(d / "unloadable", "a") as f:
                    f.write(f"{backend} {why}\n")
                continue
            backend = (d / "inflight.backend").read_text().strip() if (d / "inflight.backend").exists() else "?"
            case = casefile.load_case(d / "inflight.safetensors") if (d / "inflight.safetensors").exists() else None
            kernel = case.kernel if case is not None else part.get("running", "?")
            saved = casefile.save_failure(case, casefile.FAILURES_DIR / f"{kernel}.{backend}.crash.safetensors",
                                        {"backends": [backend]}) if case is not None else None
            pair = list(dict.fromkeys([ORACLE, backend]))  # replay compares two backends at least
            replay = casefile.replay_command(saved) + "".join(f" --backend {shlex.quote(b)}" for b in pair) if saved else casefile.NOT_SAVED
            message = f"{kernel}: backend '{backend}' killed the process ({_signal_name(rc)}) on a case\n  replay: {replay}"
            listed = next((e for e in known if (e.kernel, e.backend) == (kernel, backend) and e.kind.startswith("asan ")), None)
            entry = {"status": "crash", "examples": 0, "failures": 1, "message": message}
            if listed is not None:
                entry["expected"] = listed.id
                message += f"\n  expected: {listed.id}, {listed.rule} (an out-of-bounds access; the sanitize session sees it)"
            else:
                code = 1
            print(f"\n  {kernel}: CRASH of {backend} ({_signal_name(rc)}); going on with the kernels not yet run\n  {message}\n", flush=True)
            kernels[kernel] = {**kernels.get(kernel, {}), backend: {**entry, "message": message}}
            crashed.append(kernel)
            if kernel == "?":
                break  # nothing to skip: a second child would crash the same way
    merged["kernels"], merged["coverage"], merged["seconds"] = kernels, coverage, seconds
    if crashed:
        merged["crashed"] = crashed
    if unloadable:
        merged["unloadable"] = unloadable
    if crashed:  # each child's table holds its own kernels: the whole run's, crashes included, once more
        order = [k for k in contracts.SPECS if k in kernels] + [k for k in kernels if k not in contracts.SPECS]
        backends = list(dict.fromkeys(b for k in order for b in kernels[k]))
        print("\nthe whole run, every child merged:\n" + suite.table({k: kernels[k] for k in order}, backends))
        unexpected = [f"{k}/{b} (crash)" for k in crashed for b, e in kernels.get(k, {}).items() if e["status"] == "crash" and "expected" not in e]
        if unexpected:
            print(f"FAILED: {', '.join(unexpected)}")
    path = suite.write_report(report_path, merged)
    print(f"\nreport (every child merged): {path}")
    if junit_path:
        print(f"junit: {suite.write_junit(junit_path, kernels, coverage, seconds, require)}")
    return code
