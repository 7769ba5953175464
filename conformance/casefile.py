"""The case file: how a case is saved and loaded, where failing cases go, and the command that replays one.

A file is untrusted when it is loaded: it is data (safetensors and JSON, never code), and every field is
checked (:func:`load_case`).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch
from safetensors import safe_open

import contracts
from conformance.case import Case
from contracts.spec import Table

FAILURES_DIR = Path(os.environ.get("SPECDIFF_FAILURES", "reports/failures"))

# A saved case is a .safetensors file: tensor bytes and JSON, nothing a loader executes (torch.save
# is a pickle, and weights_only is a restricted unpickler still). Each distinct storage among the
# tensor arguments is one 1-D uint8 tensor of its bytes ("s0", "s1", ...) and each tensor argument
# a view of one (dtype, byte offset, sizes, strides, negative and conjugate bits, requires_grad), so that aliased
# arguments and strided views come back exactly. The metadata holds one key, "specdiff": the JSON
# document {"format", "version", "kernel", "grid", "positional", "note", "meta", "args"}. An argument
# is {"tensor": view}, {"table": [{"tensor": view}, ...]} (a pointer table's tensors), {"int": n},
# {"float": float.hex()}, {"bool": b}, {"none": null} or {"str": s};
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
        if isinstance(v, Table):
            return {"table": [encode(x, name) for x in v]}
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
        raise ValueError(f"{where} must be an object with one key (none, bool, int, float, complex, str, list, table, tensor, ndarray)")
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
    if kind == "table" and isinstance(x, list):
        if not all(isinstance(e, dict) and list(e) == ["tensor"] for e in x):
            raise ValueError(f"{where}: a table holds tensors only, each {{\"tensor\": view}}")
        return Table(_value(e, blobs, views, f"{where}[{g}]", depth + 1) for g, e in enumerate(x))
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


_warned: set[tuple[str, str, str]] = set()


def save_failure(case: Case, path: Path | None = None, meta: dict[str, Any] | None = None) -> Path | None:
    """``save_case`` for a failing case: a failures directory that cannot be written (or a case that cannot
    be saved) is a warning, so that the failure is still reported as itself; None then. The warning is
    printed once per kernel, place and reason: shrinking saves every smaller failing case it finds."""
    try:
        return save_case(case, path, meta)
    except (OSError, ValueError) as e:
        key = (case.kernel, str(path or FAILURES_DIR), f"{type(e).__name__}: {e}")
        if key not in _warned:
            _warned.add(key)
            print(f"warning: could not save the failing {case.kernel} case under {key[1]}: {e}", file=sys.stderr, flush=True)
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
