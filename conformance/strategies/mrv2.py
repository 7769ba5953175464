"""Cases of Model Runner V2's rejection-sampler kernels (K11–K18).

Every case starts from one MRV2 batch layout (:func:`layouts`): requests with 0..K drafts each,
state slots permuted through ``idx_mapping`` (more slots than requests), and the per-row
expansion (``cu_num_logits``, ``expanded_idx_mapping``, ``expanded_local_pos``) derived from it
exactly as the model runner does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from conformance.strategies.metadata import I32, I64, padding, wide_dtypes
from contracts import mrv2 as contract
from contracts.spec import next_power_of_2


@dataclass(frozen=True)
class Layout:
    """One MRV2 batch: request ``r`` has ``drafts[r]`` draft rows and a bonus row, rows
    ``cu[r] .. cu[r+1]-1``, and lives in state slot ``slots[r]`` of ``max_reqs``."""

    drafts: list[int]
    k: int  # num_speculative_steps: the widest request
    slots: list[int]
    max_reqs: int

    @property
    def requests(self) -> int:
        return len(self.drafts)

    @property
    def cu(self) -> list[int]:
        out = [0]
        for n in self.drafts:
            out.append(out[-1] + n + 1)
        return out

    @property
    def num_logits(self) -> int:
        return self.cu[-1]

    @property
    def row_slot(self) -> list[int]:
        """expanded_idx_mapping: the state slot of every logits row."""
        return [s for s, n in zip(self.slots, self.drafts) for _ in range(n + 1)]

    @property
    def row_step(self) -> list[int]:
        """expanded_local_pos: the row's index inside its request (its bonus row last)."""
        return [i for n in self.drafts for i in range(n + 1)]


@st.composite
def layouts(draw: st.DrawFn, max_requests: int = 6, max_k: int = 4, min_requests: int = 0, busy: bool = False) -> Layout:
    """``busy``: at least one request has drafts (drawn batches are often empty or draft-less)."""
    k = draw(st.integers(1, max_k))
    drafts = draw(st.lists(st.integers(0, k), min_size=max(min_requests - busy, 0), max_size=max_requests - busy))
    if busy:
        drafts.insert(draw(st.integers(0, len(drafts))), draw(st.integers(1, k)))
    if 0 in drafts:
        event("request without drafts")
    max_reqs = len(drafts) + draw(st.sampled_from([0, 0, 2, 5]))
    slots = draw(st.permutations(range(max_reqs)))[: len(drafts)]
    if slots != sorted(slots):
        event("permuted idx_mapping")
    return Layout(drafts, k, list(slots), max_reqs)


# -- K11 -------------------------------------------------------------------------------------------
@cases_for(contract.K11)
def gather_cases() -> st.SearchStrategy[Case]:
    return _gather_cases()


@st.composite
def _gather_cases(draw: st.DrawFn) -> Case:
    lay = draw(layouts())
    g = generator(draw(seeds))
    # Each request schedules its rows' tokens at the end of its query; a prefill chunk may come
    # first. Tokens outside every logits row are never read.
    input_ids, positions, indices, prefill = [], [], [], [0] * lay.max_reqs
    for slot, n in zip(lay.slots, lay.drafts):
        lead = draw(st.sampled_from([0, 0, 3]))
        start = int(torch.randint(0, 300, (1,), generator=g))
        tokens = lead + n + 1
        base = len(input_ids)
        input_ids += torch.randint(0, 151_936, (tokens,), generator=g).tolist()
        positions += list(range(start, start + tokens))
        indices += list(range(base + lead, base + tokens))
        # Prefill lengths around the step's first position make some of its drafts placeholders.
        first = start + lead
        prefill[slot] = max(0, first + draw(st.integers(-2, n + 1)))
    for slot in set(range(lay.max_reqs)) - set(lay.slots):
        prefill[slot] = int(torch.randint(0, 500, (1,), generator=g))
    spare_tokens = draw(st.sampled_from([0, 0, 2]))
    input_ids += [7] * spare_tokens
    positions += [0] * spare_tokens
    nl = lay.num_logits
    if lay.requests and draw(st.sampled_from([False, False, True])):
        perm = torch.randperm(nl, generator=g).tolist()  # rows need not read tokens in order
        indices = [indices[i] for i in perm]
        event("logits rows out of token order")
    tile = draw(st.sampled_from([1024, 1024, 4, 1, 2]))
    if nl > tile:
        event("several row tiles")
    spare = padding(draw)
    args = dict(
        draft_sampled_ptr=torch.zeros(nl + spare, dtype=draw(int_dtypes)),
        pos_ptr=torch.zeros(nl + spare, dtype=draw(wide_dtypes)),
        input_ids_ptr=torch.tensor(input_ids, dtype=I64).to(draw(int_dtypes)),
        positions_ptr=torch.tensor(positions, dtype=I64).to(draw(wide_dtypes)),
        logits_indices_ptr=torch.tensor(indices, dtype=I64).to(draw(wide_dtypes)),
        expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64).to(draw(wide_dtypes)),
        expanded_local_pos_ptr=torch.tensor(lay.row_step, dtype=I64).to(draw(int_dtypes)),
        prefill_len_ptr=torch.tensor(prefill, dtype=I64).to(draw(int_dtypes)),
        num_logits=nl,
        BLOCK_SIZE=tile,
    )
    return Case(contract.K11, args)


