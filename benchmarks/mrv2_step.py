"""Model Runner V2's step kernels (the batch state K22-K28, the EAGLE/MTP drafter K29-K31, the block
tables K32-K33) at a step's real sizes: ``B`` requests, one in eight a 256-token prefill chunk, the
rest verifying 4 drafts; 1.25 B request states, max_model_len 4096, vocabulary 151,936 (the
penalties' output counts), hidden size 4096 in bfloat16, two KV-cache groups of 16-token blocks
(one a 1024-token sliding window).

    python benchmarks/mrv2_step.py --device cpu [--requests 64,256]     the C++ port, 1 and all threads
    SPECDIFF_VLLM=PATH python benchmarks/mrv2_step.py --device cuda     our compiled Triton and vLLM's

On the CPU the port is timed alone: no engine runs these kernels on a CPU (vLLM's CPU platform runs
Model Runner V1), so there is nothing of vLLM's to put beside it. On a GPU, ours and vLLM's own
compiled kernels run on the same inputs in one process, each launch replayed from a CUDA graph
(``triton.testing.do_bench_cudagraph`` medians: a Python launch costs about as much as these kernels
take, so ``do_bench`` would time the launch). Every
backend's outputs are checked against the C++ port's, which conformance holds to the oracle: ours
must agree bit for bit, and so must vLLM's (these kernels have no departures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import omp_threads  # noqa: E402

import contracts  # noqa: E402
from conformance.backend import addressed  # noqa: E402
from conformance.backends import resolve_kernel  # noqa: E402
from conformance.runner import bits, copy_args  # noqa: E402
from contracts.spec import Role, Table, tensors  # noqa: E402

I32, I64 = torch.int32, torch.int64
K, MAX_MODEL_LEN, VOCAB, HIDDEN, CHUNK = 4, 4096, 151936, 4096, 256


def step_cases(b: int) -> dict[str, dict[str, Any]]:
    """Each step kernel's arguments for one step of ``b`` requests (CPU tensors)."""
    g = torch.Generator().manual_seed(b)
    states = b + b // 4
    idx = torch.randperm(states, generator=g)[:b]
    prefill_rows = torch.arange(b) % 8 == 3
    query = torch.where(prefill_rows, CHUNK, K + 1)
    logits = torch.where(prefill_rows, 1, K + 1)
    qsl = torch.cat([torch.zeros(1, dtype=I64), query.cumsum(0)])
    cu = torch.cat([torch.zeros(1, dtype=I64), logits.cumsum(0)])
    tokens = int(qsl[-1])
    sampled = torch.where(prefill_rows, 0, torch.randint(1, K + 2, (b,), generator=g))
    rejected = torch.where(prefill_rows, 0, logits - sampled)
    total = torch.randint(1000, 3000, (states,), generator=g)
    computed = total.clone()
    prefill = torch.randint(100, 900, (states,), generator=g)
    # A prefill row's state: a prompt of 2048, 512 computed; its chunk ends before the prompt does.
    computed[idx[prefill_rows]] = 512
    prefill[idx[prefill_rows]] = 2048
    seq = computed[idx] + query
    history = torch.randint(0, VOCAB, (states, MAX_MODEL_LEN), generator=g, dtype=I32)
    draft_table = torch.randint(0, VOCAB, (states, K), generator=g)
    step_tokens = torch.randint(0, VOCAB, (b, K + 1), generator=g)
    bins = torch.randint(0, 3, (states, VOCAB), generator=g, dtype=I32)
    next_prefill = torch.randint(0, VOCAB, (2, states), generator=g, dtype=I32)
    i32 = lambda t: t.to(I32)  # noqa: E731
    cases: dict[str, dict[str, Any]] = {}
    cases["input_batch._prepare_prefill_inputs_kernel"] = dict(
        input_ids_ptr=torch.zeros(tokens, dtype=I32), next_prefill_tokens_ptr=next_prefill.clone(), next_prefill_tokens_stride=states,
        num_lookahead=2, idx_mapping_ptr=idx, query_start_loc_ptr=i32(qsl), all_token_ids_ptr=history, all_token_ids_stride=MAX_MODEL_LEN,
        prefill_lens_ptr=i32(prefill), num_computed_tokens_ptr=i32(computed), BLOCK_SIZE=1024, LOOKAHEAD_BLOCK=2)
    cases["_prepare_pos_seq_lens_kernel"] = dict(
        pos_ptr=torch.zeros(tokens, dtype=I64), seq_lens_ptr=torch.zeros(states, dtype=I32), idx_mapping_ptr=idx,
        query_start_loc_ptr=i32(qsl), num_computed_tokens_ptr=i32(computed), max_num_reqs=states, BLOCK_SIZE=1024)
    cases["_combine_sampled_and_draft_tokens_kernel"] = dict(
        input_ids_ptr=torch.randint(0, VOCAB, (tokens,), generator=g, dtype=I32), idx_mapping_ptr=idx,
        last_sampled_tokens_ptr=torch.randint(0, VOCAB, (states, 1), generator=g), query_start_loc_ptr=i32(qsl), seq_lens_ptr=i32(seq),
        prefill_len_ptr=i32(prefill), draft_tokens_ptr=draft_table, draft_tokens_stride=K, cu_num_logits_ptr=i32(cu),
        logits_indices_ptr=torch.zeros(int(cu[-1]), dtype=I64), BLOCK_SIZE=8, NUM_NEW_SAMPLED_TOKENS=1)
    cases["_get_num_sampled_and_rejected_kernel"] = dict(
        num_sampled_ptr=i32(torch.where(prefill_rows, 1, sampled)), num_rejected_ptr=torch.zeros(b, dtype=I32), seq_lens_ptr=i32(seq),
        cu_num_logits_ptr=i32(cu), idx_mapping_ptr=idx, prefill_len_ptr=i32(prefill))
    cases["_post_update_kernel"] = dict(
        idx_mapping_ptr=idx, num_computed_tokens_ptr=i32(computed), last_sampled_tokens_ptr=torch.zeros((states, 1), dtype=I64),
        output_bin_counts_ptr=bins, output_bin_counts_stride=VOCAB, sampled_tokens_ptr=step_tokens, sampled_tokens_stride=K + 1,
        num_sampled_ptr=i32(sampled), num_rejected_ptr=i32(rejected), query_start_loc_ptr=i32(qsl), all_token_ids_ptr=history.clone(),
        all_token_ids_stride=MAX_MODEL_LEN, total_len_ptr=i32(total), draft_tokens_ptr=None, draft_tokens_out_ptr=None, num_draft_tokens=0)
    cases["_post_update_num_computed_tokens_kernel"] = dict(
        idx_mapping_ptr=idx, num_computed_tokens_ptr=i32(computed), query_start_loc_ptr=i32(qsl))
    cases["_expand_idx_mapping_kernel"] = dict(
        idx_mapping_ptr=idx, expanded_idx_mapping_ptr=torch.zeros(int(cu[-1]), dtype=I64),
        expanded_local_pos_ptr=torch.zeros(int(cu[-1]), dtype=I32), cu_num_logits_ptr=i32(cu), BLOCK_SIZE=8)
    positions = torch.randint(0, 4000, (tokens,), generator=g)
    cases["target_dependent_ar._prepare_prefill_inputs_kernel"] = dict(
        last_token_indices_ptr=torch.zeros(states, dtype=I64), draft_current_step_ptr=torch.tensor(3),
        draft_input_ids_ptr=torch.zeros(tokens, dtype=I32), draft_positions_ptr=torch.zeros(tokens, dtype=I64),
        draft_query_start_loc_ptr=torch.zeros(states + 1, dtype=I32), draft_seq_lens_ptr=torch.zeros(states, dtype=I32),
        target_input_ids_ptr=torch.randint(0, VOCAB, (tokens,), generator=g, dtype=I32), target_positions_ptr=positions,
        idx_mapping_ptr=idx, last_sampled_ptr=torch.randint(0, VOCAB, (states, 1), generator=g), next_prefill_tokens_ptr=next_prefill,
        num_sampled_ptr=i32(sampled), num_rejected_ptr=i32(rejected), query_start_loc_ptr=i32(qsl), seq_lens_ptr=i32(seq),
        max_num_reqs=states, BLOCK_SIZE=1024)
    drafts = torch.randint(0, VOCAB, (b, K), generator=g)
    cases["_prepare_decode_inputs_kernel"] = dict(
        draft_tokens_ptr=drafts[:, 0], draft_tokens_stride=K, target_seq_lens_ptr=i32(seq), num_rejected_ptr=i32(rejected),
        input_ids_ptr=torch.zeros(tokens, dtype=I32), positions_ptr=positions[:b].clone(), sample_src_positions_ptr=positions[:b] + 1,
        query_start_loc_ptr=torch.zeros(states + 1, dtype=I32), seq_lens_ptr=torch.zeros(states, dtype=I32),
        max_model_len=MAX_MODEL_LEN, max_num_reqs=states, BLOCK_SIZE=1024, ADVANCE_DRAFT_POSITIONS=True)
    hidden = torch.randn((tokens, HIDDEN), generator=g).to(torch.bfloat16)
    cases["_update_draft_inputs_kernel"] = dict(
        output_draft_tokens_ptr=torch.zeros((states, K), dtype=I64), output_draft_tokens_stride=K,
        next_input_hidden_states_ptr=torch.zeros((tokens, HIDDEN), dtype=torch.bfloat16), next_input_hidden_states_stride=HIDDEN,
        input_ids_ptr=torch.zeros(tokens, dtype=I32), positions_ptr=positions[:b].clone(), sample_src_positions_ptr=positions[:b] + 1,
        seq_lens_ptr=i32(seq), draft_tokens_ptr=drafts[:, 1].contiguous(), current_draft_step_ptr=torch.tensor(1), hidden_states_ptr=hidden,
        hidden_states_stride=HIDDEN, hidden_size=HIDDEN, max_model_len=MAX_MODEL_LEN, num_speculative_steps=K, BLOCK_SIZE=1024,
        ADVANCE_DRAFT_POSITIONS=True)
    # Two KV-cache groups of 16-token blocks (the second a 1024-token sliding window); each request
    # holds the blocks of its positions and drafts; every token's position is consecutive in its row.
    widths = [MAX_MODEL_LEN // 16] * 2
    tables = Table(torch.randint(1, 2**20, (states, w), generator=g, dtype=I32) for w in widths)
    held = torch.stack([((computed + CHUNK + K + 15) // 16).clamp_max(w) for w in widths]).to(I32)
    row_of = torch.repeat_interleave(torch.arange(b), query)
    step_positions = computed[idx][row_of] + torch.arange(tokens) - qsl[row_of]
    cases["_gather_block_tables_kernel"] = dict(
        batch_idx_to_req_idx=idx, src_block_table_ptrs=tables, dst_block_table_ptrs=Table(torch.zeros_like(t) for t in tables),
        block_table_strides=torch.tensor(widths), num_blocks_ptr=held, num_blocks_stride=states, num_reqs=b,
        num_computed_tokens_ptr=i32(computed), sliding_window_reach_ptr=torch.tensor([0, 1024], dtype=I32),
        block_sizes_ptr=torch.tensor([16, 16], dtype=I32), MASK_SLIDING_WINDOW=True, BLOCK_SIZE=1024)
    cases["_compute_slot_mappings_kernel"] = dict(
        max_num_tokens=tokens, idx_mapping=idx, query_start_loc=i32(qsl), pos=step_positions, block_table_ptrs=tables,
        block_table_strides=torch.tensor(widths), block_sizes=torch.tensor([16, 16], dtype=I32),
        slot_mapping_enabled=torch.ones(2, dtype=torch.bool), dcp_sharded=torch.zeros(2, dtype=torch.bool),
        slot_mappings_ptr=torch.zeros((2, tokens), dtype=I64), slot_mappings_stride=tokens, cp_rank=0, CP_SIZE=1,
        CP_INTERLEAVE=1, PAD_ID=-1, TRITON_BLOCK_SIZE=1024)
    return cases


def _outputs(kernel: str, args: dict[str, Any]) -> dict[str, torch.Tensor]:
    spec = contracts.get(kernel)
    return {label: t.cpu() for label, p, t in tensors(spec, args) if p.role in (Role.OUT, Role.INOUT)}


def _launcher(backend: str, kernel: str, args: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    spec = contracts.get(kernel)
    be, k = resolve_kernel(backend, spec)
    run = be.launcher(k, tuple(spec.grid(args)))
    return lambda a: run(**a)


def reference_outputs(kernel: str, case: dict[str, Any]) -> dict[str, torch.Tensor]:
    args = copy_args(case, "cpu")
    _launcher("cpu", kernel, args)(args)
    return _outputs(kernel, args)


def differing(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> int:
    return sum(int((bits(got[n]) != bits(w)).sum()) for n, w in want.items())


def cpu_run(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    cores = os.cpu_count() or 1
    for b in sizes:
        cases = step_cases(b)
        for kernel, case in cases.items():
            want = reference_outputs(kernel, case)
            row: dict[str, Any] = {"kernel": kernel, "requests": b}
            run = _launcher("cpu", kernel, case)
            for threads in sorted({1, cores}):
                times = []
                with omp_threads(threads):
                    for _ in range(repeats):
                        fresh = copy_args(case, "cpu")  # in-place kernels run on their inputs each time
                        t0 = time.perf_counter()
                        run(fresh)
                        times.append(time.perf_counter() - t0)
                row[f"t{threads}_us"] = round(statistics.median(times) * 1e6, 2)
                row[f"t{threads}_cells_differing"] = differing(_outputs(kernel, fresh), want)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# Kernels whose repeats would walk out of their buffers: _post_update_kernel appends at total_len and
# advances it. Each timed launch restores the state it advances first (both backends alike).
RESTORED = {"_post_update_kernel": ("total_len_ptr", "num_computed_tokens_ptr")}


def cuda_run(sizes: list[int], backends: list[str]) -> list[dict[str, Any]]:
    from triton.testing import do_bench_cudagraph

    rows = []
    for b in sizes:
        cases = step_cases(b)
        for kernel, case in cases.items():
            want = reference_outputs(kernel, case)
            row: dict[str, Any] = {"kernel": kernel, "requests": b}
            for name in backends:
                args = copy_args(case, "cuda")
                run = _launcher(name, kernel, args)
                saved = {n: args[n].clone() for n in RESTORED.get(kernel, ())}
                bound = addressed(args)  # made once: a CUDA graph cannot capture the copy that makes the addresses

                def launch(run: Any = run, args: dict[str, Any] = bound, saved: dict[str, torch.Tensor] = saved) -> None:
                    for n, t in saved.items():
                        args[n].copy_(t)
                    run(args)

                # Replayed from a CUDA graph: the kernels take microseconds, a Python launch as long.
                row[f"{name}_ms"] = do_bench_cudagraph(launch, rep=100, return_mode="median")
                args = copy_args(case, "cuda")  # validated on fresh inputs (in-place kernels)
                run(addressed(args))
                torch.cuda.synchronize()
                row[f"{name}_cells_differing"] = differing(_outputs(kernel, args), want)
            if "vllm_ms" in row and "triton_ms" in row:
                row["ours_vs_vllm"] = round(row["vllm_ms"] / row["triton_ms"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--requests", default="64,256")
    parser.add_argument("--repeats", type=int, default=51)
    parser.add_argument("--out", default="reports/bench")
    ns = parser.parse_args(argv)
    sizes = [int(x) for x in ns.requests.split(",")]
    if ns.device == "cuda":
        if not torch.cuda.is_available():
            print("benchmarks/mrv2_step.py: skipped, no CUDA GPU is present")
            return 0
        backends = ["triton"] + (["vllm"] if os.environ.get("SPECDIFF_VLLM") else [])
        if "vllm" in backends:
            from conformance import engine

            engine.use(os.environ["SPECDIFF_VLLM"])
        rows = cuda_run(sizes, backends)
        ok = all(r.get(f"{n}_cells_differing", 0) == 0 for r in rows for n in backends)
    else:
        rows = cpu_run(sizes, ns.repeats)
        ok = all(v == 0 for r in rows for k, v in r.items() if k.endswith("_cells_differing"))
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if ns.device == "cuda" else f"{os.cpu_count()} CPU cores"
    (out / f"mrv2-step-{ns.device}.json").write_text(json.dumps({"device": device, "rows": rows}, indent=2) + "\n")
    if not ok:
        print("MISMATCH: a backend's outputs differ from the C++ port's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
