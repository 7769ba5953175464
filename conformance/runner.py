"""Feeds one case to every backend with poisoned outputs and compares what they wrote.

For each backend the runner copies the case (keeping aliased parameters aliased), fills
every output buffer with a poison no kernel can legitimately write (§1.13), launches, checks
that no input changed, and keeps the outputs. Outputs compare exactly, as bit patterns.
On disagreement it names the kernel, the backend that differs from the others, the first
divergent cell with the inputs that decided it, and a command that replays the saved case.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conformance import departures
from conformance.backend import Backend
from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.casefile import save_in_flight
from contracts.spec import KernelSpec, Role, Table, tensors

# The interpreter evaluates masked-off lanes too (a division by a zero q that is never used).
warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")


def poison_value(dtype: torch.dtype, variant: int = 0) -> Any:
    """The dtype's minimum + 1 for integers, NaN for floats; True then False for bools."""
    if dtype == torch.bool:
        return variant == 0
    if dtype.is_floating_point:
        return float("nan")
    return torch.iinfo(dtype).min + 1


def bits(t: torch.Tensor) -> torch.Tensor:
    """A view whose equality is bit-pattern equality (NaN == NaN, -0.0 != 0.0)."""
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    if t.dtype == torch.float64:
        return t.view(torch.int64)
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    return t


def _span(v: torch.Tensor) -> int:
    """Elements from ``v``'s first to its last (strides non-negative)."""
    return 0 if v.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride()) if n > 0)


def memory(v: torch.Tensor) -> torch.Tensor:
    """What to snapshot and compare of ``v``: itself, or for a view that overlaps itself (more
    elements than the memory it spans: stride 0) that memory, flat, where its elements would be
    counted in the trillions."""
    if v.device.type == "meta" or any(s < 0 for s in v.stride()) or v.numel() <= _span(v):
        return v
    return torch.as_strided(v, (_span(v),), (1,))


def copy_tensor(v: torch.Tensor, device: str) -> torch.Tensor:
    """A copy of ``v`` on ``device`` with its strides (strided parameters, a row stride bigger than the
    width, are the point). A view that overlaps itself (stride 0: 2**40 rows of one stored row, as a
    file or the fuzz may hold) copies the memory it spans, never its elements one by one; a meta
    tensor, which has no data, stays one."""
    if v.device.type == "meta" or device == "meta":
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    flat = memory(v)
    if flat is v:
        c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
        c.copy_(v)
        return c
    base = torch.empty(flat.numel(), dtype=v.dtype, device=device)
    base.copy_(flat)
    return torch.as_strided(base, v.shape, v.stride())


