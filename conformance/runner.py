"""Feeds one case to every backend with poisoned outputs and compares what they wrote.

For each backend the runner copies the case (keeping aliased parameters aliased), fills
every output buffer with a poison no kernel can legitimately write (§1.13), launches, checks
that no input changed, and keeps the outputs. Outputs compare exactly, as bit patterns.
On disagreement it names the kernel, the backend that differs from the others, the first
divergent cell with the inputs that decided it, and a command that replays the saved case.
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from conformance import kernels
from conformance.backends import BACKENDS, ORACLE, Backend
from conformance.contract import KernelSpec, Kind, Role

# The interpreter evaluates masked-off lanes too (a division by a zero q that is never used).
warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

FAILURES_DIR = Path(os.environ.get("SPECDIFF_FAILURES", "reports/failures"))


@dataclass
class Case:
    """One launch of one kernel: arguments by parameter name (CPU tensors), and the grid.

    Parameters that alias each other are the same tensor object in ``args``. ``grid`` is
    the canonical grid when None. ``positional`` launches with positional arguments instead
    of the keywords vLLM's dispatchers use.
    """

    kernel: str
    args: dict[str, Any]
    grid: tuple[int, ...] | None = None
    positional: bool = False
    note: str = ""

    @property
    def spec(self) -> KernelSpec:
        return kernels.get(self.kernel)

    def launch_grid(self) -> tuple[int, ...]:
        return self.grid if self.grid is not None else tuple(self.spec.grid(self.args))


def poison_value(dtype: torch.dtype, variant: int = 0) -> Any:
    """The dtype's minimum + 1 for integers, NaN for floats; True then False for bools."""
    if dtype == torch.bool:
        return variant == 0
    if dtype.is_floating_point:
        return float("nan")
    return torch.iinfo(dtype).min + 1


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view whose equality is bit-pattern equality (NaN == NaN, -0.0 != 0.0)."""
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    if t.dtype == torch.float64:
        return t.view(torch.int64)
    return t


def _copy_args(args: dict[str, Any], device: str) -> dict[str, Any]:
    """Copies every tensor to ``device``; parameters bound to one tensor stay aliased."""
    copies: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in args.items():
        if isinstance(v, torch.Tensor):
            if id(v) not in copies:
                # Keep strides: strided parameters (a row stride bigger than the width) are the point.
                c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
                c.copy_(v)
                copies[id(v)] = c
            out[k] = copies[id(v)]
        else:
            out[k] = v
    return out


def _aliases_input(spec: KernelSpec, args: dict[str, Any], name: str) -> bool:
    t = args[name]
    return any(p.role is Role.IN and args[p.name] is t for p in spec.params if p.name != name)


def _variants(spec: KernelSpec, args: dict[str, Any]) -> int:
    boolean = any(
        isinstance(args[p.name], torch.Tensor) and args[p.name].dtype == torch.bool for p in spec.params if p.role is Role.OUT
    )
    return 2 if boolean else 1


@dataclass
class Outcome:
    """What one backend did with one case (one poison variant)."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    error: str | None = None


def run_backend(backend: Backend, case: Case, variant: int = 0) -> Outcome:
    spec = case.spec
    kernel = backend.resolve(spec)
    args = _copy_args(case.args, backend.device())
    for p in spec.params:
        v = args[p.name]
        if p.role is Role.OUT and isinstance(v, torch.Tensor) and not _aliases_input(spec, args, p.name):
            v.fill_(poison_value(v.dtype, variant))
    before = {
        p.name: args[p.name].clone()
        for p in spec.params
        if p.kind is Kind.PTR and p.role is Role.IN and isinstance(args[p.name], torch.Tensor)
        and not any(args[o.name] is args[p.name] for o in spec.outputs)
    }
    try:
        launch = backend.launcher(kernel, case.launch_grid())
        if case.positional:
            launch(*[args[n] for n in spec.arg_names])
        else:
            launch(**args)
        if backend.device() == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # a backend that raises on valid input disagrees with the others
        return Outcome(error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    for name, old in before.items():
        if not torch.equal(_bits(old), _bits(args[name])):
            return Outcome(error=f"modified its input '{name}' (inputs must stay unchanged, C27)")
    # args are this launch's own copies: keeping their outputs needs no further copy (.cpu() copies from a GPU).
    return Outcome(outputs={p.name: args[p.name].cpu() for p in spec.outputs if isinstance(args[p.name], torch.Tensor)})


class Disagreement(AssertionError):
    """Backends wrote different outputs for one case. ``backends`` are the odd ones out."""

    def __init__(self, message: str, backends: list[str]) -> None:
        super().__init__(message)
        self.backends = backends


def _key(o: Outcome) -> Any:
    if o.error is not None:
        return ("error", o.error.splitlines()[0])
    return tuple((k, v.dtype, tuple(v.shape), tuple(_bits(v).reshape(-1).tolist())) for k, v in sorted(o.outputs.items()))


def compare(case: Case, outcomes: dict[str, Outcome], variant: int = 0) -> None:
    """Raises :class:`Disagreement` unless every backend wrote the same outputs."""
    keys = {b: _key(o) for b, o in outcomes.items()}
    if len(set(keys.values())) <= 1:
        return
    # The majority is right; without one, the oracle is.
    tally = Counter(keys.values())
    (top, count), *rest = tally.most_common()
    reference = top if count > 1 and (not rest or rest[0][1] < count) else keys.get(ORACLE, top)
    odd = [b for b, k in keys.items() if k != reference]
    agree = [b for b, k in keys.items() if k == reference]
    raise Disagreement(describe(case, outcomes, odd, agree, variant), odd)


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
            want, got = _bits(good.outputs[name]).reshape(-1), _bits(o.outputs[name]).reshape(-1)
            if want.shape != got.shape or torch.equal(want, got):
                continue
            i = int((want != got).nonzero()[0])
            values = "  ".join(f"{k}={outcomes[k].outputs[name].reshape(-1)[i].item()!r}" for k in outcomes if not outcomes[k].error)
            poison = poison_value(good.outputs[name].dtype, variant)
            lines.append(f"  output '{name}' first differs at flat element {i}: {values}  (poison {poison!r})")
            if spec.explain is not None:
                try:
                    why = spec.explain(case.args, name, i)
                except Exception as e:  # never let the explanation hide the failure
                    why = f"(could not explain: {e})"
                lines.extend("  " + line for line in why.splitlines())
            break
    return "\n".join(lines)


def run_case(case: Case, backends: list[str]) -> dict[str, Outcome]:
    """Runs ``case`` on every named backend (and every poison variant) and compares; returns
    what each backend wrote under the first poison variant (coverage classifies it)."""
    first: dict[str, Outcome] = {}
    for variant in range(_variants(case.spec, case.args)):
        outcomes = {b: run_backend(BACKENDS[b], case, variant) for b in backends}
        compare(case, outcomes, variant)
        first = first or outcomes
    return first


# -- saving and replaying failing cases -------------------------------------------------------
def save_case(case: Case, path: Path | None = None) -> Path:
    path = path or FAILURES_DIR / f"{case.kernel}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"kernel": case.kernel, "args": case.args, "grid": case.grid, "positional": case.positional, "note": case.note}, path)
    return path


def load_case(path: str | os.PathLike[str]) -> Case:
    data = torch.load(path, weights_only=False)
    return Case(data["kernel"], data["args"], data["grid"], data.get("positional", False), data.get("note", ""))


def replay_command(path: Path) -> str:
    return f"{shlex.quote(sys.executable)} -m conformance replay {shlex.quote(str(path))}"
