"""vLLM's CPU sampler ops (K34 greedy_argmax, K35 fused_gumbel_argmax): goldens, the random stream
against an independent statement of SplitMix64, the sampled distribution, the engine's two failing
vectors, and invalid input. vLLM implements them as C++ ops of its CPU build: no Triton form."""

from __future__ import annotations

import math

import pytest
import torch
from support import BACKENDS as ALL
from support import f32, i64, refused, run, vllm_spec

from conformance.backends import BACKENDS
from conformance.strategies.argmax import seed_drawing_top
from contracts import argmax as contract

HOST = tuple(b for b in ALL if BACKENDS[b].applies(contract.GREEDY_ARGMAX))
backends = pytest.mark.parametrize("backend", HOST)
ours = pytest.mark.parametrize("backend", ["reference", "cpu"])
INF, NAN = math.inf, math.nan


def greedy(backend: str, logits: list[list[float]]) -> list[int]:
    x = f32(logits)
    return run(backend, contract.K34, (1,), sampled=torch.empty(x.shape[0], dtype=torch.int64), logits=x)["sampled"].tolist()


def gumbel(backend: str, logits: list[list[float]] | torch.Tensor, seeds: list[int]) -> list[int]:
    x = logits if isinstance(logits, torch.Tensor) else f32(logits)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    return run(backend, contract.K35, (1,), sampled=out, logits=x, seeds=i64(seeds))["sampled"].tolist()


@backends
def test_greedy_golden(backend):
    # The first maximum; the first NaN over any maximum; -0.0 equals 0.0; a row of -inf gives 0.
    assert greedy(backend, [[1, 3, 3, 2], [1, NAN, 5, NAN], [-0.0, 0.0, -1, -2], [-INF] * 4, [-INF, INF, 1, INF]]) == [1, 1, 0, 0, 1]


@backends
def test_greedy_one_row_and_none(backend):
    assert greedy(backend, [[0.5, 0.25, 0.75]]) == [2]
    x = torch.empty(0, 7)
    assert run(backend, contract.K34, (1,), sampled=torch.empty(0, dtype=torch.int64), logits=x)["sampled"].numel() == 0


def _splitmix64(z: int) -> int:
    """SplitMix64's finalizer, as its author states it, on Python ints."""
    m = 2**64 - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_the_stream_is_splitmix64():
    for seed in (0, 1, 2**31 - 1, -1, -(2**63)):
        key = _splitmix64(seed & (2**64 - 1))
        want = [_splitmix64((key + (i + 1) * 0x9E3779B97F4A7C15) & (2**64 - 1)) >> 11 for i in range(9)]
        assert contract.draws(seed, 9).tolist() == want


@backends
def test_gumbel_golden(backend):
    seeds = [7, 7, 123, 5, 9]
    # Equal logits: the token of the largest noise; -inf tokens are never sampled; a row of -inf gives
    # 0; the first +inf logit wins (every later inf - inf is NaN).
    rows = [[0.0] * 6, [-INF, 0.0, -INF, 0.0, -INF, 0.0], [-INF] * 6, [1.0, INF, 2.0, INF, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1e30]]
    noise = [_noise(d) for d in contract.draws(7, 6).tolist()]
    best = max(range(6), key=lambda i: noise[i])
    odd = max((1, 3, 5), key=lambda i: noise[i])
    assert gumbel(backend, rows, seeds) == [best, odd, 0, 1, 5]


def _noise(d: int) -> float:
    return -math.log(-math.log((d + 0.5) * 2.0**-53))


@backends
def test_noise_next_to_the_largest_logits_decides(backend):
    # Two equal logits at float32's largest value: added to 3.4e38 the noise is lost, compared in
    # (logit, noise) space it decides.
    top = 3.4028234663852886e38
    noise = [_noise(d) for d in contract.draws(11, 3).tolist()]
    want = max((1, 2), key=lambda i: noise[i])
    assert gumbel(backend, [[-1.0, top, top]], [11]) == [want]
    noise = [_noise(d) for d in contract.draws(13, 3).tolist()]
    assert gumbel(backend, [[-1.0, top, top]], [13]) == [max((1, 2), key=lambda i: noise[i])]


