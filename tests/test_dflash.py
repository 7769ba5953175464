"""DFlash input preparation (K9): the spec's golden examples on every backend, Hypothesis
conformance across the three backends, and invalid input on the reference and CPU launchers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS as BACKEND_NAMES
from support import i32, i64, run

from conformance.backends import BACKENDS
from contracts import dflash as contract
from contracts.spec import KernelSpec

I32, I64 = torch.int32, torch.int64
POISON = -9
M = -3  # the goldens' parallel-drafting token id


backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])


def launch(backend: str, spec: KernelSpec, args: dict[str, Any]) -> None:
    """Launches as vLLM does, by keyword, with the canonical grid; outputs land in ``args``."""
    run(backend, spec.name, spec.grid(args), **args)


def poisoned(n: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=dtype)


def dflash_args(qsl, positions, nxt, table, *, rejected=None, k=2, block_size=4, lanes=None, extra=0):
    """Outputs hold ``extra`` spare cells past what the kernel writes; their poison must survive."""
    b, q = len(qsl) - 1, k + 1
    table = i32(table)
    longest = max(qsl[r + 1] - qsl[r] for r in range(b)) + q
    args = dict(
        next_token_ids_ptr=i32(nxt),
        target_positions_ptr=i64(positions),
        out_input_ids_ptr=poisoned(b * q + extra),
        out_context_positions_ptr=poisoned(qsl[-1] + extra, I64),
        out_query_positions_ptr=poisoned(b * q + extra, I64),
        out_context_slot_mapping_ptr=poisoned(qsl[-1] + extra, I64),
        out_query_slot_mapping_ptr=poisoned(b * q + extra, I64),
        out_token_indices_ptr=poisoned(b * k + extra),
        block_table_ptr=table,
        block_table_stride=table.stride(0),
        query_start_loc_ptr=i32(qsl),
        num_rejected_tokens_ptr=0 if rejected is None else i32(rejected),
        parallel_drafting_token_id=M,
        block_size=block_size,
        num_query_per_req=q,
        num_speculative_tokens=k,
        total_input_tokens=len(positions),
        BLOCK_SIZE=lanes or min(256, 1 << (longest - 1).bit_length()),
    )
    if rejected is not None:
        args["HAS_NUM_REJECTED"] = True  # omitted otherwise: the constexpr defaults to False
    return args


QSL, POSITIONS, NEXT = [0, 3, 7], [0, 1, 2, 10, 11, 12, 13], [21, 22]
TABLE = [list(range(8)), list(range(8, 16))]
GOLDEN = {
    # rejected: query positions, query slots (ids, context outputs and token indices are shared)
    "rejected-0-1": ([0, 1], [3, 4, 5, 13, 14, 15], [3, 4, 5, 45, 46, 47]),
    "no-rejected-counts": (None, [3, 4, 5, 14, 15, 16], [3, 4, 5, 46, 47, 48]),
    "all-of-request-1-rejected": ([0, 4], [3, 4, 5, 3, 4, 5], [3, 4, 5, 35, 36, 37]),  # reads request 0's last
}


def written(values: list[int], extra: int) -> list[int]:
    return values + [POISON] * extra


@backends
@pytest.mark.parametrize("lanes", [None, 2], ids=["call-site-tile", "several-tiles"])
@pytest.mark.parametrize("extra", [0, 2], ids=["exact", "spare-cells"])
@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(backend, name, extra, lanes):
    rejected, query_positions, query_slots = GOLDEN[name]
    a = dflash_args(QSL, POSITIONS, NEXT, TABLE, rejected=rejected, lanes=lanes, extra=extra)
    launch(backend, contract.COPY_AND_EXPAND_DFLASH_INPUTS, a)
    assert a["out_input_ids_ptr"].tolist() == written([21, M, M, 22, M, M], extra)
    assert a["out_context_positions_ptr"].tolist() == written(POSITIONS, extra)
    assert a["out_context_slot_mapping_ptr"].tolist() == written([0, 1, 2, 42, 43, 44, 45], extra)
    assert a["out_query_positions_ptr"].tolist() == written(query_positions, extra)
    assert a["out_query_slot_mapping_ptr"].tolist() == written(query_slots, extra)
    assert a["out_token_indices_ptr"].tolist() == written([1, 2, 4, 5], extra)


@backends
@pytest.mark.parametrize("counts", [0, None], ids=["integer-0", "None"])
def test_golden_column_clamp(backend, counts):
    # Positions past the table's width map to column stride - 1 (C23).
    a = dflash_args([0, 2], [30, 31], [21], [[1, 2]])
    a["num_rejected_tokens_ptr"] = counts
    a["HAS_NUM_REJECTED"] = False
    launch(backend, contract.COPY_AND_EXPAND_DFLASH_INPUTS, a)
    assert a["out_context_slot_mapping_ptr"].tolist() == [10, 11]
    assert a["out_query_positions_ptr"].tolist() == [32, 33, 34]
    assert a["out_query_slot_mapping_ptr"].tolist() == [8, 9, 10]
    assert a["out_input_ids_ptr"].tolist() == [21, M, M]
    assert a["out_token_indices_ptr"].tolist() == [1, 2]


@backends
def test_empty_request_reads_the_previous_request(backend):
    # Request 1 has no context: without rejected counts it continues from request 0's last position.
    a = dflash_args([0, 3, 3], [0, 1, 2], [21, 22], TABLE)
    launch(backend, contract.COPY_AND_EXPAND_DFLASH_INPUTS, a)
    assert a["out_query_positions_ptr"].tolist() == [3, 4, 5, 3, 4, 5]
    assert a["out_query_slot_mapping_ptr"].tolist() == [3, 4, 5, 35, 36, 37]  # row 1: block 8
    assert a["out_context_positions_ptr"].tolist() == [0, 1, 2]



# -- invalid input -----------------------------------------------------------------------------------
@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(HAS_NUM_REJECTED=True), ValueError, "HAS_NUM_REJECTED"),  # flag without a tensor (C26)
        (dict(num_rejected_tokens_ptr=i32([0, 0])), ValueError, "HAS_NUM_REJECTED"),  # tensor without the flag
        (dict(num_rejected_tokens_ptr=1), TypeError, "num_rejected_tokens_ptr"),  # only the integer 0
        (dict(num_speculative_tokens=1), ValueError, "num_speculative_tokens"),
        (dict(num_rejected_tokens_ptr=i32([3, 0]), HAS_NUM_REJECTED=True), ValueError, "num_rejected_tokens_ptr"),
        (dict(block_table_ptr=i32([list(range(8))])), ValueError, "block_table_ptr"),  # one row for two requests
        (dict(block_table_ptr=i32([list(range(12)), list(range(12))])[:, :8]), ValueError, "block_table_ptr"),  # reads a gap
        (dict(target_positions_ptr=i64([0, 1, 2, 10, -11, 12, 13])), ValueError, "target_positions_ptr"),
        (dict(query_start_loc_ptr=i32([0, 4, 3])), ValueError, "query_start_loc_ptr"),
        (dict(out_query_slot_mapping_ptr=poisoned(5, I64)), ValueError, "out_query_slot_mapping_ptr"),
        (dict(BLOCK_SIZE=12), ValueError, "BLOCK_SIZE"),
        # b * Q wraps int64 (as K8's b * P crashed the fuzz): refused, not wrapped to a small length
        (dict(num_query_per_req=2**62, num_speculative_tokens=2**62 - 1), ValueError, "out_input_ids_ptr"),
    ],
)
def test_invalid(backend, change, error, param):
    a = dflash_args(QSL, POSITIONS, NEXT, TABLE)
    a.update(change)
    before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(error, match=param):
        BACKENDS[backend].resolve(contract.COPY_AND_EXPAND_DFLASH_INPUTS)(**a)
    for k, v in before.items():
        assert torch.equal(a[k], v), f"{k} was written before the error"