def copy_args(args: dict[str, Any], device: str) -> dict[str, Any]:
    """Copies every tensor to ``device``; parameters bound to one tensor stay aliased."""
    copies: dict[int, torch.Tensor] = {}

    def copy(v: torch.Tensor) -> torch.Tensor:
        if id(v) not in copies:
            copies[id(v)] = copy_tensor(v, device)
        return copies[id(v)]

    out = {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            out[k] = copy(v)
        elif isinstance(v, Table):
            out[k] = Table(copy(t) if isinstance(t, torch.Tensor) else t for t in v)
        else:
            out[k] = v
    return out


def _aliases_input(spec: KernelSpec, args: dict[str, Any], name: str) -> bool:
    t = args[name]
    return any(p.role is Role.IN and args[p.name] is t for p in spec.params if p.name != name)


def poison_variants(spec: KernelSpec, args: dict[str, Any]) -> int:
    """How many poisons a case runs under: two when a bool output could hold either (True, then False)."""
    boolean = any(
        isinstance(args[p.name], torch.Tensor) and args[p.name].dtype == torch.bool for p in spec.params if p.role is Role.OUT
    )
    return 2 if boolean else 1


_TORCH_DTYPE_ERROR = re.compile(r"expected scalar type (\w+) but found (\w+)")


def _dtype_hint(spec: KernelSpec, args: dict[str, Any], message: str) -> str:
    """Names the arguments behind a dtype error that does not name them (torch's data_ptr<T> check)."""
    m = _TORCH_DTYPE_ERROR.search(message)
    if m is None:
        return ""
    found = m.group(2).lower()
    names = [p.name for p in spec.params if isinstance(args.get(p.name), torch.Tensor)
             and str(args[p.name].dtype).removeprefix("torch.") in ({"int": "int32", "long": "int64"}.get(found, found), found)]
    return f" (arguments of that dtype: {', '.join(names) or 'none'})"


@dataclass
class Outcome:
    """What one backend did with one case (one poison variant)."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None


# The flight recorder (conformance/isolate.py): when set, every case is saved here before its first
# launch, and the name of each backend written beside it (INFLIGHT.backend) before that backend
# runs, so that a supervising process can name the backend and the case that killed this one.
INFLIGHT: Path | None = None
# Seconds each backend spent in its launches (copies, poison and comparisons excluded), per
# backend name, over the process: the runner's per-backend times are differences of it.
LAUNCH_SECONDS: Counter[str] = Counter()
_recorded: list[Case] = []  # the case last saved to INFLIGHT (kept alive: compared by identity)


def _record(case: Case, backend: str) -> None:
    if INFLIGHT is None:
        return
    if not _recorded or _recorded[0] is not case:
        save_in_flight(case, INFLIGHT)  # a case no file can hold still gets its backend named
        _recorded[:] = [case]
    INFLIGHT.with_suffix(".backend").write_text(backend)


def run_backend(backend: Backend, case: Case, variant: int = 0) -> Outcome:
    spec = case.spec
    _record(case, backend.name)
    kernel = backend.resolve(spec)
    args = copy_args(case.args, backend.device())
    every = tensors(spec, args)
    written = {id(t) for _, p, t in every if p.is_output}
    for _, p, t in every:
        if p.role in (Role.OUT, Role.SCRATCH) and not _aliases_input(spec, args, p.name):
            t.fill_(poison_value(t.dtype, variant))
    before = {label: (t, copy_tensor(memory(t), t.device.type)) for label, p, t in every
              if p.role is Role.IN and id(t) not in written}
    started = time.perf_counter()
    try:
        launch = backend.launcher(kernel, case.launch_grid())
        if case.positional:
            launch(*[args[n] for n in spec.arg_names])
        else:
            launch(**args)
        if backend.device() == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # a backend that raises on valid input disagrees with the others
        LAUNCH_SECONDS[backend.name] += time.perf_counter() - started
        first, _, rest = str(e).strip().partition("\n")  # the hint joins the line reports quote
        return Outcome(error=f"{type(e).__name__}: {first}{_dtype_hint(spec, args, first)}\n{rest}\n{traceback.format_exc(limit=-3)}")
    LAUNCH_SECONDS[backend.name] += time.perf_counter() - started
    for name, (t, old) in before.items():
        if not torch.equal(bits(old), bits(memory(t))):
            return Outcome(error=f"modified its input '{name}' (inputs must stay unchanged, C27)")
    # args are this launch's own copies: keeping their outputs needs no further copy (.cpu() copies from a GPU).
    return Outcome(outputs={label: t.cpu() for label, p, t in every if p.role in (Role.OUT, Role.INOUT)})


@dataclass(frozen=True)
class Diff:
    """How one backend departs from the verdict on one case: the first differing cell of one output.

    ``kind`` is "error" (raised on in-contract input), "accepted invalid input", "modified input",
    "unwritten" (a cell the verdict writes still holds the poison), "stray write" (a cell the verdict
    leaves untouched was written) or "value"; ``rule`` is the contract clause deciding the cell
    (``KernelSpec.rule``); ``departure`` the §5 decision that explains it for an engine backend.
    """

    backend: str
    output: str
    kind: str
    rule: str = ""
    index: int = -1
    detail: str = ""
    departure: str | None = None

    @property
    def group(self) -> tuple[str, str, str, str]:
        return (self.backend, self.output, self.kind, self.departure or self.rule)


class Disagreement(AssertionError):
    """Backends wrote different outputs for one case. ``backends`` are the odd ones out."""

    def __init__(self, message: str, backends: list[str], diffs: tuple[Diff, ...] = ()) -> None:
        super().__init__(message)
        self.backends = backends
        self.diffs = diffs


def vote_key(o: Outcome) -> Any:
    """What the vote compares of an outcome: its first error line, or its outputs bit for bit."""
    if o.error is not None:
        return ("error", o.error.splitlines()[0])
    return tuple((k, v.dtype, tuple(v.shape), tuple(bits(v).reshape(-1).tolist())) for k, v in sorted(o.outputs.items()))


def diffs_against(case: Case, backend: str, got: Outcome, good: Outcome | None, variant: int) -> list[Diff]:
    """The first differing cell of each output of ``got`` against the verdict ``good``."""
    spec = case.spec
    if got.error is not None:
        if got.error.startswith("SignatureDrift"):  # an engine release's kernel takes other parameters
            declared = "declared in the contract" in got.error.splitlines()[0]
            return [Diff(backend, "-", "signature", "earlier release" if declared else "", detail=got.error.splitlines()[0])]
        kind = "modified input" if got.error.startswith("modified its input") else "error"
        return [Diff(backend, "-", kind, detail=got.error.splitlines()[0])]
    if good is None or good.error is not None:
        return [Diff(backend, "-", "value", detail="wrote outputs where the verdict raised")]
    out = []
    for name in sorted(good.outputs):
        want, have = bits(good.outputs[name]).reshape(-1), bits(got.outputs[name]).reshape(-1)
        if want.shape != have.shape or torch.equal(want, have):
            continue
        i = int((want != have).nonzero()[0])
        poison = bits(torch.tensor([poison_value(good.outputs[name].dtype, variant)], dtype=good.outputs[name].dtype))[0]
        kind = "unwritten" if have[i] == poison else "stray write" if want[i] == poison else "value"
        rule = ""
        if spec.rule is not None:
            try:
                rule = spec.rule(case.args, name, i, kind)
            except Exception:  # the classifier is the harness's; never hide the disagreement
                rule = ""
        dep = None
        if BACKENDS[backend].engine:
            found = departures.match(spec.name, BACKENDS[backend].mode(), case.args, name, i,
                                     good.outputs[name], got.outputs[name])
            dep = found.id if found is not None else None
        out.append(Diff(backend, name, kind, rule, i, departure=dep))
    return out


def _snap_float64_noise(case: Case, outcomes: dict[str, Outcome]) -> None:
    """C29: where an output's float64 cells carry float64 noise (``Param.float64_rtol``), a backend's
    cell within that tolerance of the oracle's (or the first backend's) takes its bits, so that
    the vote below compares decisions exactly and such values to their stated tolerance."""
    tol = {p.name: p.float64_rtol for p in case.spec.outputs if p.float64_rtol}
    done = [o for o in outcomes.values() if o.error is None]
    if not tol or len(done) < 2:
        return
    ref = outcomes[ORACLE] if ORACLE in outcomes and outcomes[ORACLE].error is None else done[0]
    for o in done:
        for name, rtol in tol.items():
            want, got = ref.outputs.get(name), o.outputs.get(name)
            if o is ref or want is None or got is None or want.dtype != torch.float64 or got.shape != want.shape:
                continue
            close = (want - got).abs() <= rtol * want.abs().clamp_min(1.0)
            o.outputs[name] = torch.where(close, want, got)


def compare(case: Case, outcomes: dict[str, Outcome], variant: int = 0, departed: list[Diff] | None = None) -> None:
    """Raises :class:`Disagreement` unless every backend wrote the same outputs.

    Disagreements explained by a contract departure (engine backends only) do not raise: they are
    appended to ``departed`` when given.
    """
    _snap_float64_noise(case, outcomes)
    keys = {b: vote_key(o) for b, o in outcomes.items()}
    if len(set(keys.values())) <= 1:
        return
    # The majority is right; without one, the oracle is.
    tally = Counter(keys.values())
    (top, count), *rest = tally.most_common()
    reference = top if count > 1 and (not rest or rest[0][1] < count) else keys.get(ORACLE, top)
    odd = [b for b, k in keys.items() if k != reference]
    agree = [b for b, k in keys.items() if k == reference]
    good = outcomes[agree[0]] if agree else None
    diffs = [d for b in odd for d in diffs_against(case, b, outcomes[b], good, variant)]
    failing = [d for d in diffs if d.departure is None]
    if departed is not None:
        departed.extend(d for d in diffs if d.departure is not None)
    if not failing:
        return
    odd = list(dict.fromkeys(d.backend for d in failing))
    raise Disagreement(describe(case, outcomes, odd, agree, variant), odd, tuple(failing))


def _mode(name: str) -> str:
    return f"{name} ({BACKENDS[name].mode()})"


def describe(case: Case, outcomes: dict[str, Outcome], odd: list[str], agree: list[str], variant: int) -> str:
    spec = case.spec
    who = " and ".join(f"'{_mode(b)}'" for b in odd)
    lines = [f"{spec.name}: backend {who} differs from {' and '.join(repr(_mode(b)) for b in agree) or 'the others'}"]
    for b in odd + agree:  # an agreeing oracle that raised is news too (it wins ties)
        if outcomes[b].error:
            lines.append(f"  {b} failed: {outcomes[b].error.strip()}")
    good = outcomes[agree[0]] if agree else None
    for b in odd:
        o = outcomes[b]
        if o.error or good is None or good.error:
            continue
        for name in sorted(good.outputs):
            want, got = bits(good.outputs[name]).reshape(-1), bits(o.outputs[name]).reshape(-1)
            if want.shape != got.shape or torch.equal(want, got):
                continue
            i = int((want != got).nonzero()[0])
            values = "  ".join(f"{k}={outcomes[k].outputs[name].reshape(-1)[i].item()!r}" for k in outcomes if not outcomes[k].error)
            poison = poison_value(good.outputs[name].dtype, variant)
            lines.append(f"  output '{name}' first differs at flat element {i}: {values}  (poison {poison!r})")
            if spec.explain is not None:
                try:
                    why = explainer(spec)(case.args, name, i)
                except Exception as e:  # never let the explanation hide the failure
                    why = f"(could not explain: {e})"
                lines.extend("  " + line for line in why.splitlines())
            break
    return "\n".join(lines)


def explainer(spec: KernelSpec) -> Any:
    """The contract's explanation of an output cell: its function, or the oracle function it names."""
    if not isinstance(spec.explain, str):
        return spec.explain
    module, _, name = spec.explain.partition(":")
    return getattr(importlib.import_module(module), name)


