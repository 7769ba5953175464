"""The conformance suite, one kernel at a time: which backends can run it, its Hypothesis cases through
them, its coverage of state classes, and the report (JSON, a table, JUnit) the CLI and the pytest plugin
both write.

A report entry of one backend on one kernel is a dict: ``status`` ("pass", "fail", "error", "missing",
"skipped", "n/a", "not compared"; "crash" from conformance/isolate.py), ``examples``, ``failures``,
``mode`` and ``message``; a run that compared also has ``unsupported``, ``departs`` and ``seconds``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import hypothesis
from hypothesis import Phase, given, settings

import contracts
from conformance import junit, runner
from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.casefile import replay_command, save_failure
from conformance.findings import Findings
from conformance.runner import Diff, Disagreement, run_case

# specdiff's own backends: a kernel one of them lacks fails the run.
BUILT_IN = ("reference", "triton", "cpu")
SCHEMA = 2  # of the JSON report

Entry = dict[str, Any]  # one backend's report entry on one kernel (see above)
Results = dict[str, dict[str, Entry]]  # kernel -> backend -> entry


def backend_mode(name: str) -> str:
    """How backend ``name`` runs here, for reports: its mode, and the CPU port's thread count."""
    mode = BACKENDS[name].mode()
    if name == "cpu":
        from cpu_impl import _C

        mode += f", {_C.max_threads()} threads"
    return mode


# Set in the children of a run with --jobs above 1 (conformance/isolate.py): their number.
LANES = "SPECDIFF_RUN_LANES"


class Progress:
    """One live line on a terminal while a kernel runs: its examples so far, its backends, the time.
    Nothing at all when the stream is not a terminal (CI logs, pipes, pytest's capture), or when
    children of one run share it."""

    def __init__(self, kernel: str, backends: list[str], stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)()) and LANES not in os.environ
        self.text = f"{kernel} on {', '.join(backends)}"
        self.started = self.shown = time.perf_counter()

    def tick(self, examples: int) -> None:
        now = time.perf_counter()
        if self.live and now - self.shown >= 0.5:
            self.shown = now
            self.stream.write(f"\r\033[K  {self.text}: {examples} examples, {now - self.started:.0f} s")
            self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()


def check_kernel(
    name: str, backends: list[str], seed: int | None, states: Counter[str] | None = None, shrink: bool = True,
    findings: Findings | None = None, call_site: bool = False, examples: Sequence[Case] = (), interpreted: int | None = None,
) -> dict[str, Entry]:
    """Runs the kernel's Hypothesis cases through ``backends``; returns a per-backend report.

    ``states`` tallies, per coverage class, the cases that reached it (conformance/coverage.py).
    With ``findings`` the run keeps going: every example runs and every disagreement, departure
    and unsupported case is added there; without, the first disagreement stops the kernel (and is
    shrunk). ``call_site`` draws only what vLLM's call sites pass. ``examples`` run first, every
    time (cases found earlier and frozen, tests/found_cases.py). ``interpreted`` caps the cases
    specdiff's interpreted backends run (the first ones drawn; the others run every case).
    """
    from conformance import coverage
    from conformance.strategies import cases

    tally: Counter[str] = Counter()
    odd: Counter[str] = Counter()
    declined: Counter[str] = Counter()
    departed: Counter[str] = Counter()

    progress = Progress(name, backends)
    capped = {b for b in backends if interpreted is not None and not BACKENDS[b].engine and BACKENDS[b].mode() == "interpreted"}

    @given(case=cases(name, call_site=call_site))
    def prop(case: Any) -> None:
        tally["examples"] += 1
        progress.tick(tally["examples"])
        notes: list[Diff] = []
        these = [b for b in backends if b not in capped or tally["examples"] <= interpreted]
        try:
            outcomes = run_case(case, these, notes)
        except Disagreement as d:
            odd.update(d.backends)
            if findings is None:
                path = save_failure(case, meta={"backends": backends})
                raise Disagreement(f"{d}\n  replay: {replay_command(path)}", d.backends, d.diffs) from None
            for diff in d.diffs:
                findings.add(case, diff, str(d))
            outcomes = {}
        for n in notes:
            (declined if n.kind == "unsupported" else departed)[n.backend] += 1
            if findings is not None:
                findings.add(case, n, n.detail)
        oracle = outcomes.get(ORACLE)
        if states is not None and oracle is not None and oracle.error is None:
            try:
                states.update(coverage.observe(name, case.args, oracle.outputs).keys())
            except Exception as e:  # a classifier's bug is the harness's, never a backend's
                states[f"classifier error: {type(e).__name__}: {e}"] += 1

    for case in examples:
        prop = hypothesis.example(case=case)(prop)
    if seed is not None:
        prop = hypothesis.seed(seed)(prop)
    if not shrink or findings is not None:  # report the first failing case as found (the mutants session wants speed)
        prop = settings(phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])(prop)
    failure: BaseException | None = None
    launched = runner.LAUNCH_SECONDS.copy()
    try:
        prop()
    except Disagreement as d:
        failure = d
    except Exception as e:  # a harness or strategy error: every backend's result is unknown
        failure = e
    finally:
        progress.close()
    report = {}
    for b in backends:
        entry: dict[str, Any] = {
            "status": "fail" if odd[b] else "pass",
            "examples": min(tally["examples"], interpreted) if b in capped else tally["examples"],
            "failures": odd[b],
            "unsupported": declined[b],
            "departs": departed[b],
            "mode": backend_mode(b),
            "seconds": round(runner.LAUNCH_SECONDS[b] - launched[b], 2),  # its own launches
            "message": None,
        }
        if isinstance(failure, Disagreement) and b in failure.backends:
            entry["message"] = str(failure)
        elif failure is not None and not isinstance(failure, Disagreement):
            entry["status"] = "error"
            entry["message"] = "".join(traceback.format_exception(failure)[-6:])
        report[b] = entry
    return report


