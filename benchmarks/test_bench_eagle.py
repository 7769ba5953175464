"""Benchmarks of the EAGLE input-preparation kernels (docs/spec.md §2.6, §2.7): small per-request kernels
whose cost is the launch, measured against the 10x-over-the-oracle target at 256 requests.

    test_small  eagle_prepare_inputs_padded_kernel (K6) and eagle_prepare_next_token_padded_kernel
                (K7), B requests with N drafts each (the rejection output [B, N+1] as K7's input)
"""

from __future__ import annotations

import pytest
import torch
from harness import Case, backends_for, bench_kernel, full_sweep, gate_mark

REQUESTS = (1, 8, 64, 256, 1024)
DRAFTS = (1, 4, 8)
KERNELS = ("eagle_prepare_inputs_padded_kernel", "eagle_prepare_next_token_padded_kernel")
I32 = torch.int32
VOCAB = 151936


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function.__name__ != "test_small":
        return
    sizes = [(b, n) for b in REQUESTS for n in DRAFTS] if full_sweep(metafunc.config) else [(256, 4)]
    params = [
        pytest.param(k, b, n, be, id=f"{k}-{be}-B{b}-N{n}", marks=gate_mark(be))
        for k in KERNELS
        for (b, n) in sizes
        for be in backends_for(k)
    ]
    metafunc.parametrize("kernel,B,N,backend", params)


def _g(b: int, n: int) -> torch.Generator:
    return torch.Generator().manual_seed(b * 7919 + n)


def prepare_inputs_case(b: int, n: int) -> Case:
    """A decode batch: N drafts per request, N + 1 target tokens each, 0..N+1 valid samples."""
    g = _g(b, n)
    cu = (torch.arange(1, b + 1) * n).to(I32)
    valid = torch.randint(0, n + 2, (b,), dtype=I32, generator=g)
    qsl = (torch.arange(0, b + 1) * (n + 1)).to(I32)
    args = dict(cu_num_draft_tokens_ptr=cu, valid_sampled_tokens_count_ptr=valid, query_start_loc_gpu_ptr=qsl,
                token_indices_to_sample_ptr=torch.empty(b, dtype=I32), num_rejected_tokens_gpu_ptr=torch.empty(b, dtype=I32),
                num_reqs=b)
    return Case("eagle_prepare_inputs_padded_kernel", args, (b,), dict(B=b, N=n, V=0, dtype="i32"))


def prepare_next_token_case(b: int, n: int) -> Case:
    """The rejection output [B, N+1]: an accepted prefix, then -1; a few discarded requests."""
    g = _g(b, n)
    w = n + 1
    sampled = torch.randint(0, VOCAB, (b, w), dtype=I32, generator=g)
    accepted = torch.randint(1, w + 1, (b, 1), generator=g)
    sampled[torch.arange(w).expand(b, w) >= accepted] = -1
    args = dict(sampled_token_ids_ptr=sampled, discard_request_mask_ptr=torch.rand(b, generator=g) < 0.05,
                backup_next_token_ids_ptr=torch.randint(0, VOCAB, (b,), dtype=I32, generator=g),
                next_token_ids_ptr=torch.empty(b, dtype=I32), valid_sampled_tokens_count_ptr=torch.empty(b, dtype=I32),
                vocab_size=VOCAB, num_sampled_tokens_per_req=w, num_reqs=b, stride_sampled_token_ids=w,
                BLOCK_SIZE_TOKENS=1 << (w - 1).bit_length())
    return Case("eagle_prepare_next_token_padded_kernel", args, (b,), dict(B=b, N=n, V=0, dtype="i32"))


def test_small(benchmark, request, roofline, kernel, B, N, backend):
    case = prepare_inputs_case(B, N) if kernel == KERNELS[0] else prepare_next_token_case(B, N)
    bench_kernel(benchmark, request.config, case, backend, roofline)