def _refused(error: str | None) -> bool:
    return error is not None and error.split(":", 1)[0] in ("TypeError", "ValueError")


# The oracle's outcomes by case content (``oracle_memo``), of one kernel at a time.
_memo: dict[bytes, Outcome] = {}
_memo_kernel: str | None = None
_memo_on = False


@contextmanager
def oracle_memo(kernel: str) -> Iterator[None]:
    """Within, the oracle runs a case whose content it already ran (``kernel``'s, in this process)
    once: a kernel's tests, one per backend on the same derandomized cases, each need its outcome.
    The oracle is a function of its arguments (seeds are arguments), so the outcome is the same."""
    global _memo_kernel, _memo_on
    if _memo_kernel != kernel:
        _memo.clear()
        _memo_kernel = kernel
    _memo_on = True
    try:
        yield
    finally:
        _memo_on = False


def case_digest(case: Case, variant: int) -> bytes | None:
    """A digest of everything a launch of ``case`` reads: the kernel, the grid, each argument's value
    (a tensor's dtype, geometry, aliasing and the bytes it spans); None for a tensor without data."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{case.spec.name}|{variant}|{case.positional}|{case.launch_grid()}".encode())
    seen: dict[int, int] = {}
    every = {label: t for label, _, t in tensors(case.spec, case.args)}
    for name in case.spec.arg_names:
        v = case.args[name]
        if isinstance(v, Table):
            h.update(f"|{name}=table of {len(v)}".encode())
        elif isinstance(v, torch.Tensor):
            every.setdefault(name, v)  # a tensor where a scalar belongs: refused, still told apart
        else:
            h.update(f"|{name}={v!r}".encode())
    for name, v in every.items():
        if v.device.type == "meta":
            return None
        alias = seen.setdefault(id(v), len(seen))
        h.update(f"|{name}@{alias}:{v.dtype}:{tuple(v.shape)}:{v.stride()}:{v.storage_offset()}|".encode())
        # Copied into a fresh flat tensor: a strided column of 0 or 1 elements counts as contiguous, yet
        # keeps the stride that a byte view refuses.
        data = memory(v).reshape(-1)
        h.update(torch.empty(data.shape, dtype=data.dtype).copy_(data).view(torch.uint8).numpy().tobytes())
    return h.digest()


def _run(backend: str, case: Case, variant: int) -> Outcome:
    """``run_backend``, through the oracle's memo where one is on."""
    key = case_digest(case, variant) if backend == ORACLE and _memo_on and _memo_kernel == case.spec.name else None
    if key is not None and key in _memo:
        o = _memo[key]
        return Outcome(outputs=dict(o.outputs), error=o.error)
    o = run_backend(BACKENDS[backend], case, variant)
    if key is not None:
        _memo[key] = Outcome(outputs=dict(o.outputs), error=o.error)
    return o


