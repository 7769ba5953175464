"""Signature conformance: every backend's launch signature against its kernel's contract.

A call site that gains a keyword (vLLM's rejection sampler once gained ``SYNTHETIC_MODE``)
crashes an engine whose CPU port still has the old signature. This gate catches that before any
kernel runs: for every kernel in :data:`contracts.SPECS` and every registered backend
that implements it, it checks

- ``contract``: the contract itself — unique names, parameters with defaults trailing, flags
  naming real parameters;
- ``names``: parameter names and their order (``arg_names``, else ``inspect.signature``);
- ``defaults``: the trailing optional parameters and their default values;
- ``constexprs``: which parameters are ``tl.constexpr``, where the backend exposes it;
- ``launch``: the launch forms of §1.9 on a small valid case — every parameter by keyword as
  vLLM's dispatchers pass them, positionally, constexprs by keyword after positional pointers,
  trailing defaults omitted, and (for the CPU port) every Triton launch option accepted and
  ignored;
- ``unknown-keyword``: a keyword the kernel does not have is a ``TypeError`` naming it (CPU port);
- ``cpp-entry``: the C++ entry point ``cpu_impl._C.<family>.<kernel name without _kernel>``
  takes one argument per contract parameter and the launcher passes them all, in order.

With ``--vllm`` it also checks each contract against vLLM's own kernel (``KernelSpec.qualname``):
names, order and constexprs. Without an importable vLLM that check is skipped with the reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

import contracts
from conformance.arguments import backend_name, kernel_name, output_file
from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.runner import bits, copy_args
from contracts.spec import LAUNCH_OPTIONS, REQUIRED, KernelSpec, Kind

UNKNOWN = "NOT_A_PARAMETER"


@dataclass
class Check:
    kernel: str
    backend: str  # "contract" and "vllm" for the checks that involve no backend
    check: str
    ok: bool | None  # None: skipped
    message: str = ""


# -- what a backend's kernel object says about itself ---------------------------------------
def _python_fn(obj: Any) -> Callable[..., Any] | None:
    """The Python function behind a kernel object: Triton's JIT / interpreted ``fn``, or itself."""
    fn = getattr(obj, "fn", None)
    if callable(fn):
        return fn
    if inspect.isfunction(obj):
        return obj
    return None


def triton_wrappers(obj: Any) -> tuple[list[Any], Any]:
    """Triton's ``heuristics`` / ``autotune`` wrappers around a kernel object, outermost first, and
    what they wrap."""
    from triton.runtime.autotuner import Autotuner, Heuristics  # noqa: PLC0415

    out = []
    while isinstance(obj, (Autotuner, Heuristics)):
        out.append(obj)
        obj = obj.fn
    return out, obj


def filled_by_heuristics(obj: Any) -> list[str]:
    """Parameters a ``triton.heuristics`` wrapper (at any depth) fills from the launch's arguments."""
    from triton.runtime.autotuner import Heuristics  # noqa: PLC0415

    return [name for w in triton_wrappers(obj)[0] if isinstance(w, Heuristics) for name in w.values]


