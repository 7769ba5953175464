"""Contract of Model Runner V2's bad words (docs/bad_words.md, C43; vLLM's
``vllm/v1/worker/gpu/sample/bad_words.py``).

``BadWordsState.apply`` runs K41 ``_bad_words_kernel`` (``bad_words.py:102``) on the sampler's
float32 copy of the logits, in place, before the temperature (``Sampler.apply_sampling_params``). A
row is a token: a request's verification rows share its state through ``expanded_idx_mapping`` and
are told apart by their local position (``expanded_local_pos``: 0 for the row after the last
committed token, ``k`` for the row after the request's ``k``-th draft). The grid is one program per
row and bad word, ``(num_tokens, max_num_bad_words)``, the batch's largest count.

Each request's bad words are flattened into a row of ``bad_word_token_ids`` with cumulative
``bad_word_offsets`` (bad word ``j`` is ``[offsets[j], offsets[j + 1])``). A row sees its request's
committed output, ``all_token_ids[state, prompt_len:total_len]``, followed by the drafts before it,
``input_ids[row - pos + 1 : row + 1]`` (the sampler's input ids, the rejection sampler's
``draft_sampled``). A bad word whose prefix (every token but its last) ends that sequence bans its
last token: the row's logit there becomes -inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from contracts._checks import require_rows
from contracts.spec import INT, KernelSpec, Role, at_least, in_int32, ptr, require, scalar

F32, I32 = torch.float32, torch.int32
K41 = "_bad_words_kernel"
_MODULE = "vllm.v1.worker.gpu.sample.bad_words"


def rows(a: Mapping[str, Any]) -> int:
    """The rows a launch processes: the logits' rows (the call site's grid, ``logits.shape[0]``)."""
    return a["logits_ptr"].shape[0]


def vocab(a: Mapping[str, Any]) -> int:
    """V, the logits' columns: the kernel takes no vocabulary size, a banned token is a column."""
    return a["logits_ptr"].shape[1]


def _ints(t: torch.Tensor, n: int) -> list[int]:
    return t.reshape(-1)[:n].tolist()


def counts(a: Mapping[str, Any]) -> list[int]:
    """Each row's number of bad words (its request state's)."""
    n = rows(a)
    table = _ints(a["num_bad_words_ptr"], a["num_bad_words_ptr"].numel())
    return [table[s] for s in _ints(a["expanded_idx_mapping_ptr"], n)]


def grid(a: Mapping[str, Any]) -> tuple[int, int]:
    """``(num_tokens, max_num_bad_words)``: the call site's largest count over the batch's requests."""
    return (rows(a), max(counts(a), default=0))


def _table(k: str, a: Mapping[str, Any], name: str, stride_name: str) -> None:
    """A per-request table addressed as ``state * stride + column``: the call site passes its
    stride(0), so entry ``[s, j]`` is the tensor's (bounds then follow its shape)."""
    t = a[name]
    if t.shape[0] > 1:
        require(a[stride_name] == t.stride(0), k, stride_name, f"must be {name}'s row stride {t.stride(0)}, got {a[stride_name]}")


def _states_of(k: str, a: Mapping[str, Any], state: int, r: int, *names: str) -> None:
    for name in names:
        size = a[name].shape[0]
        require(state < size, k, "expanded_idx_mapping_ptr",
                f"entry {r} = {state} must index '{name}' of {size} request states (its row has bad words)")


def words(a: Mapping[str, Any], state: int) -> list[list[int]]:
    """Request state ``state``'s bad words, each a list of token ids (its last is the one banned)."""
    nb = int(a["num_bad_words_ptr"].reshape(-1)[state])
    offsets = a["bad_word_offsets_ptr"][state, : nb + 1].tolist()
    tokens = a["bad_word_token_ids_ptr"][state]
    return [tokens[offsets[j] : offsets[j + 1]].tolist() for j in range(nb)]


def seen(a: Mapping[str, Any], r: int) -> list[int]:
    """What row ``r`` sees: its request's committed output, then the drafts before the row."""
    s = int(a["expanded_idx_mapping_ptr"].reshape(-1)[r])
    prompt, total = int(a["prompt_len_ptr"].reshape(-1)[s]), int(a["total_len_ptr"].reshape(-1)[s])
    pos = int(a["expanded_local_pos_ptr"].reshape(-1)[r])
    return a["all_token_ids_ptr"][s, prompt:total].tolist() + a["input_ids_ptr"].reshape(-1)[r - pos + 1 : r + 1].tolist()


