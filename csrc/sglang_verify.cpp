// OpenMP port of SGLang's speculative verification (docs/sglang_verify.md, C46-C48): the chain
// rejection sampler (K46), the greedy tree walk (K47) and the target-only tree sampler (K48).
//
// Each entry checks its launch in full (it can be called directly), then runs one request per
// iteration, requests in parallel (a request writes only its own slots and rows). The final draw
// sums C29's fixed-point units (int64: exact in any order), so it matches the oracle and Triton bit
// for bit. Built with -ffp-contract=off: RN(scale * p) - q is two roundings.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "launch.h"
#include "metadata.h"

namespace specdiff {
namespace {

constexpr const char* kClassic = "speculative_sampling_classic_kernel";
constexpr const char* kGreedyTree = "verify_tree_greedy_kernel_triton";
constexpr const char* kTargetOnly = "tree_speculative_sampling_target_only";
constexpr double kSumScale = 70368744177664.0;  // 2^46: C29's units
constexpr double kRowSumLimit = 65536.0;        // C46d: a drawn row sums to at most 2^16

inline std::int64_t int_at(const Buffer& b, std::int64_t i) {
  return b.dtype == kInt32 ? static_cast<std::int64_t>(b.as<std::int32_t>()[i]) : b.as<std::int64_t>()[i];
}

inline void store_int(const Buffer& b, std::int64_t i, std::int64_t v) {
  if (b.dtype == kInt32)
    b.as<std::int32_t>()[i] = static_cast<std::int32_t>(v);
  else
    b.as<std::int64_t>()[i] = v;
}

// C16's residual weight: max(diff, 0), NaN giving 0.
inline float residual(float diff) { return diff > 0.0f ? diff : 0.0f; }
// C46c: q outside [0, 1] (NaN included) counts as 0.
inline float sanitized(float q) { return q >= 0.0f && q <= 1.0f ? q : 0.0f; }
// C46d: a weight in [0, 1] as units of 2^-46, truncated (an exact product, then the conversion).
inline std::int64_t units(float w) { return static_cast<std::int64_t>(static_cast<double>(w) * kSumScale); }
inline float mass(std::int64_t u) { return static_cast<float>(static_cast<double>(u) * (1.0 / kSumScale)); }
// The draw's threshold: float64(coin) * float64(total), rounded once, truncated (coin in [0, 1]).
inline std::int64_t cut(float coin, std::int64_t total) {
  return static_cast<std::int64_t>(static_cast<double>(coin) * static_cast<double>(total));
}

// C46d: the first index whose prefix sum of weight(v) exceeds cut(coin, total); -1 when none does.
// total < 0: the weights' own sum.
template <class W>
std::int64_t draw(std::int64_t v, const W& weight, float coin, std::int64_t total) {
  if (total < 0) {
    total = 0;
    for (std::int64_t c = 0; c < v; ++c) total += units(weight(c));
  }
  const std::int64_t threshold = cut(coin, total);
  std::int64_t prefix = 0;
  for (std::int64_t c = 0; c < v; ++c) {
    prefix += units(weight(c));
    if (prefix > threshold) return c;
  }
  return -1;
}

// Every flat index b * sb + r * sr + c * sc (b < nb, r < nr, c < nc) lies in [0, numel): a stepped
// stride must be >= 0, and the last index is formed with checked arithmetic.
void need_reads(const char* kernel, const char* name, const Buffer& t, std::int64_t nb, const char* sb_name, std::int64_t sb,
                std::int64_t nr, const char* sr_name, std::int64_t sr, std::int64_t nc, const char* sc_name, std::int64_t sc) {
  if (nb <= 0 || nr <= 0 || nc <= 0) return;
  std::int64_t last = 0;
  for (auto [count, stride, sname] : {std::tuple{nb, sb, sb_name}, std::tuple{nr, sr, sr_name}, std::tuple{nc, sc, sc_name}}) {
    if (count <= 1) continue;
    if (stride < 0) fail(kernel, sname, "must be >= 0, got " + std::to_string(stride));
    last = checked_add(kernel, sname, last, checked_mul(kernel, sname, count - 1, stride, "an offset"), "an offset");
  }
  if (last >= t.numel)
    fail(kernel, name, "is read at flat index " + std::to_string(last) + ", past its " + std::to_string(t.numel) + " elements");
}

// A 2-D Strided tensor's stride arguments are its own (where a dimension is stepped).
void need_strides(const char* kernel, const Strided& t, const char* sb_name, std::int64_t sb, const char* ss_name,
                  std::int64_t ss) {
  if (t.rows > 1 && sb != t.row_stride)
    fail(kernel, sb_name, "must be the tensor's stride(0) = " + std::to_string(t.row_stride) + ", got " + std::to_string(sb));
  if (t.cols > 1 && ss != 1) fail(kernel, ss_name, "must be the tensor's stride(1) = 1, got " + std::to_string(ss));
}

void need_unit(const char* kernel, const char* name, float x, const std::string& where, const char* what) {
  if (!(x >= 0.0f && x <= 1.0f))
    fail(kernel, name, std::string("must hold ") + what + " in [0, 1]; " + where + " holds " + std::to_string(x));
}

// C46/C48's target rows: values in [0, 1], each row summing to at most 2^16.
void need_probability_row(const char* kernel, const char* name, const float* row, std::int64_t stride, std::int64_t v,
                          const std::string& where) {
  double sum = 0.0;
  for (std::int64_t c = 0; c < v; ++c) {
    need_unit(kernel, name, row[c * stride], where + " column " + std::to_string(c), "probabilities");
    sum += row[c * stride];
  }
  if (sum > kRowSumLimit) fail(kernel, name, where + " sums to " + std::to_string(sum) + ", above 2**16 (C46d)");
}

// Slots of every node over the batch: in [0, slots), distinct.
void need_distinct_slots(const char* kernel, const char* name, std::vector<std::int64_t> all, std::int64_t slots) {
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] < 0 || all[i] >= slots)
      fail(kernel, name, "entry " + std::to_string(i) + " = " + std::to_string(all[i]) + " must be a slot in [0, " +
                             std::to_string(slots) + ")");
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end())
    fail(kernel, name, "must hold distinct slots (two requests never write one predicts slot)");
}

