"""Benchmarks of the rejection-sampler family (docs/spec.md §2.1–§2.4, §3.1).

The C++ port (``cpu``) against the PyTorch oracle (``reference``) on the CPU, and compiled Triton
(every ``triton*`` backend) on a GPU when one is present. Sizes follow vLLM's shapes: ``B``
requests with ``N`` drafts each, vocabularies of real models (Llama 2 32000, Llama 3 128256,
Qwen 2 151936, Gemma 256000).

    test_sample_recovered           K4 by batch, drafts, vocabulary and inv_q width (cold caches)
    test_sample_recovered_threads   K4 thread scaling (1 .. all cores; warm, as a loop would call it)
    test_rejection_random           K2 by batch and drafts (cold caches)
    test_rejection_sample           the whole §3.1 composition, all-random batch, injected randomness
    test_small                      K1 and K3 at 256 requests (the 10x-over-the-oracle target)
    test_launch_overhead            the Python launch wrapper's cost per call (the < 10 us target)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from harness import (
    Case,
    assert_same,
    backends_for,
    bare_entry,
    bench_kernel,
    best_of,
    budget,
    cores,
    full_sweep,
    gate_mark,
    omp_threads,
    record,
    require_memory,
    run_oracle,
    same_bytes_read_gbps,
    thread_counts,
    timed,
    timed_here,
)

from compositions.sampler import SamplingMetadata, rejection_sample

VOCABS = {"32k": 32000, "128k": 128256, "152k": 151936, "256k": 256000}
REQUESTS = (1, 8, 64, 256, 1024)
DRAFTS = (1, 4, 8)
F32, F64, I32, I64 = torch.float32, torch.float64, torch.int32, torch.int64


# -- the sweeps ------------------------------------------------------------------------------------------------
def _recovered_sizes(full: bool) -> list[tuple[int, int, int, str]]:
    """(B, N, V, inv_q dtype) of the K4 sweep."""
    if full:
        return [(b, n, v, dt) for v in VOCABS.values() for b in REQUESTS for n in DRAFTS for dt in ("f32", "f64")]
    v = VOCABS["152k"]
    quick = [(b, 4, v, "f32") for b in (1, 8, 64, 256)] + [(1, 8, v, "f32"), (64, 4, v, "f64")]
    quick += [(64, 4, VOCABS[k], "f32") for k in ("32k", "128k", "256k")]
    return quick


def _batch_sizes(full: bool, quick: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(b, n) for b in REQUESTS for n in DRAFTS] if full else quick



def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    full = full_sweep(metafunc.config)
    name = metafunc.function.__name__
    v152 = VOCABS["152k"]

    def ids(x: Any) -> str:
        return str(x)

    if name == "test_sample_recovered":
        params = [
            pytest.param(b, n, v, dt, be, id=f"{be}-B{b}-N{n}-V{v}-{dt}", marks=gate_mark(be))
            for (b, n, v, dt) in _recovered_sizes(full)
            for be in backends_for("sample_recovered_tokens_kernel")
            if timed_here(be, (b, n, v, dt), _recovered_sizes(False))
        ]
        metafunc.parametrize("B,N,V,dtype,backend", params)
    elif name == "test_sample_recovered_threads":
        sizes = [(1, 8, v152), (64, 4, v152)] + ([(256, 8, v152), (8, 4, VOCABS["32k"])] if full else [])
        params = [
            pytest.param(b, n, v, th, id=f"B{b}-N{n}-V{v}-t{th}")
            for (b, n, v) in sizes
            for th in thread_counts(metafunc.config)
        ]
        metafunc.parametrize("B,N,V,threads", params)
    elif name in ("test_rejection_random", "test_rejection_sample"):
        kernel = "rejection_random_sample_kernel"
        quick = [(64, 4), (256, 4)] if name == "test_rejection_random" else [(64, 4)]
        backends = backends_for(kernel) if name == "test_rejection_random" else ["cpu", "reference"]
        params = [
            pytest.param(b, n, v152, be, id=f"{be}-B{b}-N{n}-V{v152}", marks=gate_mark(be))
            for (b, n) in _batch_sizes(full, quick)
            for be in backends
            if timed_here(be, (b, n), quick)
        ]
        metafunc.parametrize("B,N,V,backend", params)
    elif name == "test_small":
        params = [
            pytest.param(k, b, n, be, id=f"{k}-{be}-B{b}-N{n}", marks=gate_mark(be))
            for k in ("rejection_greedy_sample_kernel", "expand_kernel")
            for (b, n) in _batch_sizes(full, [(256, 4)])
            for be in backends_for(k)
            if timed_here(be, (b, n), [(256, 4)])
        ]
        metafunc.parametrize("kernel,B,N,backend", params)
    elif name == "test_launch_overhead":
        metafunc.parametrize("kernel", ["rejection_greedy_sample_kernel", "expand_kernel", "rejection_random_sample_kernel",
                                        "sample_recovered_tokens_kernel"], ids=ids)


# -- inputs ---------------------------------------------------------------------------------------------------------
_PROBS: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}


@pytest.fixture(scope="module", autouse=True)
def _free_inputs() -> Any:
    yield
    _PROBS.clear()


def _probs(t: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft probability rows [T, V], float32, one pair kept at a time (they are large)."""
    key = (t, v)
    if key not in _PROBS:
        _PROBS.clear()
        require_memory(3 * t * v * 4, f"[{t}, {v}] probability rows")
        g = torch.Generator().manual_seed(t * 1_000_003 + v)
        with omp_threads(cores()):
            p = torch.rand(t, v, generator=g)
            q = torch.rand(t, v, generator=g)
        _PROBS[key] = (p, q)
    return _PROBS[key]