def names_of(obj: Any) -> list[str] | None:
    names = getattr(obj, "arg_names", None)
    if names is not None:
        return list(names)
    try:
        return list(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return None


def defaults_of(obj: Any) -> dict[str, Any] | None:
    """Parameters with a default and their values, from the Python signature (None if none)."""
    target = _python_fn(obj) or obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return None
    return {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


def constexprs_of(obj: Any) -> list[int] | None:
    """Indices of the constexpr parameters, where the kernel object exposes them."""
    obj = triton_wrappers(obj)[1]
    if getattr(obj, "constexprs", None) is not None:  # vLLM's KernelOverride mirrors a kernel's, or None
        return sorted(obj.constexprs)
    params = getattr(obj, "params", None)
    if params and all(hasattr(p, "is_constexpr") for p in params):
        return [i for i, p in enumerate(params) if p.is_constexpr]
    fn = getattr(obj, "fn", None)  # Triton's interpreter keeps only the function
    if fn is not None:
        sig = inspect.signature(fn)
        return [i for i, p in enumerate(sig.parameters.values()) if "constexpr" in str(p.annotation)]
    return None


def cpp_arity(fn: Any) -> int | None:
    """Number of arguments of a pybind11 function, from its signature line ``f(arg0: T, ...) -> R``."""
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    if not doc or "(" not in doc[0]:
        return None
    inner, depth = [], 0
    for ch in doc[0][doc[0].index("(") + 1 :]:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        inner.append("\0" if ch == "," and depth == 0 else ch)
    parts = [a for a in "".join(inner).split("\0") if a.strip()]
    return len(parts)


# -- a small valid case per kernel -------------------------------------------------------------
def example_case(kernel: str, predicate: Callable[[Case], bool] = lambda c: True) -> Case:
    """The simplest keyword-launched case of ``kernel`` satisfying ``predicate`` (deterministic)."""
    from hypothesis import HealthCheck, Phase, find, settings

    from conformance.strategies import cases

    quiet = settings(
        database=None, derandomize=True, max_examples=500, phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck), deadline=None,
    )
    return find(cases(kernel), lambda c: not c.positional and predicate(c), settings=quiet)


def _launch(backend: Any, kernel: Any, case: Case, args: tuple[Any, ...] = (), **kwargs: Any) -> dict[str, Any]:
    """Launches with copies of the case's tensors; returns the copies (outputs written)."""
    copies = copy_args(case.args, backend.device())
    positional = [copies[n] for n in case.spec.arg_names[: len(args)]]
    keywords = {n: copies[n] for n in kwargs.pop("_names", ())}
    keywords.update(kwargs)
    backend.launcher(kernel, case.launch_grid())(*positional, **keywords)
    return copies


def _outputs(spec: KernelSpec, copies: dict[str, Any]) -> list[torch.Tensor]:
    return [bits(copies[p.name]).cpu() for p in spec.outputs if isinstance(copies[p.name], torch.Tensor)]


# -- the checks ------------------------------------------------------------------------------
def check_contract(spec: KernelSpec) -> list[Check]:
    out = []
    names = spec.arg_names
    dup = sorted({n for n in names if names.count(n) > 1})
    out.append(Check(spec.name, "contract", "names", not dup, f"duplicate parameters {dup}" if dup else ""))
    first_default = next((i for i, p in enumerate(spec.params) if p.default is not REQUIRED), len(names))
    late = [p.name for p in spec.params[first_default:] if p.default is REQUIRED]
    out.append(
        Check(spec.name, "contract", "defaults", not late,
              f"required parameters {late} follow a parameter with a default: optional parameters must trail" if late else "")
    )
    bad_flags = [f"{f.constexpr}/{f.tensor}" for f in spec.flags if f.constexpr not in names or f.tensor not in names]
    bad_flags += [f.constexpr for f in spec.flags if f.constexpr in names and spec.param(f.constexpr).kind is not Kind.CONSTEXPR]
    out.append(Check(spec.name, "contract", "flags", not bad_flags, f"flags naming no constexpr/tensor pair: {bad_flags}" if bad_flags else ""))
    return out


def check_backend(spec: KernelSpec, name: str, case: Case | None = None) -> list[Check]:
    """Every signature check of one backend's kernel against ``spec``."""
    backend = BACKENDS[name]
    why = backend.unavailable()
    if why is not None:
        return [Check(spec.name, name, "available", None, why)]
    kernel = backend.resolve(spec)
    if kernel is None:
        return []  # conformance reports missing kernels; partial backends answer for their own
    from conformance import engine

    if isinstance(kernel, engine.Drifted):  # another release's parameters: reported, never launched
        return [Check(spec.name, name, "names", None if kernel.declared else False, kernel.message)]
    out: list[Check] = []

    def add(check: str, ok: bool | None, message: str = "") -> None:
        out.append(Check(spec.name, name, check, ok, message))

    want = list(spec.arg_names)
    got = names_of(kernel)
    if name == ORACLE and spec.check_grid is not None and got is not None and got[-1:] == ["grid"]:
        got = got[:-1]  # a kernel that reads its grid: the oracle takes it too, by keyword (KernelSpec.check_grid)
    names_ok = False
    if got is None:
        add("names", False, "kernel object is not introspectable: no arg_names and no inspect.signature")
    else:
        # Tuning constexprs (KernelSpec.tuning) may follow the engine's parameters where the
        # kernel's heuristics fill them, so that no launch has to pass them.
        tuned = got[len(want):] if got[: len(want)] == want else []
        unfilled = [n for n in tuned if n not in spec.tuning or n not in filled_by_heuristics(kernel)]
        names_ok = got[: len(want)] == want and not unfilled
        message = "" if names_ok else _diff_names(want, got)
        if unfilled and got[: len(want)] == want:
            message = f"parameters {unfilled} follow the contract's without being KernelSpec.tuning filled by triton.heuristics"
        add("names", names_ok, message)

    defaults = defaults_of(kernel)
    if defaults is not None:
        want_defaults = {p.name: p.default for p in spec.params if p.default is not REQUIRED}
        add("defaults", defaults == want_defaults, "" if defaults == want_defaults else f"defaults {defaults}, contract {want_defaults}")

    if name != ORACLE:  # the oracle is a plain function: a constexpr is just an argument there
        ce = constexprs_of(kernel)
        if ce is not None:
            want_ce = list(spec.constexprs) + list(range(len(want), len(got or want)))  # tuning: constexprs all
            names = got if got is not None and len(got) >= len(want) else want
            add("constexprs", ce == want_ce, "" if ce == want_ce else f"constexprs {[names[i] for i in ce if i < len(names)]}, contract {[names[i] for i in want_ce if i < len(names)]}")

    if names_ok:
        case = case or example_case(spec.name)
        out.extend(Check(spec.name, name, *r) for r in _launch_forms(spec, backend, kernel, case))

    from cpu_impl.launcher import CpuKernel  # noqa: PLC0415 - only the CPU port has these duties

    if isinstance(kernel, CpuKernel):
        out.append(Check(spec.name, name, "unknown-keyword", *_unknown_keyword(spec, backend, kernel, case or example_case(spec.name))))
        out.append(Check(spec.name, name, "cpp-entry", *_cpp_entry(spec, kernel)))
    return out


def _diff_names(want: list[str], got: list[str]) -> str:
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    if not parts:
        parts.append(f"order {got}, contract {want}")
    return "; ".join(parts)


def _launch_forms(spec: KernelSpec, backend: Any, kernel: Any, case: Case) -> Iterable[tuple[str, bool, str]]:
    names = list(spec.arg_names)
    required = [p.name for p in spec.params if p.default is REQUIRED]
    constexprs = [names[i] for i in spec.constexprs]
    pointers_first = [n for n in names if n not in constexprs]
    forms: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
        ("keywords", "every parameter by keyword (vLLM's dispatchers)", lambda: _launch(backend, kernel, case, _names=names)),
        ("positional", "every parameter positionally", lambda: _launch(backend, kernel, case, tuple(names))),
    ]
    if constexprs and pointers_first == names[: len(pointers_first)]:
        forms.append(("constexpr-keywords", "constexprs by keyword after positional arguments",
                      lambda: _launch(backend, kernel, case, tuple(pointers_first), _names=constexprs)))
    if len(required) < len(names) and all(case.args[p.name] == p.default for p in spec.params if p.default is not REQUIRED):
        forms.append(("defaults-omitted", "trailing defaults omitted", lambda: _launch(backend, kernel, case, _names=required)))
    # Triton owns its options; a backend that declares it takes none (vLLM's KernelOverride raises on
    # them) is not asked to.
    if not backend.gridless and not backend.name.startswith("triton") and backend.launch_options:
        options = dict(sorted(LAUNCH_OPTIONS.items()))
        forms.append(("launch-options", "every Triton launch option (accepted and ignored)",
                      lambda: _launch(backend, kernel, case, _names=names, **options)))
    reference = None
    for check, label, launch in forms:
        try:
            outs = _outputs(spec, launch())
        except Exception as e:  # a launch form the kernel rejects
            yield f"launch/{check}", False, f"{label}: {type(e).__name__}: {e}"
            continue
        if reference is None:
            reference = outs
        same = len(outs) == len(reference) and all(torch.equal(a, b) for a, b in zip(outs, reference))
        yield f"launch/{check}", same, "" if same else f"{label}: outputs differ from the keyword launch"