def run_case(case: Case, backends: list[str], notes: list[Diff] | None = None) -> dict[str, Outcome]:
    """Runs ``case`` on every named backend (and every poison variant) and compares; returns
    what each backend wrote under the first poison variant (coverage classifies it).

    The contract judges first: a case outside its domain must be refused with TypeError or
    ValueError by every backend that validates, and is not voted on. A backend that refuses a case
    outside its declared capabilities is left out of the vote; ``notes`` (when given) collects those
    refusals (kind "unsupported", rule the capability) and the departures.
    """
    spec = case.spec
    try:
        spec.check(case.args, grid=case.launch_grid())
    except (TypeError, ValueError) as e:
        outcomes = {b: _run(b, case, 0) for b in backends if BACKENDS[b].validates}
        bad = [Diff(b, "-", "accepted invalid input", detail=str(e)) for b, o in outcomes.items() if not _refused(o.error)]
        if bad:
            raise Disagreement(
                f"{spec.name}: the contract refuses this case ({e}) but " + ", ".join(f"'{_mode(d.backend)}'" for d in bad)
                + " did not raise TypeError/ValueError", [d.backend for d in bad], tuple(bad)) from None
        return outcomes
    first: dict[str, Outcome] = {}
    for variant in range(poison_variants(spec, case.args)):
        outcomes = {b: _run(b, case, variant) for b in backends}
        voting = dict(outcomes)
        for b, o in outcomes.items():
            why = BACKENDS[b].unsupported(spec, case.args) if o.error is not None else None
            if why is not None:
                del voting[b]
                if notes is not None and variant == 0:
                    notes.append(Diff(b, "-", "unsupported", why, detail=o.error.splitlines()[0]))
        compare(case, voting, variant, notes if variant == 0 else None)
        first = first or outcomes
    return first
