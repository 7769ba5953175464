"""MRV2's random streams and numerics as primitives of their own: the oracle, the C++ port and
Triton (``tl.rand`` itself; our murmur3) agree bit for bit, and the oracle agrees with published
answers (Random123's Philox4x32-10 known-answer vector, MurmurHash3_x86_32 of a plain byte
string). Interpreted here; ``docs/gpu.md`` runs the same file compiled on the lent GPU."""

from __future__ import annotations

import struct

import pytest
import torch
import triton
from hypothesis import given
from hypothesis import strategies as st

import triton_impl
from contracts import numerics
from cpu_impl import _C
from cpu_impl.launcher import buf
from reference import gumbel as ref
from triton_impl import gumbel as tri

I32, I64, F32, F64 = torch.int32, torch.int64, torch.float32, torch.float64
EDGE_SEEDS = [0, 1, -1, 2**32, 2**32 + 5, 2**63 - 1, -(2**63), 1234, -5678, 0x9E3779B97F4A7C15 - 2**64]
BLOCK = 256
# Elementwise probes: the interpreter pays per program, not per element, so it takes wide blocks.
PROBE = BLOCK if triton_impl.mode() == "compiled" else 1 << 14


def device() -> str:
    return triton_impl.device()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({F32: I32, F64: I64}.get(t.dtype, t.dtype))


def assert_bits_equal(name: str, want: torch.Tensor, got: torch.Tensor) -> None:
    bad = (bits(want.cpu()) != bits(got.cpu())).nonzero().flatten()
    assert bad.numel() == 0, f"{name}: {bad.numel()} of {want.numel()} differ, first at {int(bad[0])}: {want[bad[0]]} vs {got[bad[0]]}"