def _cu(b: int, n: int) -> torch.Tensor:
    return (torch.arange(1, b + 1, dtype=I64) * n).to(I32)


def _g(b: int, n: int, v: int) -> torch.Generator:
    return torch.Generator().manual_seed(b * 7919 + n * 104729 + v)


def recovered_case(b: int, n: int, v: int, dtype: str, draft_probs: bool = True) -> Case:
    t = b * n
    p, q = _probs(t, v)
    g = _g(b, n, v)
    inv_q = 1.0 / torch.empty(b, v, dtype=F64 if dtype == "f64" else F32).exponential_(generator=g)
    args = dict(
        output_token_ids_ptr=torch.empty(t, dtype=I32), cu_num_draft_tokens_ptr=_cu(b, n),
        draft_token_ids_ptr=torch.randint(0, v, (t,), dtype=I32, generator=g), draft_probs_ptr=q if draft_probs else None,
        target_probs_ptr=p, inv_q_ptr=inv_q, vocab_size=v, BLOCK_SIZE=8192, NO_DRAFT_PROBS=not draft_probs,
        USE_FP64_GUMBEL=dtype == "f64",
    )
    return Case("sample_recovered_tokens_kernel", args, (b, n), dict(B=b, N=n, V=v, dtype=dtype))


def random_case(b: int, n: int, v: int) -> Case:
    t = b * n
    p, q = _probs(t, v)
    g = _g(b, n, v)
    args = dict(
        output_token_ids_ptr=torch.full((b, n + 1), -1, dtype=I32), cu_num_draft_tokens_ptr=_cu(b, n),
        draft_token_ids_ptr=torch.randint(0, v, (t,), dtype=I32, generator=g), draft_probs_ptr=q, target_probs_ptr=p,
        bonus_token_ids_ptr=torch.randint(0, v, (b, 1), dtype=I32, generator=g),
        recovered_token_ids_ptr=torch.randint(0, v, (t,), dtype=I32, generator=g),
        uniform_probs_ptr=torch.rand(t, dtype=F64, generator=g), is_greedy_ptr=torch.zeros(b, dtype=torch.bool),
        max_spec_len=n, vocab_size=v, synthetic_conditional_rates_ptr=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False,
    )
    return Case("rejection_random_sample_kernel", args, (b,), dict(B=b, N=n, V=v, dtype="f32"))


