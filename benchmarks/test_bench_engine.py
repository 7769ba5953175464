"""specdiff's C++ port beside the engine's own: every kernel vLLM's CPU platform overrides, timed
in one run, interleaved, on the same inputs.

For each kernel ``CpuPlatform.register_triton_kernel_overrides`` replaces (read from the vLLM
source, ``conformance/engine/cpu.py``), at B requests x 4 drafts (and K4 at 1 x 8) and at one
thread and every core, four ways of running it:

    specdiff          our launcher, ``kernel[grid](**args)``
    specdiff-plugin   our launcher behind vLLM's own ``KernelOverride``: what the engine runs once
                      ``specdiff.vllm_plugin`` registered it (vllm/triton_utils/dispatcher.py)
    vllm              vLLM's override: its dispatcher, its adapter (cpu_triton_utils.py) and its op
    vllm-bare         vLLM's C++ op alone, on the arguments its adapter handed it (converted once)

Before any time counts, our outputs are compared with the oracle (a difference fails the test)
and vLLM's with ours; where the engine differs (a catalogued defect, e.g. D2/D3's narrowed
float64), the result says so and the ratio is marked as not like for like. Times are the minima
of interleaved rounds (each round calls every variant once per iteration, so a busy machine slows
all of them alike). The ratio is vLLM's time over ours: above 1, specdiff is faster.

Needs a vLLM source: ``--vllm`` / ``SPECDIFF_VLLM`` (``nox -s bench`` passes 0.33.0, downloaded
and built once into SPECDIFF_CACHE); skips with the reason otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from harness import (
    Case,
    assert_same,
    budget,
    cores,
    evict_caches,
    full_sweep,
    omp_threads,
    poison,
    require_memory,
    run_oracle,
    snapshot,
)
from test_bench_eagle import prepare_inputs_case, prepare_next_token_case
from test_bench_rejection import VOCABS, expand_case, greedy_case, random_case, recovered_case

import contracts
from conformance.backends import BACKENDS
from contracts.slot_mapping import COMPUTE_SLOT_MAPPING

I32, I64 = torch.int32, torch.int64
V = VOCABS["152k"]
BLOCK = 16  # KV-cache block size
MAX_MODEL_LEN = 8192
BLOCKS = MAX_MODEL_LEN // BLOCK  # block-table columns
# K4 and K2 stream [T, V] probability rows: timed cold, as a decode step meets them.
COLD = {"sample_recovered_tokens_kernel", "rejection_random_sample_kernel"}


def _g(b: int) -> torch.Generator:
    return torch.Generator().manual_seed(b * 7919 + 17)


def _positions(g: torch.Generator, b: int, per_request: int) -> torch.Tensor:
    """Each request's tokens at consecutive positions from a random start, within the model length."""
    start = torch.randint(0, MAX_MODEL_LEN - per_request - 1, (b, 1), generator=g)
    return (start + torch.arange(per_request)).reshape(-1)


def _table(g: torch.Generator, rows: int) -> torch.Tensor:
    return torch.randint(0, 1 << 20, (rows, BLOCKS), dtype=I32, generator=g)


def step_case(b: int, n: int) -> Case:
    """K5 as eagle_step_update_slot_mapping_and_metadata calls it: one position per request."""
    g = _g(b)
    positions = _positions(g, b, 1)
    args = dict(positions_ptr=positions, block_table_ptr=_table(g, b), block_table_stride=BLOCKS,
                seq_lens_ptr=(positions + 1).to(I32), out_clamped_positions_ptr=torch.empty(b, dtype=I64),
                out_slot_mapping_ptr=torch.empty(b, dtype=I64), block_size=BLOCK, max_model_len=MAX_MODEL_LEN,
                n_blocks_per_req=BLOCKS, PAD_ID=-1, batch_size=b)
    return Case("eagle_step_slot_mapping_metadata_kernel", args, (b,), dict(B=b, N=n, V=0, dtype="i64"))


