"""Launches of SGLang's speculative verification: chains with a coin planted on the strict product's
boundary (``fl32(coin * q) == p``), ``p = 0`` at coin 0, draft probabilities 0, above 1, negative,
infinite or NaN, rows where p == q (an all-zero residual), final coins of 0 and 1, block
verification over prefixes the token-by-token rule rejects, vocabularies off the tile; draft trees
with siblings, deep chains, slots permuted over the batch, int32 and int64 indices; target-only
levels whose siblings share a coin, thresholds below 1, ``draft_probs`` that is not zero."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import sglang_verify as contract
from contracts.spec import next_power_of_2

F32 = torch.float32
ODD_Q = (0.0, 1.5, float("nan"), -0.25, float("inf"))  # C46a rejects each; C46c counts each as 0
# K46's vocabularies: small, medium, and one past SGLang's 4096-wide tile.
VOCABS = st.one_of(st.integers(1, 12), st.integers(13, 300), st.sampled_from([4097]))
BLOCK_ODD_Q = (0.0, 1.5, float("inf"))  # block verification's mass takes the raw q: never negative or NaN (C46e)


def _rows(g: torch.Generator, rows: int, v: int, kind: str) -> torch.Tensor:
    """``rows`` probability rows of width ``v``: normalized, one-hot, sparse (top-k'd) or unnormalized
    values in [0, 1] (SGLang's draw normalizes by the sum)."""
    if kind == "one-hot":
        out = torch.zeros(rows, v)
        out[torch.arange(rows), torch.randint(0, v, (rows,), generator=g)] = 1.0
        return out
    x = torch.rand(rows, v, generator=g) ** 3
    if kind == "sparse" and v > 2:
        x = torch.where(x >= x.topk(min(3, v), -1).values[:, -1:], x, torch.zeros_like(x))
    if kind == "raw":
        return x.to(F32)
    return (x / x.sum(-1, keepdim=True)).to(F32).clamp(0.0, 1.0)


@st.composite
def _classic(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    bs = draw(st.integers(0, 4))
    n = draw(st.integers(1, 5))
    v = draw(VOCABS)
    block = draw(st.booleans())
    kind = draw(st.sampled_from(["dense", "dense", "sparse", "one-hot", "raw"]))
    tp = _rows(g, bs * n, v, kind).view(bs, n, v)
    q_rows = draw(st.sampled_from([n - 1, n])) if n > 1 else draw(st.sampled_from([0, 1]))
    dp = _rows(g, bs * q_rows, v, draw(st.sampled_from(["dense", "sparse", "one-hot"]))).view(bs, q_rows, v)
    if draw(st.integers(0, 3)) == 0 and bs and q_rows:  # p == q on a row: an all-zero residual there
        rows = min(n, q_rows)
        tp[:, :rows] = dp[:, :rows]
        event("p == q rows")
    drafts = torch.zeros(bs, n, dtype=torch.int64)
    coins = torch.rand(bs, max(n - 1, 1) + draw(st.sampled_from([0, 1])), generator=g).to(F32)
    for b in range(bs):
        for s in range(1, n):
            row = s - 1
            d = int(torch.multinomial(dp[b, row].double() + 1e-9, 1, generator=g)) if draw(st.booleans()) else draw(st.integers(0, v - 1))
            drafts[b, s] = d
            # Block verification: near misses (2), high ratios after them (5), ratios of .8 at low coins (8).
            special = draw(st.sampled_from([0, 1, 2, 2, 3, 4, 5, 5, 8, 8]) if block else st.integers(0, 9))
            if special == 0:  # the strict boundary: p = fl32(coin * q) rejects
                q = float(dp[b, row, d]) or 0.5
                dp[b, row, d] = q
                tp[b, row, d] = float(coins[b, row] * torch.tensor(q, dtype=F32))
                event("p planted at fl32(coin * q)")
            elif special == 1:  # zero target mass at coin 0
                tp[b, row, d], coins[b, row] = 0.0, 0.0
                dp[b, row, d] = max(float(dp[b, row, d]), 0.25)
            elif special == 2 and not block:
                dp[b, row, d] = draw(st.sampled_from(ODD_Q))
            elif special == 2:  # a near miss token by token (.75 q >= p = q / 2): h = .5 for the steps after it
                q = max(float(dp[b, row, d]), 0.05)
                dp[b, row, d], tp[b, row, d], coins[b, row] = q, 0.5 * q, 0.75
            elif special == 3:  # accepted at nearly any coin
                tp[b, row, d], dp[b, row, d] = 1.0, 1.0
            elif special == 4:
                coins[b, row] = draw(st.sampled_from([0.0, 1.0, 1.0 - 2.0**-24]))
            elif special in (5, 6, 7):  # p well above q: block verification's ratio climbs back toward 1
                q = max(float(dp[b, row, d]), 0.05)
                dp[b, row, d], tp[b, row, d] = q, min(1.0, 3.0 * q)
            elif special == 8:  # h falls to .8 of the last, at a low coin: a shorter prefix tests its mass
                q = max(float(dp[b, row, d]), 0.05)
                dp[b, row, d], tp[b, row, d], coins[b, row] = q, 0.8 * q, 0.02
    if bs and q_rows and draw(st.integers(0, 2)) == 0:  # odd q off the drafts too (the residual, the block mass)
        lanes = torch.rand(dp.shape, generator=g) < 0.1
        dp[lanes] = draw(st.sampled_from(BLOCK_ODD_Q if block else ODD_Q))
        event("odd q in the rows")
    final = torch.rand(bs, generator=g).to(F32)
    if bs and draw(st.booleans()):
        final[draw(st.integers(0, bs - 1))] = draw(st.sampled_from([1.0, 1.0, 0.0, 1.0 - 2.0**-24]))
    dtype = draw(int_dtypes)
    cand = drafts.to(dtype)
    n_pred = bs * n + draw(st.sampled_from([0, 0, 3]))
    slots = torch.arange(bs * n) if draw(st.booleans()) else torch.randperm(n_pred, generator=g)[: bs * n]
    idx = slots.view(bs, n).to(draw(int_dtypes))
    acc = torch.full((bs, n), -1, dtype=draw(int_dtypes))
    if draw(st.integers(0, 4)) == 0 and bs:  # rows inside wider buffers (AcceptIndex shares RetriveIndex's strides)
        wide = lambda t: torch.cat([t, torch.zeros(bs, 2, dtype=t.dtype)], 1)[:, : t.shape[1]]  # noqa: E731
        cand, idx, acc, coins = wide(cand), wide(idx), wide(acc), wide(coins)
        event("row-strided index tensors")
    block_v = draw(st.sampled_from([16, 64, 4096]))
    reduce_ = draw(st.sampled_from([16, 64, min(next_power_of_2(v), 32768)]))
    args = dict(
        Predicts=torch.zeros(n_pred, dtype=draw(int_dtypes)),
        AcceptIndex=acc,
        AcceptTokenNum=torch.zeros(bs, dtype=draw(int_dtypes)),
        Candidates=cand,
        RetriveIndex=idx,
        UniformSamples=coins,
        UniformSamplesFinal=final,
        TargetProbs=tp,
        DraftProbs=dp,
        stride_cand_b=cand.stride(0), stride_cand_s=cand.stride(1),
        stride_idx_b=idx.stride(0), stride_idx_s=idx.stride(1),
        stride_uni_b=coins.stride(0), stride_uni_s=coins.stride(1),
        stride_tp_b=tp.stride(0), stride_tp_s=tp.stride(1), stride_tp_v=tp.stride(2),
        stride_dp_b=dp.stride(0), stride_dp_s=dp.stride(1), stride_dp_v=dp.stride(2),
        NUM_SLOTS=n,
        VOCAB_SIZE=v,
        BLOCK_V=block_v,
        BLOCK_VERIFICATION=block,
        BLOCK_REDUCE=reduce_,
    )
    return Case(contract.K46, args)


@cases_for(contract.K46)
def classic_cases() -> st.SearchStrategy[Case]:
    return _classic()


@st.composite
def _trees(draw: st.DrawFn, bs: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per request: each node's parent drawn among the earlier nodes (a deep chain, a star, anything
    between); first-child and next-sibling lists, siblings in node order. Returns (next, sibling, depth)."""
    nxt = torch.full((bs, n), -1, dtype=torch.int64)
    sib = torch.full((bs, n), -1, dtype=torch.int64)
    depth = torch.zeros(bs, dtype=torch.int64)
    shape = draw(st.sampled_from(["any", "any", "chain", "chain", "star"]))
    for b in range(bs):
        level = [0] * n
        last_child: dict[int, int] = {}
        for i in range(1, n):
            parent = i - 1 if shape == "chain" else 0 if shape == "star" else draw(st.integers(max(0, i - 3), i - 1))
            level[i] = level[parent] + 1
            if parent in last_child:
                sib[b, last_child[parent]] = i
            else:
                nxt[b, parent] = i
            last_child[parent] = i
        depth[b] = max(level)
    return nxt, sib, depth


def _targets_along(g: torch.Generator, cand: torch.Tensor, nxt: torch.Tensor, sib: torch.Tensor, v: int) -> torch.Tensor:
    """Targets that mostly match one of a node's children (a random child), else a random token."""
    bs, n = cand.shape
    target = torch.randint(0, v, (bs, n), generator=g)
    for b in range(bs):
        for i in range(n):
            children = []
            c = int(nxt[b, i])
            while c != -1:
                children.append(c)
                c = int(sib[b, c])
            if children and float(torch.rand((), generator=g)) < 0.85:
                target[b, i] = cand[b, children[int(torch.randint(0, len(children), (), generator=g))]]
    return target


@st.composite
def _greedy(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    bs = draw(st.integers(0, 4))
    n = draw(st.integers(1, 8))
    nxt, sib, depth = draw(_trees(bs, n))
    v = draw(st.sampled_from([3, 50, 50, 2**40]))
    cand = torch.randint(0, min(v, 2**31), (bs, n), generator=g)
    if v > 2**31:
        cand = cand * 2**9  # ids past int32: compared, never written
    target = _targets_along(g, cand, nxt, sib, min(v, 2**31))
    spec = draw(st.integers(1, int(depth.max()) + 2 if bs else 3))
    slots = torch.arange(bs * n) if draw(st.booleans()) else torch.randperm(bs * n, generator=g)
    if v > 2**31:
        predict_dtype = torch.int64
    else:
        predict_dtype = draw(int_dtypes)
    t = lambda x: x.to(draw(int_dtypes))  # noqa: E731
    args = dict(
        predicts_ptr=torch.zeros(bs * n + draw(st.sampled_from([0, 2])), dtype=predict_dtype),
        accept_index_ptr=torch.full((bs, spec), -1, dtype=draw(int_dtypes)),
        accept_token_num_ptr=torch.zeros(bs, dtype=draw(int_dtypes)),
        candidates_ptr=cand if v > 2**31 else t(cand),
        retrieve_index_ptr=t(slots.view(bs, n)),
        retrieve_next_token_ptr=t(nxt),
        retrieve_next_sibling_ptr=t(sib),
        target_predict_ptr=target if v > 2**31 else t(target),
        batch_size=bs,
        num_speculative_tokens=spec,
        num_draft_tokens=n,
    )
    return Case(contract.K47, args)


@cases_for(contract.K47)
def greedy_cases() -> st.SearchStrategy[Case]:
    return _greedy()


@st.composite
def _target_only(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    bs = draw(st.integers(0, 4))
    n = draw(st.integers(1, 7))
    nxt, sib, depth = draw(_trees(bs, n))
    v = draw(st.one_of(st.integers(1, 10), st.integers(1, 10), st.integers(11, 200)))
    tp = _rows(g, bs * n, v, draw(st.sampled_from(["dense", "dense", "sparse", "one-hot", "raw"]))).view(bs, n, v)
    cand = torch.randint(0, v, (bs, n), generator=g)
    for b in range(bs):  # drafts drawn from their parent's p, mostly
        for i in range(n):
            c = int(nxt[b, i])
            while c != -1:
                if draw(st.integers(0, 3)):
                    cand[b, c] = int(torch.multinomial(tp[b, i].double() + 1e-9, 1, generator=g))
                c = int(sib[b, c])
    coins = torch.rand(bs, n, generator=g).to(F32)
    if bs and draw(st.booleans()):
        coins.view(-1)[draw(st.integers(0, bs * n - 1))] = draw(st.sampled_from([0.0, 1.0]))
    final = torch.rand(bs, generator=g).to(F32)
    if bs and draw(st.integers(0, 3)) == 0:
        final[draw(st.integers(0, bs - 1))] = draw(st.sampled_from([0.0, 1.0]))
    dp = torch.zeros_like(tp)
    if draw(st.integers(0, 3)) == 0:
        dp = _rows(g, bs * n, v, "dense").view(bs, n, v) * 0.5
        event("draft_probs not zero")
    thresholds = draw(st.sampled_from([(1.0, 1.0), (1.0, 1.0), (0.3, 1.0), (0.05, 1.0), (1.0, 0.5), (0.0, 0.0), (0.9, 0.8)]))
    spec = draw(st.integers(1, int(depth.max()) + 2 if bs else 3))
    args = dict(
        predicts=torch.zeros(bs * n, dtype=torch.int32),
        accept_index=torch.full((bs, spec), -1, dtype=torch.int32),
        accept_token_num=torch.zeros(bs, dtype=torch.int32),
        candidates=cand,
        retrive_index=(torch.arange(bs * n) if draw(st.booleans()) else torch.randperm(bs * n, generator=g)).view(bs, n),
        retrive_next_token=nxt,
        retrive_next_sibling=sib,
        uniform_samples=coins,
        uniform_samples_for_final_sampling=final,
        target_probs=tp,
        draft_probs=dp,
        threshold_single=thresholds[0],
        threshold_acc=thresholds[1],
        deterministic=draw(st.booleans()),
    )
    return Case(contract.K48, args)


@cases_for(contract.K48)
def target_only_cases() -> st.SearchStrategy[Case]:
    return _target_only()


# -- state classes ---------------------------------------------------------------------------------
def _chain_steps(a: Args) -> list[tuple[int, int, float, float, float]]:
    """K46's token-by-token decisions as the rule meets them: (request, step, p, q, coin), up to and
    including each request's first rejection."""
    out = []
    for b in range(contract.batch(a)):
        for s in range(1, a["NUM_SLOTS"]):
            d = int(a["Candidates"][b, s])
            p, q, c = a["TargetProbs"][b, s - 1, d], a["DraftProbs"][b, s - 1, d], a["UniformSamples"][b, s - 1]
            out.append((b, s, float(p), float(q), float(c)))
            if not bool(contract.chain_accepts(p, q, c)):
                break
    return out


def _boundary(k: str, a: Args, o: Outputs) -> int:
    if a["BLOCK_VERIFICATION"]:
        return 0
    return sum(1 for _, _, p, q, c in _chain_steps(a)
               if 0 < q <= 1 and float(torch.tensor(c, dtype=F32) * torch.tensor(q, dtype=F32)) == p)


def _zero_mass(k: str, a: Args, o: Outputs) -> int:
    return sum(1 for _, _, p, q, c in _chain_steps(a) if p == 0.0 and c == 0.0 and 0 < q <= 1)


def _odd_q(k: str, a: Args, o: Outputs) -> int:
    return 0 if a["BLOCK_VERIFICATION"] else sum(1 for _, _, p, q, c in _chain_steps(a) if not 0 < q <= 1)


def _all_accepted(k: str, a: Args, o: Outputs) -> int:
    n = a["NUM_SLOTS"]
    return int((o["AcceptTokenNum"][: contract.batch(a)] == n - 1).sum()) if n > 1 else 0


def _final_rows(a: Args, o: Outputs) -> list[tuple[int, torch.Tensor, float]]:
    """Each K46 request's final weights in units (as the contract decides them) and final coin."""
    out = []
    for b in range(contract.batch(a)):
        num, scale, _ = contract.classic_decisions(a, b)
        out.append((b, contract.classic_final_units(a, b, num, scale), float(a["UniformSamplesFinal"][b])))
    return out


def _zero_residual(k: str, a: Args, o: Outputs) -> int:
    return sum(1 for _, w, _ in _final_rows(a, o) if not bool((w > 0).any()))


def _overrun(k: str, a: Args, o: Outputs) -> int:
    return sum(1 for _, w, c in _final_rows(a, o) if bool((w > 0).any()) and c == 1.0)


def _zero_probability_token(k: str, a: Args, o: Outputs) -> int:
    """The draw's V - 1 fallback names a token of zero weight (SD8, SD9)."""
    return sum(1 for _, w, c in _final_rows(a, o) if contract.draw(w, c) is None and not int(w[-1]) > 0)


def _block_beats_token_by_token(k: str, a: Args, o: Outputs) -> int:
    if not a["BLOCK_VERIFICATION"]:
        return 0
    count = 0
    for b in range(contract.batch(a)):
        first = next((s for bb, s, p, q, c in _chain_steps(a) if bb == b and not bool(contract.chain_accepts(
            torch.tensor(p), torch.tensor(q), torch.tensor(c)))), a["NUM_SLOTS"])
        count += int(o["AcceptTokenNum"][b]) > first - 1
    return count


def _mass_decides(k: str, a: Args, o: Outputs) -> int:
    """Block verification accepted a prefix shorter than the chain with 0 < h < 1, after testing the
    residual mass at the next row."""
    if not a["BLOCK_VERIFICATION"]:
        return 0
    return sum(1 for b in range(contract.batch(a)) if contract.classic_decisions(a, b)[2] is not None)


def _tiles(k: str, a: Args, o: Outputs) -> int:
    v, block = a["VOCAB_SIZE"], a["BLOCK_V"]
    return int(contract.batch(a) > 0 and v > block and v % block != 0)


def _walk(a: Args, b: int) -> tuple[int, list[int], bool]:
    """K47's walk of request b: (accepted drafts, the sibling index of each match, whether the last
    accepted node has a child)."""
    nxt, sib = a["retrieve_next_token_ptr"][b].tolist(), a["retrieve_next_sibling_ptr"][b].tolist()
    cand, slot = a["candidates_ptr"][b].tolist(), a["retrieve_index_ptr"][b].tolist()
    target = a["target_predict_ptr"].reshape(-1).tolist()
    last, cur, num, where = slot[0], 0, 0, []
    for _ in range(1, a["num_speculative_tokens"]):
        cur, k = nxt[cur], 0
        while cur != -1 and cand[cur] != target[last]:
            cur, k = sib[cur], k + 1
        if cur == -1:
            break
        num, last = num + 1, slot[cur]
        where.append(k)
    return num, where, nxt[cur] != -1 if cur != -1 else False


def _greedy_count(test) -> object:  # noqa: ANN001
    return lambda k, a, o: sum(1 for b in range(a["batch_size"]) if test(a, b, *_walk(a, b)))


def _target_only_levels(a: Args) -> list[tuple[int, bool, bool, bool]]:
    """K48's accepted nodes: (request, after a rejected sibling, by the single threshold, p = 0 met)."""
    out = []
    bs, n, spec, _ = contract.target_only_shape(a)
    for b in range(bs):
        nxt, sib = a["retrive_next_token"][b].tolist(), a["retrive_next_sibling"][b].tolist()
        cand = a["candidates"][b].tolist()
        row, coin, acc, cur = 0, a["uniform_samples"][b, 0], torch.tensor(0.0), 0
        for _ in range(1, spec):
            cur, rejected = nxt[cur], False
            zero = False
            while cur != -1:
                p = a["target_probs"][b, row, cand[cur]]
                acc = acc + p
                zero |= float(p) == 0.0
                if bool(contract.target_only_accepts(p, acc, coin, a["threshold_single"], a["threshold_acc"])):
                    t_acc = max(float(torch.tensor(a["threshold_acc"], dtype=F32)), 1e-9)
                    out.append((b, rejected, not bool(coin < acc / t_acc), zero))
                    acc, row, coin = torch.tensor(0.0), cur, a["uniform_samples"][b, cur]
                    break
                rejected = True
                cur = sib[cur]
            if cur == -1:
                out.append((b, False, False, zero))
                break
    return out


CLASSES: tuple[StateClass, ...] = (
    StateClass("coin * q == p: rejected", (contract.K46,), _boundary, "C46a: the strict product rule's boundary (SD1, SD3)"),
    StateClass("p = 0 at coin 0: rejected", (contract.K46,), _zero_mass, "C46a: SD2, vLLM's C9 accepts"),
    StateClass("q outside (0, 1] at a draft", (contract.K46,), _odd_q, "q = 0, > 1, negative, infinite or NaN rejects (SD4)"),
    StateClass("every draft accepted: the bonus", (contract.K46,), _all_accepted, "C46d: drawn from p at row NUM_SLOTS - 1 (SD11)"),
    StateClass("an all-zero residual", (contract.K46,), _zero_residual, "C46d: the draw finds nothing: V - 1 (SD8)"),
    StateClass("a final coin of 1 over positive weights", (contract.K46,), _overrun, "C46d: the cut is the sum: V - 1 (SD9)"),
    StateClass("block verification beyond the first rejection", (contract.K46,), _block_beats_token_by_token,
               "C46e: a prefix the token-by-token rule rejects (SD16)"),
    StateClass("block verification's residual mass", (contract.K46,), _mass_decides, "C46e: 0 < h < 1 below the last step"),
    StateClass("a vocabulary off BLOCK_V", (contract.K46,), _tiles, "the draw carries its prefix sum across tiles"),
    StateClass("the draw names a zero-probability token", (contract.K46,), _zero_probability_token,
               "V - 1 of weight 0: SGLang's fallback, kept (SD8, SD9)", required=False, hazard=True),
    StateClass("a match past the first sibling", (contract.K47,), _greedy_count(lambda a, b, num, where, more: any(where))),
    StateClass("no match at the root level", (contract.K47,),
               _greedy_count(lambda a, b, num, where, more: num == 0 and int(a["retrieve_next_token_ptr"][b, 0]) != -1
                             and a["num_speculative_tokens"] > 1)),
    StateClass("three or more drafts accepted", (contract.K47,), _greedy_count(lambda a, b, num, where, more: num >= 3)),
    StateClass("a walk cut by num_speculative_tokens", (contract.K47,),
               _greedy_count(lambda a, b, num, where, more: num == a["num_speculative_tokens"] - 1 and more)),
    StateClass("int32 tree indices", (contract.K47,),
               lambda k, a, o: int(a["batch_size"] > 0 and a["retrieve_next_sibling_ptr"].dtype == torch.int32), call_site=False),
    StateClass("slots permuted over the batch", (contract.K47,),
               lambda k, a, o: int(not torch.equal(a["retrieve_index_ptr"].reshape(-1).long(), torch.arange(a["retrieve_index_ptr"].numel()))),
               call_site=False),
    StateClass("siblings share the level's coin", (contract.K48,),
               lambda k, a, o: sum(1 for _, after, _, _ in _target_only_levels(a) if after), "C48a: a sibling accepted after a rejected one"),
    StateClass("p >= threshold_single accepts", (contract.K48,),
               lambda k, a, o: sum(1 for _, _, single, _ in _target_only_levels(a) if single), "C48a, SD15"),
    StateClass("p = 0 at a level", (contract.K48,), lambda k, a, o: sum(1 for *_, zero in _target_only_levels(a) if zero),
               "C48a: no target mass never accepts (SGLang #35771)"),
    StateClass("draft_probs written", (contract.K48,), lambda k, a, o: int(not torch.equal(a["draft_probs"], o["draft_probs"])),
               "C48c: the input mutation"),
    StateClass("the bonus drawn", (contract.K48,),
               lambda k, a, o: int((o["accept_token_num"] == a["accept_index"].shape[1] - 1).sum()) if a["accept_index"].shape[1] > 1 else 0),
)
