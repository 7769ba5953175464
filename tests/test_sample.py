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


# -- K38 ---------------------------------------------------------------------------------------------
def gumbel_args(logits: torch.Tensor, mapping: list[int], temps: list[float], seeds: list[int], pos: list[int], block: int = 8,
                fp64: bool = False, cache: torch.Tensor | None = None, col: torch.Tensor | None = None, drafting: bool = False) -> dict:
    n, v = logits.shape
    nb = -(-v // block)
    return dict(local_argmax_ptr=torch.full((n, nb), -9, dtype=torch.int64), local_argmax_stride=nb,
                local_max_ptr=torch.zeros(n, nb, dtype=torch.float64 if fp64 else torch.float32), local_max_stride=nb,
                logits_cache_ptr=cache, logits_cache_stride_0=cache.stride(0) if cache is not None else 0,
                logits_cache_stride_1=cache.stride(1) if cache is not None else 0, logits_cache_col_ptr=col,
                logits_cache_source_ptr=logits if cache is not None else None,
                logits_cache_source_stride=logits.stride(0) if cache is not None else 0,
                logits_ptr=logits, logits_stride=logits.stride(0), expanded_idx_mapping_ptr=i32(mapping),
                seeds_ptr=torch.tensor(seeds, dtype=torch.int64), pos_ptr=torch.tensor(pos, dtype=torch.int64), temp_ptr=f32(temps),
                vocab_size=v, BLOCK_SIZE=block, IS_DRAFTING=drafting, APPLY_TEMPERATURE=drafting, USE_FP64=fp64,
                PER_TOKEN_COL=col is not None and col.dim() > 0)


def sample_tiles(backend: str, a: dict) -> dict:
    n, nb = a["local_argmax_ptr"].shape
    return run(backend, contract.K38, (n, nb), **a)


def _winner(a: dict) -> list[int]:
    """The host's reduction (gumbel_sample): each row's best tile, its column."""
    best = a["local_max_ptr"].argmax(-1, keepdim=True)
    return a["local_argmax_ptr"].gather(-1, best).view(-1).tolist()


@backends
def test_gumbel_greedy_and_padding_rows_take_the_first_maximum(backend):
    # Row 0 greedy (state 0, T = 0), row 1 a padding row: no noise; ties and signed zeros go to the
    # first column; a tile of -inf reports its first column.
    x = f32([[1.0, 3.0, 3.0, -INF, -INF, -INF, -INF, -INF, 0.5, 2.0],
             [-0.0, 0.0, -INF, -INF, -INF, -INF, -INF, -INF, -INF, -INF]])
    a = sample_tiles(backend, gumbel_args(x.clone(), [0, -1], [0.0], [5], [3, 4]))
    assert a["local_argmax_ptr"].tolist() == [[1, 9], [0, 8]]
    assert a["local_max_ptr"].tolist() == [[3.0, 2.0], [0.0, -INF]]
    if backend != "vllm":  # vLLM may report -0.0: departure C30
        assert math.copysign(1.0, a["local_max_ptr"][1, 0].item()) == 1.0  # -0.0 reads as +0.0 (C30)


@ours
def test_gumbel_samples_softmax(backend):
    # One row per seed over logits [0, 1, 2, -1]: the winners' frequencies are softmax's.
    n = 3000
    x = torch.tensor([0.0, 1.0, 2.0, -1.0]).repeat(n, 1)
    a = sample_tiles(backend, gumbel_args(x, list(range(n)), [1.0] * n, list(range(n)), [7] * n, block=4))
    freq = torch.bincount(torch.tensor(_winner(a)), minlength=4).double() / n
    p = torch.softmax(x[0].double(), 0)
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all(), (freq, p)


@ours
def test_the_draft_and_its_verifier_do_not_share_a_stream(backend):
    # The same request, position and flat logits drafted and verified: the winners agree about 1/V
    # of the time (the draft's position is salted by 2**30), not always.
    n, v = 2000, 32
    x = torch.zeros(n, v)
    args = dict(mapping=list(range(n)), temps=[1.0] * n, seeds=list(range(n)), pos=[11] * n, block=32)
    verified = _winner(sample_tiles(backend, gumbel_args(x.clone(), **args)))
    drafted = _winner(sample_tiles(backend, gumbel_args(x.clone(), drafting=True, **args)))
    same = sum(d == t for d, t in zip(drafted, verified))
    assert same < 3 * n // v, same
    # The salt is the position's 2**30: the draft's stream is the target's at position + 2**30.
    salted = _winner(sample_tiles(backend, gumbel_args(x.clone(), **{**args, "pos": [11 + 2**30] * n})))
    assert salted == drafted


@ours
def test_the_drafter_caches_raw_logits_and_seeds_by_column(backend):
    # Rows of states 2 and 0 copy their raw logits into the cache at column 1; the temperature divides
    # in the kernel; the seed takes the column in its high word (spec_step_seed).
    x = torch.randn(2, 12)
    cache = torch.full((3, 2, 12), 9.0)
    a = sample_tiles(backend, gumbel_args(x.clone(), [2, 0], [0.5, 1.0, 2.0], [4, 5, 6], [20, 21], block=4, cache=cache,
                                          col=torch.tensor(1), drafting=True))
    assert torch.equal(a["logits_cache_ptr"][2, 1], x[0]) and torch.equal(a["logits_cache_ptr"][0, 1], x[1])
    assert bool((a["logits_cache_ptr"][1] == 9.0).all()) and bool((a["logits_cache_ptr"][:, 0] == 9.0).all())
    b = gumbel_args(x.clone(), [2, 0], [0.5, 1.0, 2.0], [4 ^ (1 << 32), 5, 6 ^ (1 << 32)], [20, 21], block=4, drafting=True)
    b = sample_tiles(backend, b)
    assert torch.equal(a["local_argmax_ptr"], b["local_argmax_ptr"]) and torch.equal(a["local_max_ptr"], b["local_max_ptr"])


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(temp_ptr=f32([-1.0, 1.0])), ValueError, "temp_ptr"),
        (dict(temp_ptr=f32([float("nan"), 1.0])), ValueError, "temp_ptr"),
        (dict(expanded_idx_mapping_ptr=i32([0, 2])), ValueError, "expanded_idx_mapping_ptr"),
        (dict(pos_ptr=torch.tensor([-1, 0])), ValueError, "pos_ptr"),
        (dict(local_max_stride=1), ValueError, "local_max_stride"),
        (dict(vocab_size=0), ValueError, "vocab_size"),
        (dict(local_max_ptr=torch.zeros(2, 2, dtype=torch.float64)), ValueError, "USE_FP64"),
    ],
)
def test_gumbel_invalid(backend, change, error, param):
    a = gumbel_args(torch.zeros(2, 16), [0, 1], [1.0, 0.0], [1, 2], [0, 1])
    refused(backend, contract.K38, a | change, error, param)