def slot_mapping_case(b: int, n: int) -> Case:
    """K10 on a decode batch of n + 1 tokens per request. max_num_tokens is the batch itself:
    vLLM's port never pads the tail (D6), so a longer buffer would not be like for like."""
    g = _g(b)
    qsl = (torch.arange(b + 1) * (n + 1)).to(I32)
    t = b * (n + 1)
    args = dict(num_tokens=t, max_num_tokens=t, query_start_loc_ptr=qsl, positions_ptr=_positions(g, b, n + 1),
                block_table_ptr=_table(g, b), block_table_stride=BLOCKS, slot_mapping_ptr=torch.empty(t, dtype=I64),
                KV_CACHE_BLOCK_SIZE=BLOCK, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1,
                BLOCK_SIZE=1024)
    return Case(COMPUTE_SLOT_MAPPING.name, args, COMPUTE_SLOT_MAPPING.grid(args), dict(B=b, N=n, V=0, dtype="i64"))


def copy_expand_case(b: int, n: int) -> Case:
    """K8 for EAGLE after verification: n + 1 target tokens per request, a random accepted prefix,
    ids shifted left, one new slot per request."""
    g = _g(b)
    w = n + 1
    qsl = (torch.arange(b + 1) * w).to(I32)
    accepted = torch.randint(0, w, (b,), generator=g, dtype=I32)
    n_in = b * w
    args = dict(
        target_token_ids_ptr=torch.randint(0, V, (n_in,), generator=g, dtype=I32), target_positions_ptr=_positions(g, b, w),
        next_token_ids_ptr=torch.randint(0, V, (b,), generator=g, dtype=I32),
        out_input_ids_ptr=torch.empty(n_in, dtype=I32), out_positions_ptr=torch.empty(n_in, dtype=I64),
        out_is_rejected_token_mask_ptr=torch.empty(n_in, dtype=torch.bool), out_is_masked_token_mask_ptr=torch.empty(n_in, dtype=torch.bool),
        out_new_token_indices_ptr=torch.empty(b, dtype=I32), out_hidden_state_mapping_ptr=torch.empty(n_in, dtype=I32),
        query_start_loc_ptr=qsl, query_end_loc_ptr=qsl[:-1] + accepted, padding_token_id=0, parallel_drafting_token_id=0,
        total_input_tokens=n_in, num_padding_slots_per_request=1, shift_input_ids=True,
        BLOCK_SIZE_TOKENS=1 << (w - 1).bit_length(),
    )
    spec = contracts.get("copy_and_expand_eagle_inputs_kernel")
    return Case(spec.name, args, spec.grid(args), dict(B=b, N=n, V=0, dtype="i32"))


def dflash_case(b: int, n: int) -> Case:
    """K9 for DFlash's first pass: n + 1 context tokens per request, n speculative tokens, no
    rejected counts (the padded mode is where vLLM's port reads the wrong position, D7)."""
    g = _g(b)
    w, q = n + 1, n + 1
    qsl = (torch.arange(b + 1) * w).to(I32)
    t = b * w
    args = dict(
        next_token_ids_ptr=torch.randint(0, V, (b,), generator=g, dtype=I32), target_positions_ptr=_positions(g, b, w),
        out_input_ids_ptr=torch.empty(b * q, dtype=I32), out_context_positions_ptr=torch.empty(t, dtype=I64),
        out_query_positions_ptr=torch.empty(b * q, dtype=I64), out_context_slot_mapping_ptr=torch.empty(t, dtype=I64),
        out_query_slot_mapping_ptr=torch.empty(b * q, dtype=I64), out_token_indices_ptr=torch.empty(b * n, dtype=I32),
        block_table_ptr=_table(g, b), block_table_stride=BLOCKS, query_start_loc_ptr=qsl, num_rejected_tokens_ptr=0,
        parallel_drafting_token_id=V - 1, block_size=BLOCK, num_query_per_req=q, num_speculative_tokens=n, total_input_tokens=t,
        BLOCK_SIZE=min(256, 1 << (w + q - 1).bit_length()), HAS_NUM_REJECTED=False,
    )
    spec = contracts.get("copy_and_expand_dflash_inputs_kernel")
    return Case(spec.name, args, spec.grid(args), dict(B=b, N=n, V=0, dtype="i32"))


