"""Hostile input: each class the fuzz generates, pinned as a regression on the launchers
that validate (the oracle and the C++ port) — refused with the argument named, nothing written —
and the in-contract neighbours of each refusal still run."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from support import i32, i64, refused, run
from test_eagle import SEVEN_WIDE, step_args

from contracts import eagle, slot_mapping
from cpu_impl import _C

ROOT = Path(__file__).resolve().parents[1]

validating = pytest.mark.parametrize("backend", ["reference", "cpu"])
K5 = eagle.EAGLE_STEP_SLOT_MAPPING_METADATA.name
K7 = eagle.EAGLE_PREPARE_NEXT_TOKEN_PADDED.name
K10 = slot_mapping.COMPUTE_SLOT_MAPPING.name


def launch(backend, kernel, args):
    run(backend, kernel, (1,), **args)


def k5_args(**kw):
    return step_args([50, 98, 99, 100], i32(SEVEN_WIDE), [51, 99, 100, 101], 6, **kw)


@validating
def test_declared_alias_runs_and_undeclared_overlap_is_refused(backend):
    a = k5_args(alias=True)  # positions_ptr is out_clamped_positions_ptr
    launch(backend, K5, a)
    assert a["positions_ptr"].tolist() == [51, 99, 0, 0]
    # A view of the declared pair's memory at other indices changes what each program reads.
    a = k5_args()
    wide = torch.zeros(5, dtype=torch.int64)
    wide[:4] = a["positions_ptr"]
    a["positions_ptr"], a["out_clamped_positions_ptr"] = wide[:4], wide[1:5]
    refused(backend, K5, a, ValueError, "out_clamped_positions_ptr", "positions_ptr")
    # An output over an input the contract never lets it share: the slot mapping over the positions.
    a = k5_args()
    wide = torch.zeros(8, dtype=torch.int64)
    wide[:4] = a["positions_ptr"]
    a["positions_ptr"], a["out_slot_mapping_ptr"] = wide[:4], wide[2:8]
    refused(backend, K5, a, ValueError, "out_slot_mapping_ptr", "positions_ptr")


@validating
@pytest.mark.parametrize("mrope", [False, True], ids=["positions", "mrope_positions"])
def test_draft_step_aliasing_as_vllm_passes_it(backend, mrope):
    """vLLM's drafter (0.32.0 and 0.33.0, llm_base_proposer.py) passes positions_1d and
    out_clamped_positions as two slice objects of one buffer: self.positions[:batch_size] each
    time, or row 0 of mrope_positions. That launch is in contract and computes as if aliased."""
    expected = k5_args(alias=True)
    launch(backend, K5, expected)
    a = k5_args()
    b = a["batch_size"]
    if mrope:
        buf = torch.full((3, 16), 7, dtype=torch.int64)
        buf[0, :b] = a["positions_ptr"]
        a["positions_ptr"], a["out_clamped_positions_ptr"] = buf[:, :b][0], buf[0, :b]
    else:
        buf = torch.full((16,), 7, dtype=torch.int64)
        buf[:b] = a["positions_ptr"]
        a["positions_ptr"], a["out_clamped_positions_ptr"] = buf[:b], buf[:b]
    assert a["positions_ptr"] is not a["out_clamped_positions_ptr"]
    launch(backend, K5, a)
    for name in ("out_clamped_positions_ptr", "out_slot_mapping_ptr", "seq_lens_ptr"):
        assert a[name].tolist() == expected[name].tolist(), name
    untouched = buf[1:, :] if mrope else buf[b:]
    assert (untouched == 7).all()


@validating
@pytest.mark.parametrize("fault", ["negative view", "sparse", "fake", "grad"])
def test_tensors_without_plain_memory_are_type_errors(backend, fault):
    a = k5_args()
    if fault == "negative view":
        a["positions_ptr"] = torch._neg_view(-a["positions_ptr"])  # same values, negated memory
    elif fault == "sparse":
        a["positions_ptr"] = a["positions_ptr"].to_sparse()
    elif fault == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            a["positions_ptr"] = torch.empty(4, dtype=torch.int64)
    else:  # the only float output in the ten V1 kernels' contracts is expand_kernel's
        out = torch.zeros(2, requires_grad=True)
        args = dict(output_ptr=out, input_ptr=torch.ones(2), cu_num_tokens_ptr=i32([1, 2]), replace_from=0, replace_to=1,
                    MAX_NUM_TOKENS=2)
        refused(backend, "expand_kernel", args, TypeError, "output_ptr")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fake tensor's data-pointer warning
        refused(backend, K5, a, TypeError, "positions_ptr")


@validating
def test_overflowing_products_are_refused_and_their_neighbours_run(backend):
    def args(kbs, world, interleave):
        return dict(num_tokens=2, max_num_tokens=2, query_start_loc_ptr=i32([0, 2]), positions_ptr=i64([0, 1]),
                    block_table_ptr=i32([[3, 4]]), block_table_stride=2, slot_mapping_ptr=i64([9, 9]),
                    KV_CACHE_BLOCK_SIZE=kbs, TOTAL_CP_WORLD_SIZE=world, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=interleave,
                    PAD_ID=-1, BLOCK_SIZE=4)

    refused(backend, K10, args(2**32, 2**31, 1), ValueError, "TOTAL_CP_WORLD_SIZE")
    refused(backend, K10, args(1, 2**32, 2**31), ValueError, "CP_KV_CACHE_INTERLEAVE_SIZE")
    a = args(2**31, 2**31, 1)  # 2**62 positions per virtual block: in int64; position 1 is rank 1's
    launch(backend, K10, a)
    assert a["slot_mapping_ptr"].tolist() == [3 * 2**31, -1]


@validating
def test_dflash_last_query_position_past_int64_is_refused(backend):
    big = 2**63 - 2  # last + 1 + k wraps for k >= 1: a negative block column, read before the table
    args = dict(next_token_ids_ptr=i64([5]), target_positions_ptr=i64([big]), out_input_ids_ptr=i32([0, 0]),
                out_context_positions_ptr=i64([0]), out_query_positions_ptr=i64([0, 0]),
                out_context_slot_mapping_ptr=i64([0]), out_query_slot_mapping_ptr=i64([0, 0]),
                out_token_indices_ptr=i32([0]), block_table_ptr=i32([[1, 2]]), block_table_stride=2,
                query_start_loc_ptr=i32([0, 1]), num_rejected_tokens_ptr=0, parallel_drafting_token_id=7,
                block_size=16, num_query_per_req=2, num_speculative_tokens=1, total_input_tokens=1, BLOCK_SIZE=4,
                HAS_NUM_REJECTED=False)
    refused(backend, "copy_and_expand_dflash_inputs_kernel", args, ValueError, "target_positions_ptr")


@validating
def test_a_huge_count_of_stride_zero_rows_is_refused_at_once(backend):
    # 2**62 requests whose sampled rows all sit at row 0: one row to check, then the short masks refuse.
    args = dict(sampled_token_ids_ptr=i64([[1, 2]]), discard_request_mask_ptr=torch.tensor([False]),
                backup_next_token_ids_ptr=i64([0]), next_token_ids_ptr=i64([0]), valid_sampled_tokens_count_ptr=i64([0]),
                vocab_size=10, num_sampled_tokens_per_req=2, num_reqs=2**62, stride_sampled_token_ids=0,
                BLOCK_SIZE_TOKENS=2)
    started = time.perf_counter()
    refused(backend, K7, args, ValueError, "discard_request_mask_ptr")
    assert time.perf_counter() - started < 5


@validating
def test_no_column_to_read_takes_any_stride(backend):
    args = dict(sampled_token_ids_ptr=torch.zeros(2, 0, dtype=torch.int64), discard_request_mask_ptr=torch.tensor([False, False]),
                backup_next_token_ids_ptr=i64([4, 5]), next_token_ids_ptr=i64([0, 0]), valid_sampled_tokens_count_ptr=i64([9, 9]),
                vocab_size=10, num_sampled_tokens_per_req=0, num_reqs=2, stride_sampled_token_ids=-(2**63), BLOCK_SIZE_TOKENS=1)
    launch(backend, K7, args)
    assert args["next_token_ids_ptr"].tolist() == [4, 5] and args["valid_sampled_tokens_count_ptr"].tolist() == [0, 0]


@pytest.mark.parametrize("threads", [0, -1, 1025, 2**31])
def test_set_num_threads_is_bounded(threads):
    before = _C.max_threads()
    with pytest.raises(ValueError, match="'threads'"):
        _C.set_num_threads(threads)
    assert _C.max_threads() == before


def test_k7_oracle_is_linear_in_the_batch():
    # 200,000 requests took five minutes when each row sliced the rest of the batch; linear, well under a second.
    n = 200_000
    args = dict(sampled_token_ids_ptr=torch.ones(n, 4, dtype=torch.int64), discard_request_mask_ptr=torch.zeros(n, dtype=torch.bool),
                backup_next_token_ids_ptr=torch.zeros(n, dtype=torch.int64), next_token_ids_ptr=torch.zeros(n, dtype=torch.int64),
                valid_sampled_tokens_count_ptr=torch.zeros(n, dtype=torch.int64), vocab_size=10, num_sampled_tokens_per_req=4,
                num_reqs=n, stride_sampled_token_ids=4, BLOCK_SIZE_TOKENS=4)
    started = time.perf_counter()
    launch("reference", K7, args)
    assert time.perf_counter() - started < 30
    assert bool((args["valid_sampled_tokens_count_ptr"] == 4).all()) and bool((args["next_token_ids_ptr"] == 1).all())


RACE = r"""
import sys, threading
import torch
from cpu_impl.rejection import rejection_greedy_sample_kernel as kernel

