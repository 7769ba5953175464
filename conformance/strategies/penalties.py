"""Rows for Model Runner V2's penalties: requests whose verification rows sit at local positions
0..K with drafts that repeat the prompt, the output and each other (placeholders of -1 and ids past
the vocabulary among them); repetition penalties of 1, ordinary, tiny and huge; frequency and presence
penalties of 0, -0.0, vLLM's range and beyond; positive, negative, zero, signed-zero, infinite and
subnormal logits; bitmask words with bit 31 and bits past V; counts past 2**24; vocabularies off the
tile and the word; strided rows and tables. K40: prefills whose prompt ends inside a tile or at its
edge, empty prefills, rows shorter than the longest, tables already holding bits and counts, and (off
the call site) a state named twice."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import penalties as contract
from contracts._checks import flat_view

REPETITION = (1.0, 1.0, 2.0, 0.5, 1.3, 3.0, 1.05, 1.7717035, 1e-7, 2.0**-149, 1e30, 3e38)  # 1.05, 1.77: inexact compiled 1/p
FREQUENCY = (0.0, 0.0, -0.0, 0.5, -0.5, 2.0, -2.0, 0.1, 1e20)
PRESENCE = (0.0, 0.0, -0.0, 0.25, -1.0, 2.0, 0.3)
LOGITS = (0.0, -0.0, float("inf"), float("-inf"), 2.0**-149, -(2.0**-149), 3e38, -3e38)


def _table(g: torch.Generator, draw: st.DrawFn, states: int, width: int, values: torch.Tensor | None = None) -> torch.Tensor:
    """A [states, width] int32 table, inside a wider buffer now and then (its rows stride(0) apart)."""
    pad = draw(st.sampled_from([0, 0, 0, 3]))
    buf = torch.zeros(states, width + pad, dtype=torch.int32)
    if values is not None:
        buf[:, :width] = values
    return buf[:, :width] if pad else buf


@st.composite
def _penalties(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    v = draw(st.one_of(st.integers(0, 40), st.integers(41, 300), st.sampled_from([1024, 1031, 2049])))
    block = draw(st.sampled_from([32, 64, 1024] if v <= 1024 else [1024, 8192]))
    # Requests, each K + 1 rows at local positions 0..K and one state (distinct, as the call site has).
    ks = draw(st.lists(st.integers(0, 3), min_size=0, max_size=4))
    states = draw(st.integers(max(1, len(ks)), len(ks) + 2))
    owner = draw(st.permutations(range(states)))[: len(ks)]
    if ks and draw(st.integers(0, 5)) == 0:
        owner = [owner[0]] * len(ks)  # off the call site: requests sharing a state
    mapping = [s for s, k in zip(owner, ks) for _ in range(k + 1)]
    local = [j for k in ks for j in range(k + 1)]
    n = len(mapping)
    if n and draw(st.integers(0, 7)) == 0:  # off the call site: any position the reads allow
        local = [draw(st.integers(0, r + 1)) for r in range(n)]
        event("positions apart from the requests")
    pens = []
    for _ in range(states):
        if draw(st.integers(0, 4)) == 0:
            pens.append((1.0, draw(st.sampled_from([0.0, -0.0])), draw(st.sampled_from([0.0, -0.0]))))  # off
        else:
            pens.append((draw(st.sampled_from(REPETITION)), draw(st.sampled_from(FREQUENCY)), draw(st.sampled_from(PRESENCE))))
    # Prompts and outputs: a few tokens of each state, the last token and bit-31 columns favoured.
    words = contract.cdiv(v, contract.WORD)
    favoured = [t for t in (v - 1, 31, 63, 0) if 0 <= t < v]
    prompt = torch.zeros(states, max(words, 1) * contract.WORD, dtype=torch.bool)
    counts = torch.zeros(states, v, dtype=torch.int64)
    for s in range(states):
        if not v:
            break
        picks = torch.randint(0, v, (draw(st.integers(0, 6)),), generator=g).tolist() + draw(st.lists(st.sampled_from(favoured), max_size=2))
        prompt[s, picks] = True
        outs = torch.randint(0, v, (draw(st.integers(0, 6)),), generator=g)
        counts[s].index_add_(0, outs, torch.randint(1, 4, outs.shape, generator=g))
        if draw(st.integers(0, 5)) == 0:
            counts[s, int(torch.randint(0, v, (1,), generator=g))] = draw(st.sampled_from([2**24 + 1, 2**24 + 3, 2**31 - 64]))
            event("a count past 2**24")
    packed = (prompt.view(states, -1, contract.WORD).long() << torch.arange(contract.WORD)).sum(-1)
    if v and draw(st.integers(0, 3)) == 0:  # bits past V in the last word: never read as columns
        packed[:, -1] |= torch.randint(0, 2**32, (states,), generator=g) & ~((1 << (v - (words - 1) * contract.WORD)) - 1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)[:, :words]
    mask = _table(g, draw, states, words, packed)
    bins = _table(g, draw, states, v, counts.to(torch.int32))
    # The step's tokens: local position 0 the last committed token, then drafts that repeat.
    pool = favoured + [int(t) for t in prompt[:, :v].nonzero()[:, 1][:4]] + [int(t) for t in counts.nonzero()[:, 1][:4]]
    token_ids = []
    for _ in range(n):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            token_ids.append(-1)  # a draft not yet proposed (gather_draft_sampled's placeholder)
        elif kind == 1:
            token_ids.append(v + draw(st.integers(0, 3)))  # outside the vocabulary: counts nowhere
        elif kind <= 5 and pool:
            token_ids.append(draw(st.sampled_from(pool)))
        elif kind <= 7 and token_ids and 0 <= token_ids[-1] < v:
            token_ids.append(token_ids[-1])  # a draft repeated
        else:
            token_ids.append(int(torch.randint(0, max(v, 1), (1,), generator=g)))
    pad = draw(st.sampled_from([0, 5]))
    logits = torch.randn(n, v + pad, generator=g) * draw(st.sampled_from([0.5, 3.0, 40.0]))
    if n and v:
        logits.view(-1)[torch.randint(0, n * (v + pad), (max(1, n * v // 10),), generator=g)] = float("-inf")
        columns = [t for t in pool + token_ids if 0 <= t < v] or [0]  # where the penalties apply, mostly
        for _ in range(draw(st.integers(0, 8))):
            logits[draw(st.integers(0, n - 1)), draw(st.sampled_from(columns))] = draw(st.sampled_from(LOGITS))
        for r, s in enumerate(mapping):  # a NaN where no penalty reads it
            if not contract.uses_penalty(*pens[s]) and draw(st.integers(0, 3)) == 0:
                logits[r, draw(st.integers(0, v - 1))] = float("nan")
    if pad and draw(st.booleans()):
        logits = logits[:, :v]
        event("strided rows")
    args = dict(
        logits_ptr=logits,
        logits_stride=logits.stride(0) if n else v,
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(draw(int_dtypes)),
        token_ids_ptr=torch.tensor(token_ids, dtype=torch.int64).to(draw(int_dtypes)),
        expanded_local_pos_ptr=torch.tensor(local, dtype=torch.int64).to(draw(int_dtypes)),
        repetition_penalty_ptr=torch.tensor([p[0] for p in pens], dtype=torch.float32),
        frequency_penalty_ptr=torch.tensor([p[1] for p in pens], dtype=torch.float32),
        presence_penalty_ptr=torch.tensor([p[2] for p in pens], dtype=torch.float32),
        prompt_bin_mask_ptr=mask,
        prompt_bin_mask_stride=mask.stride(0),
        output_bin_counts_ptr=bins,
        output_bin_counts_stride=bins.stride(0),
        vocab_size=v,
        BLOCK_SIZE=block,
    )
    return Case(contract.K39, args)


@cases_for(contract.K39)
def penalties_cases() -> st.SearchStrategy[Case]:
    return _penalties()


@st.composite
def _bincount(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    v = draw(st.one_of(st.integers(1, 70), st.sampled_from([96, 257, 1025])))
    block = draw(st.sampled_from([4, 16, 64, 1024]))
    states = draw(st.integers(1, 6))
    width = draw(st.sampled_from([8, 40, 300, 2100] if block < 1024 else [300, 2100, 2100]))  # two tiles of 1024 and more
    n = draw(st.integers(0, states))
    mapping = draw(st.permutations(range(states)))[:n]
    if n and draw(st.integers(0, 5)) == 0:
        mapping = mapping + [mapping[0]]  # off the call site: a state named twice
        event("a state named twice")
    edges = [e for e in (block, 2 * block) if e <= width]
    prefill, prompt = [], []
    for _ in range(states):
        f = draw(st.one_of(st.integers(0, min(width, 70)), st.sampled_from([width, *edges]), st.integers(0, width)))
        p = draw(st.one_of(st.integers(0, f), st.sampled_from([e for e in (0, f, *edges) if e <= f])))
        prefill.append(f)
        prompt.append(p)
    favoured = [t for t in (v - 1, 31, 63, 0) if t < v]
    tokens = torch.randint(0, v, (states, width), generator=g)
    hot = torch.rand(states, width, generator=g) < 0.3  # repeats: many writes to one word or count
    tokens[hot] = torch.tensor(favoured)[torch.randint(0, len(favoured), (int(hot.sum()),), generator=g)]
    all_token_ids = tokens.to(draw(int_dtypes))
    if draw(st.integers(0, 3)) == 0:
        all_token_ids = torch.cat([all_token_ids, all_token_ids[:, :3]], 1)[:, :width]  # a wider buffer
    words = contract.cdiv(v, contract.WORD)
    before = torch.randint(-(2**31), 2**31, (states, words), generator=g, dtype=torch.int64)
    before[torch.rand(states, words, generator=g) < 0.6] = 0
    mask = _table(g, draw, states, words, before.to(torch.int32))
    counts = _table(g, draw, states, v, torch.randint(0, 3, (states, v), generator=g).to(torch.int32))
    args = dict(
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(draw(int_dtypes)),
        all_token_ids_ptr=all_token_ids,
        all_token_ids_stride=all_token_ids.stride(0),
        prompt_len_ptr=torch.tensor(prompt, dtype=torch.int64).to(draw(int_dtypes)),
        prefill_len_ptr=torch.tensor(prefill, dtype=torch.int64).to(draw(int_dtypes)),
        prompt_bin_mask_ptr=mask,
        prompt_bin_mask_stride=mask.stride(0),
        output_bin_counts_ptr=counts,
        output_bin_counts_stride=counts.stride(0),
        BLOCK_SIZE=block,
    )
    return Case(contract.K40, args)


@cases_for(contract.K40)
def bincount_cases() -> st.SearchStrategy[Case]:
    return _bincount()


# -- state classes -----------------------------------------------------------------------------------
def _penalised(a: Args) -> list[tuple[int, int, float]]:
    """(row, state, repetition penalty) of every row K39 penalises."""
    if not a["vocab_size"]:
        return []
    out = []
    for r in range(contract.rows(a)):
        s = int(a["expanded_idx_mapping_ptr"][r])
        rep, freq, pres = contract.penalties_of(a, s)
        if contract.uses_penalty(rep, freq, pres):
            out.append((r, s, rep))
    return out


def _hit(a: Args, r: int, s: int) -> torch.Tensor:
    """Row r's columns the repetition penalty scales: in the prompt, counted, or drafted earlier."""
    at = s * a["output_bin_counts_stride"]
    count = flat_view(a["output_bin_counts_ptr"])[at : at + a["vocab_size"]].to(torch.int64) + contract.draft_counts(a, r)
    return contract.prompt_bits(a, s) | (count > 0)


