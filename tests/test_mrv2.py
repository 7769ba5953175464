"""Model Runner V2's rejection sampler (K11–K18): golden examples on every backend, Hypothesis
conformance across the three backends, and invalid input on the reference and CPU launchers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from support import BACKENDS as BACKEND_NAMES
from support import i32, i64, run

from conformance.backends import BACKENDS
from conformance.contract import KernelSpec
from conformance.kernels import mrv2 as contracts
from conformance.runner import run_case
from conformance.strategies import cases

I32, I64 = torch.int32, torch.int64
POISON = -9

backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])


def launch(backend: str, spec: KernelSpec, args: dict[str, Any]) -> None:
    run(backend, spec.name, spec.grid(args), **args)


def poisoned(n: int, dtype: torch.dtype = I32) -> torch.Tensor:
    return torch.full((n,), POISON, dtype=dtype)


# -- K11 _gather_draft_sampled_kernel ------------------------------------------------------------------
def gather_args(block: int = 1024, spare: int = 0) -> dict[str, Any]:
    # Two requests: slot 2 with 2 drafts (positions 10..12, prefill 11), slot 0 with none
    # (position 40). Rows read tokens 1..3 and 5 of a 6-token schedule.
    return dict(
        draft_sampled_ptr=poisoned(4 + spare),
        pos_ptr=poisoned(4 + spare, I64),
        input_ids_ptr=i32([90, 91, 92, 93, 94, 95]),
        positions_ptr=i64([9, 10, 11, 12, 39, 40]),
        logits_indices_ptr=i64([1, 2, 3, 5]),
        expanded_idx_mapping_ptr=i64([2, 2, 2, 0]),
        expanded_local_pos_ptr=i32([0, 1, 2, 0]),
        prefill_len_ptr=i32([3, 100, 11]),
        num_logits=4,
        BLOCK_SIZE=block,
    )


@backends
@pytest.mark.parametrize("block", [1024, 2, 1], ids=["call-site-tile", "two-tiles", "one-row-tiles"])
@pytest.mark.parametrize("spare", [0, 2], ids=["exact", "spare-cells"])
def test_golden_gather(backend, block, spare):
    a = gather_args(block, spare)
    launch(backend, contracts.GATHER_DRAFT_SAMPLED, a)
    # Row 1 (local 1): 11 - 1 = 10 < prefill 11 -> placeholder; row 2: 12 - 2 = 10 < 11 too.
    # Row 0 is a bonus-position row (local 0), never a placeholder; slot 0's prefill 3 is irrelevant.
    assert a["draft_sampled_ptr"].tolist() == [91, -1, -1, 95] + [POISON] * spare
    assert a["pos_ptr"].tolist() == [10, 11, 12, 40] + [POISON] * spare


@backends
def test_golden_gather_prefill_boundary(backend):
    # position - local_pos == prefill_len is not a placeholder: the step began at the prefill's end.
    a = gather_args()
    a["prefill_len_ptr"] = i32([3, 100, 10])
    launch(backend, contracts.GATHER_DRAFT_SAMPLED, a)
    assert a["draft_sampled_ptr"].tolist() == [91, 92, 93, 95]


# -- K12 _flatten_sampled_kernel -----------------------------------------------------------------------
def flatten_args(counts: list[int], spare: int = 0) -> dict[str, Any]:
    sampled = i64([[1, 2, 3, POISON], [4, 5, POISON, POISON], [6, 7, 8, 9]])[:, :3]  # a column slice
    return dict(
        flat_sampled_ptr=torch.zeros(8 + spare, dtype=I64),
        sampled_ptr=sampled,
        sampled_stride=sampled.stride(0),
        num_sampled_ptr=i32(counts),
        cu_num_logits_ptr=i32([0, 3, 5, 8]),
    )


@backends
@pytest.mark.parametrize(
    "counts, flat",
    [
        ([3, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8]),
        ([1, 0, 2], [1, 0, 0, 0, 0, 6, 7, 0]),  # rows past num_sampled keep the host's zeros
        ([0, 0, 0], [0] * 8),
    ],
    ids=["all", "some", "none"],
)
def test_golden_flatten(backend, counts, flat):
    a = flatten_args(counts, spare=2)
    launch(backend, contracts.FLATTEN_SAMPLED, a)
    assert a["flat_sampled_ptr"].tolist() == flat + [0, 0]


@given(case=cases(contracts.K11))
def test_conformance_gather(case):
    run_case(case, BACKEND_NAMES)


@given(case=cases(contracts.K12))
def test_conformance_flatten(case):
    run_case(case, BACKEND_NAMES)


# -- invalid input -----------------------------------------------------------------------------------
def _refused(backend: str, spec: KernelSpec, a: dict[str, Any], error: type, param: str) -> None:
    before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(error, match=param):
        BACKENDS[backend].resolve(spec)(**a)
    for k, v in before.items():
        assert torch.equal(a[k], v), f"{k} was written before the error"


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(logits_indices_ptr=i64([1, 2, 3, 6])), ValueError, "logits_indices_ptr"),  # past the tokens
        (dict(logits_indices_ptr=i64([1, -1, 3, 5])), ValueError, "logits_indices_ptr"),
        (dict(expanded_idx_mapping_ptr=i64([2, 2, 3, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(positions_ptr=i64([9, -10, 11, 12, 39, 40])), ValueError, "positions_ptr"),  # C25
        (dict(expanded_local_pos_ptr=i32([0, -1, 2, 0])), ValueError, "expanded_local_pos_ptr"),
        (dict(draft_sampled_ptr=poisoned(3)), ValueError, "draft_sampled_ptr"),
        (dict(num_logits=-1), ValueError, "num_logits"),
        (dict(BLOCK_SIZE=3), ValueError, "BLOCK_SIZE"),
        (dict(input_ids_ptr=i64([90, 2**40, 92, 93, 94, 95])), ValueError, "input_ids_ptr"),  # narrows to int32
        (dict(input_ids_ptr=torch.zeros(6)), TypeError, "input_ids_ptr"),
    ],
)
def test_invalid_gather(backend, change, error, param):
    a = gather_args()
    a.update(change)
    _refused(backend, contracts.GATHER_DRAFT_SAMPLED, a, error, param)


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(num_sampled_ptr=i32([4, 0, 0])), ValueError, "num_sampled_ptr"),  # past the request's rows
        (dict(num_sampled_ptr=i32([1, -1, 0])), ValueError, "num_sampled_ptr"),
        (dict(cu_num_logits_ptr=i32([0, 3, 2, 8])), ValueError, "cu_num_logits_ptr"),
        (dict(cu_num_logits_ptr=i32([])), ValueError, "cu_num_logits_ptr"),
        (dict(flat_sampled_ptr=torch.zeros(7, dtype=I64)), ValueError, "flat_sampled_ptr"),
        (dict(sampled_stride=6), ValueError, "sampled_ptr"),  # row 2 lies past the buffer
        (dict(flat_sampled_ptr=torch.zeros(8, dtype=I32), sampled_ptr=i64([[1, 2**40, 3]] * 3), sampled_stride=3),
         ValueError, "sampled_ptr"),
    ],
)
def test_invalid_flatten(backend, change, error, param):
    a = flatten_args([3, 2, 3])
    a.update(change)
    _refused(backend, contracts.FLATTEN_SAMPLED, a, error, param)