// C47b: a request's links in [-1, n), and no sibling list that fails to reach -1 (a cycle).
void need_tree(const char* kernel, const char* next_name, const char* sib_name, const std::int64_t* next, const std::int64_t* sib,
               std::int64_t b, std::int64_t n) {
  for (auto [links, name] : {std::pair{next, next_name}, std::pair{sib, sib_name}})
    for (std::int64_t i = 0; i < n; ++i)
      if (links[i] < -1 || links[i] >= n)
        fail(kernel, name, "[" + std::to_string(b) + ", " + std::to_string(i) + "] = " + std::to_string(links[i]) +
                               " must be -1 or a node in [0, " + std::to_string(n) + ")");
  std::vector<char> state(static_cast<std::size_t>(n), 0);  // 0 unseen, 1 on the current walk, 2 ends at -1
  for (std::int64_t start = 0; start < n; ++start) {
    std::int64_t i = start;
    while (i >= 0 && state[i] == 0) state[i] = 1, i = sib[i];
    if (i >= 0 && state[i] == 1)
      fail(kernel, sib_name, "must end every sibling list at -1 within " + std::to_string(n) + " steps; request " + std::to_string(b) +
                                 "'s list from node " + std::to_string(start) + " is a cycle (C47b)");
    for (i = start; i >= 0 && state[i] == 1; i = sib[i]) state[i] = 2;
  }
}

// -- K46 -------------------------------------------------------------------------------------------
struct Chain {
  std::int64_t num = 0;
  float scale = 1.0f;
  std::int64_t total = -1;  // the residual mass's units, where block verification summed them
};