@ours
def test_gumbel_samples_softmax(backend):
    # Gumbel-max: token i with probability softmax(x)_i. 4,000 seeds at the call site's range,
    # each frequency within five standard deviations.
    x = torch.tensor([0.0, 1.0, 2.0, -1.0]).repeat(4000, 1)
    seeds = torch.randint(0, contract.CALL_SITE_SEEDS, (4000,), generator=torch.Generator().manual_seed(3)).tolist()
    sampled = torch.tensor(gumbel(backend, x, seeds))
    p = torch.softmax(x[0].double(), 0)
    freq = torch.bincount(sampled, minlength=4).double() / len(seeds)
    sd = (p * (1 - p) / len(seeds)).sqrt()
    assert ((freq - p).abs() <= 5 * sd).all(), (freq, p)


@ours
def test_neighbouring_seeds_draw_independent_rows(backend):
    # vllm#59786: consecutive seeds must not draw a table shifted by one token. Over a flat row the
    # tokens of seeds s and s + 1 agree about 1/V of the time.
    v, n = 64, 2000
    x = torch.zeros(n, v)
    a = torch.tensor(gumbel(backend, x, list(range(n))))
    b = torch.tensor(gumbel(backend, x, list(range(1, n + 1))))
    assert int((a[1:] == b[:-1]).sum()) == n - 1  # same seed, same token
    for shift in (1, -1):
        assert int(((a + shift) % v == b).sum()) < 5 * n // v


def _top_first() -> tuple[list[list[float]], list[int]]:
    # Token 0 draws 2**53 - 1: its u, 1 - 2**-54, rounds to 1.0. Its noise is -log(2**-54) = 37.43,
    # so token 1, 50 above, is sampled; with +inf noise token 0 would be, however far below.
    return [[0.0, 50.0]], [seed_drawing_top(0, 0x155)]


def _near_top_pruned() -> tuple[torch.Tensor, list[int]]:
    # Token 1 draws 2**53 - 3: d + 0.5 rounds up, u = 1 - 2**-52, its noise 52 ln 2 = 36.04. With
    # token 1's logit 35.93 below token 0's total, it wins; (2**53 - 1 - d + 0.5) * 2**-53, 1 - u
    # before u's rounding, is a quarter more than 1 - u and prunes it where -log(2.5 * 2**-53) = 35.82
    # is below the gap.
    seed = seed_drawing_top(1, 0x2A, below=2)
    g0 = _noise(int(contract.draws(seed, 2)[0]))
    return torch.tensor([[0.0, g0 - 35.93]]), [seed]


@ours
@pytest.mark.parametrize("vector", [_top_first, _near_top_pruned])
def test_draws_near_the_top(backend, vector):
    logits, seeds = vector()
    assert gumbel(backend, logits, seeds) == [1]


@pytest.mark.parametrize("vector", [_top_first, _near_top_pruned])
def test_engine_op_departs_near_the_top(vector):
    if vllm_spec() is None or BACKENDS["vllm-cpu"].unavailable() is not None:
        pytest.skip("no vLLM named, or no C++ toolchain for its CPU ops")
    logits, seeds = vector()
    assert gumbel("vllm-cpu", logits, seeds) == [0]  # D16 (conformance/engine/expected.toml)


def test_no_triton_form():
    for b in ("triton", "vllm"):
        assert not BACKENDS[b].applies(contract.FUSED_GUMBEL_ARGMAX)
        assert "C++ op of its CPU build" in BACKENDS[b].inapplicable(contract.FUSED_GUMBEL_ARGMAX)


@ours
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(logits=torch.zeros(2, 0)), ValueError, "logits"),
        (dict(logits=torch.zeros(2, 3, dtype=torch.float64)), TypeError, "logits"),
        (dict(logits=torch.zeros(6)), ValueError, "logits"),
        (dict(logits=torch.zeros(3, 2).t()), ValueError, "logits"),  # no unit inner stride
        (dict(sampled=torch.zeros(3, dtype=torch.int64)), ValueError, "sampled"),
        (dict(sampled=torch.zeros(2, dtype=torch.int32)), TypeError, "sampled"),
        (dict(seeds=i64([1, 2, 3])), ValueError, "seeds"),
        (dict(seeds=torch.tensor([1, 2], dtype=torch.int32)), TypeError, "seeds"),
    ],
)
def test_invalid(backend, change, error, param):
    a = dict(sampled=torch.zeros(2, dtype=torch.int64), logits=torch.zeros(2, 3), seeds=i64([1, 2]))
    refused(backend, contract.K35, a | change, error, param)
    if param != "seeds":
        refused(backend, contract.K34, {k: v for k, v in (a | change).items() if k != "seeds"}, error, param)
