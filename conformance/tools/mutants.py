"""Planted faults: the harness's measured power to detect realistic bugs.

Each entry of the catalogue is one fault: a backend, a file, an exact ``find`` text and its
``replace``ment, the kernels that can see it, and the class of fault. The catalogue is data that
anyone can extend: each family's faults beside its cases (``conformance/strategies/<family>.toml``),
the harness core's in ``conformance/tools/mutants.toml``. One ``[[mutant]]`` table per fault:

- ``id``: unique, kebab-case, ``<backend>-<what breaks>``;
- ``backend``: ``reference``, ``triton`` or ``cpu``, where the fault lives; a kill must name it;
- ``file``: the path from the repository root (``csrc/`` files are rebuilt, the rest is Python);
- ``find``: exact text that must occur once in the file, unless ``occurrence`` picks the n-th
  (1-based); a ``find`` that no longer matches fails the session (update it);
- ``replace``: what the text becomes; ``also``: further edits of the same file, in order;
- ``kernels``: the kernels whose checks can see the fault; ``fault``: its class (the kill matrix
  groups by it); ``description``: how a maintainer would plausibly have written it;
- ``checks`` (optional): the checks to run, in that order (a fault only one check can see names
  it first), by default every one of ``CHECKS``.

A fault must change behaviour the contract pins down: an "equivalent mutant" (an approximate
division the Triton interpreter computes exactly anyway) proves nothing. ``python -m conformance mutants`` copies the tree once into a
scratch directory, builds the C++ extension there once, and then for each mutant, one at a
time: applies it, rebuilds only the changed translation unit (C++ faults), and runs the
harness's checks from inside the copy — its packages shadow any installed specdiff, since the
working directory comes first on ``sys.path`` — until one of them kills it:

- ``conformance``: ``python -m conformance run --profile ci`` on the mutant's kernels, the
  faulty backend against the oracle (and, for an oracle fault, against the other two, so that
  the majority names it); a kill is a report that names the faulty backend. ``--seed N``
  (repeatable) draws the profile's cases from each seed in turn instead of the profile's own
  derandomized draw, and counts a kill only if every seed kills: how much a kill owes to one draw;
- ``threads``: thread-count invariance of the C++ port (C++ faults);
- ``fuzz``: the malformed-input fuzz, for backends that validate; a kill names the backend;
- ``signatures``: the signature gate on the faulty backend;
- ``goldens``: the spec's golden examples (``tests/test_<family>.py`` selected by backend).

Then it restores the file (and the pristine object file and extension) and moves on. It prints
a kill matrix — fault × the check that caught it — writes ``reports/mutants.json`` (and JUnit
XML with ``--junit``), and exits non-zero if any catalogued fault survives, does not apply (its
``find`` text is gone: the catalogue is stale) or does not build.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.arguments import backend_name, input_file, jobs, output_file, shard
from conformance.backends import ORACLE
from conformance.profiles import PROFILES, chosen

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def source_tree(command: str) -> Path:
    """The source tree a command that rebuilds or diffs the port works on: the checkout this module
    runs from. An installed wheel has none (no csrc/, no setup.py): a ValueError saying so."""
    if not ((ROOT / "setup.py").is_file() and (ROOT / "csrc").is_dir()):
        raise ValueError(f"`{command}` works on specdiff's source tree (it rebuilds the C++ port or reads git), "
                         f"and this specdiff is installed without one ({ROOT}): run it from a clone")
    return ROOT
# The harness core's faults, then each family's, in name order.
CATALOGUE = (Path(__file__).with_name("mutants.toml"), *sorted(Path(__file__).parent.parent.joinpath("strategies").glob("*.toml")))
FAILED = ("fail", "error", "crash")
CHECKS = ("conformance", "threads", "fuzz", "signatures", "goldens", "compile", "tsan")
FUZZ_LAUNCHES = 900  # malformed cases per mutant kernel (about 43 of each of the 21 kinds)
CHECK_TIMEOUT = 900  # seconds; a mutant that hangs a check is killed by the timeout

# Build the extension in place, recompiling only translation units newer than their objects.
BUILD = ["setup.py", "-q", "build_ext", "--inplace"]  # incremental: only the units a fault touches rebuild


@dataclass
class Mutant:
    id: str
    backend: str
    file: str
    find: str
    replace: str
    kernels: list[str]
    fault: str
    description: str
    occurrence: int = 0  # 0: ``find`` must occur exactly once; n: its n-th occurrence (1-based)
    checks: list[str] = field(default_factory=lambda: list(CHECKS))
    # Further edits of the same file, applied in order after the first: [{find, replace, occurrence}].
    also: list[dict[str, Any]] = field(default_factory=list)


def load(paths: Path | Sequence[Path] = CATALOGUE, root: Path = ROOT) -> list[Mutant]:
    """The catalogue in ``paths``, checked against the tree at ``root``: a mutant edits one file of the
    tree (``tree_files``), never a path outside it (absolute, ``..``, or a symbolic link out)."""
    entries = [e for p in ([paths] if isinstance(paths, Path) else paths) for e in tomllib.loads(p.read_text()).get("mutant", [])]
    files = set(tree_files(root))
    inside = root.resolve()
    out = []
    for entry in entries:
        try:
            m = Mutant(**entry)
        except TypeError as e:
            raise ValueError(f"mutant {entry.get('id', '?')!r}: {e}") from None
        unknown = set(m.checks) - set(CHECKS)
        if unknown:
            raise ValueError(f"mutant {m.id}: unknown checks {sorted(unknown)}")
        if len(set(m.checks)) != len(m.checks):
            raise ValueError(f"mutant {m.id}: checks {m.checks} names a check twice")
        if m.file not in files or not (root / m.file).resolve().is_relative_to(inside):
            raise ValueError(f"mutant {m.id}: file {m.file!r} is not a file of the tree {str(root)!r} (it must be a path "
                             "relative to the repository root that git tracks, inside the tree)")
        out.append(m)
    ids = [m.id for m in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate mutant ids: {sorted(dup)}")
    return out


def mutate(text: str, m: Mutant) -> str:
    """``text`` with the mutant applied; ValueError when a ``find`` text is not where it says."""
    for edit in [{"find": m.find, "replace": m.replace, "occurrence": m.occurrence}, *m.also]:
        find, occurrence = edit["find"], edit.get("occurrence", 0)
        count = text.count(find)
        if occurrence == 0 and count != 1:
            raise ValueError(f"mutant {m.id}: 'find' {find[:60]!r} occurs {count} times in {m.file} (must be once, or give 'occurrence')")
        if occurrence > count:
            raise ValueError(f"mutant {m.id}: 'find' {find[:60]!r} occurs {count} times in {m.file}, occurrence {occurrence} asked")
        at = -1
        for _ in range(max(1, occurrence)):
            at = text.index(find, at + 1)
        text = text[:at] + edit["replace"] + text[at + len(find) :]
    return text


# -- the scratch tree -------------------------------------------------------------------------------
def tree_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files (what a fresh clone plus work in progress has)."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True).stdout
        return [f for f in out.decode().split("\0") if f and (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".nox", "build", "reports", "__pycache__", ".hypothesis"}
        return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]


class Scratch:
    """A copy of the tree with its own in-place build of cpu_impl._C."""

    def __init__(self, root: Path, where: Path | None = None, keep: bool = False) -> None:
        self.root = root
        self.dir = Path(where or tempfile.mkdtemp(prefix="specdiff-mutants-"))
        self.keep = keep
        for f in tree_files(root):
            dest = self.dir / f
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, dest)
        self.pristine = self.dir / ".pristine"
        self.env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SPECDIFF_FAILURES": str(self.dir / "reports" / "failures")}
        self.env.pop("PYTHONPATH", None)

    def build(self, flags: str = "") -> subprocess.CompletedProcess[str]:
        """Builds the copy's extension; `flags` go after the caller's own SPECDIFF_CXXFLAGS, and stay
        for the later builds of this copy."""
        if flags:
            self.env["SPECDIFF_CXXFLAGS"] = " ".join(x for x in (os.environ.get("SPECDIFF_CXXFLAGS", ""), flags) if x)
        return subprocess.run([sys.executable, *BUILD], cwd=self.dir, env=self.env, capture_output=True, text=True)

    def objects(self) -> list[Path]:
        return sorted(p for p in (self.dir / "build").rglob("*.o")) + sorted((self.dir / "cpu_impl").glob("_C*.so"))

    def save_pristine(self) -> None:
        self.pristine.mkdir(exist_ok=True)
        for p in self.objects():
            rel = p.relative_to(self.dir)
            (self.pristine / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, self.pristine / rel)

    def restore_pristine(self) -> None:
        for p in self.pristine.rglob("*"):
            if p.is_file():
                shutil.copy2(p, self.dir / p.relative_to(self.pristine))

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class Applied:
    """Applies a mutant to the scratch tree for the duration of a ``with`` block."""

    def __init__(self, scratch: Scratch, m: Mutant) -> None:
        self.s, self.m = scratch, m
        self.path = scratch.dir / m.file
        self.native = m.file.startswith("csrc/")
        self.touched: list[tuple[Path, os.stat_result]] = []

    def __enter__(self) -> Applied:
        original = self.path.read_text()
        self.original, self.stat = original, self.path.stat()
        self.path.write_text(mutate(original, self.m))
        if self.native:
            # Newer than every object and the extension: the units that include it rebuild (setup.py
            # reads each object's dependency file).
            later = time.time() + 2
            self.touched.append((self.path, self.path.stat()))
            os.utime(self.path, (later, later))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.path.write_text(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))
        for t, st in self.touched:
            os.utime(t, ns=(st.st_atime_ns, st.st_mtime_ns))
        if self.native:
            self.s.restore_pristine()


# -- the checks ------------------------------------------------------------------------------------
@dataclass
class Result:
    check: str
    killed: bool | None  # None: not applicable or not run
    seconds: float = 0.0
    detail: str = ""


def _run(s: Scratch, args: list[str], timeout: int) -> tuple[int | None, str, float]:
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *args], cwd=s.dir, env=s.env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", time.perf_counter() - started
    return done.returncode, (done.stdout + done.stderr)[-6000:], time.perf_counter() - started


def _crash(rc: int | None) -> str | None:
    if rc is None:
        return "timed out"
    if rc < 0:
        return f"crashed (signal {-rc})"
    return None


def _names_backend(text: str, backend: str) -> bool:
    return f" on {backend}:" in text or f"'{backend} (" in text or f"{backend} failed" in text


def conformance_kill(kernels: dict[str, dict[str, Any]], backend: str) -> tuple[bool, str]:
    """Whether a conformance report (its "kernels") kills a fault of ``backend``, and the first line
    saying so: a report that names the backend as failing. An oracle fault on a kernel with two
    voters (a host function has no Triton form) cannot be outvoted: the runner holds the other one
    to the oracle, and their disagreement is the detection."""
    hit = [k for k, per in kernels.items() if per.get(backend, {}).get("status") in FAILED]
    msg = next((per[backend]["message"] for k, per in kernels.items() if k in hit), "") or ""
    skipped = [per[backend].get("message") or "" for per in kernels.values() if per.get(backend, {}).get("status") == "skipped"]
    if not hit and skipped:  # the backend did not run here (an unbuilt extension): not a survival to count
        return False, f"could not run: {skipped[0]}".strip().splitlines()[0]
    if not hit and backend == ORACLE:
        for k, per in kernels.items():
            voted = {b: r for b, r in per.items() if r.get("status") in ("pass", *FAILED)}
            wrong = [b for b, r in voted.items() if r["status"] in FAILED]
            if len(voted) == 2 and wrong:
                hit.append(k)
                msg = f"{k}: {wrong[0]} disagrees with the oracle (two voters: no majority names either)"
                break
    return bool(hit), msg.strip().splitlines()[0] if msg.strip() else ""


def check(name: str, m: Mutant, s: Scratch, profile: str, seeds: list[int] | None = None) -> Result:
    reports = s.dir / "reports"
    reports.mkdir(exist_ok=True)
    kernels = [a for k in m.kernels for a in ("--kernel", k)]
    if name == "conformance" and seeds and len(seeds) > 1:
        # The profile's cases drawn from each seed in turn: killed only if every draw kills it.
        results = [check(name, m, s, profile, [seed]) for seed in seeds]
        missed = [seed for seed, r in zip(seeds, results) if not r.killed]
        detail = f"killed under all {len(seeds)} seeds" if not missed else f"survived seeds {missed} of {seeds}"
        return Result(name, not missed, sum(r.seconds for r in results), detail)
    if name == "conformance":
        others = ["--backend", "triton", "--backend", "cpu"] if m.backend == "reference" else []
        report = reports / f"{m.id}.conformance.json"
        seed = ["--seed", str(seeds[0])] if seeds else []
        rc, out, sec = _run(s, ["-m", "conformance", "run", "--profile", profile, *seed, *kernels, "--backend", m.backend, *others,
                                "--no-shrink", "--no-require-coverage", "--every-interpreted", "--report", str(report)], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        if not report.exists():
            return Result(name, rc != 0, sec, out[-400:])
        killed, msg = conformance_kill(json.loads(report.read_text())["kernels"], m.backend)
        return Result(name, killed, sec, msg)
    if name == "threads":
        if m.backend != "cpu":
            return Result(name, None)
        report = reports / f"{m.id}.threads.json"
        rc, out, sec = _run(s, ["-m", "conformance", "threads", "--profile", profile, *kernels, "--report", str(report)], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        # A kill is outputs that differ between thread counts, not a check that could not run.
        found = json.loads(report.read_text()).get("kernels", {}) if report.exists() else {}
        differ = [e.get("message") or "" for e in found.values() if e.get("status") == "fail"]
        if differ:
            return Result(name, True, sec, differ[0].strip().splitlines()[0] if differ[0].strip() else "")
        return Result(name, False, sec, "" if rc == 0 else f"could not run (exit {rc}): {_first_message(report, out)}"[:300])
    if name == "fuzz":
        from conformance.backends import BACKENDS

        if m.backend not in BACKENDS or not BACKENDS[m.backend].validates:
            return Result(name, None)
        report = reports / f"{m.id}.fuzz.json"
        rc, out, sec = _run(s, ["-m", "conformance", "fuzz", "--profile", profile, *kernels, "--launches", str(FUZZ_LAUNCHES * len(m.kernels)),
                                "--report", str(report)], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        msgs = [e["message"] for e in json.loads(report.read_text())["kernels"].values() if e.get("message")] if report.exists() else [out]
        named = [x for x in msgs if _names_backend(x, m.backend)]
        return Result(name, rc != 0 and bool(named), sec, named[0].strip().splitlines()[0] if named else "")
    if name == "signatures":
        rc, out, sec = _run(s, ["-m", "conformance", "signatures", *kernels, "--backend", m.backend], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        fails = [line.strip() for line in out.splitlines() if " FAIL " in line]
        if rc != 0 and not fails:
            return _could_not_run(name, rc, sec, out)
        return Result(name, rc != 0, sec, fails[0] if rc != 0 else "")
    if name == "goldens":
        families = sorted({_family(k) for k in m.kernels})
        # The family's goldens, and the large-shape tier (offsets past 2**31, every family).
        files = [f"tests/test_{f}.py" for f in [*families, "large"] if (s.dir / f"tests/test_{f}.py").exists()]
        if not files:
            return Result(name, None)
        rc, out, sec = _run(s, ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files, "-k", m.backend], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        failed = [line for line in out.splitlines() if line.startswith("FAILED")]
        return Result(name, rc == 1, sec, failed[0] if failed else "")
    if name == "tsan":
        if m.backend != "cpu":
            return Result(name, None)
        rc, out, sec = _run(s, ["-m", "conformance", "sanitize", "--sanitizer", "thread", "--profile", profile, *kernels,
                                "--reports", str(reports / f"{m.id}.tsan")], CHECK_TIMEOUT)
        if rc is None:
            return Result(name, True, sec, "timed out")
        race = next((line.strip() for line in out.splitlines() if "WARNING: ThreadSanitizer" in line), "")
        if rc != 0 and not race:  # the sanitizer did not run (no TSan runtime, a failed build)
            return _could_not_run(name, rc, sec, out)
        return Result(name, rc != 0 and bool(race), sec, race)
    if name == "compile":
        if m.backend != "triton":
            return Result(name, None)
        report = reports / f"{m.id}.compile.json"
        rc, out, sec = _run(s, ["-m", "conformance", "compile", "--profile", profile, *kernels, "--report", str(report)], CHECK_TIMEOUT)
        if _crash(rc):
            return Result(name, True, sec, _crash(rc))
        return Result(name, rc == 1, sec, _first_message(report, out))
    raise ValueError(name)


def _could_not_run(name: str, rc: int, sec: float, out: str) -> Result:
    """Not a kill: the check exited non-zero without finding anything (its last line says why)."""
    tail = next((line.strip() for line in reversed(out.splitlines()) if line.strip()), "")
    return Result(name, False, sec, f"could not run (exit {rc}): {tail}"[:300])


def _first_message(report: Path, out: str) -> str:
    """The first line of the first kernel's message in a tool's JSON report (its output, without one)."""
    msg = next((e["message"] for e in json.loads(report.read_text())["kernels"].values() if e.get("message")), "") if report.exists() else out
    return (msg or "").strip().splitlines()[0] if (msg or "").strip() else ""


def _family(kernel: str) -> str:
    import contracts

    return contracts.get(kernel).family


def evaluate(m: Mutant, s: Scratch, profile: str, all_checks: bool, seeds: list[int] | None = None) -> dict[str, Any]:
    """Applies ``m``, builds if native, runs its checks; returns the row of the kill matrix."""
    row: dict[str, Any] = {"id": m.id, "backend": m.backend, "fault": m.fault, "file": m.file, "kernels": m.kernels,
                           "description": m.description, "checks": {}, "killed_by": None, "error": None}
    started = time.perf_counter()
    try:
        with Applied(s, m):
            if m.file.startswith("csrc/"):
                built = s.build()
                row["build_seconds"] = round(time.perf_counter() - started, 1)
                if built.returncode != 0:
                    row["error"] = "does not build: " + (built.stdout + built.stderr).strip()[-600:]
                    return row
            for name in m.checks:
                r = check(name, m, s, profile, seeds)
                if r.killed is None:
                    continue
                row["checks"][name] = {"killed": r.killed, "seconds": round(r.seconds, 1), "detail": r.detail[:300]}
                if r.killed and row["killed_by"] is None:
                    row["killed_by"] = name
                    if not all_checks:
                        break
    except ValueError as e:  # the find text is gone: the catalogue is stale
        row["error"] = str(e)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def matrix(rows: list[dict[str, Any]]) -> str:
    width = max([len(r["id"]) for r in rows] + [6]) + 2
    head = f"{'mutant':<{width}}{'backend':<11}" + "".join(f"{c:<13}" for c in CHECKS) + "verdict"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for c in CHECKS:
            e = r["checks"].get(c)
            cells.append(f"{'-' if e is None else 'KILLED' if e['killed'] else 'survived':<13}")
        verdict = (f"ERROR: {r['error']}" if r["error"] else f"killed by {r['killed_by']}" if r["killed_by"] else "SURVIVED")
        lines.append(f"{r['id']:<{width}}{r['backend']:<11}" + "".join(cells) + f"{verdict} ({r.get('seconds', 0)} s)")
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    p = sub.add_parser("mutants", help="apply each catalogued fault to a scratch copy and check the harness kills it")
    p.add_argument("--catalogue", type=input_file, help="a catalogue file (default: the core's and every family's)")
    p.add_argument("--id", action="append", help="only this mutant (repeatable)")
    p.add_argument("--backend", action="append", type=backend_name, help="only mutants of this backend (repeatable)")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--seed", type=int, action="append",
                   help="draw the conformance check's cases from this seed (repeatable: killed only if every seed kills it)")
    p.add_argument("--all-checks", action="store_true", help="run every check on every mutant (the full matrix), not just until the first kill")
    p.add_argument("--scratch", help="scratch directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--report", default="reports/mutants.json", type=output_file)
    p.add_argument("--junit", type=output_file, help="write a JUnit XML report here")
    p.add_argument("--shard", type=shard, metavar="K/N", help="only every N-th chosen mutant from the K-th: one share per machine")
    p.add_argument("--jobs", "-j", default="auto", type=jobs, help="scratch trees checking faults side by side (default auto: every core)")
    p.add_argument("--list", action="store_true", help="list the catalogue and check every mutant applies, then stop")
    p.set_defaults(func=cmd, check=_select)


def _select(ns: argparse.Namespace) -> list[Mutant]:
    """The mutants the command line asks for; ValueError when the catalogue does not load or holds none of them."""
    catalogue = load(Path(ns.catalogue) if ns.catalogue else CATALOGUE, source_tree("mutants"))
    if importlib.util.find_spec("pytest") is None:
        raise ValueError("`mutants` runs each planted fault's tests with pytest, which is not installed: "
                         "pip install 'specdiff[test]'")
    unknown = [i for i in ns.id or [] if i not in {m.id for m in catalogue}]
    if unknown:
        raise ValueError(f"--id: unknown mutant {', '.join(map(repr, unknown))}; known: {', '.join(m.id for m in catalogue)}")
    chosen = [m for m in catalogue if (not ns.id or m.id in ns.id) and (not ns.backend or m.backend in ns.backend)]
    if ns.shard:
        k, n = ns.shard
        chosen = chosen[k - 1::n]
    if not chosen:
        raise ValueError(f"no mutant of {ns.catalogue or 'the catalogue'} matches --id, --backend and --shard")
    return chosen


def cmd(ns: argparse.Namespace) -> int:
    chosen = _select(ns)
    if ns.list:
        bad, wide = 0, max((len(m.id) for m in chosen), default=0) + 2
        for m in chosen:
            try:
                mutate((ROOT / m.file).read_text(), m)
                ok = "applies"
            except (ValueError, OSError) as e:
                ok, bad = f"STALE: {e}", bad + 1
            print(f"{m.id:<{wide}}{m.backend:<11}{m.fault:<38}{ok}")
        return 1 if bad else 0
    started = time.perf_counter()
    lanes = min(ns.jobs, len(chosen))
    where = [Path(ns.scratch) / str(i) if lanes > 1 else Path(ns.scratch) for i in range(lanes)] if ns.scratch else [None] * lanes
    print(f"specdiff mutants: {len(chosen)} faults, profile {ns.profile}, {lanes} scratch tree(s)", flush=True)
    done: dict[int, dict[str, Any]] = {}
    todo = list(enumerate(chosen))
    lock = threading.Lock()
    broken_tree: list[str] = []

    def lane(i: int) -> None:
        # Each lane owns a scratch copy and takes the next fault not yet taken.
        s = Scratch(source_tree("mutants"), where[i], ns.keep)
        try:
            # Always: the copy's port votes on every fault (a launcher fault is its Python, an oracle
            # fault is outvoted by it). Unbuilt, the copy would import whatever extension an editable
            # install of the checkout points at, or none, and the port's checks would not run.
            t = time.perf_counter()
            built = s.build()
            if built.returncode != 0:
                with lock:
                    print((built.stdout + built.stderr)[-3000:])
                    broken_tree.append("the unmutated tree does not build")
                return
            s.save_pristine()
            print(f"  built the unmutated extension in {s.dir} in {time.perf_counter() - t:.0f} s", flush=True)
            while True:
                with lock:
                    if not todo or broken_tree:
                        return
                    k, m = todo.pop(0)
                row = evaluate(m, s, ns.profile, ns.all_checks, ns.seed)
                how = row["error"] or (f"killed by {row['killed_by']}: {row['checks'][row['killed_by']]['detail']}" if row["killed_by"] else "SURVIVED")
                with lock:
                    done[k] = row
                    print(f"  {m.id} ({m.backend}, {m.fault}): {how[:220]} [{row['seconds']} s]", flush=True)
        except BaseException as err:
            with lock:
                broken_tree.append(f"{type(err).__name__}: {err}")
        finally:
            s.close()

    # Daemons: an interrupt ends the run (the checks' processes get it too) with the rows so far reported.
    threads = [threading.Thread(target=lane, args=(i,), daemon=True) for i in range(lanes)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            th.join()
    except BaseException as err:
        rows = [done[k] for k in sorted(done)]
        _report(ns, rows, time.perf_counter() - started, f"the run stopped after {len(rows)} of {len(chosen)} mutants: {type(err).__name__}")
        raise
    rows = [done[k] for k in sorted(done)]
    incomplete = None
    if broken_tree or len(rows) < len(chosen):
        incomplete = f"the run stopped after {len(rows)} of {len(chosen)} mutants: {'; '.join(broken_tree) or 'interrupted'}"
        print(f"FAILED: {incomplete}")
    survived, broken = _report(ns, rows, time.perf_counter() - started, incomplete)
    return 0 if not survived and not broken and incomplete is None else 1


def _report(ns: argparse.Namespace, rows: list[dict[str, Any]], seconds: float, incomplete: str | None) -> tuple[list[str], list[str]]:
    """Prints the kill matrix and writes the JSON (and JUnit) report; returns the survivors and the broken mutants."""
    print()
    print(matrix(rows))
    killed = sum(1 for r in rows if r["killed_by"])
    survived = [r["id"] for r in rows if not r["killed_by"] and not r["error"]]
    broken = [r["id"] for r in rows if r["error"]]
    print(f"\nkilled {killed}/{len(rows)}" + (f"; survived: {', '.join(survived)}" if survived else "")
          + (f"; stale or not building: {', '.join(broken)}" if broken else "") + f"; {seconds:.0f} s")
    report: dict[str, Any] = {"schema": 1, "profile": ns.profile, "killed": killed, "total": len(rows), "seconds": round(seconds, 1),
                              "mutants": rows}
    if incomplete:
        report["incomplete"] = incomplete
    path = Path(ns.report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    if ns.junit:
        from conformance import junit

        junit.write(ns.junit, "mutants", [
            junit.TestCase(f"mutants.{r['backend']}", r["id"], r.get("seconds", 0.0),
                           failure=None if r["killed_by"] or r["error"] else f"{r['fault']} survived every check: {r['description']}",
                           error=r["error"])
            for r in rows
        ])
    return survived, broken