def _repetition_on(test: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        total = 0
        for r, s, rep in _penalised(a):
            if rep != 1.0:
                total += int((_hit(a, r, s) & test(a["logits_ptr"][r, : a["vocab_size"]])).sum())
        return total

    return count


def _only_drafted(kernel: str, a: Args, out: Outputs) -> int:
    total = 0
    for r, s, rep in _penalised(a):
        at = s * a["output_bin_counts_stride"]
        base = flat_view(a["output_bin_counts_ptr"])[at : at + a["vocab_size"]]
        only = (contract.draft_counts(a, r) > 0) & (base == 0)
        if rep != 1.0:
            only &= ~contract.prompt_bits(a, s)
        total += int(only.sum())
    return total


def _rep_far(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for r, s, rep in _penalised(a) if rep != 1.0 and not 2.0**-20 <= rep <= 2.0**20 and bool(_hit(a, r, s).any()))


def _untouched(kernel: str, a: Args, out: Outputs) -> int:
    if not a["vocab_size"]:
        return 0
    return sum(1 for r in range(contract.rows(a))
               if not contract.uses_penalty(*contract.penalties_of(a, int(a["expanded_idx_mapping_ptr"][r]))))


def _off_grid(kernel: str, a: Args, out: Outputs) -> int:
    v = a["vocab_size"]
    return int(v % a["BLOCK_SIZE"] != 0 and v % contract.WORD != 0 and any(rep != 1.0 for _, _, rep in _penalised(a)))


def _prompt_bit(column: Callable[[int], list[int]]) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        total = 0
        for _, s, rep in _penalised(a):
            if rep != 1.0:
                cols = [c for c in column(a["vocab_size"]) if 0 <= c < a["vocab_size"]]
                total += int(contract.prompt_bits(a, s)[cols].sum()) if cols else 0
        return total

    return count


def _request_rows(kernel: str, a: Args, out: Outputs) -> int:
    """Runs of rows of one penalised state at local positions 0, 1, .., K (K >= 2)."""
    pos = a["expanded_local_pos_ptr"][: contract.rows(a)].tolist()
    penalised = {r for r, _, _ in _penalised(a)}
    runs = 0
    for r in range(len(pos)):
        k = pos[r]
        if k >= 2 and r - k >= 0 and r in penalised and pos[r - k : r + 1] == list(range(k + 1)):
            m = a["expanded_idx_mapping_ptr"]
            runs += len({int(m[j]) for j in range(r - k, r + 1)}) == 1
    return runs


def _placeholder(kernel: str, a: Args, out: Outputs) -> int:
    total = 0
    for r, _, _ in _penalised(a):
        first, last = contract.draft_span(a, r)
        drafts = a["token_ids_ptr"][first : last + 1] if last >= first else a["token_ids_ptr"][:0]
        total += int(((drafts < 0) | (drafts >= a["vocab_size"])).sum())
    return total


def _strided(kernel: str, a: Args, out: Outputs) -> int:
    return int(contract.rows(a) > 1 and a["logits_stride"] > a["vocab_size"] and bool(_penalised(a)))


def _words_bit_31(kernel: str, a: Args, out: Outputs) -> int:
    """Prompt words K40 leaves negative (bit 31 set) in a row it writes."""
    total = 0
    for s in set(a["expanded_idx_mapping_ptr"].tolist()):
        prompt, _ = contract.prefill_of(a, s)
        total += int((prompt % contract.WORD == 31).any())
    return total


def _bincount_rows(test: Callable[[Args, int, int, int], bool]) -> Callable[[str, Args, Outputs], int]:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        mapping = a["expanded_idx_mapping_ptr"].tolist()
        longest = contract.longest_prefill(a)
        return sum(1 for s in mapping
                   if test(a, int(a["prompt_len_ptr"][s]), int(a["prefill_len_ptr"][s]), longest))

    return count


def _last_token(kernel: str, a: Args, out: Outputs) -> int:
    last = a["output_bin_counts_ptr"].shape[1] - 1
    total = 0
    for s in set(a["expanded_idx_mapping_ptr"].tolist()):
        prompt, output = contract.prefill_of(a, s)
        total += int((prompt == last).any()) + int((output == last).any())
    return total


def _accumulated(kernel: str, a: Args, out: Outputs) -> int:
    """Counts added to a count already above 0."""
    total = 0
    for s in set(a["expanded_idx_mapping_ptr"].tolist()):
        _, output = contract.prefill_of(a, s)
        if output.numel():
            at = s * a["output_bin_counts_stride"]
            total += int((flat_view(a["output_bin_counts_ptr"])[at + output.unique()] > 0).sum())
    return total


def _twice(kernel: str, a: Args, out: Outputs) -> int:
    m = a["expanded_idx_mapping_ptr"].tolist()
    return len(m) - len(set(m))


K39, K40 = (contract.K39,), (contract.K40,)
CLASSES: tuple[StateClass, ...] = (
    StateClass("row without penalty", K39, _untouched, "repetition 1, frequency and presence 0 (-0.0 too): not written"),
    StateClass("penalised only for an earlier draft", K39, _only_drafted,
               "a column neither in the prompt nor counted, drafted at an earlier local position of the row's request"),
    StateClass("repetition on a positive logit", K39, _repetition_on(lambda x: x > 0), "x * RN(1 / penalty)"),
    StateClass("repetition on a negative logit", K39, _repetition_on(lambda x: (x < 0) & torch.isfinite(x)), "x * penalty"),
    StateClass("repetition on a zero logit", K39, _repetition_on(lambda x: x == 0), "0 * penalty keeps the zero's sign"),
    StateClass("repetition on -inf", K39, _repetition_on(lambda x: x == float("-inf")), "-inf stays"),
    StateClass("tiny or huge repetition penalty", K39, _rep_far, "outside [2**-20, 2**20]: RN(1/p) overflows or is subnormal"),
    StateClass("vocabulary off the tile and the word", K39, _off_grid, "V % BLOCK_SIZE != 0 and V % 32 != 0: the last word partial"),
    StateClass("prompt token V - 1", K39, _prompt_bit(lambda v: [v - 1]), "the last column's bit"),
    StateClass("prompt bit 31", K39, _prompt_bit(lambda v: list(range(31, v, 32))), "a negative bitmask word"),
    StateClass("rows of one request at local positions 0..K", K39, _request_rows, "K >= 2: each row counts the drafts before it"),
    StateClass("a draft outside the vocabulary", K39, _placeholder, "-1 (a placeholder) or >= V: counts nowhere"),
    StateClass("strided logits rows", K39, _strided, "logits_stride > V"),
    StateClass("K40 prompt bit 31", K40, _words_bit_31, "a prompt token t with t % 32 = 31: the word turns negative"),
    StateClass("K40 last column", K40, _last_token, "a token at the tables' last column (V - 1)"),
    StateClass("K40 prompt ends inside a tile", K40, _bincount_rows(lambda a, p, f, m: p < f and p % a["BLOCK_SIZE"] != 0),
               "the tile holding prompt_len sets bits and counts"),
    StateClass("K40 prompt ends at a tile edge", K40,
               _bincount_rows(lambda a, p, f, m: 0 < p < f and p % a["BLOCK_SIZE"] == 0), "(b + 1) * BLOCK_SIZE = prompt_len"),
    StateClass("K40 a row shorter than the longest prefill", K40,
               _bincount_rows(lambda a, p, f, m: contract.cdiv(f, a["BLOCK_SIZE"]) < contract.cdiv(m, a["BLOCK_SIZE"])),
               "its programs past its prefill_len do nothing"),
    StateClass("K40 empty prefill", K40, _bincount_rows(lambda a, p, f, m: f == 0), "prefill_len 0: nothing read"),
    StateClass("K40 counts added to", K40, _accumulated, "the tables' contents accumulate (the host zeroes them first)"),
    StateClass("K40 a state named twice", K40, _twice, "off the call site: its outputs counted once per row", required=False),
)
