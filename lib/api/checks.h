// Argument checks shared by every public entry point (attention, layers, positional encodings).
// Each throws cpuattn::Error with a message that names the argument and its shape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cpuattn/cpuattn.h"

namespace cpuattn::detail {

// A view's sizes joined by `sep`: "2x8x128x32" for records, and shape_str()'s "[2,8,128,32]"
// for messages.
std::string join_dims(const TensorView& t, char sep);
std::string shape_str(const TensorView& t);
// "Q [2,8,128,32], K [2,8,128,64]" for a message tail.
std::string shapes_of(std::initializer_list<std::pair<const char*, const TensorView*>> ts);
[[noreturn]] void fail(const std::string& what);

// a * b, for sizes that come from the caller: an Error naming `what` (e.g. "MhaConfig: heads x
// head_dim") and both factors when the product overflows int64. The one place such products are
// checked; the byte extents of views go through extent_of().
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what);

// The byte range [lo, hi) a view can touch. Computing it also proves that no offset overflows.
// With the view it came from (rank 0: a plain byte range), so that two ranges that interleave can
// be told apart exactly (check_disjoint).
struct Extent {
  std::uintptr_t lo = 0, hi = 0;
  TensorView view{};
};
Extent extent_of(const char* name, const TensorView& t);

// Present, rank in [min_rank, max_rank], sizes >= 1, strides >= 0, last dimension contiguous.
void check_view(const char* name, const TensorView& t, int min_rank, int max_rank);
// f32 (or f64 when allowed).
void check_dtype(const char* name, const TensorView& t, bool allow_f64);
// An output must not write one element twice.
void check_no_self_overlap(const char* name, const TensorView& t);
// An output's bytes must not overlap any of `others`: where two byte ranges intersect, their views
// are compared element by element in effect (an exact test, as numpy.shares_memory's), so views
// that interleave without sharing a byte (q, k, v and out of one [B, L, 4, H, D] buffer) pass;
// past a work bound the answer is "may overlap", an error too.
void check_disjoint(const char* out_name, const Extent& o,
                    std::initializer_list<std::pair<const char*, Extent>> others);

}  // namespace cpuattn::detail
