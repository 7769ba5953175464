"""Rows for Model Runner V2's bad words: requests of one to five rows (local positions 0..K, drafts
from a small alphabet so that prefixes match, the drafts' placeholder -1 among them), committed
outputs of 0 to 6 tokens, bad words planted to end a row's sequence among its committed tokens, its
drafts or both, or one token longer than it sees, one-token words, words sharing a banned token,
-inf and NaN logits at banned columns, counts below the grid's, garbage past each request's count,
strided logits and tables."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import bad_words as contract

ALPHABET = 5  # tokens 0..4: short prefixes match often


@st.composite
def _launch(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    v = draw(st.one_of(st.integers(ALPHABET, 24), st.integers(25, 600)))
    requests = draw(st.integers(0, 4))
    states = draw(st.integers(max(1, requests), 6))
    order = draw(st.permutations(range(states)))
    mapping: list[int] = []
    local: list[int] = []
    for q in range(requests):
        k = draw(st.integers(0, 4))  # drafts
        s = order[q] if draw(st.integers(0, 7)) else order[0]  # now and then two requests of one state
        mapping += [s] * (k + 1)
        local += list(range(k + 1))
    n = len(mapping)
    inputs = torch.randint(0, ALPHABET, (n,), generator=g)
    if n and draw(st.integers(0, 4)) == 0:
        inputs[torch.randint(0, n, (1,), generator=g)] = -1  # a placeholder draft
        event("a placeholder draft")
    prompts = [draw(st.integers(0, 3)) for _ in range(states)]
    outputs = [draw(st.integers(0, 6)) for _ in range(states)]
    history = torch.randint(0, ALPHABET, (states, max(p + o for p, o in zip(prompts, outputs)) + draw(st.integers(0, 3))), generator=g)

    def seen(r: int) -> list[int]:
        s = mapping[r]
        return history[s, prompts[s] : prompts[s] + outputs[s]].tolist() + inputs[r - local[r] + 1 : r + 1].tolist()

    words: list[list[list[int]]] = []
    for s in range(states):
        ws = []
        for _ in range(draw(st.integers(0, 5))):
            length = draw(st.integers(1, 4))
            ws.append(torch.randint(0, ALPHABET, (length,), generator=g).tolist())
        rows_of = [r for r in range(n) if mapping[r] == s]
        if ws and rows_of:  # plant words that end a row's sequence, or are one longer than it
            for _ in range(draw(st.integers(0, 3))):
                r = draw(st.sampled_from(rows_of))
                sequence = seen(r)
                plen = draw(st.integers(0, len(sequence) + 1))
                prefix = sequence[len(sequence) - plen :] if plen <= len(sequence) else [draw(st.integers(0, ALPHABET - 1)), *sequence]
                ws.append([*prefix, draw(st.integers(0, v - 1))])
        words.append(ws)
    most = max((len(w) for w in words), default=0) + draw(st.integers(0, 2))
    width = max((sum(len(x) for x in w) for w in words), default=0) + draw(st.integers(0, 4))
    tokens = torch.randint(0, ALPHABET, (states, max(width, 1)), generator=g)
    offsets = torch.randint(-3, 9, (states, most + 1), generator=g)  # garbage past each request's count
    for s, ws in enumerate(words):
        flat = [t for w in ws for t in w]
        if flat:
            tokens[s, : len(flat)] = torch.tensor(flat)
        offsets[s, : len(ws) + 1] = torch.tensor([0, *(len(w) for w in ws)]).cumsum(0)
    num = torch.tensor([len(w) for w in words])
    logits = torch.randn(n, v + draw(st.sampled_from([0, 0, 5])), generator=g) * 4
    if n:
        logits.view(-1)[torch.randint(0, logits.numel(), (max(1, logits.numel() // 8),), generator=g)] = float("-inf")
        logits.view(-1)[torch.randint(0, logits.numel(), (2,), generator=g)] = float("nan")
        for ws in words:  # a banned column holding -inf or NaN
            for w in ws[:1]:
                logits[torch.randint(0, n, (1,), generator=g), w[-1]] = draw(st.sampled_from([float("-inf"), float("nan"), 3.0]))
    if logits.shape[1] != v:
        logits = logits[:, :v]
        event("strided rows")
    ints = draw(int_dtypes)
    table_ints = draw(int_dtypes)
    tokens, offsets, history = tokens.to(table_ints), offsets.to(table_ints), history.to(table_ints)
    if draw(st.integers(0, 3)) == 0:  # tables inside wider buffers
        tokens = torch.cat([tokens, tokens], 1)[:, : tokens.shape[1]]
        history = torch.cat([history, history], 1)[:, : history.shape[1]]
        event("strided tables")
    args = dict(
        logits_ptr=logits,
        logits_stride=logits.stride(0) if n else v,
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(ints),
        bad_word_token_ids_ptr=tokens,
        bad_word_token_ids_stride=tokens.stride(0),
        bad_word_offsets_ptr=offsets,
        bad_word_offsets_stride=offsets.stride(0),
        num_bad_words_ptr=num.to(ints),
        all_token_ids_ptr=history,
        all_token_ids_stride=history.stride(0),
        prompt_len_ptr=torch.tensor(prompts).to(ints),
        total_len_ptr=torch.tensor([p + o for p, o in zip(prompts, outputs)]).to(ints),
        input_ids_ptr=inputs.to(ints),
        expanded_local_pos_ptr=torch.tensor(local, dtype=torch.int64).to(ints),
    )
    return Case(contract.K41, args)


@cases_for(contract.K41)
def bad_words_cases() -> st.SearchStrategy[Case]:
    return _launch()


def _matches(a: Args) -> list[tuple[int, int, int, int]]:
    """(row, bad word, prefix length, where its prefix starts in the row's sequence) of every word of
    every row with bad words, -1 as the start where the prefix is longer than the sequence."""
    out = []
    for r in range(contract.rows(a)):
        s = int(a["expanded_idx_mapping_ptr"][r])
        if int(a["num_bad_words_ptr"][s]) == 0:
            continue
        sequence = contract.seen(a, r)
        for j, w in enumerate(contract.words(a, s)):
            plen = len(w) - 1
            out.append((r, j, plen, len(sequence) - plen if contract.bans(w, sequence) else -1 - (plen == len(sequence) + 1)))
    return out


def _output_len(a: Args, r: int) -> int:
    s = int(a["expanded_idx_mapping_ptr"][r])
    return int(a["total_len_ptr"][s]) - int(a["prompt_len_ptr"][s])


def _bans(test: object) -> object:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        return sum(1 for r, j, plen, at in _matches(a) if at >= 0 and test(a, r, plen, at))  # type: ignore[operator]

    return count


def _shared(kernel: str, a: Args, out: Outputs) -> int:
    total = 0
    for r in range(contract.rows(a)):
        s = int(a["expanded_idx_mapping_ptr"][r])
        if int(a["num_bad_words_ptr"][s]):
            sequence = contract.seen(a, r)
            banned = [w[-1] for w in contract.words(a, s) if contract.bans(w, sequence)]
            total += len(banned) - len(set(banned))
    return total


def _held(kernel: str, a: Args, out: Outputs) -> int:
    before, after = a["logits_ptr"], out["logits_ptr"]
    return int(((after == float("-inf")) & (torch.isnan(before) | (before == float("-inf")))).sum()) if before.numel() else 0


def _idle(kernel: str, a: Args, out: Outputs) -> int:
    _, most = contract.grid(a)
    return sum(1 for c in contract.counts(a) if c < most)


CLASSES: tuple[StateClass, ...] = (
    StateClass("a prefix across committed tokens and drafts", (contract.K41,),
               _bans(lambda a, r, plen, at: plen >= 2 and at < _output_len(a, r) < at + plen),
               "the prefix begins in the committed output and ends among the row's drafts"),
    StateClass("a prefix among the drafts only", (contract.K41,),
               _bans(lambda a, r, plen, at: plen >= 1 and at >= _output_len(a, r)), "input_ids at local positions 1..pos"),
    StateClass("a prefix among committed tokens only", (contract.K41,),
               _bans(lambda a, r, plen, at: plen >= 1 and int(a["expanded_local_pos_ptr"][r]) == 0),
               "a row at local position 0 sees no draft"),
    StateClass("a prefix one longer than the row sees", (contract.K41,),
               lambda k, a, o: sum(1 for r, j, plen, at in _matches(a) if at == -2), "never matches"),
    StateClass("a one-token bad word", (contract.K41,), _bans(lambda a, r, plen, at: plen == 0), "bans its token always"),
    StateClass("two bad words ban one column", (contract.K41,), _shared, "both programs store -inf"),
    StateClass("a row at local position 2 or more", (contract.K41,),
               _bans(lambda a, r, plen, at: int(a["expanded_local_pos_ptr"][r]) >= 2), "it sees two drafts or more"),
    StateClass("a banned column held -inf or NaN", (contract.K41,), _held, "it becomes -inf"),
    StateClass("programs past a request's count", (contract.K41,), _idle,
               "a row whose request has fewer bad words than the grid's second axis: its last programs do nothing"),
)