void speculative_sampling_classic(Buffer predicts, Strided accept_index, Buffer accept_token_num, Strided candidates,
                                  Strided retrive_index, Strided uniform, Buffer uniform_final, Buffer target, Buffer draft,
                                  std::int64_t stride_cand_b, std::int64_t stride_cand_s, std::int64_t stride_idx_b,
                                  std::int64_t stride_idx_s, std::int64_t stride_uni_b, std::int64_t stride_uni_s,
                                  std::int64_t stride_tp_b, std::int64_t stride_tp_s, std::int64_t stride_tp_v,
                                  std::int64_t stride_dp_b, std::int64_t stride_dp_s, std::int64_t stride_dp_v,
                                  std::int64_t num_slots, std::int64_t v, std::int64_t block_v, bool block_verification,
                                  std::int64_t block_reduce) {
  const char* k = kClassic;
  need_at_least(k, "NUM_SLOTS", num_slots, 1);
  need_at_least(k, "VOCAB_SIZE", v, 1);
  if (v >= (std::int64_t{1} << 31)) fail(k, "VOCAB_SIZE", "must be < 2**31 (token ids are int32), got " + std::to_string(v));
  for (auto [name, value] : {std::pair{"BLOCK_V", block_v}, std::pair{"BLOCK_REDUCE", block_reduce}}) {
    need_power_of_two(k, name, value);
    if (value > (1 << 16)) fail(k, name, "must be <= 65536 (a tile), got " + std::to_string(value));
  }
  const std::int64_t bs = candidates.rows;
  if (candidates.cols != num_slots) fail(k, "Candidates", "must have NUM_SLOTS = " + std::to_string(num_slots) + " columns");
  if (retrive_index.rows != bs || retrive_index.cols != num_slots)
    fail(k, "RetriveIndex", "must have shape [bs=" + std::to_string(bs) + ", NUM_SLOTS=" + std::to_string(num_slots) + "]");
  if (accept_index.rows != bs || accept_index.cols != num_slots || (bs > 1 && accept_index.row_stride != retrive_index.row_stride))
    fail(k, "AcceptIndex", "must have RetriveIndex's shape and strides (K46 addresses it with RetriveIndex's strides)");
  if (uniform.rows != bs || uniform.cols < num_slots - 1)
    fail(k, "UniformSamples", "must have shape [bs=" + std::to_string(bs) + ", >= NUM_SLOTS - 1]");
  need_len(k, "UniformSamplesFinal", uniform_final, bs);
  need_len(k, "AcceptTokenNum", accept_token_num, bs);
  need_strides(k, candidates, "stride_cand_b", stride_cand_b, "stride_cand_s", stride_cand_s);
  need_strides(k, retrive_index, "stride_idx_b", stride_idx_b, "stride_idx_s", stride_idx_s);
  need_strides(k, uniform, "stride_uni_b", stride_uni_b, "stride_uni_s", stride_uni_s);
  need_reads(k, "TargetProbs", target, bs, "stride_tp_b", stride_tp_b, num_slots, "stride_tp_s", stride_tp_s, v, "stride_tp_v",
             stride_tp_v);
  need_reads(k, "DraftProbs", draft, bs, "stride_dp_b", stride_dp_b, num_slots - 1, "stride_dp_s", stride_dp_s, v, "stride_dp_v",
             stride_dp_v);
  if (bs == 0) return;
  const float* tp = target.as<float>();
  const float* dp = draft.as<float>();
  const float* coins = uniform.as<float>();
  const float* finals = uniform_final.as<float>();
  std::vector<std::int64_t> slots;
  slots.reserve(static_cast<std::size_t>(bs * num_slots));
  for (std::int64_t b = 0; b < bs; ++b) {
    for (std::int64_t s = 0; s < num_slots; ++s) {
      slots.push_back(int_at(retrive_index.data, b * retrive_index.row_stride + s));
      need_fits(k, "RetriveIndex", slots.back(), "AcceptIndex", accept_index.data);
      if (s == 0) continue;
      const std::int64_t d = int_at(candidates.data, b * candidates.row_stride + s);
      if (d < 0 || d >= v)
        fail(k, "Candidates", "[" + std::to_string(b) + ", " + std::to_string(s) + "] = " + std::to_string(d) +
                                  " must be a draft id in [0, VOCAB_SIZE=" + std::to_string(v) + ") (C46b)");
      need_unit(k, "UniformSamples", coins[b * uniform.row_stride + s - 1], "[" + std::to_string(b) + ", " + std::to_string(s - 1) + "]",
                "coins");
    }
    need_unit(k, "UniformSamplesFinal", finals[b], "[" + std::to_string(b) + "]", "coins");
  }
  need_distinct_slots(k, "RetriveIndex", slots, predicts.numel);
  need_fits(k, "VOCAB_SIZE", v - 1, "Predicts", predicts);
  for (std::int64_t b = 0; b < bs; ++b)
    for (std::int64_t r = 0; r < num_slots; ++r) {
      const std::string where = "row [" + std::to_string(b) + ", " + std::to_string(r) + "]";
      need_probability_row(k, "TargetProbs", tp + b * stride_tp_b + r * stride_tp_s, stride_tp_v, v, where);
      if (block_verification && r < num_slots - 1)
        for (std::int64_t c = 0; c < v; ++c)
          if (!(dp[b * stride_dp_b + r * stride_dp_s + c * stride_dp_v] >= 0.0f))
            fail(k, "DraftProbs", where + " column " + std::to_string(c) + " must be >= 0 (not NaN) under BLOCK_VERIFICATION (C46e)");
    }

  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (worth_team(bs * v, 1 << 15))
  for (std::int64_t b = 0; b < bs; ++b) {
    const float* p = tp + b * stride_tp_b;
    const float* q = dp + b * stride_dp_b;
    const float* coin = coins + b * uniform.row_stride;
    auto draft_at = [&](std::int64_t s) { return int_at(candidates.data, b * candidates.row_stride + s); };
    auto p_at = [&](std::int64_t row, std::int64_t c) { return p[row * stride_tp_s + c * stride_tp_v]; };
    auto q_at = [&](std::int64_t row, std::int64_t c) { return q[row * stride_dp_s + c * stride_dp_v]; };
    Chain chain;
    if (block_verification) {
      // C46e: prefix ratios h, then the longest prefix first.
      std::vector<float> ratio(static_cast<std::size_t>(num_slots), 1.0f);
      float h = 1.0f;
      for (std::int64_t s = 1; s < num_slots; ++s) {
        const std::int64_t d = draft_at(s);
        const float pv = p_at(s - 1, d), qv = q_at(s - 1, d);
        h = qv > 0.0f && qv <= 1.0f ? std::min((h * pv) / qv, 1.0f) : 0.0f;
        ratio[s] = h;
      }
      for (std::int64_t step = num_slots - 1; step >= 1; --step) {
        const float hs = ratio[step], c = coin[step - 1];
        if (!(c < hs)) continue;
        float accept_prob = hs;
        std::int64_t total = -1;
        if (step < num_slots - 1 && hs > 0.0f && hs < 1.0f) {
          total = 0;  // the residual mass at the next row, with the raw q
          for (std::int64_t col = 0; col < v; ++col) {
            const float scaled = hs * p_at(step, col);
            total += units(residual(scaled - q_at(step, col)));
          }
          const float m = mass(total);
          accept_prob = m / ((m + 1.0f) - hs);
        }
        if (c < accept_prob) {
          chain = Chain{step, hs, total};
          break;
        }
      }
    } else {
      // C46a: token by token.
      for (std::int64_t s = 1; s < num_slots; ++s) {
        const std::int64_t d = draft_at(s);
        const float pv = p_at(s - 1, d), qv = q_at(s - 1, d);
        if (!(qv > 0.0f && qv <= 1.0f && coin[s - 1] * qv < pv)) break;
        chain.num = s;
      }
    }
    const std::int64_t row = b * retrive_index.row_stride;
    store_int(accept_index.data, row, int_at(retrive_index.data, row));
    for (std::int64_t s = 1; s <= chain.num; ++s) {
      store_int(predicts, int_at(retrive_index.data, row + s - 1), draft_at(s));
      store_int(accept_index.data, row + s, int_at(retrive_index.data, row + s));
    }
    store_int(accept_token_num, b, chain.num);
    // C46d: the bonus from p alone, else the residual max(RN(scale * p) - q', 0).
    const std::int64_t num = chain.num;
    const bool bonus = num == num_slots - 1;
    const float scale = chain.scale;
    auto weight = [&](std::int64_t col) {
      const float pv = p_at(num, col);
      if (bonus) return pv;
      const float scaled = scale * pv;
      return residual(scaled - sanitized(q_at(num, col)));
    };
    const std::int64_t token = draw(v, weight, finals[b], chain.total);
    store_int(predicts, int_at(retrive_index.data, row + num), token < 0 ? v - 1 : token);
  }
}

