"""Where specdiff's contract deliberately departs from vLLM 0.33.0, as data.

Each entry names a contract decision (§5 of the spec), the kernels it touches, the engine modes in
which the engine's own kernels behave differently, the one-line reason, and the test that tells
whether a disagreeing cell lies where the decision applies. An engine backend's disagreement that
matches an entry is reported as ``departs (C6)``: decided, not a defect. Departures apply to
engine backends only; one of specdiff's own backends that leaves the contract is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from contracts import penalties, sglang_verify
from contracts.spec import counts, starts


@dataclass(frozen=True)
class Departure:
    id: str
    kernels: tuple[str, ...] | None  # None: every kernel
    modes: tuple[str, ...] | None  # engine modes it applies to (a word of Backend.mode()); None: all
    reason: str
    matches: Callable[[Mapping[str, Any], str, int], bool]
    # For numeric departures: whether every cell where the engine's output differs from the
    # contract's is close enough (the two whole outputs, as written).
    close: Callable[[torch.Tensor, torch.Tensor], bool] | None = None

    def applies(self, kernel: str, mode: str) -> bool:
        return (self.kernels is None or kernel in self.kernels) and (self.modes is None or any(m in mode for m in self.modes))


def _near_ratio(a: Mapping[str, Any], t: int) -> bool:
    """K2's test at draft token ``t`` compares p/q with u where |p/q - u| <= 4 ulp(p/q) (§2.2
    conformance notes): approximate division may decide it otherwise."""
    d = int(a["draft_token_ids_ptr"][t])
    v = a["vocab_size"]
    if d < 0 or d >= v:
        return False
    p = a["target_probs_ptr"].reshape(-1)[t * v + d]
    q = torch.tensor(1.0) if a["draft_probs_ptr"] is None else a["draft_probs_ptr"].reshape(-1)[t * v + d]
    if not q > 0:
        return False
    ratio = float(p / q)  # float32, rounded to nearest
    u = float(a["uniform_probs_ptr"][t])
    ulp32 = math.ulp(ratio) * 2**29  # float32 keeps 29 fewer fraction bits than float64
    return math.isfinite(ratio) and abs(ratio - u) <= 4 * ulp32


def _ratio_tie(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K2's cell is decided by a ratio near its uniform."""
    s = a["max_spec_len"]
    r, j = divmod(index, s + 1)
    cu = a["cu_num_draft_tokens_ptr"]
    n, start = int(counts(cu)[r]), int(starts(cu)[r])
    return j < n and not a["SYNTHETIC_MODE"] and _near_ratio(a, start + j)


