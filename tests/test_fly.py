"""The FLy pre-pass (K19, K20): goldens, every deferral condition on its own, the window's view of
the launch's values, Hypothesis conformance across the backends, and invalid input."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from support import BACKENDS as BACKEND_NAMES
from support import f32, f64, i32, i64, refused, run

from contracts import fly as contract

backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
cpu_and_reference = pytest.mark.parametrize("backend", ["reference", "cpu"])
V = 8


def greedy_args(draft, argmax, *, entropy=None, logits=None, cu=None, is_greedy=None, threshold=0.3, window=1) -> dict[str, Any]:
    t = len(draft)
    return dict(
        cu_num_draft_tokens_ptr=i32(cu or [t]),
        draft_token_ids_ptr=i32(draft),
        target_argmax_ptr=i64(argmax),
        target_logits_ptr=f32(logits) if logits is not None else torch.zeros(t, V),
        fly_entropy_ptr=f32(entropy or [2.0] * t),
        is_greedy_ptr=None if is_greedy is None else torch.tensor(is_greedy),
        vocab_size=V,
        fly_entropy_threshold=threshold,
        FLY_WINDOW_SIZE=window,
    )


def random_args(draft, u, *, p=0.5, q=None, entropy=None, cu=None, is_greedy=None, threshold=0.3, window=1) -> dict[str, Any]:
    """Every row's draft cell holds ``p`` (and ``q``, when given): scalars, or one value per row."""
    t = len(draft)

    def rows(x):
        out = torch.zeros(t, V)
        for i, d in enumerate(draft):
            if 0 <= d < V:
                out[i, d] = x[i] if isinstance(x, list) else x
        return out

    return dict(
        cu_num_draft_tokens_ptr=i32(cu or [t]),
        draft_token_ids_ptr=i32(draft),
        draft_probs_ptr=None if q is None else rows(q),
        target_probs_ptr=rows(p),
        uniform_probs_ptr=f64(u),
        fly_entropy_ptr=f32(entropy or [2.0] * t),
        is_greedy_ptr=torch.tensor(is_greedy or [False] * len(cu or [t])),
        vocab_size=V,
        fly_entropy_threshold=threshold,
        NO_DRAFT_PROBS=q is None,
        FLY_WINDOW_SIZE=window,
    )


def greedy(backend: str, a: dict[str, Any]) -> list[int]:
    run(backend, contract.K19, contract.APPLY_FLY_GREEDY.grid(a), **a)
    return a["target_argmax_ptr"].tolist()


def random(backend: str, a: dict[str, Any]) -> list[float]:
    run(backend, contract.K20, contract.APPLY_FLY_RANDOM.grid(a), **a)
    return a["uniform_probs_ptr"].tolist()


# -- goldens (docs/fly.md) -------------------------------------------------------------------------------
@backends
def test_golden_greedy(backend):
    # Position 0 is rejected (4 != 1), uncertain, and position 1 is accepted: deferred. Position 2
    # has no room for a window.
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6])) == [4, 5, 6]


@backends
def test_golden_random(backend):
    assert random(backend, random_args([4, 5, 6], [0.99, 0.1, 0.1])) == [0.0, 0.1, 0.1]


@backends
def test_windows_read_the_launch_values(backend):
    # Position 1 defers; position 0's window must still see position 1 rejected (argmax 2, not 5).
    assert greedy(backend, greedy_args([4, 5, 6, 7], [1, 2, 6, 7])) == [1, 5, 6, 7]
    # Position 1 defers (u -> 0); position 0's window must still see its uniform 0.99.
    assert random(backend, random_args([4, 5, 6, 7], [0.99, 0.99, 0.1, 0.1])) == [0.99, 0.0, 0.1, 0.1]


