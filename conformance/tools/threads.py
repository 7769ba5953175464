"""Thread-count invariance of the OpenMP port: bit-identical outputs at 1, 2, 3, all and twice all cores.

Every parallel loop of csrc/ carries an ``if (work >= threshold)`` clause, so the small batches
Hypothesis generates would all run on one thread and prove nothing. This check therefore runs
in a child process with a tiny preload library (:data:`SHIM`) that forces every parallel region
*launched from cpu_impl._C* onto the full team: GCC lowers ``#pragma omp parallel if (c)`` to
``GOMP_parallel(fn, data, c ? 0 : 1, flags)``, and the shim turns the ``1`` into ``0`` (the
team size set by ``omp_set_num_threads``). Regions of other libraries (torch) are untouched.
A port whose result depends on the thread count, or on how iterations are split among threads
(a race, a missing reduction, a per-thread chunking), then disagrees with itself.

For each kernel, each Hypothesis case runs on the ``cpu`` backend once per thread count through
the runner's poisoning launch (inputs checked unchanged) and the outputs compare as bit
patterns. The child reports how many parallel regions it forced, so a run that forced none —
the shim not loaded, or a port without OpenMP — is visible.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance.arguments import kernel_name, output_file
from conformance.profiles import PROFILES, chosen

SHIM = r"""
// Forces every OpenMP parallel region launched from cpu_impl._C onto the full team, and can hold
// the team's master back so that the other threads run their iterations first.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static unsigned long forced, regions;
static unsigned stagger_us;  /* > 0: the master sleeps this long before its share of the loop */
static int (*thread_num)(void);

unsigned long specdiff_forced_regions(void) { return forced; }
unsigned long specdiff_parallel_regions(void) { return regions; }
void specdiff_set_stagger(unsigned us) { stagger_us = us; }

struct call { void (*fn)(void *); void *data; unsigned us; };

static void staggered(void *p) {
  struct call *c = (struct call *)p;
  if (thread_num() == 0) usleep(c->us);
  c->fn(c->data);
}

static int from_extension(void *caller) {
  Dl_info info;
  return dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "cpu_impl/_C") != NULL;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
  static parallel_fn next;
  if (!next) {
    void *gomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_LAZY);
    next = (parallel_fn)dlsym(gomp ? gomp : RTLD_NEXT, "GOMP_parallel");
    if (!next || next == GOMP_parallel) next = (parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    thread_num = (int (*)(void))dlsym(gomp ? gomp : RTLD_NEXT, "omp_get_thread_num");
    if (!next || !thread_num) {
      fprintf(stderr, "specdiff force-parallel shim: no libgomp to forward to\n");
      abort();
    }
  }
  if (from_extension(__builtin_return_address(0))) {
    __atomic_add_fetch(&regions, 1, __ATOMIC_RELAXED);
    if (num_threads == 1) {  /* an if() clause that said "serial" */
      num_threads = 0;
      __atomic_add_fetch(&forced, 1, __ATOMIC_RELAXED);
    }
    if (stagger_us) {
      struct call c = {fn, data, stagger_us};
      next(staggered, &c, num_threads, flags);
      return;
    }
  }
  next(fn, data, num_threads, flags);
}
"""

STAGGER_US = 300  # how long the master waits in the staggered schedule: far longer than any test case's loop

_ENV_FLAG = "SPECDIFF_FORCE_PARALLEL"


def thread_counts() -> list[int]:
    """1, 2, 3, every core and twice as many (more threads than cores: the OS, not OpenMP, then
    decides who runs), without repeats, in that order."""
    counts: list[int] = []
    for n in (1, 2, 3, os.cpu_count() or 1, 2 * (os.cpu_count() or 1)):
        if n not in counts:
            counts.append(n)
    return counts


def build_shim() -> Path:
    """Compiles :data:`SHIM` (a fraction of a second) into a new private directory and returns the
    library's path; the caller removes its directory when done.

    Nothing is cached: a library found in a shared or predictable place could have been planted
    there by anyone, and what would make reusing one safe (checking the directory's owner and mode
    and the library's hash) is more code than the compile is time. ``mkdtemp`` makes the directory
    with a fresh random name and mode 0700."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"
    directory = Path(tempfile.mkdtemp(prefix="specdiff-shim-"))
    src, lib = directory / "force_parallel.c", directory / "libspecdiff_force_parallel.so"
    try:
        src.write_text(SHIM)
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return lib


def _stagger(us: int) -> bool:
    """Holds each forced region's master back ``us`` microseconds (0: no stagger); False without the shim."""
    try:
        fn = ctypes.CDLL(None).specdiff_set_stagger
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_uint]
    fn(us)
    return True


