"""Model Runner V2's block tables (K32-K33): a two-group gather with a sliding window, rows padded for
CUDA graphs and rows past the grid, slot mappings with a dummy row, a disabled group, padding past
the batch and context parallelism, each worked by hand; the pointer table and the grid as a launch
carries them; invalid input on the validating backends."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS, i32, i64, refused, run

from contracts import block_table as contract
from contracts.spec import Table

P = -9
backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])


def gather_args(**change: Any) -> dict[str, Any]:
    src = Table((i32([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]), i32([[40, 41], [50, 51], [60, 61]])))
    dst = Table((torch.full((5, 4), P, dtype=torch.int32), torch.full((5, 2), P, dtype=torch.int32)))
    return dict(batch_idx_to_req_idx=i64([2, 0]), src_block_table_ptrs=src, dst_block_table_ptrs=dst,
                block_table_strides=i64([4, 2]), num_blocks_ptr=i32([[4, 2, 3], [2, 1, 0]]), num_blocks_stride=3, num_reqs=2,
                num_computed_tokens_ptr=i32([12, 0, 9]), sliding_window_reach_ptr=i32([8, 0]), block_sizes_ptr=i32([4, 16]),
                MASK_SLIDING_WINDOW=True, BLOCK_SIZE=1024) | change


@backends
@pytest.mark.parametrize("tile", [1024, 2])
@pytest.mark.parametrize("mask", [True, False])
def test_the_gather_copies_held_blocks_nulls_the_window_and_zeroes_padded_rows(backend, tile, mask):
    a = run(backend, contract.K32, (2, 4), **gather_args(BLOCK_SIZE=tile, MASK_SLIDING_WINDOW=mask))
    # Batch row 0 is state 2 (3 blocks of group 0, none of group 1); row 1 is state 0. Group 0's
    # window reaches 8 tokens below state 0's first position 12: block 0 (tokens 0-3) is out of it.
    # Grid rows 2 and 3 are padding (zeroed); row 4 lies past the grid and keeps what it held, as do
    # the columns past a row's blocks.
    assert a["dst_block_table_ptrs"][0].tolist() == [[30, 31, 32, P], [0 if mask else 10, 11, 12, 13], [0] * 4, [0] * 4, [P] * 4]
    assert a["dst_block_table_ptrs"][1].tolist() == [[P, P], [40, 41], [0, 0], [0, 0], [P, P]]


@backends
def test_the_gather_takes_the_counts_of_a_wider_buffer_by_row_stride(backend):
    counts = torch.zeros((2, 5), dtype=torch.int32)
    counts[:, :3] = i32([[4, 2, 3], [2, 1, 0]])
    a = run(backend, contract.K32, (2, 2), **gather_args(num_blocks_ptr=counts[:, :3], num_blocks_stride=5, MASK_SLIDING_WINDOW=False))
    assert a["dst_block_table_ptrs"][0][:2].tolist() == [[30, 31, 32, P], [10, 11, 12, 13]]


def slot_args(**change: Any) -> dict[str, Any]:
    tables = Table((i32([[7, 8, 9], [3, 4, 5]]), i32([[2, 6], [1, 0]])))
    return dict(max_num_tokens=8, idx_mapping=i64([1, -1, 0]), query_start_loc=i32([0, 3, 4, 6]), pos=i64([2, 3, 4, 99, 9, 10]),
                block_table_ptrs=tables, block_table_strides=i64([3, 2]), block_sizes=i32([4, 16]),
                slot_mapping_enabled=torch.tensor([True, True]), dcp_sharded=torch.tensor([True, False]),
                slot_mappings_ptr=torch.full((2, 8), P, dtype=torch.int64), slot_mappings_stride=8, cp_rank=0, CP_SIZE=1,
                CP_INTERLEAVE=1, PAD_ID=-1, TRITON_BLOCK_SIZE=1024) | change


def slots(backend: str, **change: Any) -> list[list[int]]:
    a = slot_args(**change)
    return run(backend, contract.K33, contract.COMPUTE_SLOT_MAPPINGS.grid(a), **a)["slot_mappings_ptr"].tolist()


@backends
@pytest.mark.parametrize("tile", [1024, 2])
def test_each_token_maps_to_its_block_and_offset(backend, tile):
    # Row 0 is state 1: positions 2, 3 in its block 0 (id 3 of group 0), position 4 in block 1 (id 4).
    # Row 1 is a dummy row; row 2 is state 0 at positions 9, 10 (group 0's block 2, id 9). Tokens 6 and
    # 7 pad up to max_num_tokens.
    assert slots(backend, TRITON_BLOCK_SIZE=tile) == [[14, 15, 16, -1, 37, 38, -1, -1], [18, 19, 20, -1, 41, 42, -1, -1]]


@backends
def test_a_group_without_slot_mappings_pads_and_nothing_pads_past_max_num_tokens(backend):
    got = slots(backend, slot_mapping_enabled=torch.tensor([True, False]), max_num_tokens=6)
    assert got == [[14, 15, 16, -1, 37, 38, P, P], [-1, -1, -1, -1, -1, -1, P, P]]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "vllm"])  # vLLM's CP path: compiled only
def test_context_parallelism_keeps_this_ranks_tokens(backend):
    # Two ranks, one token at a time: rank 1 holds the odd offsets of each 8-token virtual block of
    # sharded group 0, packed into its 4-slot blocks (position 3 -> local 1, position 9 -> local 4).
    # Group 1 is not sharded: every token is this rank's.
    got = slots(backend, CP_SIZE=2, cp_rank=1)
    assert got == [[-1, 13, -1, -1, 32, -1, -1, -1], [18, 19, 20, -1, 41, 42, -1, -1]]


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_raw_addresses_are_refused_naming_the_table(backend):
    a = gather_args()
    a["src_block_table_ptrs"] = torch.tensor([t.data_ptr() for t in a["src_block_table_ptrs"]], dtype=torch.uint64)
    if backend == "triton":  # a Triton kernel takes vLLM's addresses; the contract cannot check them
        pytest.raises(TypeError, contract.GATHER_BLOCK_TABLES.check, a)
    else:
        refused(backend, contract.K32, a, TypeError, "src_block_table_ptrs")


@ours
def test_a_grid_past_the_forward_pass_tables_is_refused(backend):
    with pytest.raises(ValueError, match=r"'dst_block_table_ptrs\[0\]'"):
        run(backend, contract.K32, (2, 6), **gather_args())
    with pytest.raises(ValueError, match="'grid'"):
        run(backend, contract.K32, (1, 2), **gather_args())


def _int64_table() -> Table:
    return Table((i64([[7, 8, 9], [3, 4, 5]]), i32([[2, 6], [1, 0]])))


INVALID = [
    (contract.K32, lambda: gather_args(num_blocks_ptr=i32([[5, 2, 3], [2, 1, 0]])), ValueError, "num_blocks_ptr"),  # 5 > width 4
    (contract.K32, lambda: gather_args(batch_idx_to_req_idx=i64([3, 0])), ValueError, "batch_idx_to_req_idx"),
    (contract.K32, lambda: gather_args(dst_block_table_ptrs=Table((torch.zeros((5, 4), dtype=torch.int32),
                                                                    torch.zeros((5, 3), dtype=torch.int32)))), ValueError,
     "dst_block_table_ptrs[1]"),
    (contract.K32, lambda: gather_args(dst_block_table_ptrs=Table((torch.zeros((5, 4), dtype=torch.int32),))), ValueError,
     "dst_block_table_ptrs"),
    (contract.K32, lambda: gather_args(block_sizes_ptr=i32([4, 0])), ValueError, "block_sizes_ptr"),
    (contract.K32, lambda: gather_args(num_computed_tokens_ptr=i32([12, 0, -(2**31) + 1])), ValueError, "num_computed_tokens_ptr"),
    (contract.K32, lambda: gather_args(num_blocks_stride=2**62), ValueError, "num_blocks_ptr"),
    (contract.K33, lambda: slot_args(pos=i64([2, 3, 12, 99, 9, 10])), ValueError, "pos"),  # column 3 of width 3
    (contract.K33, lambda: slot_args(pos=i64([-1, 3, 4, 99, 9, 10])), ValueError, "pos"),
    (contract.K33, lambda: slot_args(idx_mapping=i64([2, -1, 0])), ValueError, "idx_mapping"),
    (contract.K33, lambda: slot_args(block_table_ptrs=Table((i32([[7, 8, 9], [2**29, 4, 5]]), i32([[2, 6], [1, 0]])))), ValueError,
     "block_table_ptrs"),  # 2**29 * 4 leaves int32
    (contract.K33, lambda: slot_args(slot_mappings_ptr=torch.zeros((2, 7), dtype=torch.int64), slot_mappings_stride=7), ValueError,
     "slot_mappings_ptr"),
    (contract.K33, lambda: slot_args(slot_mappings_ptr=torch.zeros(16, dtype=torch.int64), slot_mappings_stride=4), ValueError,
     "slot_mappings_stride"),  # the groups' rows would overlap
    (contract.K33, lambda: slot_args(block_table_strides=i64([4, 2])), ValueError, "block_table_ptrs[0]"),
    (contract.K33, lambda: slot_args(block_sizes=i32([4, 0])), ValueError, "block_sizes"),
    (contract.K33, lambda: slot_args(block_table_ptrs=_int64_table()), TypeError, "block_table_ptrs[0]"),
    (contract.K33, lambda: slot_args(block_table_ptrs=(i32([[7, 8, 9], [3, 4, 5]]), "x")), TypeError, "block_table_ptrs[1]"),
]


@ours
@pytest.mark.parametrize("kernel, args, error, param", INVALID, ids=[f"{k}-{p}-{i}" for i, (k, _, _, p) in enumerate(INVALID)])
def test_invalid(backend, kernel, args, error, param):
    refused(backend, kernel, args(), error, param)


@pytest.mark.skipif("vllm" not in BACKENDS, reason="needs vLLM's own kernels (SPECDIFF_VLLM)")
def test_vllms_slot_mapping_reads_past_a_narrow_groups_row():
    """vLLM 0.33.0 reads the next request's row where a token's block lies past a narrow enabled
    group's row (vllm-project/vllm issue 53982): the contract refuses that launch, and vLLM's kernel
    makes the read. Two rows of width 2 in one buffer: position 9 of 4-token blocks is column 2 of
    row 0, which is row 1's first block (70). When vLLM bounds the load this test fails: the finding
    is gone, and the contract may take the launch with PAD_ID."""
    table = i32([[10, 11], [70, 71]])
    a = slot_args(block_table_ptrs=Table((table,)), block_table_strides=i64([2]), block_sizes=i32([4]),
                  slot_mapping_enabled=torch.tensor([True]), dcp_sharded=torch.tensor([False]), idx_mapping=i64([0]),
                  query_start_loc=i32([0, 1]), pos=i64([9]), slot_mappings_ptr=torch.full((1, 8), P, dtype=torch.int64))
    with pytest.raises(ValueError, match="'pos'"):
        contract.COMPUTE_SLOT_MAPPINGS.check(a)
    assert run("vllm", contract.K33, (1, 2), **a)["slot_mappings_ptr"][0, 0].item() == 70 * 4 + 1
