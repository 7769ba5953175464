"""GPU: the rest of Model Runner V2's sampling step, ours (compiled Triton) beside vLLM's own compiled
kernels at vLLM's launches: the logits processors (``_bias_kernel``, ``_penalties_kernel``,
``_bad_words_kernel`` as ``Sampler.apply_sampling_params`` launches them, built by
``compositions.sampler.sampling_param_launches``; ``_bincount_kernel`` as a new request's admission
launches it) and the logprob kernels (``_topk_log_softmax_kernel`` at 20 logprobs and the sampled
token, ``_ranks_kernel``). Vocabulary 151,936; 64 and 256 verification rows (four a request); every
request penalised, with bad words, a logit bias, min tokens and, for one in four, allowed ids.

    SPECDIFF_VLLM=PATH python benchmarks/gpu_sampling_step.py [--rows 64,256] [--out reports/gpu]

Kernels writing in place are timed from a fresh copy of what they write (the copy timed alone and
subtracted), with ``triton.testing.do_bench_cudagraph``. Ours must equal the oracle bit for bit;
vLLM's cells that differ are counted (their departures are in conformance/departures.py).
Exit status 1 on a wrong output of ours.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contracts  # noqa: E402
from compositions.sampler import MRV2SamplingStates, RequestParams, launch, sampling_param_launches  # noqa: E402
from conformance import engine  # noqa: E402
from conformance.backends import resolve_kernel  # noqa: E402
from conformance.runner import copy_args  # noqa: E402
from contracts.spec import tensors  # noqa: E402

V = 151_936
DRAFTS = 3


def step(rows: int) -> list[tuple[str, tuple[int, ...], dict[str, Any]]]:
    """The launches of one verification step of ``rows // 4`` requests, on CPU tensors."""
    g = torch.Generator().manual_seed(rows)
    n = rows // (DRAFTS + 1)
    states = MRV2SamplingStates(n, V, 1024)
    drafts = torch.randint(0, V, (n, DRAFTS), generator=g)
    for r in range(n):
        prompt = torch.randint(0, V, (512,), generator=g).tolist()
        out = torch.randint(0, V, (128,), generator=g).tolist()
        d = drafts[r].tolist()
        states.add_request(r, prompt, out, RequestParams(
            temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2, seed=r,
            bad_words=[[out[-1], d[0], 7], [d[0], d[1]], [11, 12, 13], [5]],
            logit_bias={int(t): 0.5 for t in torch.randint(0, V, (16,), generator=g)},
            allowed_token_ids=torch.randint(0, V, (64,), generator=g).tolist() if r % 4 == 0 else [],
            min_tokens=200 if r % 2 else 0, stop_token_ids=[2, 3]))
    slots = torch.arange(n, dtype=torch.int64)
    kernel, grid, args = states.bincount_launch(slots)
    launches = [(kernel, grid, copy_args(args, "cpu"))]
    states.apply_staged_writes(backend="reference")  # the prompt bits and output counts the penalties read
    logits = torch.randn(rows, V, generator=g) * 4
    mapping = torch.arange(n, dtype=torch.int32).repeat_interleave(DRAFTS + 1)
    local = torch.arange(DRAFTS + 1, dtype=torch.int32).repeat(n)
    tokens = torch.cat([torch.zeros(n, 1, dtype=torch.int64), drafts], 1).reshape(-1).to(torch.int32)
    pos = (640 + local).to(torch.int64)
    launches += sampling_param_launches(logits, states, mapping, slots.to(torch.int32), pos, tokens, local)
    launches = [launch_ for launch_ in launches if launch_[0] != "_temperature_kernel"]  # K36: benchmarks/gpu_sample.py
    ids = torch.cat([tokens.view(-1, 1).long().clamp(min=0), torch.topk(logits, 20).indices], 1)
    out = torch.empty(rows, ids.shape[1])
    launches.append(("_topk_log_softmax_kernel", (rows,), dict(
        output_ptr=out, logits_ptr=logits, logits_stride=logits.stride(0), topk_ids_ptr=ids, topk_ids_stride=ids.stride(0),
        topk=ids.shape[1], vocab_size=V, BLOCK_SIZE=1024, TOPK_BLOCK_SIZE=32)))
    launches.append(("_ranks_kernel", (rows,), dict(
        output_ptr=torch.empty(rows, dtype=torch.int64), logits_ptr=logits, logits_stride=logits.stride(0),
        token_ids_ptr=ids[:, 0].contiguous(), vocab_size=V, BLOCK_SIZE=8192)))
    return launches


def measure(kernel: str, grid: tuple[int, ...], args: dict[str, Any], theirs: Any, bench: Any) -> dict[str, Any]:
    spec = contracts.get(kernel)
    want = copy_args(args, "cpu")
    launch("reference", kernel, grid, **want)
    result: dict[str, Any] = {"kernel": kernel, "rows": grid[0]}
    for who, fn in (("ours", resolve_kernel("triton", spec)[1]), ("vllm", theirs)):
        a = copy_args(args, "cuda")
        outs = [(label, t) for label, p, t in tensors(spec, a) if p.is_output]
        pristine = [t.clone() for _, t in outs]

        def restore(outs_: list = outs, pristine_: list = pristine) -> None:
            for (_, t), p in zip(outs_, pristine_):
                t.copy_(p)

        fn[grid](**a)
        differ = 0
        expect = {label: t for label, _, t in tensors(spec, want)}
        for label, t in outs:
            got, w = t.cpu(), expect[label]
            same = (got == w) | ((got != got) & (w != w)) if got.is_floating_point() else got == w
            differ += int((~same).sum())
        result[f"{who}_cells_differing"] = differ
        copy_ms = bench(restore)
        result[f"{who}_ms"] = bench(lambda f=fn, a_=a, r=restore: (r(), f[grid](**a_))) - copy_ms
    result["ratio"] = result["vllm_ms"] / result["ours_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    from triton.testing import do_bench_cudagraph

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256")
    parser.add_argument("--out", default="reports/gpu")
    ns = parser.parse_args(argv)
    engine.use(engine.named() or "0.33.0")
    loader = engine.loader()
    results, ok = [], True
    for rows in (int(r) for r in ns.rows.split(",")):
        for kernel, grid, args in step(rows):
            r = measure(kernel, grid, args, loader.kernel(contracts.get(kernel).qualname), do_bench_cudagraph)
            ok = ok and r["ours_cells_differing"] == 0
            results.append(r)
            print(json.dumps(r), flush=True)
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}; vocabulary {V}; CUDA-graph ms, in-place copies subtracted",
             "", "| kernel | rows | ours | vLLM | vLLM / ours | cells of ours != oracle | cells of vLLM != oracle |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['rows']} | {r['ours_ms']:.4f} | {r['vllm_ms']:.4f} | {r['ratio']:.2f} | "
              f"{r['ours_cells_differing']} | {r['vllm_cells_differing']} |" for r in results]
    print("\n".join(lines))
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-sampling-step.md").write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
