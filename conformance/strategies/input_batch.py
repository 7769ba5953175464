"""Cases of Model Runner V2's batch-state kernels (K22-K28): one drawn batch of request states
(decode rows with 0..K drafts, chunked prefills, last prefill chunks, queries that cross the
prompt's end, rows skipped by a negative index) laid out as each kernel's launch takes it, with
state rows outside the batch, CUDA-graph padding, strided state tensors, several tiles per row
and counts near int32's top."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from conformance.case import Case
from conformance.coverage import Args, Outputs, StateClass
from conformance.strategies import cases_for, generator, int_dtypes, seeds
from conformance.strategies.metadata import padding, wide_dtypes
from contracts import input_batch as contract
from contracts._checks import flat_view
from contracts.spec import next_power_of_2

I32, I64 = torch.int32, torch.int64
INT32_MAX = 2**31 - 1
KINDS = ("decode", "decode", "decode", "chunk", "last chunk", "crosses")


@dataclass
class Row:
    kind: str
    computed: int  # num_computed_tokens
    prefill: int  # prefill_len
    query: int  # query_len
    drafts: int  # drafts verified this step
    logits: int  # drafts + NUM_NEW_SAMPLED_TOKENS
    sampled: int  # tokens the rejection sampler emitted, <= logits


@dataclass
class Batch:
    states: int  # max_num_reqs
    idx: list[int]
    rows: list[Row]
    k: int  # num_speculative_steps
    new: int  # NUM_NEW_SAMPLED_TOKENS
    g: torch.Generator

    @property
    def qsl(self) -> list[int]:
        out = [0]
        for r in self.rows:
            out.append(out[-1] + r.query)
        return out

    @property
    def cu(self) -> list[int]:
        out = [0]
        for r in self.rows:
            out.append(out[-1] + r.logits)
        return out

    def per_state(self, field: str, default: int, high: int = 50) -> list[int]:
        """A ``[max_num_reqs]`` state: the batch rows' ``field``, random values elsewhere."""
        values = torch.randint(0, high, (self.states,), generator=self.g).tolist() if default < 0 else [default] * self.states
        for s, r in zip(self.idx, self.rows):
            if s >= 0:
                values[s] = getattr(r, field)
        return values


@st.composite
def batches(draw: st.DrawFn, new: int | None = None) -> Batch:
    n = draw(st.integers(0, 6))
    k = draw(st.sampled_from([3, 1, 0, 4]))
    new = draw(st.sampled_from([1, 1, 1, 0])) if new is None else new
    g = generator(draw(seeds))
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(KINDS))
        prefill = draw(st.integers(1, 40))
        if kind == "chunk" and prefill < 2:
            kind = "last chunk"  # a one-token prompt has no chunk before its last
        if kind == "decode":
            drafts = draw(st.integers(0, k))
            computed = prefill + draw(st.integers(0, 30))
            if draw(st.sampled_from([False] * 7 + [True])):
                computed = INT32_MAX - drafts - 1 - draw(st.integers(0, 2))  # the sums' top (C37)
                event("count near int32's top")
            query = drafts + 1
        elif kind == "chunk":  # seq_len < prefill_len: emits nothing yet
            drafts, computed = 0, draw(st.integers(0, prefill - 2))
            query = draw(st.integers(1, prefill - computed - 1))
        elif kind == "last chunk":  # seq_len == prefill_len: samples its first token
            drafts, computed = 0, draw(st.integers(0, prefill - 1))
            query = prefill - computed
        else:  # the query runs past prefill_len: its logits may start inside the prompt
            drafts, computed = draw(st.integers(0, k)), draw(st.integers(0, prefill - 1))
            query = prefill - computed + draw(st.integers(1, max(1, drafts + new - 1)))
        logits = drafts + new
        sampled = draw(st.integers(min(1, logits), logits)) if logits else 0
        rows.append(Row(kind, computed, prefill, query, drafts, logits, sampled))
    states = n + draw(st.integers(0, 3))
    idx = draw(st.permutations(range(states)))[:n]
    return Batch(states, list(idx), rows, k, new, g)


def _tensor(values: list[int], dtype: torch.dtype, spare: int = 0) -> torch.Tensor:
    return torch.tensor(values + [0] * spare, dtype=I64).to(dtype)


