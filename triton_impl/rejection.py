"""Triton kernels of the rejection sampler, with vLLM 0.33.0's names, parameters and grids.

Launched as ``kernel[grid](...)``: K1, K2 and K3 with grid ``(B,)``; K4 with
``(B, max_spec_len)``. Two deliberate departures from 0.33.0's bodies, both contract
requirements: every flat offset is widened to int64 before it is multiplied (C4), and the
K2 ratio uses IEEE round-to-nearest division, where compiled 0.33.0 divides approximately (C6).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _request_start(cu_ptr, req_idx):
    """start(r): the constant 0 for request 0, so cu[-1] is never read (C1)."""
    if req_idx == 0:
        start = tl.zeros((), dtype=cu_ptr.dtype.element_ty)
    else:
        start = tl.load(cu_ptr + req_idx - 1)
    return start


@triton.jit
def request_span(cu_ptr, req_idx):
    """(start(r), n(r)) of request r from inclusive cumulative counts, both int64."""
    start = _request_start(cu_ptr, req_idx).to(tl.int64)
    return start, tl.load(cu_ptr + req_idx).to(tl.int64) - start


@triton.jit(do_not_specialize=["max_spec_len"])
def rejection_greedy_sample_kernel(
    output_token_ids_ptr,  # [B, S+1] int32/int64, rows of stride max_spec_len + 1
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive cumulative draft counts
    draft_token_ids_ptr,  # [T] int32/int64, may hold -1
    target_argmax_ptr,  # [T] int64 (int32 accepted), argmax of the target logits
    bonus_token_ids_ptr,  # [B, 1] int32/int64, read flat
    is_greedy_ptr,  # [B] bool, or None when every row is greedy
    max_spec_len,  # S
    uniform_probs_ptr,  # [T] float64, read only in synthetic mode
    synthetic_conditional_rates_ptr,  # [K] float32 or None
    SYNTHETIC_MODE: tl.constexpr,  # rates is not None: accept u < rates[pos] instead of argmax equality
):
    req_idx = tl.program_id(0)
    if is_greedy_ptr is None:
        is_greedy = True
    else:
        is_greedy = tl.load(is_greedy_ptr + req_idx)
    if not is_greedy:
        return

    start_idx, num_draft_tokens = request_span(cu_num_draft_tokens_ptr, req_idx)
    row = req_idx.to(tl.int64) * (max_spec_len + 1)

    rejected = False
    for pos in range(num_draft_tokens):
        if not rejected:
            draft_token_id = tl.load(draft_token_ids_ptr + start_idx + pos)
            target_argmax_id = tl.load(target_argmax_ptr + start_idx + pos).to(tl.int32)
            if SYNTHETIC_MODE:
                u = tl.load(uniform_probs_ptr + start_idx + pos)
                rate = tl.load(synthetic_conditional_rates_ptr + pos)
                accepted = (u < rate) & (draft_token_id >= 0)  # float64 compare; strict (C8)
                token_id = tl.where(accepted, draft_token_id, target_argmax_id)
                tl.store(output_token_ids_ptr + row + pos, token_id)
                rejected = accepted == 0
            else:
                tl.store(output_token_ids_ptr + row + pos, target_argmax_id)
                rejected = draft_token_id != target_argmax_id

    if not rejected:
        bonus_token_id = tl.load(bonus_token_ids_ptr + req_idx)
        tl.store(output_token_ids_ptr + row + num_draft_tokens, bonus_token_id)


@triton.jit(do_not_specialize=["max_spec_len"])
def rejection_random_sample_kernel(
    output_token_ids_ptr,  # [B, S+1] int32/int64
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive
    draft_token_ids_ptr,  # [T] int32/int64
    draft_probs_ptr,  # [T, V] float32 q, or None
    target_probs_ptr,  # [T, V] float32 p
    bonus_token_ids_ptr,  # [B, 1] int32/int64, read flat
    recovered_token_ids_ptr,  # [T] int32/int64, emitted on rejection
    uniform_probs_ptr,  # [T] float64
    is_greedy_ptr,  # [B] bool: rows this kernel skips
    max_spec_len,  # S
    vocab_size,  # V, row stride of the probability tensors
    synthetic_conditional_rates_ptr,  # [K] float32 or None
    NO_DRAFT_PROBS: tl.constexpr,  # drafts are one-hot: q = 1
    SYNTHETIC_MODE: tl.constexpr,  # accept u < rates[pos]; probabilities are not read
):
    req_idx = tl.program_id(0)
    is_greedy = tl.load(is_greedy_ptr + req_idx)
    if is_greedy:
        return

    start_idx, num_draft_tokens = request_span(cu_num_draft_tokens_ptr, req_idx)
    row = req_idx.to(tl.int64) * (max_spec_len + 1)

    rejected = False
    for pos in range(num_draft_tokens):
        if not rejected:
            token_idx = start_idx + pos
            draft_token_id = tl.load(draft_token_ids_ptr + token_idx)
            uniform_prob = tl.load(uniform_probs_ptr + token_idx)
            # A negative draft (the -1 padding) is rejected before any probability or rate is read (C10).
            valid = draft_token_id >= 0
            if SYNTHETIC_MODE:
                rate = tl.load(synthetic_conditional_rates_ptr + pos, mask=valid, other=0.0)
                accepted = valid & (uniform_prob < rate)
            else:
                cell = token_idx * vocab_size + draft_token_id
                target_prob = tl.load(target_probs_ptr + cell, mask=valid, other=0.0)
                if NO_DRAFT_PROBS:
                    ratio = target_prob  # p / 1 is exact
                    accepted = valid & (ratio >= uniform_prob)
                else:
                    draft_prob = tl.load(draft_probs_ptr + cell, mask=valid, other=0.0)
                    ratio = tl.math.div_rn(target_prob, draft_prob)  # IEEE-rounded float32 (C6)
                    # q == 0 rejects whatever p and u are; NaN fails every comparison (C9).
                    accepted = valid & (draft_prob > 0) & (ratio >= uniform_prob)
            # Both branches int64: draft and recovered ids may differ in width (int32/int64, C5).
            if accepted:
                token_id = draft_token_id.to(tl.int64)
            else:
                rejected = True
                token_id = tl.load(recovered_token_ids_ptr + token_idx).to(tl.int64)
            tl.store(output_token_ids_ptr + row + pos, token_id)

    if not rejected:
        bonus_token_id = tl.load(bonus_token_ids_ptr + req_idx)
        tl.store(output_token_ids_ptr + row + num_draft_tokens, bonus_token_id)


@triton.jit(do_not_specialize=["replace_from", "replace_to"])
def expand_kernel(
    output_ptr,  # [T] float32/int32/int64, the input's dtype
    input_ptr,  # [B] float32/int32/int64, one value per request
    cu_num_tokens_ptr,  # [B] int32/int64, inclusive
    replace_from,  # int, compared in the data's dtype
    replace_to,  # int, converted to the data's dtype
    MAX_NUM_TOKENS: tl.constexpr,  # most tokens written per request (128 at the call site)
):
    req_idx = tl.program_id(0)
    # In cu's dtype, not widened (request_span): counts are >= 0 and non-decreasing, so end - start
    # fits it, and start_idx + offset is formed on the pointer, in 64 bits (C4).
    start_idx = _request_start(cu_num_tokens_ptr, req_idx)
    num_tokens = tl.load(cu_num_tokens_ptr + req_idx) - start_idx

    src_val = tl.load(input_ptr + req_idx)
    src_val = tl.where(src_val == replace_from, replace_to, src_val).to(src_val.dtype)
    offset = tl.arange(0, MAX_NUM_TOKENS)
    tl.store(output_ptr + start_idx + offset, src_val, mask=offset < num_tokens)


# How sample_recovered_tokens_kernel scans a row, chosen at compile time from the launch's arguments
# (KernelSpec.tuning: constexprs after the engine's parameters that no launch passes). No result
# depends on it (C15: ties go to the earliest column whatever the step). Read off an H100 (132 SMs;
# benchmarks/gpu_k4_scan.py; docs/gpu.md): with a few rows, each SM holds one
# program or none, and only loads kept in flight across loop steps (software pipelining, deep and
# with more warps) fill its memory pipe; with a few rows per SM the programs themselves fill it and
# the stages' shared memory costs occupancy instead; at thousands of rows every form is DRAM-bound
# within 3 %. Rows: (most draft rows, SCAN_BLOCK, SCAN_STAGES, num_warps), the first that fits.
SCAN_TABLE = ((32, 4096, 3, 8), (256, 2048, 3, 4), (512, 2048, 2, 4), (1024, 2048, 1, 4), (None, 4096, 3, 8))


def _scan(args: dict) -> tuple:
    rows = args["output_token_ids_ptr"].numel()
    return next(e for e in SCAN_TABLE if e[0] is None or rows <= e[0])


@triton.heuristics({
    "SCAN_BLOCK": lambda a: min(a["BLOCK_SIZE"], _scan(a)[1]),
    "SCAN_STAGES": lambda a: _scan(a)[2],
    "num_warps": lambda a: _scan(a)[3],  # a launch option, not a parameter
})
@triton.jit
def sample_recovered_tokens_kernel(
    output_token_ids_ptr,  # [T] int32/int64
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive
    draft_token_ids_ptr,  # [T] int32/int64, read only when NO_DRAFT_PROBS
    draft_probs_ptr,  # [T, V] float32 q, or None
    target_probs_ptr,  # [T, V] float32 p
    inv_q_ptr,  # [B, V] float32, or float64 with USE_FP64_GUMBEL: 1/Exp(1) noise per request
    vocab_size,  # V
    BLOCK_SIZE: tl.constexpr,  # vocabulary tile; results never depend on it
    NO_DRAFT_PROBS: tl.constexpr,  # residual = p with the draft's lane zeroed
    USE_FP64_GUMBEL: tl.constexpr,  # widen the residual and multiply in float64
    SCAN_BLOCK: tl.constexpr,  # columns per loop step (SCAN_TABLE)
    SCAN_STAGES: tl.constexpr,  # loop steps in flight (SCAN_TABLE)
):
    req_idx = tl.program_id(0)
    pos = tl.program_id(1)
    start_idx, num_draft_tokens = request_span(cu_num_draft_tokens_ptr, req_idx)
    if pos >= num_draft_tokens:
        return
    token_idx = start_idx + pos
    _, best_idx = _best_residual(
        draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr, inv_q_ptr, req_idx, token_idx, vocab_size,
        0, vocab_size, SCAN_BLOCK, SCAN_STAGES, NO_DRAFT_PROBS, USE_FP64_GUMBEL,
    )
    tl.store(output_token_ids_ptr + token_idx, best_idx)


@triton.jit
def _best_residual(
    draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr, inv_q_ptr, req_idx, token_idx, vocab_size,
    lo, hi,  # the vocabulary range [lo, hi) to scan
    BLOCK_SIZE: tl.constexpr, STAGES: tl.constexpr, NO_DRAFT_PROBS: tl.constexpr, USE_FP64_GUMBEL: tl.constexpr,
):
    """Largest residual score of one draft row in [lo, hi), and the lowest index reaching it
    (0 when no score beats -inf)."""
    probs_row = token_idx * vocab_size
    noise_row = req_idx.to(tl.int64) * vocab_size
    if NO_DRAFT_PROBS:
        draft_token_id = tl.load(draft_token_ids_ptr + token_idx)
    if USE_FP64_GUMBEL:
        best = tl.full((), float("-inf"), tl.float64)
    else:
        best = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.zeros((), dtype=tl.int32)
    for off in tl.range(lo, hi, BLOCK_SIZE, num_stages=STAGES):
        cols = off + tl.arange(0, BLOCK_SIZE)
        in_range = cols < hi
        if NO_DRAFT_PROBS:
            # Exactly the draft's lane is zeroed; an out-of-vocabulary id zeroes nothing (C16).
            residual = tl.load(target_probs_ptr + probs_row + cols, mask=in_range & (cols != draft_token_id), other=0.0)
        else:
            p = tl.load(target_probs_ptr + probs_row + cols, mask=in_range, other=0.0)
            q = tl.load(draft_probs_ptr + probs_row + cols, mask=in_range, other=0.0)
            diff = p - q
            residual = tl.where(diff > 0, diff, 0.0)  # max(p - q, 0) with NaN giving 0 on every platform
        inv_q = tl.load(inv_q_ptr + noise_row + cols, mask=in_range, other=0.0)
        if USE_FP64_GUMBEL:
            score = residual.to(tl.float64) * inv_q
        else:
            score = residual * inv_q
        # NaN scores and lanes past the range never win; mapping them to -inf also keeps the
        # interpreter's all-NaN tile max from raising.
        score = tl.where(in_range & (score == score), score, float("-inf"))
        tile_max, tile_idx = tl.max(score, axis=0, return_indices=True)
        if tile_max > best:  # strictly larger: ties go to the earlier tile (C15)
            best = tile_max
            best_idx = off + tile_idx
    return best, best_idx


# -- a faster layout for sample_recovered_tokens ----------------------------------------------------
# The engine gives each draft row one program, which leaves a GPU nearly idle when there are few
# rows (1 request x 8 drafts: 8 programs scanning 152k entries each). This layout also splits the
# vocabulary across programs and reduces the per-split maxima in a second kernel. Ties still go to
# the lowest index (earlier split, then lowest lane) and NaN never wins, so results are identical.


@triton.jit
def _recovered_split_kernel(
    output_token_ids_ptr,  # [T] int32/int64
    partial_max_ptr,  # [T', SPLITS] float32/float64: each split's largest score (-inf if none)
    partial_idx_ptr,  # [T', SPLITS] int32: the lowest vocabulary index reaching it
    arrivals_ptr,  # [T'] int32, zero between launches: splits of each token done so far
    cu_num_draft_tokens_ptr,  # [B] int32/int64, inclusive
    num_requests,  # B
    draft_token_ids_ptr,  # [T] int32/int64, read only when NO_DRAFT_PROBS
    draft_probs_ptr,  # [T, V] float32 q, or None
    target_probs_ptr,  # [T, V] float32 p
    inv_q_ptr,  # [B, V] float32/float64
    vocab_size,  # V
    split_size,  # vocabulary entries per split, a multiple of BLOCK_SIZE
    num_splits,  # row stride of the partial buffers
    BLOCK_SIZE: tl.constexpr,
    SPLITS_POW2: tl.constexpr,  # num_splits rounded up to a power of two
    SEARCH_STEPS: tl.constexpr,  # binary-search steps over cu: ceil(log2(B + 1))
    NO_DRAFT_PROBS: tl.constexpr,
    USE_FP64_GUMBEL: tl.constexpr,
):
    token_idx = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    # T' (the grid) is an upper bound known without a device sync; tokens past T do nothing.
    if token_idx >= tl.load(cu_num_draft_tokens_ptr + num_requests - 1):
        return
    # The request of this token: the first r with cu[r] > token.
    lo = tl.zeros((), dtype=tl.int64)
    hi = tl.zeros((), dtype=tl.int64) + num_requests
    for _step in range(SEARCH_STEPS):
        if lo < hi:
            mid = (lo + hi) // 2
            if tl.load(cu_num_draft_tokens_ptr + mid) > token_idx:
                hi = mid
            else:
                lo = mid + 1
    start = split * split_size
    best, best_idx = _best_residual(
        draft_token_ids_ptr, draft_probs_ptr, target_probs_ptr, inv_q_ptr, lo, token_idx, vocab_size,
        start, tl.minimum(start + split_size, vocab_size), BLOCK_SIZE, None, NO_DRAFT_PROBS, USE_FP64_GUMBEL,
    )
    row = token_idx * num_splits
    tl.store(partial_max_ptr + row + split, best)
    tl.store(partial_idx_ptr + row + split, best_idx)
    # The last split of a token to finish reduces its row (acq_rel: it sees every split's stores)
    # and leaves the counter at zero for the next launch.
    tl.debug_barrier()  # every thread of this program has stored before the counter moves
    if tl.atomic_add(arrivals_ptr + token_idx, 1, sem="acq_rel") == num_splits - 1:
        k = tl.arange(0, SPLITS_POW2)
        m = tl.load(partial_max_ptr + row + k, mask=k < num_splits, other=float("-inf"), volatile=True)
        _top, first = tl.max(m, axis=0, return_indices=True)  # the earliest split wins ties; all -inf: split 0
        tl.store(output_token_ids_ptr + token_idx, tl.load(partial_idx_ptr + row + first, volatile=True))
        tl.store(arrivals_ptr + token_idx, 0)


class SampleRecoveredSplit:
    """``sample_recovered_tokens_kernel``'s launch form over the split-vocabulary layout.

    Accepts the engine kernel's arguments (``kernel[grid](...)``; the grid is ignored) so the
    conformance harness checks it like any backend, and ``sample_recovered_tokens`` can use it.
    One launch and no host synchronisation: the token count is bounded by
    ``len(draft_token_ids)``, each token finds its request on the device, and the last split of
    a token to finish reduces it. Scratch buffers are kept per device, stream and shape. The
    tile is this layout's own (results never depend on it, C15); ``BLOCK_SIZE`` is accepted for
    the engine's signature.
    """

    arg_names = [
        "output_token_ids_ptr", "cu_num_draft_tokens_ptr", "draft_token_ids_ptr", "draft_probs_ptr",
        "target_probs_ptr", "inv_q_ptr", "vocab_size", "BLOCK_SIZE", "NO_DRAFT_PROBS", "USE_FP64_GUMBEL",
    ]

    def __init__(self, tile: int = 4096, target_programs: int = 2048, num_warps: int = 8) -> None:
        self.tile = tile  # vocabulary entries per loop step of one program
        self.target_programs = target_programs  # enough to fill a large GPU several times over
        self.num_warps = num_warps
        self._scratch: dict[tuple, tuple] = {}

    def __getitem__(self, grid: object) -> SampleRecoveredSplit:
        return self

    def _buffers(self, device: object, dtype: object, tokens: int, splits: int) -> tuple:
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream if getattr(device, "type", "cpu") == "cuda" else 0
        key = (str(device), stream, dtype, tokens, splits)
        if key not in self._scratch:
            self._scratch[key] = (
                torch.empty(tokens, splits, dtype=dtype, device=device),
                torch.empty(tokens, splits, dtype=torch.int32, device=device),
                torch.zeros(tokens, dtype=torch.int32, device=device),
            )
        return self._scratch[key]

    def __call__(self, *args: object, **kwargs: object) -> None:
        a = dict(zip(self.arg_names, args), **kwargs)
        cu, v = a["cu_num_draft_tokens_ptr"], int(a["vocab_size"])
        b, t_max = cu.numel(), a["draft_token_ids_ptr"].numel()
        if b == 0 or t_max == 0:
            return
        tiles = triton.cdiv(v, self.tile)
        splits = max(1, min(tiles, triton.cdiv(self.target_programs, t_max)))
        split_size = triton.cdiv(tiles, splits) * self.tile
        splits = triton.cdiv(v, split_size)
        partial_max, partial_idx, arrivals = self._buffers(a["target_probs_ptr"].device, a["inv_q_ptr"].dtype, t_max, splits)
        _recovered_split_kernel[(t_max, splits)](
            a["output_token_ids_ptr"], partial_max, partial_idx, arrivals, cu, b, a["draft_token_ids_ptr"],
            a["draft_probs_ptr"], a["target_probs_ptr"], a["inv_q_ptr"], v, split_size, splits,
            BLOCK_SIZE=self.tile, SPLITS_POW2=triton.next_power_of_2(splits), SEARCH_STEPS=b.bit_length(),
            NO_DRAFT_PROBS=a["NO_DRAFT_PROBS"], USE_FP64_GUMBEL=a["USE_FP64_GUMBEL"], num_warps=self.num_warps,
        )


sample_recovered_tokens_split = SampleRecoveredSplit()
