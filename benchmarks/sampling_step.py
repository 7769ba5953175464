"""CPU: the sampling step's heavy kernels at vLLM's scale (vocabulary 151,936; 64 and 256 verification
rows, four a request), specdiff's C++ port beside the PyTorch code a CPU user runs today, vLLM 0.33.0's
V1 sampler (loaded from its sdist):

- penalties: the port's ``_penalties_kernel`` (the prompt bits and output counts built once per request
  by ``_bincount_kernel``, timed apart) against V1's ``apply_penalties`` path: its
  ``get_token_bin_counts_and_mask`` for prompt and output every step, ``apply_repetition_penalties_torch``
  and the frequency and presence subtractions (512 prompt and 128 output tokens a request, the rows'
  earlier drafts among the outputs);
- logprobs: the port's ``_topk_log_softmax_kernel`` (the sampled token and 20 top ids) and
  ``_ranks_kernel`` against V1's ``compute_logprobs`` (a full float32 ``log_softmax``), the gather of
  the same 21 ids and the rank count ``(logprobs >= token).sum(-1)`` (``batched_count_greater_than``'s
  body, eager: torch.compile's CPU build is not what a first call meets).

Each thread count runs in a process of its own (``OMP_NUM_THREADS``: the port and torch read it at start).

    SPECDIFF_VLLM=0.33.0 python benchmarks/sampling_step.py [--rows 64,256] [--threads 1,2] [--out reports/bench]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.topk_topp import median_ms, thread_runs, write_report  # noqa: E402

V = 151_936
DRAFTS = 3


def measure(rows: int, reps: int) -> list[dict[str, Any]]:
    import contracts
    from compositions.sampler import MRV2SamplingStates, RequestParams
    from conformance import engine
    from conformance.backends import resolve_kernel

    engine.use(engine.named() or "0.33.0")
    load = engine.loader().kernel
    bins = load("vllm.model_executor.layers.utils.get_token_bin_counts_and_mask")
    repetition = load("vllm._custom_ops.apply_repetition_penalties_torch")

    port = {k: resolve_kernel("cpu", contracts.get(k))[1]
            for k in ("_penalties_kernel", "_bincount_kernel", "_topk_log_softmax_kernel", "_ranks_kernel")}

    g = torch.Generator().manual_seed(rows)
    n = rows // (DRAFTS + 1)
    prompts = torch.randint(0, V, (n, 512), generator=g)
    outputs = torch.randint(0, V, (n, 128), generator=g)
    drafts = torch.randint(0, V, (n, DRAFTS), generator=g)
    states = MRV2SamplingStates(n, V, 1024)
    for r in range(n):
        states.add_request(r, prompts[r].tolist(), outputs[r].tolist(),
                           RequestParams(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.2))
    slots = torch.arange(n)
    _, bincount_grid, bincount_args = states.bincount_launch(slots)
    states.apply_staged_writes(backend="cpu")
    logits = torch.randn(rows, V, generator=g) * 4
    work = logits.clone()
    local = torch.arange(DRAFTS + 1, dtype=torch.int32).repeat(n)
    tokens = torch.cat([outputs[:, -1:], drafts], 1).reshape(-1).to(torch.int32)
    mapping = slots.to(torch.int32).repeat_interleave(DRAFTS + 1)
    penalties = dict(logits_ptr=work, logits_stride=V, expanded_idx_mapping_ptr=mapping, token_ids_ptr=tokens,
                     expanded_local_pos_ptr=local, repetition_penalty_ptr=states.repetition_penalty,
                     frequency_penalty_ptr=states.frequency_penalty, presence_penalty_ptr=states.presence_penalty,
                     prompt_bin_mask_ptr=states.prompt_bin_mask, prompt_bin_mask_stride=states.prompt_bin_mask.stride(0),
                     output_bin_counts_ptr=states.output_bin_counts, output_bin_counts_stride=V, vocab_size=V, BLOCK_SIZE=8192)
    # V1's rows: a request's prompt, and its output with the row's earlier drafts (V pads: counted nowhere).
    row_prompts = prompts.repeat_interleave(DRAFTS + 1, 0)
    row_outputs = torch.full((rows, 128 + DRAFTS), V, dtype=torch.int64)
    for r in range(rows):
        j = r % (DRAFTS + 1)
        row_outputs[r, : 128 + j] = torch.cat([outputs[r // (DRAFTS + 1)], drafts[r // (DRAFTS + 1), :j]])
    rep, freq, pres = (t.repeat_interleave(DRAFTS + 1) for t in
                       (states.repetition_penalty[:n], states.frequency_penalty[:n], states.presence_penalty[:n]))

    def v1_penalties() -> None:
        work.copy_(logits)
        _, prompt_mask = bins(row_prompts, V, rows)
        counts, output_mask = bins(row_outputs, V, rows)
        repetition(work, prompt_mask, output_mask, rep)
        work.sub_(freq.unsqueeze(1) * counts)
        work.sub_(pres.unsqueeze(1) * output_mask)

    def ours_penalties() -> None:
        work.copy_(logits)
        port["_penalties_kernel"][(rows, -(-V // 8192))](**penalties)

    ids = torch.cat([tokens.view(-1, 1).long(), torch.topk(logits, 20).indices], 1)
    sampled = ids[:, 0].contiguous()
    scores, ranks = torch.empty(rows, 21), torch.empty(rows, dtype=torch.int64)

    def v1_logprobs() -> None:
        lp = logits.log_softmax(dim=-1, dtype=torch.float32)
        lp.gather(-1, ids)
        (lp >= lp.gather(-1, ids[:, :1])).sum(-1)

    def ours_logprobs() -> None:
        port["_topk_log_softmax_kernel"][(rows,)](output_ptr=scores, logits_ptr=logits, logits_stride=V, topk_ids_ptr=ids,
                                                  topk_ids_stride=21, topk=21, vocab_size=V, BLOCK_SIZE=1024, TOPK_BLOCK_SIZE=32)
        port["_ranks_kernel"][(rows,)](output_ptr=ranks, logits_ptr=logits, logits_stride=V, token_ids_ptr=sampled,
                                       vocab_size=V, BLOCK_SIZE=8192)

    def ours_bincount() -> None:
        states.prompt_bin_mask.zero_(), states.output_bin_counts.zero_()
        port["_bincount_kernel"][bincount_grid](**bincount_args)

    copy_ms = median_ms(lambda: work.copy_(logits), False, reps)
    threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    out = []
    for what, ours, v1, less in (("penalties", ours_penalties, v1_penalties, copy_ms), ("logprobs", ours_logprobs, v1_logprobs, 0.0)):
        t_ours, t_v1 = median_ms(ours, False, reps) - less, median_ms(v1, False, reps) - less
        out.append({"step": what, "rows": rows, "threads": threads, "port_ms": t_ours, "pytorch_ms": t_v1})
    out.append({"step": "bincount (once a request)", "rows": n, "threads": threads,
                "port_ms": median_ms(ours_bincount, False, reps), "pytorch_ms": float("nan")})
    return out


def main(argv: list[str] | None = None) -> int:
    got = thread_runs(__file__, measure, __doc__, argv)
    if got is None:
        return 0
    ns, results = got
    lines = [f"CPU ({os.cpu_count()} cores), torch {torch.__version__}; vocabulary {V}; medians in ms (in-place copies subtracted)",
             "", "| step | rows | threads | V1's PyTorch | specdiff's port | port / PyTorch |", "|---|---|---|---|---|---|"]
    for r in results:
        ratio = "-" if r["pytorch_ms"] != r["pytorch_ms"] else f"{r['pytorch_ms'] / r['port_ms']:.1f}x faster"
        v1 = "-" if r["pytorch_ms"] != r["pytorch_ms"] else f"{r['pytorch_ms']:.2f}"
        lines.append(f"| {r['step']} | {r['rows']} | {r['threads']} | {v1} | {r['port_ms']:.2f} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    write_report(Path(ns.out), "sampling-step", table, {"rows": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
