"""Feeds one case to every backend with poisoned outputs and compares what they wrote.

For each backend the runner copies the case (keeping aliased parameters aliased), fills
every output buffer with a poison no kernel can legitimately write (§1.13), launches, checks
that no input changed, and keeps the outputs. Outputs compare exactly, as bit patterns.
On disagreement it names the kernel, the backend that differs from the others, the first
divergent cell with the inputs that decided it, and a command that replays the saved case.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shlex
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from safetensors import safe_open

import contracts
from conformance import departures
from conformance.backends import BACKENDS, ORACLE, Backend
from contracts.spec import KernelSpec, Kind, Role

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
    # How a saved case was run: {"backends": [...], "vllm": "0.33.0"} (see save_case).
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def spec(self) -> KernelSpec:
        return contracts.get(self.kernel)

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
    args = _copy_args(case.args, backend.device())
    for p in spec.params:
        v = args[p.name]
        if p.role in (Role.OUT, Role.SCRATCH) and isinstance(v, torch.Tensor) and not _aliases_input(spec, args, p.name):
            v.fill_(poison_value(v.dtype, variant))
    before = {
        p.name: args[p.name].clone()
        for p in spec.params
        if p.kind is Kind.PTR and p.role is Role.IN and isinstance(args[p.name], torch.Tensor)
        and not any(args[o.name] is args[p.name] for o in spec.outputs)
    }
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
    for name, old in before.items():
        if not torch.equal(_bits(old), _bits(args[name])):
            return Outcome(error=f"modified its input '{name}' (inputs must stay unchanged, C27)")
    # args are this launch's own copies: keeping their outputs needs no further copy (.cpu() copies from a GPU).
    return Outcome(outputs={p.name: args[p.name].cpu() for p in spec.outputs if isinstance(args[p.name], torch.Tensor)})


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


def _key(o: Outcome) -> Any:
    if o.error is not None:
        return ("error", o.error.splitlines()[0])
    return tuple((k, v.dtype, tuple(v.shape), tuple(_bits(v).reshape(-1).tolist())) for k, v in sorted(o.outputs.items()))


def _diffs(case: Case, backend: str, got: Outcome, good: Outcome | None, variant: int) -> list[Diff]:
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
        want, have = _bits(good.outputs[name]).reshape(-1), _bits(got.outputs[name]).reshape(-1)
        if want.shape != have.shape or torch.equal(want, have):
            continue
        i = int((want != have).nonzero()[0])
        poison = _bits(torch.tensor([poison_value(good.outputs[name].dtype, variant)], dtype=good.outputs[name].dtype))[0]
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
    keys = {b: _key(o) for b, o in outcomes.items()}
    if len(set(keys.values())) <= 1:
        return
    # The majority is right; without one, the oracle is.
    tally = Counter(keys.values())
    (top, count), *rest = tally.most_common()
    reference = top if count > 1 and (not rest or rest[0][1] < count) else keys.get(ORACLE, top)
    odd = [b for b, k in keys.items() if k != reference]
    agree = [b for b, k in keys.items() if k == reference]
    good = outcomes[agree[0]] if agree else None
    diffs = [d for b in odd for d in _diffs(case, b, outcomes[b], good, variant)]
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
            want, got = _bits(good.outputs[name]).reshape(-1), _bits(o.outputs[name]).reshape(-1)
            if want.shape != got.shape or torch.equal(want, got):
                continue
            i = int((want != got).nonzero()[0])
            values = "  ".join(f"{k}={outcomes[k].outputs[name].reshape(-1)[i].item()!r}" for k in outcomes if not outcomes[k].error)
            poison = poison_value(good.outputs[name].dtype, variant)
            lines.append(f"  output '{name}' first differs at flat element {i}: {values}  (poison {poison!r})")
            if spec.explain is not None:
                try:
                    why = _explainer(spec)(case.args, name, i)
                except Exception as e:  # never let the explanation hide the failure
                    why = f"(could not explain: {e})"
                lines.extend("  " + line for line in why.splitlines())
            break
    return "\n".join(lines)


def _explainer(spec: KernelSpec) -> Any:
    """The contract's explanation of an output cell: its function, or the oracle function it names."""
    if not isinstance(spec.explain, str):
        return spec.explain
    module, _, name = spec.explain.partition(":")
    return getattr(importlib.import_module(module), name)