B, GUARD = 300_000, 1 << 20
torch.set_num_threads(1)
cu = torch.arange(1, B + 1, dtype=torch.int32)  # one draft a request
wrong = torch.full((B,), 2**31 - 1, dtype=torch.int32)  # every count past the drafts the launch was checked against
draft = torch.zeros(B, dtype=torch.int32)
argmax = torch.zeros(B, dtype=torch.int64)
bonus = torch.zeros(B, 1, dtype=torch.int32)
# The output [B, 2] inside a buffer with a megabyte of guard on each side.
whole = torch.full((2 * GUARD + 2 * B,), 7, dtype=torch.int32)
out = whole[GUARD : GUARD + 2 * B].view(B, 2)
stop = threading.Event()

def writer():
    while not stop.is_set():
        cu.copy_(wrong)
        cu.copy_(torch.arange(1, B + 1, dtype=torch.int32))

t = threading.Thread(target=writer)
t.start()
launched = refused = 0
try:
    for _ in range(int(sys.argv[1])):
        cu.copy_(torch.arange(1, B + 1, dtype=torch.int32))
        try:
            kernel[(B,)](out, cu, draft, argmax, bonus, None, 1, None, None, SYNTHETIC_MODE=False)
            launched += 1
        except ValueError:
            refused += 1  # the writer got in before the check: refused, as it must be
finally:
    stop.set()
    t.join()
touched = int((whole[:GUARD] != 7).sum() + (whole[GUARD + 2 * B :] != 7).sum())
print(f"launched {launched} refused {refused} guard cells written {touched}")
sys.exit(1 if touched else 0)
"""


def test_a_thread_rewriting_the_counts_mid_launch_sends_nothing_past_the_output():
    # The port checks cu_num_draft_tokens_ptr, releases the GIL and loops: counts rewritten by another
    # thread after the check once sent the loop 850,000 elements before the output, or into SIGSEGV.
    done = subprocess.run([sys.executable, "-c", RACE, "40"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.returncode, done.stdout[-1000:], done.stderr[-2000:])
    assert "launched" in done.stdout and " launched 0 " not in f" {done.stdout}", done.stdout