def _unknown_keyword(spec: KernelSpec, backend: Any, kernel: Any, case: Case) -> tuple[bool, str]:
    others = sorted({p.name for s in contracts.SPECS.values() for p in s.params if p.kind is Kind.CONSTEXPR} - set(spec.arg_names))
    problems = []
    for key in [UNKNOWN, *others[:1]]:
        try:
            _launch(backend, kernel, case, _names=list(spec.arg_names), **{key: False})
        except TypeError as e:
            if f"'{key}'" not in str(e):
                problems.append(f"{key}: TypeError does not name it: {e}")
        except Exception as e:
            problems.append(f"{key}: {type(e).__name__} instead of TypeError: {e}")
        else:
            problems.append(f"{key}: accepted; an unknown keyword must be a TypeError naming it (§1.9)")
    return not problems, "; ".join(problems)


def _cpp_entry(spec: KernelSpec, kernel: Any) -> tuple[bool, str]:
    from cpu_impl import _C
    from cpu_impl.launcher import GRID, buf, cpp_entry_name

    family, entry = cpp_entry_name(spec)
    module = getattr(_C, family, None)
    real = getattr(module, entry, None) if module is not None else None
    if real is None:
        return False, f"no C++ entry point cpu_impl._C.{family}.{entry}"
    arity = cpp_arity(real)
    n = len(spec.params) + len(GRID) * (spec.check_grid is not None)  # then the grid's axes follow
    if arity is not None and arity != n:
        return False, f"cpu_impl._C.{family}.{entry} takes {arity} arguments, the contract has {n} parameters"

    calls: list[tuple[Any, ...]] = []

    def launched(c: Case) -> bool:
        calls.clear()
        setattr(module, entry, lambda *a: calls.append(a))
        try:
            kernel(**copy_args(c.args, "cpu"))
        except Exception:
            return False
        finally:
            setattr(module, entry, real)
        return bool(calls)

    try:
        case = example_case(spec.name, launched)
    except Exception as e:
        return False, f"the launcher never called cpu_impl._C.{family}.{entry} on a valid case ({type(e).__name__})"
    launched(case)
    args = calls[-1]
    if len(args) != n:
        return False, f"the launcher passes {len(args)} arguments to cpu_impl._C.{family}.{entry}, the contract has {n}"
    copies = copy_args(case.args, "cpu")
    launched_again = []
    setattr(module, entry, lambda *a: launched_again.append(a))
    try:
        kernel(**copies)
    finally:
        setattr(module, entry, real)
    args = launched_again[-1]
    for p, got in zip(spec.params, args):
        v = copies[p.name]
        if p.table:
            ok = isinstance(got, tuple) and [tuple(g[:3]) for g in got] == [buf(t) for t in v]
        elif p.kind is Kind.PTR:
            want = buf(v)
            ok = (got is None) if want is None else (isinstance(got, tuple) and tuple(got[:3]) == want[:3])
        else:
            ok = not isinstance(got, tuple) and got == v
        if not ok:
            return False, f"argument {spec.arg_names.index(p.name)} of cpu_impl._C.{family}.{entry} is not '{p.name}' (got {got!r})"
    return True, ""