def _strided(g: torch.Generator, rows: int, cols: int, dtype: torch.dtype, wider: int, high: int = 50) -> torch.Tensor:
    """A ``[rows, cols]`` tensor of random values in ``[0, high)``, a column slice of a wider buffer
    when ``wider``."""
    storage = torch.randint(0, high, (rows, cols + wider), generator=g).to(dtype)
    if wider:
        event("strided state tensor")
    return storage[:, :cols]


def _tile(draw: st.DrawFn, longest: int) -> int:
    size = draw(st.sampled_from([1024, 1024, 4, 1]))
    if size < longest:
        event("several tiles per row")
    return size


# -- K22 ------------------------------------------------------------------------------------
@cases_for(contract.K22)
def prefill_cases() -> st.SearchStrategy[Case]:
    return _prefill_cases()


@st.composite
def _prefill_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    qsl = bt.qsl
    lookahead = draw(st.sampled_from([0, 1, 2, 3]))
    width = max([r.computed + r.query + lookahead for r in bt.rows if r.computed < r.prefill] + [r.prefill for r in bt.rows] + [1])
    tokens = _strided(bt.g, bt.states, width + draw(st.integers(0, 2)), draw(int_dtypes), draw(st.sampled_from([0, 0, 5])), 1000)
    nxt = torch.zeros((lookahead, bt.states + draw(st.sampled_from([0, 0, 2]))), dtype=draw(int_dtypes))
    args = dict(
        input_ids_ptr=torch.zeros(qsl[-1] + padding(draw), dtype=draw(int_dtypes)),
        next_prefill_tokens_ptr=nxt,
        next_prefill_tokens_stride=nxt.stride(0),
        num_lookahead=lookahead,
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        query_start_loc_ptr=_tensor(qsl, draw(int_dtypes), padding(draw)),
        all_token_ids_ptr=tokens,
        all_token_ids_stride=tokens.stride(0),
        prefill_lens_ptr=_tensor(bt.per_state("prefill", -1), draw(int_dtypes)),
        num_computed_tokens_ptr=_tensor(bt.per_state("computed", -1), draw(int_dtypes)),
        BLOCK_SIZE=_tile(draw, max((r.query for r in bt.rows), default=0)),
        LOOKAHEAD_BLOCK=next_power_of_2(lookahead) * draw(st.sampled_from([1, 1, 2])),
    )
    return Case(contract.K22, args)


# -- K23 ------------------------------------------------------------------------------------
@cases_for(contract.K23)
def pos_cases() -> st.SearchStrategy[Case]:
    return _pos_cases()


@st.composite
def _pos_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    n, qsl = len(bt.rows), bt.qsl
    max_num_reqs = n + draw(st.sampled_from([0, 0, 2, 5]))  # rows past the batch: CUDA-graph padding
    args = dict(
        pos_ptr=torch.zeros(qsl[-1] + padding(draw), dtype=draw(wide_dtypes)),
        seq_lens_ptr=torch.zeros(max_num_reqs + padding(draw), dtype=draw(int_dtypes)),
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        query_start_loc_ptr=_tensor(qsl, draw(int_dtypes), padding(draw)),
        num_computed_tokens_ptr=_tensor(bt.per_state("computed", -1), draw(int_dtypes)),
        max_num_reqs=max_num_reqs,
        BLOCK_SIZE=_tile(draw, max((r.query for r in bt.rows), default=0)),
    )
    return Case(contract.K23, args)


# -- K24 ------------------------------------------------------------------------------------
@cases_for(contract.K24)
def combine_cases() -> st.SearchStrategy[Case]:
    return _combine_cases()