def schedules(counts: list[int]) -> list[tuple[int, int]]:
    """(threads, master stagger in µs): every count as the runtime schedules it, then two and all
    threads with the master held back, so iterations after the first thread's run before it.
    A loop that carries state from one iteration to the next (a running offset shared by the
    threads) then reads state no iteration wrote yet: a race made deterministic."""
    out = [(n, 0) for n in counts]
    for n in sorted({2, counts[-1]}):
        if n > 1:
            out.append((n, STAGGER_US))
    return out


def _shim_counters() -> tuple[int, int] | None:
    try:
        me = ctypes.CDLL(None)
        forced, regions = me.specdiff_forced_regions, me.specdiff_parallel_regions
    except (OSError, AttributeError):
        return None
    forced.restype = regions.restype = ctypes.c_ulong
    return int(forced()), int(regions())


# -- the check, in the child process ------------------------------------------------------------
class ThreadDisagreement(AssertionError):
    pass


def _label(schedule: tuple[int, int]) -> str:
    n, us = schedule
    return f"{n} OpenMP thread{'s' if n != 1 else ''}" + (f" (master held back {us} us)" if us else "")


def _describe(kernel: str, plan: list[tuple[int, int]], outs: dict[tuple[int, int], Any]) -> str:
    import torch

    from conformance.runner import bits

    first = plan[0]
    base = outs[first]
    for schedule in plan[1:]:
        o = outs[schedule]
        if base.error or o.error:
            if (base.error or "").splitlines()[:1] != (o.error or "").splitlines()[:1]:
                return f"{kernel}: {_label(first)}: {base.error or 'ok'}; {_label(schedule)}: {o.error or 'ok'}"
            continue
        for name in sorted(base.outputs):
            a, b = bits(base.outputs[name]).reshape(-1), bits(o.outputs[name]).reshape(-1)
            if not torch.equal(a, b):
                i = int((a != b).nonzero()[0])
                return (
                    f"{kernel}: output '{name}' differs between {_label(first)} and {_label(schedule)} at flat element {i}: "
                    f"{base.outputs[name].reshape(-1)[i].item()!r} vs {o.outputs[name].reshape(-1)[i].item()!r}"
                )
    return f"{kernel}: outputs differ between schedules {[_label(x) for x in plan]}"


def check_kernel(kernel: str, counts: list[int], max_examples: int | None = None) -> dict[str, Any]:
    """Runs ``kernel``'s Hypothesis cases at every thread count; returns a report entry."""
    from hypothesis import given, settings

    import contracts
    from conformance.backends import BACKENDS
    from conformance.casefile import replay_command, save_failure
    from conformance.runner import poison_variants, vote_key
    from conformance.strategies import cases
    from cpu_impl import _C

    backend = BACKENDS["cpu"]
    if backend.resolve(contracts.get(kernel)) is None:
        return {"status": "missing", "examples": 0, "message": f"cpu has no {kernel}"}
    tally = {"examples": 0}
    before = _shim_counters()
    plan = _plan(counts, before is not None)

    @given(case=cases(kernel))
    def prop(case: Any) -> None:
        tally["examples"] += 1
        try:
            for variant in range(poison_variants(case.spec, case.args)):
                outs = _outputs(case, plan, variant)
                if len({vote_key(o) for o in outs.values()}) > 1:
                    path = save_failure(case)
                    raise ThreadDisagreement(f"{_describe(kernel, plan, outs)}\n  replay: {replay_command(path, 'threads', '--replay')}")
        finally:
            _C.set_num_threads(counts[-1])
            _stagger(0)

    if max_examples is not None:
        prop = settings(max_examples=max_examples)(prop)
    started = time.perf_counter()
    entry: dict[str, Any] = {"status": "pass", "message": None}
    try:
        prop()
    except ThreadDisagreement as e:
        entry.update(status="fail", message=str(e))
    except Exception as e:  # a strategy or harness error
        entry.update(status="error", message=f"{type(e).__name__}: {e}")
    after = _shim_counters()
    entry["examples"] = tally["examples"]
    entry["seconds"] = round(time.perf_counter() - started, 2)
    if before is not None and after is not None:
        entry["forced_regions"] = after[0] - before[0]
        entry["parallel_regions"] = after[1] - before[1]
    return entry


def _plan(counts: list[int], shim: bool) -> list[tuple[int, int]]:
    """(threads, master delay in us) pairs: every schedule with the preload shim, else the counts."""
    return schedules(counts) if shim else [(n, 0) for n in counts]


def _outputs(case: Any, plan: list[tuple[int, int]], variant: int) -> dict[tuple[int, int], Any]:
    """The C++ port's outputs for one poison variant of ``case`` under every schedule of ``plan``."""
    from conformance.backends import BACKENDS
    from conformance.runner import run_backend
    from cpu_impl import _C

    outs = {}
    for n, us in plan:
        _C.set_num_threads(n)
        _stagger(us)
        outs[(n, us)] = run_backend(BACKENDS["cpu"], case, variant)
    return outs