def _refused(error: str | None) -> bool:
    return error is not None and error.split(":", 1)[0] in ("TypeError", "ValueError")


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
        spec.check(case.args)
    except (TypeError, ValueError) as e:
        outcomes = {b: run_backend(BACKENDS[b], case) for b in backends if BACKENDS[b].validates}
        bad = [Diff(b, "-", "accepted invalid input", detail=str(e)) for b, o in outcomes.items() if not _refused(o.error)]
        if bad:
            raise Disagreement(
                f"{spec.name}: the contract refuses this case ({e}) but " + ", ".join(f"'{_mode(d.backend)}'" for d in bad)
                + " did not raise TypeError/ValueError", [d.backend for d in bad], tuple(bad)) from None
        return outcomes
    first: dict[str, Outcome] = {}
    for variant in range(_variants(spec, case.args)):
        outcomes = {b: run_backend(BACKENDS[b], case, variant) for b in backends}
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


# -- saving and replaying failing cases -------------------------------------------------------
# A saved case is a .safetensors file: tensor bytes and JSON, nothing a loader executes (torch.save
# is a pickle, and weights_only is a restricted unpickler still). Each distinct storage among the
# tensor arguments is one 1-D uint8 tensor of its bytes ("s0", "s1", ...) and each tensor argument
# a view of one (dtype, byte offset, sizes, strides, negative and conjugate bits, requires_grad), so that aliased
# arguments and strided views come back exactly. The metadata holds one key, "specdiff": the JSON
# document {"format", "version", "kernel", "grid", "positional", "note", "meta", "args"}. An argument
# is {"tensor": view}, {"int": n}, {"float": float.hex()}, {"bool": b}, {"none": null} or {"str": s};
# the fuzz's malformed launches add {"complex": [hex, hex]}, {"list": [arguments]}, {"ndarray": view}
# and meta tensors (a view whose storage is null).
CASE_FORMAT = "specdiff-case"
CASE_VERSION = 1
# The dtypes a saved tensor may have (complex64: the fuzz's wrong-dtype cases); a name outside these is refused.
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "complex64")
}
_DTYPE_NAMES = {d: n for n, d in DTYPES.items()}
# An int argument fits in 128 bits (the fuzz's huge scalars reach 2**80; a longer number is a garbled
# file, not a launch); sizes, strides and offsets are non-negative int64.
_INTS = (-(1 << 128), 1 << 128)
_EXTENT = 1 << 63
_MAX_DEPTH = 8  # nesting of list arguments (the fuzz passes a tensor as nested lists)
_TENSOR_KEYS = ("storage", "dtype", "byte_offset", "size", "stride", "neg", "conj", "requires_grad")