@st.composite
def _combine_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    qsl, cu = bt.qsl, bt.cu
    last = torch.randint(0, 1000, (bt.states, 1), generator=bt.g)
    drafts = _strided(bt.g, bt.states, max(bt.k, 1), draw(wide_dtypes), draw(st.sampled_from([0, 0, 2])), 1000)
    args = dict(
        input_ids_ptr=torch.randint(-5, 0, (qsl[-1] + padding(draw),), generator=bt.g).to(draw(int_dtypes)),
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        last_sampled_tokens_ptr=(last if draw(st.booleans()) else last.flatten()).to(draw(wide_dtypes)),
        query_start_loc_ptr=_tensor(qsl, draw(int_dtypes), padding(draw)),
        seq_lens_ptr=_tensor([r.computed + r.query for r in bt.rows], draw(int_dtypes), padding(draw)),
        prefill_len_ptr=_tensor(bt.per_state("prefill", -1), draw(int_dtypes)),
        draft_tokens_ptr=drafts,
        draft_tokens_stride=drafts.stride(0),
        cu_num_logits_ptr=_tensor(cu, draw(int_dtypes)),
        logits_indices_ptr=torch.zeros(cu[-1] + padding(draw), dtype=draw(wide_dtypes)),
        BLOCK_SIZE=next_power_of_2(bt.k + bt.new) * draw(st.sampled_from([1, 1, 2])),
        NUM_NEW_SAMPLED_TOKENS=bt.new,
    )
    return Case(contract.K24, args)


# -- K25 ------------------------------------------------------------------------------------
@cases_for(contract.K25)
def counts_cases() -> st.SearchStrategy[Case]:
    return _counts_cases()


@st.composite
def _counts_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    args = dict(
        num_sampled_ptr=_tensor([r.sampled for r in bt.rows], draw(int_dtypes)),
        num_rejected_ptr=torch.zeros(len(bt.rows) + padding(draw), dtype=draw(int_dtypes)),
        seq_lens_ptr=_tensor([r.computed + r.query for r in bt.rows], draw(int_dtypes)),
        cu_num_logits_ptr=_tensor(bt.cu, draw(int_dtypes)),
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        prefill_len_ptr=_tensor(bt.per_state("prefill", -1), draw(int_dtypes)),
    )
    return Case(contract.K25, args)


# -- K26 ------------------------------------------------------------------------------------
@cases_for(contract.K26)
def post_cases() -> st.SearchStrategy[Case]:
    return _post_cases()


@st.composite
def _post_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    n, g, k = len(bt.rows), bt.g, bt.k
    # Rows whose request finished, or needs no update, are -1 (the pipeline-parallel receive path).
    idx = [s if draw(st.sampled_from([True] * 4 + [False])) else -1 for s in bt.idx]
    rows = bt.rows
    # A chunked prefill emits nothing and rejects nothing (K25 made it so).
    sampled = [0 if r.computed + r.query < r.prefill else r.sampled for r in rows]
    rejected = [0 if r.computed + r.query < r.prefill else r.logits - ns for r, ns in zip(rows, sampled)]
    vocab = draw(st.sampled_from([4, 50]))
    width = k + 1
    tokens_in = _strided(g, max(n, 1), width, draw(wide_dtypes), draw(st.sampled_from([0, 0, 2])), vocab)
    total = [int(torch.randint(0, 40, (1,), generator=g)) for _ in range(bt.states)]
    columns = 40 + width + draw(st.integers(0, 2))
    history = _strided(g, bt.states, columns, draw(int_dtypes), draw(st.sampled_from([0, 0, 3])), 1000)
    computed = bt.per_state("computed", -1)
    for s, r in zip(idx, rows):
        if s >= 0 and computed[s] > INT32_MAX - r.query:
            computed[s] = INT32_MAX - r.query  # query_len is added before the rejected are taken off
    bins = None
    if draw(st.sampled_from([True, True, False])):
        bins = _strided(g, bt.states, vocab, draw(int_dtypes), draw(st.sampled_from([0, 0, 1])), 3)
    with_drafts = draw(st.booleans()) and k > 0
    qsl = draw(st.sampled_from(["given", "given", "none"]))
    args = dict(
        idx_mapping_ptr=_tensor(idx, draw(int_dtypes)),
        num_computed_tokens_ptr=_tensor(computed, draw(int_dtypes)),
        last_sampled_tokens_ptr=torch.randint(0, 1000, (bt.states, 1), generator=g).to(draw(wide_dtypes)),
        output_bin_counts_ptr=bins,
        output_bin_counts_stride=bins.stride(0) if bins is not None else 0,
        sampled_tokens_ptr=tokens_in,
        sampled_tokens_stride=tokens_in.stride(0),
        num_sampled_ptr=_tensor(sampled, draw(int_dtypes)),
        num_rejected_ptr=_tensor(rejected, draw(int_dtypes)),
        query_start_loc_ptr=_tensor(bt.qsl, draw(int_dtypes)) if qsl == "given" else None,
        all_token_ids_ptr=history,
        all_token_ids_stride=history.stride(0),
        total_len_ptr=_tensor(total, draw(int_dtypes)),
        draft_tokens_ptr=torch.randint(0, 1000, (n, k), generator=g).to(draw(wide_dtypes)) if with_drafts else None,
        draft_tokens_out_ptr=torch.zeros((bt.states, k), dtype=draw(wide_dtypes)) if with_drafts or draw(st.booleans()) else None,
        num_draft_tokens=k if with_drafts else 0,
    )
    return Case(contract.K26, args)


