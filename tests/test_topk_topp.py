"""The top-k/top-p mask (C35): goldens on a tie vector, the exact cut-offs as properties (top-k keeps
exactly k, lowest column first among ties; top-p keeps the shortest prefix reaching p), tile and grid
independence, vLLM's placeholders, Hypothesis conformance across the backends, and invalid input."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import BACKENDS as BACKEND_NAMES
from support import f32, i32, refused, run

from conformance import compositions
from conformance.backends import BACKENDS
from conformance.kernels import topk_topp as contracts
from conformance.runner import run_case
from conformance.strategies import cases
from reference.topk_topp import weights

K = contracts.KERNEL
INF = float("inf")
backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
ours = pytest.mark.parametrize("backend", ["reference", "triton", "cpu"])
TIES = [1.0, 3.0, 3.0, 3.0, 0.0, 2.0, 2.0, -1.0]


def args(rows: Any, k: list[int] | None = None, p: list[float] | None = None, *, programs: int = 2, block: int = 4,
         split: bool = False, mask: float = -INF) -> dict[str, Any]:
    return contracts.launch_args(f32(rows), None if k is None else i32(k), None if p is None else f32(p), programs=programs,
                                 block=block, trunc=block, mask_value=mask, split=split)


def launch(backend: str, a: dict[str, Any]) -> list[list[int]]:
    """Runs the mask; returns the kept columns of each row."""
    if (why := BACKENDS[backend].unsupported(contracts.TOPK_TOPP, a)) is not None:
        pytest.skip(f"{backend} declares it does not support this case: {why}")
    run(backend, K, contracts.TOPK_TOPP.grid(a), **a)
    return [(row != a["MASK_VALUE"]).nonzero().flatten().tolist() for row in a["LOGITS"]]


# -- goldens: vLLM's own kernel, interpreted with its row index cast, kept these sets ------------------
@backends
@pytest.mark.parametrize("k, p, want", [
    (1, None, [1]), (2, None, [1, 2]), (4, None, [1, 2, 3, 5]), (8, None, list(range(8))),
    (None, 0.5, [1, 2]), (None, 0.9, [1, 2, 3, 5, 6]), (4, 0.5, [1, 2]), (3, 0.99, [1, 2, 3]),
])
def test_golden_ties(backend, k, p, want):
    a = args([TIES] * 3, None if k is None else [k] * 3, None if p is None else [p] * 3)
    assert launch(backend, a) == [want] * 3


@ours
def test_rows_neither_step_touches_stay_bit_identical(backend):
    # k >= V, k >= the finite count, p >= 1, and an all -inf row under top-p: nothing is written.
    rows = [[-0.0, 1.0, -INF, 2.0], [1.0, -INF, -INF, 0.5], [3.0, 2.0, 1.0, 0.0], [-INF] * 4]
    a = args(rows, [4, 2, 9, 1], [0.5, 1.0, 1.5, 0.5])
    before = a["LOGITS"].clone()
    launch(backend, a)
    # Row 0: k = V, so top-p alone; rows 1 and 2: top-k a no-op and p >= 1; row 3: all -inf.
    assert torch.equal(a["LOGITS"][1:].view(torch.int32), before[1:].view(torch.int32))
    # Row 0's weights against 2.0: 2**32, e**-1 and e**-2 of it (and 0): 2.0 alone reaches half.
    assert a["LOGITS"][0].tolist() == [-INF, -INF, -INF, 2.0]


@ours
def test_negative_zero_ties_with_zero_and_keeps_its_bits(backend):
    a = args([[-0.0, 0.0, -0.0, -1.0]], [2], mask=-7.0)
    launch(backend, a)
    assert a["LOGITS"][0].tolist() == [0.0, 0.0, -7.0, -7.0]
    assert math.copysign(1.0, a["LOGITS"][0, 0].item()) == -1.0  # kept cells keep their bits


@ours
def test_split_rows_are_left_to_the_split_kernels(backend):
    # SPLIT_COVERS_PONLY with K given: a row with k >= V gets no top-p here; k < V rows still do.
    a = args([TIES, TIES], [8, 4], [0.5, 0.5], split=True)
    assert launch(backend, a) == [list(range(8)), [1, 2]]
    # Without K the split flag changes nothing: every row is a top-p row here.
    assert launch(backend, args([TIES], None, [0.5], split=True)) == [[1, 2]]


@ours
def test_mask_value_is_rounded_to_float32(backend):
    a = args([TIES], [1], mask=-1e40)  # beyond float32: -inf
    launch(backend, a)
    assert a["LOGITS"][0].tolist() == [-INF, 3.0, -INF, -INF, -INF, -INF, -INF, -INF]


@ours
def test_an_outlier_far_above_the_first_tile_is_still_masked_around(backend):
    # vLLM's standalone top-p shifts exp by avg + 10 std of tile 0; a logit 150 above overflows it
    # and vLLM leaves the row unmasked (C35). The exact cut-off keeps the outlier alone.
    row = [0.0] * 16
    row[11] = 150.0
    assert launch(backend, args([row], None, [0.5])) == [[11]]


# -- the exact cut-offs as properties ----------------------------------------------------------------
def _bits(x: torch.Tensor) -> list[int]:
    return x.contiguous().view(torch.int32).tolist()


@settings(max_examples=40)
@given(case=cases(K))
def test_cut_offs_hold_on_every_backend(case):
    """Stated again, by sorting in Python: top-k keeps exactly the first k of the rank order (value
    descending, column ascending), top-p the shortest prefix of what remains whose integer mass
    reaches p * Z; kept cells keep their bits, every other cell holds MASK_VALUE."""
    a = case.args
    out = run_case(case, ["reference", "triton", "cpu"])["reference"].outputs["LOGITS"]
    mask = _bits(torch.tensor([a["MASK_VALUE"]], dtype=torch.float32))[0]
    for r in range(a["BATCH_SIZE"]):
        x, y = contracts.row_values(a, r), contracts.row_values({**a, "LOGITS": out}, r)
        v, finite = x.numel(), int((x > -INF).sum())
        k = int(a["K"][r]) if a["TOPK_ENABLED"] else None
        p = float(a["P"][r]) if a["TOPP_ENABLED"] else None
        topk = k is not None and k < v and finite > k
        topp = p is not None and p < 1 and finite > 0 and not (a["SPLIT_COVERS_PONLY"] and k is not None and k >= v)
        if not (topk or topp):
            assert _bits(y) == _bits(x)
            continue
        order = sorted(range(v), key=lambda c: (-float(x[c]), c))  # -0.0 and 0.0 compare equal: columns decide
        kept = order[:k] if topk else order
        if topp:
            u = weights(x[kept], x.max()).tolist()
            need = float(torch.tensor(p, dtype=torch.float32)) * sum(u)
            n = next(i + 1 for i in range(len(u)) if sum(u[: i + 1]) >= need)
            kept = kept[:n]
        want = [xb if c in set(kept) else mask for c, xb in enumerate(_bits(x))]
        assert _bits(y) == want, f"row {r}: kept {sorted(kept)}"


@ours
def test_the_result_depends_on_no_tile_size_and_no_grid(backend):
    g = torch.Generator().manual_seed(5)
    rows = torch.randint(-3, 4, (5, 37), generator=g).float()  # ties at every cut-off
    want = None
    for block, programs in [(4, 1), (16, 3), (64, 5), (256, 6)]:
        a = args(rows.tolist(), [1, 5, 9, 36, 40], [0.3, 0.9, 0.5, 0.99, 0.7], programs=programs, block=block)
        got = launch(backend, a)
        assert want is None or got == want
        want = got


# -- vLLM's call site --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_vllm_placeholders_for_a_disabled_k_or_p_are_never_read(backend):
    # apply_top_k_top_p_triton passes LOGITS for the K or P it does not use.
    a = args([TIES], None, [0.5])
    a["K"] = a["LOGITS"]
    assert launch(backend, a) == [[1, 2]]
    a = args([TIES], [2], None)
    a["P"] = a["LOGITS"]
    assert launch(backend, a) == [[1, 2]]


@ours
def test_rows_inside_a_wider_buffer(backend):
    # LOGITS_STRIDE_0 > V: the columns past V of each row are never touched.
    wide = torch.arange(24, dtype=torch.float32).reshape(2, 12)
    a = args([[0.0] * 8] * 2, [2, 3])
    a.update(LOGITS=wide.clone(), LOGITS_STRIDE_0=12)
    launch(backend, a)
    assert torch.equal(a["LOGITS"][:, 8:], wide[:, 8:])
    assert (a["LOGITS"][:, :8] != -INF).sum(1).tolist() == [2, 3]


@given(case=cases(K))
def test_conformance(case):
    run_case(case, ["reference", "triton", "cpu"])


# -- invalid input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("change, error, param", [
    (dict(K=i32([0, 2])), ValueError, "K"),
    (dict(K=i32([2])), ValueError, "K"),
    (dict(P=f32([0.0, 0.5])), ValueError, "P"),
    (dict(P=f32([math.nan, 0.5])), ValueError, "P"),
    (dict(K=None), ValueError, "TOPK_ENABLED"),
    (dict(K=torch.tensor([2, 2])), TypeError, "K"),
    (dict(BUFFER=torch.empty(2, 7)), ValueError, "BUFFER"),
    (dict(PERCENTILE_TO_STD_TABLE=torch.zeros(199)), ValueError, "PERCENTILE_TO_STD_TABLE"),
    (dict(LOGITS_STRIDE_0=7), ValueError, "LOGITS_STRIDE_0"),
    (dict(LOGITS_STRIDE_0=9), ValueError, "LOGITS"),
    (dict(BATCH_SIZE=3), ValueError, "LOGITS"),
    (dict(BLOCK_SIZE=6), ValueError, "BLOCK_SIZE"),
    (dict(MASK_VALUE="x"), TypeError, "MASK_VALUE"),
])
def test_invalid_input_is_refused_naming_the_argument(backend, change, error, param):
    a = args([TIES, TIES], [2, 2], [0.5, 0.5])
    a.update(change)
    refused(backend, K, a, error, param)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("bad", [math.nan, INF])
def test_nan_and_plus_inf_logits_are_refused(backend, bad):
    rows = [TIES, TIES]
    rows[1] = [*TIES[:5], bad, *TIES[6:]]
    refused(backend, K, args(rows, [2, 2]), ValueError, "LOGITS")


# -- vLLM's other path: apply_top_k_top_p_pytorch, by set relations (docs/topk_topp.md) -------------
@pytest.fixture(scope="module")
def pytorch_path():
    from support import vllm_spec

    from conformance import engine

    spec = vllm_spec()
    if spec is None:
        pytest.skip("no vLLM: set SPECDIFF_VLLM or run `nox -s engine` once")
    before = engine.named()
    engine.use(spec)
    yield engine.loader().kernel("vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch")
    engine.use(before or "")


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Rows of the conformance kinds; k in [1, V] (vLLM's samplers clamp it there), p in (0, 1]."""
    from conformance.strategies.topk_topp import ROWS, VOCABS, _row

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    b, v = draw(st.integers(1, 4)), draw(st.sampled_from(VOCABS[1:]))
    x = torch.stack([_row(draw(st.sampled_from(ROWS)), g, v) for _ in range(b)])
    topk, topp = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    k = torch.tensor([draw(st.integers(1, v)) for _ in range(b)]) if topk else None
    p = torch.tensor([draw(st.sampled_from([0.5, 0.9, 1.0, 0.25, 1e-8])) for _ in range(b)], dtype=torch.float32) if topp else None
    return x, k, p