def replay(path: str, counts: list[int]) -> int:
    from conformance.casefile import load_case
    from conformance.runner import poison_variants, vote_key

    case = load_case(path)
    plan = _plan(counts, _shim_counters() is not None)
    for variant in range(poison_variants(case.spec, case.args)):
        outs = _outputs(case, plan, variant)
        _stagger(0)
        if len({vote_key(o) for o in outs.values()}) > 1:
            print(_describe(case.kernel, plan, outs))
            return 1
    print(f"{case.kernel}: identical under {', '.join(_label(x) for x in plan)}")
    return 0


# -- command line: re-executes itself with the shim preloaded ------------------------------------
MAX_THREADS = 4096  # beyond any machine's cores: a larger count is a typo


def team_sizes(value: str) -> list[int]:
    """``--threads``: comma-separated OpenMP team sizes, each from 1 to :data:`MAX_THREADS`."""
    try:
        out = [int(x) for x in value.split(",")]
    except ValueError:
        out = []
    if not out or not all(1 <= n <= MAX_THREADS for n in out):
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of thread counts from 1 to {MAX_THREADS}")
    return out


def add_parser(sub: Any) -> None:
    p = sub.add_parser("threads", help="check the C++ port gives bit-identical outputs at 1, 2, 3, all and twice all OpenMP threads")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--threads", type=team_sizes, help="comma-separated thread counts (default 1,2,3,all cores,twice all)")
    p.add_argument("--max-examples", type=int, help="override the profile's examples per kernel")
    p.add_argument("--no-force", action="store_true", help="keep the ports' own serial thresholds (no preload shim)")
    p.add_argument("--report", default="reports/threads.json", type=output_file)
    p.add_argument("--junit", type=output_file, help="write a JUnit XML report here")
    p.add_argument("--replay", help="re-run one saved case at every thread count")
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    counts = ns.threads or thread_counts()
    if not ns.no_force and os.environ.get(_ENV_FLAG) is None:
        lib = build_shim()
        try:
            env = dict(os.environ)
            env["LD_PRELOAD"] = " ".join(x for x in (env.get("LD_PRELOAD", ""), str(lib)) if x)  # after libasan, if any
            env[_ENV_FLAG] = str(lib)
            return subprocess.run([sys.executable, "-m", "conformance", "threads", *_argv(ns)], env=env).returncode
        finally:
            shutil.rmtree(lib.parent, ignore_errors=True)
    if ns.replay:
        return replay(ns.replay, counts)
    from hypothesis import settings

    import contracts

    settings.load_profile(ns.profile)
    forcing = _shim_counters() is not None
    print(f"specdiff threads: profile {ns.profile}, OpenMP threads {counts}, "
          f"{'every parallel region forced (preload shim), then 2 and all threads with the master held back' if forcing else 'ports keep their serial thresholds'}",
          flush=True)
    results: dict[str, dict[str, Any]] = {}
    report: dict[str, Any] = {"schema": 1, "profile": ns.profile, "threads": counts, "forced": forcing, "kernels": results}
    try:  # the report is written whatever happens: what was collected, and why the run stopped
        for name in ns.kernel or list(contracts.SPECS):
            e = check_kernel(name, counts, ns.max_examples)
            results[name] = e
            forced = f", {e['forced_regions']}/{e['parallel_regions']} regions forced parallel" if "forced_regions" in e else ""
            print(f"  {name}: {e['status']} {e['examples']} cases in {e.get('seconds', 0)} s{forced}", flush=True)
            if e["message"]:
                print("\n" + e["message"] + "\n", flush=True)
    except BaseException as err:
        report["incomplete"] = f"the run stopped after {len(results)} kernels: {type(err).__name__}: {err}"
        raise
    finally:
        path = Path(ns.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        if ns.junit:
            from conformance import junit

            junit.write(ns.junit, "threads", [
                junit.TestCase("threads", k, e.get("seconds", 0.0), failure=e["message"] if e["status"] == "fail" else None,
                               error=e["message"] if e["status"] == "error" else None, skipped=e["message"] if e["status"] == "missing" else None)
                for k, e in results.items()
            ])
    bad = [k for k, e in results.items() if e["status"] in ("fail", "error")]
    if bad:
        print(f"FAILED: {', '.join(bad)}")
        return 1
    print(f"thread counts {counts}: bit-identical on {len(results)} kernels")
    return 0


def _argv(ns: argparse.Namespace) -> list[str]:
    out = ["--profile", ns.profile, "--report", ns.report]
    for k in ns.kernel or []:
        out += ["--kernel", k]
    if ns.threads:
        out += ["--threads", ",".join(map(str, ns.threads))]
    if ns.max_examples is not None:
        out += ["--max-examples", str(ns.max_examples)]
    if ns.junit:
        out += ["--junit", ns.junit]
    if ns.replay:
        out += ["--replay", ns.replay]
    return out