@ours
def test_gumbel_refuses_what_it_cannot_judge(backend):
    x = torch.zeros(2, 16)
    x[1, 3] = float("nan")
    refused(backend, contract.K38, gumbel_args(x, [0, -1], [1.0], [1], [0, 1]), ValueError, "logits_ptr")  # a padding row too
    # Two rows of one request copying into one cache column race: refused.
    cache = torch.zeros(2, 2, 16)
    a = gumbel_args(torch.zeros(2, 16), [1, 1], [1.0, 1.0], [1, 2], [0, 1], cache=cache, col=torch.tensor(0), drafting=True)
    refused(backend, contract.K38, a, ValueError, "expanded_idx_mapping_ptr")
    a = gumbel_args(torch.zeros(1, 16), [1], [1.0, 1.0], [1, 2], [0], cache=cache, col=torch.tensor(2), drafting=True)
    refused(backend, contract.K38, a, ValueError, "logits_cache_col_ptr")


@backends
def test_gumbel_call_site_tiles_agree_with_the_oracle(backend):
    # The call site's 1024-wide tiles, where our Triton kernel scores only the 128-column rows whose
    # noise bound can reach the tile's best: the same winners and scores as scoring every lane.
    from reference import sample as oracle

    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 3000, generator=g) * 3
    x[0, ::3] = -INF
    x[1, :1024] = -INF  # a tile of -inf only
    args = dict(mapping=[0, 1, 2], temps=[1.0, 0.5, 2.0], seeds=[3, -5, 2**40], pos=[1, 2, 3], block=1024)
    want = gumbel_args(x.clone(), **args)
    oracle._gumbel_sample_kernel(**want)
    got = sample_tiles(backend, gumbel_args(x.clone(), **args))
    assert torch.equal(got["local_argmax_ptr"], want["local_argmax_ptr"])
    if backend != "vllm":  # vLLM's scores depart by C29's ulps
        assert torch.equal(got["local_max_ptr"], want["local_max_ptr"])