@settings(max_examples=60)
@given(batch=batches(), sync=st.booleans())
def test_vllms_pytorch_path_keeps_a_superset_at_ties_and_the_same_mass(pytorch_path, batch, sync):
    """Top-k: C35's set is inside PyTorch's, which adds only logits equal to the k-th (it keeps every
    tie). Top-p: every token the two paths decide differently is a tie of the other's boundary, or
    sits where the mass before it is within 1e-5 of p (float32 softmax and cumsum); at p = 1 PyTorch
    may also drop a token whose float32 probability is 0."""
    x, k, p = batch
    ours = compositions.apply_top_k_top_p(x.clone(), k, p, backend="cpu")
    theirs = pytorch_path(x.clone(), k, p, allow_cpu_sync=sync)
    for r in range(x.shape[0]):
        row, a, b = x[r], ours[r] > -INF, theirs[r] > -INF
        kr = int(k[r]) if k is not None else None
        if p is None:
            assert bool((a & ~b).sum() == 0), f"row {r}: C35 keeps what PyTorch masks"
            vk = torch.sort(row, descending=True).values[kr - 1]
            assert bool((row[b & ~a] == vk).all()), f"row {r}: PyTorch keeps more than the k-th's ties"
            continue
        order = torch.sort(row, descending=True, stable=True).indices
        s = order[:kr] if kr is not None and kr < row.numel() and int((row > -INF).sum()) > kr else order
        prob = torch.softmax(row[s].double(), 0)
        before = {int(c): float(m) for c, m in zip(s, torch.cumsum(prob, 0) - prob)}
        pr = float(p[r])
        for c in (a ^ b).nonzero().flatten().tolist():
            boundary = [row[m] for m in (s[a[s]][-1:].tolist() + s[b[s]][-1:].tolist())]
            tie = any(row[c] == v for v in boundary)
            near = c in before and abs(before[c] - pr) <= 1e-5
            underflow = pr >= 1.0 and b[c].item() is False and float(torch.softmax(row[s], 0)[(s == c).nonzero()[0]]) == 0.0 if c in before else False
            assert tie or near or underflow, f"row {r}, column {c}: C35 {'keeps' if a[c] else 'masks'} it, PyTorch does not"