def save_case(case: Case, path: Path | None = None, meta: dict[str, Any] | None = None) -> Path:
    """Saves ``case`` as a .safetensors file (tensors, ints, floats, strings; see above). ``meta`` records
    how to reproduce it: the backends that ran it and the vLLM the engine backends were loaded from."""
    path = Path(path or FAILURES_DIR / f"{case.kernel}.safetensors")
    meta = dict(meta or {})
    if "vllm" not in meta and os.environ.get("SPECDIFF_VLLM"):
        meta["vllm"] = os.environ["SPECDIFF_VLLM"]
    blobs: dict[str, torch.Tensor] = {}
    keys: dict[tuple[str, int, int], str] = {}  # (device, data pointer, bytes) of a storage -> its key

    def view(t: torch.Tensor, name: str) -> dict[str, Any]:
        if type(t) is not torch.Tensor or t.layout != torch.strided:
            raise ValueError(f"argument {name!r}: cannot save a {type(t).__name__} ({t.layout}): only plain strided tensors")
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"argument {name!r}: cannot save a {t.dtype} tensor (savable: {', '.join(DTYPES)})")
        key = None
        if t.device.type != "meta":  # a meta tensor has no bytes: its storage is null
            s = t.untyped_storage()
            # With its size: an empty storage may sit at the address of a live one and share nothing.
            where = (str(t.device), s.data_ptr(), s.nbytes())
            key = keys.get(where)
            if key is None:
                key = keys[where] = f"s{len(blobs)}"
                blobs[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(s).cpu().clone()
        return {"storage": key, "dtype": _DTYPE_NAMES[t.dtype], "byte_offset": t.storage_offset() * t.element_size(),
                "size": list(t.shape), "stride": list(t.stride()), "neg": t.is_neg(), "conj": t.is_conj(),
                "requires_grad": t.requires_grad}

    def encode(v: Any, name: str) -> dict[str, Any]:
        if v is None:
            return {"none": None}
        if isinstance(v, bool):
            return {"bool": v}
        if isinstance(v, int):
            if not _INTS[0] <= v < _INTS[1]:
                raise ValueError(f"argument {name!r}: {v} does not fit in 128 bits")
            return {"int": v}
        if isinstance(v, float):
            return {"float": v.hex()}  # exact, NaN and infinities included
        if isinstance(v, complex):
            return {"complex": [v.real.hex(), v.imag.hex()]}
        if isinstance(v, str):
            return {"str": v}
        if isinstance(v, list):
            return {"list": [encode(x, name) for x in v]}
        if isinstance(v, torch.Tensor):
            return {"tensor": view(v, name)}
        if isinstance(v, np.ndarray):
            return {"ndarray": view(torch.from_numpy(v), name)}
        raise ValueError(f"argument {name!r}: cannot save a {type(v).__name__}")

    doc = {"format": CASE_FORMAT, "version": CASE_VERSION, "kernel": case.kernel,
           "grid": list(case.grid) if case.grid is not None else None, "positional": case.positional, "note": case.note,
           "meta": meta, "args": {k: encode(v, k) for k, v in case.args.items()}}
    data = safetensors.torch.save(blobs, metadata={"specdiff": json.dumps(doc)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # a crash mid-write (the fuzz's in-flight case) never leaves half a file
    return path


def save_in_flight(case: Case, path: Path) -> None:
    """Saves the case about to run, for a crash to leave behind; one no file can hold (a fake or sparse
    tensor) leaves no file, rather than a stale one."""
    try:
        save_case(case, path)
    except ValueError:
        path.unlink(missing_ok=True)


def load_case(path: str | os.PathLike[str]) -> Case:
    """A saved case. The file is untrusted: it is data (safetensors and JSON, never code), every field is
    checked, and anything that is not a case is a ValueError naming the file and what is wrong. An unknown
    kernel name is a KeyError listing the known ones."""
    name = f"replay file {str(path)!r}"
    try:
        with safe_open(str(path), framework="pt") as f:
            header = (f.metadata() or {}).get("specdiff")
            blobs = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise ValueError(f"{name} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{name} is a directory") from None
    except Exception as e:  # safetensors' own errors: truncated, garbled, not safetensors at all
        raise ValueError(f"{name} is not a saved case: {_pickled(path) or str(e).splitlines()[0]}") from None
    if header is None:
        raise ValueError(f"{name} is in an unsupported format: a safetensors file without specdiff's metadata (no version field)")
    try:
        doc = json.loads(header)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{name}: its 'specdiff' metadata is not JSON ({e})") from None
    try:
        return _case_from(doc, blobs)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _pickled(path: str | os.PathLike[str]) -> str | None:
    """Why a file is refused when it is the old format: torch.save's zip archive or a bare pickle."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return ("a torch.save/pickle file (the old .pt format, which can run code when loaded) is not read: "
                "the format is unsupported (no version field); save the case again as .safetensors")
    return None


def _case_from(doc: Any, blobs: dict[str, torch.Tensor]) -> Case:
    """The case a saved document describes; ValueError naming the field that is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != CASE_FORMAT:
        raise ValueError(f"unsupported format: 'format' must be {CASE_FORMAT!r}")
    if "version" not in doc:
        raise ValueError("unsupported format: no version field")
    if type(doc["version"]) is not int or doc["version"] != CASE_VERSION:
        raise ValueError(f"unsupported version {doc['version']!r} (this specdiff reads version {CASE_VERSION})")
    for key, kind in (("kernel", str), ("positional", bool), ("note", str), ("meta", dict), ("args", dict)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"{key!r} must be a {kind.__name__}")
    contracts.get(doc["kernel"])  # an unknown kernel is a KeyError listing the known ones
    grid = doc.get("grid")
    if grid is not None and not (isinstance(grid, list) and 1 <= len(grid) <= 3 and all(_is_int(g, 0, _EXTENT) for g in grid)):
        raise ValueError("'grid' must be null or a list of one to three non-negative ints")
    for key, blob in blobs.items():
        if blob.dtype != torch.uint8 or blob.dim() != 1:
            raise ValueError(f"storage {key!r} must be a 1-D uint8 tensor, not {blob.dtype} of shape {list(blob.shape)}")
    views: dict[str, torch.Tensor] = {}  # arguments that view the same bytes the same way are one tensor, as saved
    args = {name: _value(v, blobs, views, f"argument {name!r}", 0) for name, v in doc["args"].items()}
    return Case(doc["kernel"], args, tuple(grid) if grid is not None else None, doc["positional"], doc["note"], doc["meta"])


def _is_int(v: Any, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v < hi


def _value(v: Any, blobs: dict[str, torch.Tensor], views: dict[str, torch.Tensor], where: str, depth: int) -> Any:
    if not isinstance(v, dict) or len(v) != 1:
        raise ValueError(f"{where} must be an object with one key (none, bool, int, float, complex, str, list, tensor, ndarray)")
    ((kind, x),) = v.items()
    if kind == "none" and x is None:
        return None
    if kind == "bool" and isinstance(x, bool):
        return x
    if kind == "int":
        if not _is_int(x, *_INTS):
            raise ValueError(f"{where}: {x!r:.40} is not an int of at most 128 bits")
        return x
    if kind == "float" and isinstance(x, str):
        return _float(x, where)
    if kind == "complex" and isinstance(x, list) and len(x) == 2 and all(isinstance(p, str) for p in x):
        return complex(_float(x[0], where), _float(x[1], where))
    if kind == "str" and isinstance(x, str):
        return x
    if kind == "list" and isinstance(x, list):
        if depth >= _MAX_DEPTH:
            raise ValueError(f"{where}: lists nested deeper than {_MAX_DEPTH}")
        return [_value(e, blobs, views, where, depth + 1) for e in x]
    if kind in ("tensor", "ndarray"):
        key = f"{kind}:{json.dumps(x, sort_keys=True)}"
        if key not in views:
            t = _view(x, blobs, where)
            if kind == "ndarray":
                if t.device.type == "meta" or t.dtype == torch.bfloat16 or t.is_neg() or t.is_conj():
                    raise ValueError(f"{where}: an ndarray cannot be {t.dtype}, on meta, or a negative or conjugate view")
                views[key] = t.numpy()
            else:
                views[key] = t
        return views[key]
    raise ValueError(f"{where}: {kind!r} with value {x!r:.60} is not a saved value")


def _float(x: str, where: str) -> float:
    try:
        return float.fromhex(x)
    except (ValueError, OverflowError):
        raise ValueError(f"{where}: {x!r:.40} is not a float in hex notation") from None


def _view(entry: Any, blobs: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    """The tensor ``entry`` describes, after checking that it lies inside its storage's bytes (never
    letting torch grow a storage to fit a view, which ``Tensor.set_`` would)."""
    if not isinstance(entry, dict) or sorted(entry) != sorted(_TENSOR_KEYS):
        raise ValueError(f"{where}: a tensor must have exactly the keys {', '.join(_TENSOR_KEYS)}")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"{where}: dtype {entry['dtype']!r:.40} is not one of {', '.join(DTYPES)}")
    size, stride, offset = entry["size"], entry["stride"], entry["byte_offset"]
    if not (isinstance(size, list) and isinstance(stride, list) and len(size) == len(stride) <= 16
            and all(_is_int(n, 0, _EXTENT) for n in size + stride)):
        raise ValueError(f"{where}: size and stride must be lists of the same length (at most 16) of non-negative ints")
    itemsize = dtype.itemsize
    if not _is_int(offset, 0, _EXTENT) or offset % itemsize:
        raise ValueError(f"{where}: byte_offset {offset!r:.40} must be a non-negative multiple of {itemsize} ({entry['dtype']})")
    if not all(isinstance(entry[k], bool) for k in ("neg", "conj", "requires_grad")):
        raise ValueError(f"{where}: neg, conj and requires_grad must be booleans")
    if entry["requires_grad"] and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"{where}: only a floating-point tensor can require grad, not {entry['dtype']}")
    numel = math.prod(size)
    # Python ints: no overflow, whatever the file says.
    end = offset if numel == 0 else offset + (sum((n - 1) * s for n, s in zip(size, stride)) + 1) * itemsize
    if numel >= _EXTENT or end >= _EXTENT:
        raise ValueError(f"{where}: a view of {numel} elements reaching byte {end} is beyond int64")
    storage = entry["storage"]
    if storage is None:  # a meta tensor: shape and strides, no bytes
        base = torch.empty(end // itemsize, dtype=dtype, device="meta")
    else:
        blob = blobs.get(storage) if isinstance(storage, str) else None
        if blob is None:
            raise ValueError(f"{where}: storage {storage!r:.40} is not in the file")
        nbytes = blob.numel()
        if end > nbytes:
            raise ValueError(f"{where}: the view reaches byte {end} of storage {storage!r}, which holds {nbytes} bytes")
        base = blob[: nbytes - nbytes % itemsize].view(dtype)  # exactly the whole elements of the storage
    t = torch.as_strided(base, size, stride, offset // itemsize)
    if entry["neg"]:
        t = torch._neg_view(t)
    if entry["conj"]:
        t = torch.conj(t)
    return t.requires_grad_() if entry["requires_grad"] else t


# What a failure prints instead of a replay command when its case could not be saved.
NOT_SAVED = "none: the case could not be saved (see the warning above)"


def save_failure(case: Case, path: Path | None = None, meta: dict[str, Any] | None = None) -> Path | None:
    """``save_case`` for a failing case: a failures directory that cannot be written (or a case that cannot
    be saved) is a warning, so that the failure is still reported as itself; None then."""
    try:
        return save_case(case, path, meta)
    except (OSError, ValueError) as e:
        print(f"warning: could not save the failing {case.kernel} case under {path or FAILURES_DIR}: {e}", file=sys.stderr, flush=True)
        return None


def replay_command(path: Path | None, *tool: str) -> str:
    """The command that re-runs the case saved at ``path`` (with ``tool``, e.g. "threads", "--replay";
    default ``replay``), or :data:`NOT_SAVED`. It reads the same on a laptop as in CI's log: the
    interpreter by name (any environment with specdiff installed), the file relative to the working
    directory when it lies below it."""
    if path is None:
        return NOT_SAVED
    try:
        path = Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:  # outside the working directory: keep it absolute
        pass
    return f"python -m conformance {' '.join(tool or ('replay',))} {shlex.quote(str(path))}"
