"""``specdiff show FILE``: a saved case as Python source, ready to paste beside a test.

A case Hypothesis found (``reports/failures/*.safetensors``) lives in the example database until it
is gone; pasted into the test file as an explicit ``@example``, it runs first on every run, on every
machine, for good. ``show`` prints the case as a ``Case(...)`` literal (every tensor with its dtype,
shape, strides and shared storage; every scalar), the ``@example`` line that freezes it above the
kernel's conformance test, and, as a golden, what the oracle writes for it (or the exception it
raises, for a case outside the contract).

    specdiff show reports/failures/expand_kernel.safetensors [--name NAME]

Float values print as the shortest decimal that reads back to the same bits (NaN and infinities
as ``nan`` / ``inf``; a NaN's payload and sign are not kept). The file is read like ``replay``
reads it: data only, never code.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from collections import Counter
from typing import Any

import torch

from conformance.arguments import input_file
from conformance.backends import BACKENDS, ORACLE
from conformance.case import Case
from conformance.casefile import load_case
from conformance.runner import run_backend

WIDTH = 100
# Every value of these is a float32 value, so float32's shortest decimal names it exactly.
NARROW_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _number(x: Any) -> str:
    if isinstance(x, bool):
        return repr(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return repr(x)


def _values(t: torch.Tensor, indent: int = 8) -> str:
    """The tensor's elements as a (nested) Python list literal; a matrix gets a line per row, as a
    formatter would lay it out at ``indent``."""
    if t.dim() == 0:
        return _values(t.reshape(1))[1:-1]
    if t.dim() == 1:
        if t.dtype in NARROW_FLOATS:  # the shortest float32 decimal: it reads back to the same value
            return "[" + ", ".join(str(x) for x in t.float().numpy()) + "]"
        return "[" + ", ".join(_number(x) for x in t.tolist()) + "]"
    inner = " " * (indent + 4)
    return "[\n" + "".join(f"{inner}{_values(row, indent + 4)},\n" for row in t) + " " * indent + "]"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype)  # "torch.int32"


def _refuse(name: str, t: torch.Tensor) -> None:
    why = ("a sparse tensor" if t.layout != torch.strided else "a tensor without data (meta)" if t.device.type == "meta"
           else "a negative view" if t.is_neg() else "a conjugate view" if t.is_conj() else None)
    if why:
        raise ValueError(f"argument {name!r} is {why}, which a literal cannot express: replay the file instead")


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """Which storage ``t`` views; an empty one shares nothing (every empty storage has address 0)."""
    nbytes = t.untyped_storage().nbytes()
    return (t.untyped_storage().data_ptr(), nbytes) if nbytes else (-id(t), 0)


def _tensor(t: torch.Tensor, shared: Counter[tuple[int, int]], storages: dict[tuple[int, int], str], lines: list[str],
            indent: int = 8) -> str:
    """Source for ``t``: a plain literal, or a view of a storage named once (strided, offset, or
    viewed by several arguments, which stay aliased)."""
    key = _storage(t)
    suffix = ".requires_grad_()" if t.requires_grad else ""
    if t.numel() == 0:  # no value to keep: its shape and strides are the case
        return f"torch.empty_strided({tuple(t.shape)}, {tuple(t.stride())}, dtype={_dtype(t)}){suffix}"
    whole = t.is_contiguous() and t.storage_offset() == 0 and key[1] == t.numel() * t.element_size()
    if whole and shared[key] == 1:
        return f"torch.tensor({_values(t.detach(), indent)}, dtype={_dtype(t)}){suffix}"
    if key not in storages:
        storages[key] = f"storage{len(storages)}"
        flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (key[1] // t.element_size(),))
        lines.append(f"{storages[key]} = torch.tensor({_values(flat.detach(), 0)}, dtype={_dtype(t)})")
    return f"{storages[key]}.as_strided({tuple(t.shape)}, {tuple(t.stride())}, {t.storage_offset()}){suffix}"


def source(case: Case, name: str = "case") -> str:
    """``case`` as Python source: imports, storages, the ``Case`` literal, the ``@example`` line and
    the oracle's verdict."""
    for n, v in case.args.items():
        if isinstance(v, torch.Tensor):
            _refuse(n, v)
    uses = Counter(id(v) for v in case.args.values() if isinstance(v, torch.Tensor))
    tensors = {id(v): v for v in case.args.values() if isinstance(v, torch.Tensor)}.values()
    shared = Counter(_storage(v) for v in tensors)  # above 1: several tensors view one storage
    storages: dict[tuple[int, int], str] = {}
    named: dict[int, str] = {}  # one tensor object passed as several arguments (a declared alias, C31)
    pre: list[str] = []
    fields = []
    for n, v in case.args.items():
        if isinstance(v, torch.Tensor) and uses[id(v)] > 1:
            if id(v) not in named:
                named[id(v)] = f"tensor{len(named)}"
                pre.append(f"{named[id(v)]} = {_tensor(v, shared, storages, pre, 0)}")
            text = named[id(v)]
        else:
            text = _tensor(v, shared, storages, pre) if isinstance(v, torch.Tensor) else _number(v) if isinstance(v, (bool, int, float)) else repr(v)
        fields.append(f'        "{n}": {text},')
    extra = []
    if case.grid is not None:
        extra.append(f"grid={tuple(case.grid)}")
    if case.positional:
        extra.append("positional=True")
    body = [f"{name} = Case(", f'    "{case.kernel}",', "    {", *fields, "    }" + ("," if extra else ""), *(f"    {e}," for e in extra), ")"]
    verdict = _verdict(case)
    header = [
        f"# {case.kernel}" + (f": {case.note}" if case.note else "") + (f"; saved from {', '.join(case.meta['backends'])}" if case.meta.get("backends") else ""),
        "import torch",
        "from hypothesis import example",
        "",
        "from conformance.runner import Case",
        "",
    ]
    if any(w in "\n".join(pre + fields + verdict) for w in ("nan", "inf")):
        header += ['nan, inf = float("nan"), float("inf")', ""]
    usage = [
        "",
        f'# Frozen beside the kernel\'s conformance test, above its @given(case=cases("{case.kernel}")):',
        f"#     @example(case={name})",
    ]
    text = "\n".join([*header, *pre, *body, *usage, "", *verdict])
    return "\n".join(_wrap(line) for line in text.splitlines()) + "\n"