def available(spec_name: str, wanted: list[str], asked: set[str]) -> tuple[list[str], dict[str, Entry]]:
    """The backends of ``wanted`` that can run the kernel here, and the entries of those that cannot (unavailable,
    lacking it, or without a form of it). A partial backend (one with a base) lacking it is left out unless
    ``asked`` names it."""
    spec = contracts.get(spec_name)
    runnable, skipped = [], {}
    for b in wanted:
        backend = BACKENDS[b]
        why = backend.unavailable()
        if not backend.applies(spec):
            if backend.base is not None and b not in asked:
                continue  # a partial backend answers only for its own kernels
            skipped[b] = {"status": "n/a", "examples": 0, "failures": 0, "mode": backend.mode(),
                          "message": backend.inapplicable(spec)}
            continue
        if backend.engine and spec.engine_apart:  # vLLM's kernel follows another contract: not compared
            skipped[b] = {"status": "n/a", "examples": 0, "failures": 0, "mode": backend.mode(), "message": spec.engine_apart}
            continue
        if why is None and backend.resolve(spec) is None:
            if backend.engine:  # a fact about the engine, not a gap of specdiff's (no CPU port of MRV2)
                skipped[b] = {"status": "skipped", "examples": 0, "failures": 0, "mode": backend.mode(),
                              "message": f"{backend.mode()} has no {spec.name}"}
                continue
            if b not in BUILT_IN and b not in asked:
                continue  # a partial backend (one with a base) only answers for its own kernels
            skipped[b] = {"status": "missing", "examples": 0, "failures": 0, "mode": backend.mode(), "message": f"{b} has no {spec.name}"}
        elif why is not None:
            skipped[b] = {"status": "skipped", "examples": 0, "failures": 0, "mode": "-", "message": why}
        else:
            runnable.append(b)
    return runnable, skipped


def not_compared(name: str, b: str, runnable: list[str], skipped: dict[str, Entry]) -> Entry:
    """The entry of a backend that ran alone: one backend is no comparison, and never a pass."""
    why = "; ".join(f"{s}: {e['message']}" for s, e in skipped.items())
    return {"status": "not compared", "examples": 0, "failures": 0, "mode": backend_mode(b) if b in runnable else "-",
            "message": f"{name}: only {' and '.join(runnable) or 'no backend'} can run it here, and a comparison needs two"
                       + (f" ({why})" if why else "")}


@dataclass
class KernelRun:
    """One kernel through the backends of a run: each backend's entry (in the run's order of backends),
    the kernel's state coverage, and its wall time (drawing, launches, comparisons)."""

    entries: dict[str, Entry]
    coverage: dict[str, Any]
    seconds: float


def run_kernel(name: str, backends: list[str], asked: set[str], seed: int | None, *, shrink: bool = True,
               findings: Findings | None = None, call_site: bool = False, interpreted: int | None = None) -> KernelRun:
    """The kernel through every backend of ``backends`` that can run it (:func:`available`), when two can;
    when fewer can, the one that could is ``not compared``, never a pass."""
    runnable, skipped = available(name, backends, asked)
    seen: Counter[str] = Counter()
    started = time.perf_counter()
    if len(runnable) > 1:
        per = check_kernel(name, runnable, seed, seen, shrink=shrink, findings=findings, call_site=call_site, interpreted=interpreted)
        per.update(skipped)
    else:
        per = {**skipped, **{b: not_compared(name, b, runnable, skipped) for b in runnable or [ORACLE]}}
    seconds = round(time.perf_counter() - started, 2)
    complete = len(runnable) > 1 and all(e["status"] == "pass" for e in per.values() if e["status"] != "skipped")
    return KernelRun({b: per[b] for b in backends if b in per}, state_coverage(name, seen, complete, call_site), seconds)


