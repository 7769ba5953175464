"""Benchmarks of Model Runner V2's rejection sampler (docs/mrv2.md) on the CPU.

A vLLM user on a CPU has no MRV2 at all: vLLM falls back to the V1 sampler. So the C++ port of the
whole MRV2 ``rejection_sample`` is timed against the oracle and against the V1 path on the same
batch (``B`` requests x 4 drafts, all random, vocabulary 151,936, target and draft logits), at one
thread and at every core; and the three vocabulary-wide kernels (K13 logits statistics, K15
residual mass, K17 resample) on their own, cold, against this run's read roofline.

    test_mrv2_rejection_sample   the composition: cpu (1 and all threads), V1 on cpu, and the oracle
                                 (timed at 64 requests only)
    test_mrv2_vocabulary_kernels K13, K15, K17 on the composition's own intermediate inputs

The oracle runs once per batch and mode (``oracle``): every validation and every kernel's captured
inputs read that one run. At 256 requests one oracle call takes minutes on 2 cores; the full sweep
used to make seven of them there, and three more at 64 requests, because the kernels' cases
alternated batch sizes and each check called the oracle again.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from harness import (
    Case,
    Launch,
    assert_same,
    budget,
    capture_launches,
    cores,
    full_sweep,
    omp_threads,
    record,
    require_memory,
    timed,
    timed_here,
)

import compositions.sampler as compositions
from compositions.sampler import SamplingMetadata, mrv2_rejection_sample, rejection_sample

V = 151936
N = 4
VOCAB_KERNELS = ("_compute_local_logits_stats_kernel", "_compute_local_residual_mass_kernel", "_resample_kernel")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    # 256 requests only in the full sweep: there one oracle call takes minutes on 2 cores. The
    # oracle is timed at 64 only (beside the engine it is a footnote), and every list runs a batch
    # size through before the next, so each batch is drawn, and the oracle run, once.
    sizes = (64, 256) if full_sweep(metafunc.config) else (64,)
    if name == "test_mrv2_rejection_sample":
        params = [pytest.param(b, mode, be, th, id=f"{be}-{mode}-B{b}-N{N}-V{V}-t{th}")
                  for b in sizes for mode in ("standard", "block")
                  for be, th in (("cpu", 1), ("cpu", cores()), ("v1-cpu", cores()), ("reference", cores()))
                  if not (be == "v1-cpu" and mode == "block") and timed_here(be, b, (64,))]
        metafunc.parametrize("B,mode,backend,threads", params)
    elif name == "test_mrv2_vocabulary_kernels":
        params = [pytest.param(k, b, th, id=f"{k}-B{b}-N{N}-V{V}-t{th}")
                  for b in sizes for k in VOCAB_KERNELS for th in sorted({1, cores()})]
        metafunc.parametrize("kernel,B,threads", params)


_BATCHES: dict[int, dict[str, Any]] = {}


def batch(b: int) -> dict[str, Any]:
    """``b`` requests with N drafts each, every row its own logits: target N(0, 3), draft logits the
    target plus N(0, 1) (so drafts are often accepted, sometimes not), drafts drawn from the target's
    top tokens, temperature 1, one slot and seed per request. One batch kept at a time."""
    if b not in _BATCHES:
        _BATCHES.clear()
        rows = b * (N + 1)
        require_memory(3 * rows * V * 4, f"[{rows}, {V}] logits")
        g = torch.Generator().manual_seed(b)
        with omp_threads(cores()):
            target = torch.randn(rows, V, generator=g) * 3
            draft = (target.view(b, N + 1, V)[:, :N] + torch.randn(b, N, V, generator=g)).contiguous()
        tokens = target.topk(4, dim=1).indices[torch.arange(rows), torch.randint(0, 4, (rows,), generator=g)].to(torch.int32)
        _BATCHES[b] = dict(
            target_logits=target, draft_logits=draft, draft_sampled=tokens,
            cu_num_logits=torch.arange(0, rows + 1, N + 1, dtype=torch.int32),
            pos=torch.randint(0, 2**40, (rows,), generator=g), idx_mapping=torch.arange(b),
            expanded_idx_mapping=torch.arange(b).repeat_interleave(N + 1),
            expanded_local_pos=torch.arange(N + 1, dtype=torch.int32).repeat(b), temperature=torch.ones(b),
            seed=torch.randint(-(2**63), 2**63 - 1, (b,), generator=g), num_speculative_steps=N)
    return _BATCHES[b]


_ORACLE: dict[tuple[int, str], tuple[Any, dict[str, Launch]]] = {}


@pytest.fixture(scope="module", autouse=True)
def _free_batches() -> Any:
    # At 256 requests the batch and the oracle's captured launches hold about 10 GB: the next
    # module's large K4 cases were killed for memory (the full sweep on this 24 GB machine).
    yield
    _BATCHES.clear()
    _ORACLE.clear()


def oracle(b: int, mode: str) -> tuple[Any, dict[str, Launch]]:
    """The oracle's ``(sampled, num_sampled)`` on ``batch(b)`` in ``mode``, and its launches by
    kernel (captured under block verification only, where K13, K15 and K17 all run). One run per
    batch size and mode, kept until the module ends (the kernels' cases come back to 64 requests
    after 256: at 64 the launches hold about 2.5 GB)."""
    if (b, mode) not in _ORACLE:
        x = batch(b)
        result: list[Any] = []

        def run() -> None:
            result.append(mrv2_rejection_sample(**x, use_block_verification=mode == "block", backend="reference"))

        launches: list[Launch] = []
        with omp_threads(cores()):
            if mode == "block":
                launches = capture_launches(run)
            else:
                run()
        _ORACLE[(b, mode)] = (result[0], {launch.kernel: launch for launch in launches})
    return _ORACLE[(b, mode)]


def v1_inputs(x: dict[str, Any], b: int) -> tuple[Any, ...]:
    """The same batch as the V1 sampler takes it: the draft rows' target logits, the drafter's
    probabilities (its softmax, computed before the sampler as the drafter does), bonus tokens."""
    rows = x["target_logits"].view(b, N + 1, V)
    drafts = x["draft_sampled"].view(b, N + 1)[:, 1:].reshape(-1).contiguous()
    probs = torch.softmax(x["draft_logits"].view(b * N, V), dim=-1)
    meta = SamplingMetadata(temperature=x["temperature"], all_greedy=False, all_random=True)
    bonus = torch.zeros(b, 1, dtype=torch.int32)
    return drafts, [N] * b, N, torch.arange(1, b + 1, dtype=torch.int32) * N, probs, rows[:, :N].reshape(b * N, V).contiguous(), bonus, meta


def vocab_bytes(x: dict[str, Any], b: int, mode: str) -> int:
    """Logit bytes the vocabulary-wide kernels must read: K13 every draft row's target and draft
    logits, K15 (block verification) those of the rows after a request's first, K17 one target
    row per request plus the rejected draft's row (counted for every request: an upper bound)."""
    per_row = V * (4 + x["draft_logits"].element_size())
    k15 = b * (N - 1) * per_row if mode == "block" else 0
    return b * N * per_row + k15 + b * per_row


