"""Shared machinery of the pytest-benchmark suites (one ``test_bench_<family>.py`` per family).

Every benchmark reads its kernel's ``KernelSpec``: the launch goes through the backend registered
on it, bytes moved come from ``spec.bytes_moved``, and after the timed loop the outputs are
compared bit for bit with the PyTorch oracle run on the same inputs. Each result carries its
sizes, backend, thread count, bytes, GB/s and this run's memory roofline in ``extra_info``, which
``benchmarks/report.py`` turns into the summary table and the plots.

Options (after ``--`` in ``nox -s bench``):

    --full               the whole sweep (also SPECDIFF_BENCH_FULL=1); default: the quick sweep
    --bench-threads N,M  thread counts of the scaling sweeps (default: 1, 2, 4, ... all cores)
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import contracts
from conformance.backends import BACKENDS, ORACLE
from conformance.runner import bits, copy_args, poison_value
from contracts.spec import KernelSpec, Role

# Time one benchmark may take (its warm-up, then the timed rounds), by sweep.
BUDGET_S = {"quick": 1.0, "full": 2.0}
# A GB/s above this multiple of the roofline is a measurement error (timer, cache, bytes).
ROOFLINE_SLACK = 1.05


# -- options and machine ------------------------------------------------------------------------------
def full_sweep(config: pytest.Config) -> bool:
    return bool(config.getoption("--full")) or os.environ.get("SPECDIFF_BENCH_FULL", "") not in ("", "0")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def thread_counts(config: pytest.Config | None = None) -> list[int]:
    """1, 2, 4, ... up to every core, and every core itself."""
    given = config.getoption("--bench-threads") if config is not None else None
    if given:
        return [int(x) for x in given.split(",")]
    n, out, k = cores(), [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def cpu_info() -> dict[str, str]:
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in os.popen("lscpu 2>/dev/null").read().splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    return info


def llc_bytes() -> int:
    """Size of the largest cache level of cpu0, from sysfs (0 if unknown)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            text = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    return best


def mem_available() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


# -- threads ----------------------------------------------------------------------------------------------
def _cpu_ext() -> Any:
    from cpu_impl import _C

    return _C


@contextlib.contextmanager
def omp_threads(n: int) -> Iterator[None]:
    """OpenMP threads of the C++ port (and of torch, which shares the OpenMP runtime) for a block."""
    ext = _cpu_ext()
    before = ext.max_threads()
    ext.set_num_threads(n)
    torch.set_num_threads(n)
    try:
        yield
    finally:
        ext.set_num_threads(before)
        torch.set_num_threads(before)


# -- the roofline -------------------------------------------------------------------------------------------
@dataclass
class Roofline:
    """This run's memory bandwidth: a large read-only reduction and a large copy (GB/s)."""

    read_gbps: float
    copy_gbps: float
    threads: int
    bytes: int
    detail: dict[str, float] = field(default_factory=dict)