def _fly_ratio_tie(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K20's uniform cell ``index`` is decided by K2's test at it and in its window; one of those
    ratios lies near its uniform."""
    from contracts.fly import request_of

    _, start, n = request_of(a, index)
    return any(_near_ratio(a, t) for t in range(index, min(index + a["FLY_WINDOW_SIZE"], start + n - 1) + 1))


def _nan_in_row(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K4's token row holds a NaN probability (target, or draft when given)."""
    rows = [a["target_probs_ptr"][index]] + ([] if a["draft_probs_ptr"] is None else [a["draft_probs_ptr"][index]])
    return any(bool(torch.isnan(r).any()) for r in rows)


def _past_int32(a: Mapping[str, Any], output: str, index: int) -> bool:
    return any(isinstance(v, torch.Tensor) and v.numel() >= 2**31 for v in a.values())


def _near_acceptance_threshold(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K16's request (of ``index``) has a draft whose acceptance test compares a C29 quantity within
    1e-5 (relative, at least absolute) of its threshold: the strict log-ratio test ``log p(d)`` against
    ``log u + log q(d)``, or block verification's ``u <= h``. Greedy and synthetic decisions are exact."""
    from contracts import mrv2, numerics
    from reference import gumbel
    from reference import mrv2 as oracle

    r = index // max(a["sampled_stride"], 1) if output == "sampled_ptr" else index
    q = mrv2.requests(a)[r]
    if q.greedy or a["SYNTHETIC_MODE"]:
        return False
    nb, seed, tokens = a["vocab_num_blocks"], a["seed_ptr"][q.slot], a["draft_sampled_ptr"].to(torch.int64)
    t = torch.tensor(q.temp, dtype=torch.float32)
    for i in range(q.drafts):
        row, d = q.start + i, int(tokens[q.start + i + 1])
        if d < 0:
            continue
        block = a["USE_BLOCK_VERIFICATION"]
        u = gumbel.tl_rand32(gumbel.spec_step_seed(seed, i) if block else seed, a["pos_ptr"][row], includes_zero=False)
        if block:
            ratio = numerics.exp32(a["cumulative_log_p_ptr"][row])
            nxt = int(tokens[row + 2]) if i < q.drafts - 1 else -1
            if nxt >= 0:
                mass = oracle.residual_mass(dict(a), row + 1, nxt, ratio, nb)
                value, threshold = u, mass / (mass + 1.0 - ratio)
            else:
                value, threshold = u, ratio
        else:
            lp, lq, _, _ = oracle.log_probs(dict(a), row, q.slot, i, d, t, nb)
            value, threshold = lp, numerics.log32(u) + lq
        value, threshold = float(value), float(threshold)
        if math.isfinite(value) and math.isfinite(threshold) and abs(value - threshold) <= 1e-5 * max(1.0, abs(threshold)):
            return True
    return False


def _resample_tile(a: Mapping[str, Any], output: str, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The oracle's scores (and residual ratios q/p, or None) of the K17 tile holding cell ``index``."""
    from contracts import mrv2
    from reference import mrv2 as oracle

    r, b = divmod(index, max(a[output.removesuffix("_ptr") + "_stride"], 1))
    scores, ratio = oracle.resample_scores(dict(a), mrv2.resamples(a)[r])
    return scores[b], None if ratio is None else ratio[b]


def _near_resample_tie(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K17's tile (of ``index``) has a runner-up score within 1e-5 (relative, at least absolute) of its
    winner: float32 noise from another log, or another rounding of the residual, may pick it."""
    scores = _resample_tile(a, output, index)[0].double()
    top = scores.topk(2).values if scores.numel() > 1 else scores
    return bool(torch.isfinite(top).all()) and float(top[0] - top[-1]) <= 1e-5 * max(1.0, abs(float(top[0])))


def _near_sample_tie(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K38's tile (of ``index``) has a runner-up score within 1e-5 (relative, at least absolute) of its
    winner: noise from another log, or another rounding of the quotient, may pick it."""
    from reference import sample as oracle

    r, b = divmod(index, max(a[output.removesuffix("_ptr") + "_stride"], 1))
    if r >= a["logits_ptr"].shape[0] or output == "logits_cache_ptr":
        return False
    scores = oracle.gumbel_scores(dict(a), r)[b].double()
    top = scores.topk(2).values if scores.numel() > 1 else scores
    return bool(torch.isfinite(top).all()) and float(top[0] - top[-1]) <= 1e-5 * max(1.0, abs(float(top[0])))


def _ill_conditioned_residual(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K17's tile (of ``index``) has, among its two best scores, a residual ``log p + log(1 - r)`` at a
    ratio r = q/p >= 0.9: an error e in r moves it by e r / (1 - r), ten times or more."""
    scores, ratio = _resample_tile(a, output, index)
    if ratio is None:
        return False
    return bool((ratio[scores.topk(min(2, scores.numel())).indices] >= 0.9).any())


def _near_min_p_threshold(a: Mapping[str, Any], output: str, index: int) -> bool:
    """K37's cell holds a logit within 1e-6 (relative, absolute below 1) of its row's threshold: an
    approximate log of min-p may put it on the other side."""
    stride = a["logits_stride"] or 1
    r, c = divmod(index, stride)
    if r >= a["logits_ptr"].shape[0] or c >= a["vocab_size"]:
        return False
    row = a["logits_ptr"][r, : a["vocab_size"]]
    p = a["min_p_ptr"][int(a["expanded_idx_mapping_ptr"][r])]
    t = float(row.max()) + math.log(float(p)) if float(p) > 0 else math.nan
    x = float(row[c])
    return math.isfinite(t) and math.isfinite(x) and abs(x - t) <= 1e-6 * max(1.0, abs(t))


def _outputs(*names: str) -> Callable[[Mapping[str, Any], str, int], bool]:
    return lambda a, output, index: output in names


def _within(rtol: float, atol: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], bool]:
    """Every differing cell is a number within ``atol + rtol * |contract|`` of the contract's
    (-0.0 and +0.0 agree)."""

    def close(want: torch.Tensor, got: torch.Tensor) -> bool:
        w, g = want.double().reshape(-1), got.double().reshape(-1)
        differ = ~((w == g) | (w.isnan() & g.isnan()))
        w, g = w[differ], g[differ]
        return bool((torch.isfinite(w) & torch.isfinite(g) & ((w - g).abs() <= atol + rtol * w.abs())).all())

    return close


DEPARTURES: tuple[Departure, ...] = (
    Departure(
        "C29", ("_compute_local_logits_stats_kernel",), None,
        "sums of exponentials are exact sums of C29's specified exp32; vLLM's float32 exp and its tree or "
        "NumPy sums differ in the last bits (within 1e-5 relative)",
        _outputs("target_local_sumexp_ptr", "draft_local_sumexp_ptr"), _within(1e-5),
    ),
    Departure(
        "C29", ("_compute_cumulative_log_p_kernel",), None,
        "log-probabilities come from C29 log-sum-exps; vLLM's float32 exp, log and tree sums move them in the "
        "last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("cumulative_log_p_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C29", ("_compute_local_residual_mass_kernel",), None,
        "residual masses are exact sums of fused terms over C29 probabilities; vLLM's float32 exp, log and tree or "
        "NumPy sums move them in the last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("local_residual_mass_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C29", ("_rejection_kernel",), None,
        "the log-sum-exps K17 resamples with are C29 log-sum-exps; vLLM's float32 exp, log and tree sums move them "
        "in the last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("target_rejected_logsumexp_ptr", "draft_rejected_logsumexp_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C29", ("_rejection_kernel",), None,
        "acceptance tests compare C29 log-probabilities (or block verification's h) with the uniform's threshold; "
        "vLLM's float32 exp, log and sums may decide otherwise within 1e-5 of it",
        _near_acceptance_threshold,
    ),
    Departure(
        "C29", ("_resample_kernel",), None,
        "resample scores add noise from C29's specified logs to C29 residuals; vLLM's float32 exp, log "
        "and log1p move them in the last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("resampled_local_max_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C29", ("_resample_kernel",), None,
        "a tile whose two best scores lie within 1e-5 of each other may crown either under vLLM's float32 "
        "exp, log and log1p",
        _near_resample_tie,
    ),
    Departure(
        "C29", ("_resample_kernel",), None,
        "a residual log p + log(1 - q/p) with q/p >= 0.9 is ill-conditioned: vLLM's float32 exp (compiled: not "
        "correctly rounded) moves q/p by ulps, the score by r / (1 - r) as many, and may change the tile's winner",
        _ill_conditioned_residual,
    ),
    Departure(
        "C6", ("_compute_local_logits_stats_kernel",), ("compiled",),
        "draft logits are divided by the temperature rounded to nearest; compiled Triton divides approximately "
        "(<= 2 ulp), so a tile's draft maximum may differ in the last bits",
        _outputs("draft_local_max_ptr"), _within(5e-7),
    ),
    Departure(
        "C30", ("_compute_local_logits_stats_kernel",), None,
        "-0.0 logits read as +0.0, so a tile's maximum is unambiguous; vLLM may report -0.0",
        _outputs("target_local_max_ptr", "draft_local_max_ptr"), _within(0.0),
    ),
    Departure(
        "C6", ("rejection_random_sample_kernel",), ("compiled",),
        "the ratio p/q is rounded to nearest; compiled Triton divides approximately (<= 2 ulp), so decisions "
        "within 4 ulp of the uniform may differ",
        _ratio_tie,
    ),
    Departure(
        "C6", ("apply_fly_random_acceptance_kernel",), ("compiled",),
        "K2's ratio p/q is rounded to nearest at the position and in its window; compiled Triton divides "
        "approximately (<= 2 ulp), so a deferral may differ where one of those ratios lies within 4 ulp of its uniform",
        _fly_ratio_tie,
    ),
    Departure(
        "C15", ("sample_recovered_tokens_kernel",), ("compiled",),
        "NaN scores never win (the contract maps them below every number); compiled Triton's max and argmax "
        "over a tile holding a NaN are platform-defined, so a row with a NaN probability may pick another index",
        _nan_in_row,
    ),
    Departure(
        "C29", ("_gumbel_sample_kernel",), None,
        "tile scores add noise from C29's specified logs (and C41's IEEE quotient); vLLM's float32 log, its log1p "
        "polynomial and its division move them in the last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("local_max_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C29", ("_gumbel_sample_kernel",), None,
        "a tile whose two best scores lie within 1e-5 of each other may crown either under vLLM's float32 log and division",
        _near_sample_tie,
    ),
    Departure(
        "C30", ("_gumbel_sample_kernel",), None,
        "-0.0 logits read as +0.0, so a greedy tile's maximum is unambiguous; vLLM may report -0.0",
        _outputs("local_max_ptr"), _within(0.0),
    ),
    Departure(
        "C6", ("_temperature_kernel",), ("compiled",),
        "logits are divided by the temperature rounded to nearest (C41); compiled Triton's `/` is approximate "
        "(<= 2 ulp)",
        _outputs("logits_ptr"), _within(2.5e-7),
    ),
    Departure(
        "C29", ("_min_p_kernel",), ("compiled",),
        "the min-p threshold adds C29's log of min-p; compiled Triton's tl.log is approximate, so a logit within "
        "1e-6 of the threshold may fall on the other side",
        _near_min_p_threshold,
    ),
    Departure(
        "C6", ("_penalties_kernel",), ("compiled",),
        "a penalised positive logit is multiplied by RN(1 / penalty) (C42, vLLM's `1.0 / scale` interpreted); "
        "compiled Triton's `/` is approximate (<= 2 ulp): within 1e-6 relative, or 1e-5 absolute where the "
        "frequency and presence subtractions cancel",
        penalties.reciprocal_cell,
        _within(1e-6, 1e-5),
    ),
    Departure(
        "C42", ("_penalties_kernel",), ("compiled",),
        "freq * count (and the repetition product before it) is rounded before the subtraction; compiled Triton "
        "fuses them into an fma: within 1e-6 relative, or 1e-5 absolute where the subtraction cancels",
        penalties.fused_cell,
        _within(1e-6, 1e-5),
    ),
    Departure(
        "C29", ("_topk_log_softmax_kernel",), None,
        "scores are C29 log-softmaxes (exact tile sums of exp32, their tree_sum, one float64 log; C45); vLLM's "
        "float32 exp and log and its float32 sums move them in the last bits (within 1e-5 relative, 1e-6 absolute)",
        _outputs("output_ptr"), _within(1e-5, 1e-6),
    ),
    Departure(
        "C45", ("_ranks_kernel",), ("interpreted",),
        "Triton's interpreter compares bfloat16 blocks by their 16-bit patterns (a negative logit or -inf above every "
        "positive one), so vLLM's interpreted ranks over bfloat16 logits count those; compiled, it compares values",
        lambda a, output, index: a["logits_ptr"].dtype == torch.bfloat16,
    ),
    Departure(
        "C46d", ("speculative_sampling_classic_kernel",), None,
        "the final draw sums C29's fixed-point units exactly; SGLang's float32 tl.sum and tl.cumsum (NumPy's pairwise "
        "sum interpreted, a tree compiled) move a token's boundaries by about sqrt(V) ulps: a cut within 4 (sqrt(V) + n) "
        "ulps of the row's sum from a boundary of the contract's token (or from the sum) may pick its neighbour",
        sglang_verify.near_draw_boundary,
    ),
    Departure(
        "C46e", ("speculative_sampling_classic_kernel",), None,
        "block verification's residual mass is an exact fixed-point sum, its ratios correctly rounded and unfused; "
        "SGLang's float32 mass sum (compiled: its approximate division and fused products) may decide a coin within "
        "4 (sqrt(V) + n) ulps of h or of m / (m + 1 - h) otherwise, and with it the request's every output",
        sglang_verify.near_block_test,
    ),
    Departure(
        "C4", None, None,
        "flat offsets are exact 64-bit values; 0.33.0 computes some in 32 bits, which wraps past 2**31 elements",
        _past_int32,
    ),
)


def match(kernel: str, mode: str, args: Mapping[str, Any], output: str, index: int,
          want: torch.Tensor | None = None, got: torch.Tensor | None = None) -> Departure | None:
    """The departure that explains an engine backend's cell (and, for a numeric departure, every
    differing cell of its output ``got`` against the contract's ``want``), or None."""
    for d in DEPARTURES:
        if d.applies(kernel, mode):
            try:
                if d.matches(args, output, index) and (d.close is None or (want is not None and got is not None and d.close(want, got))):
                    return d
            except Exception:  # a test that cannot read the case explains nothing
                continue
    return None