def state_coverage(name: str, seen: Counter[str], complete: bool, call_site: bool = False) -> dict[str, Any]:
    """A kernel's coverage entry: cases per state class, and the required classes never reached
    (judged only when every backend passed, so that a failure's cut-short run is not blamed; with
    ``call_site``, only the classes the engine's call sites can reach)."""
    from conformance import coverage

    classes = dict.fromkeys(c.name for c in coverage.classes_for(name) if not c.hazard)
    hazards = dict.fromkeys(c.name for c in coverage.classes_for(name) if c.hazard)
    errors = [c for c in seen if c.startswith("classifier error")]
    return {
        "cases": {c: seen[c] for c in classes},
        "hazards": {c: seen[c] for c in hazards},  # cases where a hazardous rule of the engine decided (StateClass.hazard)
        "missing": (coverage.missing(name, seen, call_site) if complete else []) + errors,
    }


def summary(results: Results, backends: Sequence[str], states: dict[str, dict[str, Any]]) -> str:
    """The end of a run: its table, the state classes each kernel reached, and the cases a hazard decided."""
    lines = [table(results, list(backends)), "", "state classes reached (cases):"]
    for name, st in states.items():
        line = ", ".join(f"{c} {n}" for c, n in st["cases"].items()) or "-"
        lines.append(f"  {name}: {line}" + (f"  MISSING: {', '.join(st['missing'])}" if st["missing"] else ""))
    relied = {k: {h: n for h, n in st.get("hazards", {}).items() if n} for k, st in states.items()}
    if any(relied.values()):
        lines += ["", "hazards: cases decided by a rule the contract keeps because the engine behaves so (StateClass.hazard):"]
        lines += [f"  {name}: " + ", ".join(f"{h} {n}" for h, n in hz.items()) for name, hz in relied.items() if hz]
    return "\n".join(lines)


def table(results: Results, backends: list[str]) -> str:
    """The kernel x backend table of a run: each cell the status, examples and mode. A backend with no
    entry in any row (a partial backend that implements none of these kernels) has no column."""
    backends = [b for b in backends if any(b in per for per in results.values())]
    width = max((len(k) for k in results), default=len("kernel")) + 2  # no row: a child left nothing to run
    cols = [f"{'kernel':<{width}}"] + [f"{b:<38}" for b in backends]
    lines = ["".join(cols), "-" * (width + 38 * len(backends))]
    for kernel, per in results.items():
        row = [f"{kernel:<{width}}"]
        for b in backends:
            e = per.get(b)
            cell = "-" if e is None else f"{e['status']} {e['examples']} ({e.get('mode', '-')})"
            extra = [f"{e[k]} {k}" for k in ("unsupported", "departs") if e and e.get(k)]
            cell += f" [{', '.join(extra)}]" if extra else ""
            row.append(f"{cell:<38}")
        lines.append("".join(row))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """The machine a report was made on: platform, Python, cores, and :func:`versions`."""
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(), **versions()}


def report_head(profile: str, seed: int | None) -> dict[str, Any]:
    """A report's first fields: the schema, the Hypothesis profile and seed, the machine. The kernels,
    their coverage and times follow."""
    p = settings.get_profile(profile)
    return {"schema": SCHEMA, "profile": profile, "max_examples": p.max_examples, "derandomize": p.derandomize,
            "seed": seed, "machine": machine()}


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """Writes ``report`` as JSON at ``path``, making its directory."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return out


def write_junit(path: str, results: Results, states: dict[str, dict[str, Any]], kernel_seconds: dict[str, float],
                require: bool) -> Path:
    """One test per kernel and backend (its own launches' time) and one per kernel's coverage (the
    rest of the kernel's wall time: drawing, comparing, classifying), so the suite's time is the run's."""
    cases = []
    for kernel, per in results.items():
        for b, e in per.items():
            failed = e["status"] == "not compared" or (e["status"] == "crash" and "expected" not in e) or e["status"] in ("fail", "missing") and (e["status"] == "fail" or b in BUILT_IN)
            cases.append(junit.TestCase(
                f"conformance.{kernel}", b, float(e.get("seconds", 0.0)),
                failure=e.get("message") or e["status"] if failed else None,
                error=e.get("message") if e["status"] == "error" else None,
                skipped=e.get("message") if e["status"] == "skipped" or (e["status"] == "missing" and b not in BUILT_IN) else None,
            ))
        st = states.get(kernel)
        if st is not None and st["cases"]:
            gap = f"required state classes never generated: {', '.join(st['missing'])}" if st["missing"] else None
            harness = max(0.0, kernel_seconds.get(kernel, 0.0) - sum(float(e.get("seconds", 0.0)) for e in per.values()))
            cases.append(junit.TestCase(f"conformance.{kernel}", "coverage", harness, failure=gap if require else None,
                                        skipped=gap if gap and not require else None))
    return junit.write(path, "conformance", cases)


def versions() -> dict[str, Any]:
    """The versions a report records: torch, Triton, and whether CUDA is there."""
    import torch
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.cuda.is_available()}