@backends
def test_each_request_is_its_own(backend):
    # Two requests of 2: the window never reaches into the next request; request 1 is not greedy.
    a = greedy_args([4, 5, 4, 5], [1, 5, 1, 5], cu=[2, 4], is_greedy=[True, False])
    assert greedy(backend, a) == [4, 5, 1, 5]
    assert greedy(backend, greedy_args([4, 6, 5], [1, 6, 5], cu=[1, 3])) == [1, 6, 5]
    a = random_args([4, 5, 4, 5], [0.99, 0.1, 0.99, 0.1], cu=[2, 4], is_greedy=[False, True])
    assert random(backend, a) == [0.0, 0.1, 0.99, 0.1]


# -- every condition on its own: each breaks the golden deferral ------------------------------------------
BELOW_THRESHOLD = float(torch.nextafter(f32(0.3), f32(0.0)))
GREEDY_BREAKERS = {
    "draft is the argmax": dict(argmax=[4, 5, 6]),
    "draft -1": dict(draft=[-1, 5, 6]),
    "draft == V": dict(draft=[V, 5, 6]),
    "window longer than the row": dict(window=3),
    "entropy one float32 step below": dict(entropy=[BELOW_THRESHOLD, 2.0, 2.0]),
    "NaN entropy": dict(entropy=[math.nan, 2.0, 2.0]),
    "draft logit -inf": dict(logits=[[0.0] * 4 + [-math.inf] + [0.0] * 3] + [[0.0] * V] * 2),
    "draft logit NaN": dict(logits=[[0.0] * 4 + [math.nan] + [0.0] * 3] + [[0.0] * V] * 2),
    "window position rejected": dict(argmax=[1, 2, 6]),
    "threshold infinite": dict(threshold=math.inf),
    "not a greedy row": dict(is_greedy=[False]),
}


@backends
@pytest.mark.parametrize("breaker", list(GREEDY_BREAKERS))
def test_greedy_condition(backend, breaker):
    kw = dict(draft=[4, 5, 6], argmax=[1, 5, 6]) | GREEDY_BREAKERS[breaker]
    a = greedy_args(kw.pop("draft"), kw.pop("argmax"), **kw)
    assert greedy(backend, a)[0] == a["target_argmax_ptr"][0].item()  # position 0 is not deferred


RANDOM_BREAKERS = {
    "accepted natively": dict(u=[0.5, 0.1, 0.1]),  # p/q == u: the non-strict test accepts
    "q == 0": dict(q=[0.0, 0.5, 0.5]),
    "p == 0": dict(p=[0.0, 0.5, 0.5]),
    "draft -1": dict(draft=[-1, 5, 6]),
    "draft == V": dict(draft=[V, 5, 6]),
    "window position rejected": dict(u=[0.99, 0.6, 0.1]),
    "window position with q == 0": dict(q=[0.5, 0.0, 0.5], p=[0.25, 0.5, 0.5]),
    "window longer than the row": dict(window=3),
    "entropy one float32 step below": dict(entropy=[BELOW_THRESHOLD, 2.0, 2.0]),
    "threshold infinite": dict(threshold=math.inf),
    "a greedy row": dict(is_greedy=[True]),
}


@backends
@pytest.mark.parametrize("breaker", list(RANDOM_BREAKERS))
def test_random_condition(backend, breaker):
    kw = dict(draft=[4, 5, 6], u=[0.99, 0.1, 0.1]) | RANDOM_BREAKERS[breaker]
    a = random_args(kw.pop("draft"), kw.pop("u"), **kw)
    assert random(backend, a)[0] == a["uniform_probs_ptr"][0].item()  # position 0 is not deferred


@backends
@pytest.mark.parametrize("p, q", [(0.5, None), (0.25, 0.5)])
def test_a_uniform_one_ulp_above_the_ratio_is_rejected(backend, p, q):
    # p/q is 0.5 exactly: u a float64 ulp above it is rejected natively, so position 0 defers (u -> 0),
    # and u on it is accepted. A ratio off by an ulp (an approximate division) flips one of the two.
    above = math.nextafter(0.5, 1.0)
    assert random(backend, random_args([4, 5, 6], [above, 0.1, 0.1], p=p, q=q))[0] == 0.0
    assert random(backend, random_args([4, 5, 6], [0.5, 0.1, 0.1], p=p, q=q))[0] == 0.5