def _best_rate(fn: Callable[[], Any], nbytes: int, repeats: int = 9) -> float:
    fn()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def measure_roofline(nbytes: int | None = None) -> Roofline:
    """Read bandwidth: the best of read-only reductions over a buffer far larger than the last-level
    cache: one stream (torch's sum), two streams (a dot product of its halves, as K4 reads p and q
    side by side) and the C++ reader shaped like K4's scan (nine streams per thread, K4's prefetch
    policy; csrc/roofline.cpp), since on the 16-core Xeon K4 out-read both of torch's. Copy
    bandwidth counts the bytes read plus the bytes written (STREAM's convention). All at one thread
    and at every core; the roofline is the best."""
    from cpu_impl.launcher import buf

    reader = _cpu_ext().roofline.read_streams
    nbytes = nbytes or max(1 << 30, 16 * llc_bytes())
    x = torch.rand(nbytes // 4)
    bx = buf(x)
    half = x.numel() // 2
    y = torch.empty(half)
    detail: dict[str, float] = {}
    for n in sorted({1, cores()}):
        with omp_threads(n):
            detail[f"read_{n}t"] = max(_best_rate(lambda: x.sum(), x.numel() * 4),
                                       _best_rate(lambda: torch.dot(x[:half], x[half:]), half * 8),
                                       _best_rate(lambda: reader(bx, 9), x.numel() * 4))
            detail[f"copy_{n}t"] = _best_rate(lambda: y.copy_(x[:half]), half * 8)
    if torch.cuda.is_available():
        g = torch.rand(1 << 28, device="cuda")  # 1 GiB of GPU memory
        gh = torch.empty(1 << 27, device="cuda")

        def synced(fn: Callable[[], Any]) -> Callable[[], None]:
            return lambda: (fn(), torch.cuda.synchronize())

        detail["gpu_read"] = _best_rate(synced(lambda: g.sum()), g.numel() * 4)
        detail["gpu_copy"] = _best_rate(synced(lambda: gh.copy_(g[: gh.numel()])), gh.numel() * 8)
    return Roofline(
        read_gbps=max(v for k, v in detail.items() if k.startswith("read")),
        copy_gbps=max(v for k, v in detail.items() if k.startswith("copy")),
        threads=cores(),
        bytes=nbytes,
        detail=detail,
    )


def same_bytes_read_gbps(nbytes: int, threads: int) -> float:
    """The machine's own read rate for a working set of ``nbytes``, repeated as a warm kernel call
    repeats it: torch's dot product of a buffer's halves at ``threads`` threads. Beside a kernel's
    thread scaling it tells what the cache (or memory) level holding those bytes allows any reader."""
    x = torch.rand(max(nbytes // 4, 2))
    half = x.numel() // 2
    with omp_threads(threads):
        return _best_rate(lambda: torch.dot(x[:half], x[half : 2 * half]), half * 8, repeats=200)


_ROOFLINE: Roofline | None = None


def roofline_now() -> Roofline:
    global _ROOFLINE
    if _ROOFLINE is None:
        _ROOFLINE = measure_roofline()
    return _ROOFLINE


def remeasure_roofline() -> Roofline:
    """Measures again and keeps the best of every measurement: on a shared machine a roofline taken
    while another process streamed memory is too low, and the run's roofline is its best."""
    r, again = roofline_now(), measure_roofline()
    for k, v in again.detail.items():
        r.detail[k] = max(v, r.detail.get(k, 0.0))
    r.read_gbps = max(r.read_gbps, again.read_gbps)
    r.copy_gbps = max(r.copy_gbps, again.copy_gbps)
    r.detail["remeasured"] = r.detail.get("remeasured", 0.0) + 1
    return r


# -- cases ---------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One launch: arguments by parameter name (CPU tensors), grid, and the sizes it reports."""

    kernel: str
    args: dict[str, Any]
    grid: tuple[int, ...]
    sizes: dict[str, Any]

    @property
    def spec(self) -> KernelSpec:
        return contracts.get(self.kernel)


def tensor_bytes(args: dict[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in args.values() if isinstance(v, torch.Tensor))


def timed_here(backend: str, size: Any, quick: Any) -> bool:
    """The oracle is timed at the quick sweep's sizes only, in every sweep: beside the engine it is a
    footnote, and timing it across the full sweep doubled its length (the C++ port's results are
    still checked against it at every size)."""
    return backend != "reference" or size in quick


def require_memory(nbytes: int, what: str) -> None:
    """Skips a case that would not fit in 60 % of the memory available now."""
    avail = mem_available()
    if nbytes > 0.6 * avail:
        pytest.skip(f"{what} needs ~{nbytes / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available")


def assert_same(name: str, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or not torch.equal(bits(got), bits(want)):
        diff = (bits(got).reshape(-1) != bits(want).reshape(-1)).nonzero()
        first = int(diff[0]) if diff.numel() else -1
        raise AssertionError(f"{what}: output '{name}' differs from the oracle (first at flat element {first})")


def backend_available(name: str) -> str | None:
    """None when backend ``name`` can be benchmarked here, else why not."""
    if name not in BACKENDS:
        return f"backend {name!r} is not registered"
    b = BACKENDS[name]
    why = b.unavailable()
    if why:
        return why
    if b.name.startswith("triton") and b.mode() != "compiled":
        return "Triton is interpreted here (no GPU): not a benchmark"
    return None


def gpu_backends(spec: KernelSpec) -> list[str]:
    """Registered backends that run ``spec`` compiled on a GPU (none without one)."""
    if not torch.cuda.is_available():
        return []
    return [n for n, b in BACKENDS.items() if n.startswith("triton") and backend_available(n) is None and b.resolve(spec) is not None]


def backends_for(kernel: str) -> list[str]:
    """The backends a kernel is benchmarked on: the C++ port, the oracle, and compiled Triton on a GPU."""
    return ["cpu", ORACLE] + gpu_backends(contracts.get(kernel))


def gate_mark(backend: str) -> tuple[Any, ...]:
    """The C++ port's results are what the regression gate compares (the oracle's are context)."""
    return (pytest.mark.gate,) if backend == "cpu" else ()


# -- a composition's launches -------------------------------------------------------------------------------
@dataclass
class Launch:
    """One kernel launch of a composition: its inputs as they were before it and its outputs after."""

    kernel: str
    grid: tuple[int, ...]
    before: dict[str, Any]
    outputs: dict[str, torch.Tensor]


def capture_launches(run: Callable[[], Any]) -> list[Launch]:
    """Every launch ``run`` makes through ``compositions.sampler.launch``, in order."""
    import compositions.sampler as compositions

    seen: list[Launch] = []
    real = compositions.launch

    def keep(backend: str, kernel: str, grid: tuple[int, ...], **args: Any) -> None:
        before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        real(backend, kernel, grid, **args)
        outs = {p.name: args[p.name].clone() for p in contracts.get(kernel).outputs if isinstance(args[p.name], torch.Tensor)}
        seen.append(Launch(kernel, grid, before, outs))

    compositions.launch = keep
    try:
        run()
    finally:
        compositions.launch = real
    return seen


# -- timing -----------------------------------------------------------------------------------------------------
_EVICT: torch.Tensor | None = None
_EVICT_RATES: list[float] = []  # read rate of each eviction since the last timed() began its rounds


def evict_caches() -> None:
    """Reads a buffer of sixteen times the last-level cache (a read-only dot product of its
    halves), so the next call starts from DRAM: read-only, so no dirty line is written back during
    the timed call. It is also a read roofline taken between the timed calls, under the same load:
    its best rate joins this run's roofline."""
    global _EVICT
    if _EVICT is None:
        _EVICT = torch.rand(max(16 * llc_bytes(), 512 << 20) // 4)
    half = _EVICT.numel() // 2
    t0 = time.perf_counter()
    torch.dot(_EVICT[:half], _EVICT[half:])
    rate = half * 8 / (time.perf_counter() - t0) / 1e9
    _EVICT_RATES.append(rate)
    r = roofline_now()
    if rate > r.read_gbps:
        r.read_gbps = rate
        r.detail["read_between_calls"] = rate


def timed(
    benchmark: Any,
    fn: Callable[[], Any],
    budget_s: float,
    max_rounds: int = 200,
    sync: Callable[[], None] | None = None,
    cold: bool = False,
) -> None:
    """Warm-up, then as many rounds as fit in ``budget_s`` (at least 3). ``cold`` evicts the caches
    before every round (one call per round, timed from DRAM); otherwise sub-millisecond calls are
    batched into iterations so the timer's resolution does not matter."""
    call = fn if sync is None else (lambda: (fn(), sync()))
    call()
    t0 = time.perf_counter()
    call()
    once = max(time.perf_counter() - t0, 1e-7)
    if cold:
        evict_caches()  # allocates the buffer the first time
        t0 = time.perf_counter()
        evict_caches()
        evict = time.perf_counter() - t0
        rounds = int(max(3, min(max_rounds, budget_s / (once + evict))))
        _EVICT_RATES.clear()  # from here on, one eviction right before each timed round
        benchmark.pedantic(call, setup=evict_caches, rounds=rounds, iterations=1, warmup_rounds=0)
        return
    iterations = max(1, min(1000, int(2e-4 / once)))
    rounds = int(max(3, min(max_rounds, budget_s / (once * iterations))))
    benchmark.pedantic(call, rounds=rounds, iterations=iterations, warmup_rounds=1 if once < 0.05 else 0)


def budget(config: pytest.Config) -> float:
    """Seconds one benchmark may take: SPECDIFF_BENCH_BUDGET, else by sweep."""
    given = os.environ.get("SPECDIFF_BENCH_BUDGET")
    return float(given) if given else BUDGET_S["full" if full_sweep(config) else "quick"]


@dataclass
class Result:
    seconds_min: float
    seconds_median: float


def stats_of(benchmark: Any) -> Result:
    s = benchmark.stats.stats
    return Result(s.min, s.median)


def record(
    benchmark: Any,
    case: Case,
    backend: str,
    mode: str,
    threads: int | None,
    roofline: Roofline,
    nbytes: int | None = None,
    bandwidth_bound: bool = False,
    cold: bool = False,
) -> None:
    """extra_info of one result; a GB/s above the roofline, timed from DRAM (cold caches, or a
    working set far past the last-level cache), re-measures the roofline and then marks the result
    noisy."""
    r = stats_of(benchmark)
    nbytes = case.spec.bytes_moved(case.args) if nbytes is None and case.spec.bytes_moved else nbytes
    info = benchmark.extra_info
    info.update(kernel=case.kernel, backend=backend, mode=mode, threads=threads, **case.sizes)
    info["loadavg"] = loadavg()
    info["us_min"] = r.seconds_min * 1e6
    info["us_median"] = r.seconds_median * 1e6
    if nbytes:
        working_set = tensor_bytes(case.args)
        info["bytes_moved"] = nbytes
        info["gbps"] = nbytes / r.seconds_min / 1e9
        info["gbps_median"] = nbytes / r.seconds_median / 1e9
        info["bandwidth_bound"] = bandwidth_bound
        # Warm calls on a working set the last-level cache can (partly) hold read from cache: no DRAM
        # roofline applies to them.
        info["cache"] = "cold" if cold else "warm"
        info["cache_resident"] = not cold and working_set < 4 * llc_bytes()
        if cold and _EVICT_RATES and len(_EVICT_RATES) == len(benchmark.stats.stats.data):
            # Each round against the read rate measured right before it: on a machine whose memory
            # bandwidth other tenants share, the pair sees the same contention.
            paired = sorted(nbytes / t / 1e9 / rate for t, rate in zip(benchmark.stats.stats.data, _EVICT_RATES))
            info["paired_read_fraction_median"] = paired[len(paired) // 2]
            info["paired_read_fraction_best"] = paired[-1]
        if mode == "compiled" and "gpu_read" in roofline.detail:
            info["roofline_read_gbps"] = roofline.detail["gpu_read"]
            info["of_read_roofline"] = info["gbps"] / roofline.detail["gpu_read"]
        if mode != "compiled":
            info["roofline_read_gbps"] = roofline.read_gbps
            info["roofline_copy_gbps"] = roofline.copy_gbps
            info["of_read_roofline"] = info["gbps"] / roofline.read_gbps
            # Above the roofline: measure it again (up to five times, a second or so each); another
            # process streaming memory during the first measurement leaves it too low, and the run's
            # roofline is its best. If the conflict remains, the machine was too busy to say: the
            # result is reported as noisy, never failed (only a wrong output fails a benchmark).
            for _ in range(5):
                if info["cache_resident"] or info["gbps"] <= ROOFLINE_SLACK * roofline.read_gbps:
                    break
                roofline = remeasure_roofline()
                info["roofline_read_gbps"] = roofline.read_gbps
                info["roofline_copy_gbps"] = roofline.copy_gbps
                info["of_read_roofline"] = info["gbps"] / roofline.read_gbps
            if not info["cache_resident"] and info["gbps"] > ROOFLINE_SLACK * roofline.read_gbps:
                info["noisy"] = (f"{info['gbps']:.1f} GB/s is above this run's read roofline ({roofline.read_gbps:.1f} GB/s, "
                                 f"re-measured) for a {working_set >> 20} MiB working set: the machine was busy")


# -- one benchmark of one kernel on one backend ----------------------------------------------------------------------
def poison(case: Case) -> None:
    """Fills every output with a value no kernel writes (as the conformance runner does), so a cell
    the backend fails to write cannot keep a correct value from an earlier benchmark."""
    for p in case.spec.outputs:
        t = case.args.get(p.name)
        if isinstance(t, torch.Tensor) and p.role is Role.OUT:
            t.fill_(poison_value(t.dtype))


def snapshot(args: dict[str, Any], spec: KernelSpec) -> dict[str, torch.Tensor]:
    return {p.name: args[p.name].clone() for p in spec.outputs if isinstance(args.get(p.name), torch.Tensor)}


def run_oracle(case: Case, initial: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The oracle on the case's inputs, its outputs starting from the state they had before timing."""
    args = dict(case.args)
    args.update({n: t.clone() for n, t in initial.items()})
    BACKENDS[ORACLE].resolve(case.spec)(**args)
    return args


def best_of(fn: Callable[[], Any], n: int = 2000, repeat: int = 5) -> float:
    """Seconds per call of a microsecond-scale function: the best of ``repeat`` loops of ``n``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def bare_entry(kernel: Any, args: dict[str, Any]) -> Callable[[], None]:
    """A CPU kernel's C++ entry point alone, on arguments converted once: the port without its
    Python launch wrapper."""
    converted = kernel.convert(kernel.spec.bind((), args))
    entry = kernel.entry()
    return lambda: entry(*converted)


LAUNCH_BOUND_S = 1e-4  # below this, a CPU result also records its bare C++ entry (the wrapper's share)


def bench_kernel(
    benchmark: Any,
    config: pytest.Config,
    case: Case,
    backend: str,
    roofline: Roofline,
    threads: int | None = None,
    bandwidth_bound: bool = False,
    validate: Callable[[Case, dict[str, torch.Tensor]], None] | None = None,
    cold: bool = False,
) -> None:
    """Times ``case`` on ``backend`` (the C++ port with ``threads`` OpenMP threads, the oracle, or
    compiled Triton on the GPU; ``cold``: caches evicted before every call), then re-validates the
    outputs against the oracle."""
    why = backend_available(backend)
    if why:
        pytest.skip(why)
    b = BACKENDS[backend]
    kernel = b.resolve(case.spec)
    if kernel is None:
        pytest.skip(f"backend {backend!r} has no {case.kernel}")
    device = b.device()
    poison(case)
    initial = snapshot(case.args, case.spec)
    args = copy_args(case.args, device) if device != "cpu" else case.args  # strides and aliasing kept
    launch = functools.partial(b.launcher(kernel, case.grid), **args)
    sync = torch.cuda.synchronize if device == "cuda" else None
    n = threads or cores()
    with omp_threads(n):
        timed(benchmark, launch, budget(config), sync=sync, cold=cold and device == "cpu")
    record(benchmark, case, backend, b.mode(), n if device == "cpu" and backend != ORACLE else None, roofline,
           bandwidth_bound=bandwidth_bound, cold=cold and device == "cpu")
    if backend == "cpu" and stats_of(benchmark).seconds_min < LAUNCH_BOUND_S:
        with omp_threads(n):
            benchmark.extra_info["us_c_entry"] = best_of(bare_entry(kernel, args)) * 1e6
    # Re-validation: what the timed loop left in the outputs is what the oracle writes.
    if backend != ORACLE:
        if validate is not None:
            validate(case, {name: args[name] for name in initial})
        else:
            want = run_oracle(case, initial)
            for name in initial:
                assert_same(name, args[name], want[name], f"{case.kernel} on {backend}")
        benchmark.extra_info["validated"] = True
