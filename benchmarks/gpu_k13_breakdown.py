"""Where K13's time goes on a GPU: the tile statistics of ``_compute_local_logits_stats_kernel``
taken apart (the read alone, the maximum pass, both passes with a trivial sum, both passes with C29's
``exp_units``, one pass, vLLM's float ``tl.exp`` sum), ``triton.testing.do_bench`` medians on 512
rows x 151,936 float32 logits in 8192-column tiles. A diagnostic, not a conformance check: the
variants other than ours compute other numbers.

    python benchmarks/gpu_k13_breakdown.py          (needs a CUDA GPU)

On an H200 (docs/benchmarks.md) the two passes cost no more than one read (the second hits L2), and
``exp_units`` adds a third: K13 is bound by its arithmetic. The int64-column and unmasked variants
measure the column forms K13 used before.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from triton_impl.gumbel import div_by_lanes, exp_units, reciprocal, units_to_float  # noqa: E402


@triton.jit
def two_pass(out_ptr, x_ptr, stride, n, temp, BLOCK: tl.constexpr, SLICE: tl.constexpr, TRIVIAL: tl.constexpr,
             WIDE: tl.constexpr, MASKED: tl.constexpr, DIVIDE: tl.constexpr):
    # K13's shape: a maximum pass, then an exact-sum pass over the same slices (the second read hits
    # L2). WIDE forms the columns in int64 (K13's earlier form: 64-bit masks on every element).
    # DIVIDE: 0 the target's sum, 1 the draft's (div_by_lanes and its range check, as K13), 2 a
    # multiply by the reciprocal alone (not the contract's division: its cost for comparison).
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    if WIDE:
        b = b.to(tl.int64)
    row = x_ptr + r * stride
    start = b * BLOCK
    acc = tl.full((SLICE,), float("-inf"), tl.float32)
    for c in range(0, BLOCK, SLICE):
        cols = start + c + tl.arange(0, SLICE)
        if MASKED:
            v = tl.load(row + cols, mask=cols < n, other=float("-inf"))
        else:
            v = tl.load(row + cols)
        acc = tl.maximum(acc, v)
    m = tl.max(acc, axis=0) + 0.0
    t_inv = reciprocal(temp)
    if DIVIDE > 0:
        m = tl.math.div_rn(m, temp)
    u = tl.zeros((SLICE,), tl.int64)
    odd_lanes = tl.zeros((SLICE,), tl.int32)
    for c in range(0, BLOCK, SLICE):
        cols = start + c + tl.arange(0, SLICE)
        if MASKED:
            v = tl.load(row + cols, mask=cols < n, other=float("-inf"))
        else:
            v = tl.load(row + cols)
        if DIVIDE == 1:
            v, odd = div_by_lanes(v, temp, t_inv)
            odd_lanes |= odd.to(tl.int32)
        elif DIVIDE == 2:
            v = v * t_inv
        if TRIVIAL:
            u += (v - m).to(tl.int32, bitcast=True).to(tl.int64)
        else:
            u += exp_units(v - m)
    tl.store(out_ptr + r * 64 + b, units_to_float(tl.sum(u, axis=0)) + m + tl.max(odd_lanes, axis=0))


@triton.jit
def one_pass(out_ptr, x_ptr, stride, n, BLOCK: tl.constexpr, FLOAT: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    cols = b * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + r * stride + cols, mask=cols < n, other=float("-inf"))
    m = tl.max(v, axis=0) + 0.0
    if FLOAT:
        s = tl.sum(tl.exp(v - m), axis=0)
    else:
        s = units_to_float(tl.sum(exp_units(v - m), axis=0))
    tl.store(out_ptr + r * 64 + b, s + m)


@triton.jit
def max_only(out_ptr, x_ptr, stride, n, BLOCK: tl.constexpr, SLICE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    acc = tl.full((SLICE,), float("-inf"), tl.float32)
    for c in tl.static_range(0, BLOCK, SLICE):
        cols = b * BLOCK + c + tl.arange(0, SLICE)
        acc = tl.maximum(acc, tl.load(x_ptr + r * stride + cols, mask=cols < n, other=float("-inf")))
    tl.store(out_ptr + r * 64 + b, tl.max(acc, axis=0))


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return 0
    V, R, B = 151936, 512, 8192
    x = torch.randn(R, V + 8192 - V % 8192, device="cuda")[:, :V] * 3  # full tiles past V, for the unmasked variant
    out = torch.empty(R, 64, device="cuda")
    S = x.stride(0)
    grid = (R, triton.cdiv(V, B))
    gb = x.numel() * 4 / 1e9
    two = dict(BLOCK=B, SLICE=2048, TRIVIAL=False, WIDE=False, MASKED=True, DIVIDE=0)
    runs = {
        "copy-read (x.sum)": lambda: x.sum(dim=1),
        "max only, slices 2048": lambda: max_only[grid](out, x, S, V, BLOCK=B, SLICE=2048),
        "two-pass trivial sum": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "TRIVIAL": True}),
        "two-pass exp_units (ours)": lambda: two_pass[grid](out, x, S, V, 0.7, **two),
        "two-pass exp_units, draft (div_by_lanes)": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "DIVIDE": 1}),
        "two-pass exp_units, draft (no masks)": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "DIVIDE": 1, "MASKED": False}),
        "two-pass exp_units, x * (1/t) only": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "DIVIDE": 2}),
        "two-pass exp_units, int64 columns": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "WIDE": True}),
        "two-pass exp_units, no masks": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "MASKED": False}),
        "two-pass exp_units, slice 1024": lambda: two_pass[grid](out, x, S, V, 0.7, **{**two, "SLICE": 1024}),
        "two-pass exp_units, 8 warps": lambda: two_pass[grid](out, x, S, V, 0.7, **two, num_warps=8),
        "one-pass exp_units 4 warps": lambda: one_pass[grid](out, x, S, V, BLOCK=B, FLOAT=False),
        "one-pass exp_units 8 warps": lambda: one_pass[grid](out, x, S, V, BLOCK=B, FLOAT=False, num_warps=8),
        "one-pass tl.exp float (vLLM-like)": lambda: one_pass[grid](out, x, S, V, BLOCK=B, FLOAT=True),
    }
    for name, f in runs.items():
        try:
            f()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(f, warmup=50, rep=300)
            print(f"{name:40s} {ms*1e3:8.1f} us  {gb/ms:6.2f} TB/s", flush=True)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
            print(f"{name:40s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
