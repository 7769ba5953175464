"""Rows for Model Runner V2's logit bias: requests sharing rows, allowed lists with duplicates (as
structured output's stop tokens only, now and then), distinct biased ids on allowed and disallowed
columns, biases of +-100, 0 and -0.0, stop lists with duplicates, positions on both sides of
``pos + 1 == min_len``, restore flags with and without ``CHECK_ALL_MASKED_ROWS``, +inf, -inf and NaN
logits where the contract admits them, vocabularies off the tile width, the call site's tables and
tiles (1024-wide lists, 8192-wide row tiles) and smaller ones, strided rows and tables."""

from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from contracts import logit_bias as contract
from contracts.spec import next_power_of_2

BIASES = (0.5, -2.0, 100.0, -100.0, 1e-3, 0.0, -0.0, 7.25)


def _table(lists: list[list], width: int, dtype: torch.dtype, fill: float = 0) -> torch.Tensor:
    t = torch.full((len(lists), width), fill, dtype=dtype)
    for s, x in enumerate(lists):
        if x:
            t[s, : len(x)] = torch.tensor(x, dtype=dtype)
    return t


@st.composite
def _launch(draw: st.DrawFn) -> Case:
    g = generator(draw(seeds))
    call_site = draw(st.integers(0, 4)) == 0  # the call site's widths and tiles
    small = st.one_of(st.integers(1, 40), st.integers(41, 300))
    v = draw(st.sampled_from([8193, 9000])) if call_site and draw(st.booleans()) else draw(small)
    n = draw(st.integers(0, 6))
    states = draw(st.integers(1, 5))
    mapping = draw(st.lists(st.integers(0, states - 1), min_size=n, max_size=n))
    cols = st.integers(0, v - 1)
    allowed, biases, stops, min_lens, restore = [], [], [], [], []
    for _ in range(states):
        stop = draw(st.lists(cols, min_size=1, max_size=4)) if draw(st.integers(0, 2)) else []
        if stop and draw(st.integers(0, 3)) == 0:
            stop.append(stop[0])  # a stop id twice
        restore.append(int(draw(st.booleans())))
        if stop and draw(st.integers(0, 2 - restore[-1])) == 0:  # structured output over stop tokens: masked whole
            allow = stop + draw(st.lists(st.sampled_from(stop), max_size=2))
        elif draw(st.booleans()):
            allow = draw(st.lists(cols, min_size=1, max_size=8))
            if draw(st.integers(0, 2)) == 0:
                allow.append(allow[0])  # an allowed id twice
        else:
            allow = []
        ids = draw(st.lists(cols, max_size=5, unique=True)) if draw(st.booleans()) else []
        biases.append({i: draw(st.sampled_from(BIASES)) for i in ids})
        allowed.append(allow)
        stops.append(stop)
        min_lens.append(draw(st.integers(0, 12)))
    # Positions on both sides of pos + 1 == min_len.
    pos = [max(0, min_lens[s] - draw(st.integers(-1, 3))) for s in mapping]
    widths = (1024, 1024, 128) if call_site else tuple(max([len(x) for x in lists] + [0]) + draw(st.integers(0, 3))
                                                       for lists in (allowed, biases, stops))
    widths = tuple(max(w, 1) for w in widths)
    block = next_power_of_2(max(widths))
    if not call_site and draw(st.booleans()):  # any power of two holding every list
        block = next_power_of_2(max([len(x) for x in (*allowed, *biases, *stops)] + [1]))
    logits_block = 8192 if call_site else draw(st.sampled_from([4, 16, 64, 1024]))
    pad = draw(st.sampled_from([0, 0, 3]))
    logits = torch.randn(n, v + pad, generator=g) * draw(st.sampled_from([1.0, 30.0]))
    for r, s in enumerate(mapping):
        if allowed[s]:  # NaN and -inf where step 1 masks, -inf among the kept
            logits[r, torch.randint(0, v, (2,), generator=g)] = float("nan")
            logits[r, allowed[s]] = logits[r, allowed[s]].nan_to_num(0.0)
            logits[r, draw(st.sampled_from(allowed[s]))] = draw(st.sampled_from([float("-inf"), 1.0]))
        if stops[s] and draw(st.booleans()):  # a stop token's logit +-inf: never restored
            logits[r, draw(st.sampled_from(stops[s]))] = draw(st.sampled_from([float("inf"), float("-inf")]))
        for i in biases[s]:
            if not torch.isfinite(logits[r, i]) and not bool(torch.isinf(logits[r, i])):
                logits[r, i] = 0.0
    if pad and draw(st.booleans()):
        logits = logits[:, :v]
        event("strided rows")
    ints = draw(int_dtypes)
    check = any(restore[s] for s in mapping) if draw(st.integers(0, 4)) else draw(st.booleans())
    allowed_t = _table(allowed, widths[0], ints)
    bias_ids = _table([list(b) for b in biases], widths[1], ints)
    bias_t = _table([list(b.values()) for b in biases], widths[1], torch.float32)
    stop_t = _table(stops, widths[2], ints)
    if draw(st.integers(0, 3)) == 0:  # a table inside a wider buffer
        stop_t = torch.cat([stop_t, stop_t], 1)[:, : stop_t.shape[1]]
        bias_t = torch.cat([bias_t, bias_t], 1)[:, : bias_t.shape[1]]
        event("strided tables")
    args = dict(
        logits_ptr=logits,
        logits_stride=logits.stride(0) if n else v,
        vocab_size=v,
        expanded_idx_mapping_ptr=torch.tensor(mapping, dtype=torch.int64).to(ints),
        num_allowed_token_ids_ptr=torch.tensor([len(x) for x in allowed]).to(ints),
        allowed_token_ids_ptr=allowed_t,
        allowed_token_ids_stride=allowed_t.stride(0),
        num_logit_bias_ptr=torch.tensor([len(x) for x in biases]).to(ints),
        bias_token_ids_ptr=bias_ids,
        bias_token_ids_stride=bias_ids.stride(0),
        bias_ptr=bias_t,
        bias_stride=bias_t.stride(0),
        pos_ptr=torch.tensor(pos, dtype=torch.int64).to(draw(int_dtypes)),
        min_lens_ptr=torch.tensor(min_lens).to(ints),
        num_stop_token_ids_ptr=torch.tensor([len(x) for x in stops]).to(ints),
        restore_when_all_masked_ptr=torch.tensor(restore).to(ints),
        stop_token_ids_ptr=stop_t,
        stop_token_ids_stride=stop_t.stride(0),
        BLOCK_SIZE=block,
        LOGITS_BLOCK_SIZE=logits_block,
        CHECK_ALL_MASKED_ROWS=check,
    )
    return Case(contract.K42, args)