def bans(word: list[int], sequence: list[int]) -> bool:
    """C43: a bad word bans its last token where its prefix ends the sequence (an empty prefix
    always; a prefix longer than the sequence never)."""
    prefix = word[:-1]
    return len(prefix) <= len(sequence) and sequence[len(sequence) - len(prefix) :] == prefix


def _preconditions(a: Mapping[str, Any]) -> None:
    k, n, v = K41, rows(a), vocab(a)
    logits, stride = a["logits_ptr"], a["logits_stride"]
    if n > 1:
        require(stride == logits.stride(0), k, "logits_stride", f"must be logits_ptr's row stride {logits.stride(0)}, got {stride}")
        at_least(k, "logits_stride", stride, v)
    require_rows(k, "logits_ptr", logits, n, stride, v)
    for name in ("expanded_idx_mapping_ptr", "expanded_local_pos_ptr", "input_ids_ptr"):
        require(a[name].numel() >= n, k, name, f"must hold an entry per row ({n}), has {a[name].numel()}")
    for name, stride_name in (("bad_word_token_ids_ptr", "bad_word_token_ids_stride"), ("bad_word_offsets_ptr", "bad_word_offsets_stride"),
                              ("all_token_ids_ptr", "all_token_ids_stride")):
        _table(k, a, name, stride_name)
    mapping = _ints(a["expanded_idx_mapping_ptr"], n)
    local = _ints(a["expanded_local_pos_ptr"], n)
    states = a["num_bad_words_ptr"].numel()
    offsets_width, tokens_width = a["bad_word_offsets_ptr"].shape[1], a["bad_word_token_ids_ptr"].shape[1]
    history = a["all_token_ids_ptr"].shape[1]
    checked: set[int] = set()
    for r in range(n):
        s, pos = mapping[r], local[r]
        require(0 <= s < states, k, "expanded_idx_mapping_ptr",
                f"entry {r} = {s} must index 'num_bad_words_ptr' of {states} request states")
        # A row's local position counts the rows of its request before it: its drafts are rows of this launch.
        require(0 <= pos <= r, k, "expanded_local_pos_ptr", f"entry {r} = {pos} must be in [0, {r}] (the request's rows before it)")
        nb = int(a["num_bad_words_ptr"].reshape(-1)[s])
        require(0 <= nb < offsets_width, k, "num_bad_words_ptr",
                f"entry {s} = {nb} must be in [0, {offsets_width - 1}] (bad_word_offsets_ptr holds {offsets_width} offsets a request)")
        if nb == 0:
            continue
        _states_of(k, a, s, r, "bad_word_offsets_ptr", "bad_word_token_ids_ptr", "all_token_ids_ptr")
        for name in ("prompt_len_ptr", "total_len_ptr"):
            require(s < a[name].numel(), k, "expanded_idx_mapping_ptr",
                    f"entry {r} = {s} must index '{name}' of {a[name].numel()} request states (its row has bad words)")
        prompt, total = int(a["prompt_len_ptr"].reshape(-1)[s]), int(a["total_len_ptr"].reshape(-1)[s])
        require(0 <= prompt <= total, k, "total_len_ptr", f"entry {s} = {total} must be >= prompt_len {prompt} >= 0 (state {s})")
        require(total <= history, k, "total_len_ptr", f"entry {s} = {total} must be <= all_token_ids_ptr's {history} columns (state {s})")
        in_int32(k, "expanded_local_pos_ptr", total - prompt + pos, f"row {r}'s output length + local position")
        if s in checked:
            continue
        checked.add(s)
        offsets = a["bad_word_offsets_ptr"][s, : nb + 1].tolist()
        require(offsets[0] >= 0, k, "bad_word_offsets_ptr", f"state {s}'s first offset {offsets[0]} must be >= 0")
        for j in range(nb):  # each bad word has a token to ban: an empty one would read its predecessor's
            require(offsets[j + 1] > offsets[j], k, "bad_word_offsets_ptr",
                    f"state {s}'s offsets must increase (a bad word holds a token): bad word {j} is [{offsets[j]}, {offsets[j + 1]})")
        require(offsets[nb] <= tokens_width, k, "bad_word_offsets_ptr",
                f"state {s}'s last offset {offsets[nb]} must be <= bad_word_token_ids_ptr's {tokens_width} columns")
        last = a["bad_word_token_ids_ptr"][s, torch.tensor(offsets[1:]) - 1].tolist()
        for j, t in enumerate(last):
            require(0 <= t < v, k, "bad_word_token_ids_ptr", f"state {s}'s bad word {j} bans token {t}, outside the {v} logits columns")