// -- K47 -------------------------------------------------------------------------------------------
// The tree's links of every request, read once and checked (C47b).
struct Trees {
  std::vector<std::int64_t> slot, child, sibling;
};

Trees load_trees(const char* kernel, const char* index_name, const char* next_name, const char* sib_name, const Buffer& index,
                 const Buffer& next, const Buffer& sib, std::int64_t bs, std::int64_t n, std::int64_t slots) {
  const std::int64_t cells = checked_mul(kernel, "candidates", bs, n, "bs * n");
  Trees t{load_ints(kernel, index_name, index, cells), load_ints(kernel, next_name, next, cells), load_ints(kernel, sib_name, sib, cells)};
  for (std::int64_t b = 0; b < bs; ++b) need_tree(kernel, next_name, sib_name, &t.child[b * n], &t.sibling[b * n], b, n);
  need_distinct_slots(kernel, index_name, t.slot, slots);
  return t;
}

void verify_tree_greedy(Buffer predicts, Buffer accept_index, Buffer accept_token_num, Buffer candidates, Buffer retrieve_index,
                        Buffer next_token, Buffer next_sibling, Buffer target_predict, std::int64_t batch_size,
                        std::int64_t num_spec, std::int64_t n) {
  const char* k = kGreedyTree;
  need_at_least(k, "batch_size", batch_size, 0);
  need_at_least(k, "num_speculative_tokens", num_spec, 1);
  need_at_least(k, "num_draft_tokens", n, 1);
  const std::int64_t bs = batch_size;
  need_len(k, "candidates_ptr", candidates, bs, n);
  need_len(k, "target_predict_ptr", target_predict, bs, n);
  need_len(k, "accept_index_ptr", accept_index, bs, num_spec);
  need_len(k, "accept_token_num_ptr", accept_token_num, bs);
  need_fits(k, "num_speculative_tokens", num_spec - 1, "accept_token_num_ptr", accept_token_num);
  if (bs == 0) return;
  const Trees t = load_trees(k, "retrieve_index_ptr", "retrieve_next_token_ptr", "retrieve_next_sibling_ptr", retrieve_index,
                             next_token, next_sibling, bs, n, std::min(predicts.numel, bs * n));
  const std::vector<std::int64_t> token = load_ints(k, "candidates_ptr", candidates, bs * n);
  const std::vector<std::int64_t> target = load_ints(k, "target_predict_ptr", target_predict, bs * n);
  for (std::int64_t i = 0; i < bs * n; ++i) {
    need_fits(k, "retrieve_index_ptr", t.slot[i], "accept_index_ptr", accept_index);
    need_fits(k, "target_predict_ptr", target[i], "predicts_ptr", predicts);
  }
  NoGil nogil;
#pragma omp parallel for schedule(static) if (worth_team(bs * n, 1 << 12))
  for (std::int64_t b = 0; b < bs; ++b) {
    const std::int64_t* slot = &t.slot[b * n];
    const std::int64_t* child = &t.child[b * n];
    const std::int64_t* sibling = &t.sibling[b * n];
    const std::int64_t* node_token = &token[b * n];
    std::int64_t last = slot[0], num = 0, cur = 0;
    store_int(accept_index, b * num_spec, last);
    for (std::int64_t j = 1; j < num_spec; ++j) {
      // C47a: the first child's sibling list searched for the target at the last accepted slot.
      cur = child[cur];
      const std::int64_t want = target[last];
      while (cur != -1 && node_token[cur] != want) cur = sibling[cur];  // ends at -1 (C47b)
      if (cur == -1) break;
      store_int(predicts, last, want);
      ++num;
      store_int(accept_index, b * num_spec + num, slot[cur]);
      last = slot[cur];
    }
    store_int(accept_token_num, b, num);
    store_int(predicts, last, target[last]);
  }
}