# -- K12 -------------------------------------------------------------------------------------------
@cases_for(contract.K12)
def flatten_cases() -> st.SearchStrategy[Case]:
    return _flatten_cases()


@st.composite
def _flatten_cases(draw: st.DrawFn) -> Case:
    lay = draw(layouts())
    g = generator(draw(seeds))
    r, width = lay.requests, lay.k + 1
    counts = []
    for n in lay.drafts:
        kind = draw(st.sampled_from(["some", "all", "one", "none"]))
        counts.append({"some": draw(st.integers(0, n + 1)), "all": n + 1, "one": 1, "none": 0}[kind])
    wider = draw(st.sampled_from([0, 0, 3]))
    storage = torch.randint(-1, 151_936, (max(r, 1), width + wider), generator=g).to(draw(int_dtypes))
    sampled = storage[:r, :width] if r else storage[:0, :width]
    if wider:
        event("sampled rows wider than K + 1")
    if draw(st.sampled_from([False, False, True])):
        sampled, stride = storage.reshape(-1), width + wider  # the flat buffer the stride addresses
        event("sampled passed flat")
    else:
        stride = sampled.stride(0)
    args = dict(
        flat_sampled_ptr=torch.zeros(lay.num_logits + padding(draw), dtype=draw(int_dtypes)),
        sampled_ptr=sampled,
        sampled_stride=stride,
        num_sampled_ptr=torch.tensor(counts, dtype=I64).to(draw(int_dtypes)),
        cu_num_logits_ptr=torch.tensor(lay.cu, dtype=I64).to(draw(int_dtypes)),
    )
    return Case(contract.K12, args)



# -- the vocabulary-wide kernels (K13–K18) -----------------------------------------------------------
LOGIT_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


@dataclass(frozen=True)
class Scene:
    """A batch with logits: the layout, temperatures and seeds per slot, the target logits
    ``[NL, V_t]`` and the pre-temperature draft logits ``[max_reqs, K, V_d]`` (or None), of which
    the kernels read ``V = min(V_t, V_d)`` columns in tiles of ``block``."""

    lay: Layout
    temp: torch.Tensor
    seed: torch.Tensor
    target: torch.Tensor
    draft: torch.Tensor | None
    vocab: int
    block: int


def _logits(g: torch.Generator, shape: tuple[int, ...], style: str) -> torch.Tensor:
    x = torch.randn(shape, generator=g) * 3
    if style == "ties":
        x = torch.round(x)  # many equal maxima: first-index rules decide
    elif style == "masked":
        # top-k style -inf cells; each row keeps its first token (a distribution needs one, and the
        # kernels read V <= the row's width columns)
        keep = torch.zeros(shape, dtype=torch.bool)
        keep[..., 0] = True
        x = torch.where((torch.rand(shape, generator=g) < 0.4) & ~keep, float("-inf"), x)
    elif style == "peaked":
        x[..., 0] += 12.0  # one token holds almost all the mass
    return x