def greedy_case(b: int, n: int, v: int = VOCABS["152k"]) -> Case:
    t = b * n
    g = _g(b, n, v)
    draft = torch.randint(0, v, (t,), dtype=I32, generator=g)
    # About 70 % of positions agree with the argmax, so rows stop at varied depths.
    agree = torch.rand(t, generator=g) < 0.7
    argmax = torch.where(agree, draft.to(I64), torch.randint(0, v, (t,), dtype=I64, generator=g))
    args = dict(
        output_token_ids_ptr=torch.full((b, n + 1), -1, dtype=I32), cu_num_draft_tokens_ptr=_cu(b, n),
        draft_token_ids_ptr=draft, target_argmax_ptr=argmax, bonus_token_ids_ptr=torch.randint(0, v, (b, 1), dtype=I32, generator=g),
        is_greedy_ptr=None, max_spec_len=n, uniform_probs_ptr=None, synthetic_conditional_rates_ptr=None, SYNTHETIC_MODE=False,
    )
    return Case("rejection_greedy_sample_kernel", args, (b,), dict(B=b, N=n, V=v, dtype="i32"))


def expand_case(b: int, n: int) -> Case:
    g = _g(b, n, 0)
    temperature = torch.rand(b, generator=g)
    temperature[torch.rand(b, generator=g) < 0.25] = 0.0  # greedy rows: replaced 0 -> 1
    args = dict(output_ptr=torch.empty(b * n), input_ptr=temperature, cu_num_tokens_ptr=_cu(b, n), replace_from=0,
                replace_to=1, MAX_NUM_TOKENS=128)
    return Case("expand_kernel", args, (b,), dict(B=b, N=n, V=0, dtype="f32"))


# -- the benchmarks --------------------------------------------------------------------------------------------------
def _oracle_memory(case: Case, backend: str) -> None:
    """The oracle of K4 materialises a few [T, V] temporaries; skip sizes that would not fit."""
    if backend == "reference" and case.kernel == "sample_recovered_tokens_kernel":
        t, v = case.args["target_probs_ptr"].shape
        require_memory(5 * t * v * 8, "the oracle's [T, V] temporaries")


def test_sample_recovered(benchmark, request, roofline, B, N, V, dtype, backend):
    require_memory(2 * B * N * V * 4 + B * V * 8, "K4 inputs")
    case = recovered_case(B, N, V, dtype)
    _oracle_memory(case, backend)
    bench_kernel(benchmark, request.config, case, backend, roofline, bandwidth_bound=True, cold=True,
                 validate=None if B * N * V <= 1 << 28 else _validate_recovered_rows)


