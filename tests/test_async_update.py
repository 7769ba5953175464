"""The async-scheduling update (K21): goldens, reads-before-writes, the engine's two failing
vectors, Hypothesis conformance, and invalid input. vLLM implements it in PyTorch on the host:
no Triton form (the Triton backends report it n/a)."""

from __future__ import annotations

import pytest
import torch
from support import BACKENDS as ALL
from support import i32, i64, refused, run

from conformance.backends import BACKENDS
from contracts import async_update as contract

HOST = tuple(b for b in ALL if BACKENDS[b].applies(contract.UPDATE))
backends = pytest.mark.parametrize("backend", HOST)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])


def update(backend: str, nc, na, prev, valid, drafts, cpu) -> tuple[list[int], list[int]]:
    a = dict(num_computed_tokens=i32(nc), num_accepted_tokens=i32(na), prev_positions=i64(prev),
             valid_sampled_token_count=i32(valid), prev_num_draft_tokens=i32(drafts), cpu_num_computed_tokens=i32(cpu))
    run(backend, contract.K21, (1,), **a)
    return a["num_computed_tokens"].tolist(), a["num_accepted_tokens"].tolist()


@backends
def test_golden(backend):
    # Request 0 was slot 1 with drafts: 20 + 4. Request 1 is new: the CPU's 200. Request 2 was slot 0
    # with drafts: 10 (the value before request 0 wrote slot 0) + 3. Slot 3 lies past the batch.
    assert update(backend, [10, 20, 30, 40], [9, 8, 7], [1, -1, 0], [3, 4], [2, 5, 0, 0], [100, 200, 300]) == (
        [24, 200, 13, 40], [4, 8, 3])


@backends
def test_request_without_drafts_takes_the_cpu_count(backend):
    # Slot 1 verified no drafts last step: its CPU count is exact; the accepted count is kept.
    assert update(backend, [10, 20], [9, 8], [1, 0], [3, 4], [2, 0], [100, 200]) == ([100, 13], [9, 3])


@backends
def test_duplicated_previous_positions(backend):
    assert update(backend, [10, 20], [9, 8], [0, 0], [3, 4], [2, 0], [100, 200]) == ([13, 13], [3, 3])


@backends
def test_sum_wraps_like_int32(backend):
    top = 2**31 - 1
    assert update(backend, [top], [9], [0], [1], [1], [100]) == ([-(2**31)], [1])


@ours
def test_new_requests_read_nothing(backend):
    # The upstream vector 0.33.0 fails (D10): an empty previous batch, only new requests.
    assert update(backend, [10, 20], [9, 8], [-1, -1], [], [], [100, 200]) == ([100, 200], [9, 8])


def test_engine_gathers_for_new_requests():
    if "vllm" not in HOST:
        pytest.skip("no vLLM named")
    with pytest.raises(IndexError):  # D10 (conformance/engine/expected.toml)
        update("vllm", [10, 20], [9, 8], [-1, -1], [], [], [100, 200])



@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(prev_positions=i64([1, -1, 2])), ValueError, "prev_positions"),  # upstream: index 2 of a batch of 2
        (dict(prev_num_draft_tokens=i32([2])), ValueError, "prev_positions"),
        (dict(num_accepted_tokens=i32([9, 8])), ValueError, "num_accepted_tokens"),
        (dict(cpu_num_computed_tokens=i32([100, 200, 300, 400])), ValueError, "cpu_num_computed_tokens"),
        (dict(num_computed_tokens=i32([10, 20])), ValueError, "num_computed_tokens"),
        (dict(num_computed_tokens=i64([10, 20, 30, 40])), TypeError, "num_computed_tokens"),
        (dict(valid_sampled_token_count=torch.tensor([3.0, 4.0])), TypeError, "valid_sampled_token_count"),
    ],
)
def test_invalid(backend, change, error, param):
    a = dict(num_computed_tokens=i32([10, 20, 30, 40]), num_accepted_tokens=i32([9, 8, 7]), prev_positions=i64([1, -1, 0]),
             valid_sampled_token_count=i32([3, 4]), prev_num_draft_tokens=i32([2, 5, 0, 0]), cpu_num_computed_tokens=i32([100, 200, 300]))
    refused(backend, contract.K21, a | change, error, param)
