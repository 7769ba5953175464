// Argument checks shared by the input-preparation ports (K5–K10): per-request metadata read
// into int64 vectors, and block tables addressed as row * stride + column.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace specdiff {

// The first n elements of an integer buffer, widened to int64. Small per-request inputs
// (offsets, counts, next tokens) are read once, checked, and then used by every thread.
inline std::vector<std::int64_t> load_ints(const char* kernel, const char* name, const Buffer& b, std::int64_t n) {
  need_len(kernel, name, b, n);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  with_int(kernel, name, b.dtype, [&](auto t_) {
    using T = decltype(t_);
    const T* p = b.as<T>();
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<std::int64_t>(p[i]);
  });
  return v;
}

// A tensor addressed as row * stride + column from its data pointer (a block table, K7's
// sampled tokens). Its elements are `rows` runs of `cols`, `row_stride` apart; for a column
// slice of a wider buffer the gaps between runs are not elements, and reading them is out of
// bounds. A contiguous tensor is one run of numel elements.
struct Strided {
  Buffer data;
  std::int64_t rows, cols, row_stride;
  template <class T>
  T* as() const { return data.as<T>(); }
  // Whether the flat indices [flat, flat + width) are all elements.
  bool holds(std::int64_t flat, std::int64_t width = 1) const {
    if (width <= 0) return true;
    if (flat < 0 || rows <= 0 || cols <= 0) return false;
    // Compared as width <= end - flat: flat + width wraps for a huge flat index.
    if (row_stride <= cols) return width <= (rows - 1) * row_stride + cols - flat;  // runs touch
    const std::int64_t row = flat / row_stride;
    return row < rows && width <= row * row_stride + cols - flat;
  }
};

// row * stride + column, or -1 (never an element) when a huge stride overflows int64.
inline std::int64_t flat_index(std::int64_t row, std::int64_t stride, std::int64_t column) {
  std::int64_t at = 0;
  if (__builtin_mul_overflow(row, stride, &at) || __builtin_add_overflow(at, column, &at)) return -1;
  return at;
}

inline void need_element(const char* kernel, const char* name, const Strided& t, std::int64_t flat,
                         const std::string& what) {
  if (!t.holds(flat))
    fail(kernel, name, "is read at flat index " + std::to_string(flat) + " (" + what + "), which is not an element");
}

// Every flat index r * stride + c with r < rows and c < width is an element.
// Cheap refusals first (contracts/_checks.py: require_rows), so the loop that remains runs
// over rows inside the tensor: linear in its size, never in a caller's count (2**62 rows of
// stride 0 are row 0, checked once).
inline void need_rows(const char* kernel, const char* name, const Strided& t, std::int64_t rows, std::int64_t stride,
                      std::int64_t width) {
  if (width <= 0 || rows <= 0) return;
  const std::int64_t span = t.rows > 0 && t.cols > 0 ? (t.rows - 1) * t.row_stride + t.cols : 0;
  const std::int64_t limit = span - width;  // the last flat index a row may start at
  std::int64_t bad = -1, last = 0;
  if (limit < 0)
    bad = 0;
  else if (stride < 0 && rows > 1)
    bad = 1;
  else if (stride > 0 && (__builtin_mul_overflow(rows - 1, stride, &last) || last > limit))
    bad = limit / stride + 1;
  else if (t.row_stride <= t.cols)
    ;  // one run of elements, and every row starts at or before the last start that fits in it
  else
    for (std::int64_t r = 0; r < (stride != 0 ? rows : 1) && bad < 0; ++r)
      if (!t.holds(r * stride, width)) bad = r;
  if (bad >= 0)
    fail(kernel, name,
         "must hold row " + std::to_string(bad) + "'s " + std::to_string(width) + " elements at row " +
             std::to_string(bad) + " x row stride " + std::to_string(stride));
}

// The first of p[0, n) below `floor` (0 or -1), or -1 when none is: a precondition checked over a
// whole launch before anything is written (C25). The scan ORs sign bits (q for floor 0; q & (q + 1),
// negative exactly for q <= -2, for floor -1), which vectorizes on baseline x86-64 where a compare
// of int64 lanes or an early exit does not; at 1024 requests the scalar scan was 15 % of K5's call.
template <class P>
inline std::int64_t first_below(const P* p, std::int64_t n, std::int64_t floor) {
  std::uint64_t sign = 0;
  if (floor == 0) {
    for (std::int64_t i = 0; i < n; ++i) sign |= static_cast<std::uint64_t>(static_cast<std::int64_t>(p[i]));
  } else {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto q = static_cast<std::uint64_t>(static_cast<std::int64_t>(p[i]));
      sign |= q & (q + 1);
    }
  }
  if (!(sign >> 63)) return -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (p[i] < floor) return i;
  return -1;
}

// KV slots of positions (>= 0) in block-table rows: the block column is clamped to `columns` - 1
// (a wrong but in-range slot: C21, C23). KV block sizes are powers of two in practice: then a
// shift and a mask replace the 64-bit division (which was most of K5's and K9's time per token),
// equal for positions >= 0, and which of the two applies is decided once per launch, not per token.
struct Blocks {
  std::int64_t size, columns;
  int shift;  // log2(size), or -1 when size is not a power of two

  Blocks(std::int64_t block_size, std::int64_t columns_)
      : size(block_size), columns(columns_),
        shift(block_size > 0 && (block_size & (block_size - 1)) == 0 ? __builtin_ctzll(static_cast<unsigned long long>(block_size)) : -1) {}

  // The slot of `position` in the table row starting at flat index `row`.
  template <class T>
  std::int64_t slot(const T* table, std::int64_t row, std::int64_t position) const {
    if (shift >= 0 && position >= 0) {
      const std::int64_t column = std::min(position >> shift, columns - 1);
      return static_cast<std::int64_t>(table[row + column]) * size + (position & (size - 1));
    }
    const std::int64_t column = std::min(position / size, columns - 1);
    return static_cast<std::int64_t>(table[row + column]) * size + position % size;
  }
};

// The first `entries` elements of query_start_loc: non-negative and non-decreasing (spec §1.2).
inline std::vector<std::int64_t> load_offsets(const char* kernel, const char* name, const Buffer& b,
                                              std::int64_t entries) {
  std::vector<std::int64_t> v = load_ints(kernel, name, b, entries);
  check_cumulative(kernel, name, v.data(), entries);
  return v;
}

}  // namespace specdiff