def _validate_recovered_rows(case: Case, outputs: dict[str, torch.Tensor]) -> None:
    """Re-validation of a large K4 launch on a sample of requests (first, middle, last): each
    request's recovered tokens depend only on its own rows, so the slice is an exact check."""
    a = case.args
    b = a["cu_num_draft_tokens_ptr"].numel()
    n = case.sizes["N"]
    got = outputs["output_token_ids_ptr"].cpu()
    for r in sorted({0, b // 2, b - 1}):
        rows = slice(r * n, (r + 1) * n)
        sub = Case(case.kernel, dict(a), (1, n), case.sizes)
        sub.args.update(
            output_token_ids_ptr=torch.empty(n, dtype=I32), cu_num_draft_tokens_ptr=torch.tensor([n], dtype=I32),
            draft_token_ids_ptr=a["draft_token_ids_ptr"][rows], target_probs_ptr=a["target_probs_ptr"][rows],
            draft_probs_ptr=None if a["draft_probs_ptr"] is None else a["draft_probs_ptr"][rows],
            inv_q_ptr=a["inv_q_ptr"][r : r + 1],
        )
        want = run_oracle(sub, {"output_token_ids_ptr": torch.empty(n, dtype=I32)})
        assert_same("output_token_ids_ptr", got[rows], want["output_token_ids_ptr"], f"K4 request {r}")


def test_sample_recovered_threads(benchmark, request, roofline, B, N, V, threads):
    if threads > cores():
        pytest.skip(f"{threads} threads > {cores()} cores")
    case = recovered_case(B, N, V, "f32")
    bench_kernel(benchmark, request.config, case, "cpu", roofline, threads=threads, bandwidth_bound=True)
    benchmark.extra_info["scaling"] = True
    benchmark.extra_info["same_bytes_read_gbps"] = same_bytes_read_gbps(case.spec.bytes_moved(case.args), threads)
    benchmark.group = f"K4 threads B{B} N{N} V{V}"


def test_rejection_random(benchmark, request, roofline, B, N, V, backend):
    require_memory(2 * B * N * V * 4, "K2 inputs")
    bench_kernel(benchmark, request.config, random_case(B, N, V), backend, roofline, bandwidth_bound=True, cold=True)


def test_small(benchmark, request, roofline, kernel, B, N, backend):
    case = greedy_case(B, N) if kernel == "rejection_greedy_sample_kernel" else expand_case(B, N)
    bench_kernel(benchmark, request.config, case, backend, roofline)


def test_rejection_sample(benchmark, request, roofline, B, N, V, backend):
    """§3.1 on one backend: softmax, 1/noise, K4 and K2 (an all-random batch has no K1), with the
    uniforms and exponential noise injected so both backends see the same numbers."""
    t = B * N
    require_memory(6 * t * V * 4 + 2 * B * V * 4, "the composition's [T, V] tensors")
    _, q = _probs(t, V)
    g = _g(B, N, V)
    logits = torch.randn(t, V, generator=g)
    draft = torch.randint(0, V, (t,), dtype=I32, generator=g)
    meta = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True)
    uniform = torch.rand(t, dtype=F64, generator=g)
    noise = torch.empty(B, V).exponential_(generator=g)
    bonus = torch.randint(0, V, (B, 1), dtype=I32, generator=g)
    cu = _cu(B, N)

    def run() -> torch.Tensor:
        return rejection_sample(draft, [N] * B, N, cu, q, logits, bonus, meta, backend=backend, uniform=uniform, noise=noise)

    with omp_threads(cores()):
        timed(benchmark, run, budget(request.config))
        out = run()
    # Bytes: softmax reads the logits and writes the probabilities, 1/noise reads and writes [B, V],
    # then K4 and K2 as their contracts count them.
    k4 = recovered_case(B, N, V, "f32")
    k2 = random_case(B, N, V)
    nbytes = 2 * t * V * 4 + 2 * B * V * 4 + k4.spec.bytes_moved(k4.args) + k2.spec.bytes_moved(k2.args)
    record(benchmark, k2, backend, "composition", cores() if backend == "cpu" else None, roofline, nbytes=nbytes)
    benchmark.extra_info["kernel"] = "rejection_sample"
    if backend != "reference":
        want = rejection_sample(draft, [N] * B, N, cu, q, logits, bonus, meta, backend="reference", uniform=uniform, noise=noise)
        assert_same("output", out, want, f"rejection_sample on {backend}")
        benchmark.extra_info["validated"] = True


def test_launch_overhead(benchmark, kernel):
    """What the Python launch wrapper adds to a call: ``kernel[grid](**args)`` on a one-request case
    minus the bare C++ entry point on the same buffers (the difference is bind, contract checks and
    buffer conversion)."""
    from cpu_impl import rejection as cpu

    case = {
        "rejection_greedy_sample_kernel": lambda: greedy_case(1, 4),
        "expand_kernel": lambda: expand_case(1, 4),
        "rejection_random_sample_kernel": lambda: random_case(1, 4, 64),
        "sample_recovered_tokens_kernel": lambda: recovered_case(1, 1, 64, "f32"),
    }[kernel]()
    k = getattr(cpu, kernel)
    args, grid = case.args, case.grid

    def wrapped() -> None:
        k[grid](**args)

    with omp_threads(1):
        timed(benchmark, wrapped, 0.5)
        wrapped_s = best_of(wrapped)
        c_s = best_of(bare_entry(k, args))
    info = benchmark.extra_info
    info.update(kernel=kernel, backend="cpu", mode="launch overhead", threads=1, B=1, N=case.sizes["N"], V=case.sizes["V"])
    info["us_wrapped"] = wrapped_s * 1e6
    info["us_c_entry"] = c_s * 1e6
    info["wrapper_us"] = (wrapped_s - c_s) * 1e6
    benchmark.group = "launch overhead"