def _row_of(a: Mapping[str, Any], index: int) -> tuple[int, int]:
    return divmod(index, a["logits_stride"]) if a["logits_stride"] else (0, index)


def banners(a: Mapping[str, Any], r: int, c: int) -> list[int]:
    """The bad words (indices) that ban column ``c`` of row ``r``."""
    s = int(a["expanded_idx_mapping_ptr"].reshape(-1)[r])
    if int(a["num_bad_words_ptr"].reshape(-1)[s]) == 0:
        return []
    sequence = seen(a, r)
    return [j for j, w in enumerate(words(a, s)) if w[-1] == c and bans(w, sequence)]


def _explain(a: Mapping[str, Any], output: str, index: int) -> str:
    r, c = _row_of(a, index)
    if r >= rows(a) or c >= vocab(a):
        return f"flat index {index} lies outside the rows' {vocab(a)} columns: it must stay untouched"
    s = int(a["expanded_idx_mapping_ptr"].reshape(-1)[r])
    pos = int(a["expanded_local_pos_ptr"].reshape(-1)[r])
    by = banners(a, r, c)
    what = f"banned by bad word(s) {by}" if by else "no bad word bans it"
    return f"row {r} (state {s}, local position {pos}, sees {seen(a, r)[-8:]} at its end), column {c}: {what}"


def _rule(a: Mapping[str, Any], output: str, index: int, kind: str) -> str:
    r, c = _row_of(a, index)
    if r >= rows(a) or c >= vocab(a):
        return "C43 untouched columns"
    return "C43 bad word" if banners(a, r, c) else "C43 untouched columns"


def _bytes(a: Mapping[str, Any]) -> int:
    n, (_, nb) = rows(a), grid(a)
    return n * (3 * a["expanded_idx_mapping_ptr"].element_size() + 4) + n * nb * (2 * 4 + 4)


def _int_table(name: str, doc: str) -> Any:
    return ptr(name, INT, I32, doc, ndim=(2,), contiguous=False)


BAD_WORDS = KernelSpec(
    name=K41,
    family="bad_words",
    qualname=f"{_MODULE}.{K41}",
    params=(
        ptr("logits_ptr", (F32,), F32, "[T, V] float32 logits (the sampler's copy), rows logits_stride apart; in place",
            role=Role.INOUT, ndim=(2,), contiguous=False),
        scalar("logits_stride", "row stride of logits (logits.stride(0))"),
        ptr("expanded_idx_mapping_ptr", INT, I32, "[>= T] each row's request state"),
        _int_table("bad_word_token_ids_ptr", "[max_num_reqs, VLLM_MAX_BAD_WORDS_TOTAL_TOKENS] each request's bad words, flattened"),
        scalar("bad_word_token_ids_stride", "its row stride"),
        _int_table("bad_word_offsets_ptr", "[max_num_reqs, VLLM_MAX_NUM_BAD_WORDS + 1] cumulative offsets: bad word j is "
                   "[offsets[j], offsets[j + 1])"),
        scalar("bad_word_offsets_stride", "its row stride"),
        ptr("num_bad_words_ptr", INT, I32, "[max_num_reqs] each request's number of bad words"),
        _int_table("all_token_ids_ptr", "[max_num_reqs, max_model_len] each request's committed tokens (prompt, then output)"),
        scalar("all_token_ids_stride", "its row stride"),
        ptr("prompt_len_ptr", INT, I32, "[max_num_reqs] each request's prompt length"),
        ptr("total_len_ptr", INT, I32, "[max_num_reqs] each request's committed length (prompt + output)"),
        ptr("input_ids_ptr", INT, I32, "[>= T] each row's input token: the last committed one at local position 0, then the drafts"),
        ptr("expanded_local_pos_ptr", INT, I32, "[>= T] each row's position among its request's rows"),
    ),
    grid=grid,
    preconditions=_preconditions,
    explain=_explain,
    rule=_rule,
    bytes_moved=_bytes,
)

SPECS = (BAD_WORDS,)