def test_mrv2_rejection_sample(benchmark, request, roofline, B, mode, backend, threads):
    x = batch(B)
    block = mode == "block"
    if backend == "v1-cpu":
        args = v1_inputs(x, B)

        def run() -> Any:
            return rejection_sample(*args, backend="cpu")
    else:
        def run() -> Any:
            return mrv2_rejection_sample(**x, use_block_verification=block, backend=backend)

    with omp_threads(threads):
        timed(benchmark, run, budget(request.config))
        out = run()
    case = Case("_rejection_kernel", {}, (B,), dict(B=B, N=N, V=V, verification=mode))
    record(benchmark, case, backend, "composition", threads, roofline, nbytes=vocab_bytes(x, B, mode))
    benchmark.extra_info["kernel"] = "mrv2_rejection_sample" if backend != "v1-cpu" else "v1_rejection_sample"
    if backend == "cpu":
        # Cells of `sampled` past `num_sampled` are unspecified; the rest must be the oracle's.
        (sampled, num_sampled), (want_sampled, want_num) = out, oracle(B, mode)[0]
        assert_same("num_sampled", num_sampled, want_num, "mrv2_rejection_sample on cpu")
        emitted = torch.arange(N + 1)[None, :] < want_num.long()[:, None]
        assert_same("sampled", sampled[emitted], want_sampled[emitted], "mrv2_rejection_sample on cpu")
        benchmark.extra_info["validated"] = True


def test_mrv2_vocabulary_kernels(benchmark, request, roofline, kernel, B, threads):
    launch = oracle(B, "block")[1][kernel]
    grid, args, want = launch.grid, launch.before, launch.outputs
    outputs = list(want)
    mine = dict(args)

    def run() -> None:
        compositions.launch("cpu", kernel, grid, **mine)

    with omp_threads(threads):
        for n in outputs:
            mine[n] = args[n].clone()
        timed(benchmark, run, budget(request.config), cold=True)
    for n in outputs:
        assert_same(n, mine[n], want[n], f"{kernel} on cpu")
    if kernel == "_compute_local_logits_stats_kernel":
        nbytes = B * N * V * 8
    elif kernel == "_compute_local_residual_mass_kernel":
        nbytes = B * (N - 1) * V * 8
    else:
        steps, drafts = args["rejected_step_ptr"], N
        nbytes = int(B * V * 4 + (steps < drafts).sum() * V * 4)
    case = Case(kernel, args, grid, dict(B=B, N=N, V=V))
    record(benchmark, case, "cpu", "cpu", threads, roofline, nbytes=nbytes, bandwidth_bound=True, cold=True)
    benchmark.extra_info["validated"] = True
