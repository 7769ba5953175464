"""Model Runner V2's sampling parameters (K36 ``_temperature_kernel``, K37 ``_min_p_kernel``):
goldens on every backend, IEEE division against the reciprocal, the min-p threshold's edges, vLLM's
launch form, and invalid input."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS, f32, i32, refused, run

from contracts import numerics
from contracts import sample as contract

backends = pytest.mark.parametrize("backend", BACKENDS)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF = math.inf


def temperature(backend: str, logits: torch.Tensor, mapping: list[int], temps: list[float], block: int = 16) -> torch.Tensor:
    v = logits.shape[1]
    a = run(backend, contract.K36, (logits.shape[0], -(-v // block)), logits_ptr=logits, logits_stride=logits.stride(0),
            expanded_idx_mapping_ptr=i32(mapping), temperature_ptr=f32(temps), vocab_size=v, BLOCK_SIZE=block)
    return a["logits_ptr"]


def min_p(backend: str, logits: torch.Tensor, mapping: list[int], ps: list[float], block: int = 16) -> torch.Tensor:
    a = run(backend, contract.K37, (logits.shape[0],), logits_ptr=logits, logits_stride=logits.stride(0),
            expanded_idx_mapping_ptr=i32(mapping), min_p_ptr=f32(ps), vocab_size=logits.shape[1], BLOCK_SIZE=block)
    return a["logits_ptr"]


@backends
def test_temperature_golden(backend):
    # Rows 0 and 2 share request 1 (T = 2): halved. Row 1 is greedy (T = 0) and row 3 has T = 1: untouched,
    # NaN (never read there) and -0.0 included. 20 columns: two 16-wide tiles, the second masked.
    x = torch.arange(80, dtype=torch.float32).view(4, 20) - 40.0
    x[1, 3], x[3, 5] = float("nan"), -0.0
    want = x.clone()
    want[0] /= 2.0
    want[2] /= 2.0
    got = temperature(backend, x, [1, 0, 1, 2], [0.0, 2.0, 1.0])
    assert torch.equal(got[[0, 2]], want[[0, 2]]) and torch.equal(got[[1, 3]].nan_to_num(7.0), want[[1, 3]].nan_to_num(7.0))
    assert got[3, 5].item() == 0.0 and math.copysign(1.0, got[3, 5].item()) == -1.0


def _exact_division(backend: str) -> None:
    """vLLM's compiled `/` is approximate: departure C6 (docs/sample.md), not a golden's business."""
    from conformance.backends import BACKENDS as REGISTERED

    if backend == "vllm" and "compiled" in REGISTERED["vllm"].mode():
        pytest.skip("departure C6: vLLM's compiled division is approximate (<= 2 ulp)")


@backends
def test_temperature_is_ieee_division(backend):
    _exact_division(backend)
    # 1/3 is no float32: x * RN(1/3) is an ulp off x / 3 for about a third of x; the contract divides.
    x = torch.linspace(-50.0, 50.0, 4096, dtype=torch.float32).view(4, 1024)
    got = temperature(backend, x.clone(), [0, 0, 0, 0], [3.0], block=256)
    assert torch.equal(got, x / torch.tensor(3.0))
    assert not torch.equal(got, x * torch.tensor(1.0 / 3.0, dtype=torch.float32))


@backends
def test_temperature_outside_the_reciprocal_range(backend):
    _exact_division(backend)
    x = torch.tensor([[1e-30, 3.0, -2.0, 0.0, float("inf"), 3e38]], dtype=torch.float32).repeat(3, 1)
    temps = [1e-7, 4e30, 3e-39]
    got = temperature(backend, x.clone(), [0, 1, 2], temps, block=8)
    assert torch.equal(got, x / f32(temps)[:, None])


@backends
def test_min_p_golden(backend):
    # Row 0: min-p 0.5 keeps logits >= max + log 0.5 = 3 - 0.693; row 1: min-p 0, untouched; row 2:
    # min-p 1 keeps the maximum's ties; row 3: min-p 2 masks everything; row 4 (-inf only) stays.
    x = f32([[3.0, 2.5, 2.0, -INF, 2.31, 2.30]] * 4 + [[-INF] * 6])
    got = min_p(backend, x.clone(), [0, 1, 2, 3, 0], [0.5, 0.0, 1.0, 2.0])
    ninf = -INF
    assert got.tolist() == [[3.0, 2.5, ninf, ninf, 2.309999942779541, ninf], x[1].tolist(), [3.0, ninf, ninf, ninf, ninf, ninf],
                            [ninf] * 6, [ninf] * 6]


@backends
def test_min_p_keeps_a_logit_at_its_threshold(backend):
    p = f32([0.1])
    threshold = float(torch.tensor(5.0) + numerics.log32(p)[0])
    below = float(torch.nextafter(f32(threshold), f32(-INF)))
    x = f32([[5.0, threshold, below, 4.0]])
    got = min_p(backend, x.clone(), [0], [0.1], block=4)
    assert got.tolist() == [[5.0, threshold, -INF, 4.0]]


@backends
def test_min_p_negative_or_nan_masks_nothing(backend):
    x = f32([[1.0, -30.0, 0.5]] * 2)
    assert torch.equal(min_p(backend, x.clone(), [0, 1], [-0.1, float("nan")], block=4), x)


@ours
def test_vllm_launch_form(backend):
    # apply_temperature's grid (num_tokens, cdiv(V, 8192)) and BLOCK_SIZE; apply_min_p's (num_tokens,) and 1024.
    x = torch.randn(3, 9000)
    want = x / 0.5
    got = temperature(backend, x.clone(), [0, 0, 0], [0.5], block=8192)
    assert torch.equal(got, want)
    got = min_p(backend, x.clone(), [0, 0, 0], [0.5], block=1024)
    assert torch.equal((got == -INF), x < (x.max(1, keepdim=True).values + numerics.log32(f32([0.5]))))


def _args(kernel: str) -> dict:
    table = "temperature_ptr" if kernel == contract.K36 else "min_p_ptr"
    return dict(logits_ptr=torch.zeros(2, 8), logits_stride=8, expanded_idx_mapping_ptr=i32([0, 1]), **{table: f32([0.5, 2.0])},
                vocab_size=8, BLOCK_SIZE=8)


@ours
@pytest.mark.parametrize("kernel", [contract.K36, contract.K37])
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(expanded_idx_mapping_ptr=i32([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([-1, 0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([0])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(logits_ptr=torch.zeros(1, 8), expanded_idx_mapping_ptr=i32([0]), vocab_size=9), ValueError, "logits_ptr"),
        (dict(vocab_size=9), ValueError, "logits_stride"),
        (dict(logits_stride=4), ValueError, "logits_stride"),
        (dict(BLOCK_SIZE=6), ValueError, "BLOCK_SIZE"),
        (dict(vocab_size=-1), ValueError, "vocab_size"),
        (dict(logits_ptr=torch.zeros(2, 8, dtype=torch.float64)), TypeError, "logits_ptr"),
        (dict(expanded_idx_mapping_ptr=f32([0, 1])), TypeError, "expanded_idx_mapping_ptr"),
    ],
)
def test_invalid(backend, kernel, change, error, param):
    refused(backend, kernel, _args(kernel) | change, error, param)


@ours
@pytest.mark.parametrize("t", [-0.5, float("inf"), float("nan")])
def test_temperature_refuses_what_makes_nan(backend, t):
    a = _args(contract.K36)
    a["temperature_ptr"] = f32([0.5, t])
    refused(backend, contract.K36, a, ValueError, "temperature_ptr")
    a["logits_ptr"][0, 2] = float("nan")
    a["temperature_ptr"] = f32([0.5, 1.0])
    refused(backend, contract.K36, a, ValueError, "logits_ptr")
    a["temperature_ptr"] = f32([1.0, 0.5])  # row 0 is not divided: its NaN is never read
    run(backend, contract.K36, (2, 1), **a)


@ours
def test_min_p_refuses_nan_where_it_reads(backend):
    a = _args(contract.K37)
    a["logits_ptr"][1, 3] = float("nan")
    refused(backend, contract.K37, a, ValueError, "logits_ptr")
    a["min_p_ptr"] = f32([0.5, 0.0])  # row 1 has no min-p: its NaN is never read
    run(backend, contract.K37, (2,), **a)