# -- vLLM's own kernels -------------------------------------------------------------------------
def vllm_unavailable() -> str | None:
    """Why vLLM's own kernels cannot be read here (the engine backend ``vllm``), or None."""
    return BACKENDS["vllm"].unavailable()


def check_op(spec: KernelSpec) -> Check:
    """A C++ op's schema in vLLM's ``torch_bindings.cpp``: its arguments are the contract's inputs."""
    import re

    from conformance import engine

    src = engine.located()
    if src.csrc is None:
        return Check(spec.name, "vllm", "names", None, f"{src.label} has no csrc/ to read torch.ops._C.{spec.op}'s schema from")
    bindings = (src.csrc / "cpu" / "torch_bindings.cpp").read_text()
    m = re.search(rf'"{re.escape(spec.op)}\(([^)]*)\)', bindings)
    if m is None:
        other = src.release is not None and src.release != engine.REFERENCE_RELEASE
        return Check(spec.name, "vllm", "names", None if other else False, f"torch.ops._C.{spec.op} not in vLLM {src.release or ''}".rstrip())
    names = [a.split()[-1] for a in m.group(1).split(",") if a.strip()]
    want = [p.name for p in spec.params if not p.is_output]
    return Check(spec.name, "vllm", "names", names == want, "" if names == want else _diff_names(want, names))