@st.composite
def scenes(draw: st.DrawFn, greedy: str | None = None, draft_logits: bool | None = None, busy: bool = False) -> Scene:
    lay = draw(layouts(max_requests=5, busy=busy))
    g = generator(draw(seeds))
    block = draw(st.sampled_from([8192, 4, 8, 16]))
    vocab = draw(st.integers(1, 40)) if block != 8192 else draw(st.sampled_from([5, 37, 8200]))
    if vocab > block:
        event("several vocabulary tiles")
    wider = draw(st.sampled_from([0, 0, 3]))  # a target vocabulary wider than the draft's
    if wider:
        event("target vocabulary wider than the draft's")
    mix = greedy or draw(st.sampled_from(["random", "greedy", "mixed"]))
    temps = torch.rand(lay.max_reqs, generator=g) * 1.5 + 0.25
    # Powers of two (1 the commonest temperature): the kernels multiply by their reciprocals.
    temps = torch.where(torch.rand(lay.max_reqs, generator=g) < 0.3, 2.0 ** torch.randint(-1, 2, (lay.max_reqs,), generator=g), temps)
    if mix == "greedy":
        temps[:] = 0.0
    elif mix == "mixed":
        temps[torch.rand(lay.max_reqs, generator=g) < 0.5] = 0.0
    seed = torch.randint(-(2**63), 2**63 - 1, (lay.max_reqs,), generator=g, dtype=I64)
    style = draw(st.sampled_from(["plain", "plain", "ties", "masked", "peaked"]))
    target = _logits(g, (lay.num_logits, vocab + wider), style).to(draw(st.sampled_from([torch.float32] * 3 + [torch.bfloat16])))
    draft = None
    if draw(st.booleans()) if draft_logits is None else draft_logits:
        draft = _logits(g, (lay.max_reqs, lay.k, vocab), style).to(draw(LOGIT_DTYPES))
    else:
        event("one-hot drafts (no draft logits)")
    return Scene(lay, temps, seed, target, draft, vocab, block)


def stats_buffers(sc: Scene, draw: st.DrawFn) -> dict[str, object]:
    nb = -(-sc.vocab // sc.block)
    out: dict[str, object] = {}
    for name, dtype in (("target_local_argmax", draw(int_dtypes)), ("target_local_max", torch.float32),
                        ("target_local_sumexp", torch.float32), ("draft_local_max", torch.float32),
                        ("draft_local_sumexp", torch.float32)):
        stride = nb + draw(st.sampled_from([0, 0, 2]))
        out[f"{name}_ptr"] = torch.zeros((sc.lay.num_logits, stride), dtype=dtype)
        out[f"{name}_stride"] = stride
    return out


def draft_args(sc: Scene) -> dict[str, object]:
    d = sc.draft
    return dict(draft_logits_ptr=d, draft_logits_stride_0=0 if d is None else d.stride(0),
                draft_logits_stride_1=0 if d is None else d.stride(1))


@cases_for(contract.K13)
def stats_cases() -> st.SearchStrategy[Case]:
    return _stats_cases()


@st.composite
def _stats_cases(draw: st.DrawFn) -> Case:
    sc = draw(scenes())
    lay = sc.lay
    args = dict(
        **stats_buffers(sc, draw),
        target_logits_ptr=sc.target,
        target_logits_stride=sc.target.stride(0),
        **draft_args(sc),
        expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64).to(draw(wide_dtypes)),
        expanded_local_pos_ptr=torch.tensor(lay.row_step, dtype=I64).to(draw(int_dtypes)),
        temp_ptr=sc.temp,
        vocab_size=sc.vocab,
        num_logits=lay.num_logits,
        BLOCK_SIZE=sc.block,
        HAS_DRAFT_LOGITS=sc.draft is not None,
    )
    return Case(contract.K13, args)


# -- K18 -------------------------------------------------------------------------------------------
@cases_for(contract.K18)
def insert_cases() -> st.SearchStrategy[Case]:
    return _insert_cases()


