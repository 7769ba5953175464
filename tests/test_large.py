"""Offsets past 2**31 elements (C4, §1.6): launches whose flat indices only fit int64, cheaply.

A 32-bit ``row * vocab`` or ``row * stride`` product survives every Hypothesis case (their buffers
are small). Here the buffers are large but untouched: ``torch.empty`` maps pages it never writes,
so a [3, 2**30 + 8] float32 tensor costs 12 GiB of address space and a few resident pages — the
cells the kernel must read are set, every other page stays unmapped zeros. Each launch runs on
every backend with the same inputs (the runner's copies would touch every page) and must agree
with the values the test states. Skipped, with the reason, where the address space is refused.
"""

from __future__ import annotations

import pytest
import torch
from support import i32, i64, run

import contracts

BACKENDS = ("reference", "cpu", "triton")
BIG = 2**30 + 8  # two rows of this many elements reach past 2**31


def launch(backend: str, kernel: str, **args) -> None:
    run(backend, kernel, contracts.get(kernel).grid(args), **args)


def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    try:
        return torch.empty(*shape, dtype=dtype)
    except (RuntimeError, MemoryError) as e:
        pytest.skip(f"this machine refuses {torch.Size(shape).numel() * dtype.itemsize / 2**30:.0f} GiB of address space: {e}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rejection_random_reads_a_probability_past_2_31(backend):
    # Three drafts of one request: token 2's cell is at 2 * (2**30 + 8) + 5, past int32.
    target = empty(3, BIG, dtype=torch.float32)
    drafts = [3, 4, 5]
    for t, (d, p) in enumerate(zip(drafts, [0.9, 0.8, 0.7])):
        target[t, d] = p
    out = torch.full((1, 4), -1, dtype=torch.int32)
    launch(backend, "rejection_random_sample_kernel", output_token_ids_ptr=out, cu_num_draft_tokens_ptr=i32([3]),
        draft_token_ids_ptr=i32(drafts), draft_probs_ptr=None, target_probs_ptr=target, bonus_token_ids_ptr=i32([[7]]),
        recovered_token_ids_ptr=i32([0, 1, 2]), uniform_probs_ptr=torch.tensor([0.5, 0.5, 0.69], dtype=torch.float64),
        is_greedy_ptr=torch.tensor([False]), max_spec_len=3, vocab_size=BIG, synthetic_conditional_rates_ptr=None,
        NO_DRAFT_PROBS=True, SYNTHETIC_MODE=False)
    assert out.tolist() == [[3, 4, 5, 7]]  # a wrapped offset reads an unset cell (0): a rejection


@pytest.mark.parametrize("backend", BACKENDS)
def test_slot_mapping_reads_a_block_table_row_past_2_31(backend):
    # Two requests; request 1's block-table row starts at flat index 2**31 + 8 (a row stride only int64 holds).
    stride = 2**31 + 8
    base = empty(stride + 4, dtype=torch.int32)
    table = base.as_strided((2, 4), (stride, 1))
    table[0] = i32([10, 11, 12, 13])
    table[1] = i32([20, 21, 22, 23])
    slots = torch.full((4,), -9, dtype=torch.int64)
    launch(backend, "compute_slot_mapping_kernel", num_tokens=4, max_num_tokens=4, query_start_loc_ptr=i32([0, 2, 4]),
        positions_ptr=i64([0, 17, 1, 33]), block_table_ptr=table, block_table_stride=stride, slot_mapping_ptr=slots,
        KV_CACHE_BLOCK_SIZE=16, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=4)
    assert slots.tolist() == [10 * 16, 11 * 16 + 1, 20 * 16 + 1, 22 * 16 + 1]
