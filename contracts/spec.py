"""The contract of a kernel, as data.

A :class:`KernelSpec` holds everything that is true of a kernel whatever implements it:
its vLLM name, parameters in launch order with their kinds and dtypes, which buffers it
writes, how outputs compare, its canonical grid and its preconditions. The conformance
runner, the CPU launch wrappers, the signature checks and the benchmarks all read it; none
of them restates a parameter list.
"""

from __future__ import annotations

import enum
import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch


class Kind(enum.Enum):
    PTR = "ptr"
    SCALAR = "scalar"
    CONSTEXPR = "constexpr"


class Role(enum.Enum):
    IN = "in"
    OUT = "out"  # poisoned before every conformance launch: the kernel must not read it
    INOUT = "inout"  # read and written: keeps the case's values, compared afterwards
    # A workspace the kernel writes and reads back: poisoned before every conformance launch (what
    # is read before it is written shows in the outputs), never compared afterwards.
    SCRATCH = "scratch"


class _NoDefault:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _NoDefault()

INT = (torch.int32, torch.int64)

# Keyword-only options of a Triton launch (§1.9), each with a plausible value (the signature
# gate launches with all of them): accepted and ignored by every CPU launcher.
LAUNCH_OPTIONS: Mapping[str, Any] = MappingProxyType(
    {
        "num_warps": 4,
        "num_stages": 2,
        "num_ctas": 1,
        "maxnreg": None,
        "enable_fp_fusion": False,
        "launch_cooperative_grid": False,
        "launch_pdl": False,
        "num_buffers_warp_spec": 0,
        "num_consumer_groups": 0,
        "reg_dec_producer": 0,
        "reg_inc_consumer": 0,
        "debug": False,
        "sanitize_overflow": False,
    }
)


@dataclass(frozen=True)
class Param:
    """One kernel parameter, in the kernel's declaration order.

    ``dtypes`` lists every dtype the contract accepts (§1.5); ``call_site`` is the dtype
    vLLM 0.33.0 passes, the primary conformance case. ``optional`` pointers accept ``None``;
    ``int_zero`` pointers also accept the integer 0 (K9). ``contiguous`` is False only where
    the kernel takes an explicit stride.
    """

    name: str
    kind: Kind
    dtypes: tuple[torch.dtype, ...] = ()
    call_site: torch.dtype | None = None
    role: Role = Role.IN
    optional: bool = False
    int_zero: bool = False
    contiguous: bool = True
    ndim: tuple[int, ...] = (1,)
    default: Any = REQUIRED
    # The one other parameter this one may share memory with (vLLM's call site passes two views of
    # one buffer). Every other overlap that involves a written parameter is refused (C31).
    may_alias: str = ""  # and then only as the same elements: same first element, dtype, shape, strides
    # An output whose float64 values carry C29's float64 noise (each platform's float64 log):
    # backends agree within this relative tolerance (absolute below 1) there, exactly elsewhere.
    float64_rtol: float = 0.0
    # A pointer table (Model Runner V2's block tables): the launch passes one tensor per KV-cache
    # group, as a :class:`Table`; ``dtypes``, ``ndim`` and ``contiguous`` hold for each of them.
    table: bool = False
    # A constexpr flag without which the kernel never reads this tensor: vLLM's call site then
    # passes a placeholder (another argument's tensor), so when the flag is off any value binds
    # as None.
    unread_unless: str = ""
    doc: str = ""

    @property
    def is_output(self) -> bool:
        """Written by the kernel (outputs and workspaces)."""
        return self.role is not Role.IN


def ptr(name: str, dtypes: tuple[torch.dtype, ...], call_site: torch.dtype, doc: str = "", **kw: Any) -> Param:
    return Param(name, Kind.PTR, dtypes=dtypes, call_site=call_site, doc=doc, **kw)


def table(name: str, dtypes: tuple[torch.dtype, ...], call_site: torch.dtype, doc: str = "", **kw: Any) -> Param:
    return Param(name, Kind.PTR, dtypes=dtypes, call_site=call_site, doc=doc, table=True, ndim=(2,), **kw)


class Table(tuple):  # type: ignore[type-arg]
    """The tensors behind a pointer table, one per KV-cache group, in group order.

    vLLM passes a uint64 tensor of their ``data_ptr()``s (``BlockTables._make_ptr_tensor``) that its
    kernels load and cast to pointers. An address can be neither checked, copied nor saved, so a
    launch here passes the tensors: the Triton backends hand their kernels the addresses
    (:meth:`addresses`), the oracle and the C++ port take the tensors.
    """

    def addresses(self, device: torch.device | str) -> torch.Tensor:
        """The uint64 tensor of data pointers a Triton kernel loads, on ``device``."""
        return torch.tensor([t.data_ptr() for t in self], dtype=torch.uint64, device=device)