// -- K48 -------------------------------------------------------------------------------------------
void tree_speculative_sampling_target_only(Buffer predicts, Buffer accept_index, Buffer accept_token_num, Buffer candidates,
                                           Buffer retrive_index, Buffer next_token, Buffer next_sibling, Buffer uniform,
                                           Buffer uniform_final, Buffer target, Buffer draft, float threshold_single,
                                           float threshold_acc, bool /*deterministic: no result depends on it (C48d)*/) {
  const char* k = kTargetOnly;
  // The launcher's Python check holds the shapes; here the sizes follow from the element counts.
  const std::int64_t bs = accept_token_num.numel;
  if (!(threshold_single >= 0.0f && threshold_single <= 1.0f))
    fail(k, "threshold_single", "must be in [0, 1] (SGLang's launcher checks it), got " + std::to_string(threshold_single));
  if (!(threshold_acc >= 0.0f && threshold_acc <= 1.0f))
    fail(k, "threshold_acc", "must be in [0, 1] (SGLang's launcher checks it), got " + std::to_string(threshold_acc));
  if (bs == 0) return;
  const std::int64_t n = candidates.numel / bs, spec = accept_index.numel / bs;
  if (n < 1 || candidates.numel != bs * n) fail(k, "candidates", "must have shape [bs, n] with n > 0 (bs = accept_token_num's length)");
  if (spec < 1 || accept_index.numel != bs * spec) fail(k, "accept_index", "must have shape [bs, spec] with spec > 0");
  const std::int64_t v = target.numel / (bs * n);
  if (v < 1 || target.numel != bs * n * v) fail(k, "target_probs", "must have shape [bs, n, V] with V > 0");
  if (v >= (std::int64_t{1} << 31)) fail(k, "target_probs", "must have fewer than 2**31 columns (token ids are int32)");
  if (draft.numel != target.numel) fail(k, "draft_probs", "must have target_probs' shape [bs, n, V]");
  for (auto [name, b_] : {std::pair{"predicts", &predicts}, std::pair{"uniform_samples", &uniform}})
    if (b_->numel != bs * n) fail(k, name, "must hold bs * n = " + std::to_string(bs * n) + " elements");
  if (uniform_final.numel != bs) fail(k, "uniform_samples_for_final_sampling", "must hold a coin per request");
  const Trees t = load_trees(k, "retrive_index", "retrive_next_token", "retrive_next_sibling", retrive_index, next_token,
                             next_sibling, bs, n, bs * n);
  const std::vector<std::int64_t> token = load_ints(k, "candidates", candidates, bs * n);
  for (std::int64_t i = 0; i < bs * n; ++i)
    if (token[i] < 0 || token[i] >= v)
      fail(k, "candidates", "entry " + std::to_string(i) + " = " + std::to_string(token[i]) + " must be a token id in [0, V=" +
                                std::to_string(v) + ") (C48b)");
  const float* coins = uniform.as<float>();
  const float* finals = uniform_final.as<float>();
  float* tp = target.as<float>();
  float* dp = draft.as<float>();
  for (std::int64_t i = 0; i < bs * n; ++i) need_unit(k, "uniform_samples", coins[i], "entry " + std::to_string(i), "coins");
  for (std::int64_t b = 0; b < bs; ++b)
    need_unit(k, "uniform_samples_for_final_sampling", finals[b], "entry " + std::to_string(b), "coins");
  for (std::int64_t r = 0; r < bs * n; ++r)
    need_probability_row(k, "target_probs", tp + r * v, 1, v, "row " + std::to_string(r));
  for (std::int64_t i = 0; i < bs * n * v; ++i)
    need_unit(k, "draft_probs", dp[i], "entry " + std::to_string(i), "probabilities");
  const float t_acc = std::max(threshold_acc, 1e-9f);  // SGLang's launcher
  NoGil nogil;
#pragma omp parallel for schedule(dynamic, 1) if (worth_team(bs * v, 1 << 15))
  for (std::int64_t b = 0; b < bs; ++b) {
    const std::int64_t* slot = &t.slot[b * n];
    const std::int64_t* child = &t.child[b * n];
    const std::int64_t* sibling = &t.sibling[b * n];
    const std::int64_t* node_token = &token[b * n];
    std::int64_t row = 0, last = slot[0], num = 0, cur = 0;
    float coin = coins[b * n], prob_acc = 0.0f;
    store_int(accept_index, b * spec, last);
    for (std::int64_t j = 1; j < spec; ++j) {
      cur = child[cur];
      while (cur != -1) {  // every sibling list ends at -1 (C47b)
        const std::int64_t d = node_token[cur];
        const float p = tp[(b * n + row) * v + d];
        prob_acc = prob_acc + p;
        // C48a: target mass, and the shared coin below the level's running sum or p at the threshold.
        if (p > 0.0f && (coin < prob_acc / t_acc || p >= threshold_single)) {
          prob_acc = 0.0f;
          row = cur;
          coin = coins[b * n + cur];
          store_int(predicts, last, d);
          ++num;
          store_int(accept_index, b * spec + num, slot[cur]);
          last = slot[cur];
          break;
        }
        dp[(b * n + row) * v + d] = p;  // C48c: the rejected lane takes p (an input mutation)
        cur = sibling[cur];
      }
      if (cur == -1) break;
    }
    store_int(accept_token_num, b, num);
    const float* p_row = &tp[(b * n + row) * v];
    const float* q_row = &dp[(b * n + row) * v];
    const bool bonus = num == spec - 1;
    auto weight = [&](std::int64_t c) { return bonus ? p_row[c] : residual(p_row[c] - q_row[c]); };
    std::int64_t found = draw(v, weight, finals[b], -1);
    if (found < 0) {  // C48d: the last positive lane, else V - 1
      found = v - 1;
      for (std::int64_t c = v - 1; c >= 0; --c)
        if (weight(c) > 0.0f) {
          found = c;
          break;
        }
    }
    store_int(predicts, last, found);
  }
}

}  // namespace

SPECDIFF_FAMILY(sglang_verify, "SGLang's speculative verification: the chain rejection sampler, the greedy tree walk, the "
                               "target-only tree sampler") {
  def_kernel<&speculative_sampling_classic>(m, "speculative_sampling_classic");
  def_kernel<&verify_tree_greedy>(m, "verify_tree_greedy_kernel_triton");
  def_kernel<&tree_speculative_sampling_target_only>(m, "tree_speculative_sampling_target_only");
}

}  // namespace specdiff
