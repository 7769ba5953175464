"""Compile every Triton kernel for a GPU target, on a machine without a GPU.

The interpreter runs a kernel's Python on NumPy: it never type-checks what the compiler does (an
int32 literal joined with an int64 load across an ``if``/``else``, a float64 value stored through
a float32 pointer, a constexpr used as a runtime value). CI has no GPU, but Triton compiles for
any target it has a backend for. ``python -m conformance compile`` draws the kernel's Hypothesis
cases, binds each exactly as a launch would (Triton's own binder: pointer dtypes, integer widths,
None arguments, constexpr values, the divisibility-by-16 attributes), and compiles every distinct
specialization through to the target's binary (``cubin`` for CUDA). Any compile error fails the
kernel, with the specialization that broke.

This imports the Triton kernels compiled (it sets ``TRITON_INTERPRET=0`` whatever the environment
says); run it as a command of its own, not in a process that already imported them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import contracts
from conformance.arguments import jobs, kernel_name, output_file
from conformance.profiles import PROFILES, chosen

# Distinct specializations compiled per kernel and profile (each takes one to a few seconds).
CASES = {"dev": 20, "ci": 60, "nightly": 400}
DEFAULT_TARGET = "cuda:90"  # Hopper: the lent H100, and vLLM 0.33.0's main target


def target_of(text: str) -> Any:
    """``cuda:90`` / ``hip:gfx942``: Triton's GPUTarget (warp size 32 on CUDA, 64 on HIP)."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend not in ("cuda", "hip") or not arch:
        raise argparse.ArgumentTypeError(f"target {text!r} must be cuda:<sm, e.g. 90> or hip:<gfx arch>")
    if backend == "cuda":
        if not arch.isdigit():
            raise argparse.ArgumentTypeError(f"target {text!r}: the CUDA architecture is a number such as 90")
        return GPUTarget("cuda", int(arch), 32)
    return GPUTarget("hip", arch, 64)


def _jit(name: str) -> tuple[Any, list[tuple[str, Any]]]:
    """The triton backend's JITFunction of ``name`` and, outermost first, the constexprs its
    ``triton.heuristics`` wrappers fill from a launch's arguments (KernelSpec.tuning)."""
    from triton.runtime.autotuner import Heuristics
    from triton.runtime.jit import JITFunction

    from conformance.backends import BACKENDS
    from conformance.tools.signatures import triton_wrappers

    wrappers, fn = triton_wrappers(BACKENDS["triton"].resolve(contracts.get(name)))
    filled = [item for w in wrappers if isinstance(w, Heuristics) for item in w.values.items()]
    if not isinstance(fn, JITFunction):
        raise RuntimeError(f"{name}: the triton backend's kernel is a {type(fn).__name__}, not a JITFunction "
                           "(TRITON_INTERPRET must be 0 before triton_impl is imported)")
    return fn, filled


def with_heuristics(args: dict[str, Any], filled: list[tuple[str, Any]]) -> dict[str, Any]:
    """A launch's arguments as the heuristics complete them before the JIT binds them."""
    out = dict(args)
    for k, heuristic in filled:
        out[k] = heuristic(out)
    return out