def tensors(spec: KernelSpec, a: Mapping[str, Any]) -> list[tuple[str, Param, torch.Tensor]]:
    """Every tensor a launch passes, with its label and parameter: a pointer table's tensors are
    ``name[g]``, in group order (as the runner keys their outputs)."""
    out = []
    for p in spec.params:
        v = a[p.name]
        if p.kind is not Kind.PTR:
            continue
        if isinstance(v, torch.Tensor):
            out.append((p.name, p, v))
        elif p.table and isinstance(v, tuple):
            out.extend((f"{p.name}[{g}]", p, t) for g, t in enumerate(v) if isinstance(t, torch.Tensor))
    return out


def scalar(name: str, doc: str = "", **kw: Any) -> Param:
    return Param(name, Kind.SCALAR, doc=doc, ndim=(), **kw)


def real(name: str, doc: str = "", **kw: Any) -> Param:
    """A float scalar (a Python float, or an int within int64): Triton passes it as float32,
    rounded to nearest (beyond float32's range: an infinity)."""
    return Param(name, Kind.SCALAR, dtypes=(torch.float32,), doc=doc, ndim=(), **kw)


def constexpr(name: str, doc: str = "", **kw: Any) -> Param:
    return Param(name, Kind.CONSTEXPR, doc=doc, ndim=(), **kw)


@dataclass(frozen=True)
class Flag:
    """A constexpr flag that must agree with a tensor argument (contract C26)."""

    constexpr: str
    tensor: str
    expect: Callable[[Any], bool]
    meaning: str


Args = dict[str, Any]


@dataclass(frozen=True)
class Earlier:
    """A kernel's parameter list in an earlier release (``through``: the last release known to take it)."""

    through: str
    params: tuple[str, ...]
    note: str
    # The release's arguments for a case of the contract, as that release's call site passes them,
    # where the release computes the same thing under its own parameters: the engine backends then
    # launch it bound so and judge its outputs. None: the release's kernel is reported as drift.
    bind: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    # The contract rule a case falls under that the release predates (its kernel computes otherwise
    # there), or None: such a case is reported as outside the release, never as a value failure.
    predates: Callable[[Mapping[str, Any]], str | None] | None = None


OPS = "torch.ops._C."  # the qualname prefix of vLLM's C++ ops (KernelSpec.op)