@st.composite
def _insert_cases(draw: st.DrawFn) -> Case:
    lay = draw(layouts())
    g = generator(draw(seeds))
    r = lay.requests
    temps = torch.rand(lay.max_reqs, generator=g) + 0.5
    temps[torch.rand(lay.max_reqs, generator=g) < draw(st.sampled_from([0.0, 0.5, 1.0]))] = 0.0
    counts = [draw(st.sampled_from([0, n, int(torch.randint(0, n + 1, (1,), generator=g))])) for n in lay.drafts]
    nb = draw(st.sampled_from([1, 2, 3, 149]))  # 149 = cdiv(151936, 1024)
    padded = next_power_of_2(nb) * draw(st.sampled_from([1, 1, 2]))
    maxes = torch.randn((max(r, 1), nb + draw(st.sampled_from([0, 2]))), generator=g, dtype=torch.float64)
    style = draw(st.sampled_from(["plain", "ties", "nan", "-inf"]))
    if style == "ties":
        maxes = torch.round(maxes)  # equal maxima: the first tile wins
    elif style == "nan":
        maxes[torch.rand(maxes.shape, generator=g) < 0.3] = float("nan")  # NaN never wins
    elif style == "-inf":
        maxes[:] = float("-inf")  # every tile empty: tile 0
    event(f"tile maxima: {style}")
    tokens = torch.arange(maxes.shape[1]) * 1024 + torch.randint(0, 1024, maxes.shape, generator=g)
    sampled = torch.randint(-1, 151_936, (max(r, 1), lay.k + 1 + draw(st.sampled_from([0, 2]))), generator=g)
    args = dict(
        sampled_ptr=sampled[:r].to(draw(int_dtypes)),
        sampled_stride=sampled.shape[1],
        num_sampled_ptr=torch.tensor(counts, dtype=I64).to(draw(int_dtypes)),
        resampled_local_argmax_ptr=tokens[:r].to(draw(int_dtypes)),
        resampled_local_argmax_stride=tokens.shape[1],
        resampled_local_max_ptr=maxes[:r].to(draw(st.sampled_from([torch.float32, torch.float64]))),
        resampled_local_max_stride=maxes.shape[1],
        resample_num_blocks=nb,
        cu_num_logits_ptr=torch.tensor(lay.cu, dtype=I64).to(draw(int_dtypes)),
        expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64).to(draw(wide_dtypes)),
        temp_ptr=temps,
        PADDED_RESAMPLE_NUM_BLOCKS=padded,
    )
    return Case(contract.K18, args)


def draft_tokens(draw: st.DrawFn, g: torch.Generator, sc: Scene) -> torch.Tensor:
    """``draft_sampled``: row i + 1 holds draft i, a token below V, or the placeholder -1 at drawn
    steps (the start, middle or end of a request)."""
    lay = sc.lay
    ids = torch.randint(0, sc.vocab, (lay.num_logits,), generator=g)
    where = draw(st.sampled_from(["none", "none", "start", "middle", "end", "random"]))
    for start, n in zip(lay.cu[:-1], lay.drafts):
        if n == 0 or where == "none":
            continue
        steps = {"start": [0], "middle": [n // 2], "end": [n - 1],
                 "random": (torch.rand(n, generator=g) < 0.3).nonzero().flatten().tolist()}[where]
        for i in steps:
            ids[start + i + 1] = -1
        event(f"placeholder drafts: {where}")
    return ids


def computed_stats(sc: Scene, draw: st.DrawFn) -> dict[str, object]:
    """K13's outputs for the scene, from the oracle: the statistics the later kernels read."""
    from reference import mrv2 as oracle

    lay = sc.lay
    out = stats_buffers(sc, draw)
    oracle._compute_local_logits_stats_kernel(
        **out, target_logits_ptr=sc.target, target_logits_stride=sc.target.stride(0), **draft_args(sc),
        expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64),
        expanded_local_pos_ptr=torch.tensor(lay.row_step, dtype=I32), temp_ptr=sc.temp, vocab_size=sc.vocab,
        num_logits=lay.num_logits, BLOCK_SIZE=sc.block, HAS_DRAFT_LOGITS=sc.draft is not None)
    return out


@cases_for(contract.K14)
def cumulative_cases() -> st.SearchStrategy[Case]:
    return _cumulative_cases()


def _stats_of(stats: dict[str, object], *sides: str) -> dict[str, object]:
    return {f"{side}_local_{stat}_{what}": stats[f"{side}_local_{stat}_{what}"]
            for side in sides for stat in ("max", "sumexp") for what in ("ptr", "stride")}


