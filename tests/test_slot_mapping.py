"""KV slot mapping (K10, vLLM's ComputeSlotMappingKernel.kernel): the spec's golden examples on
every backend, Hypothesis conformance across the three backends, and invalid input on the
reference and CPU launchers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import BACKENDS as BACKEND_NAMES
from support import i32, i64, run

from conformance.backends import BACKENDS
from contracts import slot_mapping as contract
from contracts.spec import KernelSpec

I32, I64 = torch.int32, torch.int64
POISON = -9


backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])


def launch(backend: str, spec: KernelSpec, args: dict[str, Any]) -> None:
    """Launches as vLLM does, by keyword, with the canonical grid; outputs land in ``args``."""
    run(backend, spec.name, spec.grid(args), **args)


def slot_args(qsl, positions, table, max_num_tokens, *, kbs=16, world=1, rank=0, interleave=1, num_tokens=None, tile=1024):
    table = i32(table)
    return dict(
        num_tokens=len(positions) if num_tokens is None else num_tokens,
        max_num_tokens=max_num_tokens,
        query_start_loc_ptr=i32(qsl),
        positions_ptr=i64(positions),
        block_table_ptr=table,
        block_table_stride=table.stride(0),
        slot_mapping_ptr=torch.full((max(max_num_tokens, qsl[-1]),), POISON, dtype=I64),
        KV_CACHE_BLOCK_SIZE=kbs,
        TOTAL_CP_WORLD_SIZE=world,
        TOTAL_CP_RANK=rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=interleave,
        PAD_ID=-1,
        BLOCK_SIZE=tile,
    )


TABLE = [[3, 7, 9, 0], [5, 6, 0, 0]]
SMALL = [[3, 7], [0, 0]]
GOLDEN = {
    # args, slot mapping
    "W1": (slot_args([0, 3, 5], [0, 4, 17, 2, 3], TABLE, 8), [48, 52, 113, 82, 83, -1, -1, -1]),
    "W2-I1-rank0": (slot_args([0, 4], [0, 1, 2, 3], SMALL, 6, kbs=2, world=2, rank=0), [6, -1, 7, -1, -1, -1]),
    "W2-I1-rank1": (slot_args([0, 4], [0, 1, 2, 3], SMALL, 6, kbs=2, world=2, rank=1), [-1, 6, -1, 7, -1, -1]),
    "W2-I2-rank0": (slot_args([0, 8], list(range(8)), SMALL, 8, kbs=2, world=2, rank=0, interleave=2), [6, 7, -1, -1, 14, 15, -1, -1]),
    "W2-I2-rank1": (slot_args([0, 8], list(range(8)), SMALL, 8, kbs=2, world=2, rank=1, interleave=2), [-1, -1, 6, 7, -1, -1, 14, 15]),
    # vbi = 4 runs past row 0 into row 1's first entry, 5 (C22).
    "past-the-row": (slot_args([0, 1], [64], TABLE, 2), [80, -1]),
    # Untouched gaps: [0, qsl[0]) and [qsl[R], num_tokens) keep their poison; the tail is padded.
    "gaps": (slot_args([1, 3], [99, 0, 4, 99], TABLE, 6), [POISON, 48, 52, POISON, -1, -1]),
    "no-requests": (slot_args([0], [7], TABLE, 3), [POISON, -1, -1]),  # only the tail program writes
    "no-tail": (slot_args([0, 3, 5], [0, 4, 17, 2, 3], TABLE, 4), [48, 52, 113, 82, 83]),
    "several-tiles": (slot_args([0, 3, 5], [0, 4, 17, 2, 3], TABLE, 8, tile=2), [48, 52, 113, 82, 83, -1, -1, -1]),
}


@backends
@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(backend, name):
    args, expected = GOLDEN[name]
    a = {k: v.clone() if k == "slot_mapping_ptr" else v for k, v in args.items()}
    launch(backend, contract.COMPUTE_SLOT_MAPPING, a)
    assert a["slot_mapping_ptr"].tolist() == expected


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"])
def test_vllm_attribute_path(backend):
    """vLLM's override registry names this kernel ComputeSlotMappingKernel.kernel."""
    import importlib

    module = importlib.import_module({"reference": "reference", "triton": "triton_impl", "cpu": "cpu_impl"}[backend] + ".slot_mapping")
    assert module.ComputeSlotMappingKernel.kernel is module.compute_slot_mapping_kernel
    assert module.ComputeSlotMappingKernel().kernel is module.compute_slot_mapping_kernel
    assert contract.COMPUTE_SLOT_MAPPING.qualname.endswith("ComputeSlotMappingKernel.kernel")



# -- invalid input -----------------------------------------------------------------------------------
@cpu_and_reference
@pytest.mark.parametrize(
    "change, param",
    [
        (dict(positions_ptr=i64([0, 4, -17, 2, 3])), "positions_ptr"),
        (dict(positions_ptr=i64([0, 4, 17, 2, 64])), "block_table_ptr"),  # vbi 4 of row 1: past the table
        (dict(block_table_ptr=i32([[3, 7, 9, 0, 1, 1], [5, 6, 0, 0, 1, 1]])[:, :4], positions_ptr=i64([0, 4, 64, 2, 3])), "block_table_ptr"),  # a gap
        (dict(TOTAL_CP_RANK=1), "TOTAL_CP_RANK"),
        (dict(num_tokens=4), "num_tokens"),
        (dict(slot_mapping_ptr=torch.full((7,), POISON, dtype=I64)), "slot_mapping_ptr"),
        (dict(query_start_loc_ptr=i32([0, 3, 2])), "query_start_loc_ptr"),
        (dict(BLOCK_SIZE=1000), "BLOCK_SIZE"),
        (dict(block_table_stride=2**63 - 1), "block_table_ptr"),  # request 1's row: a flat index that wraps in int64
        (dict(slot_mapping_ptr=torch.full((8,), POISON, dtype=torch.int32), PAD_ID=2**31), "PAD_ID"),  # past the int32 output
        # Request 2, virtual block 2: 2 * (2**63 - 1) + 2 wraps in int64 to element 0, a real element.
        (dict(query_start_loc_ptr=i32([0, 1, 1, 3]), positions_ptr=i64([0, 32, 33]), num_tokens=3, block_table_ptr=i32(TABLE + [[1, 2, 3, 4]]),
              block_table_stride=2**63 - 1), "block_table_ptr"),
    ],
)
def test_invalid(backend, change, param):
    a = slot_args([0, 3, 5], [0, 4, 17, 2, 3], TABLE, 8)
    a.update(change)
    a["block_table_stride"] = change.get("block_table_stride", a["block_table_ptr"].stride(0))
    before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=param):
        BACKENDS[backend].resolve(contract.COMPUTE_SLOT_MAPPING)(**a)
    for k, v in before.items():
        assert torch.equal(a[k], v), f"{k} was written before the error"


@cpu_and_reference
def test_wrong_dtype_is_a_type_error(backend):
    a = slot_args([0, 3, 5], [0, 4, 17, 2, 3], TABLE, 8)
    a["positions_ptr"] = a["positions_ptr"].float()
    with pytest.raises(TypeError, match="positions_ptr"):
        BACKENDS[backend].resolve(contract.COMPUTE_SLOT_MAPPING)(**a)