# -- V1's apply_sampling_constraints, end to end -------------------------------------------------------
@settings(max_examples=15)
@given(data=st.data())
def test_apply_sampling_constraints_three_ways(data):
    """Temperature, top-k and top-p per request, expanded to the draft tokens (a greedy request's
    temperature read as 1): the three backends agree bit for bit, and each token's row is the oracle's
    mask of its logits divided by its request's temperature."""
    from conformance.compositions import SamplingMetadata, apply_sampling_constraints

    b = data.draw(st.integers(1, 4))
    n = data.draw(st.lists(st.integers(0, 3), min_size=b, max_size=b))
    v = data.draw(st.sampled_from([5, 33]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    logits = torch.randn(sum(n), v, generator=g) * 3
    temp = torch.tensor([data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(b)])
    k = torch.tensor([data.draw(st.integers(1, v)) for _ in range(b)]) if data.draw(st.booleans()) else None
    p = torch.tensor([data.draw(st.sampled_from([0.3, 0.9, 1.0])) for _ in range(b)]) if data.draw(st.booleans()) else None
    meta = SamplingMetadata(temp, False, bool((temp > 0).all()), top_k=k, top_p=p)
    cu = torch.cumsum(torch.tensor(n), 0).to(torch.int32)
    outs = {be: apply_sampling_constraints(logits.clone(), cu, meta, backend=be) for be in ("reference", "triton", "cpu")}
    for be in ("triton", "cpu"):
        assert torch.equal(outs[be].view(torch.int32), outs["reference"].view(torch.int32)), be
    request = torch.repeat_interleave(torch.arange(b), torch.tensor(n))
    for t in range(sum(n)):
        r = int(request[t])
        want = (logits[t] / (temp[r] if temp[r] > 0 else 1.0))[None].clone()
        a = args(want.tolist(), None if k is None else [int(k[r])], None if p is None else [float(p[r])], programs=1)
        if k is not None or p is not None:
            launch("reference", a)
        assert torch.equal(outs["reference"][t].view(torch.int32), a["LOGITS"][0].view(torch.int32)), f"token {t}"
    greedy = SamplingMetadata(None, True, False)
    x = logits.clone()
    assert apply_sampling_constraints(x, cu, greedy, backend="cpu") is x and torch.equal(x, logits)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_host_masks_a_contiguous_copy_of_strided_logits_and_returns_it(backend):
    # apply_top_k_top_p_triton: a non-unit inner stride gets a contiguous copy, masked and returned;
    # the caller's tensor is left as it was. Rows with k = V and p = 1 are disabled, per row.
    base = torch.tensor([TIES, TIES[::-1], TIES]).t().contiguous()
    logits = base.t()  # [3, 8] with inner stride 3
    out = compositions.apply_top_k_top_p(logits, torch.tensor([2, 8, 8]), torch.tensor([1.0, 0.5, 1.0]), backend=backend)
    assert out is not logits and out.is_contiguous() and torch.equal(logits, base.t())
    # Row 1 reversed: three 3s weigh 3 of Z = 3.94 (the 2s e**-1 each, ...): p = 0.5 ends at the second 3.
    assert [(row > -INF).nonzero().flatten().tolist() for row in out] == [[1, 2], [4, 5], list(range(8))]