@dataclass
class KernelSpec:
    """The contract of one kernel; backends register on it by name (see backends.py)."""

    name: str
    family: str
    qualname: str
    params: tuple[Param, ...]
    grid: Callable[[Mapping[str, Any]], tuple[int, ...]]
    preconditions: Callable[[Mapping[str, Any]], None]
    flags: tuple[Flag, ...] = ()
    # Describes what decided output cell ``index`` of ``output``: used by failure reports. Where only
    # the oracle can say (the cut-offs it computes), the oracle function's "module:name": a contract
    # imports nothing of specdiff's, and the runner resolves the name.
    explain: Callable[[Mapping[str, Any], str, int], str] | str | None = None
    # The contract clause (§5, e.g. "C10 negative draft") that decides output cell ``index`` of
    # ``output``, given how it differs (Diff.kind): findings are grouped by it.
    rule: Callable[[Mapping[str, Any], str, int, str], str] | None = None
    # Holds for every launch vLLM 0.33.0's call sites make, beyond their dtypes (a layout, a
    # length): `--call-site` draws only such cases.
    call_site: Callable[[Mapping[str, Any]], bool] | None = None
    # Bytes a launch must move at least (reads + writes), for benchmarks' GB/s.
    bytes_moved: Callable[[Mapping[str, Any]], int] | None = None
    # vLLM implements it as a PyTorch host function, not a Triton kernel: there is no Triton form
    # (Triton backends report it "n/a"), and it is called plainly, ``f(*args)``; the grid is nominal.
    host: bool = False
    # Why vLLM's own kernel of this name is not compared launch by launch (its workspace follows
    # another contract); empty when it is. The engine backends then report it "n/a"; its signature
    # is still checked against the contract's.
    engine_apart: str = ""
    # Constexprs a Triton backend may append after the engine's parameters, each filled by the
    # kernel's ``triton.heuristics`` from the launch's arguments: compile-time choices of speed
    # (how a loop steps, how many steps are in flight) that no launch passes and no result depends
    # on. The signature gate accepts exactly these, and only where the kernel fills them.
    tuning: tuple[str, ...] = ()
    # vLLM's kernel reads its grid: how many rows it writes comes from the grid's last axis, which no
    # argument carries (MRV2's block-table gather pads rows up to it). The grid is then part of every
    # launch: this refuses one outside the contract (a ValueError naming the grid), and the oracle
    # takes it as a keyword ``grid``, the port's entry point the last axis as a trailing argument.
    check_grid: Callable[[Mapping[str, Any], tuple[int, ...]], None] | None = None
    # The kernel's parameters in earlier vLLM releases, where they differ from the contract's: the
    # engine backends report such a release's kernel as a declared signature drift, not a failure.
    earlier: tuple[Earlier, ...] = ()
    doc: str = ""
    _by_name: dict[str, Param] = field(init=False, repr=False)
    _names: tuple[str, ...] = field(init=False, repr=False)
    _unread: tuple[Param, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._names = tuple(p.name for p in self.params)
        self._by_name = {p.name: p for p in self.params}
        self._unread = tuple(p for p in self.params if p.unread_unless)

    # -- introspection -------------------------------------------------------------------
    @property
    def function(self) -> str:
        """The kernel's function name in every backend's module: ``name`` without the module that
        tells apart two vLLM kernels of one name (``input_batch._prepare_prefill_inputs_kernel``)."""
        return self.name.rpartition(".")[2]

    @property
    def arg_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def op(self) -> str:
        """The C++ op of vLLM's CPU build this contract specifies (qualname ``torch.ops._C.<op>``), or "".
        Such an op takes the contract's inputs in order and returns its one output."""
        return self.qualname.removeprefix(OPS) if self.qualname.startswith(OPS) else ""

    @property
    def constexprs(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.params) if p.kind is Kind.CONSTEXPR)

    @property
    def outputs(self) -> tuple[Param, ...]:
        """What a launch produces: the written parameters but its workspaces."""
        return tuple(p for p in self.params if p.role in (Role.OUT, Role.INOUT))

    def param(self, name: str) -> Param:
        return self._by_name[name]

    def signature(self) -> inspect.Signature:
        return inspect.Signature(
            [
                inspect.Parameter(
                    p.name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=inspect.Parameter.empty if p.default is REQUIRED else p.default,
                )
                for p in self.params
            ]
        )

    # -- binding a launch ------------------------------------------------------------------
    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Args:
        """Bind a launch exactly as Python binds a call to the kernel's signature (§1.9).

        Triton launch options are accepted and dropped; any other unknown keyword is a
        ``TypeError`` naming it. A launch that passes every parameter by keyword and nothing else
        (the engine's call sites) is already bound: its own ``kwargs`` dict is returned.
        """
        if not args and kwargs.keys() == self._by_name.keys():
            return self._placeholders(kwargs)  # type: ignore[arg-type]
        names = self._names
        if len(args) > len(names):
            raise TypeError(f"{self.name}() takes {len(names)} arguments but {len(args)} were given")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key in self._by_name:
                if key in bound:
                    raise TypeError(f"{self.name}() got multiple values for argument '{key}'")
                bound[key] = value
            elif key not in LAUNCH_OPTIONS:
                raise TypeError(f"{self.name}() got an unexpected keyword argument '{key}'")
        if len(bound) != len(names):
            for p in self.params:
                if p.name not in bound:
                    if p.default is REQUIRED:
                        raise TypeError(f"{self.name}() missing required argument '{p.name}'")
                    bound[p.name] = p.default
        return self._placeholders(bound)

    def _placeholders(self, bound: Args) -> Args:
        """A tensor its flag leaves unread binds as None (Param.unread_unless); the caller's dict
        is never changed."""
        for p in self._unread:
            if bound[p.name] is not None and not bound[p.unread_unless]:
                bound = {**bound, p.name: None}
        return bound

    # -- validation ------------------------------------------------------------------------
    def check_types(self, a: Mapping[str, Any], device: str | None = "cpu") -> None:
        """Type-level contract: tensor or None, dtype, device, rank, contiguity, flags.

        ``device=None`` accepts any device, as long as every tensor is on the same one.
        """
        if device is None:
            device = next((v.device.type for v in a.values() if isinstance(v, torch.Tensor)), "cpu")
        for p in self.params:
            v = a[p.name]
            if p.table:
                if not isinstance(v, (tuple, list)):
                    got = "a tensor (raw addresses cannot be checked)" if isinstance(v, torch.Tensor) else type(v).__name__
                    raise TypeError(f"{self.name}: '{p.name}' must be a tuple of tensors, one per KV-cache group, got {got}")
                for g, t in enumerate(v):
                    self._check_tensor(p, f"{p.name}[{g}]", t, device)
            elif p.kind is Kind.PTR:
                if v is None:
                    if not p.optional:
                        raise TypeError(f"{self.name}: '{p.name}' must be a tensor, got None")
                    continue
                if p.int_zero and isinstance(v, int) and not isinstance(v, bool) and v == 0:
                    continue
                self._check_tensor(p, p.name, v, device)
            elif p.kind is Kind.CONSTEXPR and p.name.isupper() and not p.dtypes:
                if not isinstance(v, (bool, int)):
                    raise TypeError(f"{self.name}: '{p.name}' must be a bool or int, got {type(v).__name__}")
            elif p.dtypes:
                if isinstance(v, torch.Tensor) or not isinstance(v, (int, float)):
                    raise TypeError(f"{self.name}: '{p.name}' must be a Python float, got {type(v).__name__}")
            else:
                if isinstance(v, torch.Tensor) or not isinstance(v, (int, bool)):
                    raise TypeError(f"{self.name}: '{p.name}' must be a Python int, got {type(v).__name__}")
        for f in self.flags:
            if bool(a[f.constexpr]) != f.expect(a[f.tensor]):
                raise ValueError(f"{self.name}: '{f.constexpr}' must be {f.meaning}")
        self.check_overlap(a)

    def _check_tensor(self, p: Param, name: str, v: Any, device: str) -> None:
        """One tensor argument (or a pointer table's ``name[g]``) against ``p``'s type-level contract."""
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{self.name}: '{name}' must be a tensor, got {type(v).__name__}")
        if v.dtype not in p.dtypes:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in p.dtypes)
            raise TypeError(
                f"{self.name}: '{name}' must have dtype {allowed}, got {str(v.dtype).removeprefix('torch.')}"
            )
        if v.device.type != device:
            raise ValueError(f"{self.name}: '{name}' must be on {device}, got {v.device}")
        if v.layout is not torch.strided:
            raise TypeError(f"{self.name}: '{name}' must be a strided (dense) tensor, got layout {v.layout}")
        if v.is_neg() or v.is_conj():
            # A lazy view: its memory holds the values before negation or conjugation.
            raise TypeError(f"{self.name}: '{name}' must not be a negative or conjugate view (resolve it first)")
        if p.is_output and v.requires_grad:
            raise TypeError(f"{self.name}: '{name}' is written by the kernel and must not require grad")
        if v.numel() and device == "cpu" and _data_ptr(v) == 0:
            raise TypeError(f"{self.name}: '{name}' has no data (a null data pointer: a fake or meta tensor?)")
        if v.dim() not in p.ndim:
            raise ValueError(f"{self.name}: '{name}' must have {_dims(p.ndim)}, got shape {tuple(v.shape)}")
        if p.contiguous and not v.is_contiguous():
            raise ValueError(f"{self.name}: '{name}' must be contiguous")
        if not p.contiguous and v.dim() > 1 and not v.is_contiguous() and v.stride(-1) != 1:
            raise ValueError(f"{self.name}: '{name}' must have unit inner stride")

    def check_overlap(self, a: Mapping[str, Any]) -> None:
        """C31: a written parameter shares no byte with any other tensor argument, except the one
        its ``may_alias`` names, and that one only as the same elements (:func:`same_elements`:
        element i of one is element i of the other, as vLLM's two slices of one buffer are). A kernel
        validates its inputs and then reads them again; an output over an input at other indices
        would change what was validated, and what another program reads."""
        spans = [(label, p, t, byte_span(t)) for label, p, t in tensors(self, a)]
        for i, (label, p, t, (lo, hi)) in enumerate(spans):
            for label2, q, t2, (lo2, hi2) in spans[i + 1:]:
                if not ((p.is_output or q.is_output) and lo < hi2 and lo2 < hi):
                    continue
                declared = p is not q and (p.may_alias == q.name or q.may_alias == p.name)
                if not declared:
                    raise ValueError(f"{self.name}: '{label2}' overlaps '{label}' in memory, and "
                                     f"'{label if p.is_output else label2}' is written (only declared aliases may share memory)")
                if not same_elements(t, t2):
                    raise ValueError(f"{self.name}: '{label2}' may alias '{label}' only as the same elements (the same "
                                     "first element, dtype, shape and strides), not another view of its memory")

    def check(self, a: Mapping[str, Any], device: str | None = "cpu", grid: tuple[int, ...] | None = None) -> None:
        """The whole contract: types, then the kernel's value-level preconditions, then the grid
        where the kernel reads it (``check_grid``; None: the canonical grid)."""
        self.check_types(a, device)
        self.check_scalars(a)
        self.preconditions(a)
        if self.check_grid is not None:
            self.check_grid(a, tuple(self.grid(a)) if grid is None else tuple(grid))

    def check_scalars(self, a: Mapping[str, Any]) -> None:
        """Scalars and constexprs cross into a kernel as 64-bit integers (Triton's ABI and the C++
        port's): a Python int outside int64 is a ``ValueError`` naming the parameter."""
        for p in self.params:
            v = a[p.name]
            if p.kind is not Kind.PTR and isinstance(v, int) and not -(2**63) <= v < 2**63:
                raise ValueError(f"{self.name}: '{p.name}' must fit in int64, got {v}")