def cumulative_args(draw: st.DrawFn, sc: Scene, stats: dict[str, object], tokens: torch.Tensor) -> dict[str, object]:
    lay = sc.lay
    nb = -(-sc.vocab // sc.block)
    return dict(
        cumulative_log_p_ptr=torch.zeros(lay.num_logits + padding(draw)),
        target_logits_ptr=sc.target,
        target_logits_stride=sc.target.stride(0),
        **_stats_of(stats, "target"),
        draft_sampled_ptr=tokens.to(draw(int_dtypes)),
        **draft_args(sc),
        **_stats_of(stats, "draft"),
        cu_num_logits_ptr=torch.tensor(lay.cu, dtype=I64).to(draw(int_dtypes)),
        idx_mapping_ptr=torch.tensor(lay.slots, dtype=I64).to(draw(wide_dtypes)),
        temp_ptr=sc.temp,
        vocab_num_blocks=nb,
        PADDED_VOCAB_NUM_BLOCKS=next_power_of_2(nb) * draw(st.sampled_from([1, 1, 2])),
        HAS_DRAFT_LOGITS=sc.draft is not None,
    )


@st.composite
def _cumulative_cases(draw: st.DrawFn) -> Case:
    sc = draw(scenes())
    g = generator(draw(seeds))
    return Case(contract.K14, cumulative_args(draw, sc, computed_stats(sc, draw), draft_tokens(draw, g, sc)))


def computed_cumulative(draw: st.DrawFn, sc: Scene, stats: dict[str, object], tokens: torch.Tensor) -> torch.Tensor:
    """K14's output for the scene, from the oracle (the running log-ratio K15-K17 read)."""
    from reference import mrv2 as oracle

    a = cumulative_args(draw, sc, stats, tokens)
    oracle._compute_cumulative_log_p_kernel(**a)
    return a["cumulative_log_p_ptr"]


# -- K15 -------------------------------------------------------------------------------------------
@cases_for(contract.K15)
def residual_cases() -> st.SearchStrategy[Case]:
    return _residual_cases()


@st.composite
def _residual_cases(draw: st.DrawFn) -> Case:
    sc = draw(scenes(draft_logits=True))
    lay = sc.lay
    g = generator(draw(seeds))
    stats = computed_stats(sc, draw)
    tokens = draft_tokens(draw, g, sc)
    nb = -(-sc.vocab // sc.block)
    stride = nb + draw(st.sampled_from([0, 0, 2]))
    args = dict(
        local_residual_mass_ptr=torch.zeros((lay.num_logits, stride)),
        local_residual_mass_stride=stride,
        cumulative_log_p_ptr=computed_cumulative(draw, sc, stats, tokens),
        target_logits_ptr=sc.target,
        target_logits_stride=sc.target.stride(0),
        **_stats_of(stats, "target"),
        **draft_args(sc),
        **_stats_of(stats, "draft"),
        draft_sampled_ptr=tokens.to(draw(int_dtypes)),
        expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64).to(draw(wide_dtypes)),
        expanded_local_pos_ptr=torch.tensor(lay.row_step, dtype=I64).to(draw(int_dtypes)),
        temp_ptr=sc.temp,
        vocab_size=sc.vocab,
        num_logits=lay.num_logits,
        vocab_num_blocks=nb,
        BLOCK_SIZE=sc.block,
        PADDED_VOCAB_NUM_BLOCKS=next_power_of_2(nb) * draw(st.sampled_from([1, 1, 2])),
    )
    return Case(contract.K15, args)


def computed_residual(draw: st.DrawFn, sc: Scene, stats: dict[str, object], tokens: torch.Tensor,
                      cumulative: torch.Tensor) -> torch.Tensor:
    """K15's output for the scene, from the oracle (zeros where K15 writes nothing)."""
    from reference import mrv2 as oracle

    lay = sc.lay
    nb = -(-sc.vocab // sc.block)
    out = torch.zeros((lay.num_logits, nb))
    oracle._compute_local_residual_mass_kernel(
        out, nb, cumulative, sc.target, sc.target.stride(0), **_stats_of(stats, "target"), **draft_args(sc),
        **_stats_of(stats, "draft"), draft_sampled_ptr=tokens, expanded_idx_mapping_ptr=torch.tensor(lay.row_slot, dtype=I64),
        expanded_local_pos_ptr=torch.tensor(lay.row_step, dtype=I32), temp_ptr=sc.temp, vocab_size=sc.vocab,
        num_logits=lay.num_logits, vocab_num_blocks=nb, BLOCK_SIZE=sc.block, PADDED_VOCAB_NUM_BLOCKS=next_power_of_2(nb))
    return out


def likely_drafts(draw: st.DrawFn, g: torch.Generator, sc: Scene) -> torch.Tensor:
    """``draft_sampled`` whose drafts are often the target's argmax (greedy requests accept them)
    or drawn from the target distribution (random requests accept them often), with placeholders."""
    tokens = draft_tokens(draw, g, sc)
    style = draw(st.sampled_from(["uniform", "argmax", "target"]))
    event(f"drafts: {style}")
    if style == "uniform":
        return tokens
    x = sc.target[:, : sc.vocab].float()
    pick = x.argmax(1) if style == "argmax" else torch.multinomial(torch.softmax(x, 1).nan_to_num(1.0), 1, generator=g)[:, 0]
    keep = (tokens >= 0) & (torch.rand(tokens.shape, generator=g) < 0.8)
    # Row i + 1 holds the draft verified at row i.
    shifted = torch.cat([tokens[:1], pick[:-1]])
    return torch.where(keep, shifted, tokens)


# -- K16 -------------------------------------------------------------------------------------------
@cases_for(contract.K16)
def rejection_cases() -> st.SearchStrategy[Case]:
    return _rejection_cases()


def _random_request(draw: st.DrawFn, sc: Scene) -> tuple[Scene, int | None]:
    """The (busy) scene with one request that has drafts made random (temperature 1 where it was
    greedy), and its index; None where a one-token vocabulary leaves no token to choose."""
    if sc.vocab < 2:
        return sc, None
    r = draw(st.sampled_from([r for r, n in enumerate(sc.lay.drafts) if n]))
    temp = sc.temp.clone()
    slot = sc.lay.slots[r]
    if float(temp[slot]) == 0.0:
        temp[slot] = 1.0
    return replace(sc, temp=temp), r


def _joint_ratio_near_half(sc: Scene, tokens: torch.Tensor, r: int) -> None:
    """Request ``r``'s drafts all valid: each but the last the token that keeps the joint ratio
    min(1, prod p/q) highest, the last the one that puts it nearest 1/2. Block verification's last
    step then accepts with about even odds (it takes the whole block, so it decides the outcome):
    the step's uniform, and so its per-step seed, shows in the result. Drafts as drawn left that
    ratio at 1 or near 0 in almost every case: a kernel keying step i with step i + 1's seed
    survived 7 of 10 seeds of the ci profile."""
    lay = sc.lay
    start, n, slot = lay.cu[r], lay.drafts[r], lay.slots[r]
    mine = tokens[start + 1 : start + n + 1]
    mine.clamp_(min=0)  # a placeholder would end the request's verification
    log_ratio = torch.zeros(())
    for i in range(n):
        step = log_ratio + torch.log_softmax(sc.target[start + i, : sc.vocab].float(), 0)
        if sc.draft is not None:
            step = step - torch.log_softmax(sc.draft[slot, i, : sc.vocab].float() / sc.temp[slot], 0)
        step = step.clamp(max=0.0).nan_to_num(0.0)
        mine[i] = int((step.exp() - 0.5).abs().argmin() if i == n - 1 else step.argmax())
        log_ratio = step[int(mine[i])]


@st.composite
def _rejection_cases(draw: st.DrawFn) -> Case:
    mode = draw(st.sampled_from(["standard", "synthetic", "block", "fly"]))
    event(f"verification: {mode}")
    aim = mode == "block" and draw(st.booleans())
    # FLy defers rejections of random requests only: without one, its window decides nothing.
    fly_random = mode == "fly" and draw(st.booleans())
    sc = draw(scenes(busy=aim or fly_random))
    g = generator(draw(seeds))
    aimed = None
    if aim:
        sc, aimed = _random_request(draw, sc)
    elif fly_random:
        sc, _ = _random_request(draw, sc)
        event("FLy: a random request with drafts")
    lay = sc.lay
    stats = computed_stats(sc, draw)
    tokens = likely_drafts(draw, g, sc)
    if aimed is not None:
        _joint_ratio_near_half(sc, tokens, aimed)
        event("block verification: a random request's joint ratio near 1/2")
    nb = -(-sc.vocab // sc.block)
    cumulative = residual = entropy = rates = None
    if mode == "block":
        cumulative = computed_cumulative(draw, sc, stats, tokens)
        if sc.draft is not None:
            residual = computed_residual(draw, sc, stats, tokens, cumulative)
    elif mode == "synthetic":
        rates = torch.rand(lay.k + draw(st.sampled_from([0, 2])), generator=g)
    elif mode == "fly":
        entropy = torch.rand(lay.num_logits, generator=g)
    threshold = draw(st.sampled_from([0.3, 0.0, 0.5, 1.5]))
    r = lay.requests
    width = lay.k + 1 + draw(st.sampled_from([0, 0, 2]))
    args = dict(
        sampled_ptr=torch.zeros((r, width), dtype=draw(st.sampled_from([I64, I64, I32]))),
        sampled_stride=width,
        rejected_steps_ptr=torch.zeros(r + padding(draw), dtype=draw(int_dtypes)),
        target_rejected_logsumexp_ptr=torch.zeros(r),
        draft_rejected_logsumexp_ptr=torch.zeros(r),
        target_logits_ptr=sc.target,
        target_logits_stride=sc.target.stride(0),
        target_local_argmax_ptr=stats["target_local_argmax_ptr"],
        target_local_argmax_stride=stats["target_local_argmax_stride"],
        **_stats_of(stats, "target"),
        draft_sampled_ptr=tokens.to(draw(int_dtypes)),
        **draft_args(sc),
        **_stats_of(stats, "draft"),
        cu_num_logits_ptr=torch.tensor(lay.cu, dtype=I64).to(draw(int_dtypes)),
        idx_mapping_ptr=torch.tensor(lay.slots, dtype=I64).to(draw(wide_dtypes)),
        temp_ptr=sc.temp,
        seed_ptr=sc.seed,
        pos_ptr=torch.randint(0, 2**40, (lay.num_logits,), generator=g).to(draw(wide_dtypes)),
        synthetic_conditional_rates_ptr=rates,
        cumulative_log_p_ptr=cumulative,
        local_residual_mass_ptr=residual,
        local_residual_mass_stride=0 if residual is None else residual.stride(0),
        fly_entropy_ptr=entropy,
        fly_entropy_threshold=threshold,
        vocab_num_blocks=nb,
        PADDED_VOCAB_NUM_BLOCKS=next_power_of_2(nb) * draw(st.sampled_from([1, 1, 2])),
        HAS_DRAFT_LOGITS=sc.draft is not None,
        SYNTHETIC_MODE=mode == "synthetic",
        USE_BLOCK_VERIFICATION=mode == "block",
        FLY_WINDOW_SIZE=draw(st.integers(1, 3)) if mode == "fly" else 0,
    )
    return Case(contract.K16, args)


# -- K17 -------------------------------------------------------------------------------------------
@cases_for(contract.K17)
def resample_cases() -> st.SearchStrategy[Case]:
    return _resample_cases()


@st.composite
def _resample_cases(draw: st.DrawFn) -> Case:
    """K16's verdicts on a scene (from the oracle, standard or block verification) resampled."""
    from reference import mrv2 as oracle

    k16 = draw(rejection_cases().filter(lambda c: not c.args["SYNTHETIC_MODE"] and not c.args["FLY_WINDOW_SIZE"]))
    a = dict(k16.args)
    oracle._rejection_kernel(**a)
    if draw(st.booleans()):
        # Any step may be the rejected one: resample there with the log-sum-exps K16 would keep.
        g = generator(draw(seeds))
        nb = a["vocab_num_blocks"]
        for q in contract.requests(a):
            step = int(torch.randint(0, q.drafts + 1, (1,), generator=g))
            a["rejected_steps_ptr"][q.index] = step
            if step < q.drafts and not q.greedy:
                a["target_rejected_logsumexp_ptr"][q.index] = contract.row_logsumexp(a, "target", q.start + step, nb)
                if a["HAS_DRAFT_LOGITS"]:
                    a["draft_rejected_logsumexp_ptr"][q.index] = contract.row_logsumexp(a, "draft", q.start + step, nb)
        event("rejected steps drawn")
    r = a["rejected_steps_ptr"].numel()
    nr = a["cu_num_logits_ptr"].numel() - 1
    target, draft = a["target_logits_ptr"], a["draft_logits_ptr"]
    vocab = min(target.shape[1], draft.shape[2]) if draft is not None else target.shape[1]
    vocab = draw(st.sampled_from([vocab, vocab, max(1, vocab - 2)]))  # the call site's min(V_t, V_d), or fewer
    # Small tiles on small vocabularies; the call site's 1024 otherwise (an interpreted grid of
    # thousands of tiles per request would dominate the run).
    block = draw(st.sampled_from([1024, 4, 8, 16])) if vocab <= 64 else 1024
    nb = -(-vocab // block)
    if nb > 1:
        event("several resample tiles")
    fp64 = draw(st.booleans())
    event(f"resample noise: {'float64' if fp64 else 'float32'}")
    width = nb + draw(st.sampled_from([0, 0, 2]))
    row_slot = torch.repeat_interleave(a["idx_mapping_ptr"][:nr].to(I64), a["cu_num_logits_ptr"].to(I64).diff())
    args = dict(
        resampled_local_argmax_ptr=torch.zeros((nr, width), dtype=draw(wide_dtypes)),
        resampled_local_argmax_stride=width,
        resampled_local_max_ptr=torch.zeros((nr, width), dtype=torch.float64 if fp64 else torch.float32),
        resampled_local_max_stride=width,
        target_logits_ptr=target,
        target_logits_stride=a["target_logits_stride"],
        target_rejected_logsumexp_ptr=a["target_rejected_logsumexp_ptr"],
        draft_logits_ptr=draft,
        draft_logits_stride_0=a["draft_logits_stride_0"],
        draft_logits_stride_1=a["draft_logits_stride_1"],
        draft_rejected_logsumexp_ptr=a["draft_rejected_logsumexp_ptr"],
        rejected_step_ptr=a["rejected_steps_ptr"][:r],
        cu_num_logits_ptr=a["cu_num_logits_ptr"],
        expanded_idx_mapping_ptr=row_slot.to(draw(wide_dtypes)),
        draft_sampled_ptr=a["draft_sampled_ptr"],
        temp_ptr=a["temp_ptr"],
        seed_ptr=a["seed_ptr"],
        pos_ptr=a["pos_ptr"],
        cumulative_log_p_ptr=a["cumulative_log_p_ptr"],
        contexts_ptr=None,
        contexts_stride=0,
        watermarking_ptr=None,
        watermarking_skip_mask_ptr=None,
        watermark_key_0=0,
        watermark_key_1=0,
        vocab_size=vocab,
        BLOCK_SIZE=block,
        HAS_DRAFT_LOGITS=draft is not None,
        USE_FP64=fp64,
        USE_BLOCK_VERIFICATION=a["USE_BLOCK_VERIFICATION"],
        CONTEXT_WIDTH=1,
        WATERMARK=False,
        DEDUPLICATE_CONTEXTS=False,
    )
    return Case(contract.K17, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _verdicts(a: Args, out: Outputs) -> list[tuple[contract.Request, int]]:
    """(request, accepted drafts) of every K16 request with drafts."""
    steps = out.get("rejected_steps_ptr")
    if steps is None:
        return []
    return [(q, int(steps[q.index])) for q in contract.requests(a) if q.drafts]


def _mrv2_all_accepted(kernel: str, a: Args, out: Outputs) -> int:
    return sum(k == q.drafts for q, k in _verdicts(a, out))


def _mrv2_first_rejected(kernel: str, a: Args, out: Outputs) -> int:
    return sum(k == 0 for q, k in _verdicts(a, out))


def _mrv2_rejected_later(kernel: str, a: Args, out: Outputs) -> int:
    return sum(0 < k < q.drafts for q, k in _verdicts(a, out))


def _mrv2_block_random(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not q.greedy for q, _ in _verdicts(a, out)) if a["USE_BLOCK_VERIFICATION"] else 0


def _mrv2_fly_random(kernel: str, a: Args, out: Outputs) -> int:
    return sum(not q.greedy for q, _ in _verdicts(a, out)) if a["FLY_WINDOW_SIZE"] else 0


def _resampled(kernel: str, a: Args, kind: str) -> int:
    reqs = [q for q in contract.resamples(a) if q.writes]
    if kind == "bonus":
        return sum(q.bonus for q in reqs)
    if kind == "placeholder":
        return sum(not q.bonus and q.rejected < 0 for q in reqs)
    draft = kind == "draft logits"
    return sum(q.residual for q in reqs) if bool(a["HAS_DRAFT_LOGITS"]) == draft else 0


CLASSES: tuple[StateClass, ...] = (
    StateClass("all accepted", (contract.K16,), _mrv2_all_accepted, "a request with drafts accepts them all"),
    StateClass("first draft rejected", (contract.K16,), _mrv2_first_rejected, "a request with drafts accepts none"),
    StateClass("rejected after an accepted draft", (contract.K16,), _mrv2_rejected_later, "a request accepts some of its drafts"),
    StateClass("block verification", (contract.K16,), _mrv2_block_random, "a random request under block verification"),
    StateClass("FLy window", (contract.K16,), _mrv2_fly_random, "a random request under FLy"),
    StateClass("bonus resample", (contract.K17,), lambda k, a, o: _resampled(k, a, "bonus"), "every draft accepted: the target's own draw"),
    StateClass("placeholder resample", (contract.K17,), lambda k, a, o: _resampled(k, a, "placeholder"),
               "rejected at a -1 placeholder: the target's own draw"),
    StateClass("residual with draft logits", (contract.K17,), lambda k, a, o: _resampled(k, a, "draft logits"),
               "p minus q, in the log domain"),
    StateClass("one-hot residual", (contract.K17,), lambda k, a, o: _resampled(k, a, "one-hot"),
               "the target without the rejected draft"),
)