# -- K27 ------------------------------------------------------------------------------------
@cases_for(contract.K27)
def computed_cases() -> st.SearchStrategy[Case]:
    return _computed_cases()


@st.composite
def _computed_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    computed = bt.per_state("computed", -1)
    for s, r in zip(bt.idx, bt.rows):
        computed[s] = min(computed[s], INT32_MAX - r.query)
    args = dict(
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        num_computed_tokens_ptr=_tensor(computed, draw(int_dtypes)),
        query_start_loc_ptr=_tensor(bt.qsl, draw(int_dtypes), padding(draw)),
    )
    return Case(contract.K27, args)


# -- K28 ------------------------------------------------------------------------------------
@cases_for(contract.K28)
def expand_cases() -> st.SearchStrategy[Case]:
    return _expand_cases()


@st.composite
def _expand_cases(draw: st.DrawFn) -> Case:
    bt = draw(batches())
    cu = bt.cu
    longest = max((r.logits for r in bt.rows), default=1)
    args = dict(
        idx_mapping_ptr=_tensor(bt.idx, draw(int_dtypes)),
        expanded_idx_mapping_ptr=torch.zeros(cu[-1] + padding(draw), dtype=draw(int_dtypes)),
        expanded_local_pos_ptr=torch.zeros(cu[-1] + padding(draw), dtype=draw(int_dtypes)),
        cu_num_logits_ptr=_tensor(cu, draw(int_dtypes), padding(draw)),
        BLOCK_SIZE=next_power_of_2(longest) * draw(st.sampled_from([1, 1, 2])),
    )
    return Case(contract.K28, args)


# -- state classes: what the cases must reach (conformance/coverage.py) --------------------------
def _rows(a: Args) -> list[tuple[int, int]]:
    """(batch row, request state) of every row the kernel works on."""
    return [(b, s) for b, s in enumerate(a["idx_mapping_ptr"].tolist()) if s >= 0]


def _seq(a: Args, b: int, s: int) -> tuple[int, int]:
    """(seq_len, prefill_len) of row b: from seq_lens where the kernel takes it."""
    prefill = a.get("prefill_len_ptr", a.get("prefill_lens_ptr"))
    return int(a["seq_lens_ptr"][b]), int(prefill[s])


def chunked(kernel: str, a: Args, out: Outputs) -> int:
    """Rows still prefilling: K22 copies their prompt tokens; K24 and K25 see seq_len < prefill_len."""
    if kernel == contract.K22:
        return sum(1 for _, s in _rows(a) if int(a["num_computed_tokens_ptr"][s]) < int(a["prefill_lens_ptr"][s]))
    return sum(1 for b, s in _rows(a) if _seq(a, b, s)[0] < _seq(a, b, s)[1])


def last_chunk(kernel: str, a: Args, out: Outputs) -> int:
    """Rows whose query ends exactly at prefill_len: they sample their first token."""
    return sum(1 for b, s in _rows(a) if _seq(a, b, s)[0] == _seq(a, b, s)[1])


def crosses(kernel: str, a: Args, out: Outputs) -> int:
    """K24 rows past prefill_len whose logits start inside the prompt: the last sampled token is
    not written there (it still holds a prompt token)."""
    cu = a["cu_num_logits_ptr"].tolist()
    return sum(1 for b, s in _rows(a) if _seq(a, b, s)[1] < _seq(a, b, s)[0] and _seq(a, b, s)[0] - (cu[b + 1] - cu[b]) < _seq(a, b, s)[1])