def check_vllm(spec: KernelSpec) -> list[Check]:
    from conformance.backend import engine_of

    if engine_of(spec) != "vllm":
        return []  # another engine's kernel: vLLM has no form of it
    why = vllm_unavailable()
    if why is not None:
        return [Check(spec.name, "vllm", "names", None, why)]
    if spec.op:
        return [check_op(spec)]
    try:
        # vLLM's own object, even where the engine backend leaves it out of comparison (engine_apart).
        from conformance.engine import loader

        obj = loader().kernel(spec.qualname) if spec.engine_apart else BACKENDS["vllm"].resolve(spec)
    except Exception as e:
        return [Check(spec.name, "vllm", "names", False, f"{spec.qualname} could not be loaded from vLLM: {type(e).__name__}: {e}")]
    from conformance import engine

    if obj is None:
        release = engine.located().release
        other = release is not None and release != engine.REFERENCE_RELEASE
        return [Check(spec.name, "vllm", "names", None if other else False, f"{spec.qualname} not found in vLLM {release or ''}".rstrip())]
    if isinstance(obj, engine.Drifted):
        return [Check(spec.name, "vllm", "names", None if obj.declared else False, obj.message)]
    names = names_of(obj)
    out = [Check(spec.name, "vllm", "names", names == list(spec.arg_names), "" if names == list(spec.arg_names) else _diff_names(list(spec.arg_names), names or []))]
    ce = constexprs_of(obj)
    if ce is not None:
        out.append(Check(spec.name, "vllm", "constexprs", ce == list(spec.constexprs), "" if ce == list(spec.constexprs) else f"vLLM constexprs {ce}, contract {list(spec.constexprs)}"))
    return out


# -- all of it ---------------------------------------------------------------------------------
def check_all(names: Iterable[str] | None = None, backends: Iterable[str] | None = None, vllm: bool = False) -> list[Check]:
    results: list[Check] = []
    for kernel in names or contracts.SPECS:
        spec = contracts.get(kernel)
        results.extend(check_contract(spec))
        case = None
        # The engine's own kernels are checked against the contract's names by --vllm, not held to
        # specdiff's launch forms (their launch behaviour is what conformance reports on).
        for b in backends or [b for b, be in BACKENDS.items() if not be.engine]:
            if b not in BACKENDS or not BACKENDS[b].applies(spec):
                continue
            if case is None and BACKENDS[b].unavailable() is None and BACKENDS[b].resolve(spec) is not None:
                case = example_case(kernel)
            results.extend(check_backend(spec, b, case))
        if vllm:
            results.extend(check_vllm(spec))
    return results


def report(results: list[Check]) -> str:
    """One line per kernel and backend: the checks that passed, then each failure in full."""
    by: dict[tuple[str, str], list[Check]] = {}
    for r in results:
        by.setdefault((r.kernel, r.backend), []).append(r)
    width = max((len(k) for k, _ in by), default=10) + 2
    lines = []
    for (kernel, backend), rs in by.items():
        bad = [r for r in rs if r.ok is False]
        skipped = [r for r in rs if r.ok is None]
        status = "FAIL" if bad else "skip" if skipped and len(skipped) == len(rs) else "ok"
        passed = ", ".join(r.check for r in rs if r.ok)
        lines.append(f"{kernel:<{width}}{backend:<14}{status:<6}{passed}")
        lines.extend(f"{'':<{width}}{'':<14}      {r.check}: {r.message}" for r in bad)
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    p = sub.add_parser("signatures", help="check every backend's launch signature against its contract")
    p.add_argument("--kernel", action="append", type=kernel_name, help="only this kernel (repeatable)")
    p.add_argument("--backend", action="append", type=backend_name, help="only this backend (repeatable)")
    p.add_argument("--vllm", nargs="?", const="", metavar="VERSION|PATH",
                   help="also check the contracts against vLLM's own kernels, read from this release or path "
                        "(default: SPECDIFF_VLLM; skipped, with the reason, when none is named)")
    p.add_argument("--junit", type=output_file, help="write a JUnit XML report here")
    p.set_defaults(func=cmd)


def cmd(ns: Any) -> int:
    if ns.vllm:
        from conformance import engine

        engine.use(ns.vllm)
    results = check_all(ns.kernel, ns.backend, ns.vllm is not None)
    print(report(results))
    failed = [r for r in results if r.ok is False]
    skipped = [r for r in results if r.ok is None]
    if ns.junit:
        from conformance import junit

        junit.write(ns.junit, "signatures", [junit.TestCase(f"{r.kernel}.{r.backend}", r.check, failure=r.message if r.ok is False else None,
                                                            skipped=r.message if r.ok is None else None) for r in results])
    for r in {r.message: r for r in skipped}.values():
        print(f"skipped: {r.backend}: {r.message}")
    print(f"\nsignatures: {len(results) - len(failed) - len(skipped)} ok, {len(failed)} failed, {len(skipped)} skipped")
    return 1 if failed else 0