@backends
def test_threshold_is_compared_in_float32(backend):
    # 0.1 rounds up in float32: an entropy of float32(0.1) is at the threshold, the next float32
    # below it is not; an infinite entropy meets an infinite threshold.
    on, below = float(f32(0.1)), float(torch.nextafter(f32(0.1), f32(0.0)))
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6], entropy=[on, 0, 0], threshold=0.1))[0] == 4
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6], entropy=[below, 0, 0], threshold=0.1))[0] == 1
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6], entropy=[math.inf, 0, 0], threshold=math.inf))[0] == 4
    assert random(backend, random_args([4, 5, 6], [0.99, 0.1, 0.1], entropy=[on, 0, 0], threshold=0.1))[0] == 0.0


@pytest.mark.parametrize("backend", ["reference", "triton", "cpu"])
def test_threshold_outside_float32_is_rounded(backend):
    # 1e-46 is below float32's smallest subnormal / 2: float32 rounds it to 0, which an entropy of 0
    # meets. (The interpreter keeps such a Python float as float64; our kernel casts it first.)
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6], entropy=[0.0, 0, 0], threshold=1e-46))[0] == 4
    assert greedy(backend, greedy_args([4, 5, 6], [1, 5, 6], entropy=[3e38, 0, 0], threshold=1e39))[0] == 1


@backends
def test_window_zero_defers_on_entropy_alone(backend):
    assert greedy(backend, greedy_args([4, 5, 6], [1, 2, 3], window=0)) == [4, 5, 6]
    assert random(backend, random_args([4, 5, 6], [0.99, 0.99, 0.1], window=0)) == [0.0, 0.0, 0.1]


# -- invalid input --------------------------------------------------------------------------------------
@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(target_logits_ptr=torch.zeros(3, V + 1)), ValueError, "target_logits_ptr"),
        (dict(target_logits_ptr=torch.zeros(2, V)), ValueError, "target_logits_ptr"),
        (dict(fly_entropy_ptr=f32([2.0, 2.0])), ValueError, "fly_entropy_ptr"),
        (dict(target_argmax_ptr=i64([1, 5])), ValueError, "target_argmax_ptr"),
        (dict(FLY_WINDOW_SIZE=-1), ValueError, "FLY_WINDOW_SIZE"),
        (dict(FLY_WINDOW_SIZE=2**63 - 2), ValueError, "FLY_WINDOW_SIZE"),  # T + W leaves int64 (C32)
        (dict(vocab_size=0, target_logits_ptr=torch.zeros(3, 0)), ValueError, "vocab_size"),
        (dict(cu_num_draft_tokens_ptr=i32([4])), ValueError, "draft_token_ids_ptr"),
        (dict(target_logits_ptr=torch.zeros(3, V, dtype=torch.float64)), TypeError, "target_logits_ptr"),
        (dict(fly_entropy_threshold="0.3"), TypeError, "fly_entropy_threshold"),
    ],
)
def test_invalid_greedy(backend, change, error, param):
    refused(backend, contract.K19, greedy_args([4, 5, 6], [1, 5, 6]) | change, error, param)


@cpu_and_reference
@pytest.mark.parametrize(
    "change, error, param",
    [
        (dict(is_greedy_ptr=None), TypeError, "is_greedy_ptr"),
        (dict(uniform_probs_ptr=f64([0.5, 0.5])), ValueError, "uniform_probs_ptr"),
        (dict(uniform_probs_ptr=f32([0.5, 0.5, 0.5])), TypeError, "uniform_probs_ptr"),
        (dict(draft_probs_ptr=torch.zeros(3, V)), ValueError, "NO_DRAFT_PROBS"),  # a tensor with the flag set (C26)
        (dict(target_probs_ptr=torch.zeros(3, V - 1)), ValueError, "target_probs_ptr"),
    ],
)
def test_invalid_random(backend, change, error, param):
    refused(backend, contract.K20, random_args([4, 5, 6], [0.99, 0.1, 0.1]) | change, error, param)