def specialization(fn: Any, backend: Any, args: dict[str, Any]) -> tuple[dict[str, str], dict[Any, Any], dict[Any, Any], Any]:
    """(signature, constexprs, attributes, options) of a launch with ``args``, as Triton's JIT
    computes them when it compiles that launch (private API of Triton 3.x: checked by the tests)."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, options = binder(**args)
    options, signature, constexprs, attrs = fn._pack_args(backend, {}, bound, spec, options)
    return signature, constexprs, attrs, options


def compile_kernel(name: str, target: Any, cases: int) -> dict[str, Any]:
    """Compiles ``name`` for ``target`` at every distinct specialization of ``cases`` drawn cases."""
    import triton
    from hypothesis import HealthCheck, given, settings
    from triton.compiler import ASTSource, make_backend

    from conformance.backend import addressed
    from conformance.strategies import cases as strategy

    fn, filled = _jit(name)
    backend = make_backend(target)
    seen: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    started = time.perf_counter()

    @settings(max_examples=cases, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy(name))
    def draw(case: Any) -> None:
        # Pointer tables as the kernel takes them, a uint64 tensor of addresses (Backend.addresses).
        signature, constexprs, attrs, options = specialization(fn, backend, with_heuristics(addressed(case.args), filled))
        key = json.dumps([signature, {str(k): repr(v) for k, v in constexprs.items()}, {str(k): repr(v) for k, v in attrs.items()}],
                         sort_keys=True)
        if key in seen:
            return
        seen[key] = {"signature": signature, "constexprs": {fn.arg_names[k[0]]: repr(v) for k, v in constexprs.items()}}
        try:
            triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
        except Exception as e:  # CompilationError, or the backend's (ptxas) errors
            first = str(e).strip().splitlines()
            errors.append(f"{type(e).__name__} at {json.dumps(seen[key]['signature'])} "
                          f"constexprs {seen[key]['constexprs']}:\n    " + "\n    ".join(first[-12:]))

    draw()
    return {"status": "fail" if errors else "pass", "specializations": len(seen), "seconds": round(time.perf_counter() - started, 1),
            "message": "\n".join(errors) or None}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compile", help="compile every Triton kernel for a GPU target (no GPU needed), every drawn specialization")
    p.add_argument("--profile", default=chosen(), choices=PROFILES)
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"cuda:<sm> or hip:<arch> (default {DEFAULT_TARGET})")
    p.add_argument("--cases", type=int, help="cases drawn per kernel (default: dev 20, ci 60, nightly 400)")
    p.add_argument("--report", default="reports/compile.json", type=output_file)
    p.add_argument("--jobs", "-j", default="auto", type=jobs, help="processes compiling kernels side by side (default auto: every core)")
    p.set_defaults(func=cmd)


def _compile_in_worker(name: str, target: str, cases: int, profile: str) -> dict[str, Any]:
    from hypothesis import settings

    settings.load_profile(profile)  # derandomized under ci: the same specializations as one process draws
    return compile_kernel(name, target_of(target), cases)


def cmd(ns: argparse.Namespace) -> int:
    if "triton_impl" in sys.modules:
        print("specdiff compile: the Triton kernels were already imported in this process; run the command on its own")
        return 2
    os.environ["TRITON_INTERPRET"] = "0"  # before triton_impl decides it (without a GPU it would choose 1)
    try:
        target = target_of(ns.target)
    except argparse.ArgumentTypeError as e:
        print(f"specdiff compile: {e}")
        return 2
    from hypothesis import settings

    from conformance.backends import BACKENDS

    settings.load_profile(ns.profile)
    names = [k for k in ns.kernel or list(contracts.SPECS) if BACKENDS["triton"].applies(contracts.get(k))]
    n = ns.cases or CASES[ns.profile]
    print(f"specdiff compile: target {ns.target}, {n} cases per kernel", flush=True)
    results: dict[str, dict[str, Any]] = {}

    def show(name: str, r: dict[str, Any]) -> None:
        print(f"  {name}: {r['status']} {r['specializations']} specializations in {r['seconds']} s", flush=True)
        if r["message"]:
            print("    " + r["message"].replace("\n", "\n    "), flush=True)

    workers = min(ns.jobs, len(names))
    if workers <= 1:
        for name in names:
            show(name, r := compile_kernel(name, target, n))
            results[name] = r
    else:
        # Each kernel compiles on one core; a process per core (spawned: TRITON_INTERPRET=0 travels
        # in the environment, and no worker inherits a parent's Triton state).
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_compile_in_worker, name, ns.target, n, ns.profile): name for name in names}
            for f in as_completed(futures):
                show(futures[f], r := f.result())
                results[futures[f]] = r
        results = {name: results[name] for name in names}
    with open(ns.report, "w") as f:
        json.dump({"schema": 1, "target": ns.target, "profile": ns.profile, "kernels": results}, f, indent=2)
    bad = [k for k, r in results.items() if r["status"] != "pass"]
    print(f"FAILED to compile: {', '.join(bad)}" if bad else f"all {len(results)} kernels compiled for {ns.target}")
    return 1 if bad else 0