def zero_drafts(kernel: str, a: Args, out: Outputs) -> int:
    """Generating rows verifying no draft: one logits row, the bonus token's."""
    cu, new = a["cu_num_logits_ptr"].tolist(), a.get("NUM_NEW_SAMPLED_TOKENS", 1)
    return sum(1 for b, s in _rows(a) if cu[b + 1] - cu[b] == new and _seq(a, b, s)[0] > _seq(a, b, s)[1])


def _verified(a: Args) -> list[tuple[int, int, int]]:
    """(row, logits, sampled) of K25 rows that verified drafts."""
    cu = a["cu_num_logits_ptr"].tolist()
    return [(b, cu[b + 1] - cu[b], int(a["num_sampled_ptr"][b])) for b, s in _rows(a)
            if cu[b + 1] - cu[b] > 1 and _seq(a, b, s)[0] >= _seq(a, b, s)[1]]


def all_rejected(kernel: str, a: Args, out: Outputs) -> int:
    if kernel == contract.K26:
        return sum(1 for b, _ in _rows(a) if int(a["num_sampled_ptr"][b]) == 1 and int(a["num_rejected_ptr"][b]) > 0)
    return sum(1 for _, _, ns in _verified(a) if ns == 1)


def all_accepted(kernel: str, a: Args, out: Outputs) -> int:
    if kernel == contract.K26:
        return sum(1 for b, _ in _rows(a) if int(a["num_sampled_ptr"][b]) > 1 and int(a["num_rejected_ptr"][b]) == 0)
    return sum(1 for _, nl, ns in _verified(a) if ns == nl)


def padded_rows(kernel: str, a: Args, out: Outputs) -> int:
    """K23 seq_lens rows past the batch, zeroed for full CUDA graphs."""
    return max(0, a["max_num_reqs"] - a["idx_mapping_ptr"].numel())


def skipped_rows(kernel: str, a: Args, out: Outputs) -> int:
    return sum(1 for s in a["idx_mapping_ptr"].tolist() if s < 0)


def lookahead_past_prefill(kernel: str, a: Args, out: Outputs) -> int:
    """K22 lookahead cells past prefill_len, written as 0."""
    qsl, count = a["query_start_loc_ptr"].tolist(), 0
    for b, s in _rows(a):
        c, p = int(a["num_computed_tokens_ptr"][s]), int(a["prefill_lens_ptr"][s])
        if c < p:
            count += sum(1 for j in range(a["num_lookahead"]) if c + qsl[b + 1] - qsl[b] + j >= p)
    return count


def repeated_tokens(kernel: str, a: Args, out: Outputs) -> int:
    """K26 rows that emit one token twice: its output count grows by two."""
    if a["output_bin_counts_ptr"] is None:
        return 0
    flat, stride, count = flat_view(a["sampled_tokens_ptr"]), a["sampled_tokens_stride"], 0
    for b, _ in _rows(a):
        row = flat[b * stride : b * stride + int(a["num_sampled_ptr"][b])].tolist()
        count += len(row) != len(set(row))
    return count


CLASSES: tuple[StateClass, ...] = (
    StateClass("chunked prefill", (contract.K22, contract.K24, contract.K25), chunked,
               "a request still prefilling: its prompt tokens are copied, nothing is sampled (C37)"),
    StateClass("last prefill chunk", (contract.K24, contract.K25), last_chunk,
               "seq_len == prefill_len: no draft or sampled token written, one token sampled (C37)"),
    StateClass("query crosses the prompt's end", (contract.K24,), crosses,
               "logits rows that start inside the prompt: the last sampled token is not written (C37)"),
    StateClass("zero drafts", (contract.K24,), zero_drafts, "a generating request verifying no draft"),
    StateClass("every draft rejected", (contract.K25, contract.K26), all_rejected, "only the recovered token is emitted"),
    StateClass("every draft accepted", (contract.K25, contract.K26), all_accepted, "every draft and the bonus token are emitted"),
    StateClass("padded batch rows", (contract.K23,), padded_rows, "seq_lens rows past num_reqs zeroed for full CUDA graphs"),
    StateClass("skipped rows", (contract.K26,), skipped_rows, "a negative idx_mapping entry: the row changes nothing"),
    StateClass("lookahead past prefill_len", (contract.K22,), lookahead_past_prefill, "lookahead tokens past the prompt are 0"),
    StateClass("repeated emitted token", (contract.K26,), repeated_tokens, "a token emitted twice is counted twice"),
)