def draws(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeds over the whole int64 range (edge seeds first), positions, vocabulary keys."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g, dtype=I64)
    seeds[: len(EDGE_SEEDS)] = torch.tensor(EDGE_SEEDS, dtype=I64)
    pos = torch.randint(0, 2**31, (n,), generator=g, dtype=I64)
    pos[:4] = torch.tensor([0, 2**30, 2**31 - 1, 1])
    keys = torch.randint(0, 2**20, (n,), generator=g, dtype=I64)
    return seeds, pos, keys


# -- Philox: tl.rand, the clamp, the block-verification seed mixing ------------------------------------
def test_philox_matches_random123s_known_answer():
    # Philox4x32-10, counter (0, 0, 0, 0), key (0, 0): word 0 is 0x6627e8d5 (Random123 kat_vectors).
    assert int(ref.philox_word0(torch.tensor([0]), torch.tensor([0]))[0]) == 0x6627E8D5


def test_tl_rand_known_values():
    # tl.rand(7, 0..3), as compiled Triton 3.6 on an H100 gave it (docs/mrv2.md).
    u = ref.tl_rand(torch.full((4,), 7), torch.arange(4))
    for got, prefix in zip(u.tolist(), [0.0908057, 0.8139207, 0.0121502, 0.7803980]):
        assert prefix <= got < prefix + 1e-7  # the recorded values are truncated to 7 digits


def philox_all(seeds: torch.Tensor, offsets: torch.Tensor, step: int, includes_zero: bool) -> dict[str, torch.Tensor]:
    n = seeds.numel()
    mixed = ref.spec_step_seed(seeds, step) if step >= 0 else seeds
    out = {"reference": ref.tl_rand32(mixed, offsets, includes_zero)}
    c = torch.empty(n, dtype=F32)
    _C.gumbel.philox(buf(c), buf(seeds), buf(offsets), step, includes_zero)
    out["cpu"] = c
    t = torch.empty(n, dtype=F32, device=device())
    tri.philox_probe_kernel[(-(-n // PROBE),)](t, seeds.to(device()), offsets.to(device()), n, STEP=step,
                                               INCLUDES_ZERO=includes_zero, BLOCK=PROBE)
    out["triton"] = t.cpu()
    return out


@pytest.mark.parametrize("offset_dtype", [I64, I32])
@pytest.mark.parametrize("step", [-1, 0, 3], ids=["plain", "step-0", "step-3"])
@pytest.mark.parametrize("includes_zero", [False, True])
def test_philox_three_ways(offset_dtype, step, includes_zero):
    seeds, pos, _ = draws(4096, 1)
    offsets = pos.to(offset_dtype) if offset_dtype == I32 else pos * 1031 - 2**40  # negative and >= 2^32 too
    out = philox_all(seeds, offsets, step, includes_zero)
    for b in ("cpu", "triton"):
        assert_bits_equal(f"tl_rand32 {b}", out["reference"], out[b])


def test_the_clamp_lifts_only_zero():
    # tl.rand is 0 for words 0 and 0xFFFFFFFF (once in 2^31 draws): the clamp lifts exactly that
    # to the smallest nonzero tl.rand, and leaves every other draw alone.
    lowest = torch.tensor(ref.TL_RAND_MIN, dtype=F32)
    assert bits(torch.tensor([ref.TL_RAND_MIN], dtype=F32)).item() == 0x2FFFFFFF
    seeds, pos, _ = draws(4096, 7)
    raw, clamped = ref.tl_rand(seeds, pos), ref.tl_rand32(seeds, pos, includes_zero=False)
    assert bool((raw >= lowest).all()) and torch.equal(raw, clamped)  # no zero among these
    zero = torch.zeros(1, dtype=F32)
    assert float(torch.clamp_min(zero, lowest)) == float(lowest)
    assert bits(torch.tensor([ref.TL_RAND_MIN], dtype=F32)).item() == 0x2FFFFFFF


def test_spec_step_seed_mixes_the_high_word():
    s = torch.tensor([5, -1], dtype=I64)
    assert ref.spec_step_seed(s, 3).tolist() == [5 ^ (3 << 32), -1 ^ (3 << 32)]
    assert ref.spec_step_seed(s, 0).tolist() == [5, -1]


@given(seed=st.integers(-(2**63), 2**63 - 1), offset=st.integers(0, 2**40))
def test_philox_of_one_scalar_matches_cpp(seed, offset):
    s, o = torch.tensor([seed], dtype=I64), torch.tensor([offset], dtype=I64)
    c = torch.empty(1, dtype=F32)
    _C.gumbel.philox(buf(c), buf(s), buf(o), -1, True)
    assert_bits_equal("tl_rand", ref.tl_rand(s, o), c)


# -- murmur3 and the noise -----------------------------------------------------------------------------
def murmur3_x86_32(data: bytes, seed: int) -> int:
    """The textbook MurmurHash3_x86_32 over bytes, written independently of the oracle."""
    c1, c2, m = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    body = len(data) // 4 * 4
    for (k,) in struct.iter_unpack("<I", data[:body]):
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * c2) & m
        h ^= k
        h = ((h << 13) | (h >> 19)) & m
        h = (h * 5 + 0xE6546B64) & m
    tail, k = data[body:], 0
    for i, byte in enumerate(tail):
        k |= byte << (8 * i)
    if tail:
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        h ^= (k * c2) & m
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


def test_the_textbook_murmur3_is_right():
    assert murmur3_x86_32(b"", 0) == 0
    assert murmur3_x86_32(b"hello", 0) == 0x248BFA47
    assert murmur3_x86_32(b"Hello, world!", 1234) == 0xFAF6CDB3


@given(seed=st.integers(-(2**63), 2**63 - 1), pos=st.integers(0, 2**31 - 1), key=st.integers(0, 2**20),
       domain=st.sampled_from([0, 0x9E3779B9]))
def test_murmur3_is_murmur3_x86_32_of_the_four_words(seed, pos, key, domain):
    data = struct.pack("<qII", seed, pos, key)
    want = murmur3_x86_32(data, domain)
    got = ref.murmur3_hash32(torch.tensor([seed]), torch.tensor([pos]), torch.tensor([key]), domain)
    assert int(got) == want


def murmur3_all(seeds, pos, keys) -> dict[str, tuple[torch.Tensor, ...]]:
    n = seeds.numel()
    u32 = ref.murmur3_uniform32(seeds, pos, keys)
    u64 = ref.murmur3_uniform64(seeds, pos, keys)
    out = {"reference": (ref.murmur3_hash32(seeds, pos, keys), u32, u64, ref.gumbel32(u32), ref.gumbel64(u64))}
    dtypes = (I64, F32, F64, F32, F64)
    c = tuple(torch.empty(n, dtype=d) for d in dtypes)
    _C.gumbel.murmur3(*map(buf, c), buf(seeds), buf(pos), buf(keys))
    out["cpu"] = c
    t = tuple(torch.empty(n, dtype=d, device=device()) for d in dtypes)
    tri.murmur3_probe_kernel[(-(-n // PROBE),)](*t, seeds.to(device()), pos.to(device()), keys.to(device()), n,
                                                BLOCK=PROBE)
    out["triton"] = tuple(x.cpu() for x in t)
    return out


NAMES = ("hash", "uniform32", "uniform64", "noise32", "noise64")


def test_murmur3_three_ways():
    out = murmur3_all(*draws(8192, 2))
    for b in ("cpu", "triton"):
        for name, want, got in zip(NAMES, out["reference"], out[b]):
            if name == "noise64":
                continue  # float64 libraries: within C29's tolerance, next test
            assert_bits_equal(f"{name} {b}", want, got)


def test_float64_noise_within_the_c29_tolerance():
    # -log(-log u) through two float64 library logs: libdevice on an H100 was 14 ulps from PyTorch's.
    want, *others = (o[4] for o in murmur3_all(*draws(8192, 3)).values())
    for got in others:
        ulps = (bits(want) - bits(got)).abs()
        assert int(ulps.max()) <= 64


def test_the_uniforms_stay_inside_their_intervals():
    seeds, pos, keys = draws(8192, 4)
    u32 = ref.murmur3_uniform32(seeds, pos, keys)
    u64 = ref.murmur3_uniform64(seeds, pos, keys)
    assert bool((u32 > 0).all()) and bool((u32 <= 1).all())
    assert bool((u64 > 0).all()) and bool((u64 < 1).all())
    # The float32 uniform is RN((h + 0.5) * 2^-32), computed here in float64 and rounded once.
    h = ref.murmur3_hash32(seeds, pos, keys)
    assert_bits_equal("uniform32 = RN((h + 0.5) 2^-32)", ((h.to(F64) + 0.5) * 2.0**-32).to(F32), u32)


def test_the_noise_is_gumbel_where_it_decides():
    # log(1 - u) within vLLM's documented 6e-7 of float64 on the polynomial branch (u < 0.25),
    # and the noise within 1e-5 of -log(-log1p(-u)) where the argmax is decided (u -> 0).
    u = torch.linspace(1e-7, 0.9999, 20001, dtype=F32)
    exact = torch.log1p(-u.to(F64))
    series = u < 0.25
    assert float((ref.log1p_neg32(u).to(F64) - exact)[series].abs().max()) < 6e-7
    noise = (-torch.log(-exact)).to(F32)
    assert float((ref.gumbel32(u) - noise)[series].abs().max()) < 1e-5



# Where each bound must also be close (a loose bound would score every lane, and the skip would do
# nothing), and how close: the noise's for u >= 2^-16 (all but one lane in 65536), the residual's for
# d in [-8, -2^-10] (loose by log(-d / (1 - e^d)) + 0.06 at most).
CLOSE = {True: (1 << 16, 1 << 32, 0.15), False: (0xBA800000, 0xC1000000, 0.5)}


def _bounds_hold(noise: bool, ranges: list[tuple[int, int]]) -> None:
    # K17's port skips the lanes these bound below the best score (csrc/vmath.h): a bound under its
    # exact value anywhere could lose a tile's maximum.
    lo, hi, slack = CLOSE[noise]
    for start, count in ranges:
        below, least, _ = _C.gumbel.bound_slack(noise, start, count)
        assert below == 0 and least >= 0.0, f"a bound under its value in [{start:#x}, {start + count:#x})"
        a, b = max(start, lo), min(start + count, hi)
        if a < b:
            assert _C.gumbel.bound_slack(noise, a, b - a)[2] < slack, f"a loose bound in [{a:#x}, {b:#x})"


@pytest.mark.nightly
@pytest.mark.parametrize("noise", [True, False], ids=["gumbel32_above", "residual_above"])
def test_the_resample_bounds_hold_for_every_input(noise):
    # Every 2^32 input: the hashes behind the noise, the float32 log-ratios behind the residual (two
    # minutes on one core: a proof about csrc/vmath.h, the nightly's).
    _bounds_hold(noise, [(0, 1 << 32)])


@pytest.mark.parametrize("noise", [True, False], ids=["gumbel32_above", "residual_above"])
def test_the_resample_bounds_hold_at_the_ends_and_in_random_stretches(noise):
    # The nightly's sweep in a second: both ends of the range and of the close region, and 32 random
    # stretches of 2^18 inputs.
    lo, hi, _ = CLOSE[noise]
    g = torch.Generator().manual_seed(11)
    starts = torch.randint(0, (1 << 32) - (1 << 18), (32,), generator=g).tolist()
    ends = [0, (1 << 32) - (1 << 20), lo, hi - (1 << 20)]
    _bounds_hold(noise, [*((e, 1 << 20) for e in ends), *((s, 1 << 18) for s in starts)])


def test_the_resample_bounds_three_ways():
    # Triton's bounds are the port's, bit for bit, so the port's check on every input holds for
    # them. Hashes at both ends and random; log-ratios of every class (the oracle has no bounds: it
    # scores every lane).
    d = _numerics_inputs()
    g = torch.Generator().manual_seed(9)
    h = torch.cat([torch.arange(0, 4096), torch.arange(2**32 - 4096, 2**32), torch.randint(0, 2**32, (d.numel() - 8192,), generator=g)])
    want_noise, want_residual = torch.empty(h.numel()), torch.empty(h.numel())
    _C.gumbel.bounds(buf(want_noise), buf(want_residual), buf(h), buf(d))
    noise, residual = torch.empty_like(want_noise, device=device()), torch.empty_like(want_residual, device=device())
    tri.bounds_probe_kernel[(triton.cdiv(h.numel(), PROBE),)](noise, residual, h.to(device()), d.to(device()), h.numel(), BLOCK=PROBE)
    assert_bits_equal("gumbel32_above", want_noise, noise)
    assert_bits_equal("residual_above", want_residual, residual)

# -- C29 numerics: specified float32 exp/log/log1p -------------------------------------------------
def _numerics_inputs() -> torch.Tensor:
    """Random float32 bit patterns (NaNs, infinities, subnormals and both zeros among them), dense
    draws where the kernels live, and the algorithms' own edges: the clamps, the exponent-field
    path's ends, log's sqrt(2) split, 1 + x rounding to 1."""
    g = torch.Generator().manual_seed(5)
    edges = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 2.0**-149, 2.0**-126, 88.72283935546875, 88.7228469848632812,
             89.0, 89.5, -104.0, -104.5, -87.33654, -86.5, -103.3, 1.4142135, 1.4142137, 0.70710677, 1e-8, -0.999999,
             2.0**-24, -(2.0**-25), 3.4028234663852886e38, float("inf"), float("-inf"), float("nan")]
    return torch.cat([
        torch.randint(-(2**31), 2**31, (1 << 18,), generator=g, dtype=I64).to(I32).view(F32),
        torch.randn(1 << 16, generator=g) * 30, torch.rand(1 << 16, generator=g) * 2 - 1,
        -torch.rand(1 << 16, generator=g) * 110, torch.tensor(edges),
    ]).to(F32)


def test_numerics_three_ways():
    x = _numerics_inputs()
    want = (numerics.exp32(x), numerics.log32(x.abs()), numerics.log1p32(torch.clamp_min(x, -1.0)))
    c = tuple(torch.empty_like(x) for _ in range(3))
    _C.gumbel.numerics(*map(buf, c), buf(x), False)
    lanes = tuple(torch.empty_like(x) for _ in range(3))  # exp as the kernels' vector lanes compute it
    _C.gumbel.numerics(*map(buf, lanes), buf(x), True)
    t = tuple(torch.empty_like(x, device=device()) for _ in range(3))
    tri.numerics_probe_kernel[(-(-x.numel() // PROBE),)](*t, x.to(device()), x.numel(), BLOCK=PROBE)
    for b, got in (("cpu", c), ("cpu lanes", lanes), ("triton", tuple(v.cpu() for v in t))):
        for name, w, g_ in zip(("exp32", "log32", "log1p32"), want, got):
            # A NaN comes back as a NaN: compilers do not keep payloads (compiled Triton did not).
            assert_bits_equal(f"{name} {b}", _one_nan(w), _one_nan(g_))


def _one_nan(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t != t, float("nan"), t)


def _ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in ulps of the float32 nearest the exact (float64) value."""
    near = exact.to(F32).abs()
    ulp = (torch.nextafter(near, torch.tensor(float("inf"))) - near).to(F64)
    return (got.to(F64) - exact).abs() / ulp


@pytest.mark.parametrize(("name", "f", "exact", "lo", "bound"), [
    ("exp32", numerics.exp32, torch.exp, -87.3, 1.0),  # normal results (subnormals: next test)
    ("log32", numerics.log32, torch.log, 0.0, 1.0),
    ("log1p32", numerics.log1p32, torch.log1p, -1.0, 1.5),
])
def test_numerics_are_accurate(name, f, exact, lo, bound):
    # C29 specifies the algorithms; this holds them to what docs/mrv2.md promises of them.
    x = _numerics_inputs()
    x = x[(x > lo) & (x < 88.7 if name == "exp32" else torch.isfinite(x))]
    want = exact(x.to(F64))
    err = _ulps(f(x), want)[want != 0]
    assert float(err.max()) < bound, f"{name}: {float(err.max()):.3f} ulp at {float(x[want != 0][err.argmax()])!r}"
    assert torch.equal(numerics.exp32(torch.tensor([0.0])), torch.tensor([1.0]))
    assert torch.equal(numerics.log32(torch.tensor([1.0])), torch.tensor([0.0]))


def test_exp32_rounds_once_into_the_subnormals():
    x = -torch.rand(1 << 16, generator=torch.Generator().manual_seed(8)) * 17 - 87.4  # [-104.4, -87.4]
    err = (numerics.exp32(x).to(F64) - torch.exp(x.to(F64))).abs() / 2.0**-149
    # The final multiply rounds once into the subnormals; near 2^-126 the polynomial's own 2^-24 (a
    # unit there) adds to it.
    assert float(err.max()) < 1.0


def test_exp32_nonpositive_is_exp32_where_it_applies():
    # K15 takes its two exps through exp32_nonpositive (no NaN select, no upper clamp): the same bits
    # as exp32 for every argument <= 0 or -inf, in Triton and in the port's vector lanes.
    x = _numerics_inputs()
    x = torch.cat([x[x <= 0], torch.tensor([float("-inf"), -0.0, -104.0, -104.5, -1e-45])])
    want = numerics.exp32(x)
    lanes = torch.empty_like(x)
    _C.gumbel.exp_nonpositive(buf(lanes), buf(x))
    got = torch.empty_like(x, device=device())
    tri.exp_nonpositive_probe_kernel[(-(-x.numel() // PROBE),)](got, x.to(device()), x.numel(), BLOCK=PROBE)
    assert_bits_equal("exp32_nonpositive cpu lanes", want, lanes)
    assert_bits_equal("exp32_nonpositive triton", want, got.cpu())
    # buf() hands the C++ a raw pointer: the tensors must outlive the call (temporaries would be freed
    # before it, and the port would read and write freed memory).
    out, positive = torch.empty(1), torch.tensor([0.5])
    with pytest.raises(ValueError, match="'x'"):
        _C.gumbel.exp_nonpositive(buf(out), buf(positive))


def test_exp_units_are_the_fixed_point_of_exp32():
    # K13's tile sums add exp_units(x - max): floor(exp32(x - max) * 2^46) taken straight from exp32's
    # polynomial and exponent. The C++ port's vector form is held to the same bits by K13's conformance.
    g = torch.Generator().manual_seed(9)
    x = torch.cat([-torch.rand(1 << 18, generator=g) * 40, -torch.rand(1 << 14, generator=g) * 1e-3,
                   torch.tensor([0.0, -0.0, -33.0, -32.99, -31.9, -31.8, -1e-45, -87.0, -200.0, float("-inf")])])
    want = (numerics.exp32(x).to(F64) * numerics.SUM_SCALE).to(I64)
    got = torch.empty(x.numel(), dtype=I64, device=device())
    tri.exp_units_probe_kernel[(-(-x.numel() // PROBE),)](got, x.to(device()), x.numel(), BLOCK=PROBE)
    assert_bits_equal("exp_units", want, got)
    assert int(want[-10]) == 2**46 and int(want[-1]) == 0


def test_division_by_a_temperature_is_correctly_rounded():
    # K13, K15 and K17 divide a tile by its temperature as div_by (a power of two's reciprocal, or a
    # reciprocal and two fmas): bit for bit the IEEE quotient, on random significands over the whole
    # exponent range (blocks of only normal-range values take the fast steps, blocks with a tiny or
    # huge value the general division), significands near all ones, exact quotients, zeros and
    # infinities, and temperatures inside and outside the fast steps' range.
    g = torch.Generator().manual_seed(10)
    n_blocks = 96
    n = n_blocks * BLOCK

    def floats(lo: int, hi: int, k: int) -> torch.Tensor:
        e = torch.randint(lo, hi, (k,), generator=g)
        m = torch.randint(0, 1 << 23, (k,), generator=g)
        m = torch.where(torch.rand(k, generator=g) < 0.2, (1 << 23) - 1 - torch.randint(0, 3, (k,), generator=g), m)
        return ((e << 23) | m).to(I32).view(F32)

    t = floats(127 - 24, 127 + 24, n_blocks)  # some outside [2^-20, 2^20]
    t[:6] = torch.tensor([1.0, 0.7, 0.3, 0.01, 2.0**-20, 2.0**20])
    x = floats(127 - 90, 127 + 90, n) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x[:BLOCK] = (torch.randint(-4096, 4096, (BLOCK,), generator=g) * t[0]).to(F32)  # exact quotients
    x[BLOCK: 2 * BLOCK: 7] = float("inf")
    x[BLOCK + 1: 2 * BLOCK: 7] = -0.0
    x[BLOCK + 2: 2 * BLOCK: 7] = 0.0
    x[2 * BLOCK: 3 * BLOCK] = floats(1, 27, BLOCK)  # tiny: this block divides the general way
    x[3 * BLOCK + 9] = -3e37  # huge: the quotient overflows
    x[4 * BLOCK: 5 * BLOCK] = floats(1, 254, BLOCK)  # every exponent
    t[6:9] = torch.tensor([4.0, 2.0**-4, 0.5])  # powers of two multiply by their reciprocals:
    x[6 * BLOCK: 7 * BLOCK] = floats(1, 27, BLOCK)  # subnormal quotients,
    x[7 * BLOCK: 8 * BLOCK] = floats(230, 255, BLOCK)  # overflowing ones,
    x[8 * BLOCK: 9 * BLOCK] = floats(1, 254, BLOCK)  # every exponent
    want = x / t.repeat_interleave(BLOCK)
    got = torch.empty(n, dtype=F32, device=device())
    tri.div_probe_kernel[(n_blocks,)](got, x.to(device()), t.to(device()), n, BLOCK=BLOCK)
    assert_bits_equal("div_by", want, got)
    inside = ((t >= 2.0**-20) & (t <= 2.0**20)).sum()
    assert 0 < inside < n_blocks


def test_fma32_rounds_once():
    # a * b = 2^-24 (1 + 2^-24 - 2^-35) rounds to 2^-24, and 1 + 2^-24 is a tie that goes to even
    # (1); fused, the exact product lies past the tie (1 + 2^-23).
    a = torch.tensor([1 + 2.0**-12 + 2.0**-23], dtype=F32)
    b = torch.tensor([(1 - 2.0**-12) * 2.0**-24], dtype=F32)
    assert float(a * b + 1.0) == 1.0
    assert float(numerics.fma32(a, b, 1.0)) == 1.0 + 2.0**-23
    g = torch.Generator().manual_seed(6)
    x, y, z = (torch.randn(20000, generator=g) for _ in range(3))
    # The float64 sum rounded to float32 (double rounding: about 2^-29 rare; this seed has none).
    exact = (x.double() * y.double() + z.double()).to(F32)
    assert_bits_equal("fma32", exact, numerics.fma32(x, y, z))


def test_tree_sum_three_ways_and_padding_changes_nothing():
    # C29's tree_sum: the log-sum-exps' T and block verification's residual mass. Terms over many
    # binades (where the order of additions shows), zeros and -0.0, counts that are and are not
    # powers of two; Triton pads each row to one and to four times the power of two.
    g = torch.Generator().manual_seed(10)
    for n in (1, 2, 3, 5, 19, 32, 33, 100):
        rows = 64
        x = torch.rand(rows, n, generator=g, dtype=F64) * torch.exp2(torch.randint(-60, 17, (rows, n), generator=g).to(F64))
        x[0] = 0.0
        x[1, :] = -0.0
        x[2, ::2] = -0.0
        x[3] = 1.0
        x[3, -1] = 2.0**-53  # lost beside a 1, kept beside another term as small
        want = torch.stack([numerics.tree_sum(r) for r in x])
        cpp = torch.empty(rows, dtype=F64)
        _C.gumbel.tree_sums(buf(cpp), buf(x), rows, n, n)
        assert_bits_equal(f"tree_sum cpu n={n}", want, cpp)
        for width in (1 << (n - 1).bit_length(), 4 << (n - 1).bit_length()):
            got = torch.empty(rows, dtype=F64, device=device())
            tri.tree_sum_probe_kernel[(rows,)](got, x.to(device()), n, n, WIDTH=width)
            assert_bits_equal(f"tree_sum triton n={n} width={width}", want, got)
        assert bits(want[1]) == 0  # -0.0 terms sum to +0.0
        if n >= 19:  # the tree's order, not the tiles': some row tells them apart
            assert any(numerics.tree_sum(r).item() != _in_order(r) for r in x)


def _in_order(r: torch.Tensor) -> float:
    total = 0.0
    for v in r.tolist():
        total += v
    return total