CASES: dict[str, Callable[[int, int], Case]] = {
    "rejection_greedy_sample_kernel": lambda b, n: greedy_case(b, n),
    "rejection_random_sample_kernel": lambda b, n: random_case(b, n, V),
    "expand_kernel": expand_case,
    "sample_recovered_tokens_kernel": lambda b, n: recovered_case(b, n, V, "f32"),
    "eagle_step_slot_mapping_metadata_kernel": step_case,
    "eagle_prepare_inputs_padded_kernel": prepare_inputs_case,
    "eagle_prepare_next_token_padded_kernel": prepare_next_token_case,
    "copy_and_expand_eagle_inputs_kernel": copy_expand_case,
    "copy_and_expand_dflash_inputs_kernel": dflash_case,
    COMPUTE_SLOT_MAPPING.name: slot_mapping_case,
}


def _sizes(kernel: str, full: bool) -> list[tuple[int, int, str]]:
    """(B, N, inv_q dtype) per kernel: 1, 64 and 256 requests x 4 drafts; K4 also 1 x 8 and f64."""
    sizes = [(b, 4, "f32") for b in ((1, 8, 64, 256, 1024) if full else (1, 64, 256))]
    if kernel == "sample_recovered_tokens_kernel":
        sizes += [(1, 8, "f32"), (64, 4, "f64"), (256, 4, "f64")]
    return sizes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ != "test_engine":
        return
    full = full_sweep(metafunc.config)
    threads = sorted({1, cores()})
    params = [
        pytest.param(k, b, n, dt, th, id=f"{k}-B{b}-N{n}-{dt}-t{th}")
        for k in CASES
        for (b, n, dt) in _sizes(k, full)
        for th in threads
    ]
    metafunc.parametrize("kernel,B,N,dtype,threads", params)


# -- the engine's variants ---------------------------------------------------------------------------------
def engine() -> Any:
    """vLLM's CPU overrides (conformance.engine), or a skip naming why they cannot run here."""
    from conformance import engine as eng

    why = BACKENDS["vllm-cpu"].unavailable()
    if why:
        pytest.skip(f"no engine baseline: {why} (nox -s bench passes --vllm 0.33.0)")
    return eng


def captured_op(override: Any, launch: Callable[[], Any], adapters: Any) -> Callable[[], Any]:
    """vLLM's C++ op alone: the ``torch.ops._C`` call its adapter makes during ``launch``, replayed
    on the arguments the adapter built (its int64 copies included), without the adapter."""
    seen: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    class Namespace:
        def __init__(self, real: Any) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            op = getattr(self.real, name)

            def record(*a: Any, **k: Any) -> Any:
                seen.append((op, a, k))
                return op(*a, **k)

            return record

    class Ops:
        def __getattr__(self, name: str) -> Any:
            return Namespace(getattr(torch.ops, name))

    class Torch:
        ops = Ops()

        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

    real = adapters.__dict__["torch"]
    adapters.__dict__["torch"] = Torch()
    try:
        launch()
    finally:
        adapters.__dict__["torch"] = real
    if len(seen) != 1:
        raise AssertionError(f"{override.__name__}: expected one torch.ops._C call from vLLM's adapter, saw {len(seen)}")
    op, a, k = seen[0]
    return lambda: op(*a, **k)