def same_elements(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two tensors are the same elements of the same memory: the same object, or views with
    the same first element, dtype, shape and strides (``buf[:n]`` taken twice)."""
    return x is y or (x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
                      and x.device == y.device and _data_ptr(x) == _data_ptr(y))


def _data_ptr(t: torch.Tensor) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fake tensor warns that its pointer means nothing: the question asked
        return t.data_ptr()


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [lo, hi) a strided tensor's elements lie in (empty for no element)."""
    if not t.numel():
        return (0, 0)
    lo = t.data_ptr()
    return (lo, lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size())


def _dims(ndim: tuple[int, ...]) -> str:
    return " or ".join(f"{n} dimension{'s' if n != 1 else ''}" for n in ndim)


# -- helpers for preconditions ---------------------------------------------------------------
def require(ok: bool, kernel: str, name: str, expectation: str) -> None:
    if not ok:
        raise ValueError(f"{kernel}: '{name}' {expectation}")


def require_length(kernel: str, name: str, t: Any, need: int) -> None:
    """A tensor argument holds at least ``need`` elements (non-tensors are checked elsewhere)."""
    if isinstance(t, torch.Tensor):
        require(t.numel() >= need, kernel, name, f"must hold at least {need} elements, has {t.numel()}")


def require_fits(kernel: str, name: str, value: int, out_name: str, out: Any) -> None:
    """A scalar the kernel stores into ``out`` is representable in its dtype (torch refuses to store
    it otherwise, and a cast would wrap it)."""
    if isinstance(out, torch.Tensor):
        info = torch.iinfo(out.dtype)
        dtype = str(out.dtype).removeprefix("torch.")
        require(info.min <= value <= info.max, kernel, name, f"must fit {out_name}'s {dtype}, got {value}")


def power_of_two(kernel: str, name: str, value: int) -> None:
    require(value >= 1 and value & (value - 1) == 0, kernel, name, f"must be a power of two, got {value}")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def in_int64(kernel: str, name: str, value: int, what: str) -> int:
    """C32: size and index arithmetic stays inside int64 (``value`` is ``what``, computed in Python
    ints); else a ValueError naming the argument, as the C++ port's checked_mul / checked_add."""
    require(INT64_MIN <= value <= INT64_MAX, kernel, name, f"makes {what} = {value} overflow int64")
    return value


def in_int32(kernel: str, name: str, value: int, what: str) -> None:
    """C37: a sum a Model Runner V2 step kernel forms (a length, a position, a count) fits int32, the
    dtype of the engine's state, so nothing wraps whatever the tensors' dtypes."""
    require(-(2**31) <= value < 2**31, kernel, name, f"makes {what} = {value}, outside int32")


def at_least(kernel: str, name: str, value: int, low: int) -> None:
    require(value >= low, kernel, name, f"must be >= {low}, got {value}")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def check_cumulative(kernel: str, name: str, cu: torch.Tensor) -> None:
    """Inclusive cumulative counts: non-negative and non-decreasing (§1.2)."""
    if cu.numel():
        require(int(cu[0]) >= 0, kernel, name, "must start at a non-negative count")
        require(bool((cu[1:] >= cu[:-1]).all()), kernel, name, "must be non-decreasing")


def counts(cu: torch.Tensor) -> torch.Tensor:
    """n(r) from inclusive cumulative counts, with start(0) = 0 and cu[-1] never read (C1)."""
    cu = cu.to(torch.int64)
    return torch.diff(cu, prepend=cu.new_zeros(1))


def starts(cu: torch.Tensor) -> torch.Tensor:
    cu = cu.to(torch.int64)
    return cu - counts(cu)
