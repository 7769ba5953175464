// Probes of csrc/gumbel.h for tests: each primitive over arrays, compared bit for bit with the
// oracle and Triton (tests/test_gumbel.py). Not kernels: no contract, checked lengths only.
#include "gumbel.h"
#include "vmath.h"

#include "bindings.h"
#include "common.h"

namespace specdiff {
namespace {

constexpr const char* kProbe = "gumbel probe";

void need_dtype(const char* name, const Buffer& b, int dtype, std::int64_t n) {
  if (b.dtype != dtype) fail(kProbe, name, "has the wrong dtype");
  need_len(kProbe, name, b, n);
}

void philox(Buffer out, Buffer seeds, Buffer offsets, std::int64_t step, bool includes_zero) {
  const std::int64_t n = out.numel;
  need_dtype("out", out, kFloat32, n);
  need_dtype("seeds", seeds, kInt64, n);
  if (offsets.dtype != kInt32 && offsets.dtype != kInt64) fail(kProbe, "offsets", "must be int32 or int64");
  need_len(kProbe, "offsets", offsets, n);
  const bool wide = offsets.dtype == kInt64;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t seed = seeds.as<std::int64_t>()[i];
    if (step >= 0) seed = gumbel::spec_step_seed(seed, step);
    const std::int64_t offset = wide ? offsets.as<std::int64_t>()[i] : offsets.as<std::int32_t>()[i];
    out.as<float>()[i] = gumbel::tl_rand32(seed, offset, wide, includes_zero);
  }
}

void murmur3(Buffer hash, Buffer u32, Buffer u64, Buffer noise32, Buffer noise64, Buffer seeds, Buffer pos,
             Buffer keys) {
  const std::int64_t n = hash.numel;
  need_dtype("hash", hash, kInt64, n);
  need_dtype("u32", u32, kFloat32, n);
  need_dtype("u64", u64, kFloat64, n);
  need_dtype("noise32", noise32, kFloat32, n);
  need_dtype("noise64", noise64, kFloat64, n);
  need_dtype("seeds", seeds, kInt64, n);
  need_dtype("pos", pos, kInt64, n);
  need_dtype("keys", keys, kInt64, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t s = seeds.as<std::int64_t>()[i], p = pos.as<std::int64_t>()[i];
    const auto k = static_cast<std::uint32_t>(keys.as<std::int64_t>()[i]);
    hash.as<std::int64_t>()[i] = gumbel::murmur3_hash32(s, p, k);
    const float a = gumbel::murmur3_uniform32(s, p, k);
    const double b = gumbel::murmur3_uniform64(s, p, k);
    u32.as<float>()[i] = a;
    u64.as<double>()[i] = b;
    noise32.as<float>()[i] = gumbel::gumbel32(a);
    noise64.as<double>()[i] = gumbel::gumbel64(b);
  }
}

// vmath's exp32 (the kernels' lanes, in the clone this machine picks), or its exp32_nonpositive (K15's
// lanes, for x <= 0 or -inf only); the tail by the scalar spec.
SPECDIFF_CLONES void exp32_lanes(const float* x, float* out, std::int64_t n, bool nonpositive) {
  using namespace vmath;
  const std::int64_t nv = n & ~std::int64_t{kLanes - 1};
  for (std::int64_t j = 0; j < nv; j += kLanes) {
    const Fv v = nonpositive ? exp32_nonpositive(loadu(x + j)) : exp32(loadu(x + j));
    std::memcpy(out + j, &v, sizeof v);
  }
  for (std::int64_t j = nv; j < n; ++j) out[j] = gumbel::exp32(x[j]);
}

void exp_nonpositive(Buffer out, Buffer x) {
  const std::int64_t n = x.numel;
  need_dtype("x", x, kFloat32, n);
  need_dtype("out", out, kFloat32, n);
  for (std::int64_t i = 0; i < n; ++i)
    if (!(x.as<float>()[i] <= 0.0f)) fail(kProbe, "x", "must hold values <= 0 or -inf only (no NaN)");
  exp32_lanes(x.as<float>(), out.as<float>(), n, true);
}

// The scalar C29 functions; with `lanes`, exp through the vector form the kernels use.
void numerics(Buffer exp_out, Buffer log_out, Buffer log1p_out, Buffer x, bool lanes) {
  const std::int64_t n = x.numel;
  need_dtype("x", x, kFloat32, n);
  need_dtype("exp", exp_out, kFloat32, n);
  need_dtype("log", log_out, kFloat32, n);
  need_dtype("log1p", log1p_out, kFloat32, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x.as<float>()[i];
    exp_out.as<float>()[i] = gumbel::exp32(v);
    log_out.as<float>()[i] = gumbel::log32(std::fabs(v));
    log1p_out.as<float>()[i] = gumbel::log1p32(std::max(v, -1.0f));
  }
  if (lanes) exp32_lanes(x.as<float>(), exp_out.as<float>(), n, false);
}

// C29's tree_sum of each row's first n terms (rows of `stride` float64 values), as the kernels sum tiles.
void tree_sums(Buffer out, Buffer x, std::int64_t rows, std::int64_t stride, std::int64_t n) {
  need_at_least(kProbe, "n", n, 0);
  need_at_least(kProbe, "stride", stride, n);
  need_at_least(kProbe, "rows", rows, 0);
  need_dtype("x", x, kFloat64, rows * stride);
  need_dtype("out", out, kFloat64, rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* row = x.as<double>() + r * stride;
    out.as<double>()[r] = gumbel::tree_sum([&](std::int64_t b) { return row[b]; }, n);
  }
}

// K17's bounds (vmath.h) against the exact functions, for the 32-bit inputs [lo, lo + count): hashes
// for gumbel32_above, float32 bit patterns of the log-ratio d for residual_above (where exp32(d) < 1,
// the lanes K17 scores finite). Returns the number of inputs where the bound is below the exact
// value, and the smallest and largest bound - exact where both are finite.
struct Slack {
  std::int64_t below = 0;
  float least = INFINITY, most = -INFINITY;
};

SPECDIFF_CLONES Slack bound_slack_range(bool noise, std::uint32_t lo, std::int64_t count) {
  using namespace vmath;
  Slack s;
  Iv lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  Fv least = Fv{} + INFINITY, most = Fv{} - INFINITY;
  Iv below{};
  for (std::int64_t j = 0; j < count; j += kLanes) {
    const Uv bits = reinterpret_cast<Uv>(lane + static_cast<std::int32_t>(lo + static_cast<std::uint32_t>(j)));
    Iv valid = lane < static_cast<std::int32_t>(count - j);
    Fv exact, bound;
    if (noise) {
      exact = gumbel32(uniform32(bits));
      bound = gumbel32_above(bits);
    } else {
      const Fv d = reinterpret_cast<Fv>(bits), ratio = exp32(d);
      valid &= ratio < 1.0f;
      exact = log1p32_negative(ratio < 1.0f ? -ratio : Fv{});
      bound = residual_above(d);
    }
    below -= valid & (bound < exact);  // a mask is -1 where set
    const Iv finite = valid & (bound > -INFINITY) & (bound < INFINITY) & (exact > -INFINITY);
    const Fv slack = bound - exact;
    least = finite & (slack < least) ? slack : least;
    most = finite & (slack > most) ? slack : most;
  }
  for (int l = 0; l < kLanes; ++l) {
    s.below += below[l];
    s.least = std::min(s.least, least[l]);
    s.most = std::max(s.most, most[l]);
  }
  return s;
}

// The bounds themselves, lane by lane (the kernels' forms), for comparison with Triton's bits.
SPECDIFF_CLONES void bounds_lanes(const std::int64_t* h, const float* d, float* noise, float* residual, std::int64_t n) {
  using namespace vmath;
  for (std::int64_t j = 0; j < n; j += kLanes) {
    Uv hv{};
    Fv dv{};
    for (int l = 0; l < kLanes && j + l < n; ++l) {
      hv[l] = static_cast<std::uint32_t>(h[j + l]);
      dv[l] = d[j + l];
    }
    const Fv a = gumbel32_above(hv), b = residual_above(dv);
    for (int l = 0; l < kLanes && j + l < n; ++l) {
      noise[j + l] = a[l];
      residual[j + l] = b[l];
    }
  }
}

void bounds(Buffer noise, Buffer residual, Buffer h, Buffer d) {
  const std::int64_t n = h.numel;
  need_dtype("h", h, kInt64, n);
  need_dtype("d", d, kFloat32, n);
  need_dtype("noise", noise, kFloat32, n);
  need_dtype("residual", residual, kFloat32, n);
  bounds_lanes(h.as<std::int64_t>(), d.as<float>(), noise.as<float>(), residual.as<float>(), n);
}

py::tuple bound_slack(bool noise, std::int64_t lo, std::int64_t count) {
  need_at_least(kProbe, "lo", lo, 0);
  need_at_least(kProbe, "count", count, 0);
  if (lo + count > (std::int64_t{1} << 32)) fail(kProbe, "count", "must keep lo + count within 2^32");
  Slack total;
  {
    py::gil_scoped_release nogil;
    constexpr std::int64_t kChunk = std::int64_t{1} << 20;
    const std::int64_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel
    {
      Slack mine;
#pragma omp for schedule(dynamic, 16)
      for (std::int64_t c = 0; c < chunks; ++c) {
        const Slack s = bound_slack_range(noise, static_cast<std::uint32_t>(lo + c * kChunk), std::min(kChunk, count - c * kChunk));
        mine.below += s.below;
        mine.least = std::min(mine.least, s.least);
        mine.most = std::max(mine.most, s.most);
      }
#pragma omp critical
      {
        total.below += mine.below;
        total.least = std::min(total.least, mine.least);
        total.most = std::max(total.most, mine.most);
      }
    }
  }
  return py::make_tuple(total.below, total.least, total.most);
}

}  // namespace

SPECDIFF_PROBES(gumbel, "MRV2's random streams and numerics, as probes (not kernels)") {
  m.def("philox", &philox);
  m.def("murmur3", &murmur3);
  m.def("numerics", &numerics);
  m.def("exp_nonpositive", &exp_nonpositive);
  m.def("tree_sums", &tree_sums);
  m.def("bounds", &bounds);
  m.def("bound_slack", &bound_slack, py::arg("noise"), py::arg("lo"), py::arg("count"));
}

}  // namespace specdiff