def _verdict(case: Case) -> list[str]:
    """The oracle's outputs for the case (cells it leaves unwritten keep the runner's poison), or its refusal."""
    outcome = run_backend(BACKENDS[ORACLE], case)
    if outcome.error is not None:
        first = outcome.error.strip().splitlines()[0]
        return [f"# The oracle refuses it (the contract's answer for this case): {first}"]
    lines = ["# A golden: what the oracle writes (cells it leaves untouched hold the runner's poison).", "EXPECTED = {"]
    for n, t in outcome.outputs.items():
        literal = f"torch.empty({tuple(t.shape)}, dtype={_dtype(t)})" if t.numel() == 0 else f"torch.tensor({_values(t, 4)}, dtype={_dtype(t)})"
        lines.append(f'    "{n}": {literal},')
    return [*lines, "}"]


def _wrap(line: str) -> str:
    if len(line) <= WIDTH or line.lstrip().startswith("#"):
        return line
    indent = len(line) - len(line.lstrip()) + 4
    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("show", help="print a saved case as Python source: a Case literal, its @example line, the oracle's golden")
    p.add_argument("path", type=input_file)
    p.add_argument("--name", default="case", help="the variable the case is bound to (default: case)")
    p.set_defaults(func=cmd)


def cmd(ns: argparse.Namespace) -> int:
    print(source(load_case(ns.path), ns.name.replace("-", "_")), end="")
    return 0
