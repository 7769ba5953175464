"""EAGLE input preparation (K5–K8): the spec's golden examples on every backend, Hypothesis
conformance across the three backends, and invalid input on the reference and CPU launchers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS as BACKEND_NAMES
from support import i32, i64, run

from conformance.backends import BACKENDS
from contracts import eagle as contract
from contracts.spec import KernelSpec

I32, I64 = torch.int32, torch.int64
POISON = -9  # the goldens' poison: never a value these kernels write here



def launch(backend: str, spec: KernelSpec, args: dict[str, Any]) -> None:
    """Launches as vLLM does, by keyword, with the canonical grid; outputs land in ``args``."""
    run(backend, spec.name, spec.grid(args), **args)


def poisoned(n: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=dtype)


backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])


# -- K5 eagle_step_slot_mapping_metadata_kernel ------------------------------------------------------
def step_args(positions, table, seq_lens, input_batch_size, *, block_size=16, max_model_len=100, alias=False):
    positions = i64(positions)
    table = i32(table) if not isinstance(table, torch.Tensor) else table
    b = positions.numel()
    return dict(
        positions_ptr=positions,
        block_table_ptr=table,
        block_table_stride=table.stride(0),
        seq_lens_ptr=i32(seq_lens),
        out_clamped_positions_ptr=positions if alias else poisoned(b, I64),
        out_slot_mapping_ptr=poisoned(input_batch_size, I64),
        block_size=block_size,
        max_model_len=max_model_len,
        n_blocks_per_req=table.shape[1],
        PAD_ID=-1,
        batch_size=b,
    )


SEVEN_WIDE = [[7 * r + c for c in range(7)] for r in range(4)]


@backends
@pytest.mark.parametrize("alias", [False, True], ids=["separate", "aliased"])
def test_step_golden_padding_and_max_model_len(backend, alias):
    a = step_args([50, 98, 99, 100], SEVEN_WIDE, [51, 99, 100, 101], 6, alias=alias)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_clamped_positions_ptr"].tolist() == [51, 99, 0, 0]
    assert a["out_slot_mapping_ptr"].tolist() == [51, 211, -1, -1, -1, -1]
    assert a["seq_lens_ptr"].tolist() == [52, 100, 1, 1]


@backends
def test_step_golden_narrow_table(backend):
    a = step_args([40, 3], [[5, 6], [7, 8]], [41, 4], 2)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_clamped_positions_ptr"].tolist() == [41, 4]
    assert a["out_slot_mapping_ptr"].tolist() == [105, 116]  # 41 -> column 2 clamped to 1: 6 * 16 + 9
    assert a["seq_lens_ptr"].tolist() == [42, 5]


@backends
def test_step_golden_seq_len_cap(backend):
    a = step_args([10], [[5, 6]], [100], 1)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_clamped_positions_ptr"].tolist() == [11]
    assert a["out_slot_mapping_ptr"].tolist() == [91]
    assert a["seq_lens_ptr"].tolist() == [100]


@backends
def test_step_strided_table_and_empty_batch(backend):
    # A column slice of a wider buffer: the row stride (7) is the argument, the width is 2.
    table = torch.tensor(SEVEN_WIDE, dtype=I32)[:, :2]
    a = step_args([20, 0], table, [21, 1], 3)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_slot_mapping_ptr"].tolist() == [1 * 16 + 5, 7 * 16 + 1, -1]
    a = step_args([], [[5, 6]], [], 2)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_slot_mapping_ptr"].tolist() == [-1, -1]


# -- K6 eagle_prepare_inputs_padded_kernel -------------------------------------------------------------
INPUTS_PADDED_GOLDEN = [
    # cu, valid, qsl, num_reqs, buffer length, token_indices_to_sample, num_rejected_tokens
    ([3, 3, 5], [2, 1, 3], [0, 4, 5, 8], 3, 3, [1, 4, 7], [2, 0, 0]),
    ([3, 3, 5], [2, 1, 3], [0, 4, 6, 11], 3, 3, [1, 5, 10], [2, 0, 0]),
    ([2, 2], [0, 1], [0, 3, 4], 2, 2, [-1, 3], [3, 0]),
    ([2, 4, 6], [1, 1, 1], [0, 3, 6, 9], 2, 3, [0, 3, POISON], [2, 2, POISON]),
]


@backends
@pytest.mark.parametrize("cu_index", [i32, i64])
@pytest.mark.parametrize("golden", INPUTS_PADDED_GOLDEN)
def test_inputs_padded_golden(backend, cu_index, golden):
    cu, valid, qsl, n, length, indices, rejected = golden
    a = dict(
        cu_num_draft_tokens_ptr=cu_index(cu),
        valid_sampled_tokens_count_ptr=i32(valid),
        query_start_loc_gpu_ptr=i32(qsl),
        token_indices_to_sample_ptr=poisoned(length),
        num_rejected_tokens_gpu_ptr=poisoned(length),
        num_reqs=n,
    )
    launch(backend, contract.EAGLE_PREPARE_INPUTS_PADDED, a)
    assert a["token_indices_to_sample_ptr"].tolist() == indices
    assert a["num_rejected_tokens_gpu_ptr"].tolist() == rejected


# -- K7 eagle_prepare_next_token_padded_kernel ---------------------------------------------------------
def next_token_args(rows, vocab, backup, discard=None, sampled=None, width=None):
    sampled = i32(rows) if sampled is None else sampled
    n, w = sampled.shape[0], sampled.shape[1] if width is None else width
    return dict(
        sampled_token_ids_ptr=sampled,
        discard_request_mask_ptr=torch.tensor(discard or [False] * n),
        backup_next_token_ids_ptr=i32(backup),
        next_token_ids_ptr=poisoned(n),
        valid_sampled_tokens_count_ptr=poisoned(n),
        vocab_size=vocab,
        num_sampled_tokens_per_req=w,
        num_reqs=n,
        stride_sampled_token_ids=sampled.stride(0),
        BLOCK_SIZE_TOKENS=max(1, 1 << (w - 1).bit_length()),
    )


def strided_rows(rows: list[list[int]], width: int) -> torch.Tensor:
    """``rows`` in the first columns of a ``[n, width]`` buffer whose other cells hold 12345."""
    storage = torch.full((len(rows), width), 12345, dtype=I32)
    storage[:, : len(rows[0])] = i32(rows)
    return storage[:, : len(rows[0])]


NEXT_TOKEN_GOLDEN = [
    # args, next_token_ids, valid_sampled_tokens_count
    (next_token_args([[5, 7, -1], [-1, -1, -1], [1, 104, -1], [9, 9, 9]], 100, [42, 43, 44, 45], [False, False, False, True]), [7, 43, 1, 45], [2, 0, 1, 0]),
    (next_token_args([[101, 102, 103], [201, -1, 203], [-1, -1, -1], [301, 10000, 303]], 1000, [1, 2, 3, 4]), [103, 203, 3, 303], [3, 2, 0, 2]),
    (next_token_args([[-2, -1, -1], [5, -3, -1]], 100, [0, 0]), [-2, -3], [1, 2]),
    (next_token_args(None, 100, [1, 2], sampled=strided_rows([[5, 7, -1], [8, -1, -1]], 6)), [7, 8], [2, 1]),
    (next_token_args(None, 100, [1, 2], sampled=strided_rows([[5, 7, 9], [8, 6, 4]], 3), width=2), [7, 6], [2, 2]),
    (next_token_args([[], []], 100, [1, 2]), [1, 2], [0, 0]),  # W = 0: count 0 and the backup
]


@backends
@pytest.mark.parametrize("golden", NEXT_TOKEN_GOLDEN, ids=["discard", "holes", "below-minus-one", "strided", "strided-W2", "W0"])
def test_next_token_golden(backend, golden):
    args, next_token, count = golden
    a = {k: v.clone() if isinstance(v, torch.Tensor) and k.startswith(("next", "valid")) else v for k, v in args.items()}
    launch(backend, contract.EAGLE_PREPARE_NEXT_TOKEN_PADDED, a)
    assert a["next_token_ids_ptr"].tolist() == next_token
    assert a["valid_sampled_tokens_count_ptr"].tolist() == count


# -- K8 copy_and_expand_eagle_inputs_kernel ------------------------------------------------------------
M = -3  # the parallel-drafting token id of the goldens


def expand_args(qsl, qend, ids, positions, nxt, *, shift, p, n_out, bool_poison, block=None):
    b = len(qend)
    longest = max(qsl[r + 1] - qsl[r] for r in range(b)) + p - shift
    return dict(
        target_token_ids_ptr=i32(ids),
        target_positions_ptr=i64(positions),
        next_token_ids_ptr=i32(nxt),
        out_input_ids_ptr=poisoned(n_out),
        out_positions_ptr=poisoned(n_out, I64),
        out_is_rejected_token_mask_ptr=torch.full((n_out,), bool_poison),
        out_is_masked_token_mask_ptr=torch.full((n_out,), bool_poison),
        out_new_token_indices_ptr=poisoned(b * p),
        out_hidden_state_mapping_ptr=poisoned(len(ids)),
        query_start_loc_ptr=i32(qsl),
        query_end_loc_ptr=i32(qend),
        padding_token_id=0,
        parallel_drafting_token_id=M,
        total_input_tokens=len(ids),
        num_padding_slots_per_request=p,
        shift_input_ids=shift,
        BLOCK_SIZE_TOKENS=block or min(256, 1 << (longest - 1).bit_length()),
    )


IDS = [100, 101, 102, 200, 201, 202, 203]
POSITIONS = [10, 11, 12, 20, 21, 22, 23]
NO_HIDDEN = [POISON] * 7
EXPAND_GOLDEN = {
    # (shift, P): ids, positions, rejected, masked, new indices, hidden map
    "no-shift-P3": (
        False, 3,
        [100, 101, 102, 900, M, M, 200, 201, 202, 901, M, M, 0],
        [10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 24, 25, 0],
        {12}, {4, 5, 10, 11}, [3, 4, 5, 9, 10, 11], NO_HIDDEN,
    ),
    "shift-P3": (
        True, 3,
        [101, 102, 900, M, M, 201, 202, 901, M, M, 0],
        [10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 0],
        {10}, {3, 4, 8, 9}, [2, 3, 4, 7, 8, 9], [0, 1, 2, 5, 6, 7, 8],
    ),
    "no-shift-P1": (
        False, 1,
        [100, 101, 102, 900, 200, 201, 202, 901, 0],
        [10, 11, 12, 13, 20, 21, 22, 23, 0],
        {8}, set(), [3, 7], NO_HIDDEN,
    ),
    "shift-P1": (
        True, 1,
        [101, 102, 900, 201, 202, 901, 0],
        [10, 11, 12, 20, 21, 22, 0],
        {6}, set(), [2, 5], [0, 1, 2, 3, 4, 5, 6],
    ),
}  # fmt: skip


def mask(n: int, cells: set[int]) -> list[bool]:
    return [i in cells for i in range(n)]


@backends
@pytest.mark.parametrize("bool_poison", [True, False])
@pytest.mark.parametrize("block", [None, 2], ids=["call-site-tile", "several-tiles"])
@pytest.mark.parametrize("name", list(EXPAND_GOLDEN))
def test_copy_expand_golden(backend, name, block, bool_poison):
    shift, p, ids, positions, rejected, masked, new, hidden = EXPAND_GOLDEN[name]
    n = len(ids)
    a = expand_args([0, 3, 7], [2, 5], IDS, POSITIONS, [900, 901], shift=shift, p=p, n_out=n, bool_poison=bool_poison, block=block)
    launch(backend, contract.COPY_AND_EXPAND_EAGLE_INPUTS, a)
    assert a["out_input_ids_ptr"].tolist() == ids
    assert a["out_positions_ptr"].tolist() == positions
    assert a["out_is_rejected_token_mask_ptr"].tolist() == mask(n, rejected)
    assert a["out_is_masked_token_mask_ptr"].tolist() == mask(n, masked)
    assert a["out_new_token_indices_ptr"].tolist() == new
    assert a["out_hidden_state_mapping_ptr"].tolist() == hidden


@backends
@pytest.mark.parametrize("bool_poison", [True, False])
def test_copy_expand_golden_one_token_request(backend, bool_poison):
    a = expand_args([0, 1, 4], [0, 3], [100, 200, 201, 202], [5, 20, 21, 22], [900, 901], shift=True, p=2, n_out=6, bool_poison=bool_poison)
    launch(backend, contract.COPY_AND_EXPAND_EAGLE_INPUTS, a)
    assert a["out_input_ids_ptr"].tolist() == [900, M, 201, 202, 901, M]
    assert a["out_positions_ptr"].tolist() == [5, 6, 20, 21, 22, 23]
    assert a["out_is_rejected_token_mask_ptr"].tolist() == mask(6, set())
    assert a["out_is_masked_token_mask_ptr"].tolist() == mask(6, {1, 5})
    assert a["out_new_token_indices_ptr"].tolist() == [0, 1, 4, 5]
    assert a["out_hidden_state_mapping_ptr"].tolist() == [0, 2, 3, 4]


# -- conformance -------------------------------------------------------------------------------------




# -- invalid input -----------------------------------------------------------------------------------
def launch_invalid(backend: str, spec: KernelSpec, args: dict[str, Any], error: type[Exception], param: str) -> None:
    """The launch raises ``error`` naming ``param`` and writes nothing."""
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    kernel = BACKENDS[backend].resolve(spec)
    with pytest.raises(error, match=param):
        kernel(**args)
    for k, v in before.items():
        assert torch.equal(args[k], v), f"{k} was written before the error"


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(positions=[50, -2]), ValueError, "positions_ptr"),
        (dict(input_batch_size=1), ValueError, "batch_size"),
        (dict(table=[[1, 2], [3, 4]], n_blocks=3), ValueError, "block_table_ptr"),
        (dict(sliced=True, n_blocks=3), ValueError, "block_table_ptr"),  # reads the buffer's gap
        (dict(block_size=0), ValueError, "block_size"),
        (dict(stride=2**63 - 1), ValueError, "block_table_ptr"),  # row 1 at a flat index that wraps in int64
        (dict(pad_id=-(2**31) - 1), ValueError, "PAD_ID"),  # past the int32 out_slot_mapping
        (dict(positions_dtype=torch.float32), TypeError, "positions_ptr"),
    ],
)
def test_step_invalid(backend, change, error, param):
    table = i32(change.get("table", [[1, 2, 3, 9], [4, 5, 6, 9]]))
    table = table[:, :2] if change.get("sliced") else table
    a = step_args(change.get("positions", [50, 3]), table, [51, 4], change.get("input_batch_size", 2), block_size=change.get("block_size", 16))
    a["n_blocks_per_req"] = change.get("n_blocks", 2)
    a["block_table_stride"] = change.get("stride", a["block_table_stride"])
    if "pad_id" in change:
        a["PAD_ID"] = change["pad_id"]
        a["out_slot_mapping_ptr"] = a["out_slot_mapping_ptr"].to(torch.int32)
    if "positions_dtype" in change:
        a["positions_ptr"] = a["positions_ptr"].to(change["positions_dtype"])
    launch_invalid(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a, error, param)


# The C++ port scans C25 as an OR of sign bits over the whole batch (csrc/metadata.h, first_below):
# the values either side of -1 and int64's two ends, at the first and the last of 37 rows (wider than
# any vector of the scan, with a remainder).
EDGE_POSITIONS = [-1, 2**63 - 1, 0] * 12 + [5]


@cpu_and_reference
def test_step_accepts_minus_one_and_int64_max_in_a_long_batch(backend):
    a = step_args(EDGE_POSITIONS, [[r, r + 1] for r in range(37)], [1] * 37, 37, max_model_len=2**62)
    launch(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a)
    assert a["out_clamped_positions_ptr"].tolist() == [0, 0, 1] * 12 + [6]
    assert a["out_slot_mapping_ptr"][:3].tolist() == [0, -1, 2 * 16 + 1]


@cpu_and_reference
@pytest.mark.parametrize("bad", [-2, -(2**63)])
@pytest.mark.parametrize("at", [0, 36])
def test_step_refuses_a_position_below_minus_one_anywhere(backend, bad, at):
    positions = list(EDGE_POSITIONS)
    positions[at] = bad
    a = step_args(positions, [[r, r + 1] for r in range(37)], [1] * 37, 37, max_model_len=2**62)
    launch_invalid(backend, contract.EAGLE_STEP_SLOT_MAPPING_METADATA, a, ValueError, "positions_ptr")


@cpu_and_reference
@pytest.mark.parametrize("field, value, param", [("query_start_loc_gpu_ptr", i32([0, 4, 5]), "query_start_loc_gpu_ptr"), ("num_reqs", -1, "num_reqs"), ("token_indices_to_sample_ptr", poisoned(2), "token_indices_to_sample_ptr")])
def test_inputs_padded_invalid(backend, field, value, param):
    a = dict(
        cu_num_draft_tokens_ptr=i32([3, 3, 5]),
        valid_sampled_tokens_count_ptr=i32([2, 1, 3]),
        query_start_loc_gpu_ptr=i32([0, 4, 5, 8]),
        token_indices_to_sample_ptr=poisoned(3),
        num_rejected_tokens_gpu_ptr=poisoned(3),
        num_reqs=3,
    )
    a[field] = value
    launch_invalid(backend, contract.EAGLE_PREPARE_INPUTS_PADDED, a, ValueError, param)


@cpu_and_reference
@pytest.mark.parametrize(
    "field, value, error, param",
    [
        ("BLOCK_SIZE_TOKENS", 2, ValueError, "BLOCK_SIZE_TOKENS"),  # < W = 3
        ("BLOCK_SIZE_TOKENS", 6, ValueError, "BLOCK_SIZE_TOKENS"),  # not a power of two
        ("stride_sampled_token_ids", 4, ValueError, "sampled_token_ids_ptr"),  # row 1 past the tensor
        ("stride_sampled_token_ids", 2**63 - 1, ValueError, "sampled_token_ids_ptr"),  # flat + width wraps in int64
        ("discard_request_mask_ptr", torch.tensor([False]), ValueError, "discard_request_mask_ptr"),
        ("discard_request_mask_ptr", i32([0, 0]), TypeError, "discard_request_mask_ptr"),
    ],
)
def test_next_token_invalid(backend, field, value, error, param):
    a = next_token_args([[5, 7, -1], [8, -1, -1]], 100, [1, 2])
    a[field] = value
    launch_invalid(backend, contract.EAGLE_PREPARE_NEXT_TOKEN_PADDED, a, error, param)


@cpu_and_reference
@pytest.mark.parametrize(
    "field, value, param",
    [
        ("query_end_loc_ptr", i32([2, 7]), "query_end_loc_ptr"),  # past request 1's last token
        ("query_end_loc_ptr", i32([3, 5]), "query_end_loc_ptr"),  # inside request 1, not request 0
        ("query_start_loc_ptr", i32([0, 3, 2]), "query_start_loc_ptr"),  # decreasing
        ("total_input_tokens", 6, "total_input_tokens"),
        ("out_input_ids_ptr", poisoned(12), "out_input_ids_ptr"),
        ("num_padding_slots_per_request", 0, "num_padding_slots_per_request"),
        # b * P wraps int64: the output length must not wrap to one the buffer passes (a fuzz crash)
        ("num_padding_slots_per_request", 2**62, "out_input_ids_ptr"),
    ],
)
def test_copy_expand_invalid(backend, field, value, param):
    a = expand_args([0, 3, 7], [2, 5], IDS, POSITIONS, [900, 901], shift=False, p=3, n_out=13, bool_poison=True)
    a[field] = value
    launch_invalid(backend, contract.COPY_AND_EXPAND_EAGLE_INPUTS, a, ValueError, param)


def test_unknown_keyword_is_a_type_error():
    kernel = BACKENDS["cpu"].resolve(contract.EAGLE_PREPARE_INPUTS_PADDED)
    with pytest.raises(TypeError, match="num_request"):
        kernel[(1,)](i32([0]), i32([1]), i32([0, 1]), poisoned(1), poisoned(1), num_request=1)