@cases_for(contract.K42)
def bias_cases() -> st.SearchStrategy[Case]:
    return _launch()


def _rows(test: object) -> object:
    def count(kernel: str, a: Args, out: Outputs) -> int:
        return sum(1 for r in range(contract.rows(a)) if test(a, out, r, contract.state(a, r)))  # type: ignore[operator]

    return count


def _duplicate_allowed(a: Args, out: Outputs, r: int, s: int) -> bool:
    ids = contract.listed(a, contract.ALLOWED, s)
    return ids.unique().numel() < ids.numel()


def _bias_disallowed(a: Args, out: Outputs, r: int, s: int) -> bool:
    ids = contract.listed(a, contract.BIAS, s)
    return bool(contract.listed(a, contract.ALLOWED, s).numel()) and bool((~contract.survivors(a, r)[ids]).any())


def _at_the_edge(a: Args, out: Outputs, r: int, s: int) -> bool:
    return contract.listed(a, contract.STOP, s).numel() > 0 and int(a["pos_ptr"][r]) + 1 == int(a["min_lens_ptr"][s])


def _taken(a: Args, out: Outputs, r: int) -> bool:
    """The restore scan found the row all -inf: every column but the stop tokens is -inf afterwards."""
    if not contract.restores(a, r):
        return False
    live = out["logits_ptr"][r, : a["vocab_size"]] != float("-inf")
    live[contract.listed(a, contract.STOP, contract.state(a, r))] = False
    return not bool(live.any())


def _saved_infinite(a: Args, out: Outputs, r: int, s: int) -> bool:
    """A taken restore left a stop token -inf whose logit was +-inf in the input (never restored)."""
    if not _taken(a, out, r):
        return False
    stop = contract.listed(a, contract.STOP, s)
    keep = contract.survivors(a, r)[stop]
    return bool((keep & torch.isinf(a["logits_ptr"][r, stop]) & (out["logits_ptr"][r, stop] == float("-inf"))).any())


def _off_tile(a: Args, out: Outputs, r: int, s: int) -> bool:
    swept = bool(contract.listed(a, contract.ALLOWED, s).numel()) or contract.restores(a, r)
    return swept and a["vocab_size"] % a["LOGITS_BLOCK_SIZE"] != 0


K = (contract.K42,)
CLASSES: tuple[StateClass, ...] = (
    StateClass("allowed ids with duplicates", K, _rows(_duplicate_allowed), "a column listed twice keeps its value"),
    StateClass("a bias on a disallowed column", K, _rows(_bias_disallowed), "-inf plus a finite bias stays -inf"),
    StateClass("min tokens active", K, _rows(lambda a, o, r, s: contract.min_tokens_active(a, r)), "pos + 1 < min_len: stop tokens -inf"),
    StateClass("min tokens over at pos + 1 == min_len", K, _rows(_at_the_edge), "the stop tokens stay"),
    StateClass("the all-masked restore taken", K, _rows(lambda a, o, r, s: _taken(a, o, r)),
               "the stop mask left the row all -inf: the finite saved values come back"),
    StateClass("the all-masked restore not taken", K, _rows(lambda a, o, r, s: contract.restores(a, r) and not _taken(a, o, r)),
               "a live logit is left: the stop tokens stay -inf"),
    StateClass("a saved infinity not restored", K, _rows(_saved_infinite), "only -inf < v < inf comes back"),
    StateClass("a vocabulary off LOGITS_BLOCK_SIZE", K, _rows(_off_tile), "the last tile of the mask or the scan is partial"),
)
