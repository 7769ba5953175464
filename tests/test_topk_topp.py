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
from support import TRITON_NIGHTLY, f32, i32, refused, run

from compositions import sampler as compositions
from conformance.backends import BACKENDS
from conformance.runner import run_case
from conformance.strategies import cases
from contracts import topk_topp as contract
from reference.topk_topp import weights

K = contract.KERNEL
INF = float("inf")
backends = pytest.mark.parametrize("backend", BACKEND_NAMES)
ours = pytest.mark.parametrize("backend", ["reference", "triton", "cpu"])
ours_wide = pytest.mark.parametrize("backend", ["reference", TRITON_NIGHTLY, "cpu"])  # whole rows through the split pipeline
TIES = [1.0, 3.0, 3.0, 3.0, 0.0, 2.0, 2.0, -1.0]


def args(rows: Any, k: list[int] | None = None, p: list[float] | None = None, *, programs: int = 2, block: int = 4,
         split: bool = False, mask: float = -INF) -> dict[str, Any]:
    return contract.launch_args(f32(rows), None if k is None else i32(k), None if p is None else f32(p), programs=programs,
                                 block=block, trunc=block, mask_value=mask, split=split)


def launch(backend: str, a: dict[str, Any]) -> list[list[int]]:
    """Runs the mask; returns the kept columns of each row."""
    if (why := BACKENDS[backend].unsupported(contract.TOPK_TOPP, a)) is not None:
        pytest.skip(f"{backend} declares it does not support this case: {why}")
    run(backend, K, contract.TOPK_TOPP.grid(a), **a)
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
@pytest.mark.parametrize("p", [0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("v", [8, 64])
def test_top_p_searches_the_whole_row_when_its_candidates_fall_short(backend, v, p):
    # One logit a unit above a plateau of ties: the candidates above the guessed pivot hold too little
    # of the mass, and the cut-off lies inside the plateau (lowest columns first).
    row = [-1.75] * v
    row[0] = -0.75
    u = weights(f32(row), -0.75).tolist()
    need = float(f32([p])[0]) * sum(u)
    n = next(i + 1 for i in range(v) if sum(u[: i + 1]) >= need)
    assert launch(backend, args([row], None, [p], programs=1, block=4)) == [list(range(n))]


@ours
@pytest.mark.parametrize("rounds", [1, 2])
def test_the_split_cut_off_counts_the_ties_of_earlier_slices(backend, rounds):
    # Four ties at the cut-off, one in each slice of 16 columns: the first two are kept, and the
    # slices holding the others must know how many ties came before theirs.
    x = torch.full((1, 64), -INF)
    x[0, 9] = 2.0
    x[0, [5, 20, 37, 50]] = 1.0
    p = f32([0.6])
    y = x.clone()
    split_launches(y, p, 4, rounds, [backend] * (rounds + 2))
    assert (y[0] != -INF).nonzero().flatten().tolist() == [5, 9, 20]
    assert torch.equal(y.view(torch.int32), c35_top_p(x, None, p).view(torch.int32))


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
def test_the_oracles_cut_offs_are_the_sorted_ones(case):
    """Stated again, by sorting in Python: top-k keeps exactly the first k of the rank order (value
    descending, column ascending), top-p the shortest prefix of what remains whose integer mass
    reaches p * Z; kept cells keep their bits, every other cell holds MASK_VALUE. (Conformance holds
    the other backends to the oracle, bit for bit.)"""
    a = case.args
    out = run_case(case, ["reference"])["reference"].outputs["LOGITS"]
    mask = _bits(torch.tensor([a["MASK_VALUE"]], dtype=torch.float32))[0]
    for r in range(a["BATCH_SIZE"]):
        x, y = contract.row_values(a, r), contract.row_values({**a, "LOGITS": out}, r)
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
def vllm_loader():
    """vLLM 0.33.0's sources (the engine's loader), for its own functions and kernels."""
    from support import vllm_spec

    from conformance import engine

    spec = vllm_spec()
    if spec is None:
        pytest.skip("no vLLM: set SPECDIFF_VLLM or run `nox -s engine` once")
    before = engine.named()
    engine.use(spec)
    yield engine.loader()
    engine.use(before or "")


@pytest.fixture(scope="module")
def pytorch_path(vllm_loader):
    return vllm_loader.kernel("vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch")


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Rows of the conformance kinds; k in [1, V] (vLLM's samplers clamp it there), p in (0, 1]."""
    from conformance.strategies.topk_topp import ROWS, VOCABS, logit_row

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    b, v = draw(st.integers(1, 4)), draw(st.sampled_from(VOCABS[1:]))
    x = torch.stack([logit_row(draw(st.sampled_from(ROWS)), g, v) for _ in range(b)])
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
    from compositions.sampler import SamplingMetadata, apply_sampling_constraints

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


# -- the split top-p pipeline (C36) ------------------------------------------------------------------
def c35_top_p(x: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor, mask: float = -INF) -> torch.Tensor:
    """What the split pipeline must leave: C35's top-p on the rows it owns (p < 1, and k >= V given
    k), every other row as it was."""
    from reference.topk_topp import stages

    out = x.clone()
    v = x.shape[1]
    for r in range(x.shape[0]):
        if p[r] < 1 and (k is None or k[r] >= v):
            kept = stages(x[r], None, float(p[r]), False).get("top-p")
            if kept is not None:
                drop = torch.ones(v, dtype=torch.bool)
                drop[kept] = False
                out[r, drop] = mask
    return out


@st.composite
def split_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Rows of the conformance kinds, k around V (or none), p in (0, 1.5]."""
    from conformance.strategies.topk_topp import ROWS, VOCABS, logit_row

    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    b, v = draw(st.integers(1, 4)), draw(st.sampled_from(VOCABS))
    x = torch.stack([logit_row(draw(st.sampled_from(ROWS)), g, v) for _ in range(b)])
    k = torch.tensor([draw(st.sampled_from([1, v, v + 1])) for _ in range(b)], dtype=torch.int32) if draw(st.booleans()) else None
    p = torch.tensor([draw(st.sampled_from([0.5, 0.9, 1.0, 0.25, 1e-8, 0.99999994, 1.5])) for _ in range(b)], dtype=torch.float32)
    return x, k, p


@ours_wide
@settings(max_examples=12, deadline=None)
@given(batch=split_batches(), num_sm=st.sampled_from([1, 8, 132]))
def test_split_pipeline_as_vllm_launches_it_is_c35_top_p(backend, batch, num_sm):
    # vLLM's launch sequence, tiles and workspace sizes; S from its _topp_split_count.
    x, k, p = batch
    got = x.clone()
    compositions.apply_topp_split(got, k, p, backend=backend, num_sm=num_sm)
    assert torch.equal(got.view(torch.int32), c35_top_p(x, k, p).view(torch.int32))


def split_launches(x: torch.Tensor, p: torch.Tensor, s: int, rounds: int, backends: list[str]) -> torch.Tensor:
    """The pipeline with one backend per launch (stats, each round, mask), on a workspace of exactly
    its size; returns the workspace."""
    stats, parts = torch.zeros(x.shape[0] * s * 4), torch.zeros(x.shape[0] * rounds * s * 24)
    plan = contract.split_launches(x, None, p, slices=s, workspace=(stats, parts), rounds=rounds, blocks=(16, 16, 16))
    for backend, (name, grid, a) in zip(backends, plan, strict=True):
        run(backend, name, grid, **a)
    return torch.cat([stats, parts])


def test_any_backend_takes_over_mid_pipeline():
    # C36 states every word: the workspace one backend leaves, another reads, bit for bit.
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 257, generator=g) * 3).round(decimals=1)  # ties at every cut-off
    p = f32([0.9, 0.5, 0.99])
    mixes = [["reference"] * 7, ["cpu", "triton", "reference", "cpu", "triton", "reference", "cpu"],
             ["triton", "cpu", "cpu", "reference", "reference", "triton", "triton"]]
    results = []
    for mix in mixes:
        y = x.clone()
        results.append((split_launches(y, p, 4, 5, mix).view(torch.int32), y))
    for words, y in results:
        assert torch.equal(words, results[0][0])
        assert torch.equal(y.view(torch.int32), c35_top_p(x, None, p).view(torch.int32))


@ours_wide
def test_the_last_round_finishes_what_the_rounds_leave_open(backend):
    # 1000 distinct keys packed into a few ulps around each of two values: one round (6 bins of the
    # key range) cannot isolate the cut-off; the finishing round must search the row.
    base = torch.tensor([1.0, 5.0]).repeat_interleave(500)
    x = torch.stack([base + torch.arange(1000) * 1e-6, base.flip(0) - torch.arange(1000) * 1e-6])
    p = f32([0.7, 0.3])
    for rounds in (1, 2):
        y = x.clone()
        words = split_launches(y, p, 4, rounds, [backend] * (rounds + 2)).view(torch.int32)
        assert torch.equal(y.view(torch.int32), c35_top_p(x, None, p).view(torch.int32))
        last = words[2 * 4 * 4:].reshape(2, rounds, 4, 24)[:, -1]
        assert (last[:, :, 0] == 1).all()  # each slice's finishing record: found


@ours_wide
@settings(max_examples=8, deadline=None)
@given(batch=split_batches())
def test_the_host_gives_a_row_one_mask_whichever_path_it_takes(backend, batch):
    # vLLM's CUDA dispatch (the split pipeline for <= 64 rows) and its other platforms' (the
    # monolithic kernel) mask a row alike under C35/C36: the result does not depend on batch size.
    x, k, p = batch
    one = compositions.apply_top_k_top_p(x.clone(), k, p, backend=backend, programs=2)
    two = compositions.apply_top_k_top_p(x.clone(), k, p, backend=backend, cuda_sm=132)
    assert torch.equal(one.view(torch.int32), two.view(torch.int32))


def split_args(kernel: str, **change: Any) -> dict[str, Any]:
    x = f32([TIES, TIES])
    stats, parts = contract.split_workspace()
    a = dict(LOGITS=x, LOGITS_STRIDE_0=8, STATS=stats, PARTS=parts, K=None, P=f32([0.5, 0.9]), ROUND=0, HAS_K=False,
             MASK_VALUE=-INF, VOCAB_SIZE=8, S=2, F=8, NUM_ROUNDS=5, BLOCK=16)
    a.update(change)
    return {n: a[n] for n in contract.SPECS[[s.name for s in contract.SPECS].index(kernel)].arg_names}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("kernel, change, name", [
    (contract.STEP_KERNEL, dict(F=3), "F"),
    (contract.STEP_KERNEL, dict(ROUND=5), "ROUND"),
    (contract.STEP_KERNEL, dict(ROUND=-1), "ROUND"),
    (contract.MASK_KERNEL, dict(NUM_ROUNDS=0), "NUM_ROUNDS"),
    (contract.MASK_KERNEL, dict(PARTS=torch.zeros(2 * 5 * 2 * 24 - 1)), "PARTS"),
    (contract.STATS_KERNEL, dict(STATS=torch.zeros(2 * 2 * 4 - 1)), "STATS"),
    (contract.STATS_KERNEL, dict(S=3), "S"),
    (contract.STATS_KERNEL, dict(S=128), "S"),
    (contract.STATS_KERNEL, dict(P=f32([0.5, math.nan])), "P"),
    (contract.MASK_KERNEL, dict(LOGITS=f32([TIES, [*TIES[:7], INF]])), "LOGITS"),
    (contract.STEP_KERNEL, dict(LOGITS_STRIDE_0=4), "LOGITS_STRIDE_0"),
])
def test_split_invalid_launches_are_refused(backend, kernel, change, name):
    refused(backend, kernel, split_args(kernel, **change), ValueError, name)


@ours
@pytest.mark.parametrize("seed", range(4))
def test_a_corrupted_workspace_is_read_as_defined(backend, seed):
    # A third of the words the earlier launches wrote are overwritten with anything: C36's clamps
    # give one result, the oracle's, and nothing escapes the buffers.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 64, generator=g).round(decimals=1)
    p = f32([0.9, 0.5])
    words = split_launches(x.clone(), p, 4, 2, ["reference"] * 4).view(torch.int32)
    hit = torch.rand(words.shape, generator=g) < 1 / 3
    words[hit] = torch.randint(-(2**31), 2**31, (int(hit.sum()),), generator=g).to(torch.int32)
    stats, parts = words[: 2 * 4 * 4].view(torch.float32), words[2 * 4 * 4:].view(torch.float32)
    out = {}
    for name in ("reference", backend):
        a = dict(LOGITS=x.clone(), LOGITS_STRIDE_0=64, STATS=stats.clone(), PARTS=parts.clone(), K=None, P=p, HAS_K=False,
                 MASK_VALUE=-INF, S=4, F=8, NUM_ROUNDS=2, VOCAB_SIZE=64, BLOCK=16)
        run(name, contract.MASK_KERNEL, (8,), **a)
        out[name] = a["LOGITS"].view(torch.int32)
    assert torch.equal(out[backend], out["reference"])


# -- vLLM's own split pipeline (interpreted here; compiled in benchmarks/topk_topp.py) -------------------
@pytest.fixture(scope="module")
def vllm_split(vllm_loader):
    return {n: vllm_loader.kernel(f"vllm.v1.sample.ops.topk_topp_triton.{n}") for n in contract.SPLIT_KERNELS}


def run_vllm_split(kernels: dict[str, Any], x: torch.Tensor, p: torch.Tensor, s: int) -> torch.Tensor:
    from conformance.engine import triton_mode

    if triton_mode() == "compiled" and x.device.type == "cpu":
        pytest.skip("vLLM's Triton kernels run on CPU tensors only interpreted (TRITON_INTERPRET=1)")
    y = x.clone()
    for name, grid, a in contract.split_launches(y, None, p, slices=s, workspace=contract.split_workspace(), blocks=(64, 64, 64)):
        kernels[name][grid](**a)
    return y


def test_vllm_split_agrees_on_distinct_gaussian_rows(vllm_split):
    # Rows without near-ties: vLLM's pivot search lands on C35's cut-off.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 300, generator=g) * 3
    p = f32([0.5, 0.9, 0.99, 0.25])
    assert torch.equal(run_vllm_split(vllm_split, x, p, 4), c35_top_p(x, None, p))


def test_vllm_split_leaves_a_row_of_equal_logits_unmasked(vllm_split):
    # D13: _topp_sb_step/mask_kernel return at once when max_prob <= min_prob * (1 + 1e-6)
    # (topk_topp_triton.py:1278-1280, 1475-1476), so four equal finite logits at p = 0.5 all stay, where
    # C35 (and vLLM's monolithic kernel, which keeps a prefix of ties) keeps two: a row's mask depends on
    # whether its batch has at most 64 rows.
    x = f32([[1.0, -INF, 1.0, 1.0, -INF, 1.0, -INF, -INF]])
    p = f32([0.5])
    got = run_vllm_split(vllm_split, x, p, 2)
    assert int((got > -INF).sum()) == 4
    assert int((c35_top_p(x, None, p) > -INF).sum()) == 2