def interleaved(variants: dict[str, Callable[[], Any]], budget_s: float, cold: bool) -> dict[str, float]:
    """Seconds per call of each variant: the minimum over rounds in which every variant runs in
    turn (``cold``: one call a round, caches evicted before it; warm: a batch of calls sized to
    about 0.2 ms)."""
    once = {}
    for name, fn in variants.items():
        fn()
        t0 = time.perf_counter()
        fn()
        once[name] = max(time.perf_counter() - t0, 1e-7)
    per_round = sum(once.values())
    iterations = 1 if cold else max(1, min(1000, int(2e-4 / max(once.values()))))
    rounds = int(max(3, min(200, budget_s / (per_round * iterations + (0.02 * len(variants) if cold else 0)))))
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            if cold:
                evict_caches()
            t0 = time.perf_counter()
            for _ in range(iterations):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / iterations)
    return best


def _equal(spec: Any, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Outputs whose bits differ between two runs of the same launch."""
    from conformance.runner import bits

    return [p.name for p in spec.outputs if isinstance(want.get(p.name), torch.Tensor)
            and not torch.equal(bits(got[p.name]), bits(want[p.name]))]


def test_engine(benchmark, request, roofline, kernel, B, N, dtype, threads):
    eng = engine()
    if kernel in ("sample_recovered_tokens_kernel", "rejection_random_sample_kernel"):
        require_memory(3 * B * N * V * 4 + B * V * 8, f"[{B * N}, {V}] probability rows")
    case = recovered_case(B, N, V, dtype) if kernel == "sample_recovered_tokens_kernel" else CASES[kernel](B, N)
    spec = case.spec
    ours = BACKENDS["cpu"].resolve(spec)
    theirs = BACKENDS["vllm-cpu"].resolve(spec)
    if theirs is None:
        pytest.skip(f"vLLM's CPU platform registers no override of {kernel}")
    plugin = eng.overrides().dispatcher.KernelOverride(eng.loader().kernel(spec.qualname), ours)

    # Correctness first: ours against the oracle (fails the test), vLLM's against ours (reported).
    poison(case)
    initial = snapshot(case.args, spec)
    want = run_oracle(case, initial)
    mine = {**case.args, **{n: t.clone() for n, t in initial.items()}}
    ours[case.grid](**mine)
    for name in initial:
        assert_same(name, mine[name], want[name], f"{kernel} on cpu")
    engine_args = {**case.args, **{n: t.clone() for n, t in initial.items()}}
    theirs[case.grid](**engine_args)
    differs = _equal(spec, engine_args, mine)

    args = case.args
    variants = {
        "specdiff": lambda: ours[case.grid](**args),
        "specdiff-plugin": lambda: plugin[case.grid](**args),
        "vllm": lambda: theirs[case.grid](**args),
    }
    variants["vllm-bare"] = captured_op(theirs, variants["vllm"], eng.overrides().adapters)
    cold = kernel in COLD
    with omp_threads(threads):
        best = interleaved(variants, 3 * budget(request.config), cold)
        # pytest-benchmark's own record of ours (the JSON's stats), from the same state.
        benchmark.pedantic(variants["specdiff"], setup=evict_caches if cold else None, rounds=3, iterations=1)
    info = benchmark.extra_info
    info.update(kernel=kernel, backend="cpu", mode="engine", threads=threads, B=B, N=N, V=V if kernel in COLD else 0, dtype=dtype,
                cache="cold" if cold else "warm", validated=True)
    info["us"] = {name: round(s * 1e6, 3) for name, s in best.items()}
    info["vs_engine"] = best["vllm"] / best["specdiff"]
    info["vs_engine_plugin"] = best["vllm"] / best["specdiff-plugin"]
    info["vs_engine_bare"] = best["vllm-bare"] / best["specdiff"]
    info["engine_equal"] = not differs
    if differs:
        info["engine_differs"] = differs
    if kernel == "sample_recovered_tokens_kernel":  # the one streaming kernel (K2 gathers: a latency figure)
        nbytes = spec.bytes_moved(args)
        info["bytes_moved"] = nbytes
        info["gbps"] = nbytes / best["specdiff"] / 1e9
        info["roofline_read_gbps"] = roofline.read_gbps
        info["of_read_roofline"] = info["gbps"] / roofline.read_gbps
